//! Circuit breakers through the public API: an isolated engine with a manual clock per test.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule, TraceFilter};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::slot::{Slot, SlotEntry};
use sentinel_runtime::{BlockError, Resource, RuleError, RuleKind, Sentinel};

/// A whole second, so that a test's calls fall in one 1 s statistics interval.
const T0: u64 = 1_700_000_000_000;

type Transition = (BreakerState, BreakerState, Option<f64>);

fn engine() -> (Sentinel, ManualClock, Arc<Mutex<Vec<Transition>>>) {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    engine.register_state_observer("test", move |prev, new, _rule, snapshot| {
        log.lock().unwrap().push((prev, new, snapshot));
    });
    (engine, clock, seen)
}

/// One call that takes `rt_micros` and fails when `error`; `false` when it was blocked.
fn call(res: &Resource, clock: &ManualClock, rt_micros: u64, error: bool) -> bool {
    match res.enter() {
        Ok(mut e) => {
            clock.advance(Duration::from_micros(rt_micros));
            if error {
                e.set_error();
            }
            true
        }
        Err(BlockError::Degrade { .. }) => false,
        Err(other) => panic!("unexpected block: {other}"),
    }
}

fn state(engine: &Sentinel, res: &str) -> BreakerState {
    engine.circuit_breakers(res)[0].state
}

fn transitions(seen: &Mutex<Vec<Transition>>) -> Vec<Transition> {
    seen.lock().unwrap().clone()
}

fn error_count_rule(res: &str, count: f64, min: u32) -> DegradeRule {
    DegradeRule::new(res, DegradeGrade::ErrorCount).count(count).min_request_amount(min).time_window_sec(10)
}

// ---- slow request ratio ----

#[test]
fn slow_ratio_trips_only_when_the_share_is_strictly_above_the_threshold() {
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("db", DegradeGrade::SlowRequestRatio)
            .count(50.0)
            .slow_ratio_threshold(0.5)
            .min_request_amount(4)
            .time_window_sec(10)])
        .unwrap();
    let db = engine.resource("db");
    assert!(call(&db, &clock, 60_000, false));
    assert!(call(&db, &clock, 60_000, false));
    assert!(call(&db, &clock, 1_000, false));
    assert!(call(&db, &clock, 1_000, false));
    // 2 of 4 slow = 0.5: not above 0.5.
    assert_eq!(state(&engine, "db"), BreakerState::Closed);
    assert!(call(&db, &clock, 60_000, false)); // 3 of 5 = 0.6
    assert_eq!(state(&engine, "db"), BreakerState::Open);
    assert_eq!(transitions(&seen), vec![(BreakerState::Closed, BreakerState::Open, Some(0.6))]);
    assert!(!call(&db, &clock, 0, false));
}

#[test]
fn slow_means_strictly_above_count_in_microseconds() {
    let (engine, clock, _) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("db", DegradeGrade::SlowRequestRatio)
            .count(50.0)
            .slow_ratio_threshold(0.0)
            .min_request_amount(1)
            .time_window_sec(10)])
        .unwrap();
    let db = engine.resource("db");
    // Exactly 50 ms is not slow; the 0.0 threshold trips on the first slow call.
    for _ in 0..3 {
        assert!(call(&db, &clock, 50_000, false));
    }
    assert_eq!(state(&engine, "db"), BreakerState::Closed);
    assert_eq!(engine.circuit_breakers("db")[0].interval_total, 3);
    // 50.001 ms is slow (Java's whole milliseconds would call it 50).
    assert!(call(&db, &clock, 50_001, false));
    assert_eq!(state(&engine, "db"), BreakerState::Open);
}

#[test]
fn slow_ratio_threshold_of_one_trips_at_exactly_one() {
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("db", DegradeGrade::SlowRequestRatio)
            .count(10.0)
            .min_request_amount(3)
            .time_window_sec(10)])
        .unwrap();
    let db = engine.resource("db");
    assert!(call(&db, &clock, 20_000, false));
    assert!(call(&db, &clock, 20_000, false));
    assert_eq!(state(&engine, "db"), BreakerState::Closed); // 2 < min 3
    assert!(call(&db, &clock, 20_000, false));
    assert_eq!(state(&engine, "db"), BreakerState::Open);
    assert_eq!(transitions(&seen), vec![(BreakerState::Closed, BreakerState::Open, Some(1.0))]);
}

