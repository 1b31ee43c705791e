use super::*;
use crate::rcu::tests::{spawn_on_stripe, stripe_test_lock};
use std::sync::{mpsc, Arc, Barrier};

/// Owner spends that overlapped a claim, and those of them that were given back (seen in `--nocapture`).
pub(super) static SETTLES: AtomicU64 = AtomicU64::new(0);
pub(super) static RESTORES: AtomicU64 = AtomicU64::new(0);

const NO_BORROW: &dyn Fn(u64) -> u64 = &|_| 0;
const T0: u64 = 1_700_000_000_000;

/// Calls for `acquire` until one blocks; returns the tokens admitted.
fn drain(w: &AdmissionWindow, now_ms: u64, acquire: u32, limit: f64) -> u64 {
    let mut got = 0;
    while w.try_reserve(now_ms, acquire, limit, NO_BORROW).is_some() {
        got += acquire as u64;
    }
    got
}

#[test]
fn admission_owners_spending_while_others_steal_admit_exactly_the_limit() {
    // Per round, in a fresh bucket: threads with different acquires spend until they are blocked, one of
    // them giving back every third reservation; near the end they gather tokens out of each other's
    // stripes while the owners still spend. Whatever was kept, plus what is left, is exactly the limit.
    let threads = 6;
    let w = AdmissionWindow::new();
    let now = AtomicU64::new(T0);
    let limit = AtomicU64::new(0);
    let kept = AtomicU64::new(0);
    let start = Barrier::new(threads + 1);
    let end = Barrier::new(threads + 1);
    let rounds = 300;
    let mut wrong = Vec::new();
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (w, now, limit, kept, start, end) = (&w, &now, &limit, &kept, &start, &end);
            sc.spawn(move || {
                let acquire = [1u32, 1, 2, 3, 1, 5][t];
                for _ in 0..rounds {
                    start.wait();
                    let (t_ms, l) = (now.load(Ordering::Relaxed), f64::from_bits(limit.load(Ordering::Relaxed)));
                    let mut calls = 0u32;
                    while let Some(r) = w.try_reserve(t_ms, acquire, l, NO_BORROW) {
                        calls += 1;
                        if t == 0 && calls.is_multiple_of(3) {
                            w.release(r);
                        } else {
                            kept.fetch_add(acquire as u64, Ordering::Relaxed);
                        }
                    }
                    end.wait();
                }
            });
        }
        for round in 0..rounds {
            let l = (40 + (round * 37) % 500) as f64;
            limit.store(l.to_bits(), Ordering::Relaxed);
            kept.store(0, Ordering::Relaxed);
            start.wait();
            end.wait();
            let t_ms = now.load(Ordering::Relaxed);
            let left = drain(&w, t_ms, 1, l);
            // Asserted after the threads are joined (a panic here would leave them waiting on the barrier).
            let admitted = kept.load(Ordering::Relaxed) + left;
            if admitted != l as u64 {
                wrong.push(format!("round {round}, limit {l}: {admitted} admitted"));
            }
            // The next round two buckets later: a budget of the whole limit.
            now.fetch_add(2 * BUCKET_MS, Ordering::Relaxed);
        }
    });
    assert!(wrong.is_empty(), "{wrong:?}");
    eprintln!("settled spends: {}, restored: {}", SETTLES.load(Ordering::Relaxed), RESTORES.load(Ordering::Relaxed));
}

