//! Support for the code `#[sentinel_resource]` generates: typed helper calls whose names and
//! `#[diagnostic::on_unimplemented]` messages make a wrong signature read as what was expected, and the
//! wrapper future that carries the context of an async resource across `.await` points.
//!
//! Everything here is re-exported through `crate::__private` and is not a public API.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::context::CarriedContext;
use crate::error::BlockError;
use crate::param_flow::HotParam;
use crate::Entry;

/// A function that can be called with the tuple `Args` (the handler of an annotated function).
///
/// Implemented for every `FnOnce` of up to 16 arguments; the macro calls handlers through it so that a
/// wrong arity or parameter type is reported on the handler's path with the expected signature.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be called as a `#[sentinel_resource]` handler with the arguments `{Args}`",
    label = "expected a function taking `{Args}`",
    note = "a `block_handler` takes the function's parameters, then `BlockError`; a `fallback` takes the \
            function's parameters, then the error; a `default_fallback` takes only the error"
)]
pub trait Handler<Args> {
    /// What the handler returns.
    type Output;
    /// Calls the handler.
    fn call_handler(self, args: Args) -> Self::Output;
}

macro_rules! impl_handler {
    ($($a:ident),*) => {
        impl<Func, Out, $($a),*> Handler<($($a,)*)> for Func
        where
            Func: FnOnce($($a),*) -> Out,
        {
            type Output = Out;
            #[inline(always)]
            #[allow(non_snake_case)]
            fn call_handler(self, ($($a,)*): ($($a,)*)) -> Out {
                self($($a),*)
            }
        }
    };
}
impl_handler!();
impl_handler!(A1);
impl_handler!(A1, A2);
impl_handler!(A1, A2, A3);
impl_handler!(A1, A2, A3, A4);
impl_handler!(A1, A2, A3, A4, A5);
impl_handler!(A1, A2, A3, A4, A5, A6);
impl_handler!(A1, A2, A3, A4, A5, A6, A7);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15);
impl_handler!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16);

/// Runs the body of a sync annotated function, in a closure of its own so that `return` and `?` come back to
/// the generated code. Taking an `FnOnce` lets the body return borrows of its arguments (`&mut self.x`).
#[inline(always)]
pub fn run_body<R, F: FnOnce() -> R>(body: F) -> R {
    body()
}

/// Calls a `block_handler` with the function's arguments and the block error.
#[inline(always)]
pub fn call_block_handler<H: Handler<Args>, Args>(handler: H, args: Args) -> H::Output {
    handler.call_handler(args)
}

/// Calls a `fallback` with the function's arguments and the error.
#[inline(always)]
pub fn call_fallback<H: Handler<Args>, Args>(handler: H, args: Args) -> H::Output {
    handler.call_handler(args)
}

/// Calls a `default_fallback` with the error.
#[inline(always)]
pub fn call_default_fallback<H: Handler<(E,)>, E>(handler: H, error: E) -> H::Output {
    handler.call_handler((error,))
}

/// Calls an `exceptions_to_ignore` / `exceptions_to_trace` predicate.
#[inline(always)]
pub fn call_error_predicate<E, P: FnOnce(&E) -> bool>(predicate: P, error: &E) -> bool {
    predicate(error)
}

/// A handler's output in an `async fn`: the value itself (a sync handler) or a future of it (an async handler).
#[diagnostic::on_unimplemented(
    message = "a handler of this `#[sentinel_resource]` async fn returns `{Self}`, but the function returns `{R}`",
    label = "this handler must return `{R}` (or a future whose output is `{R}`)"
)]
pub trait HandlerOutput<R, Marker> {
    /// The future that yields the function's return value.
    type Future: Future<Output = R>;
    /// Turns the handler's output into that future.
    fn into_output(self) -> Self::Future;
}

/// Marker: a sync handler's output.
#[derive(Debug)]
pub enum SyncOutput {}
/// Marker: an async handler's output.
#[derive(Debug)]
pub enum AsyncOutput {}

