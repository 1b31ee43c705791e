//! "Why didn't my rule fire?": [`Sentinel::diagnose`] reports, for one resource, whether it is registered and
//! was entered, which rules apply and which node each reads (explaining origin / `limit_app` mismatches),
//! the current numbers against each threshold, whether degrade rules can trip at the recent rate, and
//! whether errors are traced. `Display` prints it for a person.
//!
//! ```
//! use sentinel_runtime::{Sentinel, flow::FlowRule};
//! let engine = Sentinel::builder().build();
//! engine.load_flow_rules(vec![FlowRule::new("api").count(1.0).limit_app("appA")]).unwrap();
//! for _ in 0..3 {
//!     drop(engine.enter("api").unwrap()); // no origin: the rule for `appA` never applies
//! }
//! let d = engine.diagnose("api");
//! assert!(!d.flow[0].applies);
//! println!("{d}");
//! ```

use std::fmt;

use crate::circuit_breaker::{BreakerSnapshot, BreakerState, DegradeGrade, DegradeRule};
use crate::flow::{ClusterRuleMode, ClusterRuleStatus, ControlBehavior, FlowGrade, FlowRule, FlowStrategy};
use crate::{NodeStats, RuleKind, Sentinel, LIMIT_APP_DEFAULT, LIMIT_APP_OTHER};

/// What the diagnosis found about one rule.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleFinding {
    /// The rule's kind.
    pub kind: RuleKind,
    /// The rule's position in its kind's rule list.
    pub index: usize,
    /// The rule in words.
    pub summary: String,
    /// Which node (statistics) the rule reads.
    pub reads: String,
    /// The number the rule compares now (qps, threads, ratio...), when there is one.
    pub current: Option<f64>,
    /// The rule's threshold, when it has one.
    pub threshold: Option<f64>,
    /// Whether any call seen so far is subject to the rule (false: it cannot have fired).
    pub applies: bool,
    /// Reasons the rule does not (or cannot) fire, each with what to do.
    pub problems: Vec<String>,
    /// For a `regex` rule: the pattern that matched the resource's name (see [`crate::pattern`]).
    pub pattern: Option<String>,
}

/// Whether errors reach the statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorTracing {
    /// Completions over the last minute.
    pub completions: u64,
    /// Of which with a traced error.
    pub exceptions: u64,
    /// A hint when no error was traced.
    pub hint: Option<String>,
}

pub use crate::config::Caps;

/// A report on one resource. See [`Sentinel::diagnose`].
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnosis {
    /// The resource.
    pub resource: String,
    /// Whether the engine knows the resource (a handle was created or it was entered).
    pub registered: bool,
    /// Whether it was ever entered.
    pub ever_entered: bool,
    /// The contexts it was entered in.
    pub contexts: Vec<String>,
    /// Its numbers over all callers (cluster node).
    pub stats: Option<NodeStats>,
    /// Its callers with an origin, and their numbers.
    pub origins: Vec<(String, NodeStats)>,
    /// Calls (passed + blocked) over the last minute that came without an origin.
    pub calls_without_origin: u64,
    /// Flow rules of the resource.
    pub flow: Vec<RuleFinding>,
    /// Degrade rules of the resource.
    pub degrade: Vec<RuleFinding>,
    /// The circuit breakers that apply to the resource and their states ([`Sentinel::circuit_breakers`]).
    pub breakers: Vec<BreakerSnapshot>,
    /// Hot-parameter rules of the resource.
    pub param_flow: Vec<RuleFinding>,
    /// Authority rules of the resource.
    pub authority: Vec<RuleFinding>,
    /// System rules (they apply to inbound entries of every resource).
    pub system: Vec<RuleFinding>,
    /// Whether errors are traced.
    pub errors: ErrorTracing,
    /// Other observations.
    pub notes: Vec<String>,
    /// The resource's cluster-mode flow rules: how each is decided now and why ([`Sentinel::cluster_status`]).
    pub cluster: Vec<ClusterRuleStatus>,
    /// Where the engine stands against its caps on names ([`Sentinel::caps`]).
    pub caps: Caps,
}

fn origin_label(o: &str) -> String {
    if o.is_empty() {
        "`` (no origin)".to_string()
    } else {
        format!("`{o}`")
    }
}

