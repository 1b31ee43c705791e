//! [`ResponseFuture`]: waits out a queueing decision, calls the client, enforces the time limit, and
//! judges the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ClientBody;
use super::error::ClientError;
use super::guard::{Admitted, Call, GuardState};
use super::request::CallView;
use crate::clock::Sleep;
use crate::BlockError;

pin_project! {
    /// The future of a [`SentinelClientService`](super::SentinelClientService) call.
    ///
    /// Dropping it before it completes (the caller gave up) drops the client's future and exits the call's
    /// entry without counting an error.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        // Declared after the state: the client's future is dropped before the entry exits.
        call: Option<Call>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        /// A queueing rule asked the call to wait.
        Waiting { sleep: Sleep, pending: Option<Box<(S, Request<B>)>> },
        /// The call waits for a place or a lease, and is decided again.
        Queued { admitted: Admitted, pending: Option<Box<(S, Request<B>, Arc<GuardState>)>> },
        /// The client runs.
        Calling { #[pin] future: S::Future, timeout: Option<Box<Sleep>> },
        /// No resource guards this call.
        Unguarded { #[pin] future: S::Future },
        /// Blocked, without a fallback.
        Blocked { error: Option<BlockError> },
        /// Blocked, with the fallback's answer.
        Fallback { response: Option<Box<Response<Bytes>>> },
        Done,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn unguarded(future: S::Future) -> Self {
        ResponseFuture { state: State::Unguarded { future }, call: None }
    }
    pub(crate) fn blocked(error: BlockError) -> Self {
        ResponseFuture { state: State::Blocked { error: Some(error) }, call: None }
    }
    pub(crate) fn fallback(response: Response<Bytes>) -> Self {
        ResponseFuture { state: State::Fallback { response: Some(Box::new(response)) }, call: None }
    }
    pub(crate) fn calling(future: S::Future, call: Call) -> Self {
        let timeout = call.timer();
        ResponseFuture { state: State::Calling { future, timeout }, call: Some(call) }
    }
    pub(crate) fn queued(admitted: Admitted, service: S, request: Request<B>, guard: Arc<GuardState>) -> Self {
        ResponseFuture {
            state: State::Queued { admitted, pending: Some(Box::new((service, request, guard))) },
            call: None,
        }
    }
    pub(crate) fn waiting(sleep: Sleep, service: S, request: Request<B>, call: Call) -> Self {
        ResponseFuture {
            state: State::Waiting { sleep, pending: Some(Box::new((service, request))) },
            call: Some(call),
        }
    }
}

/// Judges the client's answer and decides where the call's entry exits: now, or at the end of the body.
fn finish<B, E: 'static>(
    slot: &mut Option<Call>,
    result: Result<Response<B>, E>,
) -> Result<Response<ClientBody<B>>, ClientError<E>> {
    let Some(mut call) = slot.take() else {
        return result.map(|r| r.map(|b| ClientBody::inner(b, None))).map_err(ClientError::Client);
    };
    match result {
        Err(e) => {
            // A guard inside this one blocked the call (stacked guards): it was not sent, and a block is no
            // failure of the downstream's (Java's `Tracer` never traces a `BlockException`). Its entry exits
            // without an error and, never answered, gives no sample to an adaptive limit.
            if crate::error::nested_block(&e).is_none() {
                call.failed();
            }
            Err(ClientError::Client(e))
        }
        Ok(response) => {
            let hold = call.head(response.status(), response.headers());
            let call = hold.then(|| Box::new(call));
            Ok(response.map(|b| ClientBody::inner(b, call)))
        }
    }
}

const POLLED_AFTER_COMPLETION: &str = "`ResponseFuture` polled after it completed";

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: 'static,
{
    type Output = Result<Response<ClientBody<ResBody>>, ClientError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { sleep, pending } => {
                    if Pin::new(sleep).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let Some(boxed) = pending.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    let (mut service, request) = *boxed;
                    if let Some(call) = this.call.as_mut() {
                        call.at_turn();
                    }
                    let future = service.call(request);
                    let timeout = this.call.as_ref().and_then(Call::timer);
                    this.state.set(State::Calling { future, timeout });
                }
                StateProj::Queued { admitted, pending } => {
                    let decided = std::task::ready!(admitted.as_mut().poll(cx));
                    let Some(boxed) = pending.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    let (mut service, request, guard) = *boxed;
                    match decided {
                        Ok(call) => {
                            let future = service.call(request);
                            let timeout = call.timer();
                            *this.call = Some(call);
                            this.state.set(State::Calling { future, timeout });
                        }
                        Err(blocked) => match guard.fallback(&blocked, &CallView::new(&request)) {
                            Some(response) => this.state.set(State::Fallback { response: Some(Box::new(response)) }),
                            None => this.state.set(State::Blocked { error: Some(blocked) }),
                        },
                    }
                }
                StateProj::Calling { future, timeout } => {
                    if let Poll::Ready(result) = future.poll(cx) {
                        this.state.set(State::Done);
                        return Poll::Ready(finish(this.call, result));
                    }
                    if !timeout.as_mut().is_some_and(|t| Pin::new(t).poll(cx).is_ready()) {
                        return Poll::Pending;
                    }
                    // The client's future is dropped, then the entry exits as a timed-out call.
                    this.state.set(State::Done);
                    let Some(mut call) = this.call.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    let Some(limit) = call.limit() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    return Poll::Ready(Err(ClientError::TimedOut(call.timed_out(limit))));
                }
                StateProj::Unguarded { future } => {
                    let result = std::task::ready!(future.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(finish(this.call, result));
                }
                StateProj::Blocked { error } => {
                    let Some(error) = error.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    this.state.set(State::Done);
                    // A guard stacked over this one tells the block from a failure by its type.
                    super::error::may_block_as::<S::Error>();
                    return Poll::Ready(Err(ClientError::Blocked(error)));
                }
                StateProj::Fallback { response } => {
                    let Some(response) = response.take() else { panic!("{POLLED_AFTER_COMPLETION}") };
                    this.state.set(State::Done);
                    return Poll::Ready(Ok((*response).map(ClientBody::full)));
                }
                StateProj::Done => panic!("{POLLED_AFTER_COMPLETION}"),
            }
        }
    }
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Queued { .. } => "queued",
            State::Calling { .. } => "calling",
            State::Unguarded { .. } => "unguarded",
            State::Blocked { .. } => "blocked",
            State::Fallback { .. } => "fallback",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture").field("state", &state).field("call", &self.call).finish()
    }
}