impl<R> HandlerOutput<R, SyncOutput> for R {
    type Future = std::future::Ready<R>;
    #[inline(always)]
    fn into_output(self) -> Self::Future {
        std::future::ready(self)
    }
}

impl<F: Future> HandlerOutput<F::Output, AsyncOutput> for F {
    type Future = F;
    #[inline(always)]
    fn into_output(self) -> F {
        self
    }
}

/// Awaits a handler's output in an `async fn`, whether the handler is sync or async.
#[inline(always)]
pub fn handler_output<R, M, O: HandlerOutput<R, M>>(output: O) -> HandlerFuture<O, R, M> {
    HandlerFuture { fut: output.into_output(), _marker: std::marker::PhantomData }
}

/// [`handler_output`] for a block handler of an `async fn`: called, and awaited, in the context the call was
/// made in (no entry is open; the one carried across the call's waits, if it waited), carried across its
/// awaits like [`in_context`]'s.
#[inline(always)]
pub fn blocked_output<R, M, O: HandlerOutput<R, M>>(
    scope: &mut EntryScope,
    call: impl FnOnce() -> O,
) -> InContext<HandlerFuture<O, R, M>> {
    let mut carried = scope.carried.take().unwrap_or_else(CarriedContext::capture);
    let output = carried.scope(call);
    InContext::carrying(handler_output(output), carried)
}

/// [`handler_output`] for a fallback of an `async fn`: called, and awaited, in the entry's context (the entry
/// is still open), like the body ([`in_entry`]).
#[inline(always)]
pub fn entry_output<'s, 'e, 'r, R, M, O: HandlerOutput<R, M>>(
    scope: &'s mut EntryScope,
    entry: &'e Entry<'r>,
    call: impl FnOnce() -> O,
) -> InEntry<'s, 'e, 'r, HandlerFuture<O, R, M>> {
    let output = scope.run(entry, call, |_| false);
    in_entry(scope, entry, handler_output(output))
}

/// [`entry_output`] with the handler's future in a box: for the block handler of a nested call's block that
/// escaped the body (a rare path), so that it adds no room to the call's future.
#[inline(never)]
pub fn entry_output_boxed<'s, 'e, 'r, R, M, O: HandlerOutput<R, M>>(
    scope: &'s mut EntryScope,
    entry: &'e Entry<'r>,
    call: impl FnOnce() -> O,
) -> InEntry<'s, 'e, 'r, Pin<Box<HandlerFuture<O, R, M>>>> {
    let output = scope.run(entry, call, |_| false);
    in_entry(scope, entry, Box::pin(handler_output(output)))
}

/// Probes the error an annotated function's body returned (see [`BlockProbe`]) and hands it back with what
/// `probe` found.
#[inline(always)]
pub fn probe_block<E, T>(error: E, probe: impl FnOnce(&E) -> T) -> (E, T) {
    let found = probe(&error);
    (error, found)
}

/// Whether a [`BlockProbe`] found a block.
#[inline(always)]
pub fn is_block(found: Option<&BlockError>) -> bool {
    found.is_some()
}

/// Drops the error a nested call's block came in, before its block handler is awaited.
#[inline(always)]
pub fn discard<T>(value: T) {
    drop(value)
}

/// The future of a handler's output. Its `Output` is `R` itself (not a projection through the impl that is
/// chosen later), so the return type of the annotated function decides between a sync and an async handler.
#[must_use = "futures do nothing unless polled"]
pub struct HandlerFuture<O: HandlerOutput<R, M>, R, M> {
    fut: O::Future,
    _marker: std::marker::PhantomData<fn() -> (R, M)>,
}

impl<O: HandlerOutput<R, M>, R, M> Future for HandlerFuture<O, R, M> {
    type Output = R;
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        // SAFETY: `fut` is structurally pinned: never moved out, and `HandlerFuture` has no `Drop` impl.
        unsafe { self.map_unchecked_mut(|s| &mut s.fut) }.poll(cx)
    }
}

