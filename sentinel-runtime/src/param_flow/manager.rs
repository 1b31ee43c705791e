//! The hot-parameter rules in force: the rules of each owner (the user's, the gateway's), combined per
//! resource, exact names and regex patterns (Java's `ParamFlowRuleManager` over its `RuleManager`).
//!
//! Each owner replaces only its own rules: loading the user's rules keeps the gateway's, and the other way
//! round. A rule equal to one in force keeps its counters whoever loads, so a reload of one owner never
//! resets the other's counters (Java's gateway counters reset whenever ordinary hot-parameter rules load).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::error::{RuleError, RuleKind};
use crate::pattern::{Compiler, Patterns};
use crate::slot::toolkit::{dedup, group_reusing, Matched, RuleList};

use super::state::ParamRuleState;
use super::{normalize, validate, ParamFlowRule, ResourceParamRules};

/// Who loaded a set of hot-parameter rules; each owner's set is replaced on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamRuleOwner {
    /// [`Sentinel::load_param_flow_rules`](crate::Sentinel::load_param_flow_rules) and the data sources.
    User,
    /// The gateway rules, converted (see `web::gateway`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    Gateway,
}

/// Holds the hot-parameter rules.
#[derive(Default)]
pub(crate) struct ParamFlowManager {
    set: ArcSwap<ParamRuleSet>,
    user: RuleList<ParamFlowRule>,
    gateway: RuleList<ParamFlowRule>,
    /// Serializes loads of every owner: each publishes the combination of both lists.
    install_lock: Mutex<()>,
}

/// The compiled rules of both owners.
#[derive(Default)]
struct ParamRuleSet {
    /// Rules naming their resource exactly.
    exact: HashMap<String, Arc<ResourceParamRules>>,
    /// Regex rules, by pattern.
    patterns: Patterns<ParamFlowRule>,
    /// The rules of each resource that matches a pattern, resolved when the resource is created or the set
    /// loads (its exact rules, then a state of its own for each matching regex rule).
    matched: Matched<ResourceParamRules>,
}

impl ParamRuleSet {
    /// The rules of `name` when it matches a pattern (reusing the states in `old` of equal rules).
    fn resolve(&self, name: &str, old: Option<&ResourceParamRules>) -> Option<Arc<ResourceParamRules>> {
        let mut hits = self.patterns.matching(name).peekable();
        hits.peek()?;
        let mut rules: Vec<Arc<ParamRuleState>> = self.exact.get(name).map(|e| e.rules.clone()).unwrap_or_default();
        for (_, rule) in hits {
            let reused = old.and_then(|o| o.rules.iter().find(|s| *s.rule == *rule).cloned());
            rules.push(reused.unwrap_or_else(|| Arc::new(ParamRuleState::new(rule.clone()))));
        }
        Some(Arc::new(ResourceParamRules::new(rules)))
    }
}

impl ParamFlowManager {
    /// Validates and replaces `owner`'s rules (the first invalid one rejects the set and nothing changes);
    /// `Ok(true)` when something changed. A rule equal to one in force keeps its counters.
    pub(crate) fn load(&self, owner: ParamRuleOwner, rules: Vec<ParamFlowRule>) -> Result<bool, RuleError> {
        let _g = self.install_lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.set.load_full();
        let compiler = Compiler::new(RuleKind::ParamFlow, &old.patterns);
        let check = |rule: &ParamFlowRule, index: usize| {
            validate(rule, index)?;
            if rule.regex {
                compiler.check(index, &rule.resource)?;
            }
            Ok(())
        };
        let (list, other) = match owner {
            ParamRuleOwner::User => (&self.user, &self.gateway),
            ParamRuleOwner::Gateway => (&self.gateway, &self.user),
        };
        list.replace(rules, check, normalize, |unique| {
            let others = other.get();
            // The other owner's patterns were compiled when it loaded: reuse them.
            for (index, rule) in others.iter().enumerate().filter(|(_, r)| r.regex) {
                compiler.check(index, &rule.resource)?;
            }
            let (gateway, user) = match owner {
                ParamRuleOwner::User => (others.as_slice(), unique),
                ParamRuleOwner::Gateway => (unique, others.as_slice()),
            };
            // The gateway's rules first, as Java's `GatewayFlowSlot` (-4000) checks them before `ParamFlowSlot`
            // (-3000): a call they block neither reaches nor spends from the user's rules. A rule both owners
            // hold is one rule (one set of counters).
            let combined = dedup(gateway.iter().chain(user).cloned());
            self.install(&combined, &old, &compiler);
            Ok(())
        })
    }

    /// Compiles and publishes `unique`, reusing the states of equal rules of `old`.
    fn install(&self, unique: &[ParamFlowRule], old: &ParamRuleSet, compiler: &Compiler<'_, ParamFlowRule>) {
        let (regex, exact): (Vec<&ParamFlowRule>, Vec<&ParamFlowRule>) = unique.iter().partition(|r| r.regex);
        let by_resource = group_reusing(
            exact,
            |r| &r.resource,
            |name| old.exact.get(name).map(|rs| rs.rules.clone()).unwrap_or_default(),
            |s| &*s.rule,
            |r| ParamRuleState::new(r.clone()),
        );
        let compiled = compiler.finish();
        let mut set = ParamRuleSet {
            exact: by_resource.into_iter().map(|(k, rules)| (k, Arc::new(ResourceParamRules::new(rules)))).collect(),
            patterns: Patterns::group(regex.into_iter().map(|r| (r.resource.as_str(), r.clone())), &compiled),
            matched: Matched::default(),
        };
        // Resolve again the resources that matched a pattern, keeping the counters of rules that stay.
        set.matched = Matched::resolved_again(&old.matched, |name, rules| set.resolve(name, Some(rules)));
        self.set.store(Arc::new(set));
    }

    /// The rules `owner` loaded (deduplicated, in load order).
    pub(crate) fn rules(&self, owner: ParamRuleOwner) -> Vec<ParamFlowRule> {
        match owner {
            ParamRuleOwner::User => self.user.get(),
            ParamRuleOwner::Gateway => self.gateway.get(),
        }
    }

    /// Whether the regex rule pattern `pattern` of the set in force matches `name`.
    pub(crate) fn pattern_matches(&self, pattern: &str, name: &str) -> bool {
        self.set.load().patterns.get(pattern).is_some_and(|p| p.matches(name))
    }

    /// Whether a rule names `name` exactly; the patterns of regex rules that match it are added to `matched`
    /// (nothing is resolved or kept).
    pub(crate) fn targets(&self, name: &str, matched: &mut Vec<(RuleKind, Arc<str>)>) -> bool {
        let set = self.set.load();
        matched.extend(set.patterns.sources_matching(name).map(|p| (RuleKind::ParamFlow, p.clone())));
        set.exact.contains_key(name)
    }

    /// The rules of the resource `name`, exact and matched (resolved once per resource and rule set: called
    /// when the resource is created and when rules change, never per call).
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceParamRules>> {
        let set = self.set.load();
        set.matched.for_resource(name, !set.patterns.is_empty(), &set.exact, |name| set.resolve(name, None))
    }
}
