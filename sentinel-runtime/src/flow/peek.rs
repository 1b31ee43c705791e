//! Reads of the flow rules' windows that spend nothing (the web layer's RateLimit header fields).

use super::{FlowRule, ResourceFlowRules};
use crate::stat::{StatNode, SECOND_INTERVAL_MS, SECOND_SAMPLE_COUNT};

/// The span of one bucket of the second window.
const BUCKET_MS: u64 = SECOND_INTERVAL_MS / SECOND_SAMPLE_COUNT as u64;

/// A QPS rule's budget at one instant.
#[derive(Clone, Debug)]
pub(crate) struct WindowPeek {
    /// The calls the rule admits per second.
    pub(crate) quota: u64,
    /// The calls it would admit now.
    pub(crate) remaining: u64,
    /// Milliseconds until the oldest calls in the window leave it (more budget then).
    pub(crate) refill_in_ms: u64,
}

/// The calls per second a QPS rule admits, the quota a client is told, whether its call passed or was
/// blocked: the rule's count, down to a whole call.
pub(crate) fn qps_quota(rule: &FlowRule) -> u64 {
    rule.count.max(0.0).floor() as u64
}

impl ResourceFlowRules {
    /// The budget of each rule that limits every caller's calls per second on the resource's own window,
    /// rejecting past it (the rules a client can be told a quota of), read from the window without taking
    /// from it: exact at that instant. Other rules (per origin, relate or chain, queueing, warm-up, cluster)
    /// are left out.
    /// `node` is the resource's own (cluster) node.
    pub(crate) fn peek(&self, node: &StatNode, now_ms: u64, out: &mut impl FnMut(WindowPeek)) {
        let mut passed = None;
        for st in self.rules.iter().filter(|s| s.is_simple()) {
            let passed = *passed.get_or_insert_with(|| node.admission().total(now_ms, &|s| node.borrowed_at(s)));
            let quota = qps_quota(&st.rule);
            out(WindowPeek {
                quota,
                remaining: quota.saturating_sub(passed),
                refill_in_ms: BUCKET_MS - now_ms % BUCKET_MS,
            });
        }
    }
}