/// Threads spend while the clock moves on (every 41st call moves it 60 ms: buckets close under the
/// spenders, some of whom read an older time). Passes are tallied by the bucket whose tokens paid them:
/// no two adjacent buckets (one window) admit more than the limit. `shared`: every spender is on the
/// shared stripe (else each gets whatever stripe is free: owned ones, unless other tests hold them).
fn buckets_closing_while_spending(shared: bool) {
    let _stripes = stripe_test_lock();
    let limit = 50.0;
    let threads = 4;
    let steps = 4000u64;
    let w = Arc::new(AdmissionWindow::new());
    let now = Arc::new(AtomicU64::new(T0));
    let calls = Arc::new(AtomicU64::new(0));
    let buckets = (steps * 60 / BUCKET_MS + 4) as usize;
    let passes: Arc<Vec<AtomicU64>> = Arc::new((0..buckets).map(|_| AtomicU64::new(0)).collect());
    let start = Arc::new(Barrier::new(threads));
    let spenders: Vec<_> = (0..threads)
        .map(|t| {
            let (w, now, calls, passes, start) = (w.clone(), now.clone(), calls.clone(), passes.clone(), start.clone());
            let spend = move || {
                start.wait();
                let acquire = 1 + (t as u32 % 2);
                loop {
                    let c = calls.fetch_add(1, Ordering::Relaxed);
                    if c >= steps * 41 {
                        break;
                    }
                    if c.is_multiple_of(41) {
                        now.fetch_add(60, Ordering::Relaxed);
                    }
                    let t_ms = now.load(Ordering::Relaxed);
                    if let Some(r) = w.try_reserve(t_ms, acquire, limit, NO_BORROW) {
                        let b = ((r.bucket_start() - T0 / BUCKET_MS * BUCKET_MS) / BUCKET_MS) as usize;
                        passes[b].fetch_add(acquire as u64, Ordering::Relaxed);
                    }
                }
            };
            if shared {
                spawn_on_stripe(true, spend)
            } else {
                std::thread::spawn(spend)
            }
        })
        .collect();
    for s in spenders {
        s.join().expect("spender");
    }
    let passes: Vec<u64> = passes.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    for (b, pair) in passes.windows(2).enumerate() {
        assert!(pair[0] + pair[1] <= limit as u64, "buckets {b} and {} admitted {pair:?}", b + 1);
    }
    assert!(passes.iter().sum::<u64>() > 0);
    // Two buckets later the whole limit is there again, exactly.
    let t_ms = now.load(Ordering::Relaxed) + 2 * BUCKET_MS;
    assert_eq!(drain(&w, t_ms, 1, limit), limit as u64);
}

#[test]
fn admission_buckets_closing_while_owners_spend_never_over_admit() {
    buckets_closing_while_spending(false);
}

#[test]
fn admission_buckets_closing_while_shared_stripe_callers_spend_never_over_admit() {
    buckets_closing_while_spending(true);
}

/// A limit whose bucket budget leaves tokens on a stripe after a chunk is taken for one call.
fn chunky_limit(w: &AdmissionWindow) -> f64 {
    (16 * w.locals.len()).max(50) as f64
}

/// Runs `f` on a thread on the shared stripe and returns what it returned.
fn on_shared<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    spawn_on_stripe(true, f).join().expect("thread on the shared stripe")
}