/// The error type of a function with no `block_handler`, which must be built from a [`BlockError`].
#[diagnostic::on_unimplemented(
    message = "a blocked call of this `#[sentinel_resource]` function cannot return `{Self}`: \
               `From<BlockError>` is not implemented for it",
    label = "`{Self}` cannot be built from a `BlockError`",
    note = "add `block_handler = your_handler` to the attribute, or implement \
            `From<sentinel_runtime::BlockError>` for `{Self}`"
)]
pub trait FromBlockError: Sized {
    /// Builds the error.
    fn from_block_error(err: BlockError) -> Self;
}

impl<E: From<BlockError>> FromBlockError for E {
    #[inline]
    fn from_block_error(err: BlockError) -> Self {
        E::from(err)
    }
}

/// The error of a blocked call with no `block_handler` (for the fallback, or returned as `Err`).
#[inline]
pub fn block_error_into<E: FromBlockError>(err: BlockError) -> E {
    E::from_block_error(err)
}

/// The value of a blocked call with no `block_handler` and no fallback: `Err(E::from(err))`.
#[inline]
pub fn blocked_result<T, E: FromBlockError>(err: BlockError) -> Result<T, E> {
    Err(E::from_block_error(err))
}

/// The error an annotated function's body returned, probed for a nested call's block that escaped the body
/// ([`AsBlockError`](crate::AsBlockError)). The generated code calls `(&BlockProbe(&error)).escaped_block()`
/// with [`CarriesBlock`] and [`CarriesNoBlock`] in scope: a type that implements `AsBlockError` takes the first
/// (the method is found without an extra reference), any other type the second, which answers `None` (the call
/// then compiles to nothing). Only on the error path.
#[derive(Debug)]
pub struct BlockProbe<'a, E: ?Sized>(pub &'a E);

/// [`BlockProbe`] of an error type that may be a block.
pub trait CarriesBlock<'a> {
    /// The block the error is, if it is one.
    fn escaped_block(&self) -> Option<&'a BlockError>;
}

impl<'a, E: crate::AsBlockError + ?Sized> CarriesBlock<'a> for BlockProbe<'a, E> {
    #[inline(always)]
    fn escaped_block(&self) -> Option<&'a BlockError> {
        self.0.block_error()
    }
}

/// [`BlockProbe`] of any other error type: never a block.
pub trait CarriesNoBlock<'a> {
    /// `None`.
    fn escaped_block(&self) -> Option<&'a BlockError>;
}

impl<'a, E: ?Sized> CarriesNoBlock<'a> for &BlockProbe<'a, E> {
    #[inline(always)]
    fn escaped_block(&self) -> Option<&'a BlockError> {
        None
    }
}

/// The block a [`BlockProbe`] found, for the block handler: in a box, so that an `async fn`'s future keeps
/// one word for it across the handler's await (this path is rare; a type that cannot be a block never boxes).
#[inline]
pub fn owned_block(found: Option<&BlockError>) -> Option<Box<BlockError>> {
    found.map(|b| Box::new(b.clone()))
}

/// The error type of a function with `timeout_ms`, which must be built from a [`Timeout`](crate::Timeout).
#[diagnostic::on_unimplemented(
    message = "a timed-out call of this `#[sentinel_resource]` function cannot return `{Self}`: \
               `From<Timeout>` is not implemented for it",
    label = "`{Self}` cannot be built from a `Timeout`",
    note = "implement `From<sentinel_runtime::Timeout>` for `{Self}` (a call that runs past `timeout_ms` returns \
            `Err(E::from(timeout))`, or passes it to the fallback)"
)]
pub trait FromTimeout: Sized {
    /// Builds the error.
    fn from_timeout(timeout: crate::Timeout) -> Self;
}

impl<E: From<crate::Timeout>> FromTimeout for E {
    #[inline]
    fn from_timeout(timeout: crate::Timeout) -> Self {
        E::from(timeout)
    }
}

