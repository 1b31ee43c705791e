//! The common case (one simple flow rule, closed breakers, nothing else) is decided without the general
//! check path; these tests pin that both paths agree: same window, same order of checks, same errors.

use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{BlockError, Sentinel};

const T0: u64 = 1_700_000_000_000;

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

#[test]
fn prioritized_and_plain_calls_share_one_exact_window() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("api").count(3.0)]).unwrap();
    let api = engine.resource("api");
    drop(api.enter().unwrap()); // the fast path
    drop(api.entry().prioritized(true).decide().unwrap()); // the general path, with room left: a plain pass
    drop(api.enter().unwrap());
    match api.enter() {
        Err(BlockError::Flow { rule, .. }) => assert_eq!(rule.count, 3.0),
        other => panic!("the fourth call must be blocked by the flow rule, got {other:?}"),
    }
    assert_eq!(engine.cluster_stats("api").unwrap().pass_qps, 3.0);
    assert_eq!(engine.cluster_stats("api").unwrap().block_qps, 1.0);
}

#[test]
fn a_flow_rule_is_checked_before_an_open_breaker_on_both_paths() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    let breaker = DegradeRule::new("api", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(5);
    engine.load_degrade_rules([breaker]).unwrap();
    let api = engine.resource("api");
    {
        let mut e = api.enter().unwrap(); // closed breaker: the fast path
        e.set_error();
    }
    assert_eq!(engine.circuit_breakers("api")[0].state, BreakerState::Open);
    // The flow window is used up and the breaker is open: the flow rule blocks first (Java's slot order).
    assert!(matches!(api.enter(), Err(BlockError::Flow { .. })));
    clock.advance_millis(1_000);
    // A new window: the flow rule passes, the open breaker blocks.
    assert!(matches!(api.enter(), Err(BlockError::Degrade { .. })));
    // After the retry time one probe goes through; its success closes the breaker.
    clock.advance_millis(5_000);
    drop(api.enter().unwrap());
    assert_eq!(engine.circuit_breakers("api")[0].state, BreakerState::Closed);
    clock.advance_millis(1_000);
    drop(api.enter().unwrap()); // closed again: the fast path
}

#[test]
fn a_breaker_without_flow_rules_counts_every_call_on_the_fast_path() {
    let (engine, _clock) = engine();
    let rule = DegradeRule::new("db", DegradeGrade::ErrorCount).count(2.0).min_request_amount(1).time_window_sec(5);
    engine.load_degrade_rules([rule]).unwrap();
    let db = engine.resource("db");
    for _ in 0..3 {
        let mut e = db.enter().unwrap();
        e.set_error();
    }
    assert_eq!(engine.circuit_breakers("db")[0].state, BreakerState::Open, "the third error is above 2");
    assert!(matches!(db.enter(), Err(BlockError::Degrade { .. })));
}

#[test]
fn a_blocked_fast_path_call_names_the_rule_resource_and_origin() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("pay").count(0.0)]).unwrap();
    match engine.resource("pay").entry().origin("shop").enter() {
        Err(BlockError::Flow { resource, rule, origin, .. }) => {
            assert_eq!(&*resource, "pay");
            assert_eq!(rule.resource, "pay");
            assert_eq!(&*origin, "shop");
        }
        other => panic!("expected a flow block, got {other:?}"),
    }
}
