//! The degrade rule manager: validation, breakers per resource (kept across equal reloads), the default
//! (`"*"`) breakers and their snapshots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::breaker::Breaker;
use super::observers::{BreakerState, Observers};
use super::rule::{DegradeGrade, DegradeRule};
use super::{ResourceBreakers, MAX_RULES_PER_RESOURCE};
use crate::error::{RuleError, RuleKind};
use crate::pattern::{Compiler, Patterns};
use crate::slot::toolkit::RuleList;
use crate::LIMIT_APP_DEFAULT;

/// The resource name of default rules: they apply to every resource without degrade rules of its own.
pub const DEFAULT_RESOURCE: &str = "*";

/// One breaker of a resource, as seen by [`Sentinel::circuit_breakers`](crate::Sentinel::circuit_breakers).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BreakerSnapshot {
    /// The breaker's rule (its resource is `"*"` for a default rule).
    pub rule: Arc<DegradeRule>,
    /// The breaker's state.
    pub state: BreakerState,
    /// When an OPEN breaker lets its next probe through (ms since the epoch); `None` while CLOSED.
    pub retry_at_ms: Option<u64>,
    /// Calls completed in the current statistics interval.
    pub interval_total: u64,
    /// Of those, the slow ones (slow-ratio rule) or those with an error (error rules).
    pub interval_bad: u64,
    /// Whether the breaker comes from a default (`"*"`) rule.
    pub is_default: bool,
}

/// Holds the degrade rules and their breakers.
#[derive(Default)]
pub(crate) struct DegradeManager {
    /// Breakers of the resources that have rules of their own (exact or matched).
    set: ArcSwap<DegradeSet>,
    /// Every rule in force (deduplicated), in load order.
    rules: RuleList<DegradeRule>,
    /// The default rules and, per resource that uses them, that resource's own breakers built from them.
    defaults: Mutex<Defaults>,
    /// Told of every state change.
    pub(crate) observers: Observers,
}

/// The breakers of one load of the degrade rules.
#[derive(Default)]
struct DegradeSet {
    /// Breakers of resources named exactly by rules.
    exact: HashMap<String, Arc<ResourceBreakers>>,
    /// Regex rules, by pattern.
    patterns: Patterns<Arc<DegradeRule>>,
    /// The breakers of each resource that matches a pattern (those of its exact rules, then one of its own
    /// for every matching regex rule), resolved when the resource is created or the set loads.
    matched: Mutex<HashMap<String, Arc<ResourceBreakers>>>,
}

impl DegradeSet {
    /// The breakers of `name` when it matches a pattern, reusing those in `old` of equal rules.
    fn resolve(&self, name: &str, old: Option<&ResourceBreakers>) -> Option<Arc<ResourceBreakers>> {
        let mut hits = self.patterns.matching(name).peekable();
        hits.peek()?;
        let mut breakers: Vec<Arc<Breaker>> = self.exact.get(name).map(|e| e.breakers.clone()).unwrap_or_default();
        let mut rules = Vec::new();
        for (_, rule) in hits {
            if breakers.len() + rules.len() == MAX_RULES_PER_RESOURCE {
                tracing::warn!(
                    resource = name,
                    max = MAX_RULES_PER_RESOURCE,
                    "more degrade rules match the resource than it can hold; the rest are ignored"
                );
                break;
            }
            rules.push(rule.clone());
        }
        breakers.extend(compile(&rules, old, false).breakers);
        Some(Arc::new(ResourceBreakers { breakers }))
    }

    /// Whether `name` has degrade rules of its own (exact or matched): the default rules then do not apply.
    fn has_own(&self, name: &str) -> bool {
        self.exact.contains_key(name) || self.patterns.any_match(name)
    }
}

#[derive(Default)]
struct Defaults {
    rules: Vec<Arc<DegradeRule>>,
    by_resource: HashMap<String, Arc<ResourceBreakers>>,
}

/// Checks one degrade rule; the first invalid field is reported.
pub(crate) fn validate(rule: &DegradeRule, index: usize) -> Result<(), RuleError> {
    let bad = |field, reason: &str| Err(RuleError::invalid(RuleKind::Degrade, index, &rule.resource, field, reason));
    if rule.resource.trim().is_empty() {
        return bad("resource", "must not be blank");
    }
    if !rule.count.is_finite() || rule.count < 0.0 {
        return bad("count", "must be a finite number >= 0");
    }
    if rule.grade == DegradeGrade::ErrorRatio && rule.count > 1.0 {
        return bad("count", "is an error ratio and must be <= 1");
    }
    if rule.time_window_sec == 0 {
        return bad("time_window_sec", "must be > 0");
    }
    if rule.min_request_amount == 0 {
        return bad("min_request_amount", "must be > 0");
    }
    if rule.stat_interval_ms == 0 {
        return bad("stat_interval_ms", "must be > 0");
    }
    if rule.grade == DegradeGrade::SlowRequestRatio && !(0.0..=1.0).contains(&rule.slow_ratio_threshold) {
        return bad("slow_ratio_threshold", "must be within [0, 1]");
    }
    Ok(())
}

