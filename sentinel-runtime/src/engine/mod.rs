//! The engine's handle ([`Sentinel`]): building an engine, its resources, loading rules, contexts and the
//! global engine. The state every handle shares is in `shared.rs`, below everything that holds it; this file
//! sits on top: the resources, contexts, the chain and the entries do not import it.

mod compile;
mod extensions;
mod holds;
pub(crate) mod keep;
mod kinds;
pub(crate) mod shared;

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use crate::authority::AuthorityRule;
use crate::circuit_breaker::DegradeRule;
use crate::clock::{Clock, EngineClock, ManualClock, SystemClock};
use crate::config::{Config, ConfigError, RESOURCE_OVERFLOW};
use crate::context::{self, ContextError, ContextGuard, ContextState, EngineOverride, DEFAULT_CONTEXT_NAME};
use crate::error::{BlockError, RuleError};
use crate::flow::FlowRule;
use crate::param_flow::{ParamFlowRule, ParamRuleOwner};
use crate::resource::inner::ResourceInner;
use crate::resource::{EntryType, Resource};
use crate::slot::{CustomSlots, Slot};
use crate::system::SystemRule;
use keep::SharedHandle;
use shared::{BlockListener, PatternKey, Shared};

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
        Sentinel { shared: Arc::new(SharedHandle::new(Shared::new(self.config, clock))) }
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
    pub(crate) shared: Arc<SharedHandle>,
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
    shared: std::sync::Weak<SharedHandle>,
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

