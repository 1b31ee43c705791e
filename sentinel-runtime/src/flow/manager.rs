//! The flow rules' manager: validates and loads rule sets, compiles each resource's rules
//! ([`ResourceFlowRules`]) and keeps the cluster token service.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::error::{RuleError, RuleKind};
use crate::flow::rule::{ControlBehavior, FlowGrade, FlowRule, FlowStrategy};
use crate::flow::{controller, token_service, ClusterRuleStatus, FlowRuleState, ResourceFlowRules};
use crate::pattern::{Compiler, Patterns};
use crate::slot::toolkit::{group_reusing, Matched, RuleList};
use crate::LIMIT_APP_DEFAULT;

/// Holds the flow rules.
#[derive(Default)]
pub(crate) struct FlowManager {
    set: ArcSwap<FlowRuleSet>,
    rules: RuleList<FlowRule>,
    /// The cluster token service, if one is registered.
    cluster: token_service::Registration,
}

/// The compiled flow rules of one load.
#[derive(Default)]
struct FlowRuleSet {
    /// Rules naming their resource exactly.
    exact: HashMap<String, Arc<ResourceFlowRules>>,
    /// Regex rules, by pattern.
    patterns: Patterns<FlowRule>,
    /// The rules of each resource that matches a pattern (its exact rules, then its own state of every
    /// matching regex rule), resolved when the resource is created or the set loads.
    matched: Matched<ResourceFlowRules>,
    /// Resources that relate rules read (`ref_resource` of the relate strategy).
    related: HashSet<String>,
    /// Contexts that chain rules read (`ref_resource` of the chain strategy).
    chained: HashSet<String>,
}

impl FlowRuleSet {
    /// The rules of `name` when it matches a pattern: its exact rules, then a state of its own for each
    /// matching regex rule (reusing the state in `old` of an equal rule, so a reload keeps it).
    fn resolve(&self, name: &str, old: Option<&ResourceFlowRules>) -> Option<Arc<ResourceFlowRules>> {
        let mut hits = self.patterns.matching(name).peekable();
        hits.peek()?;
        let mut rules: Vec<Arc<FlowRuleState>> = self.exact.get(name).map(|e| e.rules.clone()).unwrap_or_default();
        for (_, rule) in hits {
            let reused = old.and_then(|o| o.rules.iter().find(|s| *s.rule == *rule).cloned());
            rules.push(reused.unwrap_or_else(|| Arc::new(FlowRuleState::new(rule.clone()))));
        }
        Some(Arc::new(ResourceFlowRules::new(rules)))
    }
}

