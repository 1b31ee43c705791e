//! The entry builder: the options of one entry, and the ways to enter (sync, async, deciding only).

use std::sync::atomic::Ordering;

use crate::context;
use crate::error::BlockError;
use crate::param_flow::HotParam;
use crate::resource::{EntryType, Resource};

use super::path::MayWait;
use super::{Entry, ResRef};
use crate::wait::{Pending, RetryScope, Wait};

/// A resource's entries start here (the handle is defined with the resources; its entry methods sit with the
/// builder they return, so that resources know no entry).
impl Resource {
    /// Enters the resource with one permit, in the current context.
    #[inline]
    pub fn enter(&self) -> Result<Entry<'_>, BlockError> {
        EntryBuilder::new(self).enter()
    }
    /// Starts an entry with options (acquire count, origin, context, hot parameters, priority).
    #[inline]
    pub fn entry(&self) -> EntryBuilder<'_, 'static> {
        EntryBuilder::new(self)
    }
    /// Starts an entry that owns a clone of this handle: a `'static` entry that can move into a future or a
    /// response body (middleware), and exit after every handle of the engine is gone. On an engine that can
    /// be dropped it holds the engine's state with a counter of the calling thread's statistics stripe (a plain
    /// store at entry and one at exit, each on the thread's own stripe: threads entering one resource do not
    /// share the word they write); on the global engine and on leaked ones
    /// ([`Sentinel::leak`](crate::Sentinel::leak)), which live until the process ends, it holds nothing.
    #[inline]
    pub fn entry_owned(&self) -> EntryBuilder<'static, 'static> {
        EntryBuilder::owned(self)
    }
}

/// Options for one entry. Made by [`Resource::entry`].
#[must_use = "an entry builder does nothing until `enter` is called"]
pub struct EntryBuilder<'r, 'a> {
    pub(super) res: ResRef<'r>,
    pub(super) entry_type: EntryType,
    pub(super) acquire: u32,
    pub(super) origin: Option<&'a str>,
    pub(super) context: Option<&'a str>,
    pub(super) args: &'a [&'a dyn HotParam],
    pub(super) prioritized: bool,
}

impl<'r> EntryBuilder<'r, 'static> {
    pub(crate) fn new(res: &'r Resource) -> Self {
        Self::with(ResRef::borrowed(res), res.entry_type)
    }
}

impl EntryBuilder<'static, 'static> {
    /// An entry that keeps `res` alive: by a hold on its engine's state (`engine::keep`), or by nothing when
    /// its engine is immortal (the global engine, a leaked one): every resource is held by its engine's state
    /// until the state is freed.
    #[inline]
    pub(crate) fn owned(res: &Resource) -> Self {
        if res.shared.immortal.load(Ordering::Relaxed) {
            // SAFETY: the engine is immortal (a relaxed load that reads `true` reads the store made when its
            // last handle was put out of reach of any drop; see `Sentinel::immortal`).
            return Self::with(unsafe { ResRef::immortal(res) }, res.entry_type);
        }
        Self::with(ResRef::held(res), res.entry_type)
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
    /// Marks the call prioritized: over a QPS limit it may borrow from the next window and wait. A call that
    /// borrows skips the circuit breakers (as in Java) but is still held to an adaptive limit of calls in
    /// flight; refused there, it gives the borrowed room back.
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
    /// does a call a check asks to wait: an adaptive rule at its limit with `maxWaitMs` (it awaits a place on
    /// the engine clock's timer, newest first, then takes it; refused when the wait ends) or a cluster rule
    /// whose leased tokens ran out (it awaits the token service, at most its timeout, then decides again).
    /// Dropping the future gives back a place granted meanwhile. The returned future holds only the entry
    /// (not the hot-parameter arguments), so it is `Send`; with hot-parameter arguments, such a call is
    /// decided at once instead of waiting (deciding again would need the arguments): refused by the adaptive
    /// rule, or by the cluster rule's local fallback.
    ///
    /// A queued call is recorded at its turn: its pass, and its count in flight, once its timer fired. On a
    /// manual clock a queueing wait is not awaited, as [`enter`](Self::enter) sleeps nothing there: the turn
    /// is the arrival ([`Entry::waited`] still gives the wait the rule decided). An adaptive rule's wait does
    /// await the manual clock, which the test moves.
    ///
    /// The entry joins the active context (if any) but never changes the thread's context: the future may be
    /// polled on any thread and the entry dropped anywhere. Use [`Entry::instrument`] to run a future with
    /// the entry as its innermost entry.
    pub fn enter_async(self) -> impl std::future::Future<Output = Result<Entry<'r>, BlockError>> + Send + 'r + use<'r> {
        let wait = if self.args.is_empty() { Wait::Async(0) } else { Wait::Now };
        // A queued call's pass is recorded at its turn, once its timer fired ([`Entry::at_turn`]).
        match self.enter_or_wait(wait, false) {
            Ok(Ok(mut e)) => match e.queue_timer() {
                None => {
                    e.at_turn();
                    EnterAsync::Ready(Some(Ok(e)))
                }
                Some(timer) => EnterAsync::Waits(Box::pin(async move {
                    timer.await;
                    e.at_turn();
                    Ok(e)
                })),
            },
            Ok(Err(block)) => EnterAsync::Ready(Some(Err(block))),
            Err((b, pending)) => {
                let retry = Retry::of(b);
                EnterAsync::Waits(Box::pin(async move {
                    let mut e = retry.run(pending).await?;
                    if let Some(timer) = e.queue_timer() {
                        timer.await;
                    }
                    e.at_turn();
                    Ok(e)
                }))
            }
        }
    }

