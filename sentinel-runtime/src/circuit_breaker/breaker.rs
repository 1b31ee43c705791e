//! One circuit breaker: its statistics bucket and its CLOSED / OPEN / HALF_OPEN state machine.
//!
//! The state lives in one atomic word, so every transition is one compare-exchange. The counts are striped
//! per thread: a good call completing in an interval without a bad call adds to its own stripe and returns,
//! with no locked instruction; the other completions sum the stripes and decide (see [`Counts`]).

use std::fmt;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use crate::rcu;
use crate::stat::stripe;

use super::observers::{BreakerState, Observers};
use super::rule::{DegradeGrade, DegradeRule};

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const STATE_MASK: u64 = 0b11;

/// State word: `retry_ms << 2 | state`. The retry time (ms since the epoch) is meaningful in OPEN and
/// HALF_OPEN; packing both makes "open with this retry time" a single atomic transition.
#[inline]
fn state_word(state: u64, retry_ms: u64) -> u64 {
    (retry_ms.min(u64::MAX >> 2) << 2) | state
}

#[inline]
fn decode_state(word: u64) -> BreakerState {
    match word & STATE_MASK {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        _ => BreakerState::HalfOpen,
    }
}

// ---- Counts ----
//
// A breaker counts completed calls per interval in stripes (see `crate::stat::stripe`): every thread adds to
// its own stripe's cache line, with plain stores when it owns the stripe. The current interval is named by a
// key, `start_ms << SEQ_BITS | seq`, where `seq` counts the key changes (a new interval, or an emptying when a
// probe closes the breaker). Each stripe has two slots, used by alternate keys (`seq` parity), so the counts
// of the previous key stay readable while the next key fills. A slot holds the key its counts belong to; the
// thread that writes it first under a new key empties it (a seqlock: readers discard a slot that changed
// while they read it).
//
// Deciding needs the interval's totals, the sum over every stripe. A completion can trip a CLOSED breaker only
// if the interval holds a bad call (with no bad call, every ratio and count is 0, never above a threshold
// that is >= 0). So a bad call raises `bad_mark` to its key + 1 and every completion that finds the mark at
// or above its key + 1 sums the stripes and decides; a good call that finds it lower returns at once, with
// no locked instruction and no fence (a compiler fence only).
//
// Why no trip is missed (a trip the single-word design made on the interval's last completion, which saw the
// final counts). Call a completion "deciding" when it sums. Every deciding completion runs, after its own
// stripe write and before summing, a full fence: `fence(SeqCst)`, or the process-wide barrier
// (`rcu::heavy`, a full fence on every thread of the process) for a bad call that is the first to raise the
// mark to its key + 1 or finds the mark above its key + 1. Take a key K with at least one bad call (without
// one, nothing can trip) and let L be the deciding completion of K whose fence comes last.
// (1) Every deciding completion of K wrote its stripe before its fence, which precedes L's: L's sum sees it.
// (2) A good call G of K that did not decide wrote its stripe, ran a compiler fence, and read the mark at
//     most K. The mark only grows (`fetch_max`), so G's read comes before, in the mark's modification
//     order, the first write that made the mark exceed K, and before every later one. Let M be the bad call
//     of K that ran the barrier after such a write: the first one to raise the mark to K + 1 runs it; if the
//     mark exceeded K + 1 first (a bad call of a newer key), every bad call of K runs it, after its own
//     `fetch_max`. M's barrier is a full fence on G's thread at a point where G's mark read does not see M's
//     write yet, hence after G's stripe write (program order, kept by the compiler fence); the barrier ends
//     before M sums, and M's fence is at or before L's. So L's sum sees G's write too.
// L therefore decides on the interval's final counts, as the last compare-exchange of the single-word design
// did. Every sum includes the completion making it and every completion that happened before it, plus
// possibly some concurrent ones (the stripes are read one after the other, not as one snapshot).
// Without `membarrier` (not Linux), the compiler fence of a good call is a full fence: the same argument.
// The race is exercised by `a_good_and_a_bad_call_completing_at_the_same_instant_always_trip_together`,
// which misses trips within a few thousand rounds when the barrier is replaced by a plain fence.

