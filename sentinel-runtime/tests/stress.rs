//! A bounded multi-thread stress run (issue 10 §6): more threads than cores, rules reloading continuously,
//! entries moved to and dropped on other threads. It runs in CI in seconds; `SENTINEL_STRESS_SCALE=<n>`
//! multiplies its threads and rounds for longer runs (`SENTINEL_STRESS_SCALE=20` runs for minutes).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::{Entry, Sentinel};

fn scale() -> usize {
    std::env::var("SENTINEL_STRESS_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1)
}

/// Starts a thread that reloads rules until `stop`: the hot rules stay equal (their state is kept), others
/// change every time, so every reload runs a grace period while the callers read.
fn reloader(engine: &Sentinel, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let (engine, stop) = (engine.clone(), stop.clone());
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            engine
                .load_flow_rules([
                    FlowRule::new("hot").count(1000.0),
                    FlowRule::new("conc").grade(FlowGrade::Thread).count(3.0),
                    FlowRule::new("cold").count(i as f64),
                ])
                .unwrap();
            let d = DegradeRule::new("hot", DegradeGrade::ErrorCount)
                .count(1e9 + (i % 2) as f64)
                .min_request_amount(1)
                .time_window_sec(1);
            engine.load_degrade_rules([d]).unwrap();
            std::thread::yield_now();
        }
        i
    })
}