fn normalize(mut rule: DegradeRule) -> DegradeRule {
    if rule.limit_app.trim().is_empty() {
        rule.limit_app = LIMIT_APP_DEFAULT.to_string();
    }
    rule
}

/// Breakers for `rules`, reusing (with their state) those of `old`: the breaker of an equal rule as it is,
/// and the state of one whose rule differs only in its id (Java's rule equality leaves the id out, so a
/// renumbered rule, as a restarted dashboard pushes, keeps its breaker's state). Each old breaker goes to
/// one rule at most.
fn compile(rules: &[Arc<DegradeRule>], old: Option<&ResourceBreakers>, is_default: bool) -> ResourceBreakers {
    let old = old.map_or(&[][..], |o| &o.breakers[..]);
    let mut taken = vec![false; old.len()];
    let mut take = |matches: &dyn Fn(&DegradeRule) -> bool| {
        let i = (0..old.len()).find(|&i| !taken[i] && matches(&old[i].rule))?;
        taken[i] = true;
        Some(&old[i])
    };
    let same: Vec<Option<Arc<Breaker>>> = rules.iter().map(|rule| take(&|r| r == &**rule).cloned()).collect();
    let breakers = rules
        .iter()
        .zip(same)
        .map(|(rule, same)| {
            same.unwrap_or_else(|| {
                Arc::new(match take(&|r| r.eq_but_id(rule)) {
                    Some(b) => Breaker::taking_over(rule.clone(), b),
                    None => Breaker::new(rule.clone(), is_default),
                })
            })
        })
        .collect();
    ResourceBreakers { breakers }
}

impl DegradeManager {
    /// Validates and replaces the rule set; `Ok(true)` when something changed.
    pub(crate) fn load(&self, rules: Vec<DegradeRule>) -> Result<bool, RuleError> {
        let old = self.set.load_full();
        let compiler = Compiler::new(RuleKind::Degrade, &old.patterns);
        let check = |rule: &DegradeRule, index: usize| {
            validate(rule, index)?;
            if rule.regex {
                compiler.check(index, &rule.resource)?;
            }
            Ok(())
        };
        self.rules.replace(rules, check, normalize, |unique| self.install(unique, &old, &compiler))
    }

    fn install(
        &self,
        unique: &[DegradeRule],
        old: &DegradeSet,
        compiler: &Compiler<'_, Arc<DegradeRule>>,
    ) -> Result<(), RuleError> {
        let mut by_resource: HashMap<String, Vec<Arc<DegradeRule>>> = HashMap::new();
        let mut by_pattern: HashMap<&str, usize> = HashMap::new();
        let mut regex = Vec::new();
        for (index, rule) in unique.iter().enumerate() {
            if rule.regex {
                let n = by_pattern.entry(&rule.resource).or_default();
                if *n == MAX_RULES_PER_RESOURCE {
                    let reason = format!("has more than {MAX_RULES_PER_RESOURCE} degrade rules");
                    return Err(RuleError::invalid(RuleKind::Degrade, index, &rule.resource, "resource", reason));
                }
                *n += 1;
                regex.push((rule.resource.as_str(), Arc::new(rule.clone())));
                continue;
            }
            let rules = by_resource.entry(rule.resource.clone()).or_default();
            if rules.len() == MAX_RULES_PER_RESOURCE {
                let reason = format!("has more than {MAX_RULES_PER_RESOURCE} degrade rules");
                return Err(RuleError::invalid(RuleKind::Degrade, index, &rule.resource, "resource", reason));
            }
            rules.push(Arc::new(rule.clone()));
        }
        let default_rules = by_resource.remove(DEFAULT_RESOURCE).unwrap_or_default();
        let exact = by_resource
            .into_iter()
            .map(|(name, rules)| {
                let built = compile(&rules, old.exact.get(&name).map(|o| &**o), false);
                (name, Arc::new(built))
            })
            .collect();
        let mut set =
            DegradeSet { exact, patterns: Patterns::group(regex, &compiler.finish()), matched: Mutex::default() };
        // Resolve again the resources that matched a pattern, keeping the breakers of rules that stay.
        let old_matched = std::mem::take(&mut *old.matched.lock().unwrap_or_else(|e| e.into_inner()));
        let matched =
            old_matched.into_iter().filter_map(|(name, b)| set.resolve(&name, Some(&b)).map(|r| (name, r))).collect();
        set.matched = Mutex::new(matched);

        let mut defaults = self.defaults.lock().unwrap_or_else(|e| e.into_inner());
        if defaults.rules != default_rules {
            let by_resource = std::mem::take(&mut defaults.by_resource);
            defaults.by_resource = if default_rules.is_empty() {
                HashMap::new()
            } else {
                by_resource
                    .into_iter()
                    .map(|(name, old)| {
                        let built = compile(&default_rules, Some(&old), true);
                        (name, Arc::new(built))
                    })
                    .collect()
            };
            defaults.rules = default_rules;
        }
        self.set.store(Arc::new(set));
        Ok(())
    }

