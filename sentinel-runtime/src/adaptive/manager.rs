//! The adaptive rules in force: validated as a set, by exact name or by pattern, and the limiter of each
//! resource they govern, kept across reloads that leave its rule unchanged.
//!
//! One rule governs a resource: its exact rule, else the first pattern (in load order) that matches it. A
//! set with two exact rules for the same resource is refused (a second limiter would halve neither's limit,
//! it would double the calls in flight).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::rule::{AdaptiveRule, AdaptiveRuleError};
use super::slot::ResourceAdaptive;
use crate::error::{RuleError, RuleKind};
use crate::pattern::{Compiler, Patterns};
use crate::slot::toolkit::{DedupKey, RuleList};

/// The compiled rules of one load.
#[derive(Default)]
struct AdaptiveSet {
    exact: HashMap<String, Arc<AdaptiveRule>>,
    patterns: Patterns<Arc<AdaptiveRule>>,
}

/// Holds the adaptive rules and the limiters of the resources they govern.
#[derive(Default)]
pub(crate) struct AdaptiveManager {
    set: ArcSwap<AdaptiveSet>,
    rules: RuleList<AdaptiveRule>,
    /// Each governed resource's state, by name: reused while its rule stays, dropped when the rule goes.
    /// At most one per resource the engine created.
    cells: Mutex<HashMap<Arc<str>, Arc<ResourceAdaptive>>>,
    /// The last generation of each resource's state (kept when the state goes, so that a state that comes
    /// back is not taken for the one before): one byte per resource the engine created.
    generations: Mutex<HashMap<Arc<str>, u8>>,
    /// States a load took out of force, to retire once the resources' rules no longer hold them
    /// ([`retire_replaced`](Self::retire_replaced)).
    replaced: Mutex<Vec<Arc<ResourceAdaptive>>>,
    /// The calls in flight of states a load replaced with a changed rule, by resource, for the states that
    /// replace them ([`for_resource`](Self::for_resource)): the calls still in flight under the old rule keep
    /// counting against the new limit.
    carried: Mutex<HashMap<Arc<str>, Arc<AtomicU32>>>,
}

impl DedupKey for AdaptiveRule {
    fn dedup_key<H: Hasher>(&self, h: &mut H) {
        self.resource.hash(h);
        self.regex.hash(h);
    }
}

/// The rule error of an invalid adaptive rule.
fn rule_error(e: AdaptiveRuleError) -> RuleError {
    match e {
        AdaptiveRuleError::Invalid { index, resource, field, reason } => {
            RuleError::Invalid { kind: RuleKind::Adaptive, index, resource, field, reason }
        }
        AdaptiveRuleError::Parse(reason) => {
            RuleError::Invalid { kind: RuleKind::Adaptive, index: 0, resource: String::new(), field: "", reason }
        }
    }
}

impl AdaptiveManager {
    /// Validates and replaces the rule set; `Ok(false)` when it equals the one in force. The first invalid
    /// rule refuses the whole set and the rules in force stay.
    pub(crate) fn load(&self, rules: Vec<AdaptiveRule>) -> Result<bool, RuleError> {
        let old = self.set.load_full();
        let compiler = Compiler::new(RuleKind::Adaptive, &old.patterns);
        let mut exact_seen: HashMap<&str, usize> = HashMap::new();
        for (index, rule) in rules.iter().enumerate() {
            rule.validate(index).map_err(rule_error)?;
            if rule.regex {
                compiler.check(index, &rule.resource)?;
            } else if let Some(first) = exact_seen.insert(&rule.resource, index)
                && rules[first] != *rule
            {
                return Err(RuleError::invalid(
                    RuleKind::Adaptive,
                    index,
                    &rule.resource,
                    "resource",
                    format!("has a rule already (#{first}); one adaptive rule governs a resource"),
                ));
            }
        }
        let compiled = compiler.finish();
        self.rules.replace(
            rules,
            |_, _| Ok(()),
            |r| r,
            |unique| {
                let exact = unique.iter().filter(|r| !r.regex).map(|r| (r.resource.clone(), Arc::new(r.clone())));
                let regex = unique.iter().filter(|r| r.regex).map(|r| (r.resource.as_str(), Arc::new(r.clone())));
                let set = AdaptiveSet { exact: exact.collect(), patterns: Patterns::group(regex, &compiled) };
                let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
                let mut replaced = self.replaced.lock().unwrap_or_else(|e| e.into_inner());
                let mut carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
                cells.retain(|name, cell| {
                    let rule = set.rule_of(name);
                    let keep = rule.is_some_and(|r| **r == *cell.rule);
                    if !keep {
                        if rule.is_some() {
                            // A changed rule: its state will count the calls still in flight under this one.
                            carried.insert(name.clone(), cell.inflight_count());
                        }
                        replaced.push(cell.clone());
                    }
                    keep
                });
                self.set.store(Arc::new(set));
                Ok(())
            },
        )
    }