#[test]
fn hooked_shared_stripe_call_that_read_the_open_bucket_before_the_next_one_opened_names_the_bucket_that_paid() {
    let _stripes = stripe_test_lock();
    // Bucket X admits the whole limit, so X + 1 has no tokens. A call on the shared stripe at X + 1 reads
    // the open bucket (X + 1) in the slow path and stops there; meanwhile X + 2 opens and another call on
    // the shared stripe leaves the rest of its chunk of X + 2 on the stripe. The stopped call then spends
    // a token of X + 2: its reservation names X + 2 (naming X + 1 tallies limit + 1 passes in the window
    // of X and X + 1, as a CI run of the test above once did).
    let w = Arc::new(AdmissionWindow::new());
    let limit = chunky_limit(&w);
    assert_eq!(drain(&w, T0, 1, limit), limit as u64);
    assert!(w.try_reserve(T0 + BUCKET_MS, 1, limit, NO_BORROW).is_none(), "X + 1 has no tokens");
    let (stopped_tx, stopped_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let ws = w.clone();
    let stopped = spawn_on_stripe(true, move || {
        test_hooks::set(&test_hooks::SHARED_SLOW, move || {
            stopped_tx.send(()).expect("main waits");
            go_rx.recv().expect("main sends");
        });
        ws.try_reserve(T0 + BUCKET_MS, 1, limit, NO_BORROW)
    });
    stopped_rx.recv().expect("the call stopped in the slow path");
    let wo = w.clone();
    let other = on_shared(move || wo.try_reserve(T0 + 2 * BUCKET_MS, 1, limit, NO_BORROW));
    assert_eq!(other.map(|r| r.bucket_start()), Some(T0 + 2 * BUCKET_MS));
    let shared = &w.locals[w.owned()];
    assert!(tokens_of(shared.word.load(Ordering::Acquire)) > 0, "the rest of the chunk is on the stripe");
    go_tx.send(()).expect("the stopped call waits");
    let r = stopped.join().expect("the stopped call");
    assert_eq!(
        r.map(|r| r.bucket_start()),
        Some(T0 + 2 * BUCKET_MS),
        "X admitted {limit} and X + 1 had no tokens: the pass was paid by X + 2"
    );
}

#[test]
fn hooked_shared_stripe_credit_of_a_closed_bucket_leaves_the_stripe_naming_the_bucket_that_paid() {
    let _stripes = stripe_test_lock();
    // A call on the shared stripe takes a chunk of bucket X and stops before crediting the rest to the
    // stripe; meanwhile X + 1 opens and another call leaves the rest of its chunk of X + 1 on the stripe.
    // The stopped call's credit (of a closed generation) goes nowhere. A call at a time in X (read before
    // the clock moved) then spends a token of X + 1 from the stripe: its reservation names X + 1.
    let w = Arc::new(AdmissionWindow::new());
    let limit = chunky_limit(&w);
    let (stopped_tx, stopped_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let ws = w.clone();
    let stopped = spawn_on_stripe(true, move || {
        test_hooks::set(&test_hooks::BEFORE_CREDIT, move || {
            stopped_tx.send(()).expect("main waits");
            go_rx.recv().expect("main sends");
        });
        ws.try_reserve(T0, 1, limit, NO_BORROW)
    });
    stopped_rx.recv().expect("the call stopped before its credit");
    let wo = w.clone();
    let other = on_shared(move || wo.try_reserve(T0 + BUCKET_MS, 1, limit, NO_BORROW));
    assert_eq!(other.map(|r| r.bucket_start()), Some(T0 + BUCKET_MS));
    go_tx.send(()).expect("the stopped call waits");
    let r = stopped.join().expect("the stopped call");
    assert_eq!(r.map(|r| r.bucket_start()), Some(T0), "its own token came from X's pool");
    let shared = &w.locals[w.owned()];
    assert!(tokens_of(shared.word.load(Ordering::Acquire)) > 0, "the rest of X + 1's chunk is on the stripe");
    let wl = w.clone();
    let late = on_shared(move || wl.try_reserve(T0, 1, limit, NO_BORROW));
    assert_eq!(late.map(|r| r.bucket_start()), Some(T0 + BUCKET_MS), "the token was X + 1's");
}

#[test]
fn admission_tokens_left_on_an_idle_owners_stripe_go_to_others() {
    for exit in [false, true] {
        let limit = 1000.0;
        let w = AdmissionWindow::new();
        let (took_tx, took_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let others = AtomicU64::new(0);
        std::thread::scope(|sc| {
            let wr = &w;
            let idle = sc.spawn(move || {
                // One call leases a chunk into this thread's stripe; then the thread idles (or exits).
                assert!(wr.try_reserve(T0, 1, limit, NO_BORROW).is_some());
                took_tx.send(stripe::lease()).expect("main waits");
                if !exit {
                    go_rx.recv().expect("main sends");
                }
            });
            let lease = took_rx.recv().expect("the idle thread reserved");
            if lease.exclusive {
                let l = &w.locals[lease.index];
                let v = l.word.load(Ordering::Acquire);
                assert!(tokens_of(v) > spent_in(l.spent.load(Ordering::Acquire), gen_of(v)));
            }
            if exit {
                idle.join().expect("idle thread");
            }
            let barrier = Barrier::new(3);
            std::thread::scope(|sc2| {
                for _ in 0..3 {
                    let (w, others, barrier) = (&w, &others, &barrier);
                    sc2.spawn(move || {
                        barrier.wait();
                        others.fetch_add(drain(w, T0, 1, limit), Ordering::Relaxed);
                    });
                }
            });
            let left = drain(&w, T0, 1, limit);
            assert_eq!(others.load(Ordering::Relaxed) + left, limit as u64 - 1, "exit: {exit}");
            assert_eq!(left, 0, "the others drained everything, the idle stripe included (exit: {exit})");
            let _ = go_tx.send(());
        });
    }
}

#[test]
fn admission_a_thief_and_an_owner_racing_over_the_last_tokens_share_them_exactly() {
    // One thread spends 1 token per call from its stripe while another asks for many at once (it must
    // gather them out of the first one's stripe); many rounds. Both stop when blocked: nothing is left
    // and exactly the limit was admitted.
    let w = AdmissionWindow::new();
    let now = AtomicU64::new(T0);
    let got = [AtomicU64::new(0), AtomicU64::new(0)];
    let start = Barrier::new(3);
    let end = Barrier::new(3);
    let rounds = 500;
    let limit = 120.0;
    let mut wrong = Vec::new();
    std::thread::scope(|sc| {
        for t in 0..2 {
            let (w, now, got, start, end) = (&w, &now, &got, &start, &end);
            sc.spawn(move || {
                for _ in 0..rounds {
                    start.wait();
                    let t_ms = now.load(Ordering::Relaxed);
                    let n = if t == 0 { drain(w, t_ms, 1, limit) } else { drain(w, t_ms, 7, limit) };
                    got[t].fetch_add(n, Ordering::Relaxed);
                    end.wait();
                }
            });
        }
        for round in 0..rounds {
            start.wait();
            end.wait();
            let t_ms = now.load(Ordering::Relaxed);
            let owner_and_thief = got[0].swap(0, Ordering::Relaxed) + got[1].swap(0, Ordering::Relaxed);
            let left = drain(&w, t_ms, 1, limit);
            if owner_and_thief + left != limit as u64 {
                wrong.push(format!("round {round}: {} admitted", owner_and_thief + left));
            }
            now.fetch_add(2 * BUCKET_MS, Ordering::Relaxed);
        }
    });
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// A lease owner for the tests: counts the chunks taken below a low-water mark.
struct TestLease {
    low_water: u64,
    signals: AtomicU64,
}

impl Mode for TestLease {
    const OPENS: bool = false;
    fn took_chunk(&self, left: u64) {
        if left < self.low_water {
            self.signals.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn drain_lease(w: &AdmissionWindow, now_ms: u64, acquire: u32, m: &TestLease) -> u64 {
    let mut got = 0;
    while w.lease_take(now_ms, acquire, m).is_some() {
        got += acquire as u64;
    }
    got
}

#[test]
fn lease_tokens_are_spent_exactly_and_the_rest_comes_back_on_replace() {
    let m = TestLease { low_water: 10, signals: AtomicU64::new(0) };
    let w = AdmissionWindow::new();
    assert!(w.lease_take(T0, 1, &m).is_none(), "no lease yet");
    assert_eq!(w.lease_replace(T0 + 99, 50), 0);
    let key = w.lease_take(T0, 5, &m).expect("a lease in force");
    assert_eq!(key, T0 + 99);
    w.lease_release(key, 5);
    assert_eq!(drain_lease(&w, T0 + 10, 3, &m), 48, "50 tokens, 3 at a time");
    assert!(m.signals.load(Ordering::Relaxed) > 0, "the owner heard that the pool ran low");
    assert!(w.lease_add(T0 + 99, 7));
    assert_eq!(drain_lease(&w, T0 + 20, 1, &m), 9, "2 left plus 7 added");
    assert!(w.lease_add(T0 + 99, 4));
    assert_eq!(w.lease_left(), 4);
    assert!(w.lease_take(T0 + 100, 1, &m).is_none(), "expired after its last millisecond");
    assert_eq!(w.lease_replace(T0 + 199, 10), 4, "the unspent tokens come back to the owner");
    assert!(!w.lease_add(T0 + 99, 4), "the replaced lease takes no more tokens");
    assert_eq!(drain_lease(&w, T0 + 150, 1, &m), 10);
    assert_eq!(w.lease_replace(0, 0), 0);
    assert!(w.lease_take(T0 + 150, 1, &m).is_none(), "revoked");
}

#[test]
fn lease_spent_by_many_threads_while_topped_up_and_replaced_never_exceeds_what_was_granted() {
    // Threads spend while the owner tops the lease up and replaces it: in every lease, what the threads
    // spent plus what came back on replace is exactly what was granted.
    let threads = 4;
    let m = TestLease { low_water: 0, signals: AtomicU64::new(0) };
    let w = AdmissionWindow::new();
    let spent: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut wrong = Vec::new();
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (w, m, spent, stop) = (&w, &m, &spent, &stop);
            sc.spawn(move || {
                let acquire = [1u32, 2, 1, 3][t];
                while !stop.load(Ordering::Relaxed) {
                    if let Some(key) = w.lease_take(T0, acquire, m) {
                        spent[(key - T0) as usize].fetch_add(acquire as u64, Ordering::Relaxed);
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
        }
        for lease in 1..64u64 {
            let mut granted = 40 + lease * 7;
            w.lease_replace(T0 + lease, granted);
            for _ in 0..3 {
                std::thread::yield_now();
                if w.lease_add(T0 + lease, 11) {
                    granted += 11;
                }
            }
            std::thread::yield_now();
            let left = w.lease_replace(T0 + lease, 0);
            // The zero-token lease under the same key ends it: nothing more is spent from it.
            let _ = w.lease_replace(0, 0);
            let used = spent[lease as usize].load(Ordering::Relaxed);
            if used + left > granted {
                wrong.push(format!("lease {lease}: granted {granted}, spent {used}, left {left}"));
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(wrong.is_empty(), "{wrong:?}");
}

#[test]
fn admission_calls_over_the_limit_asking_for_more_than_is_left_do_not_rescan() {
    let w = AdmissionWindow::new();
    let limit = 10.0;
    assert_eq!(drain(&w, T0, 4, limit), 8);
    let moving = w.pool.moving.load(Ordering::Relaxed);
    for _ in 0..10 {
        assert!(w.try_reserve(T0, 3, limit, NO_BORROW).is_none(), "2 left, 3 asked");
    }
    assert_eq!(w.pool.moving.load(Ordering::Relaxed), moving, "blocked calls wrote no shared word");
    assert_eq!(drain(&w, T0, 1, limit), 2, "the 2 left are admitted");
    assert!(w.try_reserve(T0, 1, limit, NO_BORROW).is_none());
}

#[test]
fn admission_counts_are_exact_with_releases_and_a_limit_change() {
    let w = AdmissionWindow::new();
    let r = w.try_reserve(T0, 5, 10.0, NO_BORROW).expect("within the limit");
    assert_eq!(w.total(T0, NO_BORROW), 5);
    w.release(r);
    assert_eq!(w.total(T0, NO_BORROW), 0);
    assert_eq!(drain(&w, T0, 1, 10.0), 10);
    assert_eq!(w.total(T0, NO_BORROW), 10);
    // A higher limit in the same bucket adds the difference only.
    assert_eq!(drain(&w, T0, 1, 14.0), 4);
    // The next bucket: the previous one's 14 passes are still in the window.
    assert_eq!(drain(&w, T0 + BUCKET_MS, 1, 20.0), 6);
}

#[test]
fn admission_limit_changes_while_owners_spend_keep_the_count_exact() {
    // Threads alternate between two limits in one bucket, so the bucket is re-opened (every stripe
    // drained under the claims) again and again while owners spend. Then calls under the higher limit
    // take exactly what is left: the bucket admits exactly that limit in total.
    for round in 0..20u64 {
        let w = AdmissionWindow::new();
        let kept = AtomicU64::new(0);
        let barrier = Barrier::new(4);
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (w, kept, barrier) = (&w, &kept, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    for i in 0..150u64 {
                        let limit = if (i + t + round) % 3 == 0 { 60.0 } else { 100.0 };
                        if w.try_reserve(T0, 1, limit, NO_BORROW).is_some() {
                            kept.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let kept = kept.load(Ordering::Relaxed);
        assert!(kept <= 100, "round {round}: {kept} admitted");
        assert_eq!(kept + drain(&w, T0, 1, 100.0), 100, "round {round}");
    }
}

#[test]
fn hooked_a_second_window_reservation_that_read_the_other_bucket_before_it_filled_does_not_over_admit() {
    // The secondary window (a second reject rule with another limit on the node). Call A at T0+100 reads
    // the window (empty) and stops before its compare-and-swap; meanwhile (thread B) bucket 1 admits the
    // whole limit and bucket 2 follows. Had A added to the window it read, buckets 1 and 2 would hold 11.
    let w = Arc::new(SecondWindow::new());
    let limit = 10.0;
    let (stopped_tx, stopped_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let wa = w.clone();
    let a = std::thread::spawn(move || {
        test_hooks::set(&super::second_window::test_hooks::AFTER_OTHERS, move || {
            stopped_tx.send(()).expect("main waits");
            go_rx.recv().expect("main sends");
        });
        wa.try_reserve(T0 + 100, 1, limit, NO_BORROW)
    });
    stopped_rx.recv().expect("A stopped after reading the other bucket");
    let wb = w.clone();
    let b = std::thread::spawn(move || {
        let mut b1 = 0;
        while wb.try_reserve(T0 + 600, 1, limit, NO_BORROW).is_some() {
            b1 += 1;
        }
        (b1, wb.try_reserve(T0 + 1000, 1, limit, NO_BORROW))
    });
    // B finishes (no reservation waits for another); then A goes on.
    let (b1, b2) = b.join().expect("B");
    go_tx.send(()).expect("A waits");
    let r = a.join().expect("A");
    assert!(
        w.within(T0 + 1000, limit, NO_BORROW),
        "A reserved {r:?}, bucket 1 admitted {b1}, bucket 2 {b2:?}: buckets 1 and 2 hold more than {limit}"
    );
}

#[test]
fn a_second_window_release_after_the_window_moved_2_pow_18_buckets_takes_nothing_from_it() {
    // Call A reserved on the node and in the second window at T0, then stalled (or the clock jumped) while
    // the window moved on by 2^18 buckets (36 h) and filled; a later check refuses A and gives it back: the
    // bucket the window is at never held A's reservation.
    let w = AdmissionWindow::new();
    let (limit, second) = (100.0, 4.0);
    let mut a = w.try_reserve(T0, 1, limit, NO_BORROW).unwrap();
    assert!(w.within(T0, 1, second, NO_BORROW, &mut a));
    let later = T0 + (1u64 << 18) * BUCKET_MS;
    for _ in 0..4 {
        let mut r = w.try_reserve(later, 1, limit, NO_BORROW).unwrap();
        assert!(w.within(later, 1, second, NO_BORROW, &mut r));
    }
    w.release(a);
    let mut r = w.try_reserve(later, 1, limit, NO_BORROW).unwrap();
    assert!(!w.within(later, 1, second, NO_BORROW, &mut r), "5 admitted in a second window of 4");
}