#[test]
fn slow_ratio_probe_is_judged_by_its_response_time() {
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("db", DegradeGrade::SlowRequestRatio)
            .count(10.0)
            .min_request_amount(1)
            .time_window_sec(2)])
        .unwrap();
    let db = engine.resource("db");
    assert!(call(&db, &clock, 20_000, false));
    assert_eq!(state(&engine, "db"), BreakerState::Open);
    clock.advance_millis(2_000);
    // A slow probe re-opens, even without an error.
    assert!(call(&db, &clock, 30_000, false));
    assert_eq!(state(&engine, "db"), BreakerState::Open);
    clock.advance_millis(2_000);
    // A fast probe closes, even with an error (errors do not matter to a slow-ratio rule).
    assert!(call(&db, &clock, 1_000, true));
    assert_eq!(state(&engine, "db"), BreakerState::Closed);
    let states: Vec<_> = transitions(&seen).into_iter().map(|(p, n, _)| (p, n)).collect();
    use BreakerState::*;
    assert_eq!(states, vec![(Closed, Open), (Open, HalfOpen), (HalfOpen, Open), (Open, HalfOpen), (HalfOpen, Closed)]);
}

// ---- error ratio ----

#[test]
fn error_ratio_trips_only_when_the_ratio_is_strictly_above_count() {
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("api", DegradeGrade::ErrorRatio)
            .count(0.5)
            .min_request_amount(4)
            .time_window_sec(10)])
        .unwrap();
    let api = engine.resource("api");
    for error in [true, true, false, false] {
        assert!(call(&api, &clock, 100, error));
    }
    assert_eq!(state(&engine, "api"), BreakerState::Closed); // 2/4 = 0.5
    assert!(call(&api, &clock, 100, true)); // 3/5 = 0.6
    assert_eq!(state(&engine, "api"), BreakerState::Open);
    assert_eq!(transitions(&seen), vec![(BreakerState::Closed, BreakerState::Open, Some(0.6))]);
}

#[test]
fn error_ratio_of_one_never_trips() {
    let (engine, clock, _) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("api", DegradeGrade::ErrorRatio)
            .count(1.0)
            .min_request_amount(1)
            .time_window_sec(10)])
        .unwrap();
    let api = engine.resource("api");
    for _ in 0..20 {
        assert!(call(&api, &clock, 100, true));
    }
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
}

#[test]
fn below_min_request_amount_never_trips_and_the_interval_is_tumbling() {
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("api", DegradeGrade::ErrorRatio)
            .count(0.1)
            .min_request_amount(10)
            .time_window_sec(10)])
        .unwrap();
    let api = engine.resource("api");
    for _ in 0..3 {
        // 9 failures in each 1 s interval (aligned to whole seconds): never 10 in one interval.
        for _ in 0..9 {
            assert!(call(&api, &clock, 1_000, true));
        }
        assert_eq!(engine.circuit_breakers("api")[0].interval_total, 9);
        clock.set_millis((clock.now_millis() / 1000 + 1) * 1000);
    }
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    assert!(transitions(&seen).is_empty());
}

#[test]
fn statistics_interval_is_aligned_to_the_epoch() {
    let (engine, clock, _) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 2.0, 1).stat_interval_ms(1000)]).unwrap();
    let api = engine.resource("api");
    clock.set_millis(T0 + 998);
    assert!(call(&api, &clock, 0, true));
    assert!(call(&api, &clock, 0, true));
    // 2 errors at T0+998 ms; the third falls at T0+1000 ms, a new interval: no trip.
    clock.set_millis(T0 + 1000);
    assert!(call(&api, &clock, 0, true));
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    assert_eq!(engine.circuit_breakers("api")[0].interval_bad, 1);
}

// ---- error count ----

#[test]
fn error_count_trips_above_count_and_can_trip_on_a_successful_call() {
    let (engine, clock, seen) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 2.0, 5)]).unwrap();
    let api = engine.resource("api");
    for _ in 0..3 {
        assert!(call(&api, &clock, 100, true));
    }
    // 3 errors > 2, but only 3 calls < 5.
    assert!(call(&api, &clock, 100, false));
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    // The fifth call succeeds, and trips the breaker.
    assert!(call(&api, &clock, 100, false));
    assert_eq!(state(&engine, "api"), BreakerState::Open);
    assert_eq!(transitions(&seen), vec![(BreakerState::Closed, BreakerState::Open, Some(3.0))]);
}

#[test]
fn error_count_exactly_at_count_does_not_trip() {
    let (engine, clock, _) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 3.0, 1)]).unwrap();
    let api = engine.resource("api");
    for _ in 0..3 {
        assert!(call(&api, &clock, 100, true));
    }
    for _ in 0..10 {
        assert!(call(&api, &clock, 100, false));
    }
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    assert!(call(&api, &clock, 100, true));
    assert_eq!(state(&engine, "api"), BreakerState::Open);
}

