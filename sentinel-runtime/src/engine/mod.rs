//! The engine: rules, nodes, contexts and a clock.

mod extensions;
mod kinds;

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::authority::{AuthorityManager, AuthorityRule};
use crate::circuit_breaker::{DegradeManager, DegradeRule};
use crate::clock::{Clock, EngineClock, ManualClock, SystemClock};
use crate::config::{Config, ConfigError, CONTEXT_OVERFLOW, RESOURCE_OVERFLOW, UNTRACKED_ORIGIN, UNTRACKED_ORIGIN_ID};
use crate::context::{ContextInfo, ContextState, OriginInfo, DEFAULT_CONTEXT_NAME};
use crate::error::{BlockError, RuleError};
use crate::flow::{FlowManager, FlowRule};
use crate::node::{Children, EntranceNode};
use crate::param_flow::{ParamFlowManager, ParamFlowRule, ParamRuleOwner};
use crate::resource::{EntryType, Resource, ResourceInner};
use crate::rules::ResourceRules;
use crate::slot::{CustomSlots, Slot};
use crate::stat::StatNode;
use crate::system::{SystemManager, SystemRule};

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// A predicate deciding which traced errors count (the global error filter for manual entries).
pub type ErrorFilter = dyn Fn(&(dyn StdError + 'static)) -> bool + Send + Sync;

/// Called for every blocked call: the error, the time (ms) and the permits asked.
pub type BlockListener = dyn Fn(&BlockError, u64, u32) + Send + Sync;

impl SentinelBuilder {
    /// A builder configured from the environment ([`Config::from_env`]).
    pub fn from_env() -> Result<SentinelBuilder, ConfigError> {
        Ok(SentinelBuilder::default().config(Config::from_env()?))
    }
}

impl Sentinel {
    /// The engine's manual clock, if it runs on one (built with a manual clock or `SENTINEL_CLOCK=manual`).
    pub fn manual_clock(&self) -> Option<crate::clock::ManualClock> {
        self.shared.clock.manual().cloned()
    }
}

/// Builds an engine. See [`Sentinel::builder`].
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SentinelBuilder {
    config: Config,
    clock: Option<EngineClock>,
}

impl SentinelBuilder {
    /// Uses a manual clock (tests): time moves only when the clock is advanced, and queueing never sleeps.
    pub fn manual_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(EngineClock::Manual(clock));
        self
    }
    /// Uses the precise system clock: the default (the CPU's time-stamp counter read at entry and exit, about
    /// 10 ns each; response times to the microsecond; no thread).
    pub fn precise_clock(mut self) -> Self {
        self.clock = Some(EngineClock::System(SystemClock::precise()));
        self
    }
    /// Uses the cached system clock ([`SystemClock::cached`]): a millisecond timestamp that a ticker thread
    /// refreshes 1,000 times a second, so a read is one load (6–13 ns less per entry and exit on one
    /// thread), at the price of the ticker's wake-ups and of millisecond response times.
    pub fn cached_clock(mut self) -> Self {
        self.clock = Some(EngineClock::System(SystemClock::cached()));
        self
    }
    /// Uses a clock of your own.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(EngineClock::Custom(clock));
        self
    }
    /// Sets the application name.
    pub fn app_name(mut self, name: impl Into<String>) -> Self {
        self.config.app_name = name.into();
        self
    }
    /// Sets the context cap (see [`Config::max_contexts`]).
    pub fn max_contexts(mut self, n: usize) -> Self {
        self.config.max_contexts = n;
        self
    }
    /// Sets the resource cap (see [`Config::max_resources`]).
    pub fn max_resources(mut self, n: usize) -> Self {
        self.config.max_resources = n;
        self
    }
    /// Uses the clock of `other` (an integration's private engine keeps the application's time).
    #[cfg_attr(not(feature = "transport"), allow(dead_code))]
    pub(crate) fn clock_of(mut self, other: &Sentinel) -> Self {
        self.clock = Some(other.shared.clock.clone());
        self
    }
    /// Sets the cap on tracked caller origins (see [`Config::max_origins`]).
    pub fn max_origins(mut self, n: usize) -> Self {
        self.config.max_origins = n;
        self
    }
    /// Sets the cap on origin nodes per resource (see [`Config::max_origins_per_resource`]).
    pub fn max_origins_per_resource(mut self, n: usize) -> Self {
        self.config.max_origins_per_resource = n;
        self
    }
    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }
    /// Builds the engine.
    pub fn build(self) -> Sentinel {
        let clock = self.clock.unwrap_or_else(|| match self.config.clock {
            crate::config::ClockKind::Cached => EngineClock::System(SystemClock::cached()),
            crate::config::ClockKind::System => EngineClock::System(SystemClock::new()),
            crate::config::ClockKind::Precise => EngineClock::System(SystemClock::precise()),
            crate::config::ClockKind::Manual { start_ms } => EngineClock::Manual(ManualClock::at_millis(start_ms)),
        });
        let default_ctx = Box::new(ContextInfo {
            id: 0,
            entrance: EntranceNode { name: DEFAULT_CONTEXT_NAME.into(), children: Children::default() },
        });
        let empty_origin = Box::new(OriginInfo { id: 0, name: "".into() });
        let untracked_origin = Box::new(OriginInfo { id: UNTRACKED_ORIGIN_ID, name: UNTRACKED_ORIGIN.into() });
        Sentinel {
            shared: Arc::new(Shared {
                id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
                clock,
                config: self.config,
                enabled: AtomicBool::new(true),
                immortal: AtomicBool::new(false),
                inbound: StatNode::new(),
                resources: papaya::HashMap::new(),
                registry_lock: Mutex::new(()),
                resource_list: boxcar::Vec::new(),
                resource_generation: AtomicUsize::new(0),
                default_ctx,
                contexts: papaya::HashMap::new(),
                intern_lock: Mutex::new(()),
                context_list: boxcar::Vec::new(),
                empty_origin,
                untracked_origin,
                unnamed_origins: AtomicUsize::new(0),
                warned_origins: AtomicBool::new(false),
                origins: papaya::HashMap::new(),
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
                unnamed_resources: AtomicUsize::new(0),
                unnamed_contexts: AtomicUsize::new(0),
                overflowed_resources: AtomicU64::new(0),
                overflowed_contexts: AtomicU64::new(0),
                sites: Mutex::new(HashMap::new()),
                site_list: boxcar::Vec::new(),
                observers: crate::observe::Observers::default(),
                extensions: extensions::Extensions::default(),
                #[cfg(test)]
                every_nth: Default::default(),
            }),
        }
    }
}

