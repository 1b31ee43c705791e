//! Exact admission of reject-style QPS rules under concurrent callers (SPEC §5, "Reject"): tokens leased to
//! per-thread stripes must never let a window pass more than `count`, nor block while enough tokens are left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::slot::{Slot, SlotEntry};
use sentinel_runtime::{BlockError, Sentinel};

const T0: u64 = 1_700_000_000_000;

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

/// `threads` threads each try `per_thread` entries of `acquire` at the current (frozen) instant, all at once;
/// returns how many entries passed.
fn concurrent_burst(engine: &Sentinel, resource: &str, threads: usize, per_thread: usize, acquire: u32) -> usize {
    let passed = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (engine, passed, barrier) = (engine.clone(), passed.clone(), barrier.clone());
            let resource = resource.to_string();
            std::thread::spawn(move || {
                let r = engine.resource(&resource);
                barrier.wait();
                for _ in 0..per_thread {
                    if r.entry().acquire(acquire).enter().is_ok() {
                        passed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    passed.load(Ordering::Relaxed)
}

#[test]
fn exact_for_2_4_8_threads_and_counts_1_7_100_1000() {
    for threads in [2usize, 4, 8] {
        for count in [1usize, 7, 100, 1000] {
            let (engine, clock) = engine();
            engine.load_flow_rules([FlowRule::new("hot").count(count as f64)]).unwrap();
            for round in 0..3 {
                // Demand well over the count, from every thread.
                let per_thread = count / threads + count / 2 + 5;
                let passed = concurrent_burst(&engine, "hot", threads, per_thread, 1);
                assert_eq!(passed, count, "{threads} threads, count {count}, round {round}");
                assert_eq!(engine.cluster_stats("hot").unwrap().pass_qps, count as f64);
                // The next round in a fresh window.
                clock.advance_millis(1000);
            }
        }
    }
}

#[test]
fn exact_when_demand_is_below_the_count() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("hot").count(1000.0)]).unwrap();
    assert_eq!(concurrent_burst(&engine, "hot", 4, 100, 1), 400, "every call passes while tokens are left");
    assert_eq!(concurrent_burst(&engine, "hot", 4, 500, 1), 600, "then exactly what is left");
}

#[test]
fn passes_spread_over_two_buckets_never_exceed_the_limit_in_a_window() {
    let (engine, clock) = engine();
    let limit = 10usize;
    engine.load_flow_rules([FlowRule::new("w").count(limit as f64)]).unwrap();
    // Model: passes per 500 ms bucket; the window at any instant is the current bucket plus the previous one.
    let mut passes: Vec<usize> = Vec::new();
    let mut t = T0;
    for step in 0..24usize {
        let bucket = ((t - T0) / 500) as usize;
        passes.resize(bucket + 1, 0);
        let prev = if bucket > 0 { passes[bucket - 1] } else { 0 };
        let in_window = prev + passes[bucket];
        let demand_per_thread = (step * 7) % 5 + 1; // 1..=5 per thread, 4 threads
        let demand = demand_per_thread * 4;
        let expected = demand.min(limit - in_window);
        let passed = concurrent_burst(&engine, "w", 4, demand_per_thread, 1);
        assert_eq!(passed, expected, "step {step} at +{} ms", t - T0);
        passes[bucket] += passed;
        assert!(prev + passes[bucket] <= limit);
        // Steps of 250 ms: two bursts per bucket, each bucket boundary crossed with passes on both sides.
        t += 250;
        clock.set_millis(t);
    }
    for w in passes.windows(2) {
        assert!(w[0] + w[1] <= limit, "a 1 s window passed {} > {limit}: {passes:?}", w[0] + w[1]);
    }
}

#[test]
fn acquire_over_one_gathers_tokens_fragmented_across_stripes() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("f").count(100.0)]).unwrap();
    // Four threads each pass once: each leases a chunk of tokens into its own stripe.
    assert_eq!(concurrent_burst(&engine, "f", 4, 1, 1), 4);
    let f = engine.resource("f");
    // 96 are left, spread over the pool and the stripes: a call for all of them passes.
    assert!(f.entry().acquire(97).enter().is_err(), "97 > 96 left");
    let e = f.entry().acquire(96).enter();
    assert!(e.is_ok(), "96 left in total: the call gathers them");
    drop(e);
    assert!(f.enter().is_err(), "nothing left");
    assert_eq!(engine.cluster_stats("f").unwrap().pass_qps, 100.0);
}

