//! Per-rule state: the bounded table of per-value counters, and the three per-value algorithms.

use std::sync::Arc;

use super::rule::ParamFlowRule;
use super::table::{CellRef, Step, ValueTable};
use super::value::ValueKey;
use crate::clock::NANOS_PER_MILLI;
use crate::flow::{ControlBehavior, FlowGrade};

/// Java's `ParameterMetric.BASE_PARAM_MAX_CAPACITY`: counters kept per second of `duration_in_sec`.
pub const BASE_PARAM_MAX_CAPACITY: u64 = 4000;
/// Java's `ParameterMetric.TOTAL_MAX_CAPACITY`: the most counters one rule keeps.
pub const TOTAL_MAX_CAPACITY: u64 = 200_000;

/// How many distinct values one rule tracks at most: `min(4000 * duration_in_sec, 200000)`.
pub fn counter_capacity(duration_in_sec: u64) -> usize {
    BASE_PARAM_MAX_CAPACITY.saturating_mul(duration_in_sec.max(1)).min(TOTAL_MAX_CAPACITY) as usize
}

/// The bits of a token bucket's time (ms) and of its tokens, in a counter's 96-bit payload.
const BUCKET_BITS: u32 = 48;
const BUCKET_MASK: u64 = (1 << BUCKET_BITS) - 1;
/// The most tokens a bucket holds: `count + burst` above this (2.8 * 10^14) counts as this much, which no
/// caller spends within a rule's duration.
pub(crate) const BUCKET_MAX_TOKENS: i64 = BUCKET_MASK as i64;

/// What a value's token bucket holds when full: its `threshold` (an item's count, else the rule's, read as
/// the engine reads it: `count as i64`) plus the rule's `burst`, within `0..=BUCKET_MAX_TOKENS`. The one
/// reading of a bucket's size: the check, and the quota the web layer's RateLimit fields give for the value
/// whether its call passed or was blocked.
#[inline]
fn bucket_max(threshold: i64, burst: i64) -> i64 {
    threshold.max(0).saturating_add(burst).clamp(0, BUCKET_MAX_TOKENS)
}

/// A rule's burst as the engine reads it.
fn burst_of(rule: &ParamFlowRule) -> i64 {
    rule.burst_count.min(i64::MAX as u64) as i64
}

/// The quota of a value held to `threshold` (its item's count, else the rule's: [`BlockError::ParamFlow`]'s
/// `threshold`) under `rule`'s token bucket: what the bucket holds when full, as [`bucket_max`] reads it.
///
/// [`BlockError::ParamFlow`]: crate::BlockError::ParamFlow
#[cfg_attr(not(feature = "tower"), allow(dead_code))] // Read by the web layer's RateLimit headers.
pub(crate) fn bucket_quota(rule: &ParamFlowRule, threshold: f64) -> u64 {
    bucket_max(threshold as i64, burst_of(rule)) as u64
}

/// The quota a client is told for a value held to `threshold` under `rule` (a QPS rule): its token bucket's
/// size ([`bucket_quota`]), or for the rate limiter, which spaces the value's calls `duration / count` apart
/// and never reads the burst (Java's `passThrottleLocalCheck`), the count, read as the engine reads it.
#[cfg_attr(not(feature = "tower"), allow(dead_code))] // Read by the web layer's RateLimit headers.
pub(crate) fn value_quota(rule: &ParamFlowRule, threshold: f64) -> u64 {
    match rule.control_behavior {
        ControlBehavior::RateLimiter => (threshold as i64).max(0) as u64,
        _ => bucket_quota(rule, threshold),
    }
}

/// A token bucket's payload: the time of its last refill (ms) and the tokens left.
#[inline]
fn pack_bucket(last_ms: u64, tokens: i64) -> u128 {
    (((last_ms & BUCKET_MASK) as u128) << BUCKET_BITS) | (tokens as u64 & BUCKET_MASK) as u128
}
#[inline]
fn unpack_bucket(p: u128) -> (u64, i64) {
    ((p >> BUCKET_BITS) as u64 & BUCKET_MASK, (p as u64 & BUCKET_MASK) as i64)
}