fn calls(s: &NodeStats) -> u64 {
    s.minute_pass + s.minute_block
}

struct Seen<'a> {
    origins: &'a [(String, NodeStats)],
    without_origin: u64,
}

impl Seen<'_> {
    fn describe(&self) -> String {
        let mut parts: Vec<String> =
            self.origins.iter().map(|(o, s)| format!("{} ({} calls)", origin_label(o), calls(s))).collect();
        if self.without_origin > 0 {
            parts.insert(0, format!("{} ({} calls)", origin_label(""), self.without_origin));
        }
        if parts.is_empty() {
            "no calls in the last minute".to_string()
        } else {
            format!("calls in the last minute came from {}", parts.join(", "))
        }
    }
    fn get(&self, origin: &str) -> Option<&NodeStats> {
        self.origins.iter().find(|(o, _)| o == origin).map(|(_, s)| s)
    }
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
        .filter(|r| engine.flow_rule_applies(r, resource))
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
    if matches!(rule.control_behavior, ControlBehavior::WarmUp | ControlBehavior::WarmUpRateLimiter) {
        f.problems.push(format!(
            "note: warm-up starts at about count / {} per second and reaches {} over {} s of sustained traffic",
            rule.cold_factor, rule.count, rule.warm_up_period_sec
        ));
    }
    f
}

fn degrade_finding(
    index: usize,
    rule: &DegradeRule,
    stats: Option<&NodeStats>,
    breaker: Option<&BreakerSnapshot>,
    now_ms: u64,
) -> RuleFinding {
    let interval_s = f64::from(rule.stat_interval_ms.max(1)) / 1000.0;
    let (summary, current) = match rule.grade {
        DegradeGrade::SlowRequestRatio => (
            format!(
                "slow-call ratio: open for {} s when more than {} of calls in {} ms take over {} ms",
                rule.time_window_sec, rule.slow_ratio_threshold, rule.stat_interval_ms, rule.count
            ),
            stats.map(|s| s.avg_rt_ms),
        ),
        DegradeGrade::ErrorRatio => (
            format!(
                "error ratio: open for {} s when more than {} of calls in {} ms fail",
                rule.time_window_sec, rule.count, rule.stat_interval_ms
            ),
            stats.map(|s| if s.success_qps > 0.0 { s.exception_qps / s.success_qps } else { 0.0 }),
        ),
        DegradeGrade::ErrorCount => (
            format!(
                "error count: open for {} s when more than {} calls fail in {} ms",
                rule.time_window_sec, rule.count, rule.stat_interval_ms
            ),
            stats.map(|s| s.exception_qps * interval_s),
        ),
    };
    let mut f = RuleFinding {
        kind: RuleKind::Degrade,
        index,
        summary,
        reads: format!("the cluster node's completed calls, in buckets of {} ms", rule.stat_interval_ms),
        current,
        threshold: Some(rule.count),
        applies: true,
        problems: Vec::new(),
        pattern: rule.regex.then(|| rule.resource.clone()),
    };
    // The breaker's own bucket, when it has one, is what the rule compares.
    let mut from_breaker = false;
    if let Some(b) = breaker {
        let ratio = if b.interval_total == 0 { 0.0 } else { b.interval_bad as f64 / b.interval_total as f64 };
        match rule.grade {
            DegradeGrade::SlowRequestRatio => {
                f.current = Some(ratio);
                f.threshold = Some(rule.slow_ratio_threshold);
            }
            DegradeGrade::ErrorRatio => f.current = Some(ratio),
            DegradeGrade::ErrorCount => f.current = Some(b.interval_bad as f64),
        }
        from_breaker = true;
        match b.state {
            BreakerState::Open => f.problems.push(format!(
                "the breaker is OPEN: calls are blocked for another {} ms, then one probe is let through",
                b.retry_at_ms.map_or(0, |r| r.saturating_sub(now_ms))
            )),
            BreakerState::HalfOpen => f.problems.push(
                "the breaker is HALF_OPEN: one probe call is out; its outcome closes or reopens the breaker".into(),
            ),
            BreakerState::Closed => {}
        }
    }
    if let Some(s) = stats {
        let recent_qps = s.pass_qps.max(s.previous_pass_qps);
        let per_interval = recent_qps * interval_s;
        if per_interval < f64::from(rule.min_request_amount) {
            f.applies = false;
            f.problems.push(format!(
                "min_request_amount {} is not reachable: at the recent {recent_qps:.1} calls/s about {per_interval:.1} \
                 calls complete per {} ms interval, so the breaker cannot trip; lower min_request_amount or \
                 lengthen stat_interval_ms",
                rule.min_request_amount, rule.stat_interval_ms
            ));
        }
        if matches!(rule.grade, DegradeGrade::ErrorRatio | DegradeGrade::ErrorCount)
            && s.minute_exception == 0
            && s.minute_success > 0
        {
            f.problems.push(
                "no error was traced in the last minute: an error-based breaker only sees errors traced on the \
                 entry (an annotated function returning Err, or `entry.trace(&err)` / `set_error()`)"
                    .to_string(),
            );
        }
    } else {
        f.applies = false;
        f.problems.push("the resource was never entered: there is nothing to measure".to_string());
    }
    if rule.grade == DegradeGrade::SlowRequestRatio && !from_breaker {
        f.problems.push(format!(
            "note: the current number is the average rt (ms); the breaker counts calls slower than {} ms",
            rule.count
        ));
    }
    f
}

