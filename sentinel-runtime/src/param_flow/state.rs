//! Per-rule state: the bounded map of per-value counters, and the three per-value algorithms.

use std::sync::Arc;

use portable_atomic::{AtomicU128, Ordering};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, OptionsBuilder, UnitWeighter};

use super::rule::ParamFlowRule;
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

/// One value's counter: 128 bits updated by compare-and-swap, so every decision on a value is exact.
///
/// - token bucket: high 64 bits the time of the last refill (ms), low 64 bits the tokens left (`i64`);
/// - rate limiter: the time (ns) the last admitted call was scheduled at;
/// - thread grade: the calls in flight.
#[derive(Debug)]
pub(crate) struct ValueCell {
    state: AtomicU128,
}

impl ValueCell {
    fn new(hi: u64, lo: u64) -> Self {
        ValueCell { state: AtomicU128::new(pack(hi, lo)) }
    }
    /// Releases one in-flight call (thread grade).
    pub(crate) fn release_thread(&self) {
        let _ = self.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| Some(s.saturating_sub(1)));
    }
    /// The raw counter (tests).
    #[cfg(test)]
    pub(crate) fn raw(&self) -> (u64, u64) {
        unpack(self.state.load(Ordering::Acquire))
    }
}

#[inline]
fn pack(hi: u64, lo: u64) -> u128 {
    ((hi as u128) << 64) | lo as u128
}
#[inline]
fn unpack(s: u128) -> (u64, u64) {
    ((s >> 64) as u64, s as u64)
}

type Counters = Cache<ValueKey, Arc<ValueCell>, UnitWeighter, DefaultHashBuilder>;

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

/// The outcome for one value.
#[derive(Clone, Debug)]
pub(crate) enum ValueDecision {
    Pass,
    /// Pass after waiting this long (rate limiter).
    Wait(u64),
    /// Pass holding one in-flight permit on this cell, released at exit.
    Permit(Arc<ValueCell>),
    /// Block; a retry could pass after this long (when known).
    Block(Option<std::time::Duration>),
}

/// A loaded rule with its counters.
pub(crate) struct ParamRuleState {
    pub(crate) rule: Arc<ParamFlowRule>,
    mode: Mode,
    /// `(long) count`, as Java reads it.
    threshold: i64,
    burst: i64,
    duration_ms: u64,
    duration_sec: u64,
    /// Exception items, sorted by key: `(key, threshold)`.
    items: Box<[(ValueKey, i64)]>,
    counters: Counters,
    capacity: usize,
}

impl std::fmt::Debug for ParamRuleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamRuleState").field("rule", &self.rule).field("tracked", &self.counters.len()).finish()
    }
}

fn new_counters(capacity: usize) -> (Counters, usize) {
    let parallel = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // Shards of at least 512 values; a power of two, so each holds exactly `per_shard`.
    let mut shards = (parallel * 4).next_power_of_two().min(64);
    while shards > 1 && capacity / shards < 512 {
        shards /= 2;
    }
    let per_shard = capacity / shards;
    let total = per_shard * shards; // never above `capacity`
    let built =
        OptionsBuilder::new().shards(shards).estimated_items_capacity(total).weight_capacity(total as u64).build();
    let cache = match built {
        Ok(opts) => Cache::with_options(opts, UnitWeighter, DefaultHashBuilder::default(), Default::default()),
        // Unreachable with the options above; the plain constructor is still bounded.
        Err(_) => Cache::with(total, total as u64, UnitWeighter, DefaultHashBuilder::default(), Default::default()),
    };
    (cache, total)
}

