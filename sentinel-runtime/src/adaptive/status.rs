//! What an adaptive limiter shows: [`AdaptiveStatus`] (for `diagnose()`, the Prometheus gauges, the metric
//! log and the console).

use std::time::Duration;

use super::limiter::Limiter;
use super::rule::{AdaptiveRule, AlgorithmKind};

/// One adaptive limiter now: the limit it found, the calls in flight and what it measured.
///
/// Read under the limiter's control lock (taken by a window's closer once per window, never by a call), so the
/// numbers are of one moment.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AdaptiveStatus {
    /// The resource.
    pub resource: String,
    /// The algorithm in force.
    pub algorithm: AlgorithmKind,
    /// The limit in force.
    pub limit: u32,
    /// The rule's bounds.
    pub min_limit: u32,
    /// The rule's bounds.
    pub max_limit: u32,
    /// Calls in flight.
    pub inflight: u32,
    /// Calls waiting for a place (`maxWaitMs`).
    pub waiting: usize,
    /// The last closed window's lowest RTT (zero before the first window closed).
    pub min_rtt: Duration,
    /// The last closed window's average RTT: the sample RTT (zero before the first window closed).
    pub sample_rtt: Duration,
    /// The RTT the algorithm compares against: Gradient2's long-term RTT, Vegas's no-load RTT (the lowest
    /// window average; zero for AIMD).
    pub baseline_rtt: Duration,
    /// Gradient2's last gradient, in [0.5, 1] (1 for the other algorithms).
    pub gradient: f64,
    /// Whether a minimum-RTT probe pins the limit now.
    pub probing: bool,
    /// The partitions by origin.
    pub partitions: Vec<PartitionStatus>,
}

/// One partition of an adaptive limiter now.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PartitionStatus {
    /// The origin (or `default`).
    pub origin: String,
    /// Its share of the limit.
    pub share: f64,
    /// The calls in flight guaranteed to it under contention: `ceil(limit · share)`.
    pub guarantee: u32,
    /// Its calls in flight.
    pub inflight: u32,
}

impl AdaptiveStatus {
    pub(crate) fn of(resource: &str, rule: &AdaptiveRule, limiter: &Limiter) -> Self {
        let v = limiter.view();
        AdaptiveStatus {
            resource: resource.to_string(),
            algorithm: v.algorithm,
            limit: v.limit,
            min_limit: rule.min_limit,
            max_limit: rule.max_limit,
            inflight: v.inflight,
            waiting: v.waiting,
            min_rtt: Duration::from_nanos(v.min_rtt_nanos),
            sample_rtt: Duration::from_nanos(v.rtt_nanos),
            baseline_rtt: Duration::from_nanos(v.baseline_rtt_nanos),
            gradient: v.gradient,
            probing: v.probing,
            partitions: v
                .partitions
                .into_iter()
                .map(|(origin, share, guarantee, inflight)| PartitionStatus {
                    origin: origin.into(),
                    share,
                    guarantee,
                    inflight,
                })
                .collect(),
        }
    }
}
