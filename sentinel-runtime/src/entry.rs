//! Entries: one call through a resource, from the checks to the exit.

use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::NANOS_PER_MILLI;
use crate::context::{self, ContextState, OriginInfo, DEFAULT_CONTEXT_NAME};
use crate::engine::Shared;
use crate::error::BlockError;
use crate::node::{DefaultNode, OriginNode};
use crate::param_flow::HotParam;
use crate::resource::ResourceInner;
use crate::resource::{EntryType, Resource};

use crate::chain::{self, Decided, MAX_SLOT_EXITS};
use crate::flow;
use crate::rules::ResourceRules;
use crate::slot::contract::{CheckCx, ExitCx, FastCx};
use crate::slot::SlotExit;
use crate::stat::{StatNode, Writer};
use crate::wait::Wait;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// Options for one entry. Made by [`Resource::entry`].
#[must_use = "an entry builder does nothing until `enter` is called"]
pub struct EntryBuilder<'r, 'a> {
    res: ResRef<'r>,
    entry_type: EntryType,
    acquire: u32,
    origin: Option<&'a str>,
    context: Option<&'a str>,
    args: &'a [&'a dyn HotParam],
    prioritized: bool,
}

/// A resource handle borrowed (no reference counting) or owned (a `'static` entry): two direct pointers, so
/// the exit reaches the engine and the resource without a match or a second dereference.
struct ResRef<'r> {
    shared: NonNull<Shared>,
    /// The resource, with two tag bits: [`COUNTED`] when this handle owns one reference count on both
    /// (released on drop), [`DETACHED`] when it is an owned entry's (which never changes a thread's context).
    inner: NonNull<ResourceInner>,
    _borrow: PhantomData<&'r Resource>,
}

// SAFETY: a `ResRef` stands for a `&Resource` or for the two `Arc`s of a `Resource`, all `Send` and `Sync`.
unsafe impl Send for ResRef<'_> {}
unsafe impl Sync for ResRef<'_> {}

/// Tag bit: the handle owns one count on `shared` and one on `inner`.
const COUNTED: usize = 1;
/// Tag bit: the handle is an owned entry's (`Resource::entry_owned`), counted or not.
const DETACHED: usize = 2;
const TAGS: usize = COUNTED | DETACHED;
// The tags live in the low bits of a `ResourceInner` pointer.
const _: () = assert!(std::mem::align_of::<ResourceInner>() > TAGS);

impl<'r> ResRef<'r> {
    fn borrowed(r: &'r Resource) -> Self {
        ResRef { shared: NonNull::from(&*r.shared), inner: NonNull::from(&*r.inner), _borrow: PhantomData }
    }
    /// An owned entry's handle that holds no counts, for a resource that lives until the process ends.
    ///
    /// # Safety
    /// `r`'s engine is immortal: the engine's `Shared` is never dropped (`Shared::immortal`), and every
    /// resource is held by the engine's `resource_list`, which only grows
    /// and is dropped only with `Shared`. Both pointers then stay valid for the rest of the process.
    #[inline(always)]
    unsafe fn immortal(r: &Resource) -> ResRef<'static> {
        let inner = NonNull::from(&*r.inner).map_addr(|a| a | DETACHED);
        ResRef { shared: NonNull::from(&*r.shared), inner, _borrow: PhantomData }
    }
    fn owned(r: Resource) -> ResRef<'static> {
        let shared = Arc::into_raw(r.shared) as *mut Shared;
        let inner = Arc::into_raw(r.inner) as *mut ResourceInner;
        // SAFETY: `Arc::into_raw` never returns null; the tag bits are free (`ResourceInner`'s alignment).
        unsafe {
            ResRef {
                shared: NonNull::new_unchecked(shared),
                inner: NonNull::new_unchecked(inner.map_addr(|a| a | COUNTED | DETACHED)),
                _borrow: PhantomData,
            }
        }
    }
    #[inline(always)]
    fn shared(&self) -> &'r Shared {
        // SAFETY: borrowed, the resource outlives `'r`; counted, the handle holds a count until it drops (and
        // every `&'r` taken from it is used only while the entry that holds it lives); immortal, it is never
        // freed.
        unsafe { &*self.shared.as_ptr() }
    }
    #[inline(always)]
    fn inner(&self) -> &'r ResourceInner {
        // SAFETY: as for `shared`; the tag bits are masked off.
        unsafe { &*self.inner.as_ptr().map_addr(|a| a & !TAGS) }
    }
    /// Whether this is an owned entry's handle (made by `entry_owned`): its entry never installs itself in
    /// a thread's context.
    #[inline(always)]
    fn is_owned(&self) -> bool {
        self.inner.as_ptr().addr() & DETACHED != 0
    }
}

impl Drop for ResRef<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.inner.as_ptr().addr() & COUNTED != 0 {
            self.release();
        }
    }
}

impl ResRef<'_> {
    #[cold]
    fn release(&mut self) {
        // SAFETY: counted: both pointers came from `Arc::into_raw` in `owned` and are released once, here.
        unsafe {
            drop(Arc::from_raw(self.shared.as_ptr()));
            drop(Arc::from_raw(self.inner.as_ptr().map_addr(|a| a & !TAGS)));
        }
    }
}

impl<'r> EntryBuilder<'r, 'static> {
    pub(crate) fn new(res: &'r Resource) -> Self {
        Self::with(ResRef::borrowed(res), res.entry_type)
    }
}

impl EntryBuilder<'static, 'static> {
    /// An entry that keeps `res` alive: by a clone of its counts, or by nothing when its engine is immortal
    /// (the global engine, a leaked one): every resource is held by its engine until the engine drops.
    #[inline]
    pub(crate) fn owned(res: &Resource) -> Self {
        if res.shared.immortal.load(Ordering::Relaxed) {
            // SAFETY: the engine is immortal (a relaxed load that reads `true` reads the store made when its
            // last handle was put out of reach of any drop; see `Sentinel::immortal`).
            return Self::with(unsafe { ResRef::immortal(res) }, res.entry_type);
        }
        Self::with(ResRef::owned(res.clone()), res.entry_type)
    }
}

