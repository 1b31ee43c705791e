//! What the engine tells of the cluster token service and of each cluster rule
//! ([`Sentinel::cluster_status`](crate::Sentinel::cluster_status)).

use std::fmt;

use super::rule::{ClusterThresholdType, FallbackInstances, FlowRule};

/// The cluster token service registered on an engine: [`Sentinel::cluster_service_info`].
///
/// [`Sentinel::cluster_service_info`]: crate::Sentinel::cluster_service_info
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterServiceInfo {
    /// What keeps the shared limits (`redis`).
    pub kind: &'static str,
    /// The host of the shared state (the Redis server).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// How long a call with an empty lease waits, in ms.
    pub timeout_ms: u64,
    /// Whether the service reaches its shared state now.
    pub connected: bool,
    /// Engine time (ms) at which the service was started.
    pub since_ms: u64,
}

/// How a cluster-mode flow rule is decided right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClusterRuleMode {
    /// No token service is registered (or it stopped): the rule is decided as Java decides it without one,
    /// by its whole `count` locally when it falls back to local, else every call passes.
    NoService,
    /// Calls spend tokens leased from the shared limit.
    Leasing,
    /// The token service is failing: calls are decided by a local limit (see
    /// [`ClusterRuleStatus::local_limit`]).
    Fallback,
    /// The token service is failing and the rule does not fall back to local: calls pass (as in Java).
    Passing,
}

impl fmt::Display for ClusterRuleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClusterRuleMode::NoService => "no token service",
            ClusterRuleMode::Leasing => "leasing",
            ClusterRuleMode::Fallback => "local fallback",
            ClusterRuleMode::Passing => "passing (no local fallback)",
        })
    }
}

/// The state of one cluster-mode flow rule: [`Sentinel::cluster_status`](crate::Sentinel::cluster_status).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterRuleStatus {
    /// The rule.
    pub rule: FlowRule,
    /// Where the token service keeps the rule's shared limit (a Redis key), once known.
    pub key: Option<String>,
    /// How the rule is decided now.
    pub mode: ClusterRuleMode,
    /// Why, in words (the last failure while falling back).
    pub reason: Option<String>,
    /// Tokens in hand (leased, not spent yet).
    pub tokens_in_hand: u64,
    /// How long the lease in force may still be spent, in ms.
    pub lease_valid_for_ms: u64,
    /// The shared window is used up for this long (ms): calls are blocked without asking the service.
    pub exhausted_for_ms: u64,
    /// Live instances of the rule, as last seen by the service.
    pub live_instances: Option<u64>,
    /// The local limit (calls per second on this instance) that falling back uses.
    pub local_limit: f64,
    /// What a global count is divided by for [`local_limit`](Self::local_limit), and where that number
    /// comes from (seen, configured or assumed); `None` for per-instance thresholds and with no token
    /// service (the whole count).
    pub fallback_instances: Option<FallbackInstances>,
    /// Tokens leased so far.
    pub tokens_leased: u64,
    /// Leased tokens given back unspent (a lease that ended with tokens left).
    pub tokens_returned: u64,
    /// Calls made to the token service for this rule (leases and heartbeats).
    pub round_trips: u64,
    /// Failed calls to the token service.
    pub failures: u64,
    /// Calls that found the lease empty and waited for the service.
    pub waits: u64,
    /// Of which were decided locally because the wait timed out.
    pub wait_timeouts: u64,
    /// Calls decided by the local fallback (passed and blocked).
    pub fallback_decisions: u64,
    /// Calls blocked because the shared window was used up.
    pub exhausted_blocks: u64,
    /// Calls the local fallback admitted that were counted in the shared window afterwards (once the
    /// service answered again), so that the window does not grant them a second time.
    pub local_admissions_reported: u64,
}

impl fmt::Display for ClusterRuleStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.rule;
        write!(f, "cluster rule on `{}` (count {}", r.resource, r.count)?;
        if let Some(c) = &r.cluster_config {
            let t = match c.threshold_type {
                ClusterThresholdType::Global => "global",
                ClusterThresholdType::AvgLocal => "per instance",
            };
            write!(f, " {t}, window {} ms / {} buckets", c.window_interval_ms, c.sample_count)?;
        }
        write!(f, "): {}", self.mode)?;
        if let Some(k) = &self.key {
            write!(f, ", key `{k}`")?;
        }
        if let Some(n) = self.live_instances {
            write!(f, ", {n} live instance(s)")?;
        }
        if self.mode == ClusterRuleMode::Leasing {
            write!(f, ", {} token(s) in hand for {} ms", self.tokens_in_hand, self.lease_valid_for_ms)?;
            if self.exhausted_for_ms > 0 {
                write!(f, ", window used up for {} ms", self.exhausted_for_ms)?;
            }
        } else {
            write!(f, ", local limit {}/s", self.local_limit)?;
            if let Some(n) = self.fallback_instances {
                write!(f, " (count ÷ {n})")?;
            }
        }
        if let Some(why) = &self.reason {
            write!(f, "; {why}")?;
        }
        write!(
            f,
            " [leased {}, returned {}, round trips {}, failures {}, waits {} ({} timed out), decided locally {}, \
             blocked on a used-up window {}, local admissions reported {}]",
            self.tokens_leased,
            self.tokens_returned,
            self.round_trips,
            self.failures,
            self.waits,
            self.wait_timeouts,
            self.fallback_decisions,
            self.exhausted_blocks,
            self.local_admissions_reported
        )
    }
}

impl ClusterRuleStatus {
    /// The status of a cluster rule with no token service.
    pub(crate) fn without_service(rule: FlowRule) -> Self {
        ClusterRuleStatus {
            local_limit: rule.count,
            fallback_instances: None,
            rule,
            key: None,
            mode: ClusterRuleMode::NoService,
            reason: None,
            tokens_in_hand: 0,
            lease_valid_for_ms: 0,
            exhausted_for_ms: 0,
            live_instances: None,
            tokens_leased: 0,
            tokens_returned: 0,
            round_trips: 0,
            failures: 0,
            waits: 0,
            wait_timeouts: 0,
            fallback_decisions: 0,
            exhausted_blocks: 0,
            local_admissions_reported: 0,
        }
    }
}
