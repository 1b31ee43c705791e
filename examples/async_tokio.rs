//! `#[sentinel_resource]` on `async fn`s under tokio: nested resources form a call tree across `.await`, a rate
//! limiter spaces calls by awaiting a timer (the worker thread stays free), a cancelled call exits its entry, and
//! `timeout_ms` gives a call a time limit that counts as an exception (and a slow call) for circuit breakers.
//!
//! Run with `cargo run --example async_tokio`.

use std::time::{Duration, Instant};

use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel, Timeout};

#[derive(Debug)]
enum ApiError {
    Blocked(String),
    TimedOut(Timeout),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Blocked(kind) => write!(f, "blocked ({kind})"),
            ApiError::TimedOut(t) => write!(f, "{t}"),
        }
    }
}

impl std::error::Error for ApiError {}

impl From<Timeout> for ApiError {
    fn from(t: Timeout) -> Self {
        ApiError::TimedOut(t)
    }
}

impl From<BlockError> for ApiError {
    fn from(b: BlockError) -> Self {
        ApiError::Blocked(b.kind_name().to_string())
    }
}

#[sentinel_resource(name = "getUser", entry_type = In)]
async fn get_user(id: u64) -> Result<String, ApiError> {
    let profile = load_profile(id).await?;
    let orders = count_orders(id).await?;
    Ok(format!("user {id}: {profile}, {orders} orders"))
}

#[sentinel_resource(name = "loadProfile")]
async fn load_profile(id: u64) -> Result<String, ApiError> {
    tokio::task::yield_now().await;
    Ok(format!("profile-{id}"))
}

/// Spaced by a rate limiter: calls queue (awaiting a timer) instead of failing.
#[sentinel_resource(name = "countOrders")]
async fn count_orders(id: u64) -> Result<u64, ApiError> {
    Ok(id % 3)
}

#[sentinel_resource(name = "slowReport", block_handler = report_blocked)]
async fn slow_report() -> String {
    tokio::time::sleep(Duration::from_secs(10)).await;
    "report".to_string()
}

fn report_blocked(_b: BlockError) -> String {
    "report unavailable".to_string()
}

/// A downstream that hangs, given 30 ms: then the body is dropped and the fallback answers.
#[sentinel_resource(name = "fetchPrice", timeout_ms = 30, fallback = last_known_price)]
async fn fetch_price(sku: u64) -> Result<u64, ApiError> {
    tokio::time::sleep(Duration::from_secs(10)).await;
    Ok(sku * 100)
}

fn last_known_price(sku: u64, e: ApiError) -> Result<u64, ApiError> {
    println!("  fetchPrice: {e}; answering with the last known price");
    Ok(sku * 99)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sentinel = Sentinel::global();
    sentinel.load_flow_rules([FlowRule::new("countOrders")
        .count(20.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(1_000)])?;

    let started = Instant::now();
    let tasks: Vec<_> = (1..=5).map(|id| tokio::spawn(get_user(id))).collect();
    // While the calls queue, this task keeps running on the same runtime.
    let ticker = tokio::spawn(async {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            println!("  (ticker: the executor is not blocked)");
        }
    });
    for t in tasks {
        match t.await? {
            Ok(user) => println!("{user}"),
            Err(e) => println!("{e}"),
        }
    }
    ticker.await?;
    println!("5 calls spaced 50 ms apart by the rate limiter took {:?}", started.elapsed());

    // A timeout drops the future: the entry exits, and it is not counted as an error.
    let timed_out = tokio::time::timeout(Duration::from_millis(20), slow_report()).await;
    println!("slow report timed out: {}", timed_out.is_err());
    let s = sentinel.cluster_stats("slowReport").ok_or("slowReport was never entered")?;
    println!("slowReport: {} in flight, {} exceptions", s.threads, s.minute_exception);

    // A time limit of the resource's own: the call is cut at 30 ms and counted as an exception whose response
    // time is the limit, so slow-call and error breakers see it.
    println!("price of sku 7: {}", fetch_price(7).await?);
    let s = sentinel.cluster_stats("fetchPrice").ok_or("fetchPrice was never entered")?;
    println!("fetchPrice: {} in flight, {} exceptions, avg rt {} ms", s.threads, s.minute_exception, s.avg_rt_ms);

    println!("call tree:");
    for ctx in sentinel.tree() {
        print_tree(&ctx, 1);
    }
    Ok(())
}

fn print_tree(node: &sentinel_runtime::TreeNode, depth: usize) {
    println!("{}{} (pass {})", "  ".repeat(depth), node.name, node.stats.minute_pass);
    for c in &node.children {
        print_tree(c, depth + 1);
    }
}