/// State shared by every handle of one engine.
pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) clock: EngineClock,
    pub(crate) config: Config,
    pub(crate) enabled: AtomicBool,
    /// Set once a handle of this engine can never be dropped ([`Sentinel::leak`], the global engine), and
    /// never cleared: the engine then lives until the process ends, and so do its checked resources (each is
    /// held by `resource_list`, which only grows). An owned entry of such a resource takes no reference
    /// count ([`Resource::entry_owned`]).
    pub(crate) immortal: AtomicBool,
    pub(crate) inbound: StatNode,
    /// Resources by name: read lock-free; `registry_lock` serializes creation and rule refreshes.
    resources: papaya::HashMap<Arc<str>, Arc<ResourceInner>>,
    registry_lock: Mutex<()>,
    resource_list: boxcar::Vec<Arc<ResourceInner>>,
    /// Bumped whenever a resource is created (lets cached negative lookups stay valid without a lock).
    pub(crate) resource_generation: AtomicUsize,
    default_ctx: Box<ContextInfo>,
    /// Context and origin names to their index: read lock-free; `intern_lock` serializes first sightings.
    contexts: papaya::HashMap<Arc<str>, usize>,
    intern_lock: Mutex<()>,
    context_list: boxcar::Vec<ContextInfo>,
    empty_origin: Box<OriginInfo>,
    /// The origin of calls from origins past the cap.
    untracked_origin: Box<OriginInfo>,
    /// Origins interned that no rule named when they were first seen (counted against the cap).
    unnamed_origins: AtomicUsize,
    warned_origins: AtomicBool,
    origins: papaya::HashMap<Arc<str>, usize>,
    origin_list: boxcar::Vec<OriginInfo>,
    pub(crate) flow: FlowManager,
    pub(crate) degrade: DegradeManager,
    pub(crate) system: SystemManager,
    pub(crate) param: ParamFlowManager,
    pub(crate) authority: AuthorityManager,
    pub(crate) adaptive: crate::adaptive::manager::AdaptiveManager,
    pub(crate) custom_slots: ArcSwap<CustomSlots>,
    pub(crate) has_custom_slots: AtomicBool,
    error_filter: ArcSwapOption<Box<ErrorFilter>>,
    block_listeners: ArcSwap<Vec<Arc<BlockListener>>>,
    /// Whether `block_listeners` holds any: a blocked call then skips loading them.
    has_block_listeners: AtomicBool,
    warned_contexts: AtomicBool,
    warned_resources: AtomicBool,
    /// Resources created that no rule named (counted against the cap).
    unnamed_resources: AtomicUsize,
    /// Contexts created that no chain rule named (counted against the cap).
    unnamed_contexts: AtomicUsize,
    /// Handles on a new name given [`RESOURCE_OVERFLOW`] because the cap was reached.
    overflowed_resources: AtomicU64,
    /// Entries in a new context run in [`CONTEXT_OVERFLOW`] because the cap was reached.
    overflowed_contexts: AtomicU64,
    /// Resources of annotated call sites, when this engine stands in for the global one.
    sites: Mutex<HashMap<usize, usize>>,
    site_list: boxcar::Vec<Resource>,
    /// What integrations observe beyond the windows (histograms, blocks by kind), once one asks.
    pub(crate) observers: crate::observe::Observers,
    /// What integrations keep per engine (the gateway's rules).
    pub(crate) extensions: extensions::Extensions,
    /// The test-only kind's rules (slot/every_nth.rs).
    #[cfg(test)]
    pub(crate) every_nth: crate::slot::every_nth::EveryNthRules,
}

