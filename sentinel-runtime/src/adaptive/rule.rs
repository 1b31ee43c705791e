//! Adaptive rule data: what a rule says, its defaults, and its validation.

use std::fmt;

use crate::pattern::ResourcePattern;

/// The partition that takes every origin no other partition names.
pub const DEFAULT_PARTITION: &str = "default";

/// The highest `max_limit` a rule may set: the limiter's counters and its wait queue stay small.
pub const MAX_LIMIT_CAP: u32 = 1_000_000;
/// The longest `max_wait_ms` a rule may set (ten minutes).
pub const MAX_WAIT_MS_CAP: u64 = 600_000;
/// The most callers a rule may let wait at once (`max_waiters`).
pub const MAX_WAITERS_CAP: u32 = 100_000;
/// The most partitions a rule may have.
pub const MAX_PARTITIONS: usize = 64;

/// Which algorithm finds the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum AlgorithmKind {
    /// Netflix's Gradient2: the limit follows the ratio of a long-term RTT average to the current RTT, plus
    /// a queue allowance (the default for inbound resources).
    Gradient2,
    /// TCP Vegas: the limit grows or shrinks by log10(limit) from the queue estimated from each window's
    /// average RTT against the no-load RTT (the lowest window average seen in a window without a drop).
    Vegas,
    /// Additive increase, multiplicative decrease on drops (the default for outbound resources).
    Aimd,
}

impl AlgorithmKind {
    /// The name used in rule files: `gradient2`, `vegas`, `aimd`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmKind::Gradient2 => "gradient2",
            AlgorithmKind::Vegas => "vegas",
            AlgorithmKind::Aimd => "aimd",
        }
    }
    /// The kind named `name` (`gradient2`, `vegas`, `aimd`), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "gradient2" => Some(AlgorithmKind::Gradient2),
            "vegas" => Some(AlgorithmKind::Vegas),
            "aimd" => Some(AlgorithmKind::Aimd),
            _ => None,
        }
    }
    /// The default for a resource: Gradient2 for inbound calls, AIMD for outbound ones.
    pub fn default_for(inbound: bool) -> Self {
        if inbound {
            AlgorithmKind::Gradient2
        } else {
            AlgorithmKind::Aimd
        }
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Gradient2's parameters (Netflix's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, rename_all = "camelCase", deny_unknown_fields))]
pub struct Gradient2Params {
    /// Weight of a new estimate in the smoothed limit, in (0, 1] (0.2).
    pub smoothing: f64,
    /// How far the current RTT may exceed the long-term RTT before the limit falls, >= 1 (1.5).
    pub rtt_tolerance: f64,
    /// Calls allowed to queue on top of the gradient's estimate, added per update (4).
    pub queue_size: u32,
    /// Length of the long-term RTT average, in windows (600).
    pub long_window: u32,
}

impl Default for Gradient2Params {
    fn default() -> Self {
        Gradient2Params { smoothing: 0.2, rtt_tolerance: 1.5, queue_size: 4, long_window: 600 }
    }
}

/// Vegas's parameters (Netflix's defaults). Thresholds scale with `log10(limit)` (at least 1): the queue
/// estimate, `ceil(limit · (1 − no_load / rtt))` with `rtt` the window's average RTT and `no_load` the lowest
/// window average seen (windows with a drop left out), grows the limit fast at or under `log10`, by `log10`
/// under `alpha·log10`, and shrinks it by `log10` over `beta·log10`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, rename_all = "camelCase", deny_unknown_fields))]
pub struct VegasParams {
    /// Weight of a new estimate in the smoothed limit, in (0, 1] (1.0: no smoothing).
    pub smoothing: f64,
    /// Multiple of `log10(limit)` under which the limit grows (3).
    pub alpha: f64,
    /// Multiple of `log10(limit)` over which the limit shrinks (6); above `alpha`.
    pub beta: f64,
    /// The no-load RTT is measured again after about `probe_multiplier · limit` windows (30; 0: never),
    /// jittered by a factor in [0.5, 1).
    pub probe_multiplier: u32,
}

