//! The rules in force for each resource.
//!
//! Each rule manager keeps its rules by resource name. Whenever a manager's rules change or a resource is
//! created, the engine rebuilds that resource's [`ResourceRules`] (one atomically swapped `Arc`) from every
//! manager, so an entry reads all its rules with one lock-free load and no name lookup.

use std::sync::Arc;

use crate::authority::ResourceAuthority;
use crate::circuit_breaker::ResourceBreakers;
use crate::flow::ResourceFlowRules;
use crate::param_flow::ResourceParamRules;

/// The rules of every kind that apply to one resource.
#[derive(Default)]
pub(crate) struct ResourceRules {
    pub(crate) authority: Option<Arc<ResourceAuthority>>,
    pub(crate) param: Option<Arc<ResourceParamRules>>,
    pub(crate) flow: Option<Arc<ResourceFlowRules>>,
    /// Whether, and which, fast path decides the rules ([`FastPath`]).
    pub(crate) fast_path: FastPath,
    /// No authority or hot-parameter rule, and one flow rule, a cluster rule for every caller: an entry that
    /// is not prioritized, while every breaker is closed and a leased token is in hand, is decided by it
    /// alone.
    pub(crate) cluster_only: bool,
    /// Degrade rules of the resource itself.
    pub(crate) degrade: Option<Arc<ResourceBreakers>>,
    /// The default (`"*"`) breakers, present only when the resource has none of its own.
    pub(crate) default_degrade: Option<Arc<ResourceBreakers>>,
    /// The adaptive concurrency rule that governs the resource, with its limiter.
    pub(crate) adaptive: Option<Arc<crate::adaptive::slot::ResourceAdaptive>>,
    /// The test-only kind's rules (slot/every_nth.rs).
    #[cfg(test)]
    pub(crate) every_nth: Option<Arc<crate::slot::every_nth::EveryNth>>,
    /// Origins the resource's flow rules name (interned id, name): each always has its own origin node.
    pub(crate) named_origins: Vec<(u32, Arc<str>)>,
}

/// Which path decides a resource's calls that are not prioritized, while every breaker is closed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum FastPath {
    /// The general path (a kind off the fast path has rules, or flow rules the fast path does not decide).
    #[default]
    No,
    /// The fast path: no hot-parameter rule or only local ones ([`ResourceParamRules::on_fast_path`]), no flow
    /// rule or only ones the fast path decides ([`FastRules`](crate::flow::FastRules)), no adaptive rule or one
    /// whose calls never wait, no kind off the fast path (cluster-mode hot parameters): the calls are checked
    /// by the authority lists, the system rules (inbound calls), the hot-parameter rules, the flow rules and the
    /// adaptive limit alone, without the general check context.
    Common,
    /// The same, where a kind on the fast path apart
    /// ([`FAST_PATH_APART`](crate::slot::contract::RuleSlot::FAST_PATH_APART): an adaptive limit) has rules
    /// beside a kind before it that holds (flow or hot-parameter rules): the fast path's copy in which those
    /// keep what they take, to give it back when the later check refuses (`chain::run_fast`'s `APART` copy).
    Apart,
}

impl ResourceRules {
    pub(crate) fn is_empty(&self) -> bool {
        self.authority.is_none()
            && self.param.is_none()
            && self.flow.is_none()
            && self.degrade.is_none()
            && self.default_degrade.is_none()
            && self.adaptive.is_none()
            && self.test_only_is_empty()
    }

    #[cfg(test)]
    fn test_only_is_empty(&self) -> bool {
        self.every_nth.is_none()
    }
    #[cfg(not(test))]
    fn test_only_is_empty(&self) -> bool {
        true
    }
}