impl<'r> EntryBuilder<'r, 'static> {
    fn with(res: ResRef<'r>, entry_type: EntryType) -> Self {
        EntryBuilder { res, entry_type, acquire: 1, origin: None, context: None, args: &[], prioritized: false }
    }
}

impl<'r, 'a> EntryBuilder<'r, 'a> {
    /// Inbound or outbound (defaults to the handle's type).
    pub fn entry_type(mut self, t: EntryType) -> Self {
        self.entry_type = t;
        self
    }
    /// How many permits the call takes (default 1).
    pub fn acquire(mut self, n: u32) -> Self {
        self.acquire = n;
        self
    }
    /// The caller's origin, used when no context is active on this thread (the entry then runs in its own
    /// context, exited with it).
    pub fn origin<'b>(self, origin: &'b str) -> EntryBuilder<'r, 'b>
    where
        'a: 'b,
    {
        EntryBuilder { origin: Some(origin), ..self }
    }
    /// The context name, used when no context is active on this thread. The default context's name (or an
    /// empty one) is the same as naming none, and takes the same path as naming none.
    pub fn context<'b>(self, name: &'b str) -> EntryBuilder<'r, 'b>
    where
        'a: 'b,
    {
        EntryBuilder { context: context::named_context(name), ..self }
    }
    /// The call's hot-parameter values, in argument order.
    pub fn args<'b>(self, args: &'b [&'b dyn HotParam]) -> EntryBuilder<'r, 'b>
    where
        'a: 'b,
    {
        EntryBuilder { args, ..self }
    }
    /// Marks the call prioritized: over a QPS limit it may borrow from the next window and wait.
    pub fn prioritized(mut self, p: bool) -> Self {
        self.prioritized = p;
        self
    }

    /// Runs the checks; a queueing decision sleeps the thread (with a manual clock, nothing sleeps: see
    /// [`Entry::waited`]).
    ///
    /// An entry of a borrowed handle ([`Resource::entry`]) becomes the innermost entry of this thread's
    /// context until it exits: entries made meanwhile on this thread are its children and inherit its context
    /// and origin. Such an entry belongs to this thread's stack; exit it here. An entry of an owned handle
    /// ([`Resource::entry_owned`]) joins the active context but never changes the thread's context (like
    /// Java's `SphU.asyncEntry`), so it may move to and exit on any thread; [`Entry::in_scope`] and
    /// [`Entry::instrument`] run work with it as the innermost entry.
    #[inline(always)]
    pub fn enter(self) -> Result<Entry<'r>, BlockError> {
        let install = !self.res.is_owned();
        self.enter_with(true, install)
    }

    /// Runs the checks now; a queueing decision then awaits a timer instead of blocking the thread, and so
    /// does a cluster rule whose leased tokens ran out (it awaits the token service, at most its timeout,
    /// then decides again). The returned future holds only the entry (not the hot-parameter arguments), so
    /// it is `Send`; with hot-parameter arguments, a cluster rule with no token in hand is decided at once by
    /// its local fallback instead of waiting (deciding again would need the arguments).
    ///
    /// The entry joins the active context (if any) but never changes the thread's context: the future may be
    /// polled on any thread and the entry dropped anywhere. Use [`Entry::instrument`] to run a future with
    /// the entry as its innermost entry.
    pub fn enter_async(self) -> impl std::future::Future<Output = Result<Entry<'r>, BlockError>> + Send + 'r {
        let wait = if self.args.is_empty() { Wait::Async(0) } else { Wait::Now };
        let first = match self.enter_or_wait(wait, false) {
            Ok(decided) => Ok(decided),
            Err((b, pending)) => Err((Retry::of(b), pending)),
        };
        async move {
            let e = match first {
                Ok(decided) => decided?,
                Err((retry, pending)) => retry.run(pending).await?,
            };
            if e.wait_nanos > 0 && e.shared().clock.manual().is_none() {
                futures_timer::Delay::new(Duration::from_nanos(e.wait_nanos)).await;
            }
            Ok(e)
        }
    }

    /// Runs the checks without waiting: the entry says how long the call should wait ([`Entry::waited`]).
    /// Like [`enter`](EntryBuilder::enter), a borrowed handle's entry becomes the thread's innermost entry.
    /// A cluster rule with no leased token in hand is decided by its local fallback.
    #[inline(always)]
    pub fn decide(self) -> Result<Entry<'r>, BlockError> {
        let install = !self.res.is_owned();
        self.enter_with(false, install)
    }

    /// One step of an async entry (annotated `async fn`s): the decision (installed like
    /// [`decide`](EntryBuilder::decide)'s), or `None` when a cluster rule's lease is empty and the call must
    /// await `pending` and then decide again (with a new builder). `deadline`: the deadline of the wait under
    /// way (0 before the first wait).
    #[inline(always)]
    pub(crate) fn decide_or_wait(
        self,
        deadline: u64,
        pending: &mut Option<flow::token_service::Pending>,
    ) -> Option<Result<Entry<'r>, BlockError>> {
        let install = !self.res.is_owned();
        match self.enter_or_wait(Wait::Async(deadline), install) {
            Ok(decided) => Some(decided),
            Err((_, p)) => {
                *pending = Some(p);
                None
            }
        }
    }

    /// The whole entry path, waiting as `sleep` says; `install` as for [`enter_or_wait`](Self::enter_or_wait).
    #[inline(always)]
    fn enter_with(self, sleep: bool, install: bool) -> Result<Entry<'r>, BlockError> {
        self.entry_path::<Result<Entry<'r>, BlockError>>(if sleep { Wait::Blocking(0) } else { Wait::Now }, install)
    }

    /// [`entry_path`](Self::entry_path) for an async caller: `Err` gives the builder back with the wait a cluster
    /// rule asked for.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn enter_or_wait(
        self,
        wait: Wait,
        install: bool,
    ) -> Result<Result<Entry<'r>, BlockError>, (Self, flow::token_service::Pending)> {
        self.entry_path::<MayWait<'r, 'a>>(wait, install)
    }

    /// The whole entry path; the entry is built once, in place, at the end. `install`: the entry becomes the
    /// innermost entry of the thread's context (a borrowed, synchronous entry). A cluster rule's wait blocks
    /// here ([`Wait::Blocking`]) or, for an outcome that can hand the call back ([`MayWait`], with
    /// [`Wait::Async`]), returns the builder and the wait. The outcome type is static, so the synchronous
    /// path compiles to what it was before cluster waits existed.
    #[inline(always)]
    fn entry_path<O: PathResult<'r, 'a>>(self, wait: Wait, install: bool) -> O {
        let sleep = matches!(wait, Wait::Blocking(_));
        // `Shared` and `ResourceInner` stay alive as long as the entry that `self.res` moves into.
        let shared: &'r Shared = self.res.shared();
        let inner: &'r ResourceInner = self.res.inner();
        let outer = context::current();
        if !shared.enabled.load(Ordering::Relaxed) {
            return O::decided(Ok(Entry::unchecked(self.res)));
        }

        // The context: the active one, or a fresh one owned by this entry.
        let fresh = outer.engine_id != shared.id;
        let (state, touches_tls) = if !fresh {
            // An active context (a null one was refused by the context cap: Java's NullContext).
            (outer, install)
        } else {
            let st = match (self.context, self.origin) {
                (None, None) => shared.default_state(outer.override_engine),
                // `name` is never the default context's (`EntryBuilder::context` leaves it out).
                (name, origin) => shared.context_state(
                    name.unwrap_or(DEFAULT_CONTEXT_NAME),
                    origin.unwrap_or(""),
                    outer.override_engine,
                ),
            };
            // Another engine's context is active: enter without touching it.
            (st, install && outer.engine_id == 0)
        };
        // SAFETY: contexts and origins are never freed while the engine (kept alive by `res`) lives; a state of
        // this engine always has a context (past the cap, the overflow context).
        let ctx = unsafe { &*state.ctx };
        let origin = unsafe { &*state.origin };

        let node_arc = inner.node_for(ctx.id);
        if state.cur_node.is_null() {
            ctx.entrance.children.ensure(node_arc);
        } else {
            // SAFETY: the parent entry's node lives as long as the engine.
            unsafe { (*state.cur_node).children.ensure(node_arc) };
        }
        let node: &'r DefaultNode = node_arc;
        let origin_node: Option<&'r OriginNode> = if origin.id == 0 {
            None
        } else {
            Some(inner.cluster.origin_node(origin.id, &origin.name, shared.config.max_origins_per_resource))
        };
        let inbound = self.entry_type == EntryType::In;
        let own = node.records();
        let site = Site {
            shared,
            inner,
            node,
            ctx,
            origin,
            nodes: Nodes::new(node, own, inner, origin_node, inbound, shared),
        };

        let now_nanos = shared.clock.now_nanos();
        let now_ms = now_nanos / NANOS_PER_MILLI;
        let mut checks = Decided::default();
        // The wait mode rides in `checks` (blocking is its zero: `enter` stores nothing); a retry's deadline
        // is kept where only the cluster rule's slow path looks for it.
        if wait.mode() != 0 {
            checks.tally.wait_mode = wait.mode();
        }
        let _deadline = crate::wait::DeadlineScope::enter(wait.deadline());
        let needs_checks = inner.has_rules.load(Ordering::Acquire)
            || (inbound && shared.system.active())
            || shared.has_custom_slots.load(Ordering::Acquire);
        if needs_checks {
            // The common case (one simple flow rule, closed breakers, nothing else) is decided without building
            // the general check context; anything else takes the general path, in the same read section.
            let general = self.prioritized
                || (inbound && shared.system.active())
                || shared.has_custom_slots.load(Ordering::Acquire);
            let decided = inner.with_rules(|rules| {
                if !general && rules.fast_path && chain::admits_fast(rules, site.shared, now_ms) {
                    // The same chain, specialised: only the slots that can be on the fast path, on rules that
                    // leave a passed call holding nothing.
                    let fast = FastCx { resource: inner, now_ms, acquire: self.acquire, origin: &origin.name };
                    let (builder, site) = (&self, &site);
                    let cx = move || builder.check_cx(site, now_nanos, Wait::Now);
                    return chain::run_fast(rules, site.shared, &fast, &cx, &mut checks.tally.wait_nanos);
                }
                self.run_general(rules, &mut checks, &site, now_nanos)
            });
            if let Err(block) = decided {
                let block = if asks_to_wait(&block, wait) {
                    // A cluster rule's lease is empty: wait outside the rules' read section.
                    let Some(p) = flow::token_service::take_pending() else {
                        return O::decided(Err(block));
                    };
                    if O::HANDS_BACK && matches!(wait, Wait::Async(_)) {
                        return O::wait(self, p, block);
                    }
                    self.recheck_after_wait(p, &mut checks, &site).err()
                } else if matches!(block, BlockError::Adaptive { .. }) && sleep {
                    self.wait_for_adaptive_place(block, &mut checks, &site)
                } else {
                    Some(block)
                };
                if let Some(block) = block {
                    let w = Writer::at(now_ms);
                    site.nodes.for_each(|n| n.block_with(&w, self.acquire));
                    shared.on_block(&block, now_ms, self.acquire);
                    if let Some(o) = inner.observed.get() {
                        o.record_block(&block, self.acquire);
                    }
                    return O::decided(Err(block));
                }
            }
        }

        let w = Writer::at(now_ms);
        if checks.tally.occupied {
            site.nodes.for_each(|n| n.borrowed_pass_with(&w));
        } else {
            site.nodes.for_each(|n| n.pass_with(&w, self.acquire));
        }
        if touches_tls {
            context::set_current(ContextState {
                cur_node: node as *const DefaultNode,
                depth: state.depth + 1,
                ..state
            });
        }
        if sleep && checks.tally.wait_nanos > 0 && shared.clock.manual().is_none() {
            std::thread::sleep(Duration::from_nanos(checks.tally.wait_nanos));
        }
        O::decided(Ok(Entry {
            res: self.res,
            node: Some(node),
            origin_node,
            origin: Some(origin),
            parent: state.cur_node,
            created_nanos: now_nanos,
            wait_nanos: checks.tally.wait_nanos,
            depth: state.depth + 1,
            acquire: self.acquire,
            slots_passed: checks.tally.slots_passed,
            error: false,
            flags: Flags::of(touches_tls, fresh, inbound, own, checks.tally.occupied),
            flow: checks.flow,
            param: checks.param,
            breakers: checks.breakers,
            adaptive: checks.adaptive,
        }))
    }
}