// ---- the state machine ----

#[test]
fn open_blocks_until_the_retry_time_then_one_probe_closes_it() {
    let (engine, clock, seen) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    let opened = clock.now_millis();
    let snap = &engine.circuit_breakers("api")[0];
    assert_eq!((snap.state, snap.retry_at_ms), (BreakerState::Open, Some(opened + 10_000)));
    clock.set_millis(opened + 9_999);
    assert!(!call(&api, &clock, 0, false));
    clock.set_millis(opened + 10_000);
    let probe = api.enter().expect("the probe passes at the retry time");
    assert_eq!(state(&engine, "api"), BreakerState::HalfOpen);
    assert!(!call(&api, &clock, 0, false), "others are blocked while the probe is out");
    drop(probe);
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    let snap = &engine.circuit_breakers("api")[0];
    assert_eq!((snap.interval_total, snap.retry_at_ms), (0, None), "closing empties the counts");
    assert_eq!(
        transitions(&seen),
        vec![
            (BreakerState::Closed, BreakerState::Open, Some(1.0)),
            (BreakerState::Open, BreakerState::HalfOpen, None),
            (BreakerState::HalfOpen, BreakerState::Closed, None),
        ]
    );
    assert!(call(&api, &clock, 0, false));
}

#[test]
fn a_failed_probe_reopens_with_a_fresh_retry_time() {
    let (engine, clock, seen) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    clock.advance_millis(10_000);
    assert!(call(&api, &clock, 5_000, true)); // the probe fails after 5 ms
    let failed_at = clock.now_millis();
    let snap = &engine.circuit_breakers("api")[0];
    assert_eq!((snap.state, snap.retry_at_ms), (BreakerState::Open, Some(failed_at + 10_000)));
    assert_eq!(transitions(&seen)[2], (BreakerState::HalfOpen, BreakerState::Open, Some(1.0)));
    clock.set_millis(failed_at + 9_999);
    assert!(!call(&api, &clock, 0, false));
    clock.set_millis(failed_at + 10_000);
    assert!(call(&api, &clock, 0, false));
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
}

#[test]
fn an_error_traced_on_the_probe_reopens_an_error_ratio_breaker() {
    let (engine, clock, _) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("api", DegradeGrade::ErrorRatio)
            .count(0.2)
            .min_request_amount(1)
            .time_window_sec(1)])
        .unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    clock.advance_millis(1_000);
    let mut probe = api.enter().unwrap();
    probe.trace(&std::io::Error::other("downstream down"));
    drop(probe);
    assert_eq!(state(&engine, "api"), BreakerState::Open);
}

struct Gate(Arc<AtomicBool>);

impl Slot for Gate {
    fn name(&self) -> &'static str {
        "gate"
    }
    fn entry(&self, _e: &SlotEntry<'_>) -> Result<(), String> {
        if self.0.load(Ordering::SeqCst) {
            Err("closed".into())
        } else {
            Ok(())
        }
    }
}

#[test]
fn a_probe_blocked_by_a_later_slot_reopens_without_refreshing_the_retry_time() {
    let (engine, clock, seen) = engine();
    let gate = Arc::new(AtomicBool::new(false));
    engine.add_slot(-500, Gate(gate.clone())); // after the degrade slot (-1000)
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    let retry = engine.circuit_breakers("api")[0].retry_at_ms.unwrap();
    clock.advance_millis(12_000);
    gate.store(true, Ordering::SeqCst);
    match api.enter() {
        Err(BlockError::Custom { slot, .. }) => assert_eq!(slot, "gate"),
        other => panic!("expected the gate to block, got {other:?}"),
    }
    let snap = &engine.circuit_breakers("api")[0];
    assert_eq!((snap.state, snap.retry_at_ms), (BreakerState::Open, Some(retry)), "retry time kept");
    assert_eq!(transitions(&seen)[2], (BreakerState::HalfOpen, BreakerState::Open, Some(1.0)));
    // The retry time has passed already: the next call is the probe at once.
    gate.store(false, Ordering::SeqCst);
    assert!(call(&api, &clock, 0, false));
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
}