impl Shared {
    #[inline]
    pub(crate) fn default_state(&self, override_engine: *const Sentinel) -> ContextState {
        ContextState {
            engine_id: self.id,
            ctx: &*self.default_ctx as *const ContextInfo,
            origin: &*self.empty_origin as *const OriginInfo,
            cur_node: std::ptr::null(),
            depth: 0,
            override_engine,
        }
    }

    /// The context with id `id` (0: the default context).
    pub(crate) fn context_by_id(&self, id: u32) -> Option<&ContextInfo> {
        if id == 0 {
            return Some(&self.default_ctx);
        }
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
            // The default context counts as one.
            if self.unnamed_contexts.load(Ordering::Relaxed) + 1 >= self.config.max_contexts {
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
    pub(crate) fn origin(&self, name: &str) -> &OriginInfo {
        if name.is_empty() {
            return &self.empty_origin;
        }
        if let Some(&i) = self.origins.pin().get(name) {
            return &self.origin_list[i];
        }
        self.create_origin(name, false)
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
        let i = self.origin_list.push(OriginInfo { id, name: name.clone() });
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

    fn rules_for(&self, name: &Arc<str>) -> ResourceRules {
        let flow = self.flow.for_resource(name);
        // Origins the rules name are always tracked: interned here (and given their own node on this
        // resource when a flow rule reads it).
        let named_origins = flow
            .as_ref()
            .map(|f| f.named_origins().iter().map(|o| self.named_origin(o)).map(|o| (o.id, o.name.clone())).collect())
            .unwrap_or_default();
        let authority = self.authority.for_resource(name);
        if let Some(a) = &authority {
            for o in a.listed_origins() {
                self.named_origin(o);
            }
        }
        let degrade = self.degrade.for_resource(name);
        let mut rules = ResourceRules {
            named_origins,
            authority,
            param: self.param.for_resource(name),
            fast_path: false,
            cluster_only: false,
            flow,
            // The `"*"` breakers apply only to a resource with none of its own: kept only then, so that each
            // breaker slot reads one field.
            default_degrade: self.degrade.default_breakers_for(name).filter(|_| degrade.is_none()),
            degrade,
            adaptive: self.adaptive.for_resource(name),
            #[cfg(test)]
            every_nth: self.every_nth.for_resource(name),
        };
        rules.fast_path = !crate::chain::has_slow_rules(&rules, self)
            && rules.param.as_ref().is_none_or(|p| p.holds_nothing())
            && rules.flow.as_ref().is_none_or(|f| f.simple_limit().is_some());
        rules.cluster_only = !crate::chain::has_slow_rules(&rules, self)
            && rules.param.is_none()
            && rules.flow.as_ref().is_some_and(|f| f.cluster_only());
        rules
    }

    /// Runs `f` on every resource while no resource can be created.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn for_each_resource_locked(&self, f: impl Fn(&ResourceInner)) {
        let _guard = self.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
        for (_, inner) in self.resource_list.iter() {
            f(inner);
        }
    }

    /// Rebuilds every resource's rules after a manager changed.
    pub(crate) fn refresh_rules(&self) {
        let _guard = self.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
        // One grace period for the whole refresh, when `retired` drops (after the lock is released).
        let mut retired = crate::rcu::RetireBatch::new();
        for (_, inner) in self.resource_list.iter() {
            inner.set_rules(self.rules_for(&inner.name), &mut retired);
        }
        drop(_guard);
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
}

/// The engine: owns rules, nodes, contexts and a clock.
///
/// Use [`Sentinel::global`] in an application (annotated functions use it) and an isolated engine built with
/// [`Sentinel::builder`] and a [`ManualClock`] in tests.
///
/// ```
/// use sentinel_runtime::{Sentinel, clock::ManualClock, flow::FlowRule};
/// let clock = ManualClock::at_millis(1_700_000_000_000);
/// let engine = Sentinel::builder().manual_clock(clock.clone()).build();
/// engine.load_flow_rules(vec![FlowRule::new("api").count(2.0)]).unwrap();
/// let api = engine.resource("api");
/// let passed = (0..5).filter(|_| api.enter().is_ok()).count();
/// assert_eq!(passed, 2);
/// clock.advance_millis(1000);
/// assert!(api.enter().is_ok());
/// ```
#[derive(Clone)]
pub struct Sentinel {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("id", &self.shared.id)
            .field("app_name", &self.shared.config.app_name)
            .field("clock", &self.shared.clock)
            .finish_non_exhaustive()
    }
}

/// A handle to an engine that does not keep it alive: for observers, slots and listeners that the engine
/// itself holds (a strong [`Sentinel`] captured there would keep the engine alive forever).
///
/// ```
/// use sentinel_runtime::Sentinel;
/// let engine = Sentinel::builder().build();
/// let weak = engine.downgrade();
/// engine.on_block(move |err, _, _| {
///     if let Some(engine) = weak.upgrade() {
///         let _ = engine.diagnose(err.resource());
///     }
/// });
/// ```
#[derive(Clone, Default)]
pub struct WeakSentinel {
    shared: std::sync::Weak<Shared>,
}

impl WeakSentinel {
    /// The engine, if it is still alive.
    pub fn upgrade(&self) -> Option<Sentinel> {
        self.shared.upgrade().map(|shared| Sentinel { shared })
    }
}

impl fmt::Debug for WeakSentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakSentinel").field("alive", &(self.shared.strong_count() > 0)).finish()
    }
}