impl EntryBuilder<'_, '_> {
    /// An adaptive rule with `maxWaitMs` refused a sync call: it waits for a place outside the rules' read
    /// section (`adaptive::slot::wait_blocking`), then the checks run again and take that place. The block
    /// that stands, if any.
    #[cold]
    #[inline(never)]
    fn wait_for_adaptive_place(&self, block: BlockError, checks: &mut Decided, site: &Site<'_>) -> Option<BlockError> {
        let clock = &site.shared.clock;
        match crate::adaptive::slot::wait_blocking(clock, &site.inner.name, &site.origin.name) {
            Ok(true) => {}
            Ok(false) => return Some(block),
            Err(timed_out) => return Some(timed_out),
        }
        *checks = Decided::default();
        let now_nanos = clock.now_nanos();
        let decided = site.inner.with_rules(|rules| self.run_general(rules, checks, site, now_nanos));
        crate::adaptive::slot::return_unused_grant();
        decided.err()
    }

    /// A cluster rule asked the call to wait (`p`): blocks the thread until its lease changed or the wait's
    /// deadline passed, and decides again, as often as the lease changes before the deadline.
    #[cold]
    #[inline(never)]
    fn recheck_after_wait(
        &self,
        mut p: flow::token_service::Pending,
        checks: &mut Decided,
        site: &Site<'_>,
    ) -> Result<(), BlockError> {
        loop {
            p.wait_blocking();
            // The checks undid what they took when the call was asked to wait.
            *checks = Decided::default();
            let _deadline = crate::wait::DeadlineScope::enter(p.deadline());
            let now_nanos = site.shared.clock.now_nanos();
            let decided = site.inner.with_rules(|rules| self.run_general(rules, checks, site, now_nanos));
            match decided {
                Err(ref b) if asks_to_wait(b, Wait::Blocking(0)) => match flow::token_service::take_pending() {
                    Some(again) => p = again,
                    None => return decided,
                },
                decided => return decided,
            }
        }
    }