    /// The rules in force.
    pub(crate) fn rules(&self) -> Vec<AdaptiveRule> {
        self.rules.get()
    }

    /// Whether a rule names `name` exactly; the patterns of regex rules that match it are added to `matched`.
    pub(crate) fn targets(&self, name: &str, matched: &mut Vec<(RuleKind, Arc<str>)>) -> bool {
        let set = self.set.load();
        matched.extend(set.patterns.sources_matching(name).map(|p| (RuleKind::Adaptive, p.clone())));
        set.exact.contains_key(name)
    }

    /// Whether a rule governs `name` (exactly or by pattern).
    pub(crate) fn governs(&self, name: &str) -> bool {
        self.set.load().rule_of(name).is_some()
    }

    /// The state of the rule that governs `name`, reusing the one in force while its rule is unchanged
    /// (resolved when the resource is created and when rules change, never per call).
    pub(crate) fn for_resource(&self, name: &Arc<str>) -> Option<Arc<ResourceAdaptive>> {
        let set = self.set.load();
        let Some(rule) = set.rule_of(name) else {
            // No rule governs it now: no count carries over to a rule loaded later (its calls' exits read no
            // rules, and give their places to nobody).
            self.carried.lock().unwrap_or_else(|e| e.into_inner()).remove(&**name);
            return None;
        };
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cell) = cells.get(&**name)
            && *cell.rule == **rule
        {
            return Some(cell.clone());
        }
        // The calls in flight under the rule this one changes still count (see `ResourceAdaptive`).
        let carried = self.carried.lock().unwrap_or_else(|e| e.into_inner()).remove(&**name);
        let inflight = cells.get(&**name).map(|old| old.inflight_count()).or(carried).unwrap_or_default();
        let mut generations = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let generation = generations.entry(name.clone()).or_insert(0);
        *generation = generation.checked_add(1).unwrap_or(1);
        let cell = Arc::new(ResourceAdaptive::new(rule.clone(), seed_of(name), *generation, inflight));
        if let Some(old) = cells.insert(name.clone(), cell.clone()) {
            self.replaced.lock().unwrap_or_else(|e| e.into_inner()).push(old);
        }
        Some(cell)
    }

    /// Retires the states the last loads took out of force (see [`ResourceAdaptive::retire`]): call it once
    /// the resources' rules were refreshed, so that a woken waiter, deciding again, finds the rules in force.
    pub(crate) fn retire_replaced(&self) {
        let replaced = std::mem::take(&mut *self.replaced.lock().unwrap_or_else(|e| e.into_inner()));
        for cell in replaced {
            cell.retire();
        }
    }

    /// Every governed resource's state (for diagnose, gauges and the console).
    pub(crate) fn cells(&self) -> Vec<(Arc<str>, Arc<ResourceAdaptive>)> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = cells.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The state of `name`, if a rule governs it and it was resolved.
    pub(crate) fn cell(&self, name: &str) -> Option<Arc<ResourceAdaptive>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }
}

impl AdaptiveSet {
    /// The rule that governs `name`: its exact rule, else the first matching pattern's.
    fn rule_of<'a>(&'a self, name: &'a str) -> Option<&'a Arc<AdaptiveRule>> {
        self.exact.get(name).or_else(|| self.patterns.matching(name).map(|(_, r)| r).next())
    }
}

/// A seed for a resource's probe jitter: the same on every run, different across resources.
fn seed_of(name: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}