/// A thread-grade permit on one value's counter, given back at exit to the rule that gave it
/// ([`ParamRuleState::release`]): one word, which names the rule's table, so an entry holds it without a
/// reference count. A rule replaced meanwhile (its counters gone with it), or a value whose cell went to
/// another value since, takes nothing back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ValuePermit(CellRef);

/// A token bucket read without spending ([`ParamRuleState::peek_bucket`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "tower"), allow(dead_code))] // Read by the web layer's RateLimit headers.
pub(crate) struct BucketPeek {
    /// What the bucket holds when full (`count + burst_count`).
    pub(crate) quota: u64,
    /// Tokens a call could take now.
    pub(crate) remaining: u64,
    /// Milliseconds until the bucket refills (strictly more than the window after its last refill).
    pub(crate) refill_in_ms: u64,
}

/// What a rule does with each value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Qps / Reject: a lazy token bucket per value.
    Bucket,
    /// Qps / RateLimiter: uniform spacing per value, queueing strictly less than this many ns.
    Throttle { max_queue_nanos: u64 },
    /// Thread grade: calls in flight per value.
    Thread,
}

/// The slot a rate limiter gave a value ([`ValueDecision::Spaced`]): the value's counter, the pass time it
/// held before and the one the pass stored ([`ParamRuleState::give_back_slot`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThrottleSlot {
    at: CellRef,
    before: u64,
    taken: u64,
}

/// The outcome for one value.
#[derive(Debug)]
pub(crate) enum ValueDecision {
    Pass,
    /// Rate limiter: pass after waiting this long (0: at once), in the slot taken.
    Spaced(u64, ThrottleSlot),
    /// Pass holding one in-flight permit on the value, released at exit.
    Permit(ValuePermit),
    /// Block; a retry could pass after this long (when known).
    Block(Option<std::time::Duration>),
    /// Thread grade: the value has its threshold of calls in flight, counted in this cell. A call that holds a
    /// permit on that cell already passes (a value it carries twice is one call in flight); any other blocks.
    Full(ValuePermit),
}

/// A loaded rule with its counters.
pub(crate) struct ParamRuleState {
    pub(crate) rule: Arc<ParamFlowRule>,
    /// Per-stripe copies of `rule`, for the errors of blocked calls.
    rule_shares: crate::stat::stripe::Shares<ParamFlowRule>,
    mode: Mode,
    /// `(long) count`, as Java reads it.
    threshold: i64,
    burst: i64,
    duration_ms: u64,
    duration_sec: u64,
    /// Exception items, sorted by key: `(key, threshold, count)`, the threshold as the checks read it and the
    /// count as the rule gives it (for a blocked call's error).
    items: Box<[(ValueKey, i64, f64)]>,
    counters: ValueTable,
}

impl std::fmt::Debug for ParamRuleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamRuleState").field("rule", &self.rule).field("tracked", &self.counters.tracked()).finish()
    }
}

crate::stat::stripe::duplicate_by_clone!(ParamFlowRule);

impl ParamRuleState {
    /// The rule, for a blocked call's error (see [`Shares`](crate::stat::stripe::Shares)).
    #[inline]
    pub(crate) fn rule_for_block(&self) -> Arc<ParamFlowRule> {
        self.rule_shares.share(&self.rule)
    }
    pub(crate) fn new(rule: ParamFlowRule) -> Self {
        Self::with_capacity(rule, None)
    }

