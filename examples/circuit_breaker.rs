//! A downstream that turns slow and fails; callers protected by a slow-ratio circuit breaker with a fallback.
//!
//! Time is simulated with a manual clock (calls overlap as they would on a server: one arrives every 200 ms
//! and completes when the downstream answers), so eleven seconds of traffic run in an instant and the output
//! is the same on every run: `cargo run --example circuit_breaker`.
//!
//! - 0–3 s: the price service answers in 20 ms.
//! - 3–7 s: it turns slow: 500 ms, and then a timeout error.
//! - from 7 s: it is healthy again.
//!
//! The breaker opens when more than half of at least 4 calls completed in a second took over 100 ms, stays
//! open for 2 s, then lets one probe through: a slow probe opens it again, a fast one closes it. While it is
//! open, callers answer at once from a cache instead of queueing on the dying downstream.

use std::fmt;

use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::{Entry, Sentinel};

const START_MS: u64 = 1_700_000_000_000;
const ARRIVAL_EVERY_MS: u64 = 200;
const RUN_MS: u64 = 11_000;
const CACHED_PRICE: u32 = 41;

#[derive(Debug)]
struct Timeout;

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("price service timed out")
    }
}

impl std::error::Error for Timeout {}

/// The simulated downstream called at `t_ms`: how long it takes, and its answer.
fn price_service(t_ms: u64) -> (u64, Result<u32, Timeout>) {
    if (3_000..7_000).contains(&t_ms) {
        (500, Err(Timeout))
    } else {
        (20, Ok(42))
    }
}

/// A call in flight: its entry (the breaker sees it complete when the entry is dropped) and its answer.
struct InFlight<'r> {
    entry: Entry<'r>,
    done_ms: u64,
    answer: Result<u32, Timeout>,
}

fn secs(ms: u64) -> f64 {
    ms.saturating_sub(START_MS) as f64 / 1000.0
}

fn main() {
    let clock = ManualClock::at_millis(START_MS);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let observer_clock = clock.clone();
    engine.register_state_observer("print", move |prev, new, rule, snapshot| {
        let why = match snapshot {
            Some(v) => format!("  (snapshot {v:.2})"),
            None => String::new(),
        };
        println!(
            "t={:5.2}s  ** breaker of `{}`: {prev} -> {new}{why}",
            secs(observer_clock.now_millis()),
            rule.resource
        );
    });
    engine
        .load_degrade_rules(vec![DegradeRule::new("getPrice", DegradeGrade::SlowRequestRatio)
            .count(100.0) // a call over 100 ms is slow
            .slow_ratio_threshold(0.5)
            .min_request_amount(4)
            .stat_interval_ms(1_000)
            .time_window_sec(2)])
        .expect("the rule is valid");
    let prices = engine.resource("getPrice");

    let (mut fresh, mut failed, mut fallback) = (0, 0, 0);
    let mut in_flight: Vec<InFlight<'_>> = Vec::new();
    for arrival in (START_MS..START_MS + RUN_MS).step_by(ARRIVAL_EVERY_MS as usize) {
        // Complete the calls whose downstream answered by now, in order.
        in_flight.sort_by_key(|c| c.done_ms);
        while in_flight.first().is_some_and(|c| c.done_ms <= arrival) {
            let mut call = in_flight.remove(0);
            clock.set_millis(call.done_ms);
            match &call.answer {
                Ok(price) => {
                    fresh += 1;
                    println!("t={:5.2}s  price {price} from the service", secs(call.done_ms));
                }
                Err(e) => {
                    failed += 1;
                    call.entry.trace(e);
                    println!("t={:5.2}s  error after 500 ms: {e}", secs(call.done_ms));
                }
            }
        }
        clock.set_millis(arrival);
        match prices.enter() {
            Ok(entry) => {
                let (took_ms, answer) = price_service(arrival - START_MS);
                in_flight.push(InFlight { entry, done_ms: arrival + took_ms, answer });
            }
            Err(blocked) => {
                fallback += 1;
                println!(
                    "t={:5.2}s  fallback: cached price {CACHED_PRICE} at once ({})",
                    secs(arrival),
                    blocked.kind_name()
                );
            }
        }
    }
    drop(in_flight);
    println!("\n{fresh} answered by the service, {failed} failed after 500 ms, {fallback} answered by the fallback");
    for b in engine.circuit_breakers("getPrice") {
        println!("the {:?} breaker of `{}` ends {}", b.rule.grade, b.rule.resource, b.state);
    }
}