    /// What the checks see of this call.
    #[inline(always)]
    fn check_cx<'c>(&'c self, site: &Site<'c>, now_nanos: u64, cluster_wait: Wait) -> CheckCx<'c> {
        CheckCx {
            shared: site.shared,
            resource: site.inner,
            node: site.node,
            origin_node: site.nodes.origin(),
            origin: &site.origin.name,
            context_name: site.ctx.name(),
            entry_type: self.entry_type,
            acquire: self.acquire,
            prioritized: self.prioritized,
            args: &self.args,
            now_nanos,
            now_ms: now_nanos / NANOS_PER_MILLI,
            cluster_wait,
        }
    }

    /// Whether the call needs every check whatever its rules (the system rules or user slots apply).
    fn is_general(&self, shared: &Shared) -> bool {
        (self.entry_type == EntryType::In && shared.system.active()) || shared.has_custom_slots.load(Ordering::Acquire)
    }

    /// Every check in slot order (the general path), on the rules read by the caller.
    #[inline(never)]
    fn run_general(
        &self,
        rules: &ResourceRules,
        checks: &mut Decided,
        site: &Site<'_>,
        now_nanos: u64,
    ) -> Result<(), BlockError> {
        if rules.cluster_only && !self.prioritized && !self.is_general(site.shared) {
            // A lone cluster rule with a leased token in hand, decided before the general check context is
            // built (here rather than beside the fast path, which then compiles as before); without a token
            // in hand, the general path below waits, falls back or blocks.
            let now_ms = now_nanos / NANOS_PER_MILLI;
            if let Some(f) = &rules.flow {
                if chain::admits_fast(rules, site.shared, now_ms) && flow::check_cluster_only(f, now_ms, self.acquire) {
                    return Ok(());
                }
            }
        }
        let cx = self.check_cx(site, now_nanos, Wait::of_mode(checks.tally.wait_mode));
        chain::run(rules, site.shared, &cx, checks, &mut chain::Taken::default())
    }
}

/// What the entry path returns ([`EntryBuilder::entry_path`]): a decision, or, for async callers, the
/// builder and the wait a cluster rule asked for.
trait PathResult<'r, 'a>: Sized {
    /// Whether the call may be handed back to wait (else a cluster wait blocks the thread).
    const HANDS_BACK: bool;
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self;
    /// The call must wait (only called when [`HANDS_BACK`](PathResult::HANDS_BACK)); `block` is what the
    /// checks answered meanwhile.
    fn wait(b: EntryBuilder<'r, 'a>, p: flow::token_service::Pending, block: BlockError) -> Self;
}

