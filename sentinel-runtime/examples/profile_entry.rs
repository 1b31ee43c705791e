//! A tight loop of entries for profiling (`perf record`); not part of the documented examples.
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::{flow::FlowRule, Sentinel};

fn main() {
    let engine = Sentinel::builder().build();
    // "pass": a passing flow rule; "block": a blocking one; "no-rule" (or any other name): none.
    let flow =
        [FlowRule::new("pass").count(1e15), FlowRule::new("breaker").count(1e15), FlowRule::new("block").count(0.0)];
    engine.load_flow_rules(flow).expect("valid rule");
    // "breaker": the same flow rule plus a closed error-count circuit breaker.
    let breaker = DegradeRule::new("breaker", DegradeGrade::ErrorCount).count(1e9).time_window_sec(10);
    engine.load_degrade_rules([breaker]).expect("valid rule");
    let name = std::env::args().nth(1).unwrap_or_else(|| "pass".to_string());
    let iterations: u64 = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(50_000_000);
    let r = engine.resource(&name);
    let mut ok = 0u64;
    for _ in 0..iterations {
        if r.enter().is_ok() {
            ok += 1;
        }
    }
    println!("{ok} passed; size_of::<Entry>() = {}", std::mem::size_of::<sentinel_runtime::Entry<'static>>());
}