    pub(crate) fn rules(&self) -> Vec<DegradeRule> {
        self.rules.get()
    }

    /// The breakers of the resource `name` from its own rules, exact and matched (resolved once per resource
    /// and rule set: called when the resource is created and when rules change, never per call).
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceBreakers>> {
        let set = self.set.load();
        if set.patterns.is_empty() {
            return set.exact.get(name).cloned();
        }
        let mut matched = set.matched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = matched.get(name) {
            return Some(b.clone());
        }
        match set.resolve(name, None) {
            Some(b) => {
                matched.insert(name.to_string(), b.clone());
                Some(b)
            }
            None => set.exact.get(name).cloned(),
        }
    }

    /// Whether a rule names `name` exactly; the patterns of regex rules that match it are added to `matched`
    /// (nothing is resolved or kept).
    pub(crate) fn targets(&self, name: &str, matched: &mut Vec<(RuleKind, Arc<str>)>) -> bool {
        let set = self.set.load();
        matched.extend(set.patterns.sources_matching(name).map(|p| (RuleKind::Degrade, p.clone())));
        set.exact.contains_key(name)
    }

    /// The breakers of exact rules for `name`, without resolving patterns (for names that are not resources).
    pub(crate) fn exact_for(&self, name: &str) -> Option<Arc<ResourceBreakers>> {
        self.set.load().exact.get(name).cloned()
    }

    /// Whether the regex rule pattern `pattern` of the set in force matches `name`.
    pub(crate) fn pattern_matches(&self, pattern: &str, name: &str) -> bool {
        self.set.load().patterns.get(pattern).is_some_and(|p| p.matches(name))
    }

    /// The breakers built from the default (`"*"`) rules for `name`, created on first use; `None` when there
    /// are no default rules or the resource has degrade rules of its own. Each resource gets its own breakers
    /// (as in Java Sentinel): one slow resource does not open the breaker of another.
    pub(crate) fn default_breakers_for(&self, name: &str) -> Option<Arc<ResourceBreakers>> {
        if name == DEFAULT_RESOURCE || self.set.load().has_own(name) {
            return None;
        }
        let mut defaults = self.defaults.lock().unwrap_or_else(|e| e.into_inner());
        if defaults.rules.is_empty() {
            return None;
        }
        if let Some(b) = defaults.by_resource.get(name) {
            return Some(b.clone());
        }
        let built = Arc::new(compile(&defaults.rules, None, true));
        defaults.by_resource.insert(name.to_string(), built.clone());
        Some(built)
    }
}

/// The snapshots of `breakers` at `now_ms`.
pub(crate) fn snapshot(breakers: &ResourceBreakers, now_ms: u64) -> Vec<BreakerSnapshot> {
    breakers
        .breakers
        .iter()
        .map(|b| {
            let (interval_total, interval_bad) = b.counts(now_ms);
            BreakerSnapshot {
                rule: b.rule.clone(),
                state: b.state(),
                retry_at_ms: b.retry_ms(),
                interval_total,
                interval_bad,
                is_default: b.is_default,
            }
        })
        .collect()
}

impl crate::slot::toolkit::DedupKey for crate::circuit_breaker::DegradeRule {
    fn dedup_key<H: std::hash::Hasher>(&self, h: &mut H) {
        std::hash::Hash::hash(&(&self.resource, &self.limit_app, self.time_window_sec), h);
        crate::slot::toolkit::hash_f64(self.count, h);
    }
    /// Rules that differ only in their id are one rule, the first kept (Java's rule equality leaves the id
    /// out, and its rule manager keeps a set).
    fn repeats(&self, other: &Self) -> bool {
        if self.id == other.id {
            self == other
        } else {
            Self { id: other.id, ..self.clone() } == *other
        }
    }
}