impl<'r, 'a> PathResult<'r, 'a> for Result<Entry<'r>, BlockError> {
    const HANDS_BACK: bool = false;
    #[inline(always)]
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self {
        d
    }
    fn wait(_: EntryBuilder<'r, 'a>, _: flow::token_service::Pending, block: BlockError) -> Self {
        Err(block)
    }
}

/// A decision, or the builder back with a cluster wait.
type MayWait<'r, 'a> = Result<Result<Entry<'r>, BlockError>, (EntryBuilder<'r, 'a>, flow::token_service::Pending)>;

impl<'r, 'a> PathResult<'r, 'a> for MayWait<'r, 'a> {
    const HANDS_BACK: bool = true;
    #[inline(always)]
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self {
        Ok(d)
    }
    fn wait(b: EntryBuilder<'r, 'a>, p: flow::token_service::Pending, _: BlockError) -> Self {
        Err((b, p))
    }
}

/// What an async entry needs to decide again after waiting for a cluster lease: the handle and the options,
/// owned (the origin and context names are copied; there are no hot-parameter arguments).
struct Retry<'r> {
    res: ResRef<'r>,
    entry_type: EntryType,
    acquire: u32,
    origin: Option<String>,
    context: Option<String>,
    prioritized: bool,
}

impl<'r> Retry<'r> {
    #[cold]
    fn of(b: EntryBuilder<'r, '_>) -> Self {
        Retry {
            res: b.res,
            entry_type: b.entry_type,
            acquire: b.acquire,
            origin: b.origin.map(str::to_owned),
            context: b.context.map(str::to_owned),
            prioritized: b.prioritized,
        }
    }

    /// Awaits the lease, decides again, and so on until the call is decided (at the latest when the wait's
    /// deadline passed: then by the rule's local fallback).
    async fn run(mut self, mut pending: flow::token_service::Pending) -> Result<Entry<'r>, BlockError> {
        loop {
            let deadline = pending.deadline();
            pending.wait_async().await;
            let b = EntryBuilder {
                res: self.res,
                entry_type: self.entry_type,
                acquire: self.acquire,
                origin: self.origin.as_deref(),
                context: self.context.as_deref(),
                args: &[],
                prioritized: self.prioritized,
            };
            match b.enter_or_wait(Wait::Async(deadline), false) {
                Ok(decided) => return decided,
                Err((b, again)) => {
                    self.res = b.res;
                    pending = again;
                }
            }
        }
    }
}

/// Where a call stands while it is checked: its engine, its resource, its node in its context, its context and
/// origin, and the nodes it records on (built once in [`EntryBuilder::entry_path`], seen by every check).
struct Site<'c> {
    shared: &'c Shared,
    inner: &'c ResourceInner,
    node: &'c DefaultNode,
    ctx: &'c crate::context::ContextInfo,
    origin: &'c crate::context::OriginInfo,
    nodes: Nodes<'c>,
}

/// The nodes an entry records on: the cluster node first, then the context's node (unless it shows the
/// cluster node's numbers), the origin's and the inbound node when there are.
///
/// Kept as one array and visited by reference: copying it into a temporary would read it back with 16-byte
/// loads while its 8-byte stores are still in flight (a store-forwarding stall).
struct Nodes<'r> {
    list: [Option<&'r StatNode>; 4],
}

impl<'r> Nodes<'r> {
    #[inline(always)]
    fn new(
        node: &'r DefaultNode,
        own: bool,
        inner: &'r ResourceInner,
        origin: Option<&'r OriginNode>,
        inbound: bool,
        shared: &'r Shared,
    ) -> Self {
        Nodes {
            list: [
                Some(&inner.cluster.stat),
                own.then_some(&node.stat),
                origin.map(|o| &o.stat),
                inbound.then_some(&shared.inbound),
            ],
        }
    }

    /// The origin's node, if the call has an origin.
    #[inline(always)]
    fn origin(&self) -> Option<&'r StatNode> {
        self.list[2]
    }

    /// Calls `f` on each node: one call site, so `f` is inlined once rather than outlined.
    #[inline(always)]
    fn for_each(&self, f: impl Fn(&StatNode)) {
        for n in self.list.iter().flatten() {
            f(n);
        }
    }
}

/// Whether a check that answered `block` asked the call to wait for a cluster lease instead (the wait is in
/// `flow::token_service::take_pending`): only a cluster rule's flow block can be one, and only when the call may
/// wait. Looked at on the blocked path only.
#[inline(always)]
fn asks_to_wait(block: &BlockError, wait: Wait) -> bool {
    !matches!(wait, Wait::Now)
        && matches!(block, BlockError::Flow { rule, .. } if rule.cluster_mode)
        && flow::token_service::has_pending()
}

/// A call that passed the checks. Dropping it exits the resource: on return, early return, `?` and unwind.
///
/// Kept within 128 bytes (two cache lines), so returning it by value is a few register moves.
#[must_use = "dropping an entry exits it at once"]
pub struct Entry<'r> {
    res: ResRef<'r>,
    /// The node recorded on (`None`: an unchecked entry, which records nothing).
    node: Option<&'r DefaultNode>,
    origin_node: Option<&'r OriginNode>,
    /// The caller's origin (`None` for an unchecked entry).
    origin: Option<&'r OriginInfo>,
    /// The innermost entry's node before this one (restored at exit); null at the entrance.
    parent: *const DefaultNode,
    created_nanos: u64,
    wait_nanos: u64,
    depth: u32,
    acquire: u32,
    /// Bit i set: the user slot with id i passed (its exit hook runs).
    slots_passed: u32,
    error: bool,
    /// [`Flags`] bits.
    flags: u8,
    /// What the adaptive slot holds (two bytes, in what was padding).
    adaptive: crate::adaptive::slot::AdaptiveHeld,
    /// What the slots hold until exit (see [`chain::Held`]).
    flow: crate::flow::EntryState,
    param: crate::param_flow::EntryState,
    breakers: crate::circuit_breaker::EntryState,
}

