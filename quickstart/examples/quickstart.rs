//! The quickstart: guard a function with `#[sentinel_resource]`, limit it to 2 calls a second, and watch calls
//! pass, get blocked (the block handler answers), and fail over to a fallback.
//!
//! Run with `cargo run -p sentinel-quickstart --example quickstart`. No configuration, no server: the global engine's defaults.

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};

#[derive(Debug)]
enum OrderError {
    NotFound(u64),
    Busy(String),
}

impl std::fmt::Display for OrderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OrderError::NotFound(id) => write!(f, "no item #{id}"),
            OrderError::Busy(why) => write!(f, "busy: {why}"),
        }
    }
}

impl From<BlockError> for OrderError {
    fn from(b: BlockError) -> Self {
        OrderError::Busy(b.to_string())
    }
}

/// A guarded query: over its limit, `query_blocked` answers instead.
#[sentinel_resource(name = "queryOrder", block_handler = query_blocked)]
fn query_order(id: u64) -> String {
    format!("order #{id}: 2 books")
}

fn query_blocked(id: u64, blocked: BlockError) -> String {
    format!("order #{id}: try again later ({})", blocked.kind_name())
}

/// A lookup that can fail: an error goes to `lookup_fallback`, with the arguments again.
#[sentinel_resource(name = "lookupPrice", fallback = lookup_fallback)]
fn lookup_price(sku: &str) -> Result<u32, OrderError> {
    match sku {
        "book" => Ok(12),
        _ => Err(OrderError::NotFound(sku.len() as u64)),
    }
}

fn lookup_fallback(sku: &str, err: OrderError) -> Result<u32, OrderError> {
    println!("  fallback for `{sku}` after \"{err}\": using the list price");
    Ok(10)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sentinel = Sentinel::global();
    sentinel.load_flow_rules([FlowRule::new("queryOrder").count(2.0)])?;

    println!("5 calls to queryOrder, limited to 2 per second:");
    for id in 1..=5 {
        println!("  {}", query_order(id));
    }

    println!("lookupPrice:");
    println!("  book -> {:?}", lookup_price("book"));
    println!("  pen  -> {:?}", lookup_price("pen"));

    let stats = sentinel.cluster_stats("queryOrder").ok_or("queryOrder was never entered")?;
    println!("queryOrder: {} passed, {} blocked this minute", stats.minute_pass, stats.minute_block);
    let lookups = sentinel.cluster_stats("lookupPrice").ok_or("lookupPrice was never entered")?;
    println!("lookupPrice: {} passed, {} exceptions", lookups.minute_pass, lookups.minute_exception);
    println!("resources in this binary:");
    for d in Sentinel::registered_resources() {
        println!("  {} ({}:{})", d.name, d.file, d.line);
    }
    Ok(())
}
