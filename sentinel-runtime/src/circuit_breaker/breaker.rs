//! One circuit breaker: its statistics bucket and its CLOSED / OPEN / HALF_OPEN state machine.
//!
//! Both the state and the counts live in single atomic words, so every transition and every recorded call is
//! one compare-exchange: no lock, and a consistent view of the counts right after each call is recorded.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::manager::DegradeManager;
use super::rule::{DegradeGrade, DegradeRule};

/// The state of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls pass and are counted; the breaker opens when its rule's threshold is exceeded.
    Closed,
    /// Calls are blocked until the retry time (open time + `time_window_sec`).
    Open,
    /// One probe call is out; every other call is blocked until the probe completes.
    HalfOpen,
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "CLOSED",
            BreakerState::Open => "OPEN",
            BreakerState::HalfOpen => "HALF_OPEN",
        })
    }
}

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

// Counts word: `tag (22 bits) | total (21 bits) | bad (21 bits)`, where `tag` is the interval number
// (`now_ms / stat_interval_ms`, counted from the epoch) modulo 2^22 and `bad` counts slow calls (slow-ratio
// rules) or calls with an error (error rules).
const COUNT_BITS: u32 = 21;
const TAG_BITS: u32 = 22;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// A reading of the clock at most this many intervals older than the stored interval counts into it.
const MAX_LAG: u64 = 8;

#[inline]
fn pack(tag: u64, total: u64, bad: u64) -> u64 {
    (tag << (2 * COUNT_BITS)) | (total << COUNT_BITS) | bad
}

#[inline]
fn unpack(word: u64) -> (u64, u64, u64) {
    (word >> (2 * COUNT_BITS), (word >> COUNT_BITS) & COUNT_MAX, word & COUNT_MAX)
}

/// One tumbling bucket of `stat_interval_ms`, aligned to multiples of the interval since the epoch.
///
/// A call is counted by one compare-exchange that also starts a new interval when the stored one is over, so
/// a count is never lost at an interval boundary. A caller whose clock reading is a little older (up to 8
/// intervals) than the interval already stored counts into the stored interval (it completed at its boundary);
/// a clock that goes further back starts a new interval. Per interval the counts go up to 2,097,151; past that
/// both are halved, which keeps the ratio. The interval is stored modulo 2^22: counts left untouched for
/// within 8 intervals of an exact multiple of 2^22 intervals (48 days at 1 s) would be taken for current.
struct Bucket {
    word: AtomicU64,
    interval_ms: u64,
}

impl Bucket {
    fn new(interval_ms: u64) -> Self {
        Bucket { word: AtomicU64::new(0), interval_ms: interval_ms.max(1) }
    }

    #[inline]
    fn tag(&self, now_ms: u64) -> u64 {
        (now_ms / self.interval_ms) & TAG_MASK
    }

