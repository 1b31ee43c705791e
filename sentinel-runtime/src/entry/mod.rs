//! Entries: one call through a resource, from the checks to the exit.

mod builder;
mod exit;
mod path;
mod scope;

pub use builder::EntryBuilder;
#[cfg(feature = "tower")]
pub(crate) use builder::QueuedEntry;
#[doc(hidden)]
pub use path::{AskedToWait, Slow};
pub use scope::Instrumented;
#[cfg(feature = "tower")]
pub(crate) use scope::ScopeRestore;

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::context::OriginInfo;
use crate::engine::shared::Shared;
use crate::error::BlockError;
use crate::node::{DefaultNode, OriginNode};
use crate::resource::inner::ResourceInner;
use crate::resource::Resource;

use std::marker::PhantomData;
use std::ptr::NonNull;

/// A resource handle borrowed (no reference counting) or owned (a `'static` entry): two direct pointers, so
/// the exit reaches the engine and the resource without a match or a second dereference.
struct ResRef<'r> {
    shared: NonNull<Shared>,
    /// The resource, with three tag bits: [`HELD`] when this handle holds the engine's state (released on
    /// drop), [`DETACHED`] when it is an owned entry's (which never changes a thread's context),
    /// [`TURN_PENDING`] when its entry's pass waits for its turn.
    inner: NonNull<ResourceInner>,
    _borrow: PhantomData<&'r Resource>,
}

// SAFETY: a `ResRef` stands for a `&Resource`, or for a `Resource` whose engine's state it holds (the resource
// is then held by the engine), all `Send` and `Sync`.
unsafe impl Send for ResRef<'_> {}
unsafe impl Sync for ResRef<'_> {}

/// Tag bit: the handle holds the engine's state, which holds `inner` (see [`ResRef::held`]).
const HELD: usize = 1;
/// Tag bit: the handle is an owned entry's (`Resource::entry_owned`), holding or not.
const DETACHED: usize = 2;
/// Tag bit: the entry's pass waits for its turn ([`Entry::at_turn`]). The entry's own mark, kept in the handle's
/// spare bit: a field of its own would take the entry past 120 bytes (every move of it longer) and the byte
/// would take away the niche that lets a decision that may wait be returned in the room of one that may not.
const TURN_PENDING: usize = 4;
const TAGS: usize = HELD | DETACHED | TURN_PENDING;
// The tags live in the low bits of a `ResourceInner` pointer.
const _: () = assert!(std::mem::align_of::<ResourceInner>() > TAGS);

impl<'r> ResRef<'r> {
    fn borrowed(r: &'r Resource) -> Self {
        ResRef { shared: r.shared.state(), inner: NonNull::from(&*r.inner), _borrow: PhantomData }
    }
    /// An owned entry's handle that holds nothing, for a resource that lives until the process ends.
    ///
    /// # Safety
    /// `r`'s engine is immortal: the engine's `Shared` is never dropped (`SharedHandle::immortal`), and every
    /// resource is held by the engine's `resource_list`, which only grows
    /// and is dropped only with `Shared`. Both pointers then stay valid for the rest of the process.
    #[inline(always)]
    unsafe fn immortal(r: &Resource) -> ResRef<'static> {
        let inner = NonNull::from(&*r.inner).map_addr(|a| a | DETACHED);
        ResRef { shared: r.shared.state(), inner, _borrow: PhantomData }
    }
    /// An owned entry's handle on an engine that can be dropped: it takes a hold on the engine's state
    /// (`engine::keep`: a counter of the thread's stripe, not a reference count every thread writes), which
    /// keeps the state, and with it the resource (held by the engine's `resource_list`, which only grows and
    /// is dropped only with the state), until the entry is dropped.
    fn held(r: &Resource) -> ResRef<'static> {
        r.shared.holds.hold();
        let inner = NonNull::from(&*r.inner).map_addr(|a| a | HELD | DETACHED);
        ResRef { shared: r.shared.state(), inner, _borrow: PhantomData }
    }
    #[inline(always)]
    fn shared(&self) -> &'r Shared {
        // SAFETY: borrowed, the resource outlives `'r`; held, the hold keeps the state until it drops (and
        // every `&'r` taken from it is used only while the entry that holds it lives); immortal, it is never
        // freed.
        unsafe { &*self.shared.as_ptr() }
    }
    #[inline(always)]
    fn inner(&self) -> &'r ResourceInner {
        // SAFETY: as for `shared`; the tag bits are masked off.
        unsafe { &*self.inner.as_ptr().map_addr(|a| a & !TAGS) }
    }
    /// Whether the entry's pass waits for its turn ([`TURN_PENDING`]).
    #[inline(always)]
    fn turn_pending(&self) -> bool {
        self.inner.as_ptr().addr() & TURN_PENDING != 0
    }
    /// Marks the entry's pass as waiting for its turn.
    #[inline(always)]
    fn mark_turn_pending(&mut self) {
        self.inner = self.inner.map_addr(|a| a | TURN_PENDING);
    }
    /// Clears [`mark_turn_pending`](Self::mark_turn_pending)'s mark: the turn came.
    fn clear_turn_pending(&mut self) {
        // The address above the tags is never zero: the pointer is aligned past them.
        self.inner = self.inner.map_addr(|a| std::num::NonZeroUsize::new(a.get() & !TURN_PENDING).unwrap_or(a));
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
        if self.inner.as_ptr().addr() & HELD != 0 {
            self.release();
        }
    }
}