#[test]
fn a_call_a_rate_limiter_queues_past_the_retry_time_is_the_probe() {
    // Java's rate limiter waits inside the flow slot: the degrade slot after it sees the call at the end of its
    // wait. A call made while the breaker is open, whose turn comes after the retry time, is the probe.
    let (engine, clock, seen) = engine();
    let spaced = FlowRule::new("api").control_behavior(ControlBehavior::RateLimiter).count(0.5);
    engine.load_flow_rules(vec![spaced.max_queueing_time_ms(3_000)]).unwrap();
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1).time_window_sec(1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true)); // passes at once and fails: open until T0 + 1 s
    assert_eq!(engine.circuit_breakers("api")[0].retry_at_ms, Some(T0 + 1_000));
    // Its turn is at T0 + 2 s, past the retry time.
    let probe = api.enter().expect("queued past the retry time, the call is the probe");
    assert_eq!(probe.waited(), Duration::from_millis(2_000));
    assert_eq!(state(&engine, "api"), BreakerState::HalfOpen);
    drop(probe);
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    assert_eq!(transitions(&seen).len(), 3);
}

#[test]
fn blocked_calls_are_not_counted() {
    let (engine, clock, _) = engine();
    engine.load_flow_rules(vec![FlowRule::new("api").count(2.0)]).unwrap();
    engine.load_degrade_rules(vec![error_count_rule("api", 5.0, 1)]).unwrap();
    let api = engine.resource("api");
    for _ in 0..5 {
        let _ = api.enter();
    }
    let _ = clock;
    assert_eq!(engine.circuit_breakers("api")[0].interval_total, 2);
}

#[test]
fn many_threads_at_the_retry_time_get_exactly_one_probe() {
    const THREADS: usize = 8;
    let (engine, clock, _) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1).time_window_sec(1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    for round in 0..50 {
        clock.advance_millis(1_000);
        let start = Barrier::new(THREADS);
        let decided = Barrier::new(THREADS);
        let passed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    start.wait();
                    let entry = api.enter();
                    if entry.is_ok() {
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                    // Hold the probe until everyone has tried.
                    decided.wait();
                    if let Ok(mut e) = entry {
                        e.set_error(); // the probe fails: open again for the next round
                    }
                });
            }
        });
        assert_eq!(passed.load(Ordering::SeqCst), 1, "round {round}");
        assert_eq!(state(&engine, "api"), BreakerState::Open);
    }
}

// ---- counts under concurrency ----

/// `calls` completions of `res` on this thread at the frozen clock; those with `error(i)` fail.
fn complete(res: &Resource, calls: usize, error: impl Fn(usize) -> bool) {
    for i in 0..calls {
        let mut e = res.enter().unwrap_or_else(|b| panic!("call {i} blocked: {b}"));
        if error(i) {
            e.set_error();
        }
    }
}

#[test]
fn error_counts_from_many_threads_are_summed_exactly_and_trip_at_the_expected_completion() {
    const THREADS: usize = 6;
    const ERRORS_PER_THREAD: usize = 40;
    let (engine, _clock, seen) = engine();
    let limit = THREADS * ERRORS_PER_THREAD;
    engine.load_degrade_rules(vec![error_count_rule("api", limit as f64, 1)]).unwrap();
    let api = engine.resource("api");
    // Exactly `count` errors among three times as many calls, completed concurrently: not above the count.
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                complete(&api, 4 * ERRORS_PER_THREAD, |i| i % 4 == 1);
            });
        }
    });
    let snap = &engine.circuit_breakers("api")[0];
    assert_eq!((snap.interval_total, snap.interval_bad), (4 * limit as u64, limit as u64));
    assert_eq!(snap.state, BreakerState::Closed);
    assert!(transitions(&seen).is_empty());
    // Good calls on yet other threads do not trip it; the next error does, seeing every error before it.
    std::thread::scope(|s| {
        s.spawn(|| complete(&api, 10, |_| false));
    });
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    std::thread::scope(|s| {
        s.spawn(|| complete(&api, 1, |_| true));
    });
    assert_eq!(state(&engine, "api"), BreakerState::Open);
    assert_eq!(transitions(&seen), vec![(BreakerState::Closed, BreakerState::Open, Some(limit as f64 + 1.0))]);
}

#[test]
fn error_ratio_trips_on_the_good_call_that_reaches_min_request_amount() {
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("api", DegradeGrade::ErrorRatio)
            .count(0.5)
            .min_request_amount(3)
            .time_window_sec(10)])
        .unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 100, true));
    assert!(call(&api, &clock, 100, true));
    assert_eq!(state(&engine, "api"), BreakerState::Closed); // 2 < 3 calls
    assert!(call(&api, &clock, 100, false)); // 2 of 3 > 0.5
    assert_eq!(state(&engine, "api"), BreakerState::Open);
    assert_eq!(transitions(&seen), vec![(BreakerState::Closed, BreakerState::Open, Some(2.0 / 3.0))]);
}