/// Bits of the key that count key changes.
const SEQ_BITS: u32 = 20;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// The latest interval start a key holds (ms since the epoch, in the year 2527); later starts are clamped.
const MAX_START: u64 = (u64::MAX >> SEQ_BITS) - 1;
/// A slot's key before its first write.
const EMPTY: u64 = u64::MAX;
/// A slot's key while it is being emptied.
const BUSY: u64 = u64::MAX - 1;
/// A reading of the clock at most this many intervals older than the current interval counts into it.
const MAX_LAG: u64 = 8;
/// The shared bad count: its count bits, and the key bits that tag it.
const BAD_COUNT_BITS: u32 = 24;
const BAD_COUNT_MASK: u64 = (1 << BAD_COUNT_BITS) - 1;
const BAD_TAG_MASK: u64 = (1 << (64 - BAD_COUNT_BITS)) - 1;

#[inline(always)]
fn start_of(key: u64) -> u64 {
    key >> SEQ_BITS
}

/// One stripe's counts under one key.
struct Slot {
    key: AtomicU64,
    total: AtomicU64,
    bad: AtomicU64,
}

/// One stripe: the slots of alternate keys, in one cache line (both written by the stripe's thread only).
#[repr(align(64))]
struct StripeSlots([Slot; 2]);

impl StripeSlots {
    fn new() -> Self {
        let slot = || Slot { key: AtomicU64::new(EMPTY), total: AtomicU64::new(0), bad: AtomicU64::new(0) };
        StripeSlots([slot(), slot()])
    }
}

/// The counts of one tumbling interval of `stat_interval_ms`, aligned to multiples of the interval since
/// the epoch, striped per thread.
///
/// A caller whose clock reading is a little older (up to 8 intervals) than the current interval counts into
/// the current interval (it completed at its boundary); a clock that goes further back starts a new
/// interval. Counts are exact for threads that own a stripe; threads beyond the owned stripes share one and
/// count with atomic additions (one of them reading the clock two intervals late can empty the shared
/// stripe's slot of the newer interval). After 2^20 emptyings (closing probes) within one interval, a key
/// repeats and stale counts could be taken for current.
struct Counts {
    /// The current key.
    cur: AtomicU64,
    /// 1 + the newest key in which a bad call was recorded; 0 when none.
    bad_mark: AtomicU64,
    /// The bad calls of one key, written by bad calls only: `key's low 40 bits << 24 | count` (the count
    /// saturates at 2^24 - 1). Lets a completion in an interval with bad calls skip the sum when the bad
    /// count alone shows that no threshold can be crossed.
    bad_count: AtomicU64,
    interval_ms: u64,
    stripes: Box<[StripeSlots]>,
}

impl Counts {
    fn new(interval_ms: u64) -> Self {
        Counts {
            // No interval: the first call starts one.
            cur: AtomicU64::new(MAX_START << SEQ_BITS),
            bad_mark: AtomicU64::new(0),
            bad_count: AtomicU64::new(u64::MAX),
            interval_ms: interval_ms.max(1),
            stripes: (0..stripe::total_stripes()).map(|_| StripeSlots::new()).collect(),
        }
    }

    /// The key a call completing at `now_ms` counts under (no division unless `now_ms` left the interval).
    #[inline(always)]
    fn key(&self, now_ms: u64) -> u64 {
        let cur = self.cur.load(Ordering::Acquire);
        if now_ms.wrapping_sub(start_of(cur)) < self.interval_ms {
            cur
        } else {
            self.advance(now_ms)
        }
    }