/// `timeout_ms`, checked when the constant is evaluated (at compile time).
pub const fn checked_timeout_ms(ms: u64) -> u64 {
    assert!(ms > 0, "`timeout_ms` must be greater than 0");
    ms
}

/// Races the body of a function with `timeout_ms` against a timer of `limit` on the entry's engine clock (a
/// manual clock completes it when advanced; the system clock uses a runtime-agnostic timer). The limit counts
/// from the clock reading the entry was decided at (the start of the call's response time), or from now after a
/// queueing wait or for an unchecked entry; the timer itself is made only if the body does not finish on its
/// first poll (a real timer costs about a microsecond to arm).
#[inline]
pub fn time_limited<'e, F: Future>(entry: &'e Entry<'_>, limit: Duration, body: F) -> TimeLimited<'e, F> {
    let clock = &entry.shared().clock;
    let start_nanos = entry.decided_at().unwrap_or_else(|| clock.now_nanos());
    TimeLimited { body: Some(body), timer: None, clock, start_nanos, limit }
}

/// The call ran out of time: the entry counts it as an exception whose response time is `limit`, and the
/// function's error is built from the [`Timeout`](crate::Timeout).
#[inline]
pub fn timed_out<E: FromTimeout>(entry: &mut Entry<'_>, limit: Duration) -> E {
    entry.set_timed_out(limit);
    E::from_timeout(entry.timeout_error(limit))
}

pin_project_lite::pin_project! {
    /// The body of a function with `timeout_ms` and its timer: `Some(output)` when the body finished first,
    /// `None` when the time ran out. The body's future is dropped as soon as the time is up (in the poll that
    /// sees it, so inside the caller's context), which exits every entry it holds.
    #[must_use = "futures do nothing unless polled"]
    pub struct TimeLimited<'e, F> {
        #[pin]
        body: Option<F>,
        #[pin]
        timer: Option<crate::clock::Sleep>,
        clock: &'e crate::clock::EngineClock,
        start_nanos: u64,
        limit: Duration,
    }
}

impl<F: Future> Future for TimeLimited<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let mut this = self.project();
        let Some(body) = this.body.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(out) = body.poll(cx) {
            this.body.set(None);
            return Poll::Ready(Some(out));
        }
        if this.timer.is_none() {
            let elapsed = Duration::from_nanos(this.clock.now_nanos().saturating_sub(*this.start_nanos));
            this.timer.set(Some(crate::clock::Sleep::new(this.clock, this.limit.saturating_sub(elapsed))));
        }
        let timer_done = this.timer.as_mut().as_pin_mut().is_some_and(|t| t.poll(cx).is_ready());
        if timer_done {
            this.body.set(None);
            this.timer.set(None);
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// Clones an argument before the body runs, so a `fallback` can receive it after the body consumed it.
#[inline(always)]
pub fn clone_for_fallback<T: Clone>(arg: &T) -> T {
    arg.clone()
}

/// One `params = [...]` value, as a hot parameter.
#[inline(always)]
pub fn hot_param<T: HotParam>(value: &T) -> &dyn HotParam {
    value
}

/// An `origin = ...` / `context = ...` value, as text.
#[inline(always)]
pub fn as_str<S: AsRef<str> + ?Sized>(value: &S) -> &str {
    value.as_ref()
}

/// The wait of an annotated `async fn` that a check asked to wait (a cluster rule with no leased token in
/// hand, an adaptive rule at its limit with `maxWaitMs`): see [`decide_async`]. One word in the call's future
/// until a check first asks it to wait (rare), so that a call that never waits carries and drops no more.
#[derive(Default)]
pub struct AsyncWait {
    /// Dropped by `Drop` only when a wait was asked for: the future's drop glue tests it inline.
    state: std::mem::ManuallyDrop<Option<Box<WaitState>>>,
}

#[derive(Default)]
struct WaitState {
    /// The wait a check asked for, not awaited yet.
    pending: Option<crate::wait::Pending>,
    /// What the last wait got, for the next decision (a place it holds goes back if this is dropped first).
    waited: Option<crate::wait::Waited>,
    /// The deadline of the wait under way, kept for the next decision.
    deadline: u64,
}

impl Drop for AsyncWait {
    /// Inlined into the call's future: a call that never waited tests one word.
    #[inline(always)]
    fn drop(&mut self) {
        if self.state.is_some() {
            self.release();
        }
    }
}

impl AsyncWait {
    /// What a wait left: a pending wait and a place it got go back.
    #[cold]
    #[inline(never)]
    fn release(&mut self) {
        drop(std::mem::take(&mut *self.state));
    }

    /// No wait yet.
    pub fn new() -> Self {
        AsyncWait::default()
    }

    /// Awaits the end of the wait a check asked for, without blocking the thread.
    pub async fn wait(&mut self) {
        if let Some(s) = self.state.as_deref_mut()
            && let Some(p) = s.pending.take()
        {
            s.deadline = p.deadline();
            s.waited = Some(p.wait_async().await);
        }
    }
}

pub use crate::entry::{AskedToWait, Slow};

/// The first decision of an annotated `async fn`: the entry, for a call that passes without waiting (the
/// common case, which the generated code takes without any of the waits' machinery), else what the call
/// must do first ([`decide_slow`]).
// `Err` is no larger than `Ok` (both can hold an entry); boxing a delayed entry would allocate per queued call.
#[allow(clippy::result_large_err)]
#[inline(always)]
pub fn decide_now<'r>(builder: crate::EntryBuilder<'r, '_>) -> Result<Entry<'r>, Slow<'r>> {
    builder.decide_now()
}

