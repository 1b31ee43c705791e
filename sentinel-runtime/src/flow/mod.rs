//! Flow control: QPS and concurrency limits with node selection by origin, relation and chain.

mod cluster_status;
mod controller;
#[cfg(feature = "tower")]
pub(crate) mod peek;
pub(crate) mod rule;
pub(crate) mod token_service;

pub use cluster_status::{ClusterRuleMode, ClusterRuleStatus, ClusterServiceInfo};
pub use rule::{
    ClusterConfig, ClusterThresholdType, ControlBehavior, FallbackInstances, FlowGrade, FlowRule, FlowStrategy,
    ASSUMED_INSTANCES,
};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

use crate::error::{BlockError, RuleError, RuleKind};
use crate::pattern::{Compiler, Patterns};
use crate::slot::contract::{CallCx, CheckCx, ExitCx, RelatedStat, RuleSlot, Verdict};
use crate::slot::toolkit::{group_reusing, Matched, RuleList};
use crate::stat::admission::Reservation;
use crate::stat::StatNode;
use crate::{LIMIT_APP_DEFAULT, LIMIT_APP_OTHER};

use controller::{reject_qps, Controller, Decision};

/// Whose calls a rule limits, decided once at load (no string comparison per call for the common kinds).
enum LimitApp {
    Default,
    Other,
    Origin(String),
}

/// A loaded rule with its controller state.
pub(crate) struct FlowRuleState {
    pub(crate) rule: Arc<FlowRule>,
    limit_app: LimitApp,
    controller: Controller,
    /// The related resource, once it exists (relate strategy).
    ref_resource: OnceLock<RelatedStat>,
    /// Registry generation at the last failed lookup of `ref_resource`.
    ref_miss_generation: AtomicUsize,
    /// Cluster mode with a token service registered: the rule's leased tokens.
    pub(crate) lease: OnceLock<Arc<token_service::RuleLease>>,
}

impl FlowRuleState {
    /// A cluster rule (QPS and reject, by validation) for every caller on the resource's own node.
    fn is_cluster_only(&self) -> bool {
        self.rule.cluster_mode
            && self.rule.strategy == FlowStrategy::Direct
            && matches!(self.limit_app, LimitApp::Default)
    }

    fn is_simple(&self) -> bool {
        let r = &*self.rule;
        r.grade == FlowGrade::Qps
            && matches!(self.controller, Controller::Reject)
            && r.strategy == FlowStrategy::Direct
            && matches!(self.limit_app, LimitApp::Default)
            && !r.cluster_mode
    }

    fn new(rule: FlowRule) -> Self {
        let controller = Controller::for_rule(&rule);
        let limit_app = match rule.limit_app.as_str() {
            LIMIT_APP_DEFAULT => LimitApp::Default,
            LIMIT_APP_OTHER => LimitApp::Other,
            app => LimitApp::Origin(app.to_string()),
        };
        FlowRuleState {
            rule: Arc::new(rule),
            limit_app,
            controller,
            ref_resource: OnceLock::new(),
            ref_miss_generation: AtomicUsize::new(usize::MAX),
            lease: OnceLock::new(),
        }
    }
}

/// The flow rules of one resource, specific origins first and `"default"` last.
pub(crate) struct ResourceFlowRules {
    pub(crate) rules: Vec<Arc<FlowRuleState>>,
    /// Origins named by a rule of this resource (an origin named here is not "other").
    named_origins: Vec<String>,
    /// The limit of the resource's only rule when it is a local reject-style QPS limit on its own cluster
    /// node for every origin (the common rule): checked without the general loop.
    simple: Option<f64>,
    /// The resource's only rule is a cluster rule for every caller on the resource's own node: a call with a
    /// leased token in hand is decided without the general loop ([`check_cluster_only`]).
    cluster_only: bool,
}

impl ResourceFlowRules {
    /// The limit of the only rule, when it is simple.
    pub(crate) fn simple_limit(&self) -> Option<f64> {
        self.simple
    }

    /// Whether the only rule is a cluster rule for every caller on the resource's own node.
    pub(crate) fn cluster_only(&self) -> bool {
        self.cluster_only
    }

