//! Degrade (circuit breaker) rule data.

/// What trips a breaker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DegradeGrade {
    /// The share of calls slower than `count` ms exceeds `slow_ratio_threshold`.
    #[default]
    SlowRequestRatio,
    /// The share of calls with a traced error exceeds `count` (a ratio in [0, 1]).
    ErrorRatio,
    /// The number of calls with a traced error in the interval exceeds `count`.
    ErrorCount,
}

/// A circuit breaker rule.
///
/// ```
/// use sentinel_runtime::circuit_breaker::{DegradeRule, DegradeGrade};
/// let rule = DegradeRule::new("queryOrder", DegradeGrade::SlowRequestRatio).count(50.0).time_window_sec(5);
/// assert_eq!(rule.min_request_amount, 5);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DegradeRule {
    /// An id of the rule's source.
    pub id: Option<u64>,
    /// The resource (or `"*"` for the default rule of resources without their own), or a pattern when
    /// `regex` is set.
    pub resource: String,
    /// Whether `resource` is a regular expression (Java's `regex`): every resource whose whole name matches
    /// it gets its own breaker from the rule.
    pub regex: bool,
    /// Kept for compatibility with Sentinel's rule format (`"default"`).
    pub limit_app: String,
    /// What trips the breaker.
    pub grade: DegradeGrade,
    /// Max response time in ms (slow ratio), error ratio, or error count.
    pub count: f64,
    /// How long the breaker stays open, in seconds.
    pub time_window_sec: u32,
    /// Fewest calls in an interval before the breaker may trip.
    pub min_request_amount: u32,
    /// Length of the statistics interval.
    pub stat_interval_ms: u32,
    /// Slow-call share that trips a slow-ratio breaker.
    pub slow_ratio_threshold: f64,
}

impl Default for DegradeRule {
    fn default() -> Self {
        DegradeRule {
            id: None,
            resource: String::new(),
            regex: false,
            limit_app: crate::LIMIT_APP_DEFAULT.to_string(),
            grade: DegradeGrade::SlowRequestRatio,
            count: 0.0,
            time_window_sec: 0,
            min_request_amount: 5,
            stat_interval_ms: 1000,
            slow_ratio_threshold: 1.0,
        }
    }
}

impl DegradeRule {
    /// A rule for `resource` of the given grade; set the rest with the builder methods.
    pub fn new(resource: impl Into<String>, grade: DegradeGrade) -> Self {
        DegradeRule { resource: resource.into(), grade, ..Default::default() }
    }
    /// Sets `count`.
    pub fn count(mut self, c: f64) -> Self {
        self.count = c;
        self
    }
    /// Sets the open duration.
    pub fn time_window_sec(mut self, s: u32) -> Self {
        self.time_window_sec = s;
        self
    }
    /// Sets the minimum request amount.
    pub fn min_request_amount(mut self, n: u32) -> Self {
        self.min_request_amount = n;
        self
    }
    /// Sets the statistics interval.
    pub fn stat_interval_ms(mut self, ms: u32) -> Self {
        self.stat_interval_ms = ms;
        self
    }
    /// Sets the slow ratio threshold.
    pub fn slow_ratio_threshold(mut self, r: f64) -> Self {
        self.slow_ratio_threshold = r;
        self
    }
    /// Reads `resource` as a regular expression over whole resource names (see [`crate::pattern`]).
    pub fn regex(mut self, regex: bool) -> Self {
        self.regex = regex;
        self
    }
    /// Sets the rule id.
    pub fn id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }

    /// Whether `self` equals `other` but for the id (Java's rule equality: a reloaded rule that differs only
    /// in its id keeps its breaker's state).
    pub(crate) fn eq_but_id(&self, other: &DegradeRule) -> bool {
        let DegradeRule {
            id: _,
            resource,
            regex,
            limit_app,
            grade,
            count,
            time_window_sec,
            min_request_amount,
            stat_interval_ms,
            slow_ratio_threshold,
        } = self;
        *resource == other.resource
            && *regex == other.regex
            && *limit_app == other.limit_app
            && *grade == other.grade
            && *count == other.count
            && *time_window_sec == other.time_window_sec
            && *min_request_amount == other.min_request_amount
            && *stat_interval_ms == other.stat_interval_ms
            && *slow_ratio_threshold == other.slow_ratio_threshold
    }
}
