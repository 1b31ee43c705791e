//! Flow rule data.

/// What a flow rule counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FlowGrade {
    /// Calls in flight.
    Thread,
    /// Passed calls per second.
    #[default]
    Qps,
}

/// Which node a flow rule reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FlowStrategy {
    /// The resource's own node (chosen by `limit_app`).
    #[default]
    Direct,
    /// The cluster node of `ref_resource`: limit this resource when the other is busy.
    Relate,
    /// This resource's node in the context named `ref_resource` (an entrance).
    Chain,
}

/// How a flow rule shapes traffic over its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ControlBehavior {
    /// Block at once.
    #[default]
    Reject,
    /// Start at a third of the limit and warm up over `warm_up_period_sec`.
    WarmUp,
    /// Space calls evenly, queueing up to `max_queueing_time_ms`.
    RateLimiter,
    /// Warm up, and space calls evenly while warming.
    WarmUpRateLimiter,
}

/// How a cluster rule's threshold is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClusterThresholdType {
    /// `count` per connected client.
    #[default]
    AvgLocal,
    /// `count` for the whole cluster.
    Global,
}

/// Cluster settings a rule carries (used by cluster flow control).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// The rule's id in the token service.
    pub flow_id: Option<u64>,
    /// How `count` is read.
    pub threshold_type: ClusterThresholdType,
    /// Limit locally when the token service cannot be reached.
    pub fallback_to_local_when_fail: bool,
    /// Buckets of the cluster window.
    pub sample_count: u32,
    /// Length of the cluster window.
    pub window_interval_ms: u64,
    /// How many instances are expected to share a global `count` (JSON `expectedInstances`; Java has no such
    /// setting). While the token service fails, each instance's fallback admits `count ÷ instances`: the
    /// larger of this and the live instances last seen, or this alone when none were seen (Redis unreachable
    /// from the start, a wrong node). Overrides the cluster client's own `expected_instances` setting when
    /// both are set. With neither set nor seen, the fallback assumes [`ASSUMED_INSTANCES`] (see
    /// [`FallbackInstances`]).
    pub expected_instances: Option<u32>,
}

/// Instances a global cluster count is divided by while the token service fails, when the live instances
/// were never seen and no expected count is configured: a conservative share, so that the fallback never
/// multiplies the limit by the number of instances (unless there are more than this many; configure
/// `expected_instances` for the true number).
pub const ASSUMED_INSTANCES: u64 = 4;

/// How many instances a cluster rule's fallback divides a global `count` by, and where that number comes
/// from ([`ClusterRuleStatus::fallback_instances`](crate::flow::ClusterRuleStatus::fallback_instances)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackInstances {
    /// The live instances the token service last reported (no fewer were configured).
    Seen(u64),
    /// The configured expected instance count ([`ClusterConfig::expected_instances`], else the client's):
    /// none seen yet, or fewer seen than expected.
    Configured(u64),
    /// Neither seen nor configured: [`ASSUMED_INSTANCES`].
    Assumed(u64),
}

impl FallbackInstances {
    /// The instance count from the live instances last seen and the configured expected count.
    pub(crate) fn of(seen: Option<u64>, configured: Option<u64>) -> FallbackInstances {
        match (seen.filter(|n| *n > 0), configured.filter(|n| *n > 0)) {
            (Some(s), Some(c)) if c > s => FallbackInstances::Configured(c),
            (Some(s), _) => FallbackInstances::Seen(s),
            (None, Some(c)) => FallbackInstances::Configured(c),
            (None, None) => FallbackInstances::Assumed(ASSUMED_INSTANCES),
        }
    }

    /// The instance count.
    pub fn count(self) -> u64 {
        match self {
            FallbackInstances::Seen(n) | FallbackInstances::Configured(n) | FallbackInstances::Assumed(n) => n,
        }
    }

    /// Where it comes from, in one word: `seen`, `configured` or `assumed`.
    pub fn source(self) -> &'static str {
        match self {
            FallbackInstances::Seen(_) => "seen",
            FallbackInstances::Configured(_) => "configured",
            FallbackInstances::Assumed(_) => "assumed",
        }
    }
}

impl std::fmt::Display for FallbackInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            FallbackInstances::Seen(_) => "live instances last seen",
            FallbackInstances::Configured(_) => "expected instances configured",
            FallbackInstances::Assumed(_) => "instances assumed (none seen or configured)",
        };
        write!(f, "{} {what}", self.count())
    }
}

impl ClusterConfig {
    /// A configuration with the given threshold type and Java's defaults for the rest.
    pub fn new(threshold_type: ClusterThresholdType) -> Self {
        ClusterConfig { threshold_type, ..Default::default() }
    }
    /// Sets the rule's id in the token service.
    pub fn flow_id(mut self, id: u64) -> Self {
        self.flow_id = Some(id);
        self
    }
    /// Sets whether to limit locally when the token service cannot be reached.
    pub fn fallback_to_local_when_fail(mut self, on: bool) -> Self {
        self.fallback_to_local_when_fail = on;
        self
    }
    /// Sets the number of buckets of the cluster window.
    pub fn sample_count(mut self, n: u32) -> Self {
        self.sample_count = n;
        self
    }
    /// Sets the length of the cluster window.
    pub fn window_interval_ms(mut self, ms: u64) -> Self {
        self.window_interval_ms = ms;
        self
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            flow_id: None,
            threshold_type: ClusterThresholdType::AvgLocal,
            fallback_to_local_when_fail: true,
            sample_count: 10,
            window_interval_ms: 1000,
            expected_instances: None,
        }
    }
}