impl ResRef<'_> {
    #[cold]
    fn release(&mut self) {
        // SAFETY: held: the hold was taken in `held` and is released once, here; nothing of the entry reaches
        // the engine after it (the entry's own drop has run: `res` is its first field).
        unsafe { crate::engine::keep::release(self.shared) };
    }
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
    /// The installation of the thread's context the entry joined (see `context::moved`), or [`CARRIED`] once
    /// its place was carried away from the thread's context ([`Entry::carried_away`]); for an entry that did
    /// not install itself, the era of its scopes (0 until the first: `Entry::scope_era`). Atomic only so that the
    /// suspension of an `async fn`'s work can mark it through the `&Entry` its work borrows (a plain load at
    /// the exit).
    era: std::sync::atomic::AtomicU32,
    created_nanos: u64,
    wait_nanos: u64,
    depth: u32,
    acquire: u32,
    /// Bit i set: the user slot with id i passed (its exit hook runs).
    slots_passed: u32,
    error: bool,
    /// [`Flags`] bits.
    flags: u8,
    /// What the adaptive slot holds (five bytes, in what was padding).
    adaptive: crate::adaptive::slot::AdaptiveHeld,
    /// What the slots hold until exit (see [`chain::Held`](crate::chain::Held)).
    flow: crate::flow::EntryState,
    param: crate::param_flow::EntryState,
    breakers: crate::circuit_breaker::EntryState,
}