    /// A state tracking at most `cap` values instead of the rule's formula (tests of eviction).
    pub(crate) fn with_capacity(rule: ParamFlowRule, cap: Option<usize>) -> Self {
        let mode = match (rule.grade, rule.control_behavior) {
            (FlowGrade::Thread, _) => Mode::Thread,
            (FlowGrade::Qps, ControlBehavior::RateLimiter) => {
                Mode::Throttle { max_queue_nanos: rule.max_queueing_time_ms.saturating_mul(NANOS_PER_MILLI) }
            }
            (FlowGrade::Qps, _) => Mode::Bucket,
        };
        let mut items: Vec<(ValueKey, i64, f64)> = Vec::with_capacity(rule.items.len());
        for it in &rule.items {
            let key = ValueKey::of_item(&it.value);
            // A later item for the same value replaces an earlier one (Java parses items into a map).
            items.retain(|(k, ..)| *k != key);
            items.push((key, it.count as i64, it.count));
        }
        items.sort_by_key(|(k, ..)| *k);
        let counters = ValueTable::new(cap.unwrap_or_else(|| counter_capacity(rule.duration_in_sec)));
        let duration_sec = rule.duration_in_sec.max(1);
        ParamRuleState {
            rule_shares: Default::default(),
            mode,
            threshold: rule.count as i64,
            burst: burst_of(&rule),
            duration_ms: duration_sec.saturating_mul(1000),
            duration_sec,
            items: items.into_boxed_slice(),
            counters,
            rule: Arc::new(rule),
        }
    }

    /// Gives back an in-flight call's permit, if this rule gave it: `false` when it is another rule's.
    pub(crate) fn release(&self, permit: ValuePermit) -> bool {
        self.counters.release(permit.0, |n| n.saturating_sub(1))
    }

    /// Thread grade: one more call in flight on the value of `permit`, whatever the threshold (a call that
    /// holds `permit` and carries the value again: Java counts each element of a call that passed).
    pub(crate) fn add_again(&self, permit: ValuePermit) {
        self.counters.release(permit.0, |n| n.saturating_add(1));
    }

    /// Gives back the slot a rate limiter's pass took ([`ValueDecision::Spaced`]) if no later call took one
    /// of the value since (else it stays taken: later calls are spaced from it already).
    pub(crate) fn give_back_slot(&self, slot: ThrottleSlot) {
        let (before, taken) = (slot.before as u128, slot.taken as u128);
        self.counters.release(slot.at, |n| if n == taken { before } else { n });
    }

    /// Whether a call that passed holds something of this rule until it exits (a thread-grade permit).
    pub(crate) fn holds_permits(&self) -> bool {
        self.mode == Mode::Thread
    }

    /// The values tracked now: at most [`capacity`](Self::capacity), but for a rare race of misses at the
    /// capacity (the table's module docs), never more than the table's cells.
    pub(crate) fn tracked(&self) -> usize {
        self.counters.tracked()
    }
    /// The most values this rule tracks.
    pub(crate) fn capacity(&self) -> usize {
        self.counters.capacity()
    }

    #[inline]
    fn threshold_for(&self, key: &ValueKey) -> i64 {
        if self.items.is_empty() {
            return self.threshold;
        }
        match self.items.binary_search_by(|(k, ..)| k.cmp(key)) {
            Ok(i) => self.items[i].1,
            Err(_) => self.threshold,
        }
    }

    /// The count a value is held to, as the rule gives it: its item's, else the rule's (a blocked call's
    /// error).
    #[cold]
    pub(crate) fn count_for(&self, key: &ValueKey) -> f64 {
        match self.items.binary_search_by(|(k, ..)| k.cmp(key)) {
            Ok(i) => self.items[i].2,
            Err(_) => self.rule.count,
        }
    }

    /// Decides one value.
    #[inline(always)]
    /// `now_nanos` is the entry's (possibly cached) time; the rate limiter spaces calls with `precise()`.
    pub(crate) fn decide_value(
        &self,
        key: &ValueKey,
        acquire: u32,
        now_nanos: u64,
        precise: impl FnOnce() -> u64,
    ) -> ValueDecision {
        let threshold = self.threshold_for(key);
        match self.mode {
            Mode::Bucket => self.bucket(key, threshold, acquire as i64, now_nanos / NANOS_PER_MILLI),
            Mode::Throttle { max_queue_nanos } => self.throttle(key, threshold, acquire, precise(), max_queue_nanos),
            Mode::Thread => self.thread(key, threshold),
        }
    }

