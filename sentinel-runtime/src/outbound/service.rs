//! [`SentinelClientService`]: names the call, runs its checks, then calls the wrapped client.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::error::ClientError;
use super::future::ResponseFuture;
use super::guard::{Admission, Guard};
use super::request::CallView;

/// The service made by [`SentinelClientLayer`](super::SentinelClientLayer): each call enters an outbound
/// resource before the wrapped client sends it; a blocked call is never sent.
pub struct SentinelClientService<S> {
    inner: S,
    state: Arc<Guard>,
}

impl<S> SentinelClientService<S> {
    pub(crate) fn new(inner: S, state: Arc<Guard>) -> Self {
        SentinelClientService { inner, state }
    }
    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
    /// The wrapped client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
    /// The wrapped client, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for SentinelClientService<S> {
    fn clone(&self) -> Self {
        SentinelClientService { inner: self.inner.clone(), state: self.state.clone() }
    }
}

impl<S: fmt::Debug> fmt::Debug for SentinelClientService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelClientService").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SentinelClientService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: 'static,
{
    type Response = Response<super::ClientBody<ResBody>>;
    type Error = ClientError<S::Error>;
    type Future = ResponseFuture<S, ReqBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ClientError::Client)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let view = CallView::new(&req);
        match self.state.admit(&view) {
            Admission::Unguarded => ResponseFuture::unguarded(self.inner.call(req)),
            Admission::Blocked(blocked) => match self.state.fallback(&blocked, &view) {
                Some(response) => ResponseFuture::fallback(response),
                None => ResponseFuture::blocked(blocked),
            },
            Admission::Pass(call) => ResponseFuture::calling(self.inner.call(req), call),
            Admission::Wait(call, wait) => {
                // The call runs after the wait: take the client that is ready and leave a clone in its place.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let sleep = call.engine().sleep(wait);
                ResponseFuture::waiting(sleep, ready, req, call)
            }
            Admission::Queued(queued) => {
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::queued(queued.admitted(), ready, req, self.state.state().clone())
            }
        }
    }
}
