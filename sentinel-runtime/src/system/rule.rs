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