    /// Whether a rule reads the resource's node in the default context (a chain rule naming it).
    pub(crate) fn reads_default_context(&self) -> bool {
        self.rules.iter().any(|st| {
            st.rule.strategy == FlowStrategy::Chain
                && st.rule.ref_resource.as_deref() == Some(crate::DEFAULT_CONTEXT_NAME)
        })
    }
}

/// The flow slot (order -2000): the resource's flow rules, in order; the first that blocks decides.
pub(crate) struct FlowSlot;

impl RuleSlot for FlowSlot {
    type Rules = ResourceFlowRules;
    type State = ();
    /// Concurrency permits of thread-grade rules.
    type Held = EntryState;
    /// Reservations of QPS rules and tokens of cluster leases.
    type Taken = Scratch;
    const ORDER: i32 = crate::slot::ORDER_FLOW;
    const ON_FAST_PATH: bool = true;

    #[inline(always)]
    fn check(
        rules: &ResourceFlowRules,
        _: &(),
        cx: &CheckCx<'_>,
        held: &mut EntryState,
        taken: &mut Scratch,
    ) -> Result<Verdict, BlockError> {
        check(rules, cx, held, taken)
    }

    /// On the fast path the resource's only flow rule is simple (or it has none that applies).
    #[inline(always)]
    fn check_fast<'c>(
        rules: &ResourceFlowRules,
        _: &(),
        call: &impl Fn() -> CallCx<'c>,
        _: &mut u64,
    ) -> Result<(), BlockError> {
        match rules.simple {
            Some(limit) => check_simple_only(rules, limit, &call()),
            None => Ok(()),
        }
    }

    #[inline(always)]
    fn give_back(_: &ResourceFlowRules, _: &(), cx: &CheckCx<'_>, held: &mut EntryState, taken: &mut Scratch) {
        taken.release();
        held.release_permits(cx.acquire);
    }

    #[inline(always)]
    fn holds(held: &EntryState) -> bool {
        held.is_active()
    }

    #[inline(always)]
    fn exit(_: Option<&ResourceFlowRules>, _: &(), cx: &ExitCx, held: &mut EntryState) {
        held.release_permits(cx.acquire);
    }
}

const MAX_HELD: usize = 2;

/// Concurrency permits an entry holds until it exits (each of the entry's acquire count).
#[derive(Debug, Default)]
pub(crate) struct EntryState {
    permits: [Option<NodePtr>; MAX_HELD],
}

/// Reservations taken while deciding an entry: given back if a later check blocks it.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    reservations: [Option<(NodePtr, Reservation)>; MAX_HELD],
    /// Tokens taken from cluster leases: the lease, its key, the count.
    leased: [Option<(std::ptr::NonNull<token_service::RuleLease>, u64, u32)>; MAX_HELD],
}

