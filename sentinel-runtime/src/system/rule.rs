//! System rule data.

/// A system-protection rule: each field set is a limit on the whole process's inbound traffic.
///
/// ```
/// use sentinel_runtime::system::SystemRule;
/// let rule = SystemRule { qps: Some(1000.0), ..Default::default() };
/// assert!(rule.max_thread.is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemRule {
    /// An id of the rule's source.
    pub id: Option<u64>,
    /// Highest 1-minute load average (checked with BBR).
    pub highest_system_load: Option<f64>,
    /// Highest cpu usage, in [0, 1].
    pub highest_cpu_usage: Option<f64>,
    /// Highest inbound QPS.
    pub qps: Option<f64>,
    /// Highest inbound average response time, ms.
    pub avg_rt: Option<u64>,
    /// Most inbound calls in flight.
    pub max_thread: Option<u64>,
}

impl SystemRule {
    /// A rule with no limit set; set them with the builder methods.
    ///
    /// ```
    /// use sentinel_runtime::system::SystemRule;
    /// let rule = SystemRule::new().highest_cpu_usage(0.9).max_thread(400);
    /// assert_eq!(rule.max_thread, Some(400));
    /// ```
    pub fn new() -> Self {
        SystemRule::default()
    }
    /// Sets the rule id.
    pub fn id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }
    /// Sets the highest 1-minute load average.
    pub fn highest_system_load(mut self, load: f64) -> Self {
        self.highest_system_load = Some(load);
        self
    }
    /// Sets the highest cpu usage, in [0, 1].
    pub fn highest_cpu_usage(mut self, usage: f64) -> Self {
        self.highest_cpu_usage = Some(usage);
        self
    }
    /// Sets the highest inbound QPS.
    pub fn qps(mut self, qps: f64) -> Self {
        self.qps = Some(qps);
        self
    }
    /// Sets the highest inbound average response time, ms.
    pub fn avg_rt(mut self, ms: u64) -> Self {
        self.avg_rt = Some(ms);
        self
    }
    /// Sets the most inbound calls in flight.
    pub fn max_thread(mut self, n: u64) -> Self {
        self.max_thread = Some(n);
        self
    }
}