impl Sentinel {
    /// Whether the flow rule applies to `resource`: it names it, or it is a regex rule whose pattern matches.
    fn flow_rule_applies(&self, rule: &FlowRule, resource: &str) -> bool {
        if rule.regex {
            self.shared.flow.pattern_matches(&rule.resource, resource)
        } else {
            rule.resource == resource
        }
    }

    /// Whether the degrade rule is one of `resource`'s own (named or matched).
    fn degrade_rule_applies(&self, rule: &DegradeRule, resource: &str) -> bool {
        if rule.regex {
            self.shared.degrade.pattern_matches(&rule.resource, resource)
        } else {
            rule.resource == resource
        }
    }

    /// Explains the state of `resource` and its rules: see [the module](crate::diagnose).
    pub fn diagnose(&self, resource: &str) -> Diagnosis {
        let inner = self.shared.find_resource(resource);
        let registered = inner.is_some();
        let nodes = inner.as_ref().map(|r| r.nodes()).unwrap_or_default();
        let ever_entered = !nodes.is_empty();
        let contexts: Vec<String> = nodes
            .iter()
            .filter_map(|n| self.shared.contexts().find(|c| c.id == n.context_id).map(|c| c.name().to_string()))
            .collect();
        let stats = self.cluster_stats(resource);
        // Origins named by rules have a node before any call: only origins that called (in the last minute)
        // were seen.
        let mut origins = self.origins_of(resource);
        origins.retain(|(_, s)| calls(s) > 0);
        let with_origin: u64 = origins.iter().map(|(_, s)| calls(s)).sum();
        let calls_without_origin = stats.as_ref().map(|s| calls(s).saturating_sub(with_origin)).unwrap_or(0);
        let seen = Seen { origins: &origins, without_origin: calls_without_origin };

        let all_flow = self.flow_rules();
        let cluster: Vec<ClusterRuleStatus> =
            self.cluster_status().into_iter().filter(|c| c.rule.resource == resource).collect();
        let flow = all_flow
            .iter()
            .enumerate()
            .filter(|(_, r)| self.flow_rule_applies(r, resource))
            .map(|(i, r)| {
                let c = cluster.iter().find(|c| c.rule == *r);
                flow_finding(self, resource, i, r, &all_flow, &seen, &contexts, c)
            })
            .collect();

        let degrade_rules = self.degrade_rules();
        let own: Vec<(usize, &DegradeRule)> =
            degrade_rules.iter().enumerate().filter(|(_, r)| self.degrade_rule_applies(r, resource)).collect();
        let mut notes = Vec::new();
        let degrade_of: Vec<(usize, &DegradeRule)> = if own.is_empty() {
            let defaults: Vec<(usize, &DegradeRule)> =
                degrade_rules.iter().enumerate().filter(|(_, r)| r.resource == "*").collect();
            if !defaults.is_empty() {
                notes.push(format!("`{resource}` has no degrade rule of its own: the default (`*`) rules apply"));
            }
            defaults
        } else {
            own
        };
        let breakers = self.circuit_breakers(resource);
        let now_ms = self.now_millis();
        let degrade = degrade_of
            .iter()
            .map(|(i, r)| {
                let breaker = breakers.iter().find(|b| *b.rule == **r);
                degrade_finding(*i, r, stats.as_ref(), breaker, now_ms)
            })
            .collect();

        let param_flow = self
            .param_flow_rules()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.resource == resource)
            .map(|(i, r)| RuleFinding {
                kind: RuleKind::ParamFlow,
                index: i,
                summary: format!(
                    "{:?} limit {} per value of argument {} per {} s (burst {}, {} exception items)",
                    r.grade,
                    r.count,
                    r.param_idx,
                    r.duration_in_sec,
                    r.burst_count,
                    r.items.len()
                ),
                reads: format!("per-value counters of argument {}", r.param_idx),
                current: None,
                threshold: Some(r.count),
                applies: ever_entered,
                problems: vec![
                    "note: the rule only sees arguments passed with the entry (`.args(...)`, or the annotated \
                     function's parameters); a call without that argument passes"
                        .to_string(),
                ],
                pattern: None,
            })
            .collect();

