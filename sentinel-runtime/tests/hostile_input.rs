//! Bounded memory and time under hostile input (issue 10 §5): origins from request headers are capped per
//! engine and per resource with the semantics of rules that name an origin kept exactly; recursion does not
//! leak nodes; engines captured by their own observers can be dropped; rule values that Java accepts but
//! that admit nothing or cannot be represented are handled without a panic.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowGrade, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::{RuleError, Sentinel, UNTRACKED_ORIGIN};

const T0: u64 = 1_700_000_000_000;

fn engine_with(max_origins: usize, per_resource: usize) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder()
        .manual_clock(clock.clone())
        .max_origins(max_origins)
        .max_origins_per_resource(per_resource)
        .build();
    (engine, clock)
}

#[test]
fn a_flood_of_distinct_origins_is_tracked_up_to_the_caps_and_counted_exactly() {
    let (engine, _clock) = engine_with(100, 20);
    let api = engine.resource("api");
    for i in 0..10_000 {
        drop(api.entry().origin(&format!("attacker-{i}")).enter().unwrap());
    }
    assert_eq!(engine.tracked_origins(), 100, "the engine interns at most the cap");
    let origins = engine.origins_of("api");
    assert_eq!(origins.len(), 21, "20 origin nodes on the resource, plus the shared untracked one");
    let untracked = origins.iter().find(|(o, _)| o == UNTRACKED_ORIGIN).expect("an untracked node").1.clone();
    assert_eq!(untracked.pass_qps, 10_000.0 - 20.0, "every call past the caps is counted on it");
    assert_eq!(engine.cluster_stats("api").unwrap().pass_qps, 10_000.0, "the resource counts every call");
    // A caller tracked by the engine but past the resource's cap keeps its own name.
    let e = api.entry().origin("attacker-50").enter().unwrap();
    assert_eq!(e.origin(), "attacker-50");
    drop(e);
    let e = api.entry().origin("attacker-5000").enter().unwrap();
    assert_eq!(e.origin(), UNTRACKED_ORIGIN, "past the engine's cap the origin is untracked");
}

#[test]
fn an_origin_named_by_a_flow_rule_keeps_its_own_limit_past_every_cap() {
    let (engine, _clock) = engine_with(10, 5);
    engine.load_flow_rules([FlowRule::new("api").limit_app("appA").count(2.0)]).unwrap();
    let api = engine.resource("api");
    for i in 0..1000 {
        drop(api.entry().origin(&format!("o-{i}")).enter().unwrap());
    }
    let passed = (0..5).filter(|_| api.entry().origin("appA").enter().is_ok()).count();
    assert_eq!(passed, 2, "appA is limited on its own node, exactly");
    assert_eq!(engine.origin_stats("api", "appA").unwrap().pass_qps, 2.0);
}

#[test]
fn origins_named_by_authority_lists_are_matched_exactly_and_untracked_origins_are_not_white_listed() {
    let (engine, _clock) = engine_with(10, 5);
    engine
        .load_authority_rules([
            AuthorityRule::new("internal", "good,ops", AuthorityStrategy::White),
            AuthorityRule::new("public", "evil", AuthorityStrategy::Black),
        ])
        .unwrap();
    let (internal, public) = (engine.resource("internal"), engine.resource("public"));
    for i in 0..1000 {
        let _ = internal.entry().origin(&format!("o-{i}")).enter();
        let _ = public.entry().origin(&format!("o-{i}")).enter();
    }
    assert!(internal.entry().origin("good").enter().is_ok(), "a listed origin is tracked and allowed");
    assert!(internal.entry().origin("stranger").enter().is_err(), "an untracked origin is not on the white list");
    assert!(public.entry().origin("evil").enter().is_err(), "a black-listed origin is still blocked");
    assert!(public.entry().origin("stranger").enter().is_ok(), "an untracked origin is not black-listed");
}

#[test]
fn an_other_rule_limits_untracked_origins_together_on_one_node() {
    let (engine, _clock) = engine_with(3, 3);
    engine.load_flow_rules([FlowRule::new("api").limit_app("other").count(5.0)]).unwrap();
    let api = engine.resource("api");
    let passed = (0..100).filter(|i| api.entry().origin(&format!("o-{i}")).enter().is_ok()).count();
    // Three tracked origins pass once each (their own nodes); the other 97 share the untracked node's 5.
    assert_eq!(passed, 3 + 5);
}