/// [`Entry::era`] of an entry whose place in a context was carried away from the thread that made it (no era:
/// those have the top bit clear): its exit changes no thread's context.
const CARRIED: u32 = u32::MAX;

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
    /// The call returned ([`Entry::exit`], or an annotated function's body came back): a panic its thread
    /// unwinds from at the exit is not the call's (the call ran in cleanup code during that unwinding).
    const RETURNED: u8 = 64;
    /// The call has not completed yet where its completion is marked (an async caller's future, which may be
    /// dropped before it answers: [`Entry::awaits_answer`]); still set at the exit of a call that did not return
    /// (`RETURNED` outweighs it: marking the return is one instruction), its caller gave up on it.
    const ABANDONED: u8 = 128;
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
            era: std::sync::atomic::AtomicU32::new(0),
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
    /// The call waits `wait` before it runs (at least what its own checks asked): another entry of the same
    /// request asked for a longer wait (the web layer's API groups).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn waits_for(&mut self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.wait_nanos = self.wait_nanos.max(nanos);
    }
    /// Whether [`waited`](Self::waited) is more than zero (the web layer's and the async macro's test,
    /// without building a `Duration`).
    #[inline(always)]
    pub(crate) fn waits(&self) -> bool {
        self.wait_nanos > 0
    }
    /// The clock reading the call was decided at, when it was checked and went straight on (no queueing
    /// wait): where its response time starts.
    #[inline(always)]
    pub(crate) fn decided_at(&self) -> Option<u64> {
        (self.node.is_some() && !self.waits()).then_some(self.created_nanos)
    }
    /// The timer an async caller awaits for the queueing wait this call was given (a rate limiter, warm-up
    /// queueing, a prioritized call): `None` when it has none, or on a manual clock, which nothing sleeps on.
    pub(crate) fn queue_timer(&self) -> Option<futures_timer::Delay> {
        (self.waits() && self.res.shared().clock.manual().is_none()).then(|| futures_timer::Delay::new(self.waited()))
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
    /// `RESOURCE_EXHAUSTED` or `UNAVAILABLE`) or it ran past a time limit (gRPC `DEADLINE_EXCEEDED`, a
    /// guard's time limit). An adaptive rule counts it as a
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

    /// Marks the call as failed by overload for adaptive rules only (a drop), without counting it as an error
    /// for statistics and circuit breakers: the web layer's mark for an overload answer (429, 503,
    /// `RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`) of its own service that its error predicate does not count.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn mark_overload(&mut self) {
        self.flags |= Flags::OVERLOAD;
    }

    /// Whether the call was marked as failed by overload ([`set_overload`](Self::set_overload)).
    pub fn is_overload(&self) -> bool {
        self.flags & Flags::OVERLOAD != 0
    }

    /// Traces an error: ignored when it is, or was caused by, a [`BlockError`] ([`BlockError::find_in`]: a
    /// guarded client's blocked `ClientError`, a boxed or wrapped block) or the engine's error filter rejects it.
    pub fn trace(&mut self, err: &(dyn StdError + 'static)) {
        if BlockError::find_in(err).is_some() {
            return;
        }
        if self.res.shared().error_filter_accepts(err) {
            self.error = true;
        }
    }

    /// Marks the call as timed out after running for `limit`: it counts as an exception, and its response
    /// time is `limit` plus its queueing wait ([`waited`](Self::waited), as any call's response time includes
    /// it), so a slow-call breaker sees it as slow, and an adaptive limit measures `limit`, whenever it is
    /// dropped afterwards. For time limits enforced outside the entry that start once the call runs (the
    /// macro's `timeout_ms`, the web layer's `timeout`, the outbound guards').
    pub fn set_timed_out(&mut self, limit: Duration) {
        if self.node.is_none() {
            return;
        }
        self.set_overload();
        let limit_nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        // The response time is measured from `created_nanos` at exit, and an adaptive limit takes the wait
        // out of it: place the start the wait and `limit` before now.
        let ran_from = self.res.shared().clock.now_nanos().saturating_sub(limit_nanos);
        self.created_nanos = ran_from.saturating_sub(self.wait_nanos);
    }

    /// The error a timed-out call reports (see [`Entry::set_timed_out`]).
    pub fn timeout_error(&self, limit: Duration) -> crate::Timeout {
        crate::Timeout { resource: self.res.inner().name.clone(), limit }
    }

    /// Whether an error was traced.
    pub fn has_error(&self) -> bool {
        self.error
    }

    /// Exits now: the call returned. The same as dropping the entry, except while the thread unwinds from a
    /// panic: an entry dropped then counts the panic as the call's error, while one exited with `exit` is a
    /// call that returned (made by cleanup code during the unwinding, as a `Drop` impl may), as in Java, where
    /// only an exception the call threw is traced.
    pub fn exit(mut self) {
        self.returned();
    }

    /// Marks the call as returned ([`exit`](Self::exit); the macro's code, once the body came back).
    #[inline(always)]
    pub(crate) fn returned(&mut self) {
        self.flags |= Flags::RETURNED;
    }

    /// The call's work starts in a future that its caller may drop before it answers: until
    /// [`answered`](Self::answered) (or [`returned`](Self::returned)), an exit is a call given up on, of which
    /// an adaptive limit takes no round-trip sample (the time is the caller's patience, not the downstream's
    /// latency).
    #[inline(always)]
    pub(crate) fn awaits_answer(&mut self) {
        self.flags |= Flags::ABANDONED;
    }

    /// The call's answer came (see [`awaits_answer`](Self::awaits_answer)).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn answered(&mut self) {
        self.flags &= !Flags::ABANDONED;
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

    #[test]
    fn an_async_entrys_future_holds_its_decision_and_no_more() {
        // A call that waits (a queueing delay, a check's wait) keeps its state in a box of its own.
        let engine = crate::Sentinel::builder().build();
        let r = engine.resource("sized");
        let f = r.entry().enter_async();
        assert!(
            std::mem::size_of_val(&f) <= std::mem::size_of::<Result<super::Entry<'static>, crate::BlockError>>() + 8,
            "{} bytes",
            std::mem::size_of_val(&f)
        );
        assert!(futures::executor::block_on(f).is_ok());
    }

    use super::{DETACHED, HELD};
    use crate::Sentinel;
    use std::sync::Arc;

    fn tags(e: &super::Entry<'_>) -> usize {
        e.res.inner.as_ptr().addr() & (HELD | DETACHED)
    }

    #[test]
    fn owned_entries_of_an_engine_that_can_drop_hold_its_state_without_a_reference_count() {
        let engine = Sentinel::builder().build();
        let r = engine.resource("api");
        let counts = |r: &crate::Resource| (Arc::strong_count(&r.shared), Arc::strong_count(&r.inner));
        let before = counts(&r);
        let e = r.entry_owned().enter().unwrap();
        assert_eq!(tags(&e), HELD | DETACHED);
        assert_eq!(counts(&r), before, "a hold on the thread's stripe, no count");
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
