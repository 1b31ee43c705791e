//! The shared toolkit of the rule kinds: how a kind keeps its rule list, deduplicates it, reuses the state
//! of rules that a reload keeps, and stores its compiled rules by resource.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::error::RuleError;

/// The rule list of one kind as loaded (deduplicated), and the lock that serializes loads of that kind.
pub(crate) struct RuleList<R> {
    rules: ArcSwap<Vec<R>>,
    load_lock: std::sync::Mutex<()>,
}

impl<R> Default for RuleList<R> {
    fn default() -> Self {
        RuleList { rules: ArcSwap::from_pointee(Vec::new()), load_lock: std::sync::Mutex::new(()) }
    }
}

/// What a rule hashes for deduplication: equal rules must hash equal data (rules that differ may, and are then
/// compared in full). A few identifying fields are enough: the resource, the origin, the threshold.
pub(crate) trait DedupKey {
    /// Feeds the identifying fields to `h`.
    fn dedup_key<H: Hasher>(&self, h: &mut H);
    /// Whether `other` repeats this rule in a loaded list (only the first of repeats is kept): equality,
    /// unless a kind leaves out fields that do not make a rule (Java's `equals` leaves out the id).
    fn repeats(&self, other: &Self) -> bool
    where
        Self: PartialEq,
    {
        self == other
    }
}

/// Hashes a threshold so that values equal as `f64` hash equal (`0.0 == -0.0`).
pub(crate) fn hash_f64<H: Hasher>(v: f64, h: &mut H) {
    h.write_u64(if v == 0.0 { 0 } else { v.to_bits() });
}

/// `rules` without repeats, in first-seen order, in time near-linear in their number (rules are hashed by
/// [`DedupKey`] and compared in full only with rules of the same hash).
pub(crate) fn dedup<R: PartialEq + DedupKey>(rules: impl IntoIterator<Item = R>) -> Vec<R> {
    let rules = rules.into_iter();
    let mut unique: Vec<R> = Vec::with_capacity(rules.size_hint().0);
    let mut seen: HashMap<u64, Vec<usize>> = HashMap::with_capacity(rules.size_hint().0);
    for rule in rules {
        let same_hash = seen.entry(key_of(&rule)).or_default();
        if !same_hash.iter().any(|&i| unique[i].repeats(&rule)) {
            same_hash.push(unique.len());
            unique.push(rule);
        }
    }
    unique
}

impl<R: Clone + PartialEq + DedupKey> RuleList<R> {
    /// Replaces the list: every rule is validated first (the first invalid one rejects the whole set and
    /// nothing changes), normalized and deduplicated. Unless the result equals the list in force, `install`
    /// builds and publishes the compiled rules (it may still reject the set), then the list is stored.
    /// Returns whether anything changed.
    pub(crate) fn replace(
        &self,
        rules: Vec<R>,
        validate: impl Fn(&R, usize) -> Result<(), RuleError>,
        normalize: impl Fn(R) -> R,
        install: impl FnOnce(&[R]) -> Result<(), RuleError>,
    ) -> Result<bool, RuleError> {
        for (i, r) in rules.iter().enumerate() {
            validate(r, i)?;
        }
        let unique = dedup(rules.into_iter().map(normalize));
        let _g = self.load_lock.lock().unwrap_or_else(|e| e.into_inner());
        if **self.rules.load() == unique {
            return Ok(false);
        }
        install(&unique)?;
        self.rules.store(Arc::new(unique));
        Ok(true)
    }

    /// Builds and publishes the compiled rules again from the list in force (under the load lock).
    pub(crate) fn reinstall(&self, install: impl FnOnce(&[R]) -> Result<(), RuleError>) -> Result<(), RuleError> {
        let _g = self.load_lock.lock().unwrap_or_else(|e| e.into_inner());
        install(&self.rules.load())
    }

    /// The rules in force.
    pub(crate) fn get(&self) -> Vec<R> {
        self.rules.load().as_ref().clone()
    }
}

/// Groups compiled rule states by resource, reusing the state of a rule equal to one in force (so a reload
/// keeps a limiter's or a counter's state) and building the others with `new`. `old` gives the states in
/// force for a resource (those that may be reused); they are indexed by [`DedupKey`], so the grouping takes
/// time near-linear in the number of rules, however many a resource has.
pub(crate) fn group_reusing<'a, R: PartialEq + DedupKey + 'a, S>(
    unique: impl IntoIterator<Item = &'a R>,
    resource: impl Fn(&R) -> &str,
    old: impl Fn(&str) -> Vec<Arc<S>>,
    rule_of: impl Fn(&S) -> &R,
    new: impl Fn(&R) -> S,
) -> HashMap<String, Vec<Arc<S>>> {
    let mut by_resource: HashMap<String, Vec<Arc<S>>> = HashMap::new();
    let mut old_by_key: HashMap<String, HashMap<u64, Vec<Arc<S>>>> = HashMap::new();
    for rule in unique {
        let name = resource(rule);
        let index = old_by_key.entry(name.to_string()).or_insert_with(|| {
            let mut index: HashMap<u64, Vec<Arc<S>>> = HashMap::new();
            for state in old(name) {
                index.entry(key_of(rule_of(&state))).or_default().push(state);
            }
            index
        });
        let reused = index.get(&key_of(rule)).and_then(|same| same.iter().find(|s| rule_of(s) == rule).cloned());
        let state = reused.unwrap_or_else(|| Arc::new(new(rule)));
        by_resource.entry(name.to_string()).or_default().push(state);
    }
    by_resource
}

fn key_of<R: DedupKey>(rule: &R) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rule.dedup_key(&mut h);
    h.finish()
}

/// The rules of each resource that matched a regex rule of a kind's rule set, resolved once per resource and
/// rule set (when the resource is created or the set loads, never per call).
pub(crate) struct Matched<R>(std::sync::Mutex<HashMap<String, Arc<R>>>);

impl<R> Default for Matched<R> {
    fn default() -> Self {
        Matched(std::sync::Mutex::default())
    }
}

impl<R> Matched<R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<R>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The rules of `name`: `exact` alone when the set has no pattern; else the resolved ones, resolving
    /// (and keeping) them on first use, or `exact` when no pattern matches.
    pub(crate) fn for_resource(
        &self,
        name: &str,
        has_patterns: bool,
        exact: &HashMap<String, Arc<R>>,
        resolve: impl FnOnce(&str) -> Option<Arc<R>>,
    ) -> Option<Arc<R>> {
        if !has_patterns {
            return exact.get(name).cloned();
        }
        let mut matched = self.lock();
        if let Some(r) = matched.get(name) {
            return Some(r.clone());
        }
        match resolve(name) {
            Some(r) => {
                matched.insert(name.to_string(), r.clone());
                Some(r)
            }
            None => exact.get(name).cloned(),
        }
    }

    /// The resources `old` resolved, resolved again by `resolve` (given their old rules, so that rules that
    /// stay keep their state); a resource no pattern matches any more is dropped.
    pub(crate) fn resolved_again(old: &Matched<R>, resolve: impl Fn(&str, &R) -> Option<Arc<R>>) -> Matched<R> {
        let old = std::mem::take(&mut *old.lock());
        let again = old.into_iter().filter_map(|(name, rules)| resolve(&name, &rules).map(|r| (name, r))).collect();
        Matched(std::sync::Mutex::new(again))
    }
}