    #[cold]
    #[inline(never)]
    fn advance(&self, now_ms: u64) -> u64 {
        let iv = self.interval_ms;
        let aligned = (now_ms - now_ms % iv).min(MAX_START);
        let mut cur = self.cur.load(Ordering::Acquire);
        loop {
            let s = start_of(cur);
            if now_ms.wrapping_sub(s) < iv || aligned == s {
                return cur;
            }
            if aligned < s && s - aligned <= MAX_LAG * iv {
                // The current interval is newer than our reading of the clock: count into it.
                return cur;
            }
            let next = (aligned << SEQ_BITS) | (cur.wrapping_add(1) & SEQ_MASK);
            match self.cur.compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return next,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Counts one completed call in this thread's stripe; returns the key it was counted under.
    #[inline(always)]
    fn add(&self, now_ms: u64, bad: bool) -> u64 {
        let key = self.key(now_ms);
        let lease = stripe::lease();
        if let Some(s) = self.stripes.get(lease.index) {
            let slot = &s.0[(key & 1) as usize];
            if slot.key.load(Ordering::Relaxed) == key {
                stripe::add(&slot.total, 1, lease.exclusive);
                if bad {
                    stripe::add(&slot.bad, 1, lease.exclusive);
                }
                return key;
            }
        }
        self.add_slow(now_ms, bad)
    }

    /// The slot is not at the key yet: empty it (or, for a stale key, count under the current one).
    #[cold]
    #[inline(never)]
    fn add_slow(&self, now_ms: u64, bad: bool) -> u64 {
        let lease = stripe::lease();
        // The lease always names one of the stripes; the shared one is the last.
        let s = &self.stripes[lease.index.min(self.stripes.len() - 1)];
        let exclusive = lease.exclusive && lease.index < self.stripes.len();
        loop {
            // Read the key again: the interval may have moved on while this call read it.
            let key = self.key(now_ms);
            let slot = &s.0[(key & 1) as usize];
            let k = slot.key.load(Ordering::Acquire);
            if k == key {
                stripe::add(&slot.total, 1, exclusive);
                if bad {
                    stripe::add(&slot.bad, 1, exclusive);
                }
                return key;
            }
            if exclusive {
                slot.key.store(BUSY, Ordering::Relaxed);
            } else if k == BUSY || slot.key.compare_exchange(k, BUSY, Ordering::Acquire, Ordering::Relaxed).is_err() {
                std::hint::spin_loop();
                continue;
            }
            // Readers that see the emptied counts see BUSY on their second look at the key.
            fence(Ordering::Release);
            slot.total.store(0, Ordering::Relaxed);
            slot.bad.store(0, Ordering::Relaxed);
            slot.key.store(key, Ordering::Release);
        }
    }

    /// Counts a bad call of `key` in the shared bad count (a locked instruction: bad calls only); returns the
    /// key's bad calls so far, this one included.
    fn count_bad(&self, key: u64) -> u64 {
        let tag = (key & BAD_TAG_MASK) << BAD_COUNT_BITS;
        let mut w = self.bad_count.load(Ordering::Relaxed);
        loop {
            let next =
                if w & !BAD_COUNT_MASK == tag { tag | ((w & BAD_COUNT_MASK) + 1).min(BAD_COUNT_MASK) } else { tag | 1 };
            match self.bad_count.compare_exchange_weak(w, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return next & BAD_COUNT_MASK,
                Err(actual) => w = actual,
            }
        }
    }

    /// The bad calls of `key` (`None`: not known, e.g. saturated or another key's count).
    fn bad_of(&self, key: u64) -> Option<u64> {
        let w = self.bad_count.load(Ordering::Acquire);
        let n = w & BAD_COUNT_MASK;
        (w & !BAD_COUNT_MASK == (key & BAD_TAG_MASK) << BAD_COUNT_BITS && n < BAD_COUNT_MASK).then_some(n)
    }

    /// A bad call was counted under `key`: raise the mark, then fence so that this call's sum sees every
    /// completion of the interval that did not see the mark (see the argument above).
    #[inline]
    fn mark_bad(&self, key: u64) {
        let m = key + 1;
        if self.bad_mark.load(Ordering::Relaxed) != m && self.bad_mark.fetch_max(m, Ordering::SeqCst) != m {
            // First to mark this key (or the mark names a newer key): wait until every thread is past its
            // good calls' compiler fences.
            rcu::heavy();
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// Whether a bad call was recorded under `key` or a newer key (ordered after this thread's count by a
    /// compiler fence: see the argument above).
    #[inline(always)]
    fn maybe_bad(&self, key: u64) -> bool {
        rcu::light();
        self.bad_mark.load(Ordering::Relaxed) > key
    }

    /// The `(total, bad)` summed over the stripes' slots at `key`.
    fn sum(&self, key: u64) -> (u64, u64) {
        let p = (key & 1) as usize;
        let (mut total, mut bad) = (0, 0);
        for s in self.stripes.iter() {
            let slot = &s.0[p];
            if slot.key.load(Ordering::Acquire) != key {
                continue;
            }
            let (t, b) = (slot.total.load(Ordering::Relaxed), slot.bad.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if slot.key.load(Ordering::Relaxed) == key {
                total += t;
                bad += b;
            }
        }
        (total, bad)
    }

    /// The current interval's `(total, bad)`.
    fn read(&self, now_ms: u64) -> (u64, u64) {
        let cur = self.cur.load(Ordering::Acquire);
        if now_ms.wrapping_sub(start_of(cur)) < self.interval_ms {
            fence(Ordering::SeqCst);
            self.sum(cur)
        } else {
            (0, 0)
        }
    }

    /// Empties the counts: a new key for the interval of `now_ms`.
    fn reset(&self, now_ms: u64) {
        let aligned = (now_ms - now_ms % self.interval_ms).min(MAX_START);
        let mut cur = self.cur.load(Ordering::Acquire);
        loop {
            let next = (aligned << SEQ_BITS) | (cur.wrapping_add(1) & SEQ_MASK);
            match self.cur.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// What [`Breaker::peek`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peek {
    /// Closed: the call passes.
    Closed,
    /// Open and past the retry time: the call may try to become the probe (the state word it saw).
    ProbeDue(u64),
    /// Open before the retry time, or half-open with the probe out.
    Blocked,
}

/// The state word and counts of a breaker.
struct Live {
    state: AtomicU64,
    counts: Counts,
}

/// A circuit breaker built from one degrade rule.
pub(crate) struct Breaker {
    pub(crate) rule: Arc<DegradeRule>,
    /// Per-stripe copies of `rule`, for the errors of blocked calls.
    rule_shares: crate::stat::stripe::Shares<DegradeRule>,
    /// Whether it was built from a default (`"*"`) rule.
    pub(crate) is_default: bool,
    /// The state and counts: shared with the breaker that replaces this one when its rule is reloaded with
    /// only a new id (Java's rule equality leaves the id out).
    live: Arc<Live>,
    /// How long the breaker stays open, ms.
    open_ms: u64,
    /// Slow-ratio rule: a call is bad iff it is slow (else iff it has an error).
    slow_grade: bool,
    /// Slow-ratio rules: a call is slow iff its rt in µs is above this.
    slow_rt_micros: u64,
    min_request: u64,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker").field("rule", &self.rule).field("state", &self.state()).finish()
    }
}

crate::stat::stripe::duplicate_by_clone!(DegradeRule);

impl Breaker {
    /// The rule, for a blocked call's error (see [`Shares`](crate::stat::stripe::Shares)).
    #[inline]
    pub(crate) fn rule_for_block(&self) -> Arc<DegradeRule> {
        self.rule_shares.share(&self.rule)
    }
    pub(crate) fn new(rule: Arc<DegradeRule>, is_default: bool) -> Self {
        // `rt > count ms` over integer µs: rt > floor(count * 1000).
        let slow_rt_micros = (rule.count * 1000.0).floor().clamp(0.0, u64::MAX as f64) as u64;
        Breaker {
            rule_shares: Default::default(),
            is_default,
            live: Arc::new(Live {
                state: AtomicU64::new(state_word(CLOSED, 0)),
                counts: Counts::new(rule.stat_interval_ms as u64),
            }),
            open_ms: rule.time_window_sec as u64 * 1000,
            slow_grade: rule.grade == DegradeGrade::SlowRequestRatio,
            slow_rt_micros,
            min_request: rule.min_request_amount as u64,
            rule,
        }
    }

    /// A breaker for `rule`, which differs from `old`'s rule in its id only: it takes over `old`'s state and
    /// counts (they are shared, so a probe `old` issued still decides them).
    pub(crate) fn taking_over(rule: Arc<DegradeRule>, old: &Breaker) -> Self {
        debug_assert!(rule.eq_but_id(&old.rule));
        Breaker {
            rule_shares: Default::default(),
            is_default: old.is_default,
            live: old.live.clone(),
            open_ms: old.open_ms,
            slow_grade: old.slow_grade,
            slow_rt_micros: old.slow_rt_micros,
            min_request: old.min_request,
            rule,
        }
    }

    /// Whether `self` and `other` are one breaker (the same, or one taking over the other's state).
    pub(crate) fn same_as(&self, other: &Breaker) -> bool {
        Arc::ptr_eq(&self.live, &other.live)
    }

    pub(crate) fn state(&self) -> BreakerState {
        decode_state(self.live.state.load(Ordering::Acquire))
    }

    /// The retry time while OPEN or HALF_OPEN.
    pub(crate) fn retry_ms(&self) -> Option<u64> {
        let w = self.live.state.load(Ordering::Acquire);
        (w & STATE_MASK != CLOSED).then_some(w >> 2)
    }

    /// The current interval's `(total, bad)` counts.
    pub(crate) fn counts(&self, now_ms: u64) -> (u64, u64) {
        self.live.counts.read(now_ms)
    }

    /// Reads the state for an entry, changing nothing.
    #[inline]
    pub(crate) fn peek(&self, now_ms: u64) -> Peek {
        let w = self.live.state.load(Ordering::Acquire);
        match w & STATE_MASK {
            CLOSED => Peek::Closed,
            OPEN if now_ms >= w >> 2 => Peek::ProbeDue(w),
            _ => Peek::Blocked,
        }
    }

    /// Tries to become the probe: of all callers that saw the same OPEN word past its retry time, exactly
    /// one wins the OPEN -> HALF_OPEN compare-exchange.
    #[cold]
    pub(crate) fn try_probe(&self, seen: u64, mgr: &Observers) -> bool {
        let half = (seen & !STATE_MASK) | HALF_OPEN;
        if self.live.state.compare_exchange(seen, half, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            mgr.notify(BreakerState::Open, BreakerState::HalfOpen, &self.rule, None);
            true
        } else {
            false
        }
    }

    /// The probe this entry holds was blocked by a later check: back to OPEN with the same retry time.
    #[cold]
    pub(crate) fn abort_probe(&self, mgr: &Observers) {
        let w = self.live.state.load(Ordering::Acquire);
        if w & STATE_MASK == HALF_OPEN {
            let open = (w & !STATE_MASK) | OPEN;
            if self.live.state.compare_exchange(w, open, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                mgr.notify(BreakerState::HalfOpen, BreakerState::Open, &self.rule, Some(1.0));
            }
        }
    }

    /// A call that passed completed. `probe`: this call is the breaker's half-open probe (its completion
    /// decides); otherwise it is counted and, while CLOSED, may trip the breaker.
    #[inline(always)]
    pub(crate) fn on_complete(&self, now_ms: u64, rt_micros: u64, error: bool, probe: bool, mgr: &Observers) {
        let bad = if self.slow_grade { rt_micros > self.slow_rt_micros } else { error };
        let key = self.live.counts.add(now_ms, bad);
        // A good call in an interval without a bad call cannot trip the breaker: done.
        if probe || bad || self.live.counts.maybe_bad(key) {
            self.complete_slow(key, now_ms, bad, probe, mgr);
        }
    }

    /// A completion that decides: the probe's, a bad call's, or one in an interval that has a bad call.
    #[cold]
    #[inline(never)]
    fn complete_slow(&self, key: u64, now_ms: u64, bad: bool, probe: bool, mgr: &Observers) {
        if probe {
            self.finish_probe(now_ms, bad, mgr);
            return;
        }
        let bad_calls = if bad {
            let n = self.live.counts.count_bad(key);
            self.live.counts.mark_bad(key);
            Some(n)
        } else {
            fence(Ordering::SeqCst);
            self.live.counts.bad_of(key)
        };
        // The bad count alone can show that no threshold can be crossed yet: then the stripes need no sum.
        // Every completion here ran a full fence after its own count and reads the bad count after it, so a
        // bad call counted after this read sums with this call's count included (the shared count's
        // compare-exchange is a full fence on its thread): whoever decides last still sees every call.
        if bad_calls.is_some_and(|n| !self.could_trip(n)) {
            return;
        }
        self.trip_if_over(key, now_ms, mgr);
    }

    /// Whether an interval with `bad` bad calls can meet the rule's threshold (a necessary condition: every
    /// trip needs at least `max(min_request_amount, 1)` calls).
    fn could_trip(&self, bad: u64) -> bool {
        let min = self.min_request.max(1) as f64;
        let bad = bad as f64;
        match self.rule.grade {
            DegradeGrade::ErrorCount => bad > self.rule.count,
            // ratio > r with total >= min needs bad > r * min.
            DegradeGrade::ErrorRatio => bad > self.rule.count * min,
            DegradeGrade::SlowRequestRatio => {
                let t = self.rule.slow_ratio_threshold;
                // A threshold of 1.0 trips at a ratio of exactly 1.0: bad == total >= min.
                if t >= 1.0 {
                    bad >= min
                } else {
                    bad > t * min
                }
            }
        }
    }

    /// Sums the interval's counts (this call's included) and trips the breaker if they call for it.
    fn trip_if_over(&self, key: u64, now_ms: u64, mgr: &Observers) {
        let w = self.live.state.load(Ordering::Acquire);
        if w & STATE_MASK != CLOSED {
            return; // only a closed breaker trips
        }
        let (total, bad_count) = self.live.counts.sum(key);
        if total < self.min_request {
            return;
        }
        let snapshot = match self.rule.grade {
            DegradeGrade::SlowRequestRatio => {
                let ratio = bad_count as f64 / total as f64;
                let threshold = self.rule.slow_ratio_threshold;
                (ratio > threshold || (ratio == 1.0 && threshold == 1.0)).then_some(ratio)
            }
            DegradeGrade::ErrorRatio => {
                let ratio = bad_count as f64 / total as f64;
                (ratio > self.rule.count).then_some(ratio)
            }
            DegradeGrade::ErrorCount => (bad_count as f64 > self.rule.count).then_some(bad_count as f64),
        };
        if let Some(value) = snapshot {
            self.trip(w, now_ms, value, mgr);
        }
    }

    #[cold]
    fn trip(&self, closed: u64, now_ms: u64, value: f64, mgr: &Observers) {
        let open = state_word(OPEN, now_ms.saturating_add(self.open_ms));
        if self.live.state.compare_exchange(closed, open, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            mgr.notify(BreakerState::Closed, BreakerState::Open, &self.rule, Some(value));
        }
    }

    #[cold]
    fn finish_probe(&self, now_ms: u64, bad: bool, mgr: &Observers) {
        let w = self.live.state.load(Ordering::Acquire);
        if w & STATE_MASK != HALF_OPEN {
            return;
        }
        if bad {
            let open = state_word(OPEN, now_ms.saturating_add(self.open_ms));
            if self.live.state.compare_exchange(w, open, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                mgr.notify(BreakerState::HalfOpen, BreakerState::Open, &self.rule, Some(1.0));
            }
        } else {
            self.live.counts.reset(now_ms);
            if self.live.state.compare_exchange(w, state_word(CLOSED, 0), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                mgr.notify(BreakerState::HalfOpen, BreakerState::Closed, &self.rule, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(grade: DegradeGrade, count: f64, min: u32) -> Arc<DegradeRule> {
        Arc::new(DegradeRule::new("r", grade).count(count).min_request_amount(min).time_window_sec(10))
    }

    #[test]
    fn counts_within_an_interval_and_restart_at_the_next() {
        let c = Counts::new(1000);
        let k = c.add(5_000, false);
        assert_eq!(c.add(5_999, true), k);
        assert_eq!(c.sum(k), (2, 1));
        assert_eq!(c.read(5_500), (2, 1));
        // Aligned to the epoch: 6000 starts a new interval; the previous one stays readable under its key.
        let k2 = c.add(6_000, true);
        assert_ne!(k2, k);
        assert_eq!(c.read(6_999), (1, 1));
        assert_eq!(c.sum(k), (2, 1));
        assert_eq!(c.read(7_000), (0, 0));
        // Two intervals later the slot of `k` is reused and emptied.
        let k3 = c.add(7_000, false);
        assert_eq!(k3 & 1, k & 1);
        assert_eq!(c.sum(k3), (1, 0));
        assert_eq!(c.sum(k), (0, 0));
    }

    #[test]
    fn counts_a_late_reading_into_the_newer_interval_and_restart_when_time_goes_far_back() {
        let c = Counts::new(100);
        let k = c.add(1_000, false);
        assert_eq!(c.add(950, true), k);
        assert_eq!(c.read(1_050), (2, 1));
        // More than 8 intervals back: a new interval.
        let back = c.add(100, true);
        assert_ne!(back, k);
        assert_eq!(c.read(150), (1, 1));
    }

    #[test]
    fn reset_empties_the_current_interval() {
        let c = Counts::new(1000);
        c.add(5_000, true);
        c.add(5_100, false);
        c.reset(5_200);
        assert_eq!(c.read(5_300), (0, 0));
        c.add(5_300, false);
        assert_eq!(c.read(5_400), (1, 0));
        // Several resets in a row keep emptying.
        c.reset(5_500);
        c.reset(5_500);
        assert_eq!(c.read(5_600), (0, 0));
    }

    #[test]
    fn only_bad_calls_mark_the_interval() {
        let c = Counts::new(1000);
        let k = c.add(5_000, false);
        assert!(!c.maybe_bad(k));
        let k = c.add(5_001, true);
        c.mark_bad(k);
        assert!(c.maybe_bad(k));
        // The next interval starts unmarked.
        let k2 = c.add(6_000, false);
        assert!(!c.maybe_bad(k2));
    }

    #[test]
    fn counts_from_more_threads_than_stripes_sum_exactly() {
        const PER_THREAD: u64 = 10_000;
        // Beyond the owned stripes, threads share one with atomic additions: both kinds of writer.
        let threads = stripe::total_stripes() as u64 + 3;
        let c = Counts::new(1000);
        std::thread::scope(|s| {
            for t in 0..threads {
                let c = &c;
                s.spawn(move || {
                    for i in 0..PER_THREAD {
                        c.add(5_000 + i % 1000, (i + t) % 10 == 0);
                    }
                });
            }
        });
        assert_eq!(c.read(5_999), (threads * PER_THREAD, threads * PER_THREAD / 10));
    }

    #[test]
    fn a_good_call_reaching_min_request_amount_trips_even_when_calls_complete_concurrently() {
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 200;
        let mgr = Observers::default();
        for round in 0..20 {
            // Error ratio > 0 with every call of the round needed: only the interval's final counts trip,
            // whichever completion comes last (one error among thousands of good calls).
            let b = Breaker::new(rule(DegradeGrade::ErrorRatio, 0.0, (THREADS * PER_THREAD) as u32), false);
            let now = 1_700_000_000_000;
            let start = std::sync::Barrier::new(THREADS as usize);
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (b, mgr, start) = (&b, &mgr, &start);
                    s.spawn(move || {
                        start.wait();
                        for i in 0..PER_THREAD {
                            let error = t == round % THREADS && i == (round * 37) % PER_THREAD;
                            b.on_complete(now, 10, error, false, mgr);
                        }
                    });
                }
            });
            assert_eq!(b.counts(now), (THREADS * PER_THREAD, 1), "round {round}");
            assert_eq!(b.state(), BreakerState::Open, "round {round}");
        }
    }

    #[test]
    fn the_bad_count_prefilter_never_hides_a_trip() {
        let mgr = Observers::default();
        let now = 1_700_000_000_000;
        // Error ratio 0.5 with min 4: two bad calls can never exceed it at 4 calls; a third can.
        let b = Breaker::new(rule(DegradeGrade::ErrorRatio, 0.5, 4), false);
        assert!(!b.could_trip(2) && b.could_trip(3));
        for bad in [true, true, false, false] {
            b.on_complete(now, 10, bad, false, &mgr);
        }
        assert_eq!(b.state(), BreakerState::Closed, "2 of 4 is not above 0.5");
        b.on_complete(now, 10, true, false, &mgr);
        assert_eq!(b.state(), BreakerState::Open, "3 of 5 is");

        // The trip on a good call: three bad calls wait for min_request_amount, the good fourth call trips.
        let b = Breaker::new(rule(DegradeGrade::ErrorRatio, 0.5, 4), false);
        for _ in 0..3 {
            b.on_complete(now, 10, true, false, &mgr);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.on_complete(now, 10, false, false, &mgr);
        assert_eq!(b.state(), BreakerState::Open);

        // Error count 3: the fourth error trips, however many good calls come between.
        let b = Breaker::new(rule(DegradeGrade::ErrorCount, 3.0, 1), false);
        for i in 0..300 {
            b.on_complete(now, 10, i % 100 == 0, false, &mgr);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.on_complete(now, 10, true, false, &mgr);
        assert_eq!(b.state(), BreakerState::Open);

        // Slow ratio 1.0 trips at exactly 1.0: every call slow, at min_request_amount.
        let mut r = DegradeRule::new("r", DegradeGrade::SlowRequestRatio).count(1.0).min_request_amount(3);
        r = r.slow_ratio_threshold(1.0).time_window_sec(10);
        let b = Breaker::new(Arc::new(r), false);
        assert!(!b.could_trip(2) && b.could_trip(3));
        for _ in 0..3 {
            b.on_complete(now, 5_000, false, false, &mgr);
        }
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_good_and_a_bad_call_completing_at_the_same_instant_always_trip_together() {
        // The store-buffering race: the good call's count may still be in its core's store buffer when the
        // bad call sums, and the good call may read the mark before the bad call's store is visible. One of
        // the two must see the other (the barrier), so the pair's final counts (2 calls, 1 error) trip.
        const ROUNDS: usize = 10_000;
        let mgr = Observers::default();
        let breakers: Vec<Breaker> =
            (0..ROUNDS).map(|_| Breaker::new(rule(DegradeGrade::ErrorCount, 0.0, 2), false)).collect();
        let arrived = std::sync::atomic::AtomicUsize::new(0);
        let now = 1_700_000_000_000;
        std::thread::scope(|s| {
            for bad in [false, true] {
                let (breakers, mgr, arrived) = (&breakers, &mgr, &arrived);
                s.spawn(move || {
                    for (round, b) in breakers.iter().enumerate() {
                        // Both threads start each round together (spinning, so they overlap closely).
                        arrived.fetch_add(1, Ordering::SeqCst);
                        while arrived.load(Ordering::SeqCst) < 2 * (round + 1) {
                            std::hint::spin_loop();
                        }
                        b.on_complete(now, 10, bad, false, mgr);
                    }
                });
            }
        });
        let missed = breakers.iter().filter(|b| b.state() != BreakerState::Open).count();
        assert_eq!(missed, 0, "{missed} of {ROUNDS} rounds missed the trip");
        assert!(breakers.iter().all(|b| b.counts(now) == (2, 1)));
    }

    #[test]
    fn error_count_sums_errors_from_all_threads_exactly() {
        const THREADS: u64 = 4;
        const ERRORS_PER_THREAD: u64 = 25;
        let mgr = Observers::default();
        let limit = THREADS * ERRORS_PER_THREAD;
        let b = Breaker::new(rule(DegradeGrade::ErrorCount, limit as f64, 1), false);
        let now = 1_700_000_000_000;
        // Exactly `count` errors (not above it) with good calls in between, from several threads: closed.
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let (b, mgr) = (&b, &mgr);
                s.spawn(move || {
                    for _ in 0..ERRORS_PER_THREAD {
                        b.on_complete(now, 10, true, false, mgr);
                        b.on_complete(now, 10, false, false, mgr);
                    }
                });
            }
        });
        assert_eq!(b.counts(now), (2 * limit, limit));
        assert_eq!(b.state(), BreakerState::Closed);
        // One more error, from yet another thread: above the count.
        std::thread::scope(|s| {
            s.spawn(|| b.on_complete(now, 10, true, false, &mgr));
        });
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn slow_calls_are_strictly_above_the_rule_count_in_microseconds() {
        let mgr = Observers::default();
        let r = Arc::new(
            DegradeRule::new("r", DegradeGrade::SlowRequestRatio)
                .count(5.0)
                .slow_ratio_threshold(1.0)
                .min_request_amount(2)
                .time_window_sec(1),
        );
        let b = Breaker::new(r, false);
        b.on_complete(10_000, 5_000, false, false, &mgr);
        b.on_complete(10_000, 5_001, false, false, &mgr);
        assert_eq!(b.counts(10_000), (2, 1));
        assert_eq!(b.state(), BreakerState::Closed);
        // A new interval of slow calls only: the ratio is exactly 1.0 and so is the threshold.
        b.on_complete(11_000, 5_001, false, false, &mgr);
        assert_eq!(b.state(), BreakerState::Closed);
        b.on_complete(11_000, 9_000, false, false, &mgr);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_stripe_takes_one_cache_line() {
        assert_eq!(std::mem::size_of::<StripeSlots>(), 64);
        assert_eq!(std::mem::align_of::<StripeSlots>(), 64);
    }

    #[test]
    fn state_word_round_trips() {
        let w = state_word(OPEN, 1_700_000_000_000);
        assert_eq!(decode_state(w), BreakerState::Open);
        assert_eq!(w >> 2, 1_700_000_000_000);
    }
}
