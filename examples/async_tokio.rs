//! `#[sentinel_resource]` on `async fn`s under tokio: nested resources form a call tree across `.await`, a rate
//! limiter spaces calls by awaiting a timer (the worker thread stays free), and a cancelled call exits its entry.
//!
//! Run with `cargo run --example async_tokio`.

use std::time::{Duration, Instant};

use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};

#[derive(Debug)]
enum ApiError {
    Blocked(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Blocked(kind) => write!(f, "blocked ({kind})"),
        }
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
