//! Authority rules: which callers (origins) may use a resource.
//!
//! A rule names a comma-separated list of origins (`limit_app`) and a strategy: a **white** list (the
//! default) lets only the listed origins in, a **black** list keeps them out. Membership is exact equality
//! with one element of the list, with no trimming (`"appA, appB"` lists `"appA"` and `" appB"`), as in Java
//! Sentinel. A call with no origin (the empty string) always passes.
//!
//! A resource may have several rules: a call must pass every one of them. (Java Sentinel keeps the first rule
//! it loads for a resource and ignores the others with a warning.)
//!
//! ```
//! use sentinel_runtime::{Sentinel, BlockError};
//! use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
//!
//! let engine = Sentinel::builder().build();
//! engine
//!     .load_authority_rules(vec![AuthorityRule::new("admin", "ops,billing", AuthorityStrategy::White)])
//!     .unwrap();
//! let admin = engine.resource("admin");
//! assert!(admin.entry().origin("ops").enter().is_ok());
//! let blocked = admin.entry().origin("web").enter().unwrap_err();
//! assert!(matches!(blocked, BlockError::Authority { .. }));
//! assert!(admin.enter().is_ok()); // no origin: passes
//! ```

pub(crate) mod rule;

pub use rule::{AuthorityRule, AuthorityStrategy};

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::error::{BlockError, RuleError, RuleKind};
use crate::pattern::{Compiler, Patterns};
use crate::slot::contract::{CallCx, CheckCx, FastCall, RuleSlot, Verdict};
use crate::slot::toolkit::RuleList;

/// The authority rules in force for one resource.
#[derive(Debug)]
pub(crate) struct ResourceAuthority {
    pub(crate) rules: Vec<Arc<AuthorityRule>>,
    /// `lists[i]`: the origins of `rules[i]`, split once at load.
    lists: Vec<Box<[Box<str>]>>,
    /// `shares[i]`: per-stripe copies of `rules[i]`, for the errors of blocked calls.
    shares: Vec<crate::stat::stripe::Shares<AuthorityRule>>,
}

/// Holds the authority rules.
#[derive(Default)]
pub(crate) struct AuthorityManager {
    set: ArcSwap<AuthoritySet>,
    rules: RuleList<AuthorityRule>,
}

/// One rule with its origin list, split once at load.
type ListedRule = (Arc<AuthorityRule>, Box<[Box<str>]>);

/// The compiled authority rules of one load.
#[derive(Default)]
struct AuthoritySet {
    exact: HashMap<String, Arc<ResourceAuthority>>,
    patterns: Patterns<ListedRule>,
}

/// Checks one authority rule; the first invalid field is reported.
pub(crate) fn validate(rule: &AuthorityRule, index: usize) -> Result<(), RuleError> {
    let bad = |field, reason: &str| Err(RuleError::invalid(RuleKind::Authority, index, &rule.resource, field, reason));
    if rule.resource.trim().is_empty() {
        return bad("resource", "must not be blank");
    }
    if rule.limit_app.trim().is_empty() {
        return bad("limit_app", "must list at least one origin (comma-separated)");
    }
    if rule.limit_app.split(',').any(|o| o == crate::UNTRACKED_ORIGIN) {
        return bad("limit_app", "lists the reserved origin of untracked callers; choose another name");
    }
    Ok(())
}

fn listed(rule: &AuthorityRule) -> ListedRule {
    (Arc::new(rule.clone()), rule.limit_app.split(',').map(Box::from).collect())
}

crate::stat::stripe::duplicate_by_clone!(AuthorityRule);

impl ResourceAuthority {
    fn new(rules: Vec<Arc<AuthorityRule>>, lists: Vec<Box<[Box<str>]>>) -> Self {
        let shares = rules.iter().map(|_| Default::default()).collect();
        ResourceAuthority { rules, lists, shares }
    }
    fn push(&mut self, (rule, list): ListedRule) {
        self.rules.push(rule);
        self.lists.push(list);
        self.shares.push(Default::default());
    }
    /// Every origin the resource's lists name.
    pub(crate) fn listed_origins(&self) -> impl Iterator<Item = &str> {
        self.lists.iter().flat_map(|l| l.iter().map(|o| &**o))
    }
}

