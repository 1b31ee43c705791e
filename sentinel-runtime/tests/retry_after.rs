//! `BlockError::retry_after` (when a blocked call could pass if retried, filled where the block is decided), and
//! `Sentinel::has_rules_for`, the two core facts the web layer builds on.
//! Every test checks the figure against the engine itself: retried just before it the call is still blocked,
//! retried at it the call passes.

use std::time::Duration;

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowGrade, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::{BlockError, EntryType, Sentinel};

/// An engine whose clock sits `offset_ms` into a 500 ms bucket.
fn engine_at(offset_ms: u64) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000 + offset_ms);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.set_system_readings(None, None);
    (engine, clock)
}

fn blocked(r: Result<sentinel_runtime::Entry<'_>, BlockError>) -> BlockError {
    match r {
        Ok(e) => panic!("expected a block, the call passed: {e:?}"),
        Err(b) => b,
    }
}

fn ms(n: u64) -> Option<Duration> {
    Some(Duration::from_millis(n))
}

#[test]
fn qps_block_with_a_full_current_bucket_retries_when_the_whole_window_has_slid() {
    let (e, clock) = engine_at(100);
    e.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    let api = e.resource("api");
    drop(api.enter().unwrap());
    let b = blocked(api.enter());
    assert!(matches!(b, BlockError::Flow { .. }));
    // 400 ms to the end of this bucket, then 500 more until the bucket holding the pass leaves the window.
    assert_eq!(b.retry_after(), ms(900));
    clock.advance_millis(899);
    assert_eq!(blocked(api.enter()).retry_after(), ms(1));
    clock.advance_millis(1);
    assert!(api.enter().is_ok());
}

#[test]
fn qps_block_with_room_in_the_current_bucket_retries_at_its_end() {
    let (e, clock) = engine_at(400);
    e.load_flow_rules([FlowRule::new("api").count(2.0)]).unwrap();
    let api = e.resource("api");
    drop(api.enter().unwrap()); // in the bucket that ends in 100 ms
    clock.advance_millis(300); // 200 ms into the next bucket
    drop(api.enter().unwrap());
    let b = blocked(api.enter());
    // The current bucket holds one pass: once the older bucket slides out (in 300 ms) there is room.
    assert_eq!(b.retry_after(), ms(300));
    clock.advance_millis(299);
    assert!(api.enter().is_err());
    clock.advance_millis(1);
    assert!(api.enter().is_ok());
}

#[test]
fn the_general_check_path_reports_the_same_window_as_the_lone_rule_path() {
    // A breaker (never tripping) and a second, looser rule send the call down the general path.
    let (e, _clock) = engine_at(100);
    e.load_flow_rules([FlowRule::new("api").count(1.0), FlowRule::new("api").count(50.0).limit_app("other")]).unwrap();
    e.load_degrade_rules([DegradeRule::new("api", DegradeGrade::ErrorCount).count(100.0).time_window_sec(1)]).unwrap();
    let api = e.resource("api");
    drop(api.enter().unwrap());
    assert_eq!(blocked(api.enter()).retry_after(), ms(900));
}

#[test]
fn warm_up_block_reports_the_next_window() {
    let (e, _clock) = engine_at(0);
    e.load_flow_rules([FlowRule::new("api").count(10.0).control_behavior(ControlBehavior::WarmUp)]).unwrap();
    let api = e.resource("api");
    let mut last = None;
    for _ in 0..20 {
        if let Err(b) = api.enter() {
            last = Some(b);
            break;
        }
    }
    let b = last.expect("a cold warm-up rule of 10 qps blocks within 20 calls");
    assert_eq!(b.retry_after(), ms(1000), "the current bucket alone is full: the whole window must slide");
}

#[test]
fn a_limit_below_the_acquire_count_never_admits_so_no_retry_time() {
    let (e, _clock) = engine_at(0);
    e.load_flow_rules([FlowRule::new("api").count(0.0)]).unwrap();
    assert_eq!(blocked(e.resource("api").enter()).retry_after(), None);
    e.load_flow_rules([FlowRule::new("api").count(2.0)]).unwrap();
    assert_eq!(blocked(e.resource("api").entry().acquire(3).enter()).retry_after(), None);
}