/// Checks one flow rule; the first invalid field is reported.
pub(crate) fn validate(rule: &FlowRule, index: usize) -> Result<(), RuleError> {
    let bad = |field, reason: &str| Err(RuleError::invalid(RuleKind::Flow, index, &rule.resource, field, reason));
    if rule.resource.trim().is_empty() {
        return bad("resource", "must not be blank");
    }
    if rule.limit_app == crate::UNTRACKED_ORIGIN {
        return bad("limit_app", "names the reserved origin of untracked callers; choose another name");
    }
    if !rule.count.is_finite() || rule.count < 0.0 {
        return bad("count", "must be a finite number >= 0");
    }
    if matches!(rule.strategy, FlowStrategy::Relate | FlowStrategy::Chain)
        && rule.ref_resource.as_deref().is_none_or(|r| r.trim().is_empty())
    {
        return bad("ref_resource", "is required by the relate and chain strategies");
    }
    let warm = matches!(rule.control_behavior, ControlBehavior::WarmUp | ControlBehavior::WarmUpRateLimiter);
    let queue = matches!(rule.control_behavior, ControlBehavior::RateLimiter | ControlBehavior::WarmUpRateLimiter);
    if rule.grade == FlowGrade::Qps && warm {
        if rule.warm_up_period_sec == 0 {
            return bad("warm_up_period_sec", "must be > 0 for warm-up behaviours");
        }
        if rule.cold_factor <= 1 {
            return bad("cold_factor", "must be > 1");
        }
        if rule.count < 1.0 {
            // Java accepts it and then admits nothing at all (its cold rate is under one call per second).
            return bad("count", "must be >= 1 for warm-up behaviours (one call per second at least)");
        }
        if rule.count * rule.warm_up_period_sec as f64 > controller::MAX_WARM_UP_TOKENS {
            return bad(
                "count",
                &format!(
                    "times warm_up_period_sec must be at most 2^52 ({}) for the warm-up token bucket",
                    controller::MAX_WARM_UP_TOKENS
                ),
            );
        }
    }
    // As Java's `FlowRuleUtil.checkControlBehaviorField` (a rule that may never queue is a reject rule).
    if rule.grade == FlowGrade::Qps && queue && rule.max_queueing_time_ms == 0 {
        return bad(
            "max_queueing_time_ms",
            "must be > 0 for queueing behaviours (use the reject behaviour to never wait)",
        );
    }
    if rule.grade == FlowGrade::Qps && queue && rule.count > 0.0 && rule.count < controller::MIN_RATE_LIMITER_QPS {
        return bad(
            "count",
            &format!(
                "is below the slowest rate the rate limiter can space ({:e} per second: one call per 584 years)",
                controller::MIN_RATE_LIMITER_QPS
            ),
        );
    }
    if rule.cluster_mode && rule.regex {
        return bad(
            "cluster_mode",
            "cannot be combined with regex: one cluster flow id cannot count each matching resource separately",
        );
    }
    if rule.cluster_mode {
        let Some(c) = &rule.cluster_config else {
            return bad("cluster_config", "is required when cluster_mode is on");
        };
        if c.flow_id == Some(0) {
            return bad("cluster_config.flow_id", "must be > 0 (or absent: the rule is then keyed by its resource)");
        }
        if c.sample_count == 0 {
            return bad("cluster_config.sample_count", "must be > 0");
        }
        if c.window_interval_ms == 0 {
            return bad("cluster_config.window_interval_ms", "must be > 0");
        }
        if c.expected_instances == Some(0) {
            return bad("cluster_config.expected_instances", "must be > 0 (or absent)");
        }
        if c.window_interval_ms % c.sample_count as u64 != 0 {
            return bad(
                "cluster_config.window_interval_ms",
                "must be a multiple of sample_count (the window is split into equal buckets)",
            );
        }
        if rule.grade != FlowGrade::Qps {
            return bad("grade", "cluster mode limits QPS only; use a local rule for concurrency");
        }
        if rule.control_behavior != ControlBehavior::Reject {
            return bad(
                "control_behavior",
                "cluster mode admits or rejects (as Java's token server does); use Reject in cluster mode",
            );
        }
        if rule.strategy == FlowStrategy::Relate {
            return bad(
                "strategy",
                "cluster mode counts the rule's own calls; relate is not supported in cluster mode",
            );
        }
    }
    Ok(())
}

fn normalize(mut rule: FlowRule) -> FlowRule {
    if rule.limit_app.trim().is_empty() {
        rule.limit_app = LIMIT_APP_DEFAULT.to_string();
    }
    rule
}

impl FlowManager {
    /// Validates and replaces the rule set; `Ok(false)` when it equals the one in force.
    pub(crate) fn load(&self, rules: Vec<FlowRule>) -> Result<bool, RuleError> {
        let old = self.set.load_full();
        let compiler = Compiler::new(RuleKind::Flow, &old.patterns);
        let check = |rule: &FlowRule, index: usize| {
            validate(rule, index)?;
            if rule.regex {
                compiler.check(index, &rule.resource)?;
            }
            Ok(())
        };
        self.rules.replace(rules, check, normalize, |unique| self.install(unique, &old, &compiler))
    }

    /// Registers (or removes) the cluster token service: cluster rules in force get leases from it (rules
    /// whose leases came from another service are rebuilt). The caller refreshes the resources' rules.
    #[cfg_attr(not(feature = "cluster-redis"), allow(dead_code))]
    pub(crate) fn set_cluster_service(
        &self,
        service: Option<Arc<dyn token_service::TokenService>>,
    ) -> Result<(), RuleError> {
        self.cluster.set(service);
        self.rules.reinstall(|unique| {
            let old = self.set.load_full();
            let compiler = Compiler::new(RuleKind::Flow, &old.patterns);
            for (index, rule) in unique.iter().enumerate().filter(|(_, r)| r.regex) {
                compiler.check(index, &rule.resource)?;
            }
            self.install(unique, &old, &compiler)
        })
    }

    /// The cluster token service, if one is registered.
    pub(crate) fn cluster_service(&self) -> Option<Arc<dyn token_service::TokenService>> {
        self.cluster.service()
    }

    /// The state of every cluster-mode rule in force, in rule order.
    pub(crate) fn cluster_status(&self, now_ms: u64) -> Vec<ClusterRuleStatus> {
        let set = self.set.load();
        self.rules
            .get()
            .into_iter()
            .filter(|r| r.cluster_mode)
            .map(|r| {
                let state = set.exact.get(&r.resource).and_then(|rs| rs.rules.iter().find(|s| *s.rule == r).cloned());
                match state.as_ref().and_then(|s| s.lease.get()) {
                    Some(lease) => lease.status(now_ms),
                    None => token_service::ClusterRuleStatus::without_service(r),
                }
            })
            .collect()
    }

