//! The findings on cluster-mode flow rules: how each is decided now (a lease from the token service, the local
//! fallback, or passing) and why.

use super::RuleFinding;
use crate::flow::{ClusterRuleMode, ClusterRuleStatus, FlowRule};
use crate::Sentinel;

/// The cluster-mode flow rules of `resource` and their state ([`Sentinel::cluster_status`]).
pub(super) fn rules_of(engine: &Sentinel, resource: &str) -> Vec<ClusterRuleStatus> {
    engine.cluster_status().into_iter().filter(|c| c.rule.resource == resource).collect()
}

/// Adds to `f` what the cluster-mode flow rule `rule` does now, given its state.
pub(super) fn explain_mode(f: &mut RuleFinding, rule: &FlowRule, cluster_state: Option<&ClusterRuleStatus>) {
    let fallback = rule.cluster_config.as_ref().is_some_and(|c| c.fallback_to_local_when_fail);
    match cluster_state.map(|c| c.mode) {
        Some(ClusterRuleMode::Leasing) => {}
        Some(ClusterRuleMode::Fallback) => f.problems.push(format!(
            "cluster mode is falling back to a local limit of {}/s on this instance{}: {}",
            cluster_state.map_or(rule.count, |c| c.local_limit),
            cluster_state.and_then(|c| c.fallback_instances).map_or_else(String::new, |n| match n {
                crate::flow::FallbackInstances::Assumed(_) => format!(
                    " (count ÷ {n}: set `expected_instances` on the rule's cluster config or the cluster \
                     client to the real number)"
                ),
                _ => format!(" (count ÷ {n})"),
            }),
            cluster_state.and_then(|c| c.reason.clone()).unwrap_or_else(|| "the token service fails".into())
        )),
        Some(ClusterRuleMode::Passing) => {
            f.applies = false;
            f.problems.push(format!(
                "cluster mode without `fallback_to_local_when_fail` while the token service fails: every call                      passes ({})",
                cluster_state.and_then(|c| c.reason.clone()).unwrap_or_else(|| "no reason given".into())
            ));
        }
        _ if !fallback => {
            f.applies = false;
            f.problems.push(
                "cluster mode without `fallback_to_local_when_fail` and no token service (enable `cluster-redis`                      and start `cluster::RedisCluster`): the rule is skipped"
                    .to_string(),
            );
        }
        _ => f.problems.push(
            "cluster mode with no token service: decided locally with the whole count on this instance (start                  `cluster::RedisCluster` with the `cluster-redis` feature for one limit across instances)"
                .to_string(),
        ),
    }
}