        let authority = self
            .authority_rules()
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                if r.regex {
                    self.shared.authority.pattern_matches(&r.resource, resource)
                } else {
                    r.resource == resource
                }
            })
            .map(|(i, r)| {
                let list: Vec<&str> = r.limit_app.split(',').collect();
                let mut problems = Vec::new();
                for o in &list {
                    if o.trim() != *o {
                        problems.push(format!("`{o}` has surrounding spaces: membership is exact, no trimming"));
                    }
                }
                if calls_without_origin > 0 {
                    problems.push(format!(
                        "{calls_without_origin} calls came without an origin: they always pass an authority rule"
                    ));
                }
                let listed = origins.iter().filter(|(o, _)| list.contains(&o.as_str())).count();
                RuleFinding {
                    kind: RuleKind::Authority,
                    index: i,
                    summary: format!("{:?} list `{}`", r.strategy, r.limit_app),
                    reads: "the caller's origin".to_string(),
                    current: None,
                    threshold: None,
                    applies: !origins.is_empty(),
                    problems: {
                        problems.push(format!("{listed} of the {} origins seen are in the list", origins.len()));
                        problems
                    },
                    pattern: r.regex.then(|| r.resource.clone()),
                }
            })
            .collect();

        let inbound = self.inbound_stats();
        let system = self
            .system_rules()
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut limits = Vec::new();
                let mut problems = Vec::new();
                if let Some(q) = r.qps {
                    limits.push(format!("qps {q} (inbound now {:.1})", inbound.pass_qps));
                }
                if let Some(t) = r.max_thread {
                    limits.push(format!("threads {t} (inbound now {})", inbound.threads));
                }
                if let Some(rt) = r.avg_rt {
                    limits.push(format!("avg rt {rt} ms (inbound now {:.1})", inbound.avg_rt_ms));
                }
                if let Some(l) = r.highest_system_load {
                    limits.push(format!("load {l}"));
                }
                if let Some(c) = r.highest_cpu_usage {
                    limits.push(format!("cpu {c}"));
                }
                if inbound.minute_pass + inbound.minute_block == 0 {
                    problems.push(
                        "no inbound call in the last minute: system rules only check entries of type In \
                         (`resource_typed(name, EntryType::In)`, `entry_type = \"in\"`)"
                            .to_string(),
                    );
                }
                RuleFinding {
                    kind: RuleKind::System,
                    index: i,
                    summary: limits.join(", "),
                    reads: "the global inbound node (all In entries)".to_string(),
                    current: None,
                    threshold: None,
                    applies: inbound.minute_pass + inbound.minute_block > 0,
                    problems,
                    pattern: None,
                }
            })
            .collect();

        let (completions, exceptions) =
            stats.as_ref().map(|s| (s.minute_success, s.minute_exception)).unwrap_or((0, 0));
        let hint = (completions > 0 && exceptions == 0).then(|| {
            "no error traced in the last minute: if calls fail, trace them (return Err from an annotated \
             function, or `entry.trace(&err)` / `set_error()` on a manual entry), and check the error filter"
                .to_string()
        });

        if !registered {
            notes.push(format!(
                "`{resource}` is unknown to this engine: no handle was created and it was never entered (check the \
                 name, and that the code runs against this engine: `Sentinel::global()` or a `scoped` one)"
            ));
        } else if !ever_entered {
            notes.push(format!("`{resource}` has a handle but was never entered"));
        }
        let mut known = self.resource_names();
        known.sort();
        if !registered {
            let close: Vec<&String> = known
                .iter()
                .filter(|n| n.eq_ignore_ascii_case(resource) || n.contains(resource) || resource.contains(n.as_str()))
                .collect();
            if !close.is_empty() {
                notes.push(format!(
                    "similar resource names: {}",
                    close.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        if !self.is_enabled() {
            notes.push("checking is switched off for the whole engine (`set_enabled(false)`)".to_string());
        }
        let caps = self.caps();
        if resource == crate::RESOURCE_OVERFLOW {
            notes.push(format!(
                "`{resource}` stands for the new names that no rule named once the resource cap ({}) was reached \
                 ({} handles so far): system rules and rules on `{resource}` check their calls",
                caps.max_resources, caps.resources_overflowed
            ));
        } else if !registered && caps.resource_cap_reached() {
            let ruled = self.has_rules_for(resource);
            notes.push(format!(
                "the resource cap ({} names no rule names) is reached: {}",
                caps.max_resources,
                if ruled {
                    "a rule names this resource, so a handle taken now gets a resource of its own".to_string()
                } else {
                    format!(
                        "a handle on this name is a handle on `{}`, checked by system rules and rules on that name; \
                         a rule naming this resource gives it its own (raise `max_resources` if names are legitimate)",
                        crate::RESOURCE_OVERFLOW
                    )
                }
            ));
        }
        Diagnosis {
            resource: resource.to_string(),
            registered,
            ever_entered,
            contexts,
            stats,
            origins,
            calls_without_origin,
            flow,
            degrade,
            breakers,
            param_flow,
            authority,
            system,
            errors: ErrorTracing { completions, exceptions, hint },
            notes,
            cluster,
            caps,
        }
    }
}

fn write_findings(f: &mut fmt::Formatter<'_>, title: &str, findings: &[RuleFinding]) -> fmt::Result {
    if findings.is_empty() {
        return writeln!(f, "{title}: none");
    }
    writeln!(f, "{title}:")?;
    for r in findings {
        let mark = if r.applies { "" } else { "  [DOES NOT APPLY]" };
        writeln!(f, "  #{} {}{mark}", r.index, r.summary)?;
        if let Some(p) = &r.pattern {
            writeln!(f, "     matched by pattern: `{p}` (regex rule)")?;
        }
        writeln!(f, "     reads: {}", r.reads)?;
        match (r.current, r.threshold) {
            (Some(c), Some(t)) => writeln!(f, "     now: {c:.2} against threshold {t}")?,
            (None, Some(t)) if r.applies => writeln!(f, "     threshold: {t}")?,
            _ => {}
        }
        for p in &r.problems {
            writeln!(f, "     - {p}")?;
        }
    }
    Ok(())
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Diagnosis of resource `{}`", self.resource)?;
        writeln!(
            f,
            "  registered: {}; entered: {}{}",
            if self.registered { "yes" } else { "no" },
            if self.ever_entered { "yes" } else { "never" },
            if self.contexts.is_empty() { String::new() } else { format!(" (contexts: {})", self.contexts.join(", ")) }
        )?;
        writeln!(f, "  caps: {}", self.caps)?;
        if let Some(s) = &self.stats {
            writeln!(
                f,
                "  now: pass {:.1}/s, block {:.1}/s, success {:.1}/s, exception {:.1}/s, avg rt {:.1} ms, {} in flight",
                s.pass_qps, s.block_qps, s.success_qps, s.exception_qps, s.avg_rt_ms, s.threads
            )?;
            writeln!(
                f,
                "  last minute: {} passed, {} blocked, {} completed, {} with errors",
                s.minute_pass, s.minute_block, s.minute_success, s.minute_exception
            )?;
        }
        let mut callers: Vec<String> = Vec::new();
        if self.calls_without_origin > 0 {
            callers.push(format!("{} {} calls", origin_label(""), self.calls_without_origin));
        }
        callers.extend(self.origins.iter().map(|(o, s)| format!("{} {} calls", origin_label(o), calls(s))));
        if !callers.is_empty() {
            writeln!(f, "  callers (last minute): {}", callers.join(", "))?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        write_findings(f, "Flow rules", &self.flow)?;
        for c in &self.cluster {
            writeln!(f, "  {c}")?;
        }
        write_findings(f, "Degrade rules", &self.degrade)?;
        if self.breakers.is_empty() {
            writeln!(f, "Circuit breakers: none")?;
        } else {
            writeln!(f, "Circuit breakers:")?;
            for b in &self.breakers {
                writeln!(
                    f,
                    "  {:?} count {} ({}): {}, {} of {} calls bad in the current interval{}",
                    b.rule.grade,
                    b.rule.count,
                    if b.is_default { "default rule `*`" } else { "own rule" },
                    b.state,
                    b.interval_bad,
                    b.interval_total,
                    b.retry_at_ms.map(|r| format!(", next probe at {r} ms")).unwrap_or_default()
                )?;
            }
        }
        write_findings(f, "Hot-parameter rules", &self.param_flow)?;
        write_findings(f, "Authority rules", &self.authority)?;
        write_findings(f, "System rules", &self.system)?;
        write!(
            f,
            "Errors: {} of {} completions in the last minute had a traced error",
            self.errors.exceptions, self.errors.completions
        )?;
        if let Some(h) = &self.errors.hint {
            write!(f, "\n  - {h}")?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::circuit_breaker::DegradeGrade;
    use crate::clock::ManualClock;

    fn engine() -> (Sentinel, ManualClock) {
        let clock = ManualClock::at_millis(1_700_000_000_000);
        (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
    }

    #[test]
    fn explains_a_flow_rule_for_another_origin() {
        let (engine, _clock) = engine();
        engine.load_flow_rules(vec![FlowRule::new("api").count(1.0).limit_app("appA")]).unwrap();
        for _ in 0..3 {
            assert!(engine.enter("api").is_ok(), "the rule for appA does not limit calls without origin");
        }
        {
            let _ctx = engine.enter_context("web", "appB").unwrap();
            drop(engine.enter("api").unwrap());
        }
        let d = engine.diagnose("api");
        assert!(d.registered && d.ever_entered);
        assert_eq!(d.calls_without_origin, 3);
        assert_eq!(d.flow.len(), 1);
        let f = &d.flow[0];
        assert!(!f.applies);
        assert!(f.problems[0].contains("no call came with origin `appA`"), "{}", f.problems[0]);
        assert!(f.problems[0].contains("`` (no origin) (3 calls)"), "{}", f.problems[0]);
        assert!(f.problems[0].contains("`appB` (1 calls)"), "{}", f.problems[0]);
        let text = d.to_string();
        assert!(text.contains("[DOES NOT APPLY]"), "{text}");
        assert!(text.contains("limit_app \"default\""), "{text}");
        assert!(text.contains("Circuit breakers: none"), "{text}");
    }

    #[test]
    fn a_default_rule_reads_the_cluster_node_with_current_numbers() {
        let (engine, _clock) = engine();
        engine.load_flow_rules(vec![FlowRule::new("api").count(2.0)]).unwrap();
        let api = engine.resource("api");
        let _held: Vec<_> = (0..3).filter_map(|_| api.enter().ok()).collect();
        let d = engine.diagnose("api");
        let f = &d.flow[0];
        assert!(f.applies);
        assert!(f.reads.contains("cluster node"));
        assert_eq!((f.current, f.threshold), (Some(2.0), Some(2.0)));
        assert!(f.problems.is_empty(), "{:?}", f.problems);
        assert_eq!(d.stats.as_ref().unwrap().block_qps, 1.0);
    }

    #[test]
    fn relate_and_chain_rules_explain_missing_nodes() {
        let (engine, _clock) = engine();
        engine
            .load_flow_rules(vec![
                FlowRule::new("api").count(1.0).relate("db"),
                FlowRule::new("api").count(1.0).chain("web"),
            ])
            .unwrap();
        drop(engine.enter("api").unwrap());
        let d = engine.diagnose("api");
        assert!(d.flow[0].problems[0].contains("`db` does not exist yet"), "{:?}", d.flow[0].problems);
        assert!(d.flow[1].problems[0].contains("never entered in context `web`"), "{:?}", d.flow[1].problems);
        assert!(d.flow[1].problems[0].contains("sentinel_default_context"), "{:?}", d.flow[1].problems);
    }

    #[test]
    fn an_other_rule_with_only_named_or_no_origins_does_not_apply() {
        let (engine, _clock) = engine();
        engine
            .load_flow_rules(vec![
                FlowRule::new("api").count(1.0).limit_app("appA"),
                FlowRule::new("api").count(1.0).limit_app("other"),
            ])
            .unwrap();
        {
            let _ctx = engine.enter_context("web", "appA").unwrap();
            drop(engine.enter("api"));
        }
        drop(engine.enter("api"));
        let d = engine.diagnose("api");
        let other = d.flow.iter().find(|f| f.summary.contains("`other`")).unwrap();
        assert!(!other.applies);
        assert!(other.problems[0].contains("never limited by `other`"), "{:?}", other.problems);
    }

    #[test]
    fn unknown_resources_are_reported_with_similar_names() {
        let (engine, _clock) = engine();
        drop(engine.enter("queryOrder").unwrap());
        let d = engine.diagnose("queryorder");
        assert!(!d.registered);
        assert!(d.notes.iter().any(|n| n.contains("`queryOrder`")), "{:?}", d.notes);
        assert!(d.to_string().contains("registered: no; entered: never"));
    }

    #[test]
    fn min_request_amount_reachability_and_error_tracing() {
        let (engine, clock) = engine();
        let api = engine.resource("api");
        for _ in 0..2 {
            drop(api.enter().unwrap());
        }
        clock.advance_millis(100);
        let stats = engine.cluster_stats("api").unwrap();
        let rule =
            DegradeRule::new("api", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(5).min_request_amount(10);
        let f = degrade_finding(0, &rule, Some(&stats), None, clock.now_millis());
        assert!(!f.applies);
        assert!(f.problems[0].contains("min_request_amount 10 is not reachable"), "{:?}", f.problems);
        assert!(f.problems[1].contains("no error was traced"), "{:?}", f.problems);

        let reachable =
            DegradeRule::new("api", DegradeGrade::ErrorCount).count(1.0).time_window_sec(5).min_request_amount(1);
        let f = degrade_finding(0, &reachable, Some(&stats), None, clock.now_millis());
        assert!(f.applies, "{:?}", f.problems);

        let d = engine.diagnose("api");
        assert_eq!((d.errors.completions, d.errors.exceptions), (2, 0));
        assert!(d.errors.hint.is_some());
        let mut e = api.enter().unwrap();
        e.set_error();
        drop(e);
        let d = engine.diagnose("api");
        assert_eq!(d.errors.exceptions, 1);
        assert!(d.errors.hint.is_none());
    }

    #[test]
    fn an_open_breaker_is_shown_with_its_state_and_numbers() {
        let (engine, clock) = engine();
        engine
            .load_degrade_rules(vec![DegradeRule::new("pay", DegradeGrade::ErrorCount)
                .count(1.0)
                .time_window_sec(10)
                .min_request_amount(1)])
            .unwrap();
        let pay = engine.resource("pay");
        for _ in 0..3 {
            if let Ok(mut e) = pay.enter() {
                e.set_error();
            }
        }
        let d = engine.diagnose("pay");
        assert_eq!(d.breakers.len(), 1);
        assert_eq!(d.breakers[0].state, BreakerState::Open);
        let f = &d.degrade[0];
        assert!(f.problems.iter().any(|p| p.contains("the breaker is OPEN")), "{:?}", f.problems);
        let text = d.to_string();
        assert!(text.contains("ErrorCount count 1 (own rule): OPEN"), "{text}");
        clock.advance_millis(10_000);
        assert!(pay.enter().is_ok(), "the probe");
    }
}
