//! Circuit breakers make no heap allocation on entry and exit, closed, open or probing: counted with a
//! counting global allocator (per thread).

use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

#[test]
fn closed_open_and_probing_breakers_allocate_nothing() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_flow_rules([FlowRule::new("api").count(1e12)]).unwrap();
    engine
        .load_degrade_rules([
            DegradeRule::new("api", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(1),
            DegradeRule::new("api", DegradeGrade::SlowRequestRatio).count(1e6).time_window_sec(1),
            DegradeRule::new("*", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(1),
        ])
        .unwrap();
    let (api, other) = (engine.resource("api"), engine.resource("other"));
    let cycle = |n: usize| {
        for _ in 0..n {
            drop(other.enter().unwrap()); // closed default breaker
            drop(api.enter().unwrap()); // closed
            let mut e = api.enter().unwrap();
            e.set_error(); // trips
            drop(e);
            assert!(api.enter().is_err()); // open
            clock.advance_millis(1_000);
            let mut probe = api.enter().unwrap();
            assert!(api.enter().is_err()); // half-open
            probe.set_error(); // a failed probe re-opens
            drop(probe);
            clock.advance_millis(1_000);
            drop(api.enter().unwrap()); // a fine probe closes
        }
    };
    cycle(100); // warm up: nodes, thread-locals
    let before = allocations();
    cycle(10_000);
    assert_eq!(allocations() - before, 0, "allocations in 10k breaker cycles");
}
