//! [`ResponseFuture`]: waits out a queueing decision, runs the service as the request's context, enforces
//! the time limit, and judges the response.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::block_response as block;
use super::body::{BodyMode, BodyWatch, ResponseBody, Wrapped};
use super::config::LayerState;
use super::config::{ExitOn, JudgingRef, LayerConfig, OutcomeFn};
use super::outcome::{GrpcCode, Outcome};
use super::refused::{blocked_response, QueuedRequest};
use super::request::RequestView;
use super::scope::{Extras, RequestEntry};
use crate::clock::Sleep;

/// A request that passed its checks: its entry, and what judging its response needs (copied from the
/// layer's configuration, taking a reference count only for what the layer customized).
pub(crate) struct Guard {
    entry: RequestEntry,
    grpc: bool,
    exit_on: ExitOn,
    /// A custom predicate and the time limit, when the layer has them.
    judging: Option<JudgingRef>,
}

impl Guard {
    #[inline(always)]
    pub(crate) fn new(mut entry: RequestEntry, grpc: bool, config: &LayerConfig) -> Self {
        entry.awaits_answer();
        Guard { entry, grpc, exit_on: config.exit_on, judging: config.judging.as_ref().map(|j| j.share()) }
    }
    #[inline(always)]
    pub(crate) fn in_scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.entry.in_scope(f)
    }
    fn trace_if(&self) -> Option<&OutcomeFn> {
        self.judging.as_ref().and_then(|j| j.trace_if.as_ref())
    }
    fn limit(&self) -> Option<Duration> {
        self.judging.as_ref().and_then(|j| j.timeout)
    }
    /// Judges an HTTP response by its status. Without a custom predicate, only 429 and up can be an error (5xx)
    /// or an overload (429, 503): the common answer is judged by one comparison, in line.
    #[inline(always)]
    fn judge_http(&mut self, status: StatusCode) {
        if status.as_u16() < StatusCode::TOO_MANY_REQUESTS.as_u16() && self.trace_if().is_none() {
            return;
        }
        self.judge(Outcome::Http(status));
    }
    fn judge(&mut self, outcome: Outcome) {
        let trace_if = self.judging.as_ref().and_then(|j| j.trace_if.as_ref());
        self.entry.judge(super::config::is_error(trace_if, outcome), outcome);
    }
    fn error(&mut self) {
        self.entry.set_error();
    }
    #[inline]
    fn timeout(&self) -> Option<Box<Sleep>> {
        match &self.judging {
            Some(j) if j.timeout.is_some() => timer(Some(j)),
            _ => None,
        }
    }
}

/// The time limit's timer, when the layer has one (boxed: only layers with a time limit pay for its room in
/// every future).
fn timer(judging: Option<&JudgingRef>) -> Option<Box<Sleep>> {
    let j = judging?;
    j.timeout.map(|d| Box::new(j.engine.sleep(d)))
}

/// Judges the service's response and decides where the request's entry exits: now (dropped in place) or at
/// the end of the body (moved into it).
fn finish<B, E: 'static, M: BodyMode<B>>(
    slot: &mut Option<Guard>,
    result: Result<Response<B>, E>,
) -> Result<Response<M::Body>, E> {
    let Some(g) = slot.as_mut() else {
        return result.map(|r| r.map(M::plain));
    };
    g.entry.answered();
    let mut response = match result {
        Ok(r) => r,
        Err(e) => {
            // A block of a call the service made (a proxy's guarded client, a nested guard) is no failure of
            // this request's, as Java's `CommonFilter` takes a nested `BlockException` as a block: the entry
            // exits without an error.
            if crate::error::nested_block(&e).is_none() {
                g.error();
            }
            *slot = None;
            return Err(e);
        }
    };
    if let Some(fields) = g.entry.take_headers() {
        fields.write_into(response.headers_mut());
    }
    let hold = if g.grpc {
        match GrpcCode::from_headers(response.headers()) {
            // A trailers-only response: the call ended with this status.
            Some(code) => {
                g.judge(Outcome::Grpc(code));
                false
            }
            None if response.status() != StatusCode::OK => {
                g.judge(Outcome::Http(response.status()));
                false
            }
            // The status comes in the trailers.
            None => true,
        }
    } else {
        g.judge_http(response.status());
        g.exit_on == ExitOn::BodyEnd
    };
    if !hold {
        // The entry exits in place (taking the guard out first would copy it only to drop it).
        *slot = None;
        return Ok(response.map(M::plain));
    }
    match slot.take() {
        Some(g) => {
            let watch = Box::new(BodyWatch { entry: g.entry, grpc: g.grpc, judging: g.judging });
            Ok(response.map(|b| M::wrap(ResponseBody::watched(b, watch))))
        }
        None => Ok(response.map(M::plain)),
    }
}

