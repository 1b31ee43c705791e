//! The state every handle of one engine shares ([`Shared`]): the clock, the configuration, the rule kinds'
//! managers and states, the resources and their nodes, the interned contexts and origins, the user slots and
//! the listeners. It sits below everything that holds it (resources, contexts, the chain, entries), so that
//! none of them imports the engine's handle ([`Sentinel`](crate::Sentinel), `engine/mod.rs`), which sits on top.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::authority::AuthorityManager;
use crate::circuit_breaker::DegradeManager;
use crate::clock::EngineClock;
use crate::config::{Config, CONTEXT_OVERFLOW, UNTRACKED_ORIGIN, UNTRACKED_ORIGIN_ID};
use crate::context::{ContextInfo, ContextState, EngineOverride, OriginInfo, DEFAULT_CONTEXT_NAME};
use crate::engine::extensions::Extensions;
use crate::error::BlockError;
use crate::flow::manager::FlowManager;
use crate::node::{Children, EntranceNode};
use crate::param_flow::ParamFlowManager;
use crate::resource::inner::ResourceInner;
use crate::slot::CustomSlots;
use crate::stat::StatNode;
use crate::system::SystemManager;

/// The regex rules' patterns a resource name matches, each with its rule kind, in the kinds' order.
pub(super) type PatternKey = Vec<(crate::error::RuleKind, Arc<str>)>;
/// The resources names past the cap share, by the patterns they match ([`Shared::shared_by_patterns`]).
pub(super) type SharedByPatterns = std::collections::HashMap<PatternKey, Arc<ResourceInner>>;

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// A predicate deciding which traced errors count (the global error filter for manual entries).
pub type ErrorFilter = dyn Fn(&(dyn StdError + 'static)) -> bool + Send + Sync;

/// Called for every blocked call: the error, the time (ms) and the permits asked.
pub type BlockListener = dyn Fn(&BlockError, u64, u32) + Send + Sync;

/// Names (resources, contexts, origins) to what they stand for. An origin is looked up on every call that has
/// one, so its name is hashed with foldhash, seeded at random per map, rather than SipHash: the names are short
/// and every map is bounded (the resource, context and origin caps), so SipHash's stronger resistance to
/// chosen collisions buys nothing here, at about five times the cost.
pub(super) type NameMap<V> = papaya::HashMap<Arc<str>, V, foldhash::fast::RandomState>;

/// How long after a second ends on a real clock (not a [`ManualClock`](crate::clock::ManualClock)) it is
/// recorded for good ([`Shared::settled_ms`]): a thread descheduled for less than this between its clock
/// reading and its stores still counts in the second's line.
#[cfg(any(feature = "logs", feature = "transport"))]
pub(crate) const SETTLE_MS: u64 = 250;

/// State shared by every handle of one engine.
pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) clock: EngineClock,
    pub(crate) config: Config,
    pub(crate) enabled: AtomicBool,
    /// The holds of the owned entries in flight, which keep this state after the last handle
    /// (`engine::keep`).
    pub(crate) holds: super::holds::Holds,
    pub(crate) inbound: StatNode,
    /// Resources by name: read lock-free; `registry_lock` serializes creation and rule refreshes.
    pub(super) resources: NameMap<Arc<ResourceInner>>,
    pub(super) registry_lock: Mutex<()>,
    pub(super) resource_list: boxcar::Vec<Arc<ResourceInner>>,
    /// Bumped whenever a resource is created (lets cached negative lookups stay valid without a lock).
    pub(crate) resource_generation: AtomicUsize,
    pub(super) default_ctx: Box<ContextInfo>,
    /// Context and origin names to their index: read lock-free; `intern_lock` serializes first sightings.
    pub(super) contexts: NameMap<usize>,
    pub(super) intern_lock: Mutex<()>,
    pub(super) context_list: boxcar::Vec<ContextInfo>,
    pub(super) empty_origin: Box<OriginInfo>,
    /// The origin of calls from origins past the cap.
    pub(super) untracked_origin: Box<OriginInfo>,
    /// Origins interned that no rule named when they were first seen (counted against the cap).
    pub(super) unnamed_origins: AtomicUsize,
    pub(super) warned_origins: AtomicBool,
    pub(super) origins: NameMap<usize>,
    pub(super) origin_list: boxcar::Vec<OriginInfo>,
    pub(crate) flow: FlowManager,
    pub(crate) degrade: DegradeManager,
    pub(crate) system: SystemManager,
    pub(crate) param: ParamFlowManager,
    pub(crate) authority: AuthorityManager,
    pub(crate) adaptive: crate::adaptive::manager::AdaptiveManager,
    pub(crate) custom_slots: ArcSwap<CustomSlots>,
    pub(crate) has_custom_slots: AtomicBool,
    pub(super) error_filter: ArcSwapOption<Box<ErrorFilter>>,
    pub(super) block_listeners: ArcSwap<Vec<Arc<BlockListener>>>,
    /// Whether `block_listeners` holds any: a blocked call then skips loading them.
    pub(super) has_block_listeners: AtomicBool,
    pub(super) warned_contexts: AtomicBool,
    pub(super) warned_resources: AtomicBool,
    /// Whether the bound on the resources names matching the same patterns share was logged as reached.
    pub(super) warned_patterns: AtomicBool,
    /// Resources created that no rule named (counted against the cap).
    pub(super) unnamed_resources: AtomicUsize,
    /// Resources created that only regex rules match (counted against a cap of the same size).
    pub(super) matched_resources: AtomicUsize,
    /// Past that cap, the resource that new names matching the same patterns share, by those patterns: one
    /// per combination of patterns names matched, at most `max_resources` (then
    /// [`RESOURCE_PATTERNS_OVERFLOW`](crate::RESOURCE_PATTERNS_OVERFLOW)).
    pub(super) shared_by_patterns: Mutex<SharedByPatterns>,
    /// Contexts created that no chain rule named (counted against the cap).
    pub(super) unnamed_contexts: AtomicUsize,
    /// Handles on a new name given [`RESOURCE_OVERFLOW`](crate::RESOURCE_OVERFLOW) because the cap was reached.
    pub(super) overflowed_resources: AtomicU64,
    /// Entries in a new context run in [`CONTEXT_OVERFLOW`] because the cap was reached.
    pub(super) overflowed_contexts: AtomicU64,
    /// What integrations observe beyond the windows (histograms, blocks by kind), once one asks.
    pub(crate) observers: crate::observe::Observers,
    /// What integrations keep per engine (the gateway's rules).
    pub(crate) extensions: Extensions,
    /// The test-only kind's rules (slot/every_nth.rs).
    #[cfg(test)]
    pub(crate) every_nth: crate::slot::every_nth::EveryNthRules,
}