#[test]
fn a_trip_that_needs_every_concurrent_completion_of_the_interval_is_not_missed() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 150;
    let (engine, _clock, _) = engine();
    for round in 0..20 {
        // Any error trips, but only once all the calls of the round are in: the decision is the interval's
        // last completion's, whichever thread it is on, and it is most often a good call.
        let name = format!("api{round}");
        engine
            .load_degrade_rules(vec![DegradeRule::new(name.as_str(), DegradeGrade::ErrorRatio)
                .count(0.0)
                .min_request_amount((THREADS * PER_THREAD) as u32)
                .time_window_sec(10)])
            .unwrap();
        let res = engine.resource(&name);
        let start = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (res, start) = (&res, &start);
                s.spawn(move || {
                    start.wait();
                    complete(res, PER_THREAD, |i| t == round % THREADS && i == (round * 41) % PER_THREAD);
                });
            }
        });
        let snap = &engine.circuit_breakers(&name)[0];
        assert_eq!((snap.interval_total, snap.interval_bad), ((THREADS * PER_THREAD) as u64, 1), "round {round}");
        assert_eq!(snap.state, BreakerState::Open, "round {round}");
    }
}

// ---- several breakers, default rules, reloads ----

#[test]
fn two_breakers_on_one_resource_trip_independently() {
    let (engine, clock, _) = engine();
    let slow = DegradeRule::new("api", DegradeGrade::SlowRequestRatio).count(100.0).min_request_amount(1);
    let slow = slow.time_window_sec(10);
    let errors = error_count_rule("api", 1.0, 1).time_window_sec(5);
    engine.load_degrade_rules(vec![slow.clone(), errors.clone()]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 1_000, true));
    assert!(call(&api, &clock, 1_000, true));
    let states: Vec<_> = engine.circuit_breakers("api").iter().map(|b| b.state).collect();
    assert_eq!(states, vec![BreakerState::Closed, BreakerState::Open]);
    match api.enter() {
        Err(BlockError::Degrade { rule, .. }) => assert_eq!(*rule, errors),
        other => panic!("expected a degrade block, got {other:?}"),
    }
    // A probe of the error breaker, then a slow completion trips the slow breaker and closes the other.
    clock.advance_millis(5_000);
    assert!(call(&api, &clock, 200_000, false));
    let states: Vec<_> = engine.circuit_breakers("api").iter().map(|b| b.state).collect();
    assert_eq!(states, vec![BreakerState::Open, BreakerState::Closed]);
}

#[test]
fn a_breaker_due_for_a_probe_is_left_alone_while_another_blocks() {
    let (engine, clock, seen) = engine();
    let short = error_count_rule("api", 0.0, 1).time_window_sec(1);
    let long = error_count_rule("api", 0.0, 1).time_window_sec(60);
    engine.load_degrade_rules(vec![short, long]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    let retry = engine.circuit_breakers("api")[0].retry_at_ms;
    clock.advance_millis(2_000);
    // The short breaker is past its retry time, the long one is not: blocked, and the short one is not
    // even flipped to HALF_OPEN and back.
    assert!(!call(&api, &clock, 0, false));
    let snaps = engine.circuit_breakers("api");
    assert_eq!((snaps[0].state, snaps[0].retry_at_ms), (BreakerState::Open, retry));
    assert_eq!(snaps[1].state, BreakerState::Open);
    assert_eq!(transitions(&seen).len(), 2, "{:?}", transitions(&seen));
}

#[test]
fn many_threads_and_two_due_breakers_give_at_most_one_call_both_probes() {
    const THREADS: usize = 8;
    let (engine, clock, _) = engine();
    let a = error_count_rule("api", 0.0, 1).time_window_sec(1);
    let b = error_count_rule("api", 0.0, 1).time_window_sec(2);
    engine.load_degrade_rules(vec![a, b]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true)); // trips both
    for round in 0..30 {
        clock.advance_millis(2_000);
        let start = Barrier::new(THREADS);
        let decided = Barrier::new(THREADS);
        let passed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    start.wait();
                    let entry = api.enter();
                    if entry.is_ok() {
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                    decided.wait();
                    if let Ok(mut e) = entry {
                        e.set_error();
                    }
                });
            }
        });
        let passed = passed.load(Ordering::SeqCst);
        assert!(passed <= 1, "round {round}: {passed} calls passed");
        if passed == 0 {
            // The probes were split between callers and all given back: the next call takes both.
            assert!(call(&api, &clock, 0, true), "round {round}");
        }
        let states: Vec<_> = engine.circuit_breakers("api").iter().map(|b| b.state).collect();
        assert_eq!(states, vec![BreakerState::Open, BreakerState::Open], "round {round}");
    }
}