impl AuthorityManager {
    /// Validates and replaces the rule set; `Ok(false)` when it equals the one in force.
    pub(crate) fn load(&self, rules: Vec<AuthorityRule>) -> Result<bool, RuleError> {
        let old = self.set.load_full();
        let compiler = Compiler::new(RuleKind::Authority, &old.patterns);
        let check = |rule: &AuthorityRule, index: usize| {
            validate(rule, index)?;
            if rule.regex {
                compiler.check(index, &rule.resource)?;
            }
            Ok(())
        };
        self.rules.replace(
            rules,
            check,
            |r| r,
            |unique| {
                let mut exact: HashMap<String, ResourceAuthority> = HashMap::new();
                for rule in unique.iter().filter(|r| !r.regex) {
                    let (rule, list) = listed(rule);
                    let e = exact
                        .entry(rule.resource.clone())
                        .or_insert_with(|| ResourceAuthority::new(Vec::new(), Vec::new()));
                    e.push((rule, list));
                }
                let regex = unique.iter().filter(|r| r.regex).map(|r| (r.resource.as_str(), listed(r)));
                let patterns = Patterns::group(regex, &compiler.finish());
                let exact = exact.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
                self.set.store(Arc::new(AuthoritySet { exact, patterns }));
                Ok(())
            },
        )
    }
    pub(crate) fn rules(&self) -> Vec<AuthorityRule> {
        self.rules.get()
    }
    /// The rules of the resource `name`: its exact rules, then those of every pattern it matches (resolved
    /// when the resource is created and when rules change, never per call).
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceAuthority>> {
        let set = self.set.load();
        let exact = set.exact.get(name);
        let mut hits = set.patterns.matching(name).peekable();
        if hits.peek().is_none() {
            return exact.cloned();
        }
        let mut resolved = match exact {
            Some(e) => ResourceAuthority::new(e.rules.clone(), e.lists.clone()),
            None => ResourceAuthority::new(Vec::new(), Vec::new()),
        };
        for (_, listed) in hits {
            resolved.push(listed.clone());
        }
        Some(Arc::new(resolved))
    }
    /// Whether a rule names `name` exactly; the patterns of regex rules that match it are added to `matched`.
    pub(crate) fn targets(&self, name: &str, matched: &mut Vec<(RuleKind, Arc<str>)>) -> bool {
        let set = self.set.load();
        matched.extend(set.patterns.sources_matching(name).map(|p| (RuleKind::Authority, p.clone())));
        set.exact.contains_key(name)
    }

    /// Whether the regex rule pattern `pattern` of the set in force matches `name`.
    pub(crate) fn pattern_matches(&self, pattern: &str, name: &str) -> bool {
        self.set.load().patterns.get(pattern).is_some_and(|p| p.matches(name))
    }
}

/// Whether `origin` passes a rule with the origin list `list` (Java's `AuthorityRuleChecker.passCheck`).
fn passes(strategy: AuthorityStrategy, list: &[Box<str>], origin: &str) -> bool {
    if origin.is_empty() {
        return true;
    }
    let listed = list.iter().any(|app| &**app == origin);
    match strategy {
        AuthorityStrategy::White => listed,
        AuthorityStrategy::Black => !listed,
    }
}

/// The authority slot (order -6000): the caller's origin against the resource's white and black lists.
pub(crate) struct AuthoritySlot;

impl RuleSlot for AuthoritySlot {
    type Rules = ResourceAuthority;
    type State = ();
    type Held = ();
    type Taken = ();
    type FastTaken = ();
    const ORDER: i32 = crate::slot::ORDER_AUTHORITY;
    /// The lists read only the caller's origin and hold nothing: decided on the fast path too.
    const ON_FAST_PATH: bool = true;

    #[inline(always)]
    fn check(
        rules: &ResourceAuthority,
        _: &(),
        cx: &CheckCx<'_>,
        _: &mut (),
        _: &mut (),
    ) -> Result<Verdict, BlockError> {
        check(rules, cx).map(|()| Verdict::PASS)
    }

    #[inline(always)]
    fn check_fast<'c>(
        rules: &ResourceAuthority,
        _: &(),
        call: &impl FastCall<'c>,
        _: &mut u64,
        _: &mut (),
        _: Option<&mut ()>,
    ) -> Result<(), BlockError> {
        check(rules, &call.call())
    }
}

/// Checks the caller's origin against the resource's authority rules.
pub(crate) fn check(state: &ResourceAuthority, cx: &CallCx<'_>) -> Result<(), BlockError> {
    for ((rule, list), shares) in state.rules.iter().zip(&state.lists).zip(&state.shares) {
        if !passes(rule.strategy, list, cx.origin.as_str()) {
            let rule = shares.share(rule);
            return Err(BlockError::Authority { resource: cx.resource.share(), rule, origin: cx.origin.share() });
        }
    }
    Ok(())
}

impl crate::slot::toolkit::DedupKey for crate::authority::AuthorityRule {
    fn dedup_key<H: std::hash::Hasher>(&self, h: &mut H) {
        std::hash::Hash::hash(&(&self.resource, &self.limit_app), h);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &str) -> Vec<Box<str>> {
        s.split(',').map(Box::from).collect()
    }

    #[test]
    fn white_list_admits_members_only() {
        let l = list("appA,appB");
        assert!(passes(AuthorityStrategy::White, &l, "appA"));
        assert!(passes(AuthorityStrategy::White, &l, "appB"));
        assert!(!passes(AuthorityStrategy::White, &l, "appC"));
    }

    #[test]
    fn black_list_blocks_members_only() {
        let l = list("appA,appB");
        assert!(!passes(AuthorityStrategy::Black, &l, "appA"));
        assert!(passes(AuthorityStrategy::Black, &l, "appC"));
    }

    #[test]
    fn membership_is_exact_without_trimming_or_substrings() {
        let l = list("appA, appB,app");
        assert!(!passes(AuthorityStrategy::White, &l, "appB"), "` appB` is listed, not `appB`");
        assert!(passes(AuthorityStrategy::White, &l, " appB"));
        assert!(passes(AuthorityStrategy::White, &l, "app"));
        assert!(!passes(AuthorityStrategy::White, &l, "ap"), "a substring of a member is not a member");
        assert!(!passes(AuthorityStrategy::White, &l, "appA,"));
    }

    #[test]
    fn empty_origin_always_passes() {
        let l = list("appA");
        assert!(passes(AuthorityStrategy::White, &l, ""));
        assert!(passes(AuthorityStrategy::Black, &l, ""));
    }
}
