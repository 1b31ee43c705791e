//! Traffic-shaping controllers: reject, warm-up, rate limiter, warm-up rate limiter.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::NANOS_PER_MILLI;
use crate::stat::admission::Reservation;
use crate::stat::StatNode;

use super::rule::{ControlBehavior, FlowGrade, FlowRule};

/// What a controller decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Pass; `reservation` must be given back if a later check blocks.
    Pass { reservation: Option<Reservation>, wait_nanos: u64 },
    /// Pass after waiting, counted in a later window (prioritized occupy): the node recorded the borrow at
    /// `at_ms` in the bucket starting at `future_ms` ([`give_back_borrow`] takes it back if a later check
    /// refuses the call).
    Occupied { wait_nanos: u64, at_ms: u64, future_ms: u64 },
    /// Pass with a concurrency permit on the node, released at exit.
    ThreadPermit,
    /// Block; a retry could pass after `retry_after` (when known).
    Block { retry_after: Option<Duration> },
}

/// Java's `OccupyTimeoutProperty` default: a prioritized request waits less than this.
pub(crate) const OCCUPY_TIMEOUT_MS: u64 = 500;

/// Warm-up token bucket (Guava's SmoothWarmingUp, as Sentinel adapts it).
pub(crate) struct WarmUp {
    count: f64,
    cold_factor: i64,
    warning_token: i64,
    max_token: i64,
    slope: f64,
    stored_tokens: AtomicI64,
    /// Second (ms) of the last sync; `u64::MAX` before the first, which starts the bucket full (cold).
    last_filled: AtomicU64,
}

impl WarmUp {
    /// Java's token bucket for `count` (≥ 1), `period_sec` and `cold_factor` (> 1); `count × period_sec` is
    /// validated to be at most [`MAX_WARM_UP_TOKENS`], so no token arithmetic can overflow.
    pub(crate) fn new(count: f64, period_sec: u32, cold_factor: u32) -> Self {
        let cf = cold_factor as f64;
        let period = period_sec as f64;
        let warning_token = ((period * count) as i64) / (cold_factor as i64 - 1).max(1);
        let max_token = warning_token.saturating_add((2.0 * period * count / (1.0 + cf)) as i64);
        // Java divides by `max_token - warning_token` even when it is 0; the infinite slope then makes the
        // allowed rate NaN and nothing ever passes. Without a warming band there is nothing to warm: the full
        // count applies.
        let band = max_token - warning_token;
        let slope = if band > 0 { (cf - 1.0) / count / band as f64 } else { 0.0 };
        WarmUp {
            count,
            cold_factor: cold_factor as i64,
            warning_token,
            max_token,
            slope,
            stored_tokens: AtomicI64::new(0),
            last_filled: AtomicU64::new(u64::MAX),
        }
    }

    fn cool_down_tokens(&self, current_sec_ms: u64, pass_qps: i64) -> i64 {
        let old = self.stored_tokens.load(Ordering::Acquire);
        let last = self.last_filled.load(Ordering::Acquire);
        if last == u64::MAX {
            return self.max_token;
        }
        let elapsed = current_sec_ms.saturating_sub(last) as f64;
        // Refill below the warning line, or above it while traffic is light (Java's coolDownTokens): the
        // previous second passed fewer than `(int) count / coldFactor` calls, an integer division (a float one
        // would keep refilling a rule of count 10 that passes 3 calls a second, and it would never warm up).
        let cold = pass_qps < (self.count as i64) / self.cold_factor;
        let refill = old < self.warning_token || (old > self.warning_token && cold);
        let new = if refill { (old as f64 + elapsed * self.count / 1000.0) as i64 } else { old };
        new.min(self.max_token)
    }

