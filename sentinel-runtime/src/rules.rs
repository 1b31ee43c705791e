//! The rules in force for each resource, and what the checks see of an entry.
//!
//! Each rule manager keeps its rules by resource name. Whenever a manager's rules change or a resource is
//! created, the engine rebuilds that resource's [`ResourceRules`] (one atomically swapped `Arc`) from every
//! manager, so an entry reads all its rules with one lock-free load and no name lookup.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::authority::ResourceAuthority;
use crate::circuit_breaker::ResourceBreakers;
use crate::engine::Shared;
use crate::error::RuleError;
use crate::flow::ResourceFlowRules;
use crate::node::DefaultNode;
use crate::param_flow::{HotParam, ResourceParamRules};
use crate::resource::ResourceInner;
use crate::stat::StatNode;

/// The rules of every kind that apply to one resource.
#[derive(Default)]
pub(crate) struct ResourceRules {
    pub(crate) authority: Option<Arc<ResourceAuthority>>,
    pub(crate) param: Option<Arc<ResourceParamRules>>,
    pub(crate) flow: Option<Arc<ResourceFlowRules>>,
    /// The limit of the resource's only flow rule when that rule is simple (a local reject-style QPS limit on
    /// the resource's cluster node for every origin): kept here so that the common check reads it from the
    /// rules it already holds.
    pub(crate) flow_simple: Option<f64>,
    /// No authority rule, no hot-parameter rule or only ones that leave a call holding nothing
    /// ([`ResourceParamRules::holds_nothing`]), and no flow rule or one simple one: an entry that is not
    /// prioritized, while every breaker is closed, is checked by the hot-parameter rules and the flow rule
    /// alone, without the general check context.
    pub(crate) fast_path: bool,
    /// No authority or hot-parameter rule, and one flow rule, a cluster rule for every caller: an entry that
    /// is not prioritized, while every breaker is closed and a leased token is in hand, is decided by it
    /// alone.
    pub(crate) lone_cluster: bool,
    /// Degrade rules of the resource itself.
    pub(crate) degrade: Option<Arc<ResourceBreakers>>,
    /// The default (`"*"`) breakers, used only when the resource has none of its own.
    pub(crate) default_degrade: Option<Arc<ResourceBreakers>>,
    /// Origins the resource's flow rules name (interned id, name): each always has its own origin node.
    pub(crate) named_origins: Vec<(u32, Arc<str>)>,
}

impl ResourceRules {
    pub(crate) fn is_empty(&self) -> bool {
        self.authority.is_none()
            && self.param.is_none()
            && self.flow.is_none()
            && self.degrade.is_none()
            && self.default_degrade.is_none()
    }
}

/// Per-resource compiled rules of one kind, swapped atomically as a whole.
pub(crate) struct RuleMap<T> {
    map: ArcSwap<HashMap<String, Arc<T>>>,
}

impl<T> Default for RuleMap<T> {
    fn default() -> Self {
        RuleMap { map: ArcSwap::from_pointee(HashMap::new()) }
    }
}

impl<T> RuleMap<T> {
    /// The compiled rules for `resource`.
    pub(crate) fn get(&self, resource: &str) -> Option<Arc<T>> {
        self.map.load().get(resource).cloned()
    }
    /// The whole current map.
    pub(crate) fn snapshot(&self) -> Arc<HashMap<String, Arc<T>>> {
        self.map.load_full()
    }
    /// Replaces the whole map.
    pub(crate) fn store(&self, map: HashMap<String, Arc<T>>) {
        self.map.store(Arc::new(map));
    }
}

/// What a check sees of the entry being decided.
pub(crate) struct CheckCx<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) resource: &'a ResourceInner,
    /// The resource's node in the current context.
    pub(crate) node: &'a DefaultNode,
    /// The resource's node for the caller's origin (none when the origin is empty).
    pub(crate) origin_node: Option<&'a StatNode>,
    pub(crate) origin: &'a Arc<str>,
    pub(crate) context_name: &'a str,
    pub(crate) entry_type: crate::resource::EntryType,
    pub(crate) acquire: u32,
    pub(crate) prioritized: bool,
    /// The hot-parameter arguments, behind a thin reference: copying the slice itself into the context on
    /// every call costs a stalled 16-byte load, and only hot-parameter rules read it.
    pub(crate) args: &'a &'a [&'a dyn HotParam],
    pub(crate) now_nanos: u64,
    pub(crate) now_ms: u64,
    /// Whether a cluster rule whose lease is empty may make the call wait, and how.
    pub(crate) cluster_wait: crate::flow::token_service::Wait,
}

/// What the exit hooks see of an entry that passed.
pub(crate) struct ExitCx<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) now_ms: u64,
    pub(crate) rt_micros: u64,
    pub(crate) error: bool,
}

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
}

/// Hashes a threshold so that values equal as `f64` hash equal (`0.0 == -0.0`).
fn hash_f64<H: Hasher>(v: f64, h: &mut H) {
    h.write_u64(if v == 0.0 { 0 } else { v.to_bits() });
}

impl DedupKey for crate::flow::FlowRule {
    fn dedup_key<H: Hasher>(&self, h: &mut H) {
        (&self.resource, &self.limit_app).hash(h);
        hash_f64(self.count, h);
    }
}

impl DedupKey for crate::circuit_breaker::DegradeRule {
    fn dedup_key<H: Hasher>(&self, h: &mut H) {
        (&self.resource, &self.limit_app, self.time_window_sec).hash(h);
        hash_f64(self.count, h);
    }
}

impl DedupKey for crate::authority::AuthorityRule {
    fn dedup_key<H: Hasher>(&self, h: &mut H) {
        (&self.resource, &self.limit_app).hash(h);
    }
}

impl DedupKey for crate::param_flow::ParamFlowRule {
    fn dedup_key<H: Hasher>(&self, h: &mut H) {
        (&self.resource, &self.limit_app, self.param_idx).hash(h);
        hash_f64(self.count, h);
    }
}

/// `rules` without repeats, in first-seen order, in time near-linear in their number (rules are hashed by
/// [`DedupKey`] and compared in full only with rules of the same hash).
pub(crate) fn dedup<R: PartialEq + DedupKey>(rules: impl IntoIterator<Item = R>) -> Vec<R> {
    let rules = rules.into_iter();
    let mut unique: Vec<R> = Vec::with_capacity(rules.size_hint().0);
    let mut seen: HashMap<u64, Vec<usize>> = HashMap::with_capacity(rules.size_hint().0);
    for rule in rules {
        let same_hash = seen.entry(key_of(&rule)).or_default();
        if !same_hash.iter().any(|&i| unique[i] == rule) {
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