/// Puts the thread's context back when dropped (see [`Entry::scope`]).
#[must_use = "the entry's scope ends when this is dropped"]
pub(crate) struct ScopeRestore(ContextState);

impl Drop for ScopeRestore {
    #[inline]
    fn drop(&mut self) {
        context::set_current(self.0);
    }
}

/// Bits of [`Entry::flags`] (one byte keeps the entry within two cache lines).
struct Flags;
impl Flags {
    /// The entry set the thread's context (and restores it at exit).
    const TOUCHES_TLS: u8 = 1;
    /// The entry started its own context (rather than running in an active one).
    const FRESH: u8 = 2;
    const INBOUND: u8 = 4;
    /// The context's node recorded the entry (see [`DefaultNode`]).
    const OWN: u8 = 8;
    /// A prioritized call admitted by borrowing a later window.
    const OCCUPIED: u8 = 16;
    /// The call failed by overload ([`Entry::set_overload`]).
    const OVERLOAD: u8 = 32;
    /// The flags as bits 0 to 4, in the order of the constants above (shifts: fewer instructions than
    /// selecting each constant).
    #[inline(always)]
    fn of(touches_tls: bool, fresh: bool, inbound: bool, own: bool, occupied: bool) -> u8 {
        (touches_tls as u8)
            | ((fresh as u8) << 1)
            | ((inbound as u8) << 2)
            | ((own as u8) << 3)
            | ((occupied as u8) << 4)
    }
}

// SAFETY: the parent pointer refers to an engine-owned `Sync` node that outlives the entry (the entry borrows
// the engine through `res`); everything else is `Send` and `Sync`.
unsafe impl Send for Entry<'_> {}
unsafe impl Sync for Entry<'_> {}

impl<'r> Entry<'r> {
    fn unchecked(res: ResRef<'r>) -> Self {
        Entry {
            res,
            node: None,
            origin_node: None,
            origin: None,
            parent: std::ptr::null(),
            created_nanos: 0,
            wait_nanos: 0,
            depth: 0,
            acquire: 0,
            slots_passed: 0,
            error: false,
            flags: 0,
            flow: Default::default(),
            param: Default::default(),
            breakers: Default::default(),
            adaptive: Default::default(),
        }
    }
}

impl<'r> Entry<'r> {
    pub(crate) fn shared(&self) -> &Shared {
        self.res.shared()
    }