impl Shared {
    /// The state of a new engine with `config` and `clock`.
    pub(super) fn new(config: Config, clock: EngineClock) -> Shared {
        let default_ctx = Box::new(ContextInfo {
            id: 0,
            entrance: EntranceNode { name: DEFAULT_CONTEXT_NAME.into(), children: Children::default() },
        });
        let empty_origin = Box::new(OriginInfo::new(0, "".into()));
        let untracked_origin = Box::new(OriginInfo::new(UNTRACKED_ORIGIN_ID, UNTRACKED_ORIGIN.into()));
        Shared {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            clock,
            config,
            enabled: AtomicBool::new(true),
            holds: super::holds::Holds::new(),
            inbound: StatNode::new(),
            resources: NameMap::default(),
            registry_lock: Mutex::new(()),
            resource_list: boxcar::Vec::new(),
            resource_generation: AtomicUsize::new(0),
            default_ctx,
            contexts: NameMap::default(),
            intern_lock: Mutex::new(()),
            context_list: boxcar::Vec::new(),
            empty_origin,
            untracked_origin,
            unnamed_origins: AtomicUsize::new(0),
            warned_origins: AtomicBool::new(false),
            origins: NameMap::default(),
            origin_list: boxcar::Vec::new(),
            flow: FlowManager::default(),
            degrade: DegradeManager::default(),
            system: SystemManager::default(),
            param: ParamFlowManager::default(),
            authority: AuthorityManager::default(),
            adaptive: crate::adaptive::manager::AdaptiveManager::default(),
            custom_slots: ArcSwap::from_pointee(CustomSlots::default()),
            has_custom_slots: AtomicBool::new(false),
            error_filter: ArcSwapOption::empty(),
            block_listeners: ArcSwap::from_pointee(Vec::new()),
            has_block_listeners: AtomicBool::new(false),
            warned_contexts: AtomicBool::new(false),
            warned_resources: AtomicBool::new(false),
            warned_patterns: AtomicBool::new(false),
            unnamed_resources: AtomicUsize::new(0),
            matched_resources: AtomicUsize::new(0),
            shared_by_patterns: Default::default(),
            unnamed_contexts: AtomicUsize::new(0),
            overflowed_resources: AtomicU64::new(0),
            overflowed_contexts: AtomicU64::new(0),
            observers: crate::observe::Observers::default(),
            extensions: Extensions::default(),
            #[cfg(test)]
            every_nth: Default::default(),
        }
    }

