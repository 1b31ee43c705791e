//! The cluster client's settings.

use std::time::Duration;

use super::connection::Topology;
use super::error::ClusterError;

/// Settings of a [`RedisCluster`](super::RedisCluster) client, with their defaults.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// Where Redis runs: one server, a Redis Cluster, or a master behind Redis Sentinel (`rediss://` for
    /// TLS is not built in).
    pub topology: Topology,
    /// The namespace of the keys (the application's shared limits): the engine's app name when `None`.
    /// Every instance of one application must use the same.
    pub namespace: Option<String>,
    /// How long a call whose lease is empty waits for Redis, and the bound on every Redis call (default
    /// 20 ms, Java's token client timeout). Past it the call is decided by the local fallback.
    pub timeout: Duration,
    /// How often the instance renews its membership of each rule (default 1 s).
    pub heartbeat_interval: Duration,
    /// How long a membership lasts without renewal (default 3 s): an instance that stops (a crash, a
    /// network split) no longer counts after this long.
    pub member_ttl: Duration,
    /// A lease is not spent in the last this-long of its Redis bucket (default 2 ms), to absorb the
    /// difference between the instances' clocks' rates and the cached clock's resolution.
    pub lease_margin: Duration,
    /// The longest pause between two attempts to reach a failing Redis (default 1 s; the first retry
    /// comes after 100 ms, then the pause doubles). When Redis answers again, rules keep their local limits
    /// this long (plus the connection and call timeouts), so that every instance has counted what its
    /// fallback admitted before any leases again: every instance of an application should use the same.
    pub retry_max: Duration,
    /// This instance's name in the membership sets (default `host:pid:random`).
    pub instance_id: Option<String>,
    /// How many instances are expected to share each global cluster rule (default none): while Redis
    /// fails, a rule's fallback admits `count ÷` the larger of this and the live instances last seen, or
    /// this alone when none were seen (Redis unreachable from the start, a wrong node). A rule's own
    /// [`ClusterConfig::expected_instances`](crate::flow::ClusterConfig::expected_instances) wins. With
    /// neither set nor seen, the fallback assumes [`ASSUMED_INSTANCES`](crate::flow::ASSUMED_INSTANCES).
    pub expected_instances: Option<u32>,
}

impl ClusterOptions {
    /// The defaults, for the Redis at `url` (`redis://[user:password@]host:port[/db]`).
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_topology(Topology::Standalone { url: url.into() })
    }

    /// The defaults, for the Redis Cluster reached through `nodes` (seed nodes, `redis://host:port` each).
    pub fn cluster<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        Self::with_topology(Topology::cluster(nodes))
    }

    /// The defaults, for the master that the sentinels at `sentinels` (`redis://host:port` each) monitor
    /// as `master_name`.
    pub fn sentinel<S: Into<String>>(sentinels: impl IntoIterator<Item = S>, master_name: impl Into<String>) -> Self {
        Self::with_topology(Topology::sentinel(sentinels, master_name))
    }

    /// The defaults, for `topology`.
    pub fn with_topology(topology: Topology) -> Self {
        ClusterOptions {
            topology,
            namespace: None,
            timeout: Duration::from_millis(20),
            heartbeat_interval: Duration::from_secs(1),
            member_ttl: Duration::from_secs(3),
            lease_margin: Duration::from_millis(2),
            retry_max: Duration::from_secs(1),
            instance_id: None,
            expected_instances: None,
        }
    }

    /// Checks the settings against each other.
    pub(crate) fn validate(&self) -> Result<(), ClusterError> {
        let bad = |field: &'static str, reason: &str| Err(ClusterError::Option { field, reason: reason.to_string() });
        if self.timeout.is_zero() {
            return bad("timeout", "must be > 0");
        }
        if self.heartbeat_interval.is_zero() {
            return bad("heartbeat_interval", "must be > 0");
        }
        if self.member_ttl <= self.heartbeat_interval {
            return bad(
                "member_ttl",
                "must be longer than heartbeat_interval, or live instances would expire between beats",
            );
        }
        if self.expected_instances == Some(0) {
            return bad("expected_instances", "must be > 0 (or unset)");
        }
        if self.retry_max.is_zero() {
            return bad("retry_max", "must be > 0");
        }
        if let Some(ns) = &self.namespace
            && ns.trim().is_empty()
        {
            return bad("namespace", "must not be blank (leave it unset to use the app name)");
        }
        if let Some(id) = &self.instance_id
            && id.trim().is_empty()
        {
            return bad("instance_id", "must not be blank (leave it unset for host:pid:random)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_contradict_each_other_are_refused() {
        let mut o = ClusterOptions::new("redis://127.0.0.1");
        o.member_ttl = o.heartbeat_interval;
        assert!(matches!(o.validate(), Err(ClusterError::Option { field: "member_ttl", .. })));
        let mut o = ClusterOptions::new("redis://127.0.0.1");
        o.timeout = Duration::ZERO;
        assert!(matches!(o.validate(), Err(ClusterError::Option { field: "timeout", .. })));
        assert!(ClusterOptions::new("redis://127.0.0.1").validate().is_ok());
    }
}