#[test]
fn concurrent_acquire_over_one_is_exact() {
    for (count, acquire) in [(100usize, 3u32), (1000, 7), (50, 50)] {
        let (engine, _clock) = engine();
        engine.load_flow_rules([FlowRule::new("m").count(count as f64)]).unwrap();
        let passed = concurrent_burst(&engine, "m", 8, count / acquire as usize + 10, acquire);
        // With tokens left for a call, no call blocks: exactly floor(count / acquire) pass.
        assert_eq!(passed, count / acquire as usize, "count {count}, acquire {acquire}");
    }
}

#[test]
fn fractional_and_huge_limits() {
    let (engine, _clock) = engine();
    engine
        .load_flow_rules([
            FlowRule::new("half").count(2.5),
            FlowRule::new("huge").count(1e15),
            FlowRule::new("zero").count(0.0),
        ])
        .unwrap();
    assert_eq!(concurrent_burst(&engine, "half", 4, 5, 1), 2, "count 2.5 admits 2");
    assert_eq!(concurrent_burst(&engine, "huge", 4, 100, 1), 400);
    assert!(engine.resource("huge").entry().acquire(u32::MAX).enter().is_ok());
    assert_eq!(concurrent_burst(&engine, "zero", 2, 10, 1), 0);
}

#[test]
fn a_clock_going_backwards_neither_panics_nor_over_admits() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("b").count(5.0)]).unwrap();
    clock.set_millis(T0 + 10_000);
    assert_eq!(concurrent_burst(&engine, "b", 4, 5, 1), 5);
    clock.set_millis(T0 + 9_200); // back into the previous bucket, and further
    assert_eq!(concurrent_burst(&engine, "b", 4, 5, 1), 0, "counted in the newest bucket");
    clock.set_millis(T0 + 3_000);
    assert_eq!(concurrent_burst(&engine, "b", 4, 5, 1), 0);
    clock.set_millis(T0 + 11_000);
    assert_eq!(concurrent_burst(&engine, "b", 4, 5, 1), 5);
}

struct DenyEveryOther(AtomicUsize);

impl Slot for DenyEveryOther {
    fn name(&self) -> &'static str {
        "deny-every-other"
    }
    fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
        if self.0.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
            Err("every other call".into())
        } else {
            Ok(())
        }
    }
}

#[test]
fn tokens_of_calls_blocked_by_a_later_slot_are_given_back() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("r").count(10.0)]).unwrap();
    engine.add_slot(-1800, DenyEveryOther(AtomicUsize::new(0)));
    for round in 0..3 {
        assert_eq!(concurrent_burst(&engine, "r", 4, 20, 1), 10, "round {round}: blocked calls gave their tokens back");
        assert_eq!(engine.cluster_stats("r").unwrap().pass_qps, 10.0);
        clock.advance_millis(1000);
    }
}

#[test]
fn two_rules_with_different_limits_on_one_node_both_hold() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("two").count(10.0), FlowRule::new("two").count(5.0)]).unwrap();
    assert_eq!(concurrent_burst(&engine, "two", 4, 10, 1), 5);
    match engine.resource("two").enter() {
        Err(BlockError::Flow { rule, .. }) => assert_eq!(rule.count, 5.0, "the stricter rule blocks"),
        other => panic!("expected a flow block, got {:?}", other.map(|_| ())),
    }
    clock.advance_millis(1000);
    assert_eq!(concurrent_burst(&engine, "two", 8, 10, 1), 5);

    // A third, stricter rule on the same node.
    engine
        .load_flow_rules([
            FlowRule::new("two").count(10.0),
            FlowRule::new("two").count(5.0),
            FlowRule::new("two").count(3.0),
        ])
        .unwrap();
    clock.advance_millis(1000);
    assert_eq!(concurrent_burst(&engine, "two", 4, 10, 1), 3);
    clock.advance_millis(1000);
    assert_eq!(concurrent_burst(&engine, "two", 8, 10, 1), 3);
}

#[test]
fn a_changed_limit_applies_in_the_open_bucket() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("c").count(10.0)]).unwrap();
    assert_eq!(concurrent_burst(&engine, "c", 4, 1, 1), 4);
    engine.load_flow_rules([FlowRule::new("c").count(6.0)]).unwrap();
    assert_eq!(concurrent_burst(&engine, "c", 4, 5, 1), 2, "6 − 4 already passed");
    engine.load_flow_rules([FlowRule::new("c").count(20.0)]).unwrap();
    assert_eq!(concurrent_burst(&engine, "c", 4, 10, 1), 14);
}

/// On its first call, enters the resource again (the window is full: that call blocks and finds no token)
/// and then denies the outer call, whose token goes back.
struct NestedThenDeny {
    engine: Sentinel,
    calls: AtomicUsize,
    nested_blocked: Arc<AtomicUsize>,
}