    #[inline]
    pub(crate) fn default_state(&self, override_engine: EngineOverride) -> ContextState {
        ContextState {
            engine_id: self.id,
            ctx: &*self.default_ctx as *const ContextInfo,
            origin: &*self.empty_origin as *const OriginInfo,
            cur_node: std::ptr::null(),
            depth: 0,
            era: 0,
            override_engine,
        }
    }

    /// A fresh state for context `name` (interned, entrance created on first use; `None`: the default context,
    /// without comparing names) and `origin`.
    #[inline]
    pub(crate) fn context_state(
        &self,
        name: Option<&str>,
        origin: &str,
        override_engine: EngineOverride,
    ) -> ContextState {
        let ctx = match name {
            Some(name) => self.context(name),
            None => &self.default_ctx,
        };
        let origin = self.origin(origin);
        ContextState {
            engine_id: self.id,
            ctx: ctx as *const ContextInfo,
            origin: origin as *const OriginInfo,
            cur_node: std::ptr::null(),
            depth: 0,
            era: 0,
            override_engine,
        }
    }

    /// The context with id `id` (0: the default context).
    #[inline]
    pub(crate) fn context_by_id(&self, id: u32) -> Option<&ContextInfo> {
        if id == 0 {
            return Some(&self.default_ctx);
        }
        self.named_context_by_id(id)
    }

    /// [`context_by_id`](Self::context_by_id) for a named context.
    #[inline(never)]
    fn named_context_by_id(&self, id: u32) -> Option<&ContextInfo> {
        match self.context_list.get(id as usize - 1) {
            Some(c) if c.id == id => Some(c),
            _ => self.context_list.iter().map(|(_, c)| c).find(|c| c.id == id),
        }
    }

    /// The context named `name`, created on first use; past the cap (for a name no chain rule names),
    /// [`CONTEXT_OVERFLOW`].
    pub(crate) fn context(&self, name: &str) -> &ContextInfo {
        if name == DEFAULT_CONTEXT_NAME {
            return &self.default_ctx;
        }
        if let Some(&i) = self.contexts.pin().get(name) {
            return &self.context_list[i];
        }
        self.create_context(name)
    }