/// What an annotated `async fn` does when its first decision (`first`, taken whole: see [`refusal`]) is not a
/// plain pass: a blocked call's block comes back, ready at once; a wait a check asked for is awaited and the
/// call decided again by `decide` (which builds a new builder: the arguments are borrowed again), as often as
/// a check asks; a queueing rule's wait is awaited in the entry's context.
///
/// A call that waits for a check is suspended before it has an entry: the context it was called in (this
/// first poll's) is carried in `scope` across the waits, and the call is decided again in it, whichever thread
/// polls then; what the decision leaves (the entry, installed in that context) stays carried for the call's
/// work, and a block handler runs in the context carried ([`blocked_output`]).
pub fn decide_slow<'s, 'r, D>(
    first: Result<Entry<'r>, Slow<'r>>,
    scope: &'s mut EntryScope,
    decide: D,
) -> Outlined<SlowRest<impl Future<Output = Result<Entry<'r>, BlockError>> + use<'s, 'r, D>>>
where
    D: FnMut(&mut AsyncWait) -> Option<Result<Entry<'r>, BlockError>>,
{
    let rest = match first {
        // Refused: ready at once, nothing allocated (a blocked call allocates nothing).
        Err(Slow::Blocked(block)) => SlowRest::Blocked(Some(block)),
        // A plain pass, which the generated code takes without this function: an entry that waits for nothing.
        Ok(entry) => SlowRest::Waits(Box::pin(slow_decision(Slow::Delayed(entry), scope, decide))),
        // A wait (a queueing rule's delay, a check's wait): the machinery lives in a box of its own, so the
        // call's future keeps one word for it rather than its whole state (a wait allocates its timer anyway).
        Err(waits) => SlowRest::Waits(Box::pin(slow_decision(waits, scope, decide))),
    };
    Outlined { inner: rest }
}

/// The refusal of a slow decision that refused (`decided` is an `Err`). Takes the whole decision, so that the
/// call's future keeps no room for it while the block handler runs.
#[inline(always)]
pub fn refusal(decided: Result<Entry<'_>, BlockError>) -> BlockError {
    match decided {
        Err(block) => block,
        // The generated code calls it in the `Err` arm of a match on `decided` only.
        Ok(_) => unreachable!("`refusal` called on an admitted call"),
    }
}