static GLOBAL: OnceLock<Sentinel> = OnceLock::new();

/// The global engine was already initialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the global Sentinel engine is already initialized; call init_global before the first entry")]
pub struct AlreadyInitialized;

impl Sentinel {
    /// A builder for an isolated engine.
    pub fn builder() -> SentinelBuilder {
        SentinelBuilder::default()
    }

    /// The process-wide engine (built with defaults on first use).
    #[inline]
    pub fn global() -> &'static Sentinel {
        GLOBAL.get_or_init(|| Sentinel::builder().build().immortal())
    }

    /// Sets up the process-wide engine; fails if it was already used or set.
    pub fn init_global(builder: SentinelBuilder) -> Result<&'static Sentinel, AlreadyInitialized> {
        let mut built = Some(builder);
        let engine = GLOBAL.get_or_init(|| {
            built.take().map(SentinelBuilder::build).unwrap_or_else(|| Sentinel::builder().build()).immortal()
        });
        if built.is_some() {
            Err(AlreadyInitialized)
        } else {
            Ok(engine)
        }
    }

    /// Leaks the engine, which then lives until the process ends: it can stand in for the global one
    /// ([`Sentinel::scoped`]), and owned entries of its resources ([`Resource::entry_owned`], the web layer's)
    /// take no reference count, as on the global engine. Each call leaks one engine: call it once per engine
    /// the process keeps, not per request or per test case in a loop.
    pub fn leak(self) -> &'static Sentinel {
        Box::leak(Box::new(self.immortal()))
    }

    /// Marks the engine immortal: the caller keeps this handle for the rest of the process (in a static, or
    /// leaked), so its count on `Shared` is never released and `Shared` is never dropped.
    ///
    /// The flag carries no data, so a relaxed store suffices: a thread that reads `true` reads this store,
    /// made after the handle's count was taken and before the handle reaches where it is never dropped
    /// (nothing between the two can drop it: the callers only move it there). Whatever the order in which
    /// other threads see it, the count it stands for is never given back.
    fn immortal(self) -> Sentinel {
        self.shared.immortal.store(true, Ordering::Relaxed);
        self
    }

    /// Runs `f` with this engine standing in for the global one on this thread: annotated functions called
    /// in `f` (and futures created in it) use this engine. Lets tests run in parallel with their own clocks.
    pub fn scoped<R>(&'static self, f: impl FnOnce() -> R) -> R {
        struct Restore(ContextState);
        impl Drop for Restore {
            fn drop(&mut self) {
                crate::context::set_current(self.0);
            }
        }
        let prev = crate::context::current();
        crate::context::set_current(ContextState { override_engine: self as *const Sentinel, ..prev });
        let _r = Restore(prev);
        f()
    }

    /// The engine annotated functions use on this thread: a [`scoped`](Sentinel::scoped) one, or the global.
    #[inline]
    pub fn current() -> &'static Sentinel {
        let s = crate::context::current();
        if s.override_engine.is_null() {
            Sentinel::global()
        } else {
            // SAFETY: only `&'static Sentinel` values are installed as overrides.
            unsafe { &*s.override_engine }
        }
    }

    /// A handle that does not keep the engine alive (see [`WeakSentinel`]).
    pub fn downgrade(&self) -> WeakSentinel {
        WeakSentinel { shared: Arc::downgrade(&self.shared) }
    }

    /// How many distinct caller origins the engine tracks now (at most [`Config::max_origins`] plus the
    /// origins rules name).
    pub fn tracked_origins(&self) -> usize {
        self.shared.origins.pin().len()
    }

    /// Where the engine stands against its caps on names (resources, contexts, caller origins): how many
    /// names count against each cap, and how often a new name was sent to the overflow resource or context
    /// because the cap was reached. [`diagnose`](Self::diagnose) and the console show it.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, RESOURCE_OVERFLOW};
    /// let engine = Sentinel::builder().max_resources(1).build();
    /// let _a = engine.resource("a");
    /// assert_eq!(engine.resource("b").name(), RESOURCE_OVERFLOW);
    /// let caps = engine.caps();
    /// assert!(caps.resource_cap_reached());
    /// assert_eq!(caps.resources_overflowed, 1);
    /// ```
    pub fn caps(&self) -> crate::config::Caps {
        let s = &self.shared;
        crate::config::Caps {
            resources: s.unnamed_resources.load(Ordering::Relaxed),
            max_resources: s.config.max_resources,
            resources_overflowed: s.overflowed_resources.load(Ordering::Relaxed),
            // The default context counts as one.
            contexts: s.unnamed_contexts.load(Ordering::Relaxed) + 1,
            max_contexts: s.config.max_contexts,
            contexts_overflowed: s.overflowed_contexts.load(Ordering::Relaxed),
            origins: s.unnamed_origins.load(Ordering::Relaxed),
            max_origins: s.config.max_origins,
        }
    }

    /// The engine's settings.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The current time of the engine's clock, ms since the epoch.
    pub fn now_millis(&self) -> u64 {
        self.shared.now_ms()
    }

    /// A timer of `duration` on the engine's clock: a real, runtime-agnostic timer on the system clock; on a
    /// [`ManualClock`] it completes when the clock is moved past its deadline (nothing waits for real time).
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, clock::ManualClock};
    /// use std::{future::Future, time::Duration};
    /// let clock = ManualClock::at_millis(1_000);
    /// let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    /// let mut sleep = std::pin::pin!(engine.sleep(Duration::from_millis(50)));
    /// let waker = futures::task::noop_waker();
    /// let mut cx = std::task::Context::from_waker(&waker);
    /// assert!(sleep.as_mut().poll(&mut cx).is_pending());
    /// clock.advance_millis(50);
    /// assert!(sleep.as_mut().poll(&mut cx).is_ready());
    /// ```
    pub fn sleep(&self, duration: std::time::Duration) -> crate::clock::Sleep {
        crate::clock::Sleep::new(&self.shared.clock, duration)
    }

    /// Turns all checking on or off (off: entries pass and nothing is recorded).
    pub fn set_enabled(&self, on: bool) {
        self.shared.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether checking is on.
    pub fn is_enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Relaxed)
    }

    /// A handle to the outbound resource `name`, created on first use. Keep it and enter it many times.
    pub fn resource(&self, name: &str) -> Resource {
        self.resource_typed(name, EntryType::Out)
    }

    /// A handle to the resource `name` with the given entry type.
    ///
    /// Past [`Config::max_resources`] a new name that no rule names gets a handle on [`RESOURCE_OVERFLOW`]
    /// (its [`name`](Resource::name) says so); load the rules before taking handles on names that may come
    /// after the cap, or take a new handle after loading them.
    pub fn resource_typed(&self, name: &str, entry_type: EntryType) -> Resource {
        self.find_or_create(name, entry_type, true)
    }

    /// A handle to the resource of an annotated function (or one the program names at start-up): never
    /// counted against the cap, since the program bounds these names.
    pub(crate) fn site_resource_typed(&self, name: &str, entry_type: EntryType) -> Resource {
        self.find_or_create(name, entry_type, false)
    }

    #[inline]
    fn find_or_create(&self, name: &str, entry_type: EntryType, capped: bool) -> Resource {
        let shared = &self.shared;
        if let Some(inner) = shared.resources.pin().get(name) {
            return Resource { shared: shared.clone(), inner: inner.clone(), entry_type };
        }
        self.create_resource(name, entry_type, capped)
    }

    #[cold]
    fn create_resource(&self, name: &str, entry_type: EntryType, capped: bool) -> Resource {
        let shared = &self.shared;
        let at_cap = || shared.unnamed_resources.load(Ordering::Relaxed) >= shared.config.max_resources;
        // Past the cap, a flood of new names is answered without the lock.
        if capped && at_cap() && !self.has_rules_for(name) {
            return self.overflow_resource(name, entry_type);
        }
        let guard = shared.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
        let resources = shared.resources.pin();
        if let Some(inner) = resources.get(name) {
            return Resource { shared: shared.clone(), inner: inner.clone(), entry_type };
        }
        if capped && !self.has_rules_for(name) {
            if at_cap() {
                drop(guard);
                return self.overflow_resource(name, entry_type);
            }
            shared.unnamed_resources.fetch_add(1, Ordering::Relaxed);
        }
        let name: Arc<str> = name.into();
        let inner = Arc::new(ResourceInner::new(name.clone(), shared.rules_for(&name)));
        shared.observers.start(&inner.observed);
        resources.insert(name, inner.clone());
        shared.resource_list.push(inner.clone());
        shared.resource_generation.fetch_add(1, Ordering::Release);
        Resource { shared: shared.clone(), inner, entry_type }
    }

    /// The handle given for `name` past the cap: [`RESOURCE_OVERFLOW`].
    #[cold]
    fn overflow_resource(&self, name: &str, entry_type: EntryType) -> Resource {
        let shared = &self.shared;
        shared.overflowed_resources.fetch_add(1, Ordering::Relaxed);
        if !shared.warned_resources.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = shared.config.max_resources,
                resource = %name,
                "resource cap reached: new names that no rule names share the resource `{RESOURCE_OVERFLOW}` \
                 (checked by system rules and rules on it); names that rules name still get their own"
            );
        }
        self.site_resource_typed(RESOURCE_OVERFLOW, entry_type)
    }

    /// Enters the resource `name` (looked up by name: keep a [`Resource`] handle on hot paths).
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let entry = engine.enter("checkout").unwrap();
    /// assert_eq!(entry.resource(), "checkout");
    /// ```
    pub fn enter(&self, name: &str) -> Result<crate::Entry<'static>, BlockError> {
        self.resource(name).entry_owned().enter()
    }

    /// An entry builder for the resource `name` (owned, `'static`).
    pub fn entry(&self, name: &str) -> crate::EntryBuilder<'static, 'static> {
        self.resource(name).entry_owned()
    }

    /// Whether a loaded flow, degrade, hot-parameter, authority or adaptive rule names `resource`, exactly or by a
    /// regex rule whose pattern matches it, or a relate rule reads it (system rules and default `"*"` breakers
    /// name no resource and do not count). A few map lookups, and the patterns when regex rules are loaded.
    ///
    /// The engine gives such a name its own resource past [`Config::max_resources`]; integrations that take
    /// resource names from requests (the web layer) bound how many distinct names they create, and use this
    /// to give a name that a rule targets its own resource past that bound.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, flow::FlowRule};
    /// let engine = Sentinel::builder().build();
    /// engine.load_flow_rules([FlowRule::new("GET:/orders/{id}").count(10.0)]).unwrap();
    /// assert!(engine.has_rules_for("GET:/orders/{id}"));
    /// assert!(!engine.has_rules_for("GET:/orders"));
    /// ```
    pub fn has_rules_for(&self, resource: &str) -> bool {
        let s = &self.shared;
        s.flow.for_resource(resource).is_some()
            || s.degrade.for_resource(resource).is_some()
            || s.param.for_resource(resource).is_some()
            || s.authority.for_resource(resource).is_some()
            || s.adaptive.governs(resource)
            || s.flow.relates_to(resource)
    }

    /// Names of every resource entered or created so far.
    pub fn resource_names(&self) -> Vec<String> {
        self.shared.resources().map(|r| r.name.to_string()).collect()
    }

    /// Adds a user slot at `order` (see [`crate::slot`] for the built-in orders).
    ///
    /// A slot's `entry` runs while the call reads the resource's rules: loading rules from it is fine (they
    /// take effect for later calls), but a slot that blocks holds back rule reloads until it returns.
    pub fn add_slot(&self, order: i32, slot: impl Slot) {
        let slot: Arc<dyn Slot> = Arc::new(slot);
        self.shared.custom_slots.rcu(|cur| {
            let mut next = CustomSlots::clone(cur);
            next.slots.push((order, next.next_id, slot.clone()));
            next.next_id += 1;
            // Stable: slots of the same order run in the order they were added.
            next.slots.sort_by_key(|(o, _, _)| *o);
            next
        });
        self.shared.has_custom_slots.store(true, Ordering::Release);
    }

    /// Sets the global error filter: [`Entry::trace`](crate::Entry::trace) counts an error only if it returns
    /// true. Block errors are never counted.
    pub fn set_error_filter(&self, f: impl Fn(&(dyn StdError + 'static)) -> bool + Send + Sync + 'static) {
        self.shared.error_filter.store(Some(Arc::new(Box::new(f))));
    }

    /// Removes the error filter (every traced error counts).
    pub fn clear_error_filter(&self) {
        self.shared.error_filter.store(None);
    }

    /// Calls `f` for every blocked call (block logs, metrics).
    pub fn on_block(&self, f: impl Fn(&BlockError, u64, u32) + Send + Sync + 'static) {
        let f: Arc<BlockListener> = Arc::new(f);
        self.shared.block_listeners.rcu(|cur| {
            let mut v = Vec::clone(cur);
            v.push(f.clone());
            v
        });
        self.shared.has_block_listeners.store(true, Ordering::Release);
    }

    /// Replaces the flow rules. An invalid rule rejects the whole set and the rules in force stay.
    pub fn load_flow_rules(&self, rules: impl IntoIterator<Item = FlowRule>) -> Result<(), RuleError> {
        if self.shared.flow.load(rules.into_iter().collect())? {
            self.shared.refresh_rules();
        }
        self.warn_unknown_rule_resources(crate::error::RuleKind::Flow);
        Ok(())
    }
    /// The state of every cluster-mode flow rule in force, in rule order: how it is decided now (leasing from
    /// the shared limit, falling back to a local limit, and why), the tokens in hand, the live instances and
    /// counters of calls to the token service. Cluster mode needs a token service (the `cluster-redis`
    /// feature's `cluster::RedisCluster`); without one the rules are decided locally (see
    /// [`ClusterRuleMode::NoService`](crate::flow::ClusterRuleMode::NoService)).
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, flow::{ClusterConfig, ClusterRuleMode, FlowRule}};
    /// let engine = Sentinel::builder().build();
    /// let mut rule = FlowRule::new("api").count(100.0);
    /// rule.cluster_mode = true;
    /// rule.cluster_config = Some(ClusterConfig::default());
    /// engine.load_flow_rules([rule]).unwrap();
    /// assert_eq!(engine.cluster_status()[0].mode, ClusterRuleMode::NoService);
    /// ```
    pub fn cluster_status(&self) -> Vec<crate::flow::ClusterRuleStatus> {
        self.shared.flow.cluster_status(self.shared.now_ms())
    }

    #[cfg_attr(not(feature = "cluster-redis"), allow(dead_code))]
    /// Registers (`Some`) or removes the cluster token service of this engine.
    pub(crate) fn set_cluster_service(
        &self,
        service: Option<Arc<dyn crate::flow::token_service::TokenService>>,
    ) -> Result<(), RuleError> {
        self.shared.flow.set_cluster_service(service)?;
        self.shared.refresh_rules();
        Ok(())
    }

    /// Removes the cluster token service `service` if it is the one registered (another may have replaced it).
    #[cfg_attr(not(feature = "cluster-redis"), allow(dead_code))]
    pub(crate) fn unregister_cluster_service(
        &self,
        service: &Arc<dyn crate::flow::token_service::TokenService>,
    ) -> Result<(), RuleError> {
        if self.shared.flow.cluster_service().is_some_and(|s| Arc::ptr_eq(&s, service)) {
            self.set_cluster_service(None)?;
        }
        Ok(())
    }

    /// Whether a cluster token service is registered on this engine (a running cluster client): Java's
    /// cluster mode "client" (`getClusterMode` answers 0), else "not started" (-1).
    pub fn has_cluster_service(&self) -> bool {
        self.shared.flow.cluster_service().is_some()
    }

    /// The cluster token service registered on this engine, if any: where it keeps the shared limits, its
    /// timeout, whether it reaches them now (for the dashboard's cluster pages).
    pub fn cluster_service_info(&self) -> Option<crate::flow::ClusterServiceInfo> {
        self.shared.flow.cluster_service().map(|s| s.info())
    }

    /// The flow rules in force.
    pub fn flow_rules(&self) -> Vec<FlowRule> {
        self.shared.flow.rules()
    }

    /// Replaces the degrade (circuit breaker) rules.
    pub fn load_degrade_rules(&self, rules: impl IntoIterator<Item = DegradeRule>) -> Result<(), RuleError> {
        if self.shared.degrade.load(rules.into_iter().collect())? {
            self.shared.refresh_rules();
        }
        self.warn_unknown_rule_resources(crate::error::RuleKind::Degrade);
        Ok(())
    }
    /// The degrade rules in force.
    pub fn degrade_rules(&self) -> Vec<DegradeRule> {
        self.shared.degrade.rules()
    }

    /// Replaces the system rules.
    pub fn load_system_rules(&self, rules: impl IntoIterator<Item = SystemRule>) -> Result<(), RuleError> {
        self.shared.system.load(rules.into_iter().collect())?;
        Ok(())
    }
    /// The system rules in force.
    pub fn system_rules(&self) -> Vec<SystemRule> {
        self.shared.system.rules()
    }

    /// Replaces the hot-parameter rules (the gateway's converted rules stay, with their counters). A rule
    /// with [`regex`](ParamFlowRule::regex) applies to every resource whose name matches.
    pub fn load_param_flow_rules(&self, rules: impl IntoIterator<Item = ParamFlowRule>) -> Result<(), RuleError> {
        self.load_param_flow_rules_of(ParamRuleOwner::User, rules.into_iter().collect())?;
        self.warn_unknown_rule_resources(crate::error::RuleKind::ParamFlow);
        Ok(())
    }
    /// The hot-parameter rules in force (the ones loaded here; the gateway's converted rules are not listed).
    pub fn param_flow_rules(&self) -> Vec<ParamFlowRule> {
        self.shared.param.rules(ParamRuleOwner::User)
    }

    /// Replaces the authority rules.
    pub fn load_authority_rules(&self, rules: impl IntoIterator<Item = AuthorityRule>) -> Result<(), RuleError> {
        if self.shared.authority.load(rules.into_iter().collect())? {
            self.shared.refresh_rules();
        }
        self.warn_unknown_rule_resources(crate::error::RuleKind::Authority);
        Ok(())
    }
    /// The authority rules in force.
    pub fn authority_rules(&self) -> Vec<AuthorityRule> {
        self.shared.authority.rules()
    }

    /// The resource of an annotated call site in this engine (used when this engine stands in for the global).
    pub(crate) fn site_resource(&'static self, key: usize, name: &str, entry_type: EntryType) -> &'static Resource {
        let mut sites = self.shared.sites.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = sites.get(&key) {
            return &self.shared.site_list[i];
        }
        let i = self.shared.site_list.push(self.site_resource_typed(name, entry_type));
        sites.insert(key, i);
        &self.shared.site_list[i]
    }
}

impl crate::slot::contract::Resources for Shared {
    fn generation(&self) -> usize {
        self.resource_generation.load(Ordering::Acquire)
    }

    fn related(&self, name: &str) -> Option<crate::slot::contract::RelatedStat> {
        let res = self.find_resource(name)?;
        Some(crate::slot::contract::RelatedStat::new(res, |r| &r.cluster.stat))
    }
}

impl Shared {
    /// Starts recording response-time histograms (with `bounds_micros`, increasing) and blocks by kind for
    /// every resource, present and future. Returns the bounds in force: the first call's.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn observe(&self, bounds_micros: Arc<[u64]>) -> Arc<[u64]> {
        let bounds = self.observers.set_bounds(bounds_micros);
        self.for_each_resource_locked(|inner| self.observers.start(&inner.observed));
        bounds
    }
}