    #[cold]
    fn create_context(&self, name: &str) -> &ContextInfo {
        if let Some(ctx) = self.intern_context(name, true) {
            return ctx;
        }
        self.overflowed_contexts.fetch_add(1, Ordering::Relaxed);
        if !self.warned_contexts.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = self.config.max_contexts,
                context = name,
                "context cap reached: entries in new contexts that no chain rule names run in `{CONTEXT_OVERFLOW}`"
            );
        }
        // Not capped: always interned.
        self.intern_context(CONTEXT_OVERFLOW, false).unwrap_or(&self.default_ctx)
    }

    /// Interns the context `name`; `None` when `capped` and the cap on contexts no chain rule names is
    /// reached.
    fn intern_context(&self, name: &str, capped: bool) -> Option<&ContextInfo> {
        let _guard = self.intern_lock.lock().unwrap_or_else(|e| e.into_inner());
        let map = self.contexts.pin();
        if let Some(&i) = map.get(name) {
            return Some(&self.context_list[i]);
        }
        if capped && !self.flow.chains_through(name) {
            // As Java's `contextNameNodeMap.size() > MAX_CONTEXT_NAME_SIZE`, whose map holds the default context
            // beside `max_contexts` named ones: the default context does not count.
            if self.unnamed_contexts.load(Ordering::Relaxed) >= self.config.max_contexts {
                return None;
            }
            self.unnamed_contexts.fetch_add(1, Ordering::Relaxed);
        }
        let name: Arc<str> = name.into();
        let i = self.context_list.push(ContextInfo {
            id: self.context_list.count() as u32 + 1,
            entrance: EntranceNode { name: name.clone(), children: Children::default() },
        });
        map.insert(name, i);
        Some(&self.context_list[i])
    }

    /// The interned origin; [`UNTRACKED_ORIGIN`]'s once the cap on origins no rule names is reached.
    #[inline]
    pub(crate) fn origin(&self, name: &str) -> &OriginInfo {
        if name.is_empty() {
            return &self.empty_origin;
        }
        if let Some(info) = recent_origins::find(self.id, name) {
            // SAFETY: `find` returns only what `remember` stored for this engine: an entry of its
            // `origin_list`, which never moves nor drops an entry while the engine (borrowed as `self`) lives.
            return unsafe { &*info };
        }
        self.origin_looked_up(name)
    }

    /// [`origin`](Self::origin) past the thread's recent origins: the map, and the thread remembers what it
    /// found.
    #[inline(never)]
    fn origin_looked_up(&self, name: &str) -> &OriginInfo {
        let info = match self.origins.pin().get(name) {
            Some(&i) => &self.origin_list[i],
            None => self.create_origin(name, false),
        };
        // Only an origin interned under this name: the untracked origin (past the cap) stands for many names,
        // and a rule naming one of them later interns it.
        if info.name.as_str() == name {
            recent_origins::remember(self.id, info);
        }
        info
    }

    /// Interns an origin a rule names: always tracked, not counted against the cap.
    pub(crate) fn named_origin(&self, name: &str) -> &OriginInfo {
        match self.origins.pin().get(name) {
            Some(&i) => &self.origin_list[i],
            None => self.create_origin(name, true),
        }
    }

    #[cold]
    fn create_origin(&self, name: &str, named: bool) -> &OriginInfo {
        let _guard = self.intern_lock.lock().unwrap_or_else(|e| e.into_inner());
        let map = self.origins.pin();
        if let Some(&i) = map.get(name) {
            return &self.origin_list[i];
        }
        if !named {
            if self.unnamed_origins.load(Ordering::Relaxed) >= self.config.max_origins {
                if !self.warned_origins.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        max = self.config.max_origins,
                        origin = name,
                        "origin cap reached: calls from new origins run as `{UNTRACKED_ORIGIN}`"
                    );
                }
                return &self.untracked_origin;
            }
            self.unnamed_origins.fetch_add(1, Ordering::Relaxed);
        }
        let name: Arc<str> = name.into();
        let id =
            u32::try_from(self.origin_list.count() + 1).unwrap_or(UNTRACKED_ORIGIN_ID).min(UNTRACKED_ORIGIN_ID - 1);
        let i = self.origin_list.push(OriginInfo::new(id, name.clone()));
        map.insert(name, i);
        &self.origin_list[i]
    }

    /// The interned id of an origin, if it was ever seen.
    pub(crate) fn origin_id(&self, name: &str) -> Option<u32> {
        if name.is_empty() {
            return Some(0);
        }
        if name == UNTRACKED_ORIGIN {
            return Some(UNTRACKED_ORIGIN_ID);
        }
        self.origins.pin().get(name).map(|&i| self.origin_list[i].id)
    }

    /// A resource by name, if one was created.
    pub(crate) fn find_resource(&self, name: &str) -> Option<Arc<ResourceInner>> {
        self.resources.pin().get(name).cloned()
    }

    /// Runs `f` on every resource while no resource can be created.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn for_each_resource_locked(&self, f: impl Fn(&ResourceInner)) {
        let _guard = self.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
        for (_, inner) in self.resource_list.iter() {
            f(inner);
        }
    }

    pub(crate) fn error_filter_accepts(&self, err: &(dyn StdError + 'static)) -> bool {
        match &*self.error_filter.load() {
            Some(f) => f(err),
            None => true,
        }
    }

    #[inline]
    pub(crate) fn on_block(&self, err: &BlockError, now_ms: u64, acquire: u32) {
        if self.has_block_listeners.load(Ordering::Acquire) {
            self.notify_block(err, now_ms, acquire);
        }
    }

    #[cold]
    fn notify_block(&self, err: &BlockError, now_ms: u64, acquire: u32) {
        let listeners = self.block_listeners.load();
        for l in listeners.iter() {
            // A listener's panic is contained (like a breaker observer's): the caller gets its BlockError.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l(err, now_ms, acquire))).is_err() {
                static LOGGED: std::sync::Once = std::sync::Once::new();
                LOGGED.call_once(|| tracing::error!(resource = %err.resource(), "a block listener panicked"));
            }
        }
    }

    pub(crate) fn resources(&self) -> impl Iterator<Item = &Arc<ResourceInner>> {
        self.resource_list.iter().map(|(_, r)| r)
    }

    pub(crate) fn contexts(&self) -> impl Iterator<Item = &ContextInfo> {
        std::iter::once(&*self.default_ctx).chain(self.context_list.iter().map(|(_, c)| c))
    }

    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_nanos() / crate::clock::NANOS_PER_MILLI
    }

    /// The time up to which whole seconds are recorded for good (the command center's history, the metric
    /// log): on a manual clock, now; on any other clock, [`SETTLE_MS`] earlier, so that a call whose thread
    /// was descheduled between its clock reading and its stores at the end of a second is still in the
    /// second's line.
    #[cfg(any(feature = "logs", feature = "transport"))]
    pub(crate) fn settled_ms(&self) -> u64 {
        let now = self.now_ms();
        if self.clock.manual().is_some() {
            now
        } else {
            now.saturating_sub(SETTLE_MS)
        }
    }
}