impl Default for VegasParams {
    fn default() -> Self {
        VegasParams { smoothing: 1.0, alpha: 3.0, beta: 6.0, probe_multiplier: 30 }
    }
}

/// AIMD's parameters (Netflix's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, rename_all = "camelCase", deny_unknown_fields))]
pub struct AimdParams {
    /// Factor applied to the limit after a window with a drop, in [0.5, 1) (0.9).
    pub backoff_ratio: f64,
    /// A window whose RTT exceeds this counts as a drop (5,000 ms).
    pub timeout_ms: u64,
}

impl Default for AimdParams {
    fn default() -> Self {
        AimdParams { backoff_ratio: 0.9, timeout_ms: 5_000 }
    }
}

/// How samples are grouped before the limit updates (Netflix's windowed limit, without its loss of sparse
/// windows).
///
/// A window closes once `window_ms` has passed and it holds `min_samples` samples, or once `max_window_ms`
/// has passed and it holds at least one: a window with few samples is extended, never thrown away, so a
/// downstream that answers in 3 s still moves the limit.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, rename_all = "camelCase", deny_unknown_fields))]
pub struct WindowConfig {
    /// The shortest window (1,000 ms).
    pub window_ms: u64,
    /// Samples a window wants before `max_window_ms` (10).
    pub min_samples: u32,
    /// The longest a window waits for `min_samples` (5,000 ms).
    pub max_window_ms: u64,
    /// Samples with an RTT under this many microseconds are ignored (0: none; Netflix uses 100).
    pub ignore_rtt_under_us: u64,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig { window_ms: 1_000, min_samples: 10, max_window_ms: 5_000, ignore_rtt_under_us: 0 }
    }
}

/// Envoy's minimum-RTT probe: now and then the limit is pinned low for a few samples, so the RTT of an
/// unloaded downstream is measured again; the algorithm's baseline (Gradient2's long-term RTT, Vegas's
/// no-load RTT) is reset to the probe window's average RTT. Off unless `interval_ms` is set.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, rename_all = "camelCase", deny_unknown_fields))]
pub struct ProbeConfig {
    /// Time between probes (0: never probe).
    pub interval_ms: u64,
    /// A random delay added to the interval, as a fraction of it, in [0, 1) (0.15, Envoy's): the next probe
    /// starts between `interval_ms` and `interval_ms · (1 + jitter)` after the last one.
    pub jitter: f64,
    /// The limit while probing (3, Envoy's `min_concurrency`; never above `max_limit`).
    pub concurrency: u32,
    /// Samples the probe measures (50, Envoy's).
    pub samples: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig { interval_ms: 0, jitter: 0.15, concurrency: 3, samples: 50 }
    }
}

/// One origin's guaranteed share of the limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// The origin (the caller's name from the context), or [`DEFAULT_PARTITION`] for every other origin.
    pub origin: String,
    /// The share of the limit guaranteed to it under contention, in (0, 1].
    pub share: f64,
}