impl ParamRuleState {
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
        let mut items: Vec<(ValueKey, i64)> = Vec::with_capacity(rule.items.len());
        for it in &rule.items {
            let key = ValueKey::of_item(&it.value);
            // A later item for the same value replaces an earlier one (Java parses items into a map).
            items.retain(|(k, _)| *k != key);
            items.push((key, it.count as i64));
        }
        items.sort_by_key(|(k, _)| *k);
        let (counters, capacity) = new_counters(cap.unwrap_or_else(|| counter_capacity(rule.duration_in_sec)));
        let duration_sec = rule.duration_in_sec.max(1);
        ParamRuleState {
            mode,
            threshold: rule.count as i64,
            burst: rule.burst_count.min(i64::MAX as u64) as i64,
            duration_ms: duration_sec.saturating_mul(1000),
            duration_sec,
            items: items.into_boxed_slice(),
            counters,
            capacity,
            rule: Arc::new(rule),
        }
    }

    /// Whether a call that passed holds something of this rule until it exits (a thread-grade permit).
    pub(crate) fn holds_permits(&self) -> bool {
        self.mode == Mode::Thread
    }

    /// The values tracked now (never above [`capacity`](Self::capacity)).
    pub(crate) fn tracked(&self) -> usize {
        self.counters.len()
    }
    /// The most values this rule tracks.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    #[inline]
    fn threshold_for(&self, key: &ValueKey) -> i64 {
        if self.items.is_empty() {
            return self.threshold;
        }
        match self.items.binary_search_by(|(k, _)| k.cmp(key)) {
            Ok(i) => self.items[i].1,
            Err(_) => self.threshold,
        }
    }

    /// The cell of `key`, created with `init` on first sight; `true` when this call created it.
    #[inline]
    fn cell(&self, key: &ValueKey, init: impl FnOnce() -> ValueCell) -> (Arc<ValueCell>, bool) {
        let mut created = false;
        let cell = self.counters.get_or_insert_with(key, || -> Result<_, std::convert::Infallible> {
            created = true;
            Ok(Arc::new(init()))
        });
        match cell {
            Ok(c) => (c, created),
            Err(never) => match never {},
        }
    }

    /// Decides one value.
    #[inline]
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
    fn bucket(&self, key: &ValueKey, count: i64, acquire: i64, now_ms: u64) -> ValueDecision {
        if count <= 0 {
            return ValueDecision::Block(None);
        }
        let max = count.saturating_add(self.burst);
        if acquire > max {
            return ValueDecision::Block(None);
        }
        let (cell, created) = self.cell(key, || ValueCell::new(now_ms, (max - acquire) as u64));
        if created {
            return ValueDecision::Pass;
        }
        let mut cur = cell.state.load(Ordering::Acquire);
        loop {
            let (last_ms, tokens) = unpack(cur);
            let tokens = tokens as i64;
            let elapsed = now_ms.saturating_sub(last_ms);
            let next = if elapsed > self.duration_ms {
                let add = (elapsed as u128 * count as u128 / self.duration_ms as u128).min(i64::MAX as u128) as i64;
                let rest = if tokens.saturating_add(add) > max { max - acquire } else { tokens + add - acquire };
                if rest < 0 {
                    return self.bucket_block(now_ms, count, acquire, last_ms, tokens);
                }
                pack(now_ms, rest as u64)
            } else {
                let rest = tokens - acquire;
                if rest < 0 {
                    return self.bucket_block(now_ms, count, acquire, last_ms, tokens);
                }
                pack(last_ms, rest as u64)
            };
            match cell.state.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return ValueDecision::Pass,
                Err(v) => cur = v,
            }
        }
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
        let max = count.saturating_add(self.burst).max(0);
        let full = BucketPeek { quota: max as u64, remaining: max as u64, refill_in_ms: self.duration_ms + 1 };
        let Some(cell) = self.counters.peek(key) else { return Some(full) };
        let (last_ms, tokens) = unpack(cell.state.load(Ordering::Acquire));
        let tokens = (tokens as i64).max(0);
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
        let (cell, created) = self.cell(key, || ValueCell::new(0, now_nanos));
        if created {
            return ValueDecision::Pass;
        }
        let cost = (1e9 * acquire as f64 * self.duration_sec as f64 / count as f64).round() as u64;
        let mut cur = cell.state.load(Ordering::Acquire);
        loop {
            let (_, last) = unpack(cur);
            let expected = last.saturating_add(cost);
            let (next, wait) = if expected <= now_nanos {
                (now_nanos, 0)
            } else if expected - now_nanos < max_queue {
                (expected, expected - now_nanos)
            } else {
                // Retried once the wait is strictly below the queueing time, the call queues.
                let beyond = (expected - now_nanos - max_queue).saturating_add(1);
                return ValueDecision::Block(Some(std::time::Duration::from_nanos(beyond)));
            };
            match cell.state.compare_exchange_weak(cur, pack(0, next), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return if wait == 0 { ValueDecision::Pass } else { ValueDecision::Wait(wait) },
                Err(v) => cur = v,
            }
        }
    }

    /// Thread grade: take one in-flight permit if the value has fewer than its threshold.
    fn thread(&self, key: &ValueKey, threshold: i64) -> ValueDecision {
        if threshold <= 0 {
            return ValueDecision::Block(None);
        }
        let (cell, _) = self.cell(key, || ValueCell::new(0, 0));
        let limit = threshold as u128;
        let taken = cell.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1));
        match taken {
            Ok(_) => ValueDecision::Permit(cell),
            // In-flight calls free up when they finish: no retry time is known.
            Err(_) => ValueDecision::Block(None),
        }
    }

    /// The cell of a value, if tracked (tests).
    #[cfg(test)]
    pub(crate) fn peek(&self, key: &ValueKey) -> Option<Arc<ValueCell>> {
        self.counters.peek(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(s.peek(&k).unwrap().raw(), (5_000, 3), "first sight: max (3 + 1) - 1 left");
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
}