    /// Refills the bucket once per second from the previous second's passes.
    pub(crate) fn sync(&self, now_ms: u64, node: &StatNode) {
        let current = now_ms - now_ms % 1000;
        let last = self.last_filled.load(Ordering::Acquire);
        if last != u64::MAX && current <= last {
            return;
        }
        let prev_qps = node.previous_pass_qps_on_call(now_ms) as i64;
        let old = self.stored_tokens.load(Ordering::Acquire);
        let new = self.cool_down_tokens(current, prev_qps);
        if self.last_filled.compare_exchange(last, current, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let _ = self.stored_tokens.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire);
            let v = self.stored_tokens.fetch_sub(prev_qps, Ordering::AcqRel) - prev_qps;
            if v < 0 {
                self.stored_tokens.store(0, Ordering::Release);
            }
        }
    }

    /// The QPS allowed now: below the warning line the full count, above it the warming rate, never under
    /// one call per second. (Java's rate can fall under one call per second when `count / cold_factor < 1`:
    /// then no call ever passes, the bucket never drains, and the resource stays blocked for good. Where
    /// Java's rate is at least one call per second, it is used as it is.)
    pub(crate) fn allowed_qps(&self) -> f64 {
        let rest = self.stored_tokens.load(Ordering::Acquire);
        if rest >= self.warning_token {
            let above = (rest - self.warning_token) as f64;
            (1.0 / (above * self.slope + 1.0 / self.count)).next_up().max(1.0)
        } else {
            self.count
        }
    }
}

/// The most tokens a warm-up bucket may hold (`count × warm_up_period_sec`): token counts stay exact in
/// an `f64` and their arithmetic cannot overflow an `i64`.
pub(crate) const MAX_WARM_UP_TOKENS: f64 = (1u64 << 52) as f64;

/// The smallest rate the rate limiter spaces (calls per second): one call per `u64::MAX` nanoseconds is
/// about one call per 584 years; a slower rate cannot be represented.
pub(crate) const MIN_RATE_LIMITER_QPS: f64 = 1e9 / u64::MAX as f64;

/// Uniform spacing (leaky bucket): one pass every `1/count` s, queueing up to a bound.
pub(crate) struct Throttle {
    max_queue_nanos: u64,
    latest_passed: AtomicU64,
}

impl Throttle {
    pub(crate) fn new(max_queue_ms: u64) -> Self {
        Throttle { max_queue_nanos: max_queue_ms.saturating_mul(NANOS_PER_MILLI), latest_passed: AtomicU64::new(0) }
    }