    /// Counts one completed call; returns the interval's `(total, bad)` including it.
    #[inline]
    fn record(&self, now_ms: u64, bad: bool) -> (u64, u64) {
        let tag = self.tag(now_ms);
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            let (ctag, t, b) = unpack(cur);
            let (ntag, mut t, mut b) = if ctag == tag {
                (tag, t, b)
            } else if ctag.wrapping_sub(tag) & TAG_MASK <= MAX_LAG {
                // The stored interval is newer than our reading of the clock: count into it.
                (ctag, t, b)
            } else {
                (tag, 0, 0)
            };
            if t == COUNT_MAX {
                t /= 2;
                b /= 2;
            }
            t += 1;
            b += bad as u64;
            match self.word.compare_exchange_weak(cur, pack(ntag, t, b), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return (t, b),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The current interval's `(total, bad)`.
    fn read(&self, now_ms: u64) -> (u64, u64) {
        let (ctag, t, b) = unpack(self.word.load(Ordering::Relaxed));
        if ctag == self.tag(now_ms) {
            (t, b)
        } else {
            (0, 0)
        }
    }

    /// Empties the current interval.
    fn reset(&self, now_ms: u64) {
        self.word.store(pack(self.tag(now_ms), 0, 0), Ordering::Relaxed);
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

/// A circuit breaker built from one degrade rule.
pub(crate) struct Breaker {
    pub(crate) rule: Arc<DegradeRule>,
    /// Whether it was built from a default (`"*"`) rule.
    pub(crate) is_default: bool,
    state: AtomicU64,
    bucket: Bucket,
    /// How long the breaker stays open, ms.
    open_ms: u64,
    /// Slow-ratio rules: a call is slow iff its rt in µs is above this.
    slow_rt_micros: u64,
    min_request: u64,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker").field("rule", &self.rule).field("state", &self.state()).finish()
    }
}

impl Breaker {
    pub(crate) fn new(rule: Arc<DegradeRule>, is_default: bool) -> Self {
        // `rt > count ms` over integer µs: rt > floor(count * 1000).
        let slow_rt_micros = (rule.count * 1000.0).floor().clamp(0.0, u64::MAX as f64) as u64;
        Breaker {
            is_default,
            state: AtomicU64::new(state_word(CLOSED, 0)),
            bucket: Bucket::new(rule.stat_interval_ms as u64),
            open_ms: rule.time_window_sec as u64 * 1000,
            slow_rt_micros,
            min_request: rule.min_request_amount as u64,
            rule,
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        decode_state(self.state.load(Ordering::Acquire))
    }

    /// The retry time while OPEN or HALF_OPEN.
    pub(crate) fn retry_ms(&self) -> Option<u64> {
        let w = self.state.load(Ordering::Acquire);
        (w & STATE_MASK != CLOSED).then_some(w >> 2)
    }

    /// The current interval's `(total, bad)` counts.
    pub(crate) fn counts(&self, now_ms: u64) -> (u64, u64) {
        self.bucket.read(now_ms)
    }

    /// Reads the state for an entry, changing nothing.
    #[inline]
    pub(crate) fn peek(&self, now_ms: u64) -> Peek {
        let w = self.state.load(Ordering::Acquire);
        match w & STATE_MASK {
            CLOSED => Peek::Closed,
            OPEN if now_ms >= w >> 2 => Peek::ProbeDue(w),
            _ => Peek::Blocked,
        }
    }

    /// Tries to become the probe: of all callers that saw the same OPEN word past its retry time, exactly
    /// one wins the OPEN -> HALF_OPEN compare-exchange.
    #[cold]
    pub(crate) fn try_probe(&self, seen: u64, mgr: &DegradeManager) -> bool {
        let half = (seen & !STATE_MASK) | HALF_OPEN;
        if self.state.compare_exchange(seen, half, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            mgr.notify(BreakerState::Open, BreakerState::HalfOpen, &self.rule, None);
            true
        } else {
            false
        }
    }

    /// The probe this entry holds was blocked by a later check: back to OPEN with the same retry time.
    #[cold]
    pub(crate) fn abort_probe(&self, mgr: &DegradeManager) {
        let w = self.state.load(Ordering::Acquire);
        if w & STATE_MASK == HALF_OPEN {
            let open = (w & !STATE_MASK) | OPEN;
            if self.state.compare_exchange(w, open, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                mgr.notify(BreakerState::HalfOpen, BreakerState::Open, &self.rule, Some(1.0));
            }
        }
    }

    /// A call that passed completed. `probe`: this call is the breaker's half-open probe (its completion
    /// decides); otherwise it is counted and, while CLOSED, may trip the breaker.
    #[inline]
    pub(crate) fn on_complete(&self, now_ms: u64, rt_micros: u64, error: bool, probe: bool, mgr: &DegradeManager) {
        let bad = match self.rule.grade {
            DegradeGrade::SlowRequestRatio => rt_micros > self.slow_rt_micros,
            DegradeGrade::ErrorRatio | DegradeGrade::ErrorCount => error,
        };
        let (total, bad_count) = self.bucket.record(now_ms, bad);
        if probe {
            self.finish_probe(now_ms, bad, mgr);
            return;
        }
        if total < self.min_request {
            return;
        }
        let w = self.state.load(Ordering::Acquire);
        if w & STATE_MASK != CLOSED {
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
    fn trip(&self, closed: u64, now_ms: u64, value: f64, mgr: &DegradeManager) {
        let open = state_word(OPEN, now_ms.saturating_add(self.open_ms));
        if self.state.compare_exchange(closed, open, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            mgr.notify(BreakerState::Closed, BreakerState::Open, &self.rule, Some(value));
        }
    }

    #[cold]
    fn finish_probe(&self, now_ms: u64, bad: bool, mgr: &DegradeManager) {
        let w = self.state.load(Ordering::Acquire);
        if w & STATE_MASK != HALF_OPEN {
            return;
        }
        if bad {
            let open = state_word(OPEN, now_ms.saturating_add(self.open_ms));
            if self.state.compare_exchange(w, open, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                mgr.notify(BreakerState::HalfOpen, BreakerState::Open, &self.rule, Some(1.0));
            }
        } else {
            self.bucket.reset(now_ms);
            if self.state.compare_exchange(w, state_word(CLOSED, 0), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                mgr.notify(BreakerState::HalfOpen, BreakerState::Closed, &self.rule, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_counts_within_an_interval_and_restarts_at_the_next() {
        let b = Bucket::new(1000);
        assert_eq!(b.record(5_000, false), (1, 0));
        assert_eq!(b.record(5_999, true), (2, 1));
        assert_eq!(b.read(5_500), (2, 1));
        // Aligned to the epoch: 6000 starts a new interval.
        assert_eq!(b.record(6_000, true), (1, 1));
        assert_eq!(b.read(6_999), (1, 1));
        assert_eq!(b.read(7_000), (0, 0));
    }

    #[test]
    fn bucket_counts_a_late_reading_into_the_newer_interval_and_survives_time_going_back() {
        let b = Bucket::new(100);
        b.record(1_000, false);
        assert_eq!(b.record(950, true), (2, 1));
        assert_eq!(b.read(1_050), (2, 1));
    }

    #[test]
    fn bucket_halves_both_counts_when_full() {
        let b = Bucket::new(1000);
        b.word.store(pack(b.tag(0), COUNT_MAX, COUNT_MAX / 2), Ordering::Relaxed);
        let (t, bad) = b.record(0, false);
        assert_eq!(t, COUNT_MAX / 2 + 1);
        assert_eq!(bad, COUNT_MAX / 4);
    }

    #[test]
    fn state_word_round_trips() {
        let w = state_word(OPEN, 1_700_000_000_000);
        assert_eq!(decode_state(w), BreakerState::Open);
        assert_eq!(w >> 2, 1_700_000_000_000);
    }
}