/// The resources of annotated call sites, when this engine stands in for the global one (by the site's
/// address): kept among the engine's extensions, since the engine's state holds no handle.
#[derive(Default)]
struct Sites {
    map: Mutex<HashMap<usize, usize>>,
    list: boxcar::Vec<Resource>,
}

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
        /// Puts back the engine that stood in before; the thread's context stays as `f` left it (an exit of
        /// one of its entries on another thread, read in `f`, stays applied).
        struct Restore(EngineOverride);
        impl Drop for Restore {
            fn drop(&mut self) {
                context::set_current(ContextState { override_engine: self.0, ..context::current() });
            }
        }
        let prev = context::current();
        context::set_current(ContextState { override_engine: self.as_override(), ..prev });
        let _r = Restore(prev.override_engine);
        f()
    }

    /// The engine annotated functions use on this thread: a [`scoped`](Sentinel::scoped) one, or the global.
    #[inline]
    pub fn current() -> &'static Sentinel {
        Sentinel::overriding(context::current().override_engine).unwrap_or_else(Sentinel::global)
    }

    /// This engine as the one that stands in for the global one ([`Sentinel::scoped`]).
    fn as_override(&'static self) -> EngineOverride {
        EngineOverride((self as *const Sentinel).cast())
    }

    /// The engine `o` names, if one stands in for the global one.
    #[inline]
    pub(crate) fn overriding(o: EngineOverride) -> Option<&'static Sentinel> {
        // SAFETY: an `EngineOverride` other than `NONE` is only made by `as_override`, from a `&'static
        // Sentinel`.
        (!o.0.is_null()).then(|| unsafe { &*o.0.cast::<Sentinel>() })
    }

    /// Enters the context `name` with the caller `origin` (empty for none) on this thread. If a context is
    /// already active it stays active and the guard does nothing, as in Java Sentinel.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let _ctx = engine.enter_context("http-entrance", "appA").unwrap();
    /// let e = engine.enter("queryOrder").unwrap();
    /// assert_eq!(e.origin(), "appA");
    /// ```
    pub fn enter_context(&self, name: &str, origin: &str) -> Result<ContextGuard<'_>, ContextError> {
        if name == DEFAULT_CONTEXT_NAME {
            return Err(ContextError::ReservedName);
        }
        if name.is_empty() {
            return Err(ContextError::EmptyName);
        }
        let cur = context::current_settled();
        if cur.engine_id == self.shared.id {
            return Ok(self.context_guard(None, 0));
        }
        let state = ContextState {
            era: context::next_era(),
            ..self.shared.context_state(Some(name), origin, cur.override_engine)
        };
        context::set_current(state);
        Ok(self.context_guard(Some(cur), state.era))
    }

    /// The name and origin of this thread's active context of this engine, if any.
    pub fn current_context(&self) -> Option<(String, String)> {
        let s = context::current_settled();
        if s.engine_id != self.shared.id || s.ctx.is_null() {
            return None;
        }
        // SAFETY: `s` is a state of this engine (its id was compared above, and ids are never reused), so its
        // context and origin are entries of this engine's tables, which are freed only with it.
        unsafe { Some(((*s.ctx).name().to_string(), (*s.origin).name.to_string())) }
    }

    fn context_guard(&self, restore: Option<ContextState>, era: u32) -> ContextGuard<'_> {
        ContextGuard {
            engine_id: self.shared.id,
            _engine: std::marker::PhantomData,
            restore,
            era,
            _not_send: std::marker::PhantomData,
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
            matched_resources: s.matched_resources.load(Ordering::Relaxed),
            shared_by_patterns: s.shared_by_patterns.lock().unwrap_or_else(|e| e.into_inner()).len(),
            contexts: s.unnamed_contexts.load(Ordering::Relaxed),
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

    /// The time up to which whole seconds are recorded for good: now on a manual clock, a quarter of a
    /// second earlier on any other (see `Shared::settled_ms`).
    #[cfg(any(feature = "logs", feature = "transport"))]
    pub(crate) fn settled_millis(&self) -> u64 {
        self.shared.settled_ms()
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
    /// after the cap, or take a new handle after loading them. Names that only regex rules match are capped
    /// apart: past that cap, a new one gets the resource of the first name past it that matched the same
    /// patterns (its `name` says which).
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
        let max = shared.config.max_resources;
        let at_cap = || shared.unnamed_resources.load(Ordering::Relaxed) >= max;
        let matched_at_cap = || shared.matched_resources.load(Ordering::Relaxed) >= max;
        // Past the caps, a flood of new names is answered without the lock.
        if capped && (at_cap() || matched_at_cap()) {
            match self.targets(name) {
                (false, patterns) if patterns.is_empty() && at_cap() => {
                    return self.overflow_resource(name, entry_type);
                }
                (false, patterns) if !patterns.is_empty() && matched_at_cap() => {
                    return self.shared_by_patterns(patterns, name, entry_type);
                }
                _ => {}
            }
        }
        let guard = shared.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
        let resources = shared.resources.pin();
        if let Some(inner) = resources.get(name) {
            return Resource { shared: shared.clone(), inner: inner.clone(), entry_type };
        }
        if capped {
            // A name a rule names exactly is not counted: the rules bound those. One that only regex rules
            // match is counted apart: clients may choose such names.
            match self.targets(name) {
                (false, patterns) if patterns.is_empty() => {
                    if at_cap() {
                        drop(guard);
                        return self.overflow_resource(name, entry_type);
                    }
                    shared.unnamed_resources.fetch_add(1, Ordering::Relaxed);
                }
                (false, patterns) => {
                    if matched_at_cap() {
                        drop(guard);
                        return self.shared_by_patterns(patterns, name, entry_type);
                    }
                    shared.matched_resources.fetch_add(1, Ordering::Relaxed);
                }
                (true, _) => {}
            }
        }
        let name: Arc<str> = name.into();
        let inner = Arc::new(ResourceInner::new(name.clone(), compile::rules_for(shared, &name)));
        shared.observers.start(&inner.observed);
        resources.insert(name, inner.clone());
        shared.resource_list.push(inner.clone());
        shared.resource_generation.fetch_add(1, Ordering::Release);
        Resource { shared: shared.clone(), inner, entry_type }
    }

    /// The handle given past the cap on resources that only regex rules match, for `name`, which matches
    /// `patterns`: the resource that every such name matching exactly these patterns shares (the first of them
    /// past the cap), so their rules still apply, to them together. There are at most `max_resources` of
    /// those (clients choose the names, and `n` patterns make `2^n` combinations): past that, a combination
    /// without one gets [`RESOURCE_PATTERNS_OVERFLOW`](crate::RESOURCE_PATTERNS_OVERFLOW), which every regex
    /// rule checks (its own rules among them).
    #[cold]
    fn shared_by_patterns(&self, patterns: PatternKey, name: &str, entry_type: EntryType) -> Resource {
        let shared = &self.shared;
        shared.overflowed_resources.fetch_add(1, Ordering::Relaxed);
        let mut by_patterns = shared.shared_by_patterns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = by_patterns.get(&patterns) {
            // Chosen under the rules in force then: it must still match exactly these patterns (else it is
            // replaced, in the same place).
            if shared.still_shared_by(&patterns, inner) {
                return Resource { shared: shared.clone(), inner: inner.clone(), entry_type };
            }
        }
        if !shared.patterns_have_room(&by_patterns, &patterns) {
            drop(by_patterns);
            return self.patterns_overflow(entry_type);
        }
        if !shared.warned_resources.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = shared.config.max_resources,
                resource = %name,
                "resource cap reached for names regex rules match: new names that match the same patterns now \
                 share the resource of the first of them past the cap (their rules apply to them together)"
            );
        }
        // Not counted (the registry lock is taken inside; it is never held while this lock is taken).
        let resource = self.find_or_create(name, entry_type, false);
        by_patterns.insert(patterns, resource.inner.clone());
        resource
    }

    /// The handle given past the bound on the resources that names matching the same patterns share:
    /// [`RESOURCE_PATTERNS_OVERFLOW`](crate::RESOURCE_PATTERNS_OVERFLOW), which every pattern matches.
    #[cold]
    fn patterns_overflow(&self, entry_type: EntryType) -> Resource {
        let shared = &self.shared;
        if !shared.warned_patterns.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = shared.config.max_resources,
                resource = crate::RESOURCE_PATTERNS_OVERFLOW,
                "bound reached on the resources shared by names matching the same regex patterns past the cap: \
                 names matching other combinations of patterns now share one resource that every regex rule checks"
            );
        }
        // Not counted: one resource, whatever the names.
        self.find_or_create(crate::RESOURCE_PATTERNS_OVERFLOW, entry_type, false)
    }

    /// Whether a name matching `patterns` alone gets a resource of its own kind past the cap: one that names
    /// matching these patterns share already, or a new one within the bound (else
    /// [`RESOURCE_PATTERNS_OVERFLOW`](crate::RESOURCE_PATTERNS_OVERFLOW)).
    pub(crate) fn shares_by_patterns(&self, patterns: &PatternKey) -> bool {
        let by_patterns = self.shared.shared_by_patterns.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.patterns_have_room(&by_patterns, patterns)
    }

    /// Whether the cap on names that only regex rules match is reached.
    pub(crate) fn matched_cap_reached(&self) -> bool {
        self.shared.matched_resources.load(Ordering::Relaxed) >= self.shared.config.max_resources
    }

    /// For an integration past its own bound on names (the web layer, the outbound guards): the resource
    /// `name` gets without a place of its own. Its own if it has one already or a rule names it exactly;
    /// the one that names matching the same regex patterns share past the engine's cap if only patterns
    /// match it (so their rules apply, together); `None` if no rule targets it.
    #[cfg(feature = "tower")]
    pub(crate) fn resource_beyond_bound(&self, name: &str, entry_type: EntryType) -> Option<Resource> {
        if let Some(inner) = self.shared.resources.pin().get(name) {
            return Some(Resource { shared: self.shared.clone(), inner: inner.clone(), entry_type });
        }
        match self.targets(name) {
            (true, _) => Some(self.resource_typed(name, entry_type)),
            (false, patterns) if !patterns.is_empty() => Some(self.shared_by_patterns(patterns, name, entry_type)),
            (false, _) => None,
        }
    }

    /// What rules target `name`: whether one names it exactly (or reads it: a relate rule), and the patterns
    /// of the regex rules that match it. Nothing is resolved or kept.
    pub(crate) fn targets(&self, name: &str) -> (bool, PatternKey) {
        self.shared.targets(name)
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
    /// The engine gives a name a rule names exactly its own resource past [`Config::max_resources`], and
    /// caps names only regex rules match apart (see [`resource_typed`](Self::resource_typed)); integrations
    /// that take resource names from requests (the web layer) bound how many distinct names they create,
    /// and past that bound give a name a rule targets the resource the engine would.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, flow::FlowRule};
    /// let engine = Sentinel::builder().build();
    /// engine.load_flow_rules([FlowRule::new("GET:/orders/{id}").count(10.0)]).unwrap();
    /// assert!(engine.has_rules_for("GET:/orders/{id}"));
    /// assert!(!engine.has_rules_for("GET:/orders"));
    /// ```
    pub fn has_rules_for(&self, resource: &str) -> bool {
        let (exact, patterns) = self.targets(resource);
        exact || !patterns.is_empty()
    }

    /// Names of every resource entered or created so far.
    pub fn resource_names(&self) -> Vec<String> {
        self.shared.resources().map(|r| r.name.to_string()).collect()
    }

    /// The resources entered at least once (Java's cluster nodes, which a resource's first entry makes), for
    /// the command center's node commands: a resource with only a handle or rules is left out.
    #[cfg(feature = "transport")]
    pub(crate) fn entered_resource_names(&self) -> Vec<String> {
        self.shared.resources().filter(|r| r.was_entered()).map(|r| r.name.to_string()).collect()
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
            compile::refresh_rules(&self.shared);
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
        compile::refresh_rules(&self.shared);
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
            compile::refresh_rules(&self.shared);
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
            compile::refresh_rules(&self.shared);
        }
        self.warn_unknown_rule_resources(crate::error::RuleKind::Authority);
        Ok(())
    }
    /// The authority rules in force.
    pub fn authority_rules(&self) -> Vec<AuthorityRule> {
        self.shared.authority.rules()
    }

    /// This engine's value of type `T`, created with `T::default()` on first use. Cold path: integrations
    /// look it up once (a layer when built, a command when it runs) and keep the `Arc`.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn extension<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        self.shared.extensions.get::<T>().clone()
    }

    /// The resource of an annotated call site in this engine (used when this engine stands in for the global).
    pub(crate) fn site_resource(&'static self, key: usize, name: &str, entry_type: EntryType) -> &'static Resource {
        let sites: &'static Sites = self.shared.extensions.get();
        let mut map = sites.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = map.get(&key) {
            return &sites.list[i];
        }
        let i = sites.list.push(self.site_resource_typed(name, entry_type));
        map.insert(key, i);
        &sites.list[i]
    }
}