    /// Java's `ParamFlowChecker.passDefaultLocalCheck`, with the refill time and the tokens in one word so
    /// that concurrent callers never over-admit.
    #[inline(always)]
    fn bucket(&self, key: &ValueKey, count: i64, acquire: i64, now_ms: u64) -> ValueDecision {
        if count <= 0 {
            return ValueDecision::Block(None);
        }
        let max = bucket_max(count, self.burst);
        if acquire > max {
            return ValueDecision::Block(None);
        }
        let now_ms = now_ms.min(BUCKET_MASK);
        // The step answers what a block needs (the bucket's refill time and tokens), or `None` for a pass: a
        // small answer keeps the check of a tracked value from moving a whole decision around.
        let first = || (pack_bucket(now_ms, max - acquire), None);
        let step = |p: u128| {
            let (last_ms, tokens) = unpack_bucket(p);
            let elapsed = now_ms.saturating_sub(last_ms);
            let (at, rest) = if elapsed > self.duration_ms {
                let add = (elapsed as u128 * count as u128 / self.duration_ms as u128).min(i64::MAX as u128) as i64;
                (now_ms, if tokens.saturating_add(add) > max { max - acquire } else { tokens + add - acquire })
            } else {
                (last_ms, tokens - acquire)
            };
            if rest < 0 {
                Step::Keep(Some((last_ms, tokens)))
            } else {
                Step::Store(pack_bucket(at, rest), None)
            }
        };
        match self.counters.update(key, first, step, |_| false).0 {
            None => ValueDecision::Pass,
            Some((last_ms, tokens)) => self.bucket_block(now_ms, count, acquire, last_ms, tokens),
        }
    }

    /// Gives back the `acquire` tokens a call took from `key`'s bucket, when a later check refused the call
    /// (capped at the bucket's size; a value no longer tracked has nothing to give back to). Only the token
    /// bucket gives back: a rate limiter's spacing and a thread permit are not tokens.
    #[cold]
    pub(crate) fn give_back_tokens(&self, key: &ValueKey, acquire: u32) {
        if !matches!(self.mode, Mode::Bucket) {
            return;
        }
        let count = self.threshold_for(key);
        if count <= 0 {
            return;
        }
        let max = bucket_max(count, self.burst);
        self.counters.update_tracked(key, |p| {
            let (last_ms, tokens) = unpack_bucket(p);
            Step::Store(pack_bucket(last_ms, tokens.saturating_add(acquire as i64).min(max)), ())
        });
    }

    /// A value's bucket holds `tokens` at `last_ms` (its last refill), fewer than `acquire`: the retry time is
    /// the first refill (strictly more than `duration` after `last_ms`) that adds the tokens missing.
    #[cold]
    fn bucket_block(&self, now_ms: u64, count: i64, acquire: i64, last_ms: u64, tokens: i64) -> ValueDecision {
        let missing = acquire.saturating_sub(tokens.max(0)).max(1) as u128;
        // add = elapsed * count / duration >= missing  <=>  elapsed >= ceil(missing * duration / count)
        let for_tokens = (missing * self.duration_ms as u128).div_ceil(count as u128);
        let elapsed = for_tokens.max(self.duration_ms as u128 + 1).min(u64::MAX as u128) as u64;
        let at = last_ms.saturating_add(elapsed);
        ValueDecision::Block(Some(std::time::Duration::from_millis(at.saturating_sub(now_ms).max(1))))
    }

    /// What the token bucket of `key` holds at `now_ms`, read without spending from it (nor creating a
    /// counter): `None` for the rate limiter and the thread grade. Exact at that instant.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))] // Read by the web layer's RateLimit headers.
    pub(crate) fn peek_bucket(&self, key: &ValueKey, now_ms: u64) -> Option<BucketPeek> {
        if !matches!(self.mode, Mode::Bucket) {
            return None;
        }
        let count = self.threshold_for(key).max(0);
        let max = bucket_max(count, self.burst);
        let full = BucketPeek { quota: max as u64, remaining: max as u64, refill_in_ms: self.duration_ms + 1 };
        let Some(payload) = self.counters.peek(key) else { return Some(full) };
        let (last_ms, tokens) = unpack_bucket(payload);
        let tokens = tokens.max(0);
        let elapsed = now_ms.saturating_sub(last_ms);
        if elapsed > self.duration_ms {
            // The next call refills first (as `bucket` does).
            let add = (elapsed as u128 * count as u128 / self.duration_ms as u128).min(i64::MAX as u128) as i64;
            return Some(BucketPeek { remaining: tokens.saturating_add(add).min(max) as u64, ..full });
        }
        let refill_in_ms = (last_ms + self.duration_ms + 1).saturating_sub(now_ms);
        Some(BucketPeek { quota: max as u64, remaining: tokens.min(max) as u64, refill_in_ms })
    }