#[test]
fn the_untracked_origin_name_is_reserved_in_rules() {
    let (engine, _clock) = engine_with(10, 10);
    let flow = engine.load_flow_rules([FlowRule::new("api").limit_app(UNTRACKED_ORIGIN).count(1.0)]);
    assert!(matches!(flow, Err(RuleError::Invalid { field: "limit_app", .. })), "{flow:?}");
    let list = format!("good,{UNTRACKED_ORIGIN}");
    let auth = engine.load_authority_rules([AuthorityRule::new("api", &list, AuthorityStrategy::White)]);
    assert!(matches!(auth, Err(RuleError::Invalid { field: "limit_app", .. })), "{auth:?}");
}

/// Counts the drops of a value captured by an observer.
struct DropCounter(Arc<AtomicUsize>);
impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn an_observer_holding_a_weak_engine_handle_lets_the_engine_drop() {
    let engine = Sentinel::builder().build();
    let weak = engine.downgrade();
    let drops = Arc::new(AtomicUsize::new(0));
    let counter = DropCounter(drops.clone());
    engine.register_state_observer("log", move |_, _, rule, _| {
        let _ = &counter;
        if let Some(engine) = weak.upgrade() {
            let _ = engine.diagnose(&rule.resource);
        }
    });
    let weak2 = engine.downgrade();
    assert!(weak2.upgrade().is_some());
    drop(engine);
    assert!(weak2.upgrade().is_none(), "no strong handle is left");
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the observer (and the engine) were freed");
}

#[test]
fn warm_up_rules_that_java_accepts_but_that_would_admit_nothing_admit_at_least_one_call_per_second() {
    for (count, period, cold) in [(1.0, 1u32, 3u32), (2.0, 1, 3), (5.0, 1, 10), (1.0, 10, 3), (3.0, 2, 3)] {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        let rule = FlowRule::new("w")
            .count(count)
            .control_behavior(ControlBehavior::WarmUp)
            .warm_up_period_sec(period)
            .cold_factor(cold);
        engine.load_flow_rules([rule]).unwrap();
        let r = engine.resource("w");
        let mut passed = 0;
        for _ in 0..60 {
            clock.advance_millis(1000);
            if r.enter().is_ok() {
                passed += 1;
            }
        }
        assert_eq!(passed, 60, "count {count}, period {period}, cold factor {cold}: one call a second passes");
    }
}