#[test]
fn a_resource_takes_at_most_64_degrade_rules() {
    let (engine, _, _) = engine();
    let rules = |n: usize| (0..n).map(|i| error_count_rule("api", i as f64, 1)).collect::<Vec<_>>();
    engine.load_degrade_rules(rules(64)).unwrap();
    assert_eq!(engine.circuit_breakers("api").len(), 64);
    match engine.load_degrade_rules(rules(65)).unwrap_err() {
        RuleError::Invalid { index, field, .. } => assert_eq!((index, field), (64, "resource")),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(engine.degrade_rules().len(), 64);
}

#[test]
fn the_probes_of_all_due_breakers_go_to_one_call_and_its_completion_decides_each() {
    let (engine, clock, seen) = engine();
    let errors = error_count_rule("api", 0.0, 1).time_window_sec(1);
    let slow = DegradeRule::new("api", DegradeGrade::SlowRequestRatio).count(10.0).min_request_amount(1);
    engine.load_degrade_rules(vec![errors, slow.time_window_sec(1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 20_000, true)); // trips both
    clock.advance_millis(1_000);
    // One probe for both: slow but without error: the error breaker closes, the slow one re-opens.
    assert!(call(&api, &clock, 20_000, false));
    let states: Vec<_> = engine.circuit_breakers("api").iter().map(|b| b.state).collect();
    assert_eq!(states, vec![BreakerState::Closed, BreakerState::Open]);
    assert_eq!(transitions(&seen).len(), 6);
}

#[test]
fn default_rules_apply_per_resource_to_resources_without_their_own() {
    let (engine, clock, _) = engine();
    engine.load_degrade_rules(vec![error_count_rule("*", 1.0, 1), error_count_rule("own", 100.0, 1)]).unwrap();
    let (a, b, own) = (engine.resource("a"), engine.resource("b"), engine.resource("own"));
    assert!(call(&a, &clock, 0, true));
    assert!(call(&a, &clock, 0, true));
    assert!(!call(&a, &clock, 0, false), "a's default breaker is open");
    assert!(call(&b, &clock, 0, true), "b has its own default breaker");
    for _ in 0..5 {
        assert!(call(&own, &clock, 0, true), "own rules replace the default ones");
    }
    let a_snap = &engine.circuit_breakers("a")[0];
    assert!(a_snap.is_default);
    assert_eq!(a_snap.rule.resource, "*");
    assert_eq!(engine.circuit_breakers("b")[0].state, BreakerState::Closed);
    let own_snaps = engine.circuit_breakers("own");
    assert_eq!(own_snaps.len(), 1);
    assert!(!own_snaps[0].is_default);
    // Removing the default rules frees the resources.
    engine.load_degrade_rules(vec![error_count_rule("own", 100.0, 1)]).unwrap();
    assert!(call(&a, &clock, 0, false));
    assert!(engine.circuit_breakers("a").is_empty());
}

#[test]
fn reloading_an_equal_rule_keeps_its_breaker_and_state() {
    let (engine, clock, _) = engine();
    let rule = error_count_rule("api", 0.0, 1);
    let dflt = error_count_rule("*", 0.0, 1);
    engine.load_degrade_rules(vec![rule.clone(), dflt.clone()]).unwrap();
    let (api, other) = (engine.resource("api"), engine.resource("other"));
    assert!(call(&api, &clock, 0, true));
    assert!(call(&other, &clock, 0, true));
    let retry = engine.circuit_breakers("api")[0].retry_at_ms;
    // A changed set that keeps both rules: both breakers stay open with their retry time.
    engine.load_degrade_rules(vec![rule.clone(), dflt.clone(), error_count_rule("x", 3.0, 1)]).unwrap();
    assert_eq!(engine.circuit_breakers("api")[0].state, BreakerState::Open);
    assert_eq!(engine.circuit_breakers("api")[0].retry_at_ms, retry);
    assert_eq!(engine.circuit_breakers("other")[0].state, BreakerState::Open);
    assert!(!call(&api, &clock, 0, false));
    // A changed rule is a new breaker.
    engine.load_degrade_rules(vec![rule.count(1.0), dflt]).unwrap();
    assert_eq!(engine.circuit_breakers("api")[0].state, BreakerState::Closed);
    assert!(call(&api, &clock, 0, false));
}

#[test]
fn reloading_a_rule_that_differs_only_in_its_id_keeps_its_breaker_and_state() {
    // Java's `AbstractRule.equals` compares resource, limitApp and regex, not the id: a reload that gives the
    // same rule a new id (a dashboard restarted renumbers its rules) keeps the breaker and its state.
    let (engine, clock, seen) = engine();
    engine
        .load_degrade_rules(vec![error_count_rule("api", 0.0, 1).id(1), error_count_rule("*", 0.0, 1).id(2)])
        .unwrap();
    let (api, other) = (engine.resource("api"), engine.resource("other"));
    assert!(call(&api, &clock, 0, true));
    assert!(call(&other, &clock, 0, true));
    let retry = engine.circuit_breakers("api")[0].retry_at_ms;
    engine
        .load_degrade_rules(vec![error_count_rule("api", 0.0, 1).id(11), error_count_rule("*", 0.0, 1).id(12)])
        .unwrap();
    let snap = &engine.circuit_breakers("api")[0];
    assert_eq!((snap.state, snap.retry_at_ms), (BreakerState::Open, retry));
    assert_eq!(engine.circuit_breakers("other")[0].state, BreakerState::Open);
    assert!(!call(&api, &clock, 0, false));
    assert!(!call(&other, &clock, 0, false));
    assert_eq!(transitions(&seen).len(), 2, "no transition but the two trips");
    assert_eq!(engine.circuit_breakers("api")[0].rule.id, Some(11), "the breaker has the rule in force");

    // A probe out across such a reload still decides the breaker, and later calls are counted once.
    clock.set_millis(retry.unwrap());
    let probe = api.enter().unwrap();
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1).id(21)]).unwrap();
    assert_eq!(state(&engine, "api"), BreakerState::HalfOpen);
    drop(probe);
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    assert!(call(&api, &clock, 0, false));
    assert_eq!(engine.circuit_breakers("api")[0].interval_total, 1);

    // Regex rules too.
    engine.load_degrade_rules(vec![error_count_rule("re.*", 0.0, 1).regex(true).id(3)]).unwrap();
    let re = engine.resource("resource");
    assert!(call(&re, &clock, 0, true));
    engine.load_degrade_rules(vec![error_count_rule("re.*", 0.0, 1).regex(true).id(4)]).unwrap();
    assert_eq!(state(&engine, "resource"), BreakerState::Open);
}