/// What [`decide_slow`] awaits: a refusal, ready at once, or the boxed future of a call that waits. No larger
/// than a refusal: the call's future keeps room for it until it is decided.
#[must_use = "futures do nothing unless polled"]
pub enum SlowRest<F> {
    /// Refused (taken by the first poll).
    Blocked(Option<BlockError>),
    /// Waits, then is decided again.
    Waits(Pin<Box<F>>),
}

impl<F> std::fmt::Debug for SlowRest<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlowRest::Blocked(_) => "SlowRest::Blocked",
            SlowRest::Waits(_) => "SlowRest::Waits",
        })
    }
}

impl<'r, F: Future<Output = Result<Entry<'r>, BlockError>>> Future for SlowRest<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `SlowRest` is `Unpin`: a boxed future, or a block.
        match self.get_mut() {
            SlowRest::Blocked(block) => match block.take() {
                Some(block) => Poll::Ready(Err(block)),
                None => panic!("`SlowRest` polled after it completed"),
            },
            SlowRest::Waits(f) => f.as_mut().poll(cx),
        }
    }
}

pin_project_lite::pin_project! {
    /// A future polled out of line: the rare paths of an annotated `async fn` ([`decide_slow`]) stay out of the
    /// code of its common path.
    #[must_use = "futures do nothing unless polled"]
    pub struct Outlined<F> {
        #[pin]
        inner: F,
    }
}

impl<F: Future> Future for Outlined<F> {
    type Output = F::Output;

    #[cold]
    #[inline(never)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

/// [`decide_slow`]'s work.
async fn slow_decision<'r, D>(first: Slow<'r>, scope: &mut EntryScope, mut decide: D) -> Result<Entry<'r>, BlockError>
where
    D: FnMut(&mut AsyncWait) -> Option<Result<Entry<'r>, BlockError>>,
{
    let mut wait = AsyncWait::new();
    let mut decided = wait.first(first);
    let mut entry = loop {
        match decided {
            Some(d) => break d?,
            None => {
                scope.carried.get_or_insert_with(CarriedContext::capture);
                wait.wait().await;
                decided = scope.carried.get_or_insert_with(CarriedContext::capture).scope(|| decide(&mut wait));
            }
        }
    };
    if scope.carried.is_some() {
        // Decided again after a wait, in the context carried in the future: the entry's place is there, in no
        // thread's context, so its exit must leave every thread's context as it is then.
        entry.carried_away();
    }
    if let Some(delay) = queue_delay(&entry) {
        in_entry(scope, &entry, delay).await;
    }
    // Its turn: a queued call's pass is recorded now, as Java records it after the flow slot's sleep.
    entry.at_turn();
    Ok(entry)
}

impl AsyncWait {
    /// Takes the first decision's outcome ([`decide_now`]): the decision, or `None` when the call must
    /// [`wait`](AsyncWait::wait) and then be decided again ([`decide_async`]).
    fn first<'r>(&mut self, slow: Slow<'r>) -> Option<Result<Entry<'r>, BlockError>> {
        match slow {
            Slow::Blocked(block) => Some(Err(block)),
            Slow::Delayed(entry) => Some(Ok(entry)),
            Slow::Wait(AskedToWait(pending)) => {
                ask_to_wait(self, pending);
                None
            }
        }
    }
}

/// Decides an async entry: `None` when the call must `wait` and then be decided again with a fresh builder
/// (the arguments are borrowed again, so the future holds none of them).
#[inline(always)]
pub fn decide_async<'r>(
    builder: crate::EntryBuilder<'r, '_>,
    wait: &mut AsyncWait,
) -> Option<Result<Entry<'r>, BlockError>> {
    if wait.state.is_some() {
        return retry_async(builder, wait);
    }
    let mut pending = None;
    let decided = builder.decide_or_wait(0, &mut pending);
    if let Some(p) = pending {
        ask_to_wait(wait, p);
    }
    decided
}