    /// Passes now, after a wait, or blocks: lock-free, exact under concurrent callers. A pass sets `slot` to
    /// the slot it took (the last pass time before it, and its own), for [`give_back`](Self::give_back).
    pub(crate) fn acquire(&self, now_nanos: u64, acquire: u32, qps: f64, slot: &mut Option<(u64, u64)>) -> Decision {
        if acquire == 0 {
            return Decision::Pass { reservation: None, wait_nanos: 0 };
        }
        if qps <= 0.0 || qps.is_nan() {
            return Decision::Block { retry_after: None };
        }
        let cost = (acquire as f64 * 1e9 / qps).round() as u64;
        let mut last = self.latest_passed.load(Ordering::Acquire);
        loop {
            let expected = last.saturating_add(cost);
            if expected <= now_nanos {
                match self.latest_passed.compare_exchange_weak(last, now_nanos, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        *slot = Some((last, now_nanos));
                        return Decision::Pass { reservation: None, wait_nanos: 0 };
                    }
                    Err(v) => last = v,
                }
            } else {
                let wait = expected - now_nanos;
                if wait > self.max_queue_nanos {
                    // Retried after the wait beyond the queueing limit, the call queues at most that limit.
                    return Decision::Block { retry_after: Some(Duration::from_nanos(wait - self.max_queue_nanos)) };
                }
                match self.latest_passed.compare_exchange_weak(last, expected, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        *slot = Some((last, expected));
                        return Decision::Pass { reservation: None, wait_nanos: wait };
                    }
                    Err(v) => last = v,
                }
            }
        }
    }

    /// Gives back the slot a pass took (`(last pass before it, its own)`, from [`acquire`](Self::acquire)) if
    /// no later call took one after it (else the slot stays taken: later calls are spaced from it already).
    pub(crate) fn give_back(&self, (before, taken): (u64, u64)) {
        let _ = self.latest_passed.compare_exchange(taken, before, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// A rule's controller with its state.
pub(crate) enum Controller {
    Reject,
    WarmUp(WarmUp),
    RateLimiter(Throttle),
    WarmUpRateLimiter(WarmUp, Throttle),
}

impl Controller {
    pub(crate) fn for_rule(rule: &FlowRule) -> Self {
        if rule.grade == FlowGrade::Thread {
            return Controller::Reject;
        }
        match rule.control_behavior {
            ControlBehavior::Reject => Controller::Reject,
            ControlBehavior::WarmUp => {
                Controller::WarmUp(WarmUp::new(rule.count, rule.warm_up_period_sec, rule.cold_factor))
            }
            ControlBehavior::RateLimiter => Controller::RateLimiter(Throttle::new(rule.max_queueing_time_ms)),
            ControlBehavior::WarmUpRateLimiter => Controller::WarmUpRateLimiter(
                WarmUp::new(rule.count, rule.warm_up_period_sec, rule.cold_factor),
                Throttle::new(rule.max_queueing_time_ms),
            ),
        }
    }
}

/// The reject check on `node`: exact reservation in the node's admission window.
pub(crate) fn reject_qps(
    node: &StatNode,
    now_ms: u64,
    acquire: u32,
    limit: f64,
    prioritized: bool,
    held: Option<&mut Reservation>,
) -> Decision {
    let borrowed = |start: u64| node.borrowed_at(start);
    // What this call reserved in the window already (an earlier rule on the node): a borrow gives it back.
    let own = match held {
        Some(held) => {
            if node.admission().within(now_ms, acquire, limit, &borrowed, held) {
                return Decision::Pass { reservation: None, wait_nanos: 0 };
            }
            acquire
        }
        None => {
            if let Some(r) = node.admission().try_reserve(now_ms, acquire, limit, &|s| borrowed_for_open(node, s)) {
                return Decision::Pass { reservation: Some(r), wait_nanos: 0 };
            }
            0
        }
    };
    // A prioritized call over any of the node's limits may borrow (Java's `DefaultController`, whichever rule).
    if prioritized {
        // Deciding to borrow reads what is already borrowed and then adds to it: prioritized callers of one
        // node decide one at a time, or two of them could both take the last room (a cold path: only calls
        // over the limit get here).
        let _one_at_a_time = occupy_lock(node);
        let wait = try_occupy_next(node, now_ms, acquire, limit, own);
        #[cfg(test)]
        crate::rcu::test_hooks::run(&borrow_hooks::AFTER_OCCUPY_DECISION);
        // Not into a bucket whose budget is computed already (or being computed): it would not count the
        // borrow. Openings read the borrowed passes under this lock (`borrowed_for_open`).
        if wait < OCCUPY_TIMEOUT_MS && node.admission().may_borrow((now_ms + wait) / crate::stat::BUCKET_MS) {
            node.add_waiting(now_ms, now_ms + wait, acquire);
            return Decision::Occupied { wait_nanos: wait * NANOS_PER_MILLI, at_ms: now_ms, future_ms: now_ms + wait };
        }
    }
    Decision::Block { retry_after: node.qps_retry_after(now_ms, acquire, limit) }
}

/// The passes borrowed in the bucket starting at `start`, for the admission window opening that bucket: read
/// under the node's occupy lock, so that a borrow decided before the opening is counted by it or sees it.
pub(crate) fn borrowed_for_open(node: &StatNode, start: u64) -> u64 {
    #[cfg(test)]
    borrow_hooks::OPENERS.arrive(node as *const StatNode as usize);
    let _one_at_a_time = occupy_lock(node);
    #[cfg(test)]
    borrow_hooks::OPENERS.leave(node as *const StatNode as usize);
    node.borrowed_at(start)
}

/// The lock that serializes the borrowing decisions of prioritized calls on `node` (striped by address).
fn occupy_lock(node: &StatNode) -> std::sync::MutexGuard<'static, ()> {
    static LOCKS: [std::sync::Mutex<()>; 16] = [const { std::sync::Mutex::new(()) }; 16];
    let i = (node as *const StatNode as usize >> 6) % LOCKS.len();
    LOCKS[i].lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes back a borrow a prioritized call recorded on `node` ([`Decision::Occupied`]) when a later check
/// refused the call (an adaptive limit): under the node's occupy lock, as the borrow was made, so the later
/// bucket's room comes back for the next prioritized call (cold: only a refused borrower gets here).
#[cold]
pub(crate) fn give_back_borrow(node: &StatNode, at_ms: u64, future_ms: u64, acquire: u32) {
    let _one_at_a_time = occupy_lock(node);
    node.take_back_waiting(at_ms, future_ms, acquire);
}

/// Java's `StatisticNode.tryOccupyNext`: how long a prioritized request must wait for a later bucket to have
/// room (`OCCUPY_TIMEOUT_MS` when none within the timeout). `own`: what the call reserved in the window
/// itself (not counted: it goes back when the call borrows).
fn try_occupy_next(node: &StatNode, now_ms: u64, acquire: u32, threshold: f64, own: u32) -> u64 {
    let (sample_count, interval_ms) = node.second_window();
    let max_count = threshold * interval_ms as f64 / 1000.0;
    let current_borrow = node.waiting(now_ms);
    if current_borrow as f64 >= max_count {
        return OCCUPY_TIMEOUT_MS;
    }
    let window = interval_ms / sample_count as u64;
    let mut earliest = (now_ms - now_ms % window + window) as i64 - interval_ms as i64;
    let mut idx = 0u64;
    let mut current_pass = node.admission().total(now_ms, &|start| node.borrowed_at(start)) as i64 - own as i64;
    while earliest < now_ms as i64 {
        let wait = idx * window + window - now_ms % window;
        if wait >= OCCUPY_TIMEOUT_MS {
            break;
        }
        let window_pass = if earliest < 0 { 0 } else { node.window_pass_at(earliest as u64) as i64 };
        if (current_pass + current_borrow as i64 + acquire as i64 - window_pass) as f64 <= max_count {
            return wait;
        }
        earliest += window as i64;
        current_pass -= window_pass;
        idx += 1;
    }
    OCCUPY_TIMEOUT_MS
}

#[cfg(test)]
pub(crate) mod borrow_hooks {
    thread_local! {
        /// Runs once on this thread in `reject_qps`, between a prioritized call's decision to borrow and the borrow.
        pub(crate) static AFTER_OCCUPY_DECISION: crate::rcu::test_hooks::Hook = const { std::cell::RefCell::new(None) };
    }
    /// The nodes whose openings wait for the occupy lock to read their borrowed passes.
    pub(crate) static OPENERS: crate::rcu::test_hooks::Waiters = crate::rcu::test_hooks::Waiters::new();
}

#[cfg(test)]
mod borrow_tests {
    use super::*;
    use crate::stat::Writer;
    use std::sync::{mpsc, Arc};

    const T0: u64 = 1_700_000_000_000;

    /// A normal call through the rule check, recorded as a pass like the engine does.
    fn pass(node: &StatNode, t: u64, limit: f64) -> bool {
        let ok = matches!(reject_qps(node, t, 1, limit, false, None), Decision::Pass { .. });
        if ok {
            node.pass_with(&Writer::at(t), 1);
        }
        ok
    }

    #[test]
    fn hooked_prioritized_borrow_racing_with_the_opening_of_its_bucket_never_over_admits() {
        // Limit 10: buckets 1 and 2 admit 5 each. Call A (prioritized, acquire 5, at T0+1499) decides to
        // borrow bucket 3 and stops there; meanwhile calls at T0+1500 open bucket 3 and spend its budget.
        let limit = 10.0;
        let node = Arc::new(StatNode::new());
        for _ in 0..5 {
            assert!(pass(&node, T0 + 600, limit));
        }
        for _ in 0..5 {
            assert!(pass(&node, T0 + 1100, limit));
        }
        assert!(!pass(&node, T0 + 1100, limit), "the window holds 10");
        let (stopped_tx, stopped_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let na = node.clone();
        let a = std::thread::spawn(move || {
            crate::rcu::test_hooks::set(&borrow_hooks::AFTER_OCCUPY_DECISION, move || {
                stopped_tx.send(()).expect("main waits");
                go_rx.recv().expect("main sends");
            });
            let d = reject_qps(&na, T0 + 1499, 5, limit, true, None);
            matches!(d, Decision::Occupied { .. })
        });
        stopped_rx.recv().expect("A decided to borrow");
        let nb = node.clone();
        let b = std::thread::spawn(move || {
            let mut n = 0u64;
            while pass(&nb, T0 + 1500, limit) {
                n += 1;
            }
            n
        });
        // B's opening either completes or waits for the lock A holds (then A goes on first).
        let me = Arc::as_ptr(&node) as usize;
        while !b.is_finished() && !borrow_hooks::OPENERS.has(me) {
            std::thread::yield_now();
        }
        go_tx.send(()).expect("A waits");
        let a_occupied = a.join().expect("A");
        let b3 = b.join().expect("B");
        let borrowed = node.borrowed_at(T0 + 1500);
        let window = 5 + b3 + borrowed;
        assert!(
            window <= 10,
            "buckets 2 and 3 admit {window} (5 + {b3} normal + {borrowed} borrowed; A occupied: {a_occupied})"
        );
    }
}