impl Slot for NestedThenDeny {
    fn name(&self) -> &'static str {
        "nested-then-deny"
    }
    fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
        if self.calls.fetch_add(1, Ordering::Relaxed) == 0 {
            if matches!(self.engine.resource("n").enter(), Err(BlockError::Flow { .. })) {
                self.nested_blocked.fetch_add(1, Ordering::Relaxed);
            }
            return Err("deny the first call".into());
        }
        Ok(())
    }
}

#[test]
fn a_token_given_back_after_a_call_found_none_is_admitted() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("n").count(1.0)]).unwrap();
    let nested_blocked = Arc::new(AtomicUsize::new(0));
    let slot =
        NestedThenDeny { engine: engine.clone(), calls: AtomicUsize::new(0), nested_blocked: nested_blocked.clone() };
    engine.add_slot(-1800, slot);
    let n = engine.resource("n");
    assert!(n.enter().is_err(), "denied by the slot after taking the only token");
    assert_eq!(nested_blocked.load(Ordering::Relaxed), 1, "the nested call was blocked by the flow rule");
    // The nested call inside the slot found no token (and remembered the window as drained); the outer
    // call's token came back afterwards, so it is there for the next call.
    assert!(n.enter().is_ok(), "the returned token admits a call");
    assert!(matches!(n.enter(), Err(BlockError::Flow { .. })));
    assert_eq!(engine.cluster_stats("n").unwrap().pass_qps, 1.0);
}

/// A call queued by a rate limiter, holding what every kind gave it (a hot-parameter permit, a flow permit, a
/// breaker's probe taken at its turn, an adaptive place), then refused by the last check: everything goes
/// back, and the next call gets it all.
#[test]
fn a_queued_call_refused_by_the_last_check_gives_back_what_every_kind_gave_it() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
    use sentinel_runtime::flow::{ControlBehavior, FlowGrade};
    use sentinel_runtime::param_flow::ParamFlowRule;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;
    struct Deny(Arc<AtomicBool>);
    impl Slot for Deny {
        fn name(&self) -> &'static str {
            "deny"
        }
        fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
            if self.0.load(Ordering::SeqCst) {
                Err("denied".into())
            } else {
                Ok(())
            }
        }
    }
    let (engine, clock) = engine();
    engine
        .load_degrade_rules([DegradeRule::new("db", DegradeGrade::ErrorCount)
            .count(1.0)
            .min_request_amount(1)
            .time_window_sec(1)])
        .unwrap();
    let db = engine.resource("db");
    for _ in 0..2 {
        let mut e = db.entry().args(&[&"k"]).enter().unwrap();
        e.set_error();
        drop(e);
    }
    // 2 errors > 1: open until T0 + 1000.
    assert!(matches!(db.entry().args(&[&"k"]).enter(), Err(BlockError::Degrade { .. })));
    engine
        .load_flow_rules([
            FlowRule::new("db").count(1.0).control_behavior(ControlBehavior::RateLimiter).max_queueing_time_ms(3000),
            FlowRule::new("db").grade(FlowGrade::Thread).count(1.0),
        ])
        .unwrap();
    engine.load_param_flow_rules([ParamFlowRule::new("db", 0).grade(FlowGrade::Thread).count(1.0)]).unwrap();
    engine.load_adaptive_rules([AdaptiveRule::new("db").algorithm(AlgorithmKind::Vegas).limits(1, 1, 1)]).unwrap();
    let deny = Arc::new(AtomicBool::new(true));
    engine.add_slot(0, Deny(deny.clone()));
    // The rate limiter's first slot (T0): the breaker, still open then, refuses the call.
    let r = db.entry().args(&[&"k"]).enter();
    assert!(matches!(r, Err(BlockError::Degrade { .. })), "{r:?}");
    // Its turn is T0 + 1000: the probe is due; the last check refuses it.
    assert!(matches!(db.entry().args(&[&"k"]).enter(), Err(BlockError::Custom { .. })));
    deny.store(false, Ordering::SeqCst);
    clock.set_millis(T0 + 1000);
    // Its turn is T0 + 2000 (the slot the refused call took is not given back, as in Java): the probe again.
    let p = db.entry().args(&[&"k"]).enter().unwrap_or_else(|e| panic!("everything came back: {e:?}"));
    assert_eq!(p.waited(), Duration::from_millis(1000));
    drop(p);
    assert_eq!(engine.cluster_stats("db").unwrap().threads, 0);
}