    /// For the integrations (the web layer, the outbound guards): decides now like
    /// [`decide`](Self::decide), except that a call a check asks to wait (an adaptive rule at its limit
    /// with `maxWaitMs`, a cluster rule with no leased token in hand) is handed back as a future that
    /// awaits the wait without blocking the thread and then decides again. Owned entries only (the future
    /// keeps the handle); with hot-parameter arguments the call never waits (deciding again would need
    /// them).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn decide_or_queue(self) -> Result<Result<Entry<'r>, BlockError>, Queue<'r, 'a>> {
        // The decision is returned as the entry path built it (no copy of the entry to rewrap it).
        let wait = if self.args.is_empty() { Wait::Async(0) } else { Wait::Now };
        self.enter_or_wait(wait, false).map_err(|(b, pending)| Queue(b, pending))
    }

    /// [`decide_or_queue`](Self::decide_or_queue) for a caller that hands the wait its hot-parameter values
    /// owned ([`Queue::start_with_args`]): a check may ask the call to wait whatever its arguments.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[allow(clippy::result_large_err)]
    pub(crate) fn decide_or_queue_with_args(self) -> Result<Result<Entry<'r>, BlockError>, Queue<'r, 'a>> {
        self.enter_or_wait(Wait::Async(0), false).map_err(|(b, pending)| Queue(b, pending))
    }

    /// Runs the checks without waiting: the entry says how long the call should wait ([`Entry::waited`]),
    /// which is the caller's to wait; its pass is recorded now, at the decision.
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
        pending: &mut Option<Pending>,
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

    /// The first decision of an async entry (annotated `async fn`s): the entry of a call that passes without
    /// waiting, else what the call must do first (a wait a check asked for is awaited, and the call decided
    /// again with a new builder). Installed like [`decide`](EntryBuilder::decide)'s.
    // `Err` is no larger than `Ok` (both can hold an entry); boxing a delayed entry would allocate per queued call.
    #[allow(clippy::result_large_err)]
    #[inline(always)]
    pub(crate) fn decide_now(self) -> Result<Entry<'r>, super::Slow<'r>> {
        let install = !self.res.is_owned();
        self.entry_path(Wait::Async(0), install)
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
    fn enter_or_wait(self, wait: Wait, install: bool) -> Result<Result<Entry<'r>, BlockError>, (Self, Pending)> {
        self.entry_path::<MayWait<'r, 'a>>(wait, install)
    }
}

/// A call a check asked to wait ([`EntryBuilder::decide_or_queue`]): [`Queue::start`] makes its wait.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) struct Queue<'r, 'a>(EntryBuilder<'r, 'a>, Pending);

impl<'r> Queue<'r, '_> {
    /// The call's wait and the decision made after it, owning what it needs.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[cold]
    pub(crate) fn start(self) -> QueuedEntry<'r> {
        Box::pin(Retry::of(self.0).run(self.1))
    }

    /// [`start`](Self::start) for a call with hot-parameter values (`args`: the call's, owned, in argument
    /// order), which the decision after the wait checks again.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[cold]
    pub(crate) fn start_with_args(self, args: Vec<Option<String>>) -> QueuedEntry<'r> {
        let mut retry = Retry::of(self.0);
        retry.args = args;
        Box::pin(retry.run(self.1))
    }
}

/// A call waiting for a place or a lease ([`EntryBuilder::decide_or_queue`]): resolves to its decision.
/// Dropping it gives back whatever the wait got.
pub(crate) type QueuedEntry<'r> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Entry<'r>, BlockError>> + Send + 'r>>;

/// What an async entry needs to decide again after waiting for a cluster lease: the handle and the options,
/// owned (the origin and context names and any hot-parameter values are copied).
/// The future of [`EntryBuilder::enter_async`]: the decision, ready at once (the common case, which holds the
/// decision alone), or a call that waits (a queueing rule's delay, a check's wait), whose state is boxed (the
/// wait allocates its timer anyway).
enum EnterAsync<'r> {
    Ready(Option<Result<Entry<'r>, BlockError>>),
    Waits(std::pin::Pin<Box<dyn std::future::Future<Output = Result<Entry<'r>, BlockError>> + Send + 'r>>),
}

impl<'r> std::future::Future for EnterAsync<'r> {
    type Output = Result<Entry<'r>, BlockError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        // `EnterAsync` is `Unpin`: a decision, or a boxed future.
        match self.get_mut() {
            EnterAsync::Ready(decided) => match decided.take() {
                Some(decided) => std::task::Poll::Ready(decided),
                None => panic!("`enter_async`'s future polled after it completed"),
            },
            EnterAsync::Waits(f) => f.as_mut().poll(cx),
        }
    }
}

struct Retry<'r> {
    res: ResRef<'r>,
    entry_type: EntryType,
    acquire: u32,
    origin: Option<String>,
    context: Option<String>,
    prioritized: bool,
    /// The call's hot-parameter values, owned ([`Queue::start_with_args`]; none otherwise).
    args: Vec<Option<String>>,
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
            args: Vec::new(),
        }
    }

    /// Awaits the wait, decides again with what it got, and so on until the call is decided (a wait ends:
    /// a cluster rule's at its deadline, then decided by the rule's local fallback; an adaptive rule's
    /// after `maxWaitMs`).
    async fn run(mut self, mut pending: Pending) -> Result<Entry<'r>, BlockError> {
        loop {
            let deadline = pending.deadline();
            let waited = pending.wait_async().await;
            // Only for the decision below: never held across an `.await`.
            let _retry = RetryScope::enter(waited);
            let args: Vec<&dyn HotParam> = self.args.iter().map(|a| a as &dyn HotParam).collect();
            let b = EntryBuilder {
                res: self.res,
                entry_type: self.entry_type,
                acquire: self.acquire,
                origin: self.origin.as_deref(),
                context: self.context.as_deref(),
                args: &args,
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