    /// The rule's window in seconds (`duration_in_sec`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))] // Read by the web layer's RateLimit headers.
    pub(crate) fn window_secs(&self) -> u64 {
        self.duration_sec
    }

    /// Java's `ParamFlowChecker.passThrottleLocalCheck`: one call per `1000 * duration / count` ms per value,
    /// waiting strictly less than the queueing time. Kept in nanoseconds (Java rounds the cost to ms).
    fn throttle(&self, key: &ValueKey, count: i64, acquire: u32, now_nanos: u64, max_queue: u64) -> ValueDecision {
        if count <= 0 {
            return ValueDecision::Block(None);
        }
        let cost = (1e9 * acquire as f64 * self.duration_sec as f64 / count as f64).round() as u64;
        // A pass answers its wait, the pass time before it and its own (a value seen first had none: 0).
        let first = || (now_nanos as u128, Ok((0, 0, now_nanos)));
        let step = |p: u128| {
            let expected = (p as u64).saturating_add(cost);
            if expected <= now_nanos {
                Step::Store(now_nanos as u128, Ok((0, p as u64, now_nanos)))
            } else if expected - now_nanos < max_queue {
                Step::Store(expected as u128, Ok((expected - now_nanos, p as u64, expected)))
            } else {
                // Retried once the wait is strictly below the queueing time, the call queues.
                let beyond = (expected - now_nanos - max_queue).saturating_add(1);
                Step::Keep(Err(std::time::Duration::from_nanos(beyond)))
            }
        };
        match self.counters.update(key, first, step, |_| false) {
            (Ok((wait, before, taken)), at) => ValueDecision::Spaced(wait, ThrottleSlot { at, before, taken }),
            (Err(retry_after), _) => ValueDecision::Block(Some(retry_after)),
        }
    }

    /// Thread grade: take one in-flight permit if the value has fewer than its threshold.
    fn thread(&self, key: &ValueKey, threshold: i64) -> ValueDecision {
        if threshold <= 0 {
            return ValueDecision::Block(None);
        }
        let limit = threshold as u128;
        // A value seen first takes the first permit; a cell with calls in flight is kept while it can be.
        let step = |n: u128| if n < limit { Step::Store(n + 1, true) } else { Step::Keep(false) };
        match self.counters.update(key, || (1, true), step, |n| n > 0) {
            (true, at) => ValueDecision::Permit(ValuePermit(at)),
            (false, at) => ValueDecision::Full(ValuePermit(at)),
        }
    }

