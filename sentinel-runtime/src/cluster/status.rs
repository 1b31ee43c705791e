//! What a running cluster client reports of itself.

/// The state of a cluster client ([`ClusterClient::status`](super::ClusterClient::status)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterClientStatus {
    /// Where Redis runs: its URL, the cluster's seed nodes or the sentinels and the master's name
    /// (passwords hidden).
    pub url: String,
    /// The key namespace.
    pub namespace: String,
    /// This instance's member name.
    pub instance_id: String,
    /// Whether Redis answers (false before the first answer and while it fails).
    pub connected: bool,
    /// Whether the client was stopped.
    pub stopped: bool,
    /// The last failure, while Redis fails.
    pub last_error: Option<String>,
    /// Cluster rules the client leases for.
    pub rules: usize,
}