/// A flow rule: limit a resource's QPS or concurrency.
///
/// ```
/// use sentinel_runtime::flow::{FlowRule, ControlBehavior};
/// let rule = FlowRule::new("queryOrder").count(100.0).control_behavior(ControlBehavior::WarmUp);
/// assert_eq!(rule.warm_up_period_sec, 10);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct FlowRule {
    /// An id of the rule's source (kept as given; used in logs).
    pub id: Option<u64>,
    /// The resource the rule limits: its exact name, or a pattern when `regex` is set.
    pub resource: String,
    /// Whether `resource` is a regular expression (Java's `regex`): the rule applies to every resource whose
    /// whole name matches it, and each matching resource is limited separately (its own count and state).
    pub regex: bool,
    /// `"default"` (all callers), `"other"` (each origin not named by another rule), or an origin name.
    pub limit_app: String,
    /// QPS or threads.
    pub grade: FlowGrade,
    /// The threshold.
    pub count: f64,
    /// Direct, relate or chain.
    pub strategy: FlowStrategy,
    /// The related resource (relate) or entrance context name (chain).
    pub ref_resource: Option<String>,
    /// Reject, warm-up, rate limiter or both.
    pub control_behavior: ControlBehavior,
    /// Warm-up period.
    pub warm_up_period_sec: u32,
    /// Longest queueing wait for the rate limiter behaviours.
    pub max_queueing_time_ms: u64,
    /// Warm-up cold factor (> 1; Java's default 3).
    pub cold_factor: u32,
    /// Whether a cluster token service decides.
    pub cluster_mode: bool,
    /// Cluster settings.
    pub cluster_config: Option<ClusterConfig>,
}

impl Default for FlowRule {
    fn default() -> Self {
        FlowRule {
            id: None,
            resource: String::new(),
            regex: false,
            limit_app: crate::LIMIT_APP_DEFAULT.to_string(),
            grade: FlowGrade::Qps,
            count: 0.0,
            strategy: FlowStrategy::Direct,
            ref_resource: None,
            control_behavior: ControlBehavior::Reject,
            warm_up_period_sec: 10,
            max_queueing_time_ms: 500,
            cold_factor: 3,
            cluster_mode: false,
            cluster_config: None,
        }
    }
}

impl FlowRule {
    /// A QPS reject rule for `resource` with count 0; set the fields with the builder methods.
    pub fn new(resource: impl Into<String>) -> Self {
        FlowRule { resource: resource.into(), ..Default::default() }
    }
    /// Sets the threshold.
    pub fn count(mut self, count: f64) -> Self {
        self.count = count;
        self
    }
    /// Sets the grade.
    pub fn grade(mut self, grade: FlowGrade) -> Self {
        self.grade = grade;
        self
    }
    /// Sets `limit_app`.
    pub fn limit_app(mut self, app: impl Into<String>) -> Self {
        self.limit_app = app.into();
        self
    }
    /// Relate to another resource's load.
    pub fn relate(mut self, ref_resource: impl Into<String>) -> Self {
        self.strategy = FlowStrategy::Relate;
        self.ref_resource = Some(ref_resource.into());
        self
    }
    /// Limit only calls that entered through the context (entrance) named `context`.
    pub fn chain(mut self, context: impl Into<String>) -> Self {
        self.strategy = FlowStrategy::Chain;
        self.ref_resource = Some(context.into());
        self
    }
    /// Sets the control behaviour.
    pub fn control_behavior(mut self, b: ControlBehavior) -> Self {
        self.control_behavior = b;
        self
    }
    /// Sets the warm-up period.
    pub fn warm_up_period_sec(mut self, s: u32) -> Self {
        self.warm_up_period_sec = s;
        self
    }
    /// Sets the longest queueing wait.
    pub fn max_queueing_time_ms(mut self, ms: u64) -> Self {
        self.max_queueing_time_ms = ms;
        self
    }
    /// Sets the warm-up cold factor.
    pub fn cold_factor(mut self, f: u32) -> Self {
        self.cold_factor = f;
        self
    }
    /// Sets the rule id.
    pub fn id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }
    /// Reads `resource` as a regular expression over whole resource names (see [`crate::pattern`]).
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, flow::FlowRule};
    /// let engine = Sentinel::builder().build();
    /// engine.load_flow_rules([FlowRule::new("GET:/orders/.*").regex(true).count(1.0)]).unwrap();
    /// let (a, b) = (engine.resource("GET:/orders/1"), engine.resource("GET:/orders/2"));
    /// let _first = a.enter().unwrap();
    /// assert!(a.enter().is_err()); // each matching resource has its own limit of 1 ...
    /// assert!(b.enter().is_ok()); // ... so the other one still passes
    /// ```
    pub fn regex(mut self, regex: bool) -> Self {
        self.regex = regex;
        self
    }
    /// Puts the rule in cluster mode with `config`: one limit across every instance (see the `cluster`
    /// module, feature `cluster-redis`).
    ///
    /// ```
    /// use sentinel_runtime::flow::{ClusterConfig, ClusterThresholdType, FlowRule};
    /// let rule = FlowRule::new("queryOrder").count(1000.0).cluster(ClusterConfig::new(ClusterThresholdType::Global));
    /// assert!(rule.cluster_mode);
    /// ```
    pub fn cluster(mut self, config: ClusterConfig) -> Self {
        self.cluster_mode = true;
        self.cluster_config = Some(config);
        self
    }
}