    /// The counter of a value, if tracked (tests).
    #[cfg(test)]
    pub(crate) fn peek(&self, key: &ValueKey) -> Option<u128> {
        self.counters.peek(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowGrade;
    use crate::param_flow::ParamValue;

    #[test]
    fn capacity_formula_matches_java() {
        assert_eq!(counter_capacity(1), 4000);
        assert_eq!(counter_capacity(10), 40_000);
        assert_eq!(counter_capacity(50), 200_000);
        assert_eq!(counter_capacity(51), 200_000);
        assert_eq!(counter_capacity(u64::MAX), 200_000);
        let s = ParamRuleState::new(ParamFlowRule::new("r", 0).count(1.0).duration_in_sec(60));
        assert!(s.capacity() <= 200_000 && s.capacity() >= 199_000, "{}", s.capacity());
        let s = ParamRuleState::new(ParamFlowRule::new("r", 0).count(1.0));
        assert!(s.capacity() <= 4000 && s.capacity() >= 3584, "{}", s.capacity());
    }

    #[test]
    fn bucket_keeps_time_and_tokens_together() {
        let s = ParamRuleState::new(ParamFlowRule::new("r", 0).count(3.0).burst_count(1));
        let k = ParamValue::Int(1).key();
        assert!(matches!(
            s.decide_value(&k, 1, 5_000 * NANOS_PER_MILLI, || 5_000 * NANOS_PER_MILLI),
            ValueDecision::Pass
        ));
        assert_eq!(unpack_bucket(s.peek(&k).unwrap()), (5_000, 3), "first sight: max (3 + 1) - 1 left");
    }

    #[test]
    fn a_blocked_values_quota_is_the_one_its_bucket_is_read_with() {
        use crate::param_flow::ParamItemValue;
        let huge = 1e300;
        for (count, burst) in [(1.0, 0), (1.0, 2), (0.0, 0), (-3.0, 5), (2.9, 0), (huge, 0), (1.0, u64::MAX)] {
            let rule = ParamFlowRule::new("r", 0)
                .count(count)
                .burst_count(burst)
                .item(ParamItemValue::Str("vip".into()), 3.0)
                .item(ParamItemValue::Int(7), huge)
                .item(ParamItemValue::Str("none".into()), -1.0);
            let s = ParamRuleState::new(rule.clone());
            for v in [ParamValue::Str("vip"), ParamValue::Int(7), ParamValue::Str("none"), ParamValue::Int(1)] {
                let k = v.key();
                let read = s.peek_bucket(&k, 0).unwrap().quota;
                assert_eq!(bucket_quota(&rule, s.count_for(&k)), read, "{count} + {burst}, value {v}");
                assert!(read <= BUCKET_MAX_TOKENS as u64);
            }
            assert_eq!(s.count_for(&ParamValue::Str("vip").key()), 3.0);
            assert_eq!(s.count_for(&ParamValue::Int(1).key()), count);
        }
    }

    #[test]
    fn the_largest_cap_holds_whatever_the_cardinality() {
        // duration 60: min(4000 * 60, 200000) = 200000 values at most.
        let s = ParamRuleState::new(ParamFlowRule::new("r", 0).count(1.0).duration_in_sec(60));
        let cap = s.capacity();
        for v in 0..300_000i64 {
            assert!(matches!(s.decide_value(&ParamValue::Int(v).key(), 1, 0, || 0), ValueDecision::Pass));
        }
        assert!(s.tracked() <= cap && cap <= 200_000, "{} of {cap}", s.tracked());
        assert!(s.tracked() > cap / 2);
    }

    #[test]
    fn an_explicit_small_cap_bounds_strings_too() {
        let s = ParamRuleState::with_capacity(ParamFlowRule::new("r", 0).count(1.0), Some(1024));
        for v in 0..100_000u32 {
            let text = format!("user-{v}");
            let _ = s.decide_value(&ParamValue::Str(&text).key(), 1, 0, || 0);
            assert!(s.tracked() <= 1024);
        }
    }

    /// Runs `rounds` rounds of `threads` threads released together by a barrier, each calling `call(round)`
    /// once per round; returns how many calls passed in each round.
    fn race(threads: usize, rounds: usize, call: impl Fn(usize) -> bool + Send + Sync + 'static) -> Vec<usize> {
        let call = Arc::new(call);
        let barrier = Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (call, barrier) = (call.clone(), barrier.clone());
                std::thread::spawn(move || {
                    (0..rounds)
                        .map(|r| {
                            barrier.wait();
                            call(r)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<Vec<bool>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (0..rounds).map(|r| results.iter().filter(|t| t[r]).count()).collect()
    }

    #[test]
    fn callers_racing_on_a_value_never_seen_share_one_counter() {
        // Limit 1 per value; each round a new value that every thread misses at once: one inserts it, the
        // others must find that counter (a second cell for the value would admit a second call).
        let s = Arc::new(ParamRuleState::new(ParamFlowRule::new("r", 0).count(1.0)));
        let passes = race(4, 2_000, move |r| {
            matches!(s.decide_value(&ParamValue::Int(r as i64).key(), 1, 0, || 0), ValueDecision::Pass)
        });
        assert!(passes.iter().all(|&p| p == 1), "passes per round: {passes:?}");
    }

    #[test]
    fn callers_racing_on_a_value_at_its_limit_spend_its_last_token_once() {
        // Limit 2: one call takes a token first, then every thread races for the last one.
        let s = Arc::new(ParamRuleState::new(ParamFlowRule::new("r", 0).count(2.0)));
        for r in 0..2_000i64 {
            assert!(matches!(s.decide_value(&ParamValue::Int(r).key(), 1, 0, || 0), ValueDecision::Pass));
        }
        let passes = race(4, 2_000, move |r| {
            matches!(s.decide_value(&ParamValue::Int(r as i64).key(), 1, 0, || 0), ValueDecision::Pass)
        });
        assert!(passes.iter().all(|&p| p == 1), "passes per round: {passes:?}");
    }

    #[test]
    fn thread_grade_permits_never_exceed_the_limit_under_threads() {
        let s = Arc::new(ParamRuleState::new(ParamFlowRule::new("r", 0).grade(FlowGrade::Thread).count(2.0)));
        let inflight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (st, inf, mx) = (s.clone(), inflight.clone(), most.clone());
        race(4, 5_000, move |_| match st.decide_value(&ParamValue::Str("hot").key(), 1, 0, || 0) {
            ValueDecision::Permit(p) => {
                let now = inf.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                mx.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                inf.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                assert!(st.release(p));
                true
            }
            _ => false,
        });
        assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= 2);
        assert_eq!(s.peek(&ParamValue::Str("hot").key()), Some(0), "every permit given back");
    }

    #[test]
    fn a_value_in_use_keeps_its_counter_through_a_flood_of_values_seen_once() {
        // The eviction attack: spend a value's tokens, then flood the table with 10 times its capacity of
        // new values; the spent value must stay blocked (a reset counter would admit it again).
        let s = ParamRuleState::new(ParamFlowRule::new("r", 0).count(5.0));
        let hot = ParamValue::Str("hot").key();
        for _ in 0..5 {
            assert!(matches!(s.decide_value(&hot, 1, 0, || 0), ValueDecision::Pass));
        }
        assert!(matches!(s.decide_value(&hot, 1, 0, || 0), ValueDecision::Block(_)));
        for v in 0..(10 * s.capacity()) as i64 {
            let _ = s.decide_value(&ParamValue::Int(v).key(), 1, 0, || 0);
        }
        assert!(s.tracked() <= s.capacity());
        assert!(matches!(s.decide_value(&hot, 1, 0, || 0), ValueDecision::Block(_)), "the flood reset the counter");
    }

    #[test]
    fn values_up_to_most_of_the_capacity_are_all_kept() {
        // Two choices of eight cells: at 80 % of the capacity no value has been pushed out.
        let s = ParamRuleState::new(ParamFlowRule::new("r", 0).count(1.0));
        let n = s.capacity() * 8 / 10;
        for v in 0..n as i64 {
            assert!(matches!(s.decide_value(&ParamValue::Int(v).key(), 1, 0, || 0), ValueDecision::Pass));
        }
        assert_eq!(s.tracked(), n);
        let kept = (0..n as i64).filter(|&v| s.peek(&ParamValue::Int(v).key()).is_some()).count();
        assert_eq!(kept, n);
    }

    #[test]
    fn a_permit_on_a_value_pushed_out_gives_back_nothing_to_its_successor() {
        // One set: 8 cells. A permit on a value, then 8 new values with calls in flight except one pushed out.
        let s = ParamRuleState::with_capacity(ParamFlowRule::new("r", 0).grade(FlowGrade::Thread).count(5.0), Some(8));
        let first = match s.decide_value(&ParamValue::Int(-1).key(), 1, 0, || 0) {
            ValueDecision::Permit(p) => p,
            other => panic!("{other:?}"),
        };
        let mut held = Vec::new();
        for v in 0..16i64 {
            if let ValueDecision::Permit(p) = s.decide_value(&ParamValue::Int(v).key(), 1, 0, || 0) {
                held.push(p);
            }
        }
        let counts: Vec<u128> = (0..16i64).filter_map(|v| s.peek(&ParamValue::Int(v).key())).collect();
        assert!(s.release(first));
        let after: Vec<u128> = (0..16i64).filter_map(|v| s.peek(&ParamValue::Int(v).key())).collect();
        assert_eq!(counts, after, "a stale permit changed another value's count");
    }
}