pin_project! {
    /// The future of a [`SentinelService`](super::SentinelService) call.
    ///
    /// Dropping it before it completes (the client went away, an outer timeout) drops the service's future
    /// and exits the request's entry without counting an error. `M`: the layer's
    /// [`BodyMode`](super::BodyMode).
    pub struct ResponseFuture<S, B, M = Wrapped>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        guard: Option<Guard>,
        mode: PhantomData<fn() -> M>,
    }

    impl<S, B, M> PinnedDrop for ResponseFuture<S, B, M>
    where
        S: Service<Request<B>>,
    {
        fn drop(this: Pin<&mut Self>) {
            // The service's future goes first, as the request's context (entries it still holds exit as
            // children of the request's entry), then the entry.
            let mut this = this.project();
            if let Some(guard) = this.guard.as_mut() {
                guard.in_scope(|| this.state.set(State::Done));
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        /// A queueing rule asked the call to wait (boxed: the rare case should not make every future larger).
        Waiting { sleep: Sleep, call: Option<Box<(S, Request<B>)>> },
        /// A check asked the call to wait (an adaptive rule's `maxWaitMs`, a cluster lease): it is decided
        /// again after the wait.
        Queued { decided: QueuedRequest, call: Option<Box<(S, Request<B>, Arc<LayerState>, bool)>> },
        /// The service runs.
        Calling { #[pin] future: S::Future, timeout: Option<Box<Sleep>> },
        /// No resource guards this request.
        Unguarded { #[pin] future: S::Future },
        /// The layer's own response (a blocked call; boxed for the same reason).
        Respond { response: Option<Box<Response<Bytes>>> },
        Done,
    }
}

impl<S, B, M> ResponseFuture<S, B, M>
where
    S: Service<Request<B>>,
{
    pub(crate) fn unguarded(future: S::Future) -> Self {
        ResponseFuture { state: State::Unguarded { future }, guard: None, mode: PhantomData }
    }
    pub(crate) fn blocked(response: Box<Response<Bytes>>) -> Self {
        ResponseFuture { state: State::Respond { response: Some(response) }, guard: None, mode: PhantomData }
    }
    /// Calls `service` as the request's context. Takes the request's entry rather than a guard, and the
    /// request rather than a closure over it: each is moved once, into the call or the future (a service's
    /// request and future are large, and each move of them is a copy).
    #[inline(always)]
    pub(crate) fn calling(
        service: &mut S,
        request: Request<B>,
        entry: crate::Entry<'static>,
        extras: Extras,
        grpc: bool,
        config: &LayerConfig,
    ) -> Self {
        let guard = Guard::new(RequestEntry::with(entry, extras), grpc, config);
        let timeout = guard.timeout();
        let future = {
            let _scope = guard.entry.scope();
            service.call(request)
        };
        ResponseFuture { state: State::Calling { future, timeout }, guard: Some(guard), mode: PhantomData }
    }
    pub(crate) fn queued(
        (decided, layer): (QueuedRequest, Arc<LayerState>),
        grpc: bool,
        service: S,
        request: Request<B>,
    ) -> Self {
        let state = State::Queued { decided, call: Some(Box::new((service, request, layer, grpc))) };
        ResponseFuture { state, guard: None, mode: PhantomData }
    }
    pub(crate) fn waiting(sleep: Sleep, service: S, request: Request<B>, guard: Guard) -> Self {
        let state = State::Waiting { sleep, call: Some(Box::new((service, request))) };
        ResponseFuture { state, guard: Some(guard), mode: PhantomData }
    }
}

const POLLED_AFTER_COMPLETION: &str = "`ResponseFuture` polled after it completed";

impl<S, B, M, ResBody> Future for ResponseFuture<S, B, M>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: 'static,
    M: BodyMode<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { sleep, call } => {
                    if Pin::new(sleep).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let Some(boxed) = call.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    let (mut service, request) = *boxed;
                    let (future, timeout) = match this.guard.as_mut() {
                        Some(g) => {
                            g.entry.at_turn();
                            (g.in_scope(|| service.call(request)), g.timeout())
                        }
                        None => (service.call(request), None),
                    };
                    this.state.set(State::Calling { future, timeout });
                }
                StateProj::Queued { decided, call } => {
                    let decided = std::task::ready!(decided.as_mut().poll(cx));
                    let Some(boxed) = call.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    let (mut service, request, layer, grpc) = *boxed;
                    let mut guard = match decided {
                        Ok(entry) => Guard::new(entry, grpc, &layer.config),
                        Err(blocked) => {
                            let view = RequestView::new(&request);
                            let response = blocked_response(&layer.config, &blocked, &view, grpc);
                            this.state.set(State::Respond { response: Some(Box::new(response)) });
                            continue;
                        }
                    };
                    if guard.entry.waits() {
                        // A queueing rule asks for a wait as well.
                        let sleep = layer.config.engine.sleep(guard.entry.wait());
                        *this.guard = Some(guard);
                        this.state.set(State::Waiting { sleep, call: Some(Box::new((service, request))) });
                        continue;
                    }
                    let timeout = guard.timeout();
                    let future = guard.in_scope(|| service.call(request));
                    *this.guard = Some(guard);
                    this.state.set(State::Calling { future, timeout });
                }
                StateProj::Calling { future, timeout } => {
                    let polled = match this.guard.as_mut() {
                        Some(g) => g.in_scope(|| future.poll(cx)),
                        None => future.poll(cx),
                    };
                    if let Poll::Ready(result) = polled {
                        this.state.set(State::Done);
                        return Poll::Ready(finish::<_, _, M>(this.guard, result));
                    }
                    let timed_out = timeout.as_mut().is_some_and(|t| Pin::new(t).poll(cx).is_ready());
                    if !timed_out {
                        return Poll::Pending;
                    }
                    let mut guard = this.guard.take();
                    let grpc = guard.as_ref().is_some_and(|g| g.grpc);
                    if let Some(g) = guard.as_mut() {
                        // The service's future is dropped as the request's context, then the entry exits as a
                        // timed-out call (an error whose response time is the limit).
                        g.in_scope(|| this.state.set(State::Done));
                        if let Some(limit) = g.limit() {
                            g.entry.set_timed_out(limit);
                        }
                    }
                    drop(guard);
                    return Poll::Ready(Ok(block::timeout_response(grpc).map(|b| M::wrap(ResponseBody::full(b)))));
                }
                StateProj::Unguarded { future } => {
                    let result = std::task::ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(result.map(|r| r.map(M::plain)));
                }
                StateProj::Respond { response } => {
                    let Some(response) = response.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    this.state.set(State::Done);
                    return Poll::Ready(Ok((*response).map(|b| M::wrap(ResponseBody::full(b)))));
                }
                StateProj::Done => panic!("{POLLED_AFTER_COMPLETION}"),
            }
        }
    }
}

impl<S, B, M> std::fmt::Debug for ResponseFuture<S, B, M>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Queued { .. } => "queued",
            State::Calling { .. } => "calling",
            State::Unguarded { .. } => "unguarded",
            State::Respond { .. } => "blocked",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("entry", &self.guard.as_ref().map(|g| &g.entry))
            .finish()
    }
}