impl crate::slot::contract::Resources for Shared {
    fn generation(&self) -> usize {
        self.resource_generation.load(Ordering::Acquire)
    }

    fn related(&self, name: &str) -> Option<crate::slot::contract::RelatedStat> {
        let res = self.find_resource(name)?;
        Some(crate::slot::contract::RelatedStat::new(res, |r| &r.cluster.stat, ResourceInner::was_entered))
    }
}

impl Shared {
    /// What rules target `name`: whether one names it exactly (or reads it: a relate rule), and the patterns
    /// of the regex rules that match it. Nothing is resolved or kept.
    pub(super) fn targets(&self, name: &str) -> (bool, PatternKey) {
        let mut patterns = Vec::new();
        let exact = self.flow.targets(name, &mut patterns)
            | self.degrade.targets(name, &mut patterns)
            | self.param.targets(name, &mut patterns)
            | self.authority.targets(name, &mut patterns)
            | self.adaptive.targets(name, &mut patterns);
        (exact, patterns)
    }

    /// Whether `inner`, shared past the cap by the names matching `patterns`, still matches exactly them under
    /// the rules in force (rules reloaded since may have changed what it matches).
    pub(super) fn still_shared_by(&self, patterns: &PatternKey, inner: &ResourceInner) -> bool {
        matches!(self.targets(&inner.name), (false, now) if now == *patterns)
    }

    /// Whether names matching `patterns` get a resource of their own kind past the cap: the one that such names
    /// share already, or a new one within the bound on those (`max_resources`).
    pub(super) fn patterns_have_room(&self, by_patterns: &SharedByPatterns, patterns: &PatternKey) -> bool {
        by_patterns.contains_key(patterns) || by_patterns.len() < self.config.max_resources
    }

    /// Starts recording response-time histograms (with `bounds_micros`, increasing) and blocks by kind for
    /// every resource, present and future. Returns the bounds in force: the first call's.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn observe(&self, bounds_micros: Arc<[u64]>) -> Arc<[u64]> {
        let bounds = self.observers.set_bounds(bounds_micros);
        self.for_each_resource_locked(|inner| self.observers.start(&inner.observed));
        bounds
    }
}

/// The origins a thread looked up last, so that a caller calling again and again from the same few origins
/// (the common case: an origin names a calling application) finds its origin without the engine's map, whose
/// lookup (a guard of the lock-free map, a hash, a probe) costs several times a comparison of the name.
///
/// Each remembered origin is an entry of an engine's `origin_list`, tagged with that engine's id. Engine ids are
/// never reused (`NEXT_ENGINE_ID`), entries of `origin_list` never move nor drop while their engine lives, and
/// an origin is only ever handed back to a caller that borrows the engine with the same id: so a remembered
/// pointer is read only while what it points to lives. An interned origin's name never changes, so a name
/// that matches is the answer the map would give.
mod recent_origins {
    use std::cell::Cell;

