//! A blocked call makes no heap allocation, whatever rule kind blocks it: under overload, blocking is the hot
//! path (counted per thread with a counting global allocator). The one exception is a hot-parameter block,
//! whose error carries the value's text as a `String` (its public type): one allocation, checked below to
//! read as the value does.

use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::{BlockError, EntryType, Sentinel};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

/// Runs `block` (which must be refused every time) 1,000 times to warm up, then 10,000 times counted.
fn assert_blocks_allocate_nothing(kind: &str, mut block: impl FnMut() -> Result<(), BlockError>) {
    for _ in 0..1_000 {
        assert!(block().is_err(), "{kind}: the call must be blocked");
    }
    let before = allocations();
    for _ in 0..10_000 {
        assert!(block().is_err(), "{kind}: the call must be blocked");
    }
    assert_eq!(allocations() - before, 0, "{kind}: allocations on 10k blocked calls");
}

fn engine() -> Sentinel {
    Sentinel::builder().manual_clock(ManualClock::at_millis(1_700_000_000_000)).build()
}

#[test]
fn flow_and_thread_grade_blocks_allocate_nothing() {
    let e = engine();
    e.load_flow_rules([FlowRule::new("qps").count(0.0), FlowRule::new("thread").grade(FlowGrade::Thread).count(1.0)])
        .unwrap();
    let (qps, thread) = (e.resource("qps"), e.resource("thread"));
    assert_blocks_allocate_nothing("qps", || qps.enter().map(drop));
    let held = thread.enter().unwrap();
    assert_blocks_allocate_nothing("thread", || thread.enter().map(drop));
    drop(held);
}

#[test]
fn open_breaker_blocks_allocate_nothing() {
    let e = engine();
    e.load_degrade_rules([DegradeRule::new("api", DegradeGrade::ErrorCount)
        .count(0.0)
        .min_request_amount(1)
        .time_window_sec(10)])
        .unwrap();
    let api = e.resource("api");
    let mut tripping = api.enter().unwrap();
    tripping.set_error();
    drop(tripping);
    assert_blocks_allocate_nothing("degrade", || api.enter().map(drop));
}

#[test]
fn a_blocked_hot_parameter_value_reads_as_its_display() {
    let e = engine();
    e.load_param_flow_rules([ParamFlowRule::new("api", 0).count(0.0)]).unwrap();
    let api = e.resource("api");
    let long = "x".repeat(300);
    let mut v = 0u64;
    let mut calls = || {
        v += 1;
        api.entry().args(&[&v]).enter().map(drop)
    };
    for _ in 0..100 {
        assert!(calls().is_err());
    }
    let before = allocations();
    for _ in 0..1_000 {
        assert!(calls().is_err());
    }
    assert!(allocations() - before <= 1_000, "at most the value's text per blocked call");
    let cases: [(&dyn sentinel_runtime::param_flow::HotParam, &str); 7] = [
        (&-42i64, "-42"),
        (&u64::MAX, "18446744073709551615"),
        (&1.5f64, "1.5"),
        (&'é', "é"),
        (&false, "false"),
        (&"user-7", "user-7"),
        (&long, &long),
    ];
    for (arg, text) in cases {
        match api.entry().args(&[arg]).enter() {
            Err(b @ BlockError::ParamFlow { .. }) => {
                let BlockError::ParamFlow { value, .. } = &b else { unreachable!() };
                assert_eq!(value.to_string(), *text);
                assert_eq!(value, text, "the value compares with its text");
                assert!(b.to_string().contains(text), "{b}");
            }
            other => panic!("expected a hot-parameter block for {text}, got {other:?}"),
        }
    }
}

#[test]
fn authority_system_and_adaptive_blocks_allocate_nothing() {
    let e = engine();
    e.load_authority_rules([AuthorityRule::new("auth", "bad", AuthorityStrategy::Black)]).unwrap();
    let auth = e.resource("auth");
    assert_blocks_allocate_nothing("authority", || auth.entry().origin("bad").enter().map(drop));

    e.load_adaptive_rules([AdaptiveRule::new("adaptive").algorithm(AlgorithmKind::Vegas).limits(1, 1, 1)]).unwrap();
    let adaptive = e.resource("adaptive");
    let held = adaptive.enter().unwrap();
    assert_blocks_allocate_nothing("adaptive", || adaptive.enter().map(drop));
    drop(held);

    e.load_system_rules([SystemRule { max_thread: Some(1), ..Default::default() }]).unwrap();
    let inbound = e.resource_typed("inbound", EntryType::In);
    // Java's test: blocked once the calls in flight exceed the limit.
    let held = [inbound.enter().unwrap(), inbound.enter().unwrap()];
    assert_blocks_allocate_nothing("system", || inbound.enter().map(drop));
    drop(held);
}
