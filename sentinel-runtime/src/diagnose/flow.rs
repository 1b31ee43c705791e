//! The findings on flow rules: who each rule limits (`limit_app`) and which node it compares (strategy).

use super::{cluster, names, RuleFinding, Seen};
use crate::flow::{ClusterRuleStatus, ControlBehavior, FlowGrade, FlowRule, FlowStrategy};
use crate::{NodeStats, RuleKind, Sentinel, LIMIT_APP_DEFAULT, LIMIT_APP_OTHER};

/// The findings on the flow rules that apply to `resource`, with the cluster state of its cluster-mode rules.
pub(super) fn findings(
    engine: &Sentinel,
    resource: &str,
    seen: &Seen<'_>,
    contexts: &[String],
    cluster: &[ClusterRuleStatus],
) -> Vec<RuleFinding> {
    let all_flow = engine.flow_rules();
    all_flow
        .iter()
        .enumerate()
        .filter(|(_, r)| applies(engine, r, resource))
        .map(|(i, r)| {
            let c = cluster.iter().find(|c| c.rule == *r);
            flow_finding(engine, resource, i, r, &all_flow, seen, contexts, c)
        })
        .collect()
}

/// Whether the flow rule applies to `resource` (names it, or its pattern matches).
fn applies(engine: &Sentinel, rule: &FlowRule, resource: &str) -> bool {
    names(rule.regex, &rule.resource, resource, |p, n| engine.shared.flow.pattern_matches(p, n))
}

fn flow_value(grade: FlowGrade, s: &NodeStats) -> f64 {
    match grade {
        FlowGrade::Qps => s.pass_qps,
        FlowGrade::Thread => s.threads as f64,
    }
}

#[allow(clippy::too_many_arguments)]
fn flow_finding(
    engine: &Sentinel,
    resource: &str,
    index: usize,
    rule: &FlowRule,
    all: &[FlowRule],
    seen: &Seen<'_>,
    contexts: &[String],
    cluster_state: Option<&ClusterRuleStatus>,
) -> RuleFinding {
    let grade = match rule.grade {
        FlowGrade::Qps => "QPS",
        FlowGrade::Thread => "thread",
    };
    let strategy = match rule.strategy {
        FlowStrategy::Direct => "direct".to_string(),
        FlowStrategy::Relate => {
            format!("relate to `{}`", rule.ref_resource.as_deref().unwrap_or(""))
        }
        FlowStrategy::Chain => format!("chain through context `{}`", rule.ref_resource.as_deref().unwrap_or("")),
    };
    let summary = format!(
        "{grade} limit {} for limit_app `{}`, {strategy}, {:?}",
        rule.count, rule.limit_app, rule.control_behavior
    );
    let mut f = RuleFinding {
        kind: RuleKind::Flow,
        index,
        summary,
        reads: String::new(),
        current: None,
        threshold: Some(rule.count),
        applies: true,
        problems: Vec::new(),
        pattern: rule.regex.then(|| rule.resource.clone()),
    };
    let cluster = engine.cluster_stats(resource);

    // Who is subject to the rule (limit_app), as Java's node selection decides.
    let named: Vec<&str> = all
        .iter()
        .filter(|r| applies(engine, r, resource))
        .map(|r| r.limit_app.as_str())
        .filter(|a| *a != LIMIT_APP_DEFAULT && *a != LIMIT_APP_OTHER)
        .collect();
    let who_stats: Option<NodeStats>;
    if rule.limit_app == LIMIT_APP_DEFAULT {
        f.reads = format!("the cluster node of `{resource}` (every caller)");
        who_stats = cluster.clone();
    } else if rule.limit_app == LIMIT_APP_OTHER {
        let covered: Vec<&(String, NodeStats)> =
            seen.origins.iter().filter(|(o, _)| !named.contains(&o.as_str())).collect();
        f.reads = format!(
            "the node of each caller origin not named by another rule of `{resource}` (named: {})",
            if named.is_empty() { "none".to_string() } else { named.join(", ") }
        );
        who_stats = covered
            .iter()
            .map(|(_, s)| s.clone())
            .max_by(|a, b| flow_value(rule.grade, a).total_cmp(&flow_value(rule.grade, b)));
        if covered.is_empty() {
            f.applies = false;
            f.problems.push(format!(
                "no call came from an origin this `other` rule covers ({}); calls without an origin are never \
                 limited by `other`: use limit_app \"default\" to limit every caller",
                seen.describe()
            ));
        }
    } else {
        f.reads =
            format!("the origin node of `{}` (calls whose context origin is `{}`)", rule.limit_app, rule.limit_app);
        who_stats = seen.get(&rule.limit_app).cloned();
        if who_stats.is_none() {
            f.applies = false;
            f.problems.push(format!(
                "no call came with origin `{}`, so the rule never applied: {}. The origin is the one given to \
                 `enter_context(name, origin)` (or the entry's `.origin(...)`); to limit every caller use \
                 limit_app \"default\"",
                rule.limit_app,
                seen.describe()
            ));
        }
    }

    // Which node is compared (strategy).
    match rule.strategy {
        FlowStrategy::Direct => f.current = who_stats.as_ref().map(|s| flow_value(rule.grade, s)),
        FlowStrategy::Relate => {
            let r = rule.ref_resource.as_deref().unwrap_or("");
            f.reads = format!("{}; compared: the cluster node of the related resource `{r}`", f.reads);
            match engine.cluster_stats(r) {
                Some(s) => f.current = Some(flow_value(rule.grade, &s)),
                None => {
                    f.applies = false;
                    f.problems.push(format!(
                        "the related resource `{r}` does not exist yet (never entered): the rule passes until it does"
                    ));
                }
            }
        }
        FlowStrategy::Chain => {
            let ctx = rule.ref_resource.as_deref().unwrap_or("");
            f.reads = format!("{}; compared: the node of `{resource}` in context `{ctx}`", f.reads);
            match engine.context_stats(resource, ctx) {
                Some(s) => f.current = Some(flow_value(rule.grade, &s)),
                None => {
                    f.applies = false;
                    f.problems.push(format!(
                        "`{resource}` was never entered in context `{ctx}` (entered in: {}): a chain rule only \
                         limits calls made through that entrance context",
                        if contexts.is_empty() { "none".to_string() } else { contexts.join(", ") }
                    ));
                }
            }
        }
    }

    if rule.cluster_mode {
        cluster::explain_mode(&mut f, rule, cluster_state);
    }
    if matches!(rule.control_behavior, ControlBehavior::WarmUp | ControlBehavior::WarmUpRateLimiter) {
        f.problems.push(format!(
            "note: warm-up starts at about count / {} per second and reaches {} over {} s of sustained traffic",
            rule.cold_factor, rule.count, rule.warm_up_period_sec
        ));
    }
    f
}