/// An adaptive concurrency rule: the limit of a resource's calls in flight, found from measured latency.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, rename_all = "camelCase", deny_unknown_fields))]
pub struct AdaptiveRule {
    /// An id of the rule's source (kept as given).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub id: Option<u64>,
    /// The resource: its exact name, or a pattern when `regex` is set (each matching resource gets its own
    /// limiter).
    pub resource: String,
    /// Whether `resource` is a regular expression over whole names.
    pub regex: bool,
    /// The algorithm; `None` picks Gradient2 for inbound resources and AIMD for outbound ones.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub algorithm: Option<AlgorithmKind>,
    /// The lowest limit (Netflix's 20; set it lower for a downstream that holds fewer calls).
    pub min_limit: u32,
    /// The highest limit (200).
    pub max_limit: u32,
    /// The limit before the first window closes (20).
    pub initial_limit: u32,
    /// Gradient2's parameters.
    pub gradient2: Gradient2Params,
    /// Vegas's parameters.
    pub vegas: VegasParams,
    /// AIMD's parameters.
    pub aimd: AimdParams,
    /// How long a call over the limit may wait for a permit (0: it is blocked at once). Waiting calls are
    /// served newest first, on the engine clock's timer, outside the rules' read section; then the call's
    /// checks run again and it takes the place it was granted. A sync entry
    /// ([`EntryBuilder::enter`](crate::EntryBuilder::enter), a sync annotated function) blocks its thread; an
    /// async one ([`EntryBuilder::enter_async`](crate::EntryBuilder::enter_async), an annotated `async fn`,
    /// the web layer, the outbound guards) awaits and never blocks an executor's worker. Calls that must not
    /// wait ([`EntryBuilder::decide`](crate::EntryBuilder::decide), and async calls with hot-parameter
    /// arguments, which are not kept to decide again) are refused at once.
    pub max_wait_ms: u64,
    /// The most calls that may wait at once; when full, the oldest waiter is refused (the default, 0, means
    /// `max_limit`: as many waiting as could ever run, at most [`MAX_WAITERS_CAP`]).
    pub max_waiters: u32,
    /// Guaranteed shares by origin, each origin named once (empty: one pool for every caller).
    #[cfg_attr(feature = "serde", serde(with = "partitions", skip_serializing_if = "Vec::is_empty"))]
    pub partitions: Vec<Partition>,
    /// How samples are grouped into windows.
    pub window: WindowConfig,
    /// Envoy's minimum-RTT probe (off by default).
    pub probe: ProbeConfig,
}

impl Default for AdaptiveRule {
    fn default() -> Self {
        AdaptiveRule {
            id: None,
            resource: String::new(),
            regex: false,
            algorithm: None,
            min_limit: 20,
            max_limit: 200,
            initial_limit: 20,
            gradient2: Gradient2Params::default(),
            vegas: VegasParams::default(),
            aimd: AimdParams::default(),
            max_wait_ms: 0,
            max_waiters: 0,
            partitions: Vec::new(),
            window: WindowConfig::default(),
            probe: ProbeConfig::default(),
        }
    }
}

impl AdaptiveRule {
    /// A rule for `resource` with Netflix's defaults and the algorithm chosen by the resource's direction.
    pub fn new(resource: impl Into<String>) -> Self {
        AdaptiveRule { resource: resource.into(), ..Default::default() }
    }
    /// Sets the algorithm.
    pub fn algorithm(mut self, kind: AlgorithmKind) -> Self {
        self.algorithm = Some(kind);
        self
    }
    /// Sets the bounds and the initial limit.
    pub fn limits(mut self, min: u32, initial: u32, max: u32) -> Self {
        (self.min_limit, self.initial_limit, self.max_limit) = (min, initial, max);
        self
    }
    /// Sets the longest wait for a permit.
    pub fn max_wait_ms(mut self, ms: u64) -> Self {
        self.max_wait_ms = ms;
        self
    }
    /// Adds a partition: `origin` is guaranteed `share` of the limit under contention.
    pub fn partition(mut self, origin: impl Into<String>, share: f64) -> Self {
        self.partitions.push(Partition { origin: origin.into(), share });
        self
    }
    /// Reads `resource` as a regular expression over whole names.
    pub fn regex(mut self, regex: bool) -> Self {
        self.regex = regex;
        self
    }
    /// The algorithm in force for a resource of the given direction.
    pub fn algorithm_for(&self, inbound: bool) -> AlgorithmKind {
        self.algorithm.unwrap_or(AlgorithmKind::default_for(inbound))
    }
    /// The bound of the wait queue.
    pub fn waiters_bound(&self) -> u32 {
        if self.max_waiters == 0 {
            self.max_limit.min(MAX_WAITERS_CAP)
        } else {
            self.max_waiters
        }
    }