/// A check asked the call to wait for the first time.
#[cold]
#[inline(never)]
fn ask_to_wait(wait: &mut AsyncWait, pending: crate::wait::Pending) {
    *wait.state = Some(Box::new(WaitState { pending: Some(pending), waited: None, deadline: 0 }));
}

/// [`decide_async`] after a wait: decided with what the wait got.
#[cold]
#[inline(never)]
fn retry_async<'r>(
    builder: crate::EntryBuilder<'r, '_>,
    wait: &mut AsyncWait,
) -> Option<Result<Entry<'r>, BlockError>> {
    let s = wait.state.get_or_insert_with(Box::default);
    let _retry = s.waited.take().map(crate::wait::RetryScope::enter);
    builder.decide_or_wait(s.deadline, &mut s.pending)
}

/// The timer an async entry awaits when a queueing rule (rate limiter, warm-up queueing, occupy) made it wait.
/// `None` when it need not wait, or when the engine runs on a manual clock.
#[inline]
pub fn queue_delay(entry: &Entry<'_>) -> Option<futures_timer::Delay> {
    entry.queue_timer()
}

/// Marks an `async fn`'s call as started: until its body comes back ([`body_returned`]), an exit is a call
/// whose future was dropped (its caller gave up), which an adaptive limit does not sample.
#[inline(always)]
pub fn body_started(entry: &mut Entry<'_>) {
    entry.awaits_answer();
}

/// Marks the call as returned: its body came back, so a panic its thread unwinds from when the entry exits is
/// not the call's (it ran in cleanup code during that unwinding).
#[inline(always)]
pub fn body_returned(entry: &mut Entry<'_>) {
    entry.returned();
}

/// Marks the entry as failed by a traced error.
#[inline(always)]
pub fn trace_error(entry: &mut Entry<'_>) {
    entry.set_error();
}

/// Where an annotated `async fn`'s work stands with the thread's context: not suspended yet (the thread's
/// context is as the entry left it: the entry is the innermost one if it installed itself), or suspended once,
/// with the context its work runs in, installed during each later poll ([`in_entry`]).
///
/// The entry is decided in the future's first poll, in the context of the thread that polls it, and installs
/// itself there like a synchronous entry; while the call's work (a queueing wait, the body, a fallback) is not
/// suspended, there is nothing to install nor to put back. At the first suspension the thread gets its own
/// context back, and the entry's is carried in the future, as [`InContext`] carries a context.
#[derive(Debug, Default)]
pub struct EntryScope {
    carried: Option<CarriedContext>,
}

impl EntryScope {
    /// Not suspended yet.
    #[inline(always)]
    pub fn new() -> Self {
        EntryScope { carried: None }
    }

    /// Runs `f` (a poll of the call's work, or its drop) in the call's context; `suspends`: whether what `f`
    /// returned leaves the work suspended.
    #[inline(always)]
    fn run<R>(&mut self, entry: &Entry<'_>, f: impl FnOnce() -> R, suspends: impl FnOnce(&R) -> bool) -> R {
        match &mut self.carried {
            Some(carried) => carried.scope(f),
            None => {
                let r = f();
                if suspends(&r) {
                    self.suspend(entry);
                }
                r
            }
        }
    }

    /// The work is suspended for the first time: carry its context away, and give the thread back the context
    /// it had before the entry.
    #[cold]
    fn suspend(&mut self, entry: &Entry<'_>) {
        let cur = crate::context::current();
        if let Some(outer) = entry.context_without(cur) {
            crate::context::set_current(outer);
        }
        // Its exit, after the work (outside the carried context), on this thread or another, must leave
        // every thread's context as it is then.
        entry.carried_away();
        self.carried = Some(CarriedContext::copy_of(cur));
    }
}

