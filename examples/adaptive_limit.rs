//! The seed's incident, scaled down to a few seconds on the real clock: a downstream with 8 workers answers in
//! 5 ms, then in 300 ms for 1.5 s, then in 5 ms again, while callers offer 1.2x its capacity. Printed twice,
//! without a rule and with an adaptive one (Gradient2, windows of 100 ms): the limit, the calls in flight and
//! the p99 of completed calls every 250 ms.
//!
//! ```text
//! cargo run --example adaptive_limit
//! ```
//!
//! Without the rule the calls in flight pile up to hundreds and every caller waits seconds; with it they stay
//! near the limit, which falls during the incident and climbs back after it. Timings depend on the machine:
//! the deterministic version of this experiment is the crate's simulator tests.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
use sentinel_runtime::Sentinel;
use tokio::sync::Semaphore;

const WORKERS: usize = 8;
const FAST: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(300);
const INCIDENT: (Duration, Duration) = (Duration::from_millis(1_000), Duration::from_millis(2_500));
const RUN: Duration = Duration::from_millis(4_000);
const TICK: Duration = Duration::from_millis(250);

/// Response times (ms) completed since the last tick.
type Done = Arc<Mutex<Vec<f64>>>;

async fn run(engine: Sentinel, with_rule: bool) {
    if with_rule {
        let mut rule = AdaptiveRule::new("inventory").algorithm(AlgorithmKind::Gradient2).limits(2, 20, 200);
        rule.window.window_ms = 100;
        rule.window.max_window_ms = 500;
        engine.load_adaptive_rules([rule]).expect("a valid rule");
    }
    println!("{}", if with_rule { "with an adaptive rule:" } else { "without a rule:" });
    println!("  {:>6} {:>6} {:>9} {:>9} {:>8}", "t (ms)", "limit", "in flight", "blocked", "p99 (ms)");
    let downstream = Arc::new(Semaphore::new(WORKERS));
    let inflight = Arc::new(AtomicU32::new(0));
    let blocked = Arc::new(AtomicU32::new(0));
    let done: Done = Arc::default();
    let start = Instant::now();
    let resource = engine.resource("inventory");
    // 1.2x capacity: 8 workers / 5 ms = 1,600 calls a second; one call every 520 us.
    let interval = Duration::from_micros(520);
    let mut next_tick = TICK;
    let mut tick = tokio::time::interval(interval);
    while start.elapsed() < RUN {
        tick.tick().await;
        match resource.entry_owned().enter() {
            Ok(entry) => {
                let (downstream, inflight, done) = (downstream.clone(), inflight.clone(), done.clone());
                inflight.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let called = Instant::now();
                    if let Ok(_worker) = downstream.acquire().await {
                        let now = start.elapsed();
                        let slow = now >= INCIDENT.0 && now < INCIDENT.1;
                        tokio::time::sleep(if slow { SLOW } else { FAST }).await;
                    }
                    drop(entry);
                    inflight.fetch_sub(1, Ordering::Relaxed);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(called.elapsed().as_secs_f64() * 1e3);
                });
            }
            Err(_) => {
                blocked.fetch_add(1, Ordering::Relaxed);
            }
        }
        if start.elapsed() >= next_tick {
            next_tick += TICK;
            let mut rts = std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
            rts.sort_by(f64::total_cmp);
            let p99 = rts.get(rts.len().saturating_mul(99) / 100).copied().unwrap_or(0.0);
            let limit = engine.adaptive_status().first().map_or("-".to_string(), |s| s.limit.to_string());
            println!(
                "  {:>6} {:>6} {:>9} {:>9} {:>8.0}",
                start.elapsed().as_millis(),
                limit,
                inflight.load(Ordering::Relaxed),
                blocked.swap(0, Ordering::Relaxed),
                p99
            );
        }
    }
    println!();
}

#[tokio::main]
async fn main() {
    run(Sentinel::builder().build(), false).await;
    run(Sentinel::builder().build(), true).await;
}