#[test]
fn warm_up_keeps_javas_ramp_where_java_admits_calls() {
    // count 100, period 10, cold factor 3 (Java's defaults): the cold rate is count / cold_factor.
    let clock = ManualClock::at_millis(T0 - T0 % 1000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_flow_rules([FlowRule::new("w").count(100.0).control_behavior(ControlBehavior::WarmUp)]).unwrap();
    let r = engine.resource("w");
    let first_second = (0..1000).filter(|_| r.enter().is_ok()).count();
    assert_eq!(first_second, 33, "Java's cold rate: passes + 1 <= nextUp(100 / 3)");
}

#[test]
fn warm_up_counts_below_one_and_token_buckets_too_large_are_rejected_with_the_minimum() {
    let engine = Sentinel::builder().build();
    let small = FlowRule::new("w").count(0.5).control_behavior(ControlBehavior::WarmUp);
    let err = engine.load_flow_rules([small]).unwrap_err();
    assert!(err.to_string().contains(">= 1"), "{err}");
    for count in [1e19, 1e300] {
        let huge = FlowRule::new("w").count(count).control_behavior(ControlBehavior::WarmUp).warm_up_period_sec(10);
        let res = catch_unwind(AssertUnwindSafe(|| engine.load_flow_rules([huge])));
        let err = res.expect("no panic").unwrap_err();
        assert!(err.to_string().contains("2^52"), "{err}");
    }
    let extreme = FlowRule::new("w")
        .count(1e300)
        .control_behavior(ControlBehavior::WarmUp)
        .warm_up_period_sec(u32::MAX)
        .cold_factor(u32::MAX);
    assert!(catch_unwind(AssertUnwindSafe(|| engine.load_flow_rules([extreme]))).expect("no panic").is_err());
}

#[test]
fn a_queueing_rule_with_no_queueing_time_is_refused_naming_the_field_as_java_refuses_it() {
    let engine = Sentinel::builder().build();
    engine.load_flow_rules([FlowRule::new("r").count(5.0)]).unwrap();
    for behaviour in [ControlBehavior::RateLimiter, ControlBehavior::WarmUpRateLimiter] {
        let rule = FlowRule::new("r").count(10.0).control_behavior(behaviour).max_queueing_time_ms(0);
        let err = engine.load_flow_rules([rule]).expect_err("Java's checkControlBehaviorField refuses it");
        assert!(err.to_string().contains("max_queueing_time_ms"), "{err}");
        assert_eq!(engine.flow_rules()[0].count, 5.0, "the rules in force stay");
    }
    // Thread-grade rules never queue: Java checks the behaviour of QPS rules only.
    let thread = FlowRule::new("r").grade(FlowGrade::Thread).count(2.0).control_behavior(ControlBehavior::RateLimiter);
    engine.load_flow_rules([thread.max_queueing_time_ms(0)]).unwrap();
}

#[test]
fn a_rate_limiter_slower_than_can_be_represented_is_rejected() {
    let engine = Sentinel::builder().build();
    let tiny = FlowRule::new("r").count(1e-300).control_behavior(ControlBehavior::RateLimiter);
    let err = engine.load_flow_rules([tiny]).unwrap_err();
    assert!(err.to_string().contains("slowest rate"), "{err}");
}

#[test]
fn extreme_rule_values_never_panic_or_wrap() {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    for c in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(engine.load_flow_rules([FlowRule::new("x").count(c)]).is_err(), "count {c}");
    }
    engine.load_flow_rules([FlowRule::new("huge").count(1e300)]).unwrap();
    let r = engine.resource("huge");
    assert!(r.entry().acquire(u32::MAX).enter().is_ok());
    assert!(r.entry().acquire(0).enter().is_ok());
    engine.load_flow_rules([FlowRule::new("t").grade(FlowGrade::Thread).count(1e300)]).unwrap();
    let r = engine.resource("t");
    drop(r.entry().acquire(u32::MAX).enter().unwrap());
    let slow = DegradeRule::new("d", DegradeGrade::SlowRequestRatio)
        .count(1e300)
        .time_window_sec(u32::MAX)
        .min_request_amount(u32::MAX)
        .stat_interval_ms(u32::MAX)
        .slow_ratio_threshold(0.0);
    engine.load_degrade_rules([slow]).unwrap();
    let r = engine.resource("d");
    for _ in 0..10 {
        drop(r.enter());
    }
    let errors =
        DegradeRule::new("d2", DegradeGrade::ErrorCount).count(0.0).time_window_sec(u32::MAX).min_request_amount(1);
    engine.load_degrade_rules([errors]).unwrap();
    let r = engine.resource("d2");
    r.enter().unwrap().set_error();
    assert!(r.enter().is_err(), "open for u32::MAX seconds");
    let p = ParamFlowRule::new("p", 0).count(1e300).burst_count(u64::MAX >> 1).duration_in_sec(u64::MAX);
    engine.load_param_flow_rules([p]).unwrap();
    let r = engine.resource("p");
    for a in [0u32, 1, u32::MAX] {
        let _ = r.entry().acquire(a).args(&[&1u64]).enter();
    }
    let p = ParamFlowRule::new("p2", 0)
        .count(1e-9)
        .duration_in_sec(u64::MAX)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(u64::MAX);
    engine.load_param_flow_rules([p]).unwrap();
    let r = engine.resource("p2");
    for _ in 0..3 {
        let _ = r.entry().acquire(u32::MAX).args(&[&1u64]).decide();
    }
    // The clock at its ends.
    clock.set_millis(0);
    let _ = engine.resource("huge").enter();
    clock.set_nanos(u64::MAX - 1);
    let _ = engine.resource("huge").enter();
    clock.advance_millis(10);
    let _ = engine.resource("huge").enter();
}

#[test]
fn a_clock_that_goes_back_or_wraps_never_admits_past_the_limit() {
    let (engine, clock) = engine_with(10, 10);
    engine.load_flow_rules([FlowRule::new("q").count(5.0)]).unwrap();
    let breaker = DegradeRule::new("q", DegradeGrade::ErrorCount).count(100.0).min_request_amount(1).time_window_sec(1);
    engine.load_degrade_rules([breaker]).unwrap();
    let r = engine.resource("q");
    let passed = |n| (0..n).filter(|_| r.enter().is_ok()).count();
    assert_eq!(passed(10), 5);
    clock.set_millis(T0 - 10_000);
    assert_eq!(passed(10), 0, "ten seconds back: the window in force is not reopened");
    clock.set_millis(0);
    let _ = passed(10);
    clock.set_millis(T0);
    let _ = passed(10);
    clock.set_nanos(u64::MAX - 1);
    assert!(passed(10) <= 5);
    clock.advance_millis(10);
    assert!(passed(10) <= 5);
}