    /// Compiles and publishes `unique` (validated, deduplicated), reusing the states of equal rules of `old`.
    fn install(
        &self,
        unique: &[FlowRule],
        old: &FlowRuleSet,
        compiler: &Compiler<'_, FlowRule>,
    ) -> Result<(), RuleError> {
        let service = self.cluster.service();
        // A state keeps its lease only while the lease comes from the service registered now.
        let reusable = |s: &FlowRuleState| match (s.lease.get(), &service) {
            (None, _) => true,
            (Some(l), Some(svc)) => token_service::bound_to(l, svc),
            (Some(_), None) => false,
        };
        let (regex, exact): (Vec<&FlowRule>, Vec<&FlowRule>) = unique.iter().partition(|r| r.regex);
        let by_resource = group_reusing(
            exact.iter().copied(),
            |r| &r.resource,
            |name| {
                old.exact
                    .get(name)
                    .map(|rs| rs.rules.iter().filter(|s| reusable(s)).cloned().collect())
                    .unwrap_or_default()
            },
            |s| &*s.rule,
            |r| FlowRuleState::new(r.clone()),
        );
        if let Some(svc) = &service {
            // Cluster rules are exact (validation refuses regex ones).
            for st in by_resource.values().flatten().filter(|s| s.rule.cluster_mode) {
                token_service::lease_for(&st.lease, &st.rule, svc, unique);
            }
        }
        let exact = by_resource.into_iter().map(|(name, rules)| (name, Arc::new(ResourceFlowRules::new(rules))));
        let compiled = compiler.finish();
        let referenced = |strategy: FlowStrategy| {
            unique.iter().filter(|r| r.strategy == strategy).filter_map(|r| r.ref_resource.clone()).collect()
        };
        let (related, chained) = (referenced(FlowStrategy::Relate), referenced(FlowStrategy::Chain));
        let mut set = FlowRuleSet {
            exact: exact.collect(),
            patterns: Patterns::group(regex.into_iter().map(|r| (r.resource.as_str(), r.clone())), &compiled),
            matched: Matched::default(),
            related,
            chained,
        };
        // Resolve again the resources that matched a pattern, keeping the state of rules that stay.
        set.matched = Matched::resolved_again(&old.matched, |name, rules| set.resolve(name, Some(rules)));
        self.set.store(Arc::new(set));
        Ok(())
    }

    pub(crate) fn rules(&self) -> Vec<FlowRule> {
        self.rules.get()
    }

    /// The rules of the resource `name`, exact and matched (resolved once per resource and rule set: called
    /// when the resource is created and when rules change, never per call).
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceFlowRules>> {
        let set = self.set.load();
        set.matched.for_resource(name, !set.patterns.is_empty(), &set.exact, |name| set.resolve(name, None))
    }

    /// Whether a rule names `name` exactly or a relate rule reads it; the patterns of regex rules that match
    /// it are added to `matched` (nothing is resolved or kept).
    pub(crate) fn targets(&self, name: &str, matched: &mut Vec<(RuleKind, Arc<str>)>) -> bool {
        let set = self.set.load();
        matched.extend(set.patterns.sources_matching(name).map(|p| (RuleKind::Flow, p.clone())));
        set.exact.contains_key(name) || set.related.contains(name)
    }

    /// Whether a chain rule reads the context `name` (its `ref_resource`).
    pub(crate) fn chains_through(&self, name: &str) -> bool {
        self.set.load().chained.contains(name)
    }

    /// Whether the regex rule pattern `pattern` of the set in force matches `name`.
    pub(crate) fn pattern_matches(&self, pattern: &str, name: &str) -> bool {
        self.set.load().patterns.get(pattern).is_some_and(|p| p.matches(name))
    }
}

impl crate::slot::toolkit::DedupKey for crate::flow::FlowRule {
    fn dedup_key<H: std::hash::Hasher>(&self, h: &mut H) {
        std::hash::Hash::hash(&(&self.resource, &self.limit_app), h);
        crate::slot::toolkit::hash_f64(self.count, h);
    }
    /// Rules that differ only in their id or their cold factor are one rule (Java's `FlowRule.equals` leaves
    /// both out): the first is kept.
    fn repeats(&self, other: &Self) -> bool {
        if self.id == other.id && self.cold_factor == other.cold_factor {
            self == other
        } else {
            FlowRule { id: other.id, cold_factor: other.cold_factor, ..self.clone() } == *other
        }
    }
}
