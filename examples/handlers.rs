//! Every dispatch path of `#[sentinel_resource]`, in the order the macro resolves them:
//!
//! 1. blocked: `block_handler`, else the fallback with `E::from(BlockError)`, else `Err(E::from(BlockError))`;
//! 2. the body's `Err`: ignored errors are returned untouched; traced ones count as exceptions and go to the
//!    `fallback` (with the arguments) or the `default_fallback` (the error only);
//! 3. the entry exits on every path, panics included.
//!
//! Run with `cargo run --example handlers`.

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};

#[derive(Debug, Clone)]
enum PayError {
    Declined,
    Timeout,
    Busy,
}

impl From<BlockError> for PayError {
    fn from(_: BlockError) -> Self {
        PayError::Busy
    }
}

/// Shared by many functions: takes only the error.
fn retry_later<T>(e: PayError) -> Result<T, PayError> {
    println!("    default_fallback saw {e:?}");
    Err(PayError::Busy)
}

fn is_transient(e: &PayError) -> bool {
    matches!(e, PayError::Timeout | PayError::Busy)
}

struct Payments {
    provider: &'static str,
}

impl Payments {
    /// Declined payments are the caller's business: returned as they are, not counted. Transient errors count
    /// and go to the fallback, which gets `&self` and the arguments again.
    #[sentinel_resource(
        name = "charge",
        fallback = Self::charge_fallback,
        exceptions_to_ignore = [PayError::Declined],
        exceptions_to_trace = is_transient
    )]
    fn charge(&self, cents: u64) -> Result<String, PayError> {
        match cents {
            0 => Err(PayError::Declined),
            13 => Err(PayError::Timeout),
            _ => Ok(format!("{} charged {cents}", self.provider)),
        }
    }

    fn charge_fallback(&self, cents: u64, e: PayError) -> Result<String, PayError> {
        Ok(format!("queued {cents} for a retry with {} after {e:?}", self.provider))
    }

    /// Blocked calls get an answer from the block handler, an associated function.
    #[sentinel_resource(name = "balance", block_handler = Self::balance_blocked)]
    fn balance(&self) -> u64 {
        100
    }

    fn balance_blocked(&self, b: BlockError) -> u64 {
        println!("    {} blocked: {b}", self.provider);
        0
    }
}

#[sentinel_resource(name = "refund", default_fallback = retry_later)]
fn refund(cents: u64) -> Result<u64, PayError> {
    if cents > 1000 {
        Err(PayError::Timeout)
    } else {
        Ok(cents)
    }
}

/// No handler at all: a block becomes `Err(PayError::from(block))`.
#[sentinel_resource(name = "audit")]
fn audit(entry: &str) -> Result<usize, PayError> {
    Ok(entry.len())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sentinel = Sentinel::global();
    sentinel.load_flow_rules([FlowRule::new("balance").count(1.0), FlowRule::new("audit").count(1.0)])?;
    let p = Payments { provider: "acme" };

    println!("charge:");
    for cents in [250, 0, 13] {
        println!("  {cents} -> {:?}", p.charge(cents));
    }
    println!("balance (1 per second):");
    println!("  {}", p.balance());
    println!("  {}", p.balance());
    println!("refund:");
    println!("  {:?}", refund(10));
    println!("  {:?}", refund(5000));
    println!("audit (1 per second):");
    println!("  {:?}", audit("a"));
    println!("  {:?}", audit("b"));

    let c = sentinel.cluster_stats("charge").ok_or("charge was never entered")?;
    println!("charge: {} passed, {} exceptions (the declined one is not counted)", c.minute_pass, c.minute_exception);
    Ok(())
}