/// Awaits `work` (the body, a queueing wait, a fallback) of an annotated `async fn` in its entry's context
/// ([`EntryScope`]).
#[inline(always)]
pub fn in_entry<'s, 'e, 'r, F: Future>(
    scope: &'s mut EntryScope,
    entry: &'e Entry<'r>,
    work: F,
) -> InEntry<'s, 'e, 'r, F> {
    InEntry { work: ManuallyDrop::new(work), scope, entry }
}

pin_project_lite::pin_project! {
    /// The future of [`in_entry`]: polls and drops the work in its entry's context.
    #[must_use = "futures do nothing unless polled"]
    pub struct InEntry<'s, 'e, 'r, F> {
        #[pin]
        work: ManuallyDrop<F>,
        scope: &'s mut EntryScope,
        entry: &'e Entry<'r>,
    }

    impl<'s, 'e, 'r, F> PinnedDrop for InEntry<'s, 'e, 'r, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let work = this.work;
            this.scope.run(
                this.entry,
                || {
                    // SAFETY: the work is pinned in place and dropped exactly once, here; it is never touched
                    // again.
                    unsafe { ManuallyDrop::drop(work.get_unchecked_mut()) }
                },
                |_| false,
            );
        }
    }
}

impl<F: Future> Future for InEntry<'_, '_, '_, F> {
    type Output = F::Output;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // SAFETY: `work` is structurally pinned; `ManuallyDrop` is a transparent wrapper.
        let work = unsafe { this.work.map_unchecked_mut(|f| &mut **f) };
        this.scope.run(this.entry, || work.poll(cx), Poll::is_pending)
    }
}

pin_project_lite::pin_project! {
    /// A future that carries a Sentinel context: installed in the thread-local during every poll and while the
    /// inner future is dropped, so nested resources see their parent, and a cancelled entry exits in the right
    /// context. `Send` exactly when the inner future is.
    #[must_use = "futures do nothing unless polled"]
    pub struct InContext<F> {
        #[pin]
        inner: ManuallyDrop<F>,
        carried: CarriedContext,
    }

    impl<F> PinnedDrop for InContext<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let inner = this.inner;
            this.carried.scope(|| {
                // SAFETY: the inner future is pinned in place and dropped exactly once, here; it is never
                // touched again.
                unsafe { ManuallyDrop::drop(inner.get_unchecked_mut()) }
            });
        }
    }
}

impl<F> InContext<F> {
    /// Wraps `inner`, carrying the calling thread's current context (and test engine, if one is scoped).
    pub fn new(inner: F) -> Self {
        Self::carrying(inner, CarriedContext::capture())
    }

    /// Wraps `inner`, carrying `carried`.
    pub(crate) fn carrying(inner: F, carried: CarriedContext) -> Self {
        InContext { inner: ManuallyDrop::new(inner), carried }
    }
}

impl<F: Future> Future for InContext<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // SAFETY: `inner` is structurally pinned; `ManuallyDrop` is a transparent wrapper.
        let inner = unsafe { this.inner.map_unchecked_mut(|f| &mut **f) };
        this.carried.scope(|| inner.poll(cx))
    }
}

/// Wraps the body future of an annotated `async fn`, carrying the caller's context.
#[inline(always)]
pub fn in_context<F: Future>(inner: F) -> InContext<F> {
    InContext::new(inner)
}

impl crate::Sentinel {
    /// The async form of [`Sentinel::scoped`](crate::Sentinel::scoped): `fut` runs with this engine standing
    /// in for the global one during every poll, on whatever thread polls it. Meant for tests of annotated
    /// `async fn`s on multi-threaded executors.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build().leak();
    /// let fut = engine.scoped_future(async { Sentinel::current().config().app_name.clone() });
    /// assert_eq!(futures::executor::block_on(fut), engine.config().app_name);
    /// ```
    pub fn scoped_future<F: Future>(&'static self, fut: F) -> impl Future<Output = F::Output> {
        self.scoped(|| InContext::new(fut))
    }
}
