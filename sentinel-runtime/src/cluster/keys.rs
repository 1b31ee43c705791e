//! Where a cluster rule lives in Redis.
//!
//! Each rule has two keys with one hash tag (`{namespace:identity}`), so that under Redis Cluster both sit
//! in one slot and one script can use them:
//!
//! - `sentinel:{ns:id}:w`, a hash: one field per bucket of the rule's window (the bucket's index,
//!   `redis_ms / bucket_ms`) holding the tokens leased in it, minus those given back unspent; expires two
//!   windows after its last use;
//! - `sentinel:{ns:id}:m`, a sorted set: the live instances of the rule, each scored with the Redis time
//!   its membership expires at.
//!
//! The identity is the rule's `flowId` when it has one (`flow:42`), else its resource and a fingerprint of
//! what makes it the same limit on every instance (`res:queryOrder:1f3a…`): `limit_app`, strategy and
//! reference, threshold type, and window, but not `count` (changing the count keeps the window's use), plus
//! the rule's rank among the resource's rules with the same fingerprint. `{`, `}` and `%` in names are
//! percent-encoded, so a name cannot end the hash tag early.

use crate::flow::{ClusterThresholdType, FlowRule};

/// The keys of one cluster rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RuleKeys {
    /// The window hash.
    pub(crate) window: String,
    /// The membership sorted set.
    pub(crate) members: String,
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// What makes two cluster rules of one resource the same shared limit (everything but the count and the
/// fallback flag), hashed.
fn fingerprint(rule: &FlowRule) -> u64 {
    let c = rule.cluster_config.clone().unwrap_or_default();
    let text = format!(
        "{}\u{1f}{:?}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}",
        rule.limit_app,
        rule.strategy,
        rule.ref_resource.as_deref().unwrap_or(""),
        match c.threshold_type {
            ClusterThresholdType::Global => "global",
            ClusterThresholdType::AvgLocal => "avg",
        },
        c.sample_count,
        c.window_interval_ms
    );
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// The rule's identity in `namespace`: its `flowId`, else its resource and fingerprint; `rank` counts the
/// rules before it in the rule list with the same resource and fingerprint.
pub(crate) fn identity(rule: &FlowRule, rank: usize) -> String {
    match rule.cluster_config.as_ref().and_then(|c| c.flow_id) {
        Some(id) => format!("flow:{id}"),
        None if rank == 0 => format!("res:{}:{:016x}", rule.resource, fingerprint(rule)),
        None => format!("res:{}:{:016x}:{rank}", rule.resource, fingerprint(rule)),
    }
}

/// The keys of the rule with `identity` in `namespace`.
pub(crate) fn keys(namespace: &str, identity: &str) -> RuleKeys {
    let tag = format!("{{{}:{}}}", escape(namespace), escape(identity));
    RuleKeys { window: format!("sentinel:{tag}:w"), members: format!("sentinel:{tag}:m") }
}

/// The rank of `rule` among `rules` (the rule list in force): how many cluster rules before it share its
/// resource and fingerprint (and have no `flowId`).
pub(crate) fn rank_in(rule: &FlowRule, rules: &[FlowRule]) -> usize {
    if rule.cluster_config.as_ref().and_then(|c| c.flow_id).is_some() {
        return 0;
    }
    let fp = fingerprint(rule);
    rules
        .iter()
        .take_while(|r| *r != rule)
        .filter(|r| {
            r.cluster_mode
                && r.resource == rule.resource
                && r.cluster_config.as_ref().and_then(|c| c.flow_id).is_none()
                && fingerprint(r) == fp
        })
        .count()
}

/// The hash tag of a key (what Redis Cluster hashes): the text between the first `{` and the next `}`.
#[cfg(test)]
fn hash_tag(key: &str) -> Option<&str> {
    let start = key.find('{')? + 1;
    let len = key[start..].find('}')?;
    (len > 0).then(|| &key[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::ClusterConfig;

    fn cluster(resource: &str, count: f64, flow_id: Option<u64>) -> FlowRule {
        FlowRule {
            cluster_mode: true,
            cluster_config: Some(ClusterConfig { flow_id, ..ClusterConfig::default() }),
            ..FlowRule::new(resource).count(count)
        }
    }

    #[test]
    fn both_keys_of_a_rule_share_one_hash_tag_even_with_braces_in_names() {
        let k = keys("shop{eu}", "res:get}User:00");
        assert_eq!(hash_tag(&k.window), hash_tag(&k.members));
        assert_eq!(hash_tag(&k.window), Some("shop%7Beu%7D:res:get%7DUser:00"));
        assert!(k.window.ends_with(":w") && k.members.ends_with(":m"));
    }

    #[test]
    fn a_flow_id_names_the_rule_and_a_count_change_keeps_the_key() {
        assert_eq!(identity(&cluster("api", 10.0, Some(42)), 0), "flow:42");
        let a = identity(&cluster("api", 10.0, None), 0);
        assert_eq!(a, identity(&cluster("api", 99.0, None), 0), "the count is not part of the identity");
        assert_ne!(a, identity(&cluster("api", 10.0, None).limit_app("appA"), 0));
        assert_ne!(a, identity(&cluster("other", 10.0, None), 0));
    }

    #[test]
    fn rules_with_the_same_fingerprint_are_told_apart_by_rank() {
        let rules = vec![cluster("api", 10.0, None), cluster("api", 20.0, None), cluster("db", 5.0, None)];
        assert_eq!(rank_in(&rules[0], &rules), 0);
        assert_eq!(rank_in(&rules[1], &rules), 1);
        assert_eq!(rank_in(&rules[2], &rules), 0);
        assert_ne!(identity(&rules[0], 0), identity(&rules[1], 1));
    }
}