#[test]
fn thread_grade_block_has_no_retry_time() {
    let (e, _clock) = engine_at(0);
    e.load_flow_rules([FlowRule::new("api").grade(FlowGrade::Thread).count(1.0)]).unwrap();
    let api = e.resource("api");
    let _held = api.enter().unwrap();
    assert_eq!(blocked(api.enter()).retry_after(), None);
}

#[test]
fn rate_limiter_block_retries_after_the_wait_beyond_the_queueing_limit() {
    let (e, clock) = engine_at(0);
    // One pass per 100 ms, queueing at most 50 ms.
    e.load_flow_rules([FlowRule::new("api")
        .count(10.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(50)])
        .unwrap();
    let api = e.resource("api");
    drop(api.enter().unwrap());
    let b = blocked(api.enter());
    assert_eq!(b.retry_after(), ms(50), "the next slot is 100 ms away, 50 ms beyond the queueing limit");
    clock.advance_millis(50);
    let queued = api.entry().decide().expect("retried at the hint, the call queues");
    assert_eq!(queued.waited(), Duration::from_millis(50), "and waits exactly the queueing limit");
}

#[test]
fn open_breaker_retries_at_its_retry_time_and_half_open_has_none() {
    let (e, clock) = engine_at(0);
    e.load_degrade_rules([DegradeRule::new("db", DegradeGrade::ErrorCount)
        .count(1.0)
        .min_request_amount(1)
        .time_window_sec(10)])
        .unwrap();
    let db = e.resource("db");
    for _ in 0..2 {
        let mut entry = db.enter().unwrap();
        entry.set_error();
    }
    let b = blocked(db.enter());
    assert!(matches!(b, BlockError::Degrade { .. }));
    assert_eq!(b.retry_after(), ms(10_000));
    clock.advance_millis(4_000);
    assert_eq!(blocked(db.enter()).retry_after(), ms(6_000));
    clock.advance_millis(6_000);
    let probe = db.enter().expect("at the retry time a probe passes");
    // The probe is out (half-open): its completion decides, at a time nobody knows.
    assert_eq!(blocked(db.enter()).retry_after(), None);
    drop(probe);
}

#[test]
fn hot_value_bucket_retries_at_the_refill_that_gives_it_a_token() {
    let (e, clock) = engine_at(0);
    e.load_param_flow_rules([ParamFlowRule::new("get", 0).count(2.0)]).unwrap();
    let get = e.resource("get");
    let call = |v: &str| get.entry().args(&[&v]).enter().map(drop);
    call("a").unwrap();
    clock.advance_millis(300);
    call("a").unwrap();
    let b = call("a").unwrap_err();
    assert!(matches!(b, BlockError::ParamFlow { .. }));
    // The bucket was filled at 0 ms; it refills strictly more than 1000 ms later, adding 2 tokens.
    assert_eq!(b.retry_after(), ms(701));
    clock.advance_millis(700);
    assert!(call("a").is_err());
    clock.advance_millis(1);
    assert!(call("a").is_ok());
    // Another value is not affected.
    assert!(call("b").is_ok());
}

#[test]
fn hot_value_refill_too_small_for_the_call_waits_for_enough_tokens() {
    let (e, clock) = engine_at(0);
    // 4 tokens per 10 s; a call takes 4.
    e.load_param_flow_rules([ParamFlowRule::new("get", 0).count(4.0).duration_in_sec(10)]).unwrap();
    let get = e.resource("get");
    let call = |n: u32| get.entry().acquire(n).args(&[&7u32]).enter().map(drop);
    call(1).unwrap(); // 3 left
    call(3).unwrap(); // 0 left
    clock.advance_millis(12_000); // refill due: 12 s * 4 / 10 s = 4 tokens, but refills happen on a pass
    call(4).unwrap(); // 0 left, refilled at 12 s
    let b = call(4).unwrap_err();
    assert_eq!(b.retry_after(), ms(10_001));
    clock.advance_millis(10_000);
    assert!(call(4).is_err());
    clock.advance_millis(1);
    assert!(call(4).is_ok());
}

#[test]
fn hot_value_rate_limiter_retries_once_the_wait_is_below_the_queueing_time() {
    let (e, clock) = engine_at(0);
    e.load_param_flow_rules([ParamFlowRule::new("get", 0)
        .count(5.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(100)])
        .unwrap();
    let get = e.resource("get");
    let call = |v: u32| get.entry().args(&[&v]).decide();
    drop(call(1).unwrap());
    // 200 ms spacing, strictly less than 100 ms of queueing: blocked until the wait drops under 100 ms.
    let b = call(1).unwrap_err();
    let retry = b.retry_after().expect("a rate limiter knows its spacing");
    assert_eq!(retry, Duration::from_millis(100) + Duration::from_nanos(1));
    clock.advance(retry);
    let queued = call(1).expect("retried at the hint, the value queues");
    assert!(queued.waited() < Duration::from_millis(100));
}

#[test]
fn system_qps_block_reports_the_inbound_window_and_other_limits_none() {
    let (e, clock) = engine_at(250);
    e.load_system_rules([SystemRule { qps: Some(1.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    drop(api.enter().unwrap());
    let b = blocked(api.enter());
    assert!(matches!(b, BlockError::System { .. }));
    // The system check reads the pass qps, whose window no longer holds a bucket exactly one second old.
    assert_eq!(b.retry_after(), ms(750));
    clock.advance_millis(749);
    assert!(api.enter().is_err());
    clock.advance_millis(1);
    assert!(api.enter().is_ok());

    e.load_system_rules([SystemRule { max_thread: Some(1), ..Default::default() }]).unwrap();
    let (_a, _b) = (api.enter().unwrap(), api.enter().unwrap());
    let b = blocked(api.enter());
    assert!(matches!(b, BlockError::System { limit: sentinel_runtime::SystemLimit::Thread { .. }, .. }));
    assert_eq!(b.retry_after(), None);
}

#[test]
fn authority_block_has_no_retry_time() {
    let (e, _clock) = engine_at(0);
    e.load_authority_rules([AuthorityRule::new("api", "appA", AuthorityStrategy::White)]).unwrap();
    let b = blocked(e.resource("api").entry().origin("appB").enter());
    assert!(matches!(b, BlockError::Authority { .. }));
    assert_eq!(b.retry_after(), None);
}

#[test]
fn relate_rule_reading_another_resource_reports_that_resource_window() {
    let (e, clock) = engine_at(100);
    e.load_flow_rules([FlowRule::new("read").count(1.0).relate("write")]).unwrap();
    let write = e.resource("write");
    drop(write.enter().unwrap());
    let b = blocked(e.resource("read").enter());
    // A relate rule reads the pass qps, whose window no longer holds a bucket exactly one second old.
    assert_eq!(b.retry_after(), ms(900));
    clock.advance_millis(899);
    assert!(e.resource("read").enter().is_err());
    clock.advance_millis(1);
    assert!(e.resource("read").enter().is_ok());
}

#[test]
fn has_rules_for_sees_every_kind_that_names_a_resource_and_not_default_breakers() {
    let (e, _clock) = engine_at(0);
    assert!(!e.has_rules_for("a"));
    e.load_degrade_rules([
        DegradeRule::new("b", DegradeGrade::ErrorCount).count(1.0).time_window_sec(1),
        DegradeRule::new("*", DegradeGrade::ErrorCount).count(1.0).time_window_sec(1),
    ])
    .unwrap();
    e.load_param_flow_rules([ParamFlowRule::new("c", 0).count(1.0)]).unwrap();
    e.load_authority_rules([AuthorityRule::new("d", "x", AuthorityStrategy::Black)]).unwrap();
    e.load_flow_rules([FlowRule::new("a").count(1.0)]).unwrap();
    for name in ["a", "b", "c", "d"] {
        assert!(e.has_rules_for(name), "{name}");
    }
    assert!(!e.has_rules_for("z"), "a default `*` breaker names no resource");
    e.load_flow_rules([]).unwrap();
    assert!(!e.has_rules_for("a"));
}