    use crate::context::OriginInfo;

    /// How many origins a thread remembers (most recent first).
    const WAYS: usize = 4;

    #[derive(Clone, Copy)]
    struct Remembered {
        /// 0: none (engine ids start at 1).
        engine: u64,
        info: *const OriginInfo,
    }

    const NONE: Remembered = Remembered { engine: 0, info: std::ptr::null() };

    thread_local! {
        static RECENT: [Cell<Remembered>; WAYS] = const { [const { Cell::new(NONE) }; WAYS] };
    }

    /// The origin named `name` that this thread remembers for engine `engine`.
    #[inline]
    pub(super) fn find(engine: u64, name: &str) -> Option<*const OriginInfo> {
        RECENT.with(|recent| {
            recent.iter().map(Cell::get).find_map(|r| {
                // SAFETY: `r.engine == engine` only for an origin of that engine, which the caller borrows (see
                // the module docs): `r.info` points to a live `OriginInfo`.
                (r.engine == engine && unsafe { (*r.info).name.as_str() } == name).then_some(r.info)
            })
        })
    }

    /// Remembers `info`, an origin interned by engine `engine`, as this thread's most recent one.
    pub(super) fn remember(engine: u64, info: &OriginInfo) {
        let _ = RECENT.try_with(|recent| {
            for i in (1..WAYS).rev() {
                recent[i].set(recent[i - 1].get());
            }
            recent[0].set(Remembered { engine, info });
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::authority::{AuthorityRule, AuthorityStrategy};
    use crate::{Sentinel, UNTRACKED_ORIGIN};

    #[test]
    fn a_remembered_origin_is_the_one_the_map_holds_and_each_engine_keeps_its_own() {
        let a = Sentinel::builder().build();
        let b = Sentinel::builder().build();
        let (sa, sb) = (&a.shared, &b.shared);
        let first = sa.origin("shop") as *const _;
        // Now remembered by this thread: the same interned origin, from the thread or from the map.
        assert_eq!(sa.origin("shop") as *const _, first);
        assert_eq!(sa.origin_looked_up("shop") as *const _, first);
        // The other engine's origin of the same name is its own, though this thread remembers `a`'s.
        let other = sb.origin("shop") as *const _;
        assert_ne!(other, first);
        assert_eq!(sb.origin("shop") as *const _, other);
        assert_eq!(sa.origin("shop") as *const _, first);
        // More origins than the thread remembers: every name still finds its own.
        let names: Vec<String> = (0..10).map(|i| format!("caller-{i}")).collect();
        let infos: Vec<*const _> = names.iter().map(|n| sa.origin(n) as *const _).collect();
        for _ in 0..3 {
            for (n, info) in names.iter().zip(&infos) {
                assert_eq!(sa.origin(n) as *const _, *info, "{n}");
                assert_eq!(sa.origin(n).name.as_str(), n.as_str());
            }
        }
        assert_eq!(sa.origin("shop") as *const _, first);
    }

    #[test]
    fn an_origin_past_the_cap_is_not_remembered_and_a_rule_naming_it_later_applies_at_once() {
        let engine = Sentinel::builder().max_origins(1).build();
        let r = engine.resource("api");
        assert_eq!(r.entry().origin("known").enter().unwrap().origin(), "known");
        // Past the cap: untracked, whatever this thread saw before.
        for _ in 0..3 {
            assert_eq!(r.entry().origin("late").enter().unwrap().origin(), UNTRACKED_ORIGIN);
        }
        // A rule names it: interned as itself from the next call on, on this thread too.
        engine.load_authority_rules([AuthorityRule::new("api", "late", AuthorityStrategy::Black)]).unwrap();
        let blocked = r.entry().origin("late").enter();
        assert!(blocked.is_err(), "the black list applies to the origin it names");
        assert_eq!(engine.shared.origin("late").name.as_ref(), "late");
        assert_eq!(r.entry().origin("known").enter().unwrap().origin(), "known");
    }
}