    /// Checks the rule (rule `index` of its set); the first invalid field is reported.
    pub fn validate(&self, index: usize) -> Result<(), AdaptiveRuleError> {
        let bad = |field: &'static str, reason: String| {
            Err(AdaptiveRuleError::Invalid { index, resource: self.resource.clone(), field, reason })
        };
        if self.resource.trim().is_empty() {
            return bad("resource", "must not be blank".into());
        }
        if self.regex
            && let Err(reason) = ResourcePattern::compile(&self.resource)
        {
            return bad("resource", reason);
        }
        if self.min_limit == 0 {
            return bad("min_limit", "must be at least 1".into());
        }
        if self.max_limit > MAX_LIMIT_CAP {
            return bad("max_limit", format!("must be at most {MAX_LIMIT_CAP}"));
        }
        if self.min_limit > self.max_limit {
            return bad("min_limit", format!("({}) is above max_limit ({})", self.min_limit, self.max_limit));
        }
        if self.initial_limit < self.min_limit || self.initial_limit > self.max_limit {
            return bad(
                "initial_limit",
                format!(
                    "({}) must lie in [min_limit, max_limit] = [{}, {}]",
                    self.initial_limit, self.min_limit, self.max_limit
                ),
            );
        }
        let g = &self.gradient2;
        if !unit_interval(g.smoothing) {
            return bad("gradient2.smoothing", format!("({}) must be a number in (0, 1]", g.smoothing));
        }
        if !(g.rtt_tolerance.is_finite() && g.rtt_tolerance >= 1.0) {
            return bad("gradient2.rtt_tolerance", format!("({}) must be a finite number >= 1", g.rtt_tolerance));
        }
        if g.queue_size > MAX_LIMIT_CAP {
            return bad("gradient2.queue_size", format!("({}) must be at most {MAX_LIMIT_CAP}", g.queue_size));
        }
        if g.long_window == 0 {
            return bad("gradient2.long_window", "must be at least 1 window".into());
        }
        let v = &self.vegas;
        if !unit_interval(v.smoothing) {
            return bad("vegas.smoothing", format!("({}) must be a number in (0, 1]", v.smoothing));
        }
        if !(v.alpha.is_finite() && v.alpha > 0.0) {
            return bad("vegas.alpha", format!("({}) must be a finite number > 0", v.alpha));
        }
        if !(v.beta.is_finite() && v.beta > v.alpha) {
            return bad("vegas.beta", format!("({}) must be a finite number above alpha ({})", v.beta, v.alpha));
        }
        let a = &self.aimd;
        if !(a.backoff_ratio >= 0.5 && a.backoff_ratio < 1.0) {
            return bad("aimd.backoff_ratio", format!("({}) must be a number in [0.5, 1)", a.backoff_ratio));
        }
        if a.timeout_ms == 0 {
            return bad("aimd.timeout_ms", "must be at least 1 ms".into());
        }
        if self.max_wait_ms > MAX_WAIT_MS_CAP {
            return bad("max_wait_ms", format!("must be at most {MAX_WAIT_MS_CAP} ms"));
        }
        if self.max_waiters > MAX_WAITERS_CAP {
            return bad("max_waiters", format!("must be at most {MAX_WAITERS_CAP}"));
        }
        let w = &self.window;
        if w.window_ms == 0 || w.window_ms > 60_000 {
            return bad("window.window_ms", "must be between 1 and 60,000 ms".into());
        }
        if w.min_samples == 0 {
            return bad("window.min_samples", "must be at least 1".into());
        }
        if w.max_window_ms < w.window_ms || w.max_window_ms > 600_000 {
            return bad("window.max_window_ms", "must be between window_ms and 600,000 ms".into());
        }
        let p = &self.probe;
        if !(p.jitter >= 0.0 && p.jitter < 1.0) {
            return bad("probe.jitter", format!("({}) must be a number in [0, 1)", p.jitter));
        }
        if p.interval_ms > 0 && p.concurrency == 0 {
            return bad("probe.concurrency", "must be at least 1".into());
        }
        if p.interval_ms > 0 && p.samples == 0 {
            return bad("probe.samples", "must be at least 1".into());
        }
        self.validate_partitions(index)
    }

    fn validate_partitions(&self, index: usize) -> Result<(), AdaptiveRuleError> {
        let bad = |reason: String| {
            Err(AdaptiveRuleError::Invalid { index, resource: self.resource.clone(), field: "partitions", reason })
        };
        if self.partitions.len() > MAX_PARTITIONS {
            return bad(format!("has {} entries; at most {MAX_PARTITIONS} are allowed", self.partitions.len()));
        }
        let mut sum = 0.0;
        for (i, p) in self.partitions.iter().enumerate() {
            if p.origin.trim().is_empty() {
                return bad(format!("entry {i} has a blank origin"));
            }
            if self.partitions[..i].iter().any(|q| q.origin == p.origin) {
                return bad(format!("names origin `{}` twice", p.origin));
            }
            if !unit_interval(p.share) {
                return bad(format!("share of `{}` ({}) must be a number in (0, 1]", p.origin, p.share));
            }
            sum += p.share;
        }
        // A little slack for shares written in decimal (0.7 + 0.2 + 0.1 is 1.0000000000000002).
        if sum > 1.0 + 1e-9 {
            return bad(format!("shares sum to {sum}, over 1"));
        }
        Ok(())
    }
}

