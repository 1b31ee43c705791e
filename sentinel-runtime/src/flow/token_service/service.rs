//! The interface of a cluster token service, as the engine and the flow check see it.

use std::sync::Arc;
use std::time::Duration;

use super::RuleLease;
use crate::flow::cluster_status::ClusterServiceInfo;
use crate::flow::FlowRule;

/// A cluster token service: keeps the leases of the cluster rules in force filled.
///
/// Registered with [`Sentinel::set_cluster_service`](crate::Sentinel); the engine calls
/// [`attach`](TokenService::attach) for each cluster rule that comes into force (and for those in force at
/// registration), and [`wake`](TokenService::wake) when a lease asks for tokens.
pub(crate) trait TokenService: Send + Sync + 'static {
    /// A cluster rule came into force: lease tokens for it. Keep the lease weakly (it is dropped when the
    /// rule is no longer in force). `rules`: the rule list coming into force with it (the list in force may
    /// still be the one before, which can hold the rule this one replaces). Must not block.
    fn attach(&self, lease: &Arc<RuleLease>, rules: &[FlowRule]);
    /// A lease asked for tokens ([`RuleLease::take_request`]). Called on the calling thread of an entry:
    /// must not block, lock or allocate.
    fn wake(&self);
    /// How long a call waits for tokens when its rule's lease is empty.
    fn timeout(&self) -> Duration;
    /// What the service tells about itself (the dashboard's cluster pages show it).
    fn info(&self) -> ClusterServiceInfo;
}