    /// The resource's name.
    pub fn resource(&self) -> &str {
        &self.res.inner().name
    }
    /// The caller's origin (empty when none).
    pub fn origin(&self) -> &str {
        self.origin.map_or("", |o| &o.name)
    }
    /// The context's name (empty for an unchecked entry).
    pub fn context_name(&self) -> &str {
        match self.node.and_then(|n| self.res.shared().context_by_id(n.context_id)) {
            Some(c) => c.name(),
            None => "",
        }
    }
    /// How long a queueing rule made (or asked) this call wait before it passed.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.wait_nanos)
    }
    /// Whether [`waited`](Self::waited) is more than zero (the web layer's test, without building a
    /// `Duration`).
    #[cfg(feature = "tower")]
    #[inline(always)]
    pub(crate) fn waits(&self) -> bool {
        self.wait_nanos > 0
    }
    /// Whether this was a prioritized call admitted by borrowing a later window.
    pub fn is_occupied(&self) -> bool {
        self.flags & Flags::OCCUPIED != 0
    }
    /// Whether the entry was checked at all (false when the engine is disabled).
    pub fn is_checked(&self) -> bool {
        self.node.is_some()
    }
    /// The permits the call took.
    pub fn acquire_count(&self) -> u32 {
        self.acquire
    }

    /// Marks the call as failed: it counts as an exception for statistics and circuit breakers at exit.
    pub fn set_error(&mut self) {
        self.error = true;
    }

    /// Marks the call as failed by overload: the downstream refused or shed it (HTTP 429 or 503, gRPC
    /// `RESOURCE_EXHAUSTED` or `UNAVAILABLE`) or it ran past a time limit. An adaptive rule counts it as a
    /// drop, and its limit backs off (see [`crate::adaptive`]); for statistics and circuit breakers it is an
    /// error as well. The web layer and the outbound guards call it for those answers, and
    /// [`set_timed_out`](Self::set_timed_out) does.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let mut entry = engine.enter("downstream").unwrap();
    /// entry.set_overload(); // it answered 503
    /// assert!(entry.is_overload() && entry.has_error());
    /// ```
    pub fn set_overload(&mut self) {
        self.error = true;
        self.flags |= Flags::OVERLOAD;
    }

    /// Whether the call was marked as failed by overload ([`set_overload`](Self::set_overload)).
    pub fn is_overload(&self) -> bool {
        self.flags & Flags::OVERLOAD != 0
    }

    /// Traces an error: ignored when it is a [`BlockError`] or the engine's error filter rejects it.
    pub fn trace(&mut self, err: &(dyn StdError + 'static)) {
        if err.downcast_ref::<BlockError>().is_some() {
            return;
        }
        if self.res.shared().error_filter_accepts(err) {
            self.error = true;
        }
    }

    /// Marks the call as timed out after `limit`: it counts as an exception, and its response time is `limit`
    /// (so a slow-call breaker sees it as slow), whenever it is dropped afterwards. For time limits enforced
    /// outside the entry (the macro's `timeout_ms`, the web layer's `timeout`).
    pub fn set_timed_out(&mut self, limit: Duration) {
        if self.node.is_none() {
            return;
        }
        self.set_overload();
        let limit_nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        // The response time is measured from `created_nanos` at exit: place the start `limit` before now.
        self.created_nanos = self.res.shared().clock.now_nanos().saturating_sub(limit_nanos);
    }

    /// The error a timed-out call reports (see [`Entry::set_timed_out`]).
    pub fn timeout_error(&self, limit: Duration) -> crate::Timeout {
        crate::Timeout { resource: self.res.inner().name.clone(), limit }
    }

    /// Whether an error was traced.
    pub fn has_error(&self) -> bool {
        self.error
    }

    /// Exits now (the same as dropping the entry).
    pub fn exit(self) {}

    /// The thread-context state in which this entry is the innermost entry (`None` when unchecked).
    #[inline]
    fn scope_state(&self, override_engine: *const crate::Sentinel) -> Option<ContextState> {
        let node = self.node?;
        let shared = self.res.shared();
        let ctx = shared.context_by_id(node.context_id)?;
        let origin = self.origin?;
        Some(ContextState {
            engine_id: shared.id,
            ctx: ctx as *const crate::context::ContextInfo,
            origin: origin as *const crate::context::OriginInfo,
            cur_node: node as *const DefaultNode,
            depth: self.depth,
            override_engine,
        })
    }

    /// Runs `f` with this entry as the innermost entry of the thread's context: entries made in `f` are its
    /// children in the call tree and inherit its context and origin. The thread's context is put back after
    /// `f` (also when `f` panics). Meant for owned entries ([`Resource::entry_owned`], [`EntryBuilder::enter_async`]),
    /// which never install themselves.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let request = engine.resource("GET:/orders").entry_owned().origin("appA").enter().unwrap();
    /// let db = engine.resource("db");
    /// request.in_scope(|| {
    ///     let db = db.enter().unwrap();
    ///     assert_eq!(db.origin(), "appA");
    /// });
    /// assert!(engine.current_context().is_none());
    /// ```
    #[inline]
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _scope = self.scope();
        f()
    }

    /// Installs this entry as the innermost entry of the thread's context until the returned guard drops
    /// (which puts the thread's context back, also when unwinding); `None` for an unchecked entry, which
    /// installs nothing. [`in_scope`](Self::in_scope) without a closure, for callers that would otherwise move
    /// large values into one.
    #[inline]
    pub(crate) fn scope(&self) -> Option<ScopeRestore> {
        let cur = context::current();
        let state = self.scope_state(cur.override_engine)?;
        context::set_current(state);
        Some(ScopeRestore(cur))
    }

    /// A future that runs `fut` with this entry as its innermost entry, on whatever thread polls it (the
    /// entry's context is installed during every poll and while `fut` is dropped), and yields `fut`'s output
    /// with the entry, so the caller can trace an error before the entry exits. Dropped early (cancelled),
    /// it drops `fut`, then the entry: the call exits without an error.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let request = engine.resource("GET:/orders").entry_owned().origin("appA").enter().unwrap();
    /// let db = engine.resource("db");
    /// let work = async {
    ///     // Entered while the request's entry is installed: its child, with its origin.
    ///     let db = db.enter().unwrap();
    ///     db.origin().to_string()
    /// };
    /// let (origin, mut entry) = futures::executor::block_on(request.instrument(work));
    /// assert_eq!(origin, "appA");
    /// entry.set_error(); // e.g. the response was a 5xx; the entry exits when dropped
    /// ```
    pub fn instrument<F: std::future::Future>(self, fut: F) -> Instrumented<'r, F> {
        let carried = match self.scope_state(context::current().override_engine) {
            Some(state) => crate::context::CarriedContext::from_state(state),
            None => crate::context::CarriedContext::capture(),
        };
        Instrumented { inner: crate::macro_support::InContext::carrying(fut, carried), entry: Some(self) }
    }

    /// Puts back the thread's context as it was before this entry, unless it was already unwound.
    #[inline]
    fn restore_context(&self, shared: &Shared, node: &DefaultNode) {
        let cur = context::current();
        if cur.engine_id != shared.id || cur.ctx.is_null() {
            return; // an outer entry already unwound this context
        }
        // SAFETY: contexts live as long as the engine, which `res` keeps alive.
        if unsafe { (*cur.ctx).id } != node.context_id {
            return; // another context of the engine is active now
        }
        let outer = if self.flags & Flags::FRESH != 0 {
            ContextState { override_engine: cur.override_engine, ..ContextState::NONE }
        } else {
            ContextState { cur_node: self.parent, depth: self.depth - 1, ..cur }
        };
        let mine = cur.depth == self.depth && std::ptr::eq(cur.cur_node, node);
        if mine {
            context::set_current(outer);
        } else if cur.depth > self.depth {
            tracing::error!(
                resource = %self.resource(),
                "entry exited before the entries nested in it; exiting them from the context first"
            );
            context::set_current(outer);
        }
    }
}

impl Drop for Entry<'_> {
    #[inline]
    fn drop(&mut self) {
        let Some(node) = self.node else {
            return; // unchecked
        };
        let shared = self.res.shared();
        let inner = self.res.inner();
        let now_nanos = shared.clock.now_nanos();
        let now_ms = now_nanos / NANOS_PER_MILLI;
        let rt_micros = now_nanos.saturating_sub(self.created_nanos) / 1000;
        // An entry dropped by unwinding: the panic counts as an error.
        if std::thread::panicking() {
            self.error = true;
        }
        let (acquire, error) = (self.acquire, self.error);
        let w = Writer::at(now_ms);
        let (own, inbound) = (self.flags & Flags::OWN != 0, self.flags & Flags::INBOUND != 0);
        let nodes = Nodes::new(node, own, inner, self.origin_node, inbound, shared);
        nodes.for_each(|n| n.complete_with(&w, rt_micros, acquire, error));
        if let Some(o) = inner.observed.get() {
            o.record_rt(rt_micros);
        }

        let overload = self.flags & Flags::OVERLOAD != 0;
        chain::exit(shared, &ExitCx { now_nanos, now_ms, rt_micros, error, overload, acquire }, &mut self.held());
        // Before any user code runs (breaker observers, slot exit hooks), so that a panic there cannot leave
        // this entry installed in the thread's context.
        if self.flags & Flags::TOUCHES_TLS != 0 {
            self.restore_context(shared, node);
        }
        // The adaptive slot's place goes back to the rule state that gave it, read here like breakers'.
        if inner.has_breakers.load(Ordering::Acquire) || self.adaptive.holds() {
            let xcx = ExitCx { now_nanos, now_ms, rt_micros, error, overload, acquire };
            let mut held = self.held();
            inner.with_rules(|rules| chain::exit_reading_rules(rules, shared, &xcx, &mut held));
        }
        if self.slots_passed != 0 {
            self.exit_slots(shared, inner, rt_micros, error);
        }
    }
}

