//! Hot-parameter rule data.

use crate::flow::rule::{ClusterConfig, ControlBehavior, FlowGrade};

/// A typed parameter value in a rule's exception items. Matching is type-sensitive: `Int(7)` is not `Str("7")`.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamItemValue {
    /// An integer (Java's int, long, short, byte).
    Int(i64),
    /// A floating-point number (Java's float, double). An `f32` argument is compared widened to `f64`: an item
    /// meant for `f32` arguments holds the `f32` value widened (`Float(f64::from(1.1f32))`), as rule files'
    /// `classType: float` items do.
    Float(f64),
    /// A string.
    Str(String),
    /// A boolean.
    Bool(bool),
    /// A character.
    Char(char),
}

/// An exception item: a value with its own threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamFlowItem {
    /// The value.
    pub value: ParamItemValue,
    /// Its threshold.
    pub count: f64,
}

/// A hot-parameter rule: limit each distinct value of one argument separately.
///
/// ```
/// use sentinel_runtime::param_flow::ParamFlowRule;
/// let rule = ParamFlowRule::new("getUser", 0).count(5.0);
/// assert_eq!(rule.duration_in_sec, 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ParamFlowRule {
    /// An id of the rule's source.
    pub id: Option<u64>,
    /// The resource.
    pub resource: String,
    /// Kept for compatibility with Sentinel's rule format (`"default"`); not read: as in Java, the rule applies to
    /// every caller.
    pub limit_app: String,
    /// Which argument: an index, negative from the end.
    pub param_idx: i32,
    /// QPS or threads per value.
    pub grade: FlowGrade,
    /// Threshold per value.
    pub count: f64,
    /// Reject or rate limiter (others are invalid).
    pub control_behavior: ControlBehavior,
    /// Longest queueing wait (rate limiter).
    pub max_queueing_time_ms: u64,
    /// Extra tokens a value may burst by.
    pub burst_count: u64,
    /// The statistics duration.
    pub duration_in_sec: u64,
    /// Values with their own thresholds.
    pub items: Vec<ParamFlowItem>,
    /// Whether a cluster token service decides.
    pub cluster_mode: bool,
    /// Cluster settings.
    pub cluster_config: Option<ClusterConfig>,
    /// Whether `resource` is a regular expression: the rule applies to every resource whose whole name
    /// matches, each with its own per-value counters (see [`crate::pattern`]). Only with the default
    /// behaviour (reject) and without cluster mode, as in Java.
    pub regex: bool,
}

impl Default for ParamFlowRule {
    fn default() -> Self {
        ParamFlowRule {
            id: None,
            resource: String::new(),
            limit_app: crate::LIMIT_APP_DEFAULT.to_string(),
            param_idx: 0,
            grade: FlowGrade::Qps,
            count: 0.0,
            control_behavior: ControlBehavior::Reject,
            max_queueing_time_ms: 0,
            burst_count: 0,
            duration_in_sec: 1,
            items: Vec::new(),
            cluster_mode: false,
            cluster_config: None,
            regex: false,
        }
    }
}

impl ParamFlowRule {
    /// A QPS reject rule on argument `param_idx` of `resource`.
    pub fn new(resource: impl Into<String>, param_idx: i32) -> Self {
        ParamFlowRule { resource: resource.into(), param_idx, ..Default::default() }
    }
    /// Sets the threshold.
    pub fn count(mut self, c: f64) -> Self {
        self.count = c;
        self
    }
    /// Sets the grade.
    pub fn grade(mut self, g: FlowGrade) -> Self {
        self.grade = g;
        self
    }
    /// Sets the burst.
    pub fn burst_count(mut self, b: u64) -> Self {
        self.burst_count = b;
        self
    }
    /// Sets the duration.
    pub fn duration_in_sec(mut self, d: u64) -> Self {
        self.duration_in_sec = d;
        self
    }
    /// Adds an exception item.
    pub fn item(mut self, value: ParamItemValue, count: f64) -> Self {
        self.items.push(ParamFlowItem { value, count });
        self
    }
    /// Sets the control behaviour.
    pub fn control_behavior(mut self, b: ControlBehavior) -> Self {
        self.control_behavior = b;
        self
    }
    /// Sets the queueing time.
    pub fn max_queueing_time_ms(mut self, ms: u64) -> Self {
        self.max_queueing_time_ms = ms;
        self
    }
    /// Sets the rule id.
    pub fn id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }
    /// Sets `limit_app`, kept for Sentinel's rule format: as in Java, a hot-parameter rule applies to every
    /// caller whatever it says (limit by caller with a parameter that carries the origin).
    pub fn limit_app(mut self, app: impl Into<String>) -> Self {
        self.limit_app = app.into();
        self
    }
    /// Makes `resource` a regular expression (see [`regex`](Self::regex)).
    pub fn regex(mut self, regex: bool) -> Self {
        self.regex = regex;
        self
    }
    /// Puts the rule in cluster mode with `config`.
    pub fn cluster(mut self, config: ClusterConfig) -> Self {
        self.cluster_mode = true;
        self.cluster_config = Some(config);
        self
    }
}
