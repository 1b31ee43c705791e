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
//!
//! One part per rule kind builds that kind's findings (`flow`, `cluster` for cluster-mode flow rules,
//! `circuit_breaker`, `param_flow`, `authority`, `system`); `display` prints the report.

mod adaptive;
mod authority;
mod circuit_breaker;
mod cluster;
mod display;
mod flow;
mod param_flow;
mod system;
#[cfg(test)]
mod tests;

use crate::circuit_breaker::BreakerSnapshot;
use crate::flow::ClusterRuleStatus;
use crate::{NodeStats, RuleKind, Sentinel};

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
    /// The resource's adaptive limiter, once a call built it ([`Sentinel::adaptive_status`]).
    pub adaptive: Option<crate::adaptive::AdaptiveStatus>,
}

/// Whether a rule on `rule_resource` applies to `resource`: it names it, or it is a regex rule whose pattern
/// matches the name (`matches`: the rule kind's compiled patterns).
fn names(regex: bool, rule_resource: &str, resource: &str, matches: impl FnOnce(&str, &str) -> bool) -> bool {
    if regex {
        matches(rule_resource, resource)
    } else {
        rule_resource == resource
    }
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

impl Sentinel {
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

        let cluster = cluster::rules_of(self, resource);
        let flow = flow::findings(self, resource, &seen, &contexts, &cluster);
        let mut notes = Vec::new();
        let (degrade, breakers) = circuit_breaker::findings(self, resource, stats.as_ref(), &mut notes);
        let param_flow = param_flow::findings(self, resource, ever_entered);
        let authority = authority::findings(self, resource, &seen);
        let system = system::findings(self);

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
        let adaptive = self.adaptive_status_of(resource);
        notes.extend(adaptive::note(self, resource, adaptive.as_ref()));
        if resource == crate::RESOURCE_OVERFLOW {
            notes.push(format!(
                "`{resource}` stands for the new names that no rule named once the resource cap ({}) was reached \
                 ({} handles so far): system rules and rules on `{resource}` check their calls",
                caps.max_resources, caps.resources_overflowed
            ));
        } else if resource == crate::RESOURCE_PATTERNS_OVERFLOW {
            notes.push(format!(
                "`{resource}` stands for the new names only regex rules match once their cap ({0}) and the bound \
                 on the resources names matching the same patterns share past it ({0}) were reached: every \
                 regex rule checks their calls, together",
                caps.max_resources
            ));
        } else if let Some(patterns) = (!registered && self.matched_cap_reached())
            .then(|| self.targets(resource))
            .and_then(|(exact, p)| (!exact && !p.is_empty()).then_some(p))
        {
            notes.push(if self.shares_by_patterns(&patterns) {
                format!(
                    "only regex rules match this name, and the cap on such names ({}) is reached: a handle taken \
                     now shares the resource of the first name past the cap that matched the same patterns, which \
                     those rules check",
                    caps.max_resources
                )
            } else {
                format!(
                    "only regex rules match this name, and both the cap on such names ({0}) and the bound on the \
                     resources names matching the same patterns share ({0}) are reached: a handle taken now is a \
                     handle on `{1}`, which every regex rule checks (raise `max_resources` if names are \
                     legitimate)",
                    caps.max_resources,
                    crate::RESOURCE_PATTERNS_OVERFLOW
                )
            });
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
            adaptive,
        }
    }
}
