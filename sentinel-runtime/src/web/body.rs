//! The response body: the service's own, optionally holding the request's entry until it ends, or the
//! layer's own short body (blocked calls, timeouts).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::config::JudgingRef;
use super::outcome::{GrpcCode, Outcome};
use super::scope::RequestEntry;
use super::watched::{Watch, WatchedBody};

/// Holds a request's entry until the body ends: then a gRPC call's status (in the trailers; `UNKNOWN` when
/// the body ends without one, see [`GrpcCode::at_end`]) is judged, and the entry exits. Dropped before the end
/// (the client went away), the entry exits without an error.
pub(crate) struct BodyWatch {
    pub(crate) entry: RequestEntry,
    pub(crate) grpc: bool,
    pub(crate) judging: Option<JudgingRef>,
}

impl BodyWatch {
    /// Judges a gRPC call's end as a status in the response headers is judged: an error by the predicate,
    /// an overload (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`) for adaptive rules.
    fn grpc_ended(&mut self, trailers: Option<&http::HeaderMap>) {
        if self.grpc {
            let outcome = Outcome::Grpc(GrpcCode::at_end(trailers));
            let trace_if = self.judging.as_ref().and_then(|j| j.trace_if.as_ref());
            self.entry.judge(super::config::is_error(trace_if, outcome), outcome);
        }
    }
}

impl Watch for BodyWatch {
    fn trailers(&mut self, trailers: &http::HeaderMap) {
        self.grpc_ended(Some(trailers));
    }
    fn error(&mut self) {
        self.entry.set_error();
    }
    fn ended_without_trailers(&mut self) {
        self.grpc_ended(None);
    }
    fn awaits_end(&self) -> bool {
        // A gRPC response that ends without a status has failed: its end must be seen.
        self.grpc
    }
}

pin_project! {
    /// The body of a response that went through the layer: the service's body, or the layer's own (a
    /// blocked call, a timeout).
    ///
    /// When the entry is held until the body ends ([`ExitOn::BodyEnd`](super::ExitOn::BodyEnd), and every
    /// gRPC call), the entry exits at the end of the stream (the last frame, the trailers, an error) or when
    /// the body is dropped.
    pub struct ResponseBody<B> {
        #[pin]
        kind: WatchedBody<B, BodyWatch>,
    }
}

impl<B> ResponseBody<B> {
    /// The service's body, with nothing held.
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody { kind: WatchedBody::inner(body, None) }
    }
    /// The service's body, holding the entry until it ends.
    pub(crate) fn watched(body: B, watch: Box<BodyWatch>) -> Self {
        ResponseBody { kind: WatchedBody::inner(body, Some(watch)) }
    }
    /// The layer's own body.
    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody { kind: WatchedBody::full(data) }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().kind.poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.kind.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.kind.size_hint()
    }
}

/// How a layer hands back the response body: the type of the bodies of its responses. Sealed; the modes
/// are [`Wrapped`] (the default) and, with feature `axum`, [`AxumBody`].
pub trait BodyMode<B>: sealed::Sealed + Send + Sync + 'static {
    /// The body of the layer's responses.
    type Body: Body<Data = Bytes>;
    /// The service's body, with nothing held.
    #[doc(hidden)]
    fn plain(body: B) -> Self::Body;
    /// A body the layer built (one that holds the entry until it ends, or the layer's own).
    #[doc(hidden)]
    fn wrap(body: ResponseBody<B>) -> Self::Body;
}

mod sealed {
    pub trait Sealed {}
}

/// The default [`BodyMode`]: every response's body is a [`ResponseBody`] around the service's (any body
/// type: hyper, tonic, axum).
#[derive(Clone, Copy, Debug, Default)]
pub struct Wrapped;

impl sealed::Sealed for Wrapped {}

impl<B: Body<Data = Bytes>> BodyMode<B> for Wrapped {
    type Body = ResponseBody<B>;
    #[inline(always)]
    fn plain(body: B) -> ResponseBody<B> {
        ResponseBody::inner(body)
    }
    #[inline(always)]
    fn wrap(body: ResponseBody<B>) -> ResponseBody<B> {
        body
    }
}

/// The [`BodyMode`] of [`SentinelLayer::axum`](super::SentinelLayer::axum) (feature `axum`): responses keep
/// axum's [`Body`](axum::body::Body). The service's body passes through untouched, where axum would box a
/// [`ResponseBody`] a second time on every response; only a body the layer must watch (until its end) or
/// writes itself (a blocked call, a timeout) is boxed into an axum `Body`.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default)]
pub struct AxumBody;

#[cfg(feature = "axum")]
impl sealed::Sealed for AxumBody {}

#[cfg(feature = "axum")]
impl BodyMode<axum::body::Body> for AxumBody {
    type Body = axum::body::Body;
    #[inline(always)]
    fn plain(body: axum::body::Body) -> axum::body::Body {
        body
    }
    #[inline]
    fn wrap(body: ResponseBody<axum::body::Body>) -> axum::body::Body {
        axum::body::Body::new(body)
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind.fmt_as("ResponseBody", f)
    }
}