impl Scratch {
    fn push_leased(&mut self, lease: &token_service::RuleLease, key: u64, n: u32) {
        if let Some(slot) = self.leased.iter_mut().find(|s| s.is_none()) {
            *slot = Some((std::ptr::NonNull::from(lease), key, n));
        }
    }
    fn held(&mut self, node: &StatNode) -> Option<&mut Reservation> {
        self.reservations.iter_mut().flatten().find(|(p, _)| std::ptr::eq(p.0.as_ptr(), node)).map(|(_, r)| r)
    }
    fn push_reservation(&mut self, node: &StatNode, r: Reservation) {
        if let Some(slot) = self.reservations.iter_mut().find(|s| s.is_none()) {
            *slot = Some((NodePtr::of(node), r));
        }
    }
    fn release(&mut self) {
        for r in self.reservations.iter_mut() {
            if let Some((p, res)) = r.take() {
                p.get().admission().release(res);
            }
        }
        for t in self.leased.iter_mut() {
            if let Some((p, key, n)) = t.take() {
                // SAFETY: a lease lives as long as its rule state, which the check being undone holds.
                unsafe { p.as_ref() }.release(key, n as u64);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodePtr(std::ptr::NonNull<StatNode>);

impl NodePtr {
    fn of(node: &StatNode) -> NodePtr {
        NodePtr(std::ptr::NonNull::from(node))
    }
    /// SAFETY: every node lives as long as its engine, and an entry keeps its engine alive.
    fn get(&self) -> &StatNode {
        unsafe { self.0.as_ref() }
    }
}

impl EntryState {
    pub(crate) fn is_active(&self) -> bool {
        self.permits[0].is_some()
    }
    fn has_permit(&self, node: &StatNode) -> bool {
        self.permits.iter().flatten().any(|p| std::ptr::eq(p.0.as_ptr(), node))
    }
    fn push_permit(&mut self, node: &StatNode) -> bool {
        match self.permits.iter_mut().find(|s| s.is_none()) {
            Some(slot) => {
                *slot = Some(NodePtr::of(node));
                true
            }
            None => false,
        }
    }
    /// Gives back the permits (each of `n`, the entry's acquire count).
    pub(crate) fn release_permits(&mut self, n: u32) {
        for s in self.permits.iter_mut() {
            if let Some(p) = s.take() {
                p.get().release_thread_permit(n);
            }
        }
    }
}

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

impl ResourceFlowRules {
    /// One resource's rules: specific origins (and "other") before "default", keeping the given order
    /// otherwise (Java's `FlowRuleComparator`).
    fn new(mut rules: Vec<Arc<FlowRuleState>>) -> Self {
        rules.sort_by_key(|s| s.rule.limit_app == LIMIT_APP_DEFAULT);
        let named_origins = rules
            .iter()
            .map(|s| s.rule.limit_app.clone())
            .filter(|a| a != LIMIT_APP_DEFAULT && a != LIMIT_APP_OTHER)
            .collect();
        let simple = (rules.len() == 1 && rules[0].is_simple()).then(|| rules[0].rule.count);
        let cluster_only = rules.len() == 1 && rules[0].is_cluster_only();
        ResourceFlowRules { rules, named_origins, simple, cluster_only }
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
    // `max_queueing_time_ms = 0` is valid (strict spacing, never wait), as in Java.
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
                token_service::lease_for(&st.lease, &st.rule, svc);
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

    /// Whether a relate rule reads the resource `name` (its `ref_resource`).
    pub(crate) fn relates_to(&self, name: &str) -> bool {
        self.set.load().related.contains(name)
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

impl ResourceFlowRules {
    /// The origins the rules name in `limit_app` (neither `default` nor `other`).
    pub(crate) fn named_origins(&self) -> &[String] {
        &self.named_origins
    }
}

/// A check that only reads a node: `retry_after` is computed only when it blocks.
#[inline(always)]
fn read_only(pass: bool, retry_after: impl FnOnce() -> Option<std::time::Duration>) -> Decision {
    if pass {
        Decision::Pass { reservation: None, wait_nanos: 0 }
    } else {
        Decision::Block { retry_after: retry_after() }
    }
}

/// Java's `FlowRuleChecker.selectNodeByRequesterAndStrategy`.
#[inline]
fn select_node<'a>(st: &'a FlowRuleState, rules: &ResourceFlowRules, cx: &'a CheckCx<'a>) -> Option<&'a StatNode> {
    let direct = st.rule.strategy == FlowStrategy::Direct;
    let origin: &str = cx.origin;
    let applies = match &st.limit_app {
        LimitApp::Default => return if direct { Some(cx.cluster) } else { reference_node(st, cx) },
        LimitApp::Origin(app) => !origin.is_empty() && app == origin,
        LimitApp::Other => !origin.is_empty() && !rules.named_origins.iter().any(|o| o == origin),
    };
    if !applies {
        return None;
    }
    if direct {
        cx.origin_node
    } else {
        reference_node(st, cx)
    }
}

fn reference_node<'a>(st: &'a FlowRuleState, cx: &'a CheckCx<'a>) -> Option<&'a StatNode> {
    let r = st.rule.ref_resource.as_deref()?;
    match st.rule.strategy {
        FlowStrategy::Relate => {
            if let Some(res) = st.ref_resource.get() {
                return Some(res.stat());
            }
            let generation = cx.resources.generation();
            if st.ref_miss_generation.load(Ordering::Relaxed) == generation {
                return None;
            }
            match cx.resources.related(r) {
                Some(res) => Some(st.ref_resource.get_or_init(|| res).stat()),
                None => {
                    st.ref_miss_generation.store(generation, Ordering::Relaxed);
                    None
                }
            }
        }
        FlowStrategy::Chain => (cx.context_name == r).then_some(cx.node),
        FlowStrategy::Direct => None,
    }
}

/// Checks the resource's flow rules in order; the first that blocks decides.
pub(crate) fn check(
    rules: &ResourceFlowRules,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
    scratch: &mut Scratch,
) -> Result<Verdict, BlockError> {
    if let Some(limit) = rules.simple_limit() {
        return check_simple(rules, limit, cx, es, scratch);
    }
    let mut wait_nanos = 0u64;
    for st in &rules.rules {
        let rule = &*st.rule;
        if rule.cluster_mode {
            if let Some(lease) = st.lease.get() {
                let Some(node) = select_node(st, rules, cx) else {
                    continue;
                };
                let decision = lease.check(node, cx, scratch);
                if let Some(r) = apply(decision, st, node, cx, es, scratch, &mut wait_nanos) {
                    return r;
                }
                continue;
            }
            if !token_service::no_service(rule) {
                // No token service: cluster rules without local fallback pass (Java's behaviour).
                continue;
            }
        }
        let Some(node) = select_node(st, rules, cx) else {
            continue;
        };
        // A relate rule reads another resource's node: its traffic is not admitted here, so the rule can only
        // read it. Every other node is entered only through this resource's rules and is reserved exactly.
        let owned = rule.strategy != FlowStrategy::Relate;
        let decision = match rule.grade {
            // Concurrency frees up when calls finish: no retry time is known.
            FlowGrade::Thread if !owned => {
                read_only(node.cur_threads() as f64 + cx.acquire as f64 <= rule.count, || None)
            }
            FlowGrade::Thread => {
                if es.has_permit(node) {
                    read_only(node.thread_permits() as f64 <= rule.count, || None)
                } else if node.try_thread_permit(cx.acquire, rule.count) {
                    Decision::ThreadPermit
                } else {
                    Decision::Block { retry_after: None }
                }
            }
            FlowGrade::Qps => match &st.controller {
                Controller::Reject if !owned => {
                    read_only(node.pass_qps(cx.now_ms) + cx.acquire as f64 <= rule.count, || {
                        node.qps_retry_after(cx.now_ms, cx.acquire, rule.count, true)
                    })
                }
                Controller::Reject => {
                    reject_qps(node, cx.now_ms, cx.acquire, rule.count, cx.prioritized, scratch.held(node))
                }
                Controller::WarmUp(w) => {
                    w.sync(cx.now_ms, node);
                    if owned {
                        reject_qps(node, cx.now_ms, cx.acquire, w.allowed_qps(), false, scratch.held(node))
                    } else {
                        let allowed = w.allowed_qps();
                        read_only(node.pass_qps(cx.now_ms) + cx.acquire as f64 <= allowed, || {
                            node.qps_retry_after(cx.now_ms, cx.acquire, allowed, true)
                        })
                    }
                }
                Controller::RateLimiter(t) => t.acquire(cx.clock.precise_nanos(), cx.acquire, rule.count),
                Controller::WarmUpRateLimiter(w, t) => {
                    w.sync(cx.now_ms, node);
                    t.acquire(cx.clock.precise_nanos(), cx.acquire, w.allowed_qps())
                }
            },
        };
        if let Some(r) = apply(decision, st, node, cx, es, scratch, &mut wait_nanos) {
            return r;
        }
    }
    Ok(Verdict::Pass { wait_nanos })
}

/// The check of a resource whose only rule is simple (see [`ResourceFlowRules::simple_limit`]), without the
/// general rule loop.
#[inline(always)]
fn check_simple(
    rules: &ResourceFlowRules,
    limit: f64,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
    scratch: &mut Scratch,
) -> Result<Verdict, BlockError> {
    let node = cx.cluster;
    match reject_qps(node, cx.now_ms, cx.acquire, limit, cx.prioritized, None) {
        Decision::Pass { reservation, wait_nanos } => {
            if let Some(r) = reservation {
                scratch.push_reservation(node, r);
            }
            Ok(Verdict::Pass { wait_nanos })
        }
        decision => {
            let mut wait_nanos = 0u64;
            match apply(decision, &rules.rules[0], node, cx, es, scratch, &mut wait_nanos) {
                Some(r) => r,
                None => Ok(Verdict::Pass { wait_nanos }),
            }
        }
    }
}

/// The whole check of a resource whose only rule of any kind is one simple flow rule (`limit`, the only rule
/// of `rules`), for a call that is not prioritized.
#[inline(always)]
pub(crate) fn check_simple_only(rules: &ResourceFlowRules, limit: f64, call: &CallCx<'_>) -> Result<(), BlockError> {
    let (now_ms, acquire) = (call.now_ms, call.acquire);
    // `reject_qps` without a held reservation and not prioritized, reduced to the reservation itself: going
    // through it (and its `Decision`) measured 1.5 ns more per call on this path.
    let node = call.cluster;
    match node.admission().try_reserve(now_ms, acquire, limit, &|start| node.borrowed_at(start)) {
        Some(_) => Ok(()),
        // The block is built from two of the call's fields, not from `call`: passing `call` to the cold
        // function would make the fast path store the whole call view on the stack first.
        None => Err(simple_only_block(
            rules,
            call.resource,
            call.origin,
            node.qps_retry_after(now_ms, acquire, limit, false),
        )),
    }
}

/// The whole check of a resource whose only rule is a cluster rule for every caller (and only closed
/// breakers), for a call that is not prioritized: true when a leased token paid for it. Anything else (no
/// token in hand, no token service) takes the general path, which waits, falls back or blocks.
#[inline(always)]
pub(crate) fn check_cluster_only(rules: &ResourceFlowRules, now_ms: u64, acquire: u32) -> bool {
    match rules.rules[0].lease.get() {
        Some(lease) => lease.take_in_hand(now_ms, acquire),
        None => false,
    }
}

#[cold]
fn simple_only_block(
    rules: &ResourceFlowRules,
    resource: &Arc<str>,
    origin: &Arc<str>,
    retry_after: Option<std::time::Duration>,
) -> BlockError {
    // A simple rule set holds exactly one rule.
    BlockError::Flow {
        resource: resource.clone(),
        rule: rules.rules[0].rule.clone(),
        origin: origin.clone(),
        retry_after,
    }
}

/// Acts on one rule's decision: `Some` ends the check (occupied or blocked), `None` goes on to the next rule.
#[inline(always)]
fn apply(
    decision: Decision,
    st: &FlowRuleState,
    node: &StatNode,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
    scratch: &mut Scratch,
    wait_nanos: &mut u64,
) -> Option<Result<Verdict, BlockError>> {
    match decision {
        Decision::Pass { reservation, wait_nanos: w } => {
            if let Some(r) = reservation {
                scratch.push_reservation(node, r);
            }
            *wait_nanos += w;
            None
        }
        Decision::ThreadPermit => {
            if !es.push_permit(node) {
                node.release_thread_permit(cx.acquire);
            }
            None
        }
        Decision::Occupied { wait_nanos: w } => {
            scratch.release();
            es.release_permits(cx.acquire);
            Some(Ok(Verdict::Occupied { wait_nanos: *wait_nanos + w }))
        }
        Decision::Block { retry_after } => {
            scratch.release();
            es.release_permits(cx.acquire);
            Some(Err(BlockError::Flow {
                resource: cx.resource.clone(),
                rule: st.rule.clone(),
                origin: cx.origin.clone(),
                retry_after,
            }))
        }
    }
}

impl StatNode {
    fn try_thread_permit(&self, n: u32, limit: f64) -> bool {
        self.thread_gate.try_acquire(n, limit)
    }
    fn release_thread_permit(&self, n: u32) {
        self.thread_gate.release(n)
    }
    fn thread_permits(&self) -> u64 {
        self.thread_gate.permits()
    }
}

impl crate::slot::toolkit::DedupKey for crate::flow::FlowRule {
    fn dedup_key<H: std::hash::Hasher>(&self, h: &mut H) {
        std::hash::Hash::hash(&(&self.resource, &self.limit_app), h);
        crate::slot::toolkit::hash_f64(self.count, h);
    }
}