impl Entry<'_> {
    /// What the call holds, for the slots' exits.
    #[inline(always)]
    fn held(&mut self) -> chain::Held<'_> {
        chain::Held {
            flow: &mut self.flow,
            param: &mut self.param,
            breakers: &mut self.breakers,
            adaptive: &mut self.adaptive,
            nothing: (),
        }
    }

    /// Runs the exit hooks of the slots that passed this entry (matched by id). Every hook runs even if one
    /// panics; the first panic then goes on, unless the thread is already unwinding (a second panic would
    /// abort the process), in which case it is logged.
    #[cold]
    fn exit_slots(&self, shared: &Shared, inner: &ResourceInner, rt_micros: u64, error: bool) {
        let slots = shared.custom_slots.load();
        let exit = SlotExit { resource: &inner.name, rt_micros, error };
        let mut first_panic = None;
        for (_, id, s) in slots.slots.iter() {
            if (*id as usize) < MAX_SLOT_EXITS && self.slots_passed & (1 << id) != 0 {
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.exit(&exit))) {
                    first_panic.get_or_insert(p);
                }
            }
        }
        if let Some(p) = first_panic {
            if std::thread::panicking() {
                tracing::error!(resource = %inner.name, "a slot's exit hook panicked while the thread was unwinding");
            } else {
                std::panic::resume_unwind(p);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A future run with an entry as its innermost entry: see [`Entry::instrument`]. `Send` when the inner
    /// future is.
    #[must_use = "futures do nothing unless polled"]
    pub struct Instrumented<'r, F> {
        // Declared first, so it is dropped before the entry.
        #[pin]
        inner: crate::macro_support::InContext<F>,
        entry: Option<Entry<'r>>,
    }
}

impl<'r, F: std::future::Future> std::future::Future for Instrumented<'r, F> {
    type Output = (F::Output, Entry<'r>);

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        match this.entry.take() {
            Some(entry) => std::task::Poll::Ready((out, entry)),
            None => panic!("`Instrumented` polled after it completed"),
        }
    }
}

impl<F> fmt::Debug for Instrumented<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instrumented").field("entry", &self.entry).finish_non_exhaustive()
    }
}

impl fmt::Debug for Entry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("resource", &self.resource())
            .field("checked", &self.is_checked())
            .field("error", &self.error)
            .field("waited", &self.waited())
            .field("occupied", &self.is_occupied())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_entry_fits_in_two_cache_lines() {
        // Returned by value on every call: at 128 bytes or less the copy is a few register moves, not a call.
        assert!(std::mem::size_of::<super::Entry<'static>>() <= 128);
        assert!(std::mem::size_of::<Result<super::Entry<'static>, crate::BlockError>>() <= 128);
    }

    use super::{COUNTED, DETACHED};
    use crate::Sentinel;
    use std::sync::Arc;

    fn tags(e: &super::Entry<'_>) -> usize {
        e.res.inner.as_ptr().addr() & (COUNTED | DETACHED)
    }

    #[test]
    fn owned_entries_of_an_engine_that_can_drop_hold_a_count_on_the_engine_and_the_resource() {
        let engine = Sentinel::builder().build();
        let r = engine.resource("api");
        let counts = |r: &crate::Resource| (Arc::strong_count(&r.shared), Arc::strong_count(&r.inner));
        let before = counts(&r);
        let e = r.entry_owned().enter().unwrap();
        assert_eq!(tags(&e), COUNTED | DETACHED);
        assert_eq!(counts(&r), (before.0 + 1, before.1 + 1));
        // The entry outlives every handle and the engine itself, and still exits.
        drop((r, engine));
        drop(e);
    }

    #[test]
    fn owned_entries_of_leaked_and_global_engines_take_no_count_and_still_never_install() {
        for engine in [Sentinel::builder().build().leak(), Sentinel::global()] {
            let r = engine.resource("owned-entries-of-immortal-engines");
            let before = (Arc::strong_count(&r.shared), Arc::strong_count(&r.inner));
            let e = r.entry_owned().origin("app").enter().unwrap();
            assert_eq!(tags(&e), DETACHED, "no count, and detached from the thread's context");
            assert_eq!((Arc::strong_count(&r.shared), Arc::strong_count(&r.inner)), before);
            assert_eq!(engine.current_context(), None, "an owned entry never installs itself");
            // Exits on another thread, with the handle gone.
            drop(r);
            std::thread::spawn(move || drop(e)).join().unwrap();
            let stats = engine.cluster_stats("owned-entries-of-immortal-engines").unwrap();
            assert_eq!(stats.threads, 0);
        }
    }

    #[test]
    fn a_name_past_the_cap_gets_the_overflow_resource_whose_owned_entries_take_no_count_on_a_leaked_engine() {
        let engine = Sentinel::builder().max_resources(1).build().leak();
        let _first = engine.resource("first");
        let past = engine.resource("past-the-cap");
        assert_eq!(past.name(), crate::RESOURCE_OVERFLOW);
        let e = past.entry_owned().enter().unwrap();
        assert!(e.is_checked());
        assert_eq!(tags(&e), DETACHED, "held by its engine, as every resource");
    }
}