/// Whether `x` is a number in (0, 1] (NaN is not).
fn unit_interval(x: f64) -> bool {
    x > 0.0 && x <= 1.0
}

/// An adaptive rule (or a set of them) was refused; the rules in force stay.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AdaptiveRuleError {
    /// A field of one rule is invalid.
    #[error(
        "invalid adaptive rule #{index} (resource `{resource}`): `{field}` {reason}; no rule of the set was loaded"
    )]
    Invalid {
        /// The rule's position in its set (0-based).
        index: usize,
        /// The rule's resource.
        resource: String,
        /// The field, as the rule type names it (`min_limit`, `gradient2.smoothing`, `partitions`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A rule document could not be read.
    #[error("adaptive rules could not be parsed: {0}")]
    Parse(String),
}

impl AdaptiveRuleError {
    /// The field an invalid rule was refused for.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            AdaptiveRuleError::Invalid { field, .. } => Some(field),
            AdaptiveRuleError::Parse(_) => None,
        }
    }
}

/// Checks a whole set; the first invalid rule is reported and nothing of the set should be loaded.
#[cfg_attr(not(feature = "serde"), allow(dead_code))] // The rule files' reader is its caller.
pub fn validate_all(rules: &[AdaptiveRule]) -> Result<(), AdaptiveRuleError> {
    rules.iter().enumerate().try_for_each(|(i, r)| r.validate(i))
}

/// `partitions` as an object from origin to share. An origin named twice in the object is refused, as the
/// same rule built in code is (a JSON object may repeat a key; a map would keep only the last share).
#[cfg(feature = "serde")]
mod partitions {
    use std::fmt;

    use serde::de::{Deserializer, Error, MapAccess, Visitor};
    use serde::ser::{SerializeMap, Serializer};

    use super::{Partition, MAX_PARTITIONS};

    pub(crate) fn serialize<S: Serializer>(parts: &[Partition], s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(parts.len()))?;
        for p in parts {
            map.serialize_entry(&p.origin, &p.share)?;
        }
        map.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Partition>, D::Error> {
        d.deserialize_map(PartitionsVisitor)
    }

    /// Reads the object entry by entry (never more than [`MAX_PARTITIONS`] of them), refusing a repeated
    /// origin; the partitions come out ordered by origin, whatever the order of the document.
    struct PartitionsVisitor;

    impl<'de> Visitor<'de> for PartitionsVisitor {
        type Value = Vec<Partition>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object from origin to share, each origin named once")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut parts: Vec<Partition> = Vec::new();
            while let Some((origin, share)) = map.next_entry::<String, f64>()? {
                if parts.iter().any(|p| p.origin == origin) {
                    return Err(A::Error::custom(format!("names origin `{origin}` twice; give each origin one share")));
                }
                if parts.len() == MAX_PARTITIONS {
                    return Err(A::Error::custom(format!("has more than {MAX_PARTITIONS} partitions")));
                }
                parts.push(Partition { origin, share });
            }
            parts.sort_by(|a, b| a.origin.cmp(&b.origin));
            Ok(parts)
        }
    }
}