#[test]
fn a_probe_out_during_a_reload_of_an_equal_rule_still_decides_its_breaker() {
    let (engine, clock, _) = engine();
    let rule = error_count_rule("api", 0.0, 1).time_window_sec(1);
    engine.load_degrade_rules(vec![rule.clone()]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    clock.advance_millis(1_000);
    let probe = api.enter().unwrap();
    engine.load_degrade_rules(vec![rule, error_count_rule("x", 1.0, 1)]).unwrap();
    assert_eq!(state(&engine, "api"), BreakerState::HalfOpen);
    drop(probe);
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
}

#[test]
fn equal_rules_are_deduplicated() {
    let (engine, _, _) = engine();
    let rule = error_count_rule("api", 2.0, 1);
    engine.load_degrade_rules(vec![rule.clone(), rule.clone()]).unwrap();
    assert_eq!(engine.degrade_rules(), vec![rule]);
    assert_eq!(engine.circuit_breakers("api").len(), 1);
    assert!(engine.circuit_breakers("nothing").is_empty());
}

#[test]
fn an_invalid_rule_rejects_the_whole_set_and_the_rules_in_force_stay() {
    let (engine, _, _) = engine();
    let good = error_count_rule("api", 2.0, 1);
    engine.load_degrade_rules(vec![good.clone()]).unwrap();
    let ok = || error_count_rule("x", 1.0, 1);
    let ratio = |c| DegradeRule::new("x", DegradeGrade::ErrorRatio).count(c).time_window_sec(1);
    let slow = |t: f64| {
        DegradeRule::new("x", DegradeGrade::SlowRequestRatio).count(5.0).time_window_sec(1).slow_ratio_threshold(t)
    };
    let cases: Vec<(DegradeRule, &str)> = vec![
        (DegradeRule::new("  ", DegradeGrade::ErrorCount).count(1.0).time_window_sec(1), "resource"),
        (ok().count(-1.0), "count"),
        (ok().count(f64::NAN), "count"),
        (ok().count(f64::INFINITY), "count"),
        (ratio(1.5), "count"),
        (ok().time_window_sec(0), "time_window_sec"),
        (ok().min_request_amount(0), "min_request_amount"),
        (ok().stat_interval_ms(0), "stat_interval_ms"),
        (slow(1.5), "slow_ratio_threshold"),
        (slow(-0.1), "slow_ratio_threshold"),
        (slow(f64::NAN), "slow_ratio_threshold"),
    ];
    for (bad, expected) in cases {
        let err = engine.load_degrade_rules(vec![ok(), bad.clone()]).unwrap_err();
        match &err {
            RuleError::Invalid { kind, index, field, .. } => {
                assert_eq!((*kind, *index, *field), (RuleKind::Degrade, 1, expected), "{bad:?}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains(expected));
        assert_eq!(engine.degrade_rules(), vec![good.clone()]);
    }
    // Valid edge values load.
    engine.load_degrade_rules(vec![ratio(1.0), ratio(0.0), slow(0.0), slow(1.0), ok().count(0.0)]).unwrap();
    assert_eq!(engine.degrade_rules().len(), 5);
}

// ---- observers ----

#[test]
fn observers_are_registered_replaced_and_removed_by_name() {
    let (engine, clock, seen) = engine();
    let other = Arc::new(AtomicUsize::new(0));
    let o = other.clone();
    engine.register_state_observer("count", move |_, _, rule, _| {
        assert_eq!(rule.resource, "api");
        o.fetch_add(1, Ordering::SeqCst);
    });
    engine.register_state_observer("count", |_, _, _, _| {}); // replaces the counting one
    engine.register_state_observer("panics", |_, _, _, _| panic!("observer bug"));
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1).time_window_sec(1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    assert_eq!(other.load(Ordering::SeqCst), 0);
    assert_eq!(transitions(&seen).len(), 1, "a panicking observer does not stop the others");
    assert!(engine.unregister_state_observer("test"));
    assert!(!engine.unregister_state_observer("test"));
    clock.advance_millis(1_000);
    assert!(call(&api, &clock, 0, false));
    assert_eq!(state(&engine, "api"), BreakerState::Closed);
    assert_eq!(transitions(&seen).len(), 1);
}

// ---- tracing ----

#[derive(Debug)]
struct NotFound;
impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not found")
    }
}
impl std::error::Error for NotFound {}

#[derive(Debug)]
struct Wrapped(NotFound);
impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lookup failed")
    }
}
impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn traced(engine: &Sentinel, err: &(dyn std::error::Error + 'static)) -> bool {
    let mut e = engine.enter("traced").unwrap();
    e.trace(err);
    e.has_error()
}

#[test]
fn tracing_a_block_error_does_nothing() {
    let (engine, _, _) = engine();
    engine.load_flow_rules(vec![FlowRule::new("limited").count(0.0)]).unwrap();
    let block = engine.enter("limited").unwrap_err();
    assert!(!traced(&engine, &block));
    assert!(traced(&engine, &NotFound));
}

#[test]
fn trace_filter_ignores_traces_and_filters_by_predicate() {
    let (engine, _, _) = engine();
    let io = std::io::Error::other("io");
    engine.set_trace_filter(TraceFilter::new().ignore::<NotFound>());
    assert!(!traced(&engine, &NotFound));
    assert!(!traced(&engine, &Wrapped(NotFound)), "a cause in the source chain matches");
    assert!(traced(&engine, &io));

    engine.set_trace_filter(TraceFilter::new().trace::<std::io::Error>());
    assert!(traced(&engine, &io));
    assert!(!traced(&engine, &NotFound));

    engine.set_trace_filter(TraceFilter::new().predicate(|e| e.to_string() != "io"));
    assert!(!traced(&engine, &io));
    assert!(traced(&engine, &NotFound));

    engine.set_error_filter(|_| false);
    assert!(!traced(&engine, &NotFound));
    engine.clear_error_filter();
    assert!(traced(&engine, &NotFound));
}

#[test]
fn traced_errors_feed_the_breakers_and_ignored_ones_do_not() {
    let (engine, _, _) = engine();
    engine.load_degrade_rules(vec![error_count_rule("traced", 1.0, 1)]).unwrap();
    engine.set_trace_filter(TraceFilter::new().ignore::<NotFound>());
    for _ in 0..5 {
        traced(&engine, &NotFound);
    }
    assert_eq!(state(&engine, "traced"), BreakerState::Closed);
    traced(&engine, &std::io::Error::other("a"));
    traced(&engine, &std::io::Error::other("b"));
    assert_eq!(state(&engine, "traced"), BreakerState::Open);
}

#[test]
fn a_panic_through_a_probe_counts_as_its_failure() {
    let (engine, clock, _) = engine();
    engine.load_degrade_rules(vec![error_count_rule("api", 0.0, 1).time_window_sec(1)]).unwrap();
    let api = engine.resource("api");
    assert!(call(&api, &clock, 0, true));
    clock.advance_millis(1_000);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _probe = api.enter().unwrap();
        panic!("handler bug");
    }));
    assert!(r.is_err());
    assert_eq!(state(&engine, "api"), BreakerState::Open);
}