/// One phase on a frozen clock: `threads` threads call `resource` (acquiring 1 to 3 in turn) until each is
/// blocked three times in a row, then this thread takes what is left one by one; returns what all admitted.
fn drain_phase(resource: &sentinel_runtime::Resource, threads: usize, acquires: &'static [u32]) -> u64 {
    let barrier = Arc::new(Barrier::new(threads));
    let passed = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (resource, barrier, passed) = (resource.clone(), barrier.clone(), passed.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let acquire = acquires[t % acquires.len()];
                let (mut mine, mut blocked) = (0u64, 0);
                while blocked < 3 {
                    match resource.entry().acquire(acquire).enter() {
                        Ok(_) => {
                            mine += acquire as u64;
                            blocked = 0;
                        }
                        Err(_) => blocked += 1,
                    }
                }
                passed.fetch_add(mine, Ordering::Relaxed);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let mut total = passed.load(Ordering::Relaxed);
    while resource.enter().is_ok() {
        total += 1;
    }
    total
}

/// Phases on a frozen clock, each one 500 ms bucket: every thread calls until it is blocked three times in a
/// row, then the main thread takes what is left. No bucket pair ever admits more than the limit, and the
/// limit is reached exactly (each phase takes the whole budget of its bucket).
#[test]
fn admission_stays_exact_with_more_threads_than_cores_and_continuous_reloads() {
    let threads = 32 * scale();
    let phases = 20 * scale();
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_flow_rules([FlowRule::new("hot").count(1000.0)]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reloads = reloader(&engine, &stop);
    let hot = engine.resource("hot");
    let mut previous = 0u64;
    for phase in 0..phases {
        let total = drain_phase(&hot, threads, &[1, 1, 1, 2, 3]);
        assert!(previous + total <= 1000, "phase {phase}: {previous} + {total} admitted in one second");
        assert_eq!(previous + total, 1000, "phase {phase}: the budget of the bucket is taken exactly");
        previous = total;
        clock.advance_millis(500);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reloads.join().unwrap() > 0);
}

/// Two to four QPS rules with different limits on one resource (the second reserves in the node's second
/// window, a later one checks there), the lowest first, second or last, on a frozen clock as above: no
/// second ever admits more than the lowest limit, and each phase takes exactly what the lowest limit leaves.
/// The same with chain rules naming the calls' context (the default one), which decide on the resource's node
/// in it (negative limits below: a chain rule's).
#[test]
fn several_qps_limits_stay_exact_with_more_threads_than_cores() {
    let threads = 16 * scale();
    let sets: [&[f64]; 7] = [
        &[1000.0, 600.0],
        &[600.0, 1000.0],
        &[1000.0, 800.0, 600.0],
        &[600.0, 1000.0, 800.0],
        &[900.0, 600.0, 1000.0, 700.0],
        &[1000.0, -600.0],
        &[-800.0, 1000.0, -600.0, 700.0],
    ];
    let rule = |limit: f64| match limit < 0.0 {
        false => FlowRule::new("two").count(limit),
        true => FlowRule::new("two").count(-limit).chain(sentinel_runtime::DEFAULT_CONTEXT_NAME),
    };
    for limits in sets {
        let clock = ManualClock::at_millis(1_700_000_000_000);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        engine.load_flow_rules(limits.iter().map(|&l| rule(l))).unwrap();
        let two = engine.resource("two");
        let mut previous = 0u64;
        for phase in 0..10 * scale() {
            let total = drain_phase(&two, threads, &[1, 1, 2, 3]);
            assert_eq!(previous + total, 600, "{limits:?}, phase {phase}: the lowest limit, exactly, per second");
            previous = total;
            clock.advance_millis(500);
        }
    }
}

/// Real time: callers on more threads than cores, some entries dropped on another thread, a reloader:
/// nothing is left in flight and no panic escapes.
#[test]
fn entries_moved_between_threads_under_reloads_leave_nothing_in_flight() {
    let threads = 16 * scale();
    let iterations = 5000 * scale() as u64;
    let engine = Sentinel::builder().build();
    engine.load_flow_rules([FlowRule::new("conc").grade(FlowGrade::Thread).count(3.0)]).unwrap();
    engine
        .load_degrade_rules([DegradeRule::new("hot", DegradeGrade::ErrorRatio)
            .count(0.9)
            .min_request_amount(5)
            .time_window_sec(1)])
        .unwrap();
    engine.load_param_flow_rules([ParamFlowRule::new("conc", 0).count(1e6)]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reloads = reloader(&engine, &stop);
    let (tx, rx) = std::sync::mpsc::channel::<Entry<'static>>();
    let dropper = std::thread::spawn(move || rx.into_iter().map(drop).count());
    let callers: Vec<_> = (0..threads)
        .map(|t| {
            let (engine, tx) = (engine.clone(), tx.clone());
            std::thread::spawn(move || {
                let (hot, conc) = (engine.resource("hot"), engine.resource("conc"));
                for i in 0..iterations {
                    if let Ok(mut e) = hot.entry().origin(if i % 7 == 0 { "o1" } else { "" }).enter()
                        && (i + t as u64).is_multiple_of(5)
                    {
                        e.set_error();
                    }
                    if let Ok(e) = conc.entry_owned().args(&[&(i % 4)]).enter()
                        && i % 3 == 0
                    {
                        tx.send(e).unwrap();
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for c in callers {
        c.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    reloads.join().unwrap();
    let moved = dropper.join().unwrap();
    assert!(moved > 0, "some entries were dropped on another thread");
    assert_eq!(engine.cluster_stats("conc").unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("hot").unwrap().threads, 0);
}

/// Prioritized calls over the limit borrow from the next buckets: concurrently they borrow exactly what one
/// thread alone would (the decision to borrow and the borrow are one step).
#[test]
fn concurrent_prioritized_calls_borrow_no_more_than_sequential_ones() {
    let threads = 32 * scale();
    let t0 = 1_700_000_000_000u64;
    for round in 0..10 * scale() {
        let run = |concurrent: bool| {
            let clock = ManualClock::at_millis(t0 - t0 % 1000 + 200);
            let engine = Sentinel::builder().manual_clock(clock.clone()).build();
            engine.load_flow_rules([FlowRule::new("p").count(10.0)]).unwrap();
            let r = engine.resource("p");
            while r.enter().is_ok() {}
            // The next bucket has no budget left; the one after starts within the occupy timeout.
            clock.advance_millis(500);
            let occupied = Arc::new(AtomicU64::new(0));
            let try_one = |r: &sentinel_runtime::Resource, occupied: &AtomicU64| {
                if r.entry().prioritized(true).decide().is_ok_and(|e| e.is_occupied()) {
                    occupied.fetch_add(1, Ordering::Relaxed);
                }
            };
            if concurrent {
                let barrier = Arc::new(Barrier::new(threads));
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        let (r, barrier, occupied) = (r.clone(), barrier.clone(), occupied.clone());
                        std::thread::spawn(move || {
                            barrier.wait();
                            try_one(&r, &occupied);
                        })
                    })
                    .collect();
                hs.into_iter().for_each(|h| h.join().unwrap());
            } else {
                (0..threads).for_each(|_| try_one(&r, &occupied));
            }
            occupied.load(Ordering::Relaxed)
        };
        let (concurrent, sequential) = (run(true), run(false));
        assert_eq!(concurrent, sequential, "round {round}: {concurrent} borrowed concurrently, {sequential} alone");
    }
}

/// Thread-grade rules on the three nodes a call is held to (the resource's, its origin's, its context's),
/// under many threads with calls of several acquire counts and a later check that refuses every third call:
/// never more calls in flight than the smallest count, and once all have exited every permit is back.
#[test]
fn thread_grade_rules_on_three_nodes_never_over_admit_and_leak_no_permit() {
    use sentinel_runtime::slot::{Slot, SlotEntry};
    struct EveryThird(AtomicU64);
    impl Slot for EveryThird {
        fn name(&self) -> &'static str {
            "every-third"
        }
        fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
            if self.0.fetch_add(1, Ordering::Relaxed) % 3 == 2 {
                Err("third".into())
            } else {
                Ok(())
            }
        }
    }
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_700_000_000_000)).build();
    engine
        .load_flow_rules([
            FlowRule::new("t").grade(FlowGrade::Thread).count(3.0),
            FlowRule::new("t").grade(FlowGrade::Thread).count(4.0).limit_app("appA"),
            FlowRule::new("t").grade(FlowGrade::Thread).count(5.0).chain("ctx"),
        ])
        .unwrap();
    engine.add_slot(-1800, EveryThird(AtomicU64::new(0)));
    let threads = 8;
    let in_flight = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(threads));
    std::thread::scope(|s| {
        for t in 0..threads {
            let (engine, in_flight, over, barrier) = (&engine, in_flight.clone(), over.clone(), barrier.clone());
            s.spawn(move || {
                let _ctx = engine.enter_context("ctx", "appA").unwrap();
                let r = engine.resource("t");
                barrier.wait();
                for i in 0..(200 * scale()) {
                    let acquire = 1 + ((t + i) % 2) as u32;
                    if let Ok(e) = r.entry().acquire(acquire).enter() {
                        // Calls in flight + acquire <= 3 when it was checked: at most 3 in flight.
                        if in_flight.fetch_add(1, Ordering::SeqCst) + 1 > 3 {
                            over.store(true, Ordering::SeqCst);
                        }
                        std::thread::yield_now();
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        drop(e);
                    }
                }
            });
        }
    });
    assert!(!over.load(Ordering::SeqCst), "more than 3 calls in flight");
    assert_eq!(engine.cluster_stats("t").unwrap().threads, 0);
    // Every permit is back: 3 calls pass again (the slot refuses every third: retry until 3 are in).
    let _ctx = engine.enter_context("ctx", "appA").unwrap();
    let r = engine.resource("t");
    let mut held = Vec::new();
    for _ in 0..10 {
        if held.len() == 3 {
            break;
        }
        if let Ok(e) = r.enter() {
            held.push(e);
        }
    }
    assert_eq!(held.len(), 3);
    for _ in 0..3 {
        assert!(r.enter().is_err(), "3 in flight + 1 > 3");
    }
}
