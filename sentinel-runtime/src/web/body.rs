//! The response body: the service's own, optionally holding the request's entry until it ends, or the
//! layer's own short body (blocked calls, timeouts).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::layer::Judging;
use super::outcome::{is_error_by_default, GrpcCode, Outcome};
use super::scope::RequestEntry;

/// Decides whether an outcome counts as an error.
pub(crate) type OutcomeFn = Arc<dyn Fn(Outcome) -> bool + Send + Sync>;

/// Whether `outcome` counts as an error: the layer's predicate, or [`is_error_by_default`].
#[inline]
pub(crate) fn is_error(trace_if: Option<&OutcomeFn>, outcome: Outcome) -> bool {
    match trace_if {
        Some(f) => f(outcome),
        None => is_error_by_default(outcome),
    }
}

/// Holds a request's entry until the body ends: then a gRPC status in the trailers is judged, and the
/// entry exits. Dropped before the end (the client went away), the entry exits without an error.
pub(crate) struct BodyWatch {
    pub(crate) entry: RequestEntry,
    pub(crate) grpc: bool,
    pub(crate) judging: Option<Arc<Judging>>,
}

/// What a body holds until it ends (the inbound layer's request entry, the outbound guard's call): told of
/// the trailers and of an error, dropped at the end of the stream or with the body.
pub(crate) trait Watch {
    /// The body ended with these trailers.
    fn trailers(&mut self, trailers: &http::HeaderMap);
    /// The body failed.
    fn error(&mut self);
}

impl Watch for BodyWatch {
    fn trailers(&mut self, trailers: &http::HeaderMap) {
        if self.grpc {
            if let Some(code) = GrpcCode::from_headers(trailers) {
                if is_error(self.judging.as_ref().and_then(|j| j.trace_if.as_ref()), Outcome::Grpc(code)) {
                    self.error();
                }
            }
        }
    }
    fn error(&mut self) {
        self.entry.entry_mut().set_error();
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

pin_project! {
    /// A body that holds a [`Watch`] until it ends, or a short body of the middleware's own.
    #[project = WatchedProj]
    pub(crate) enum WatchedBody<B, W> {
        // Boxed: most responses hold nothing, and a response is moved several times on its way out.
        Inner { #[pin] body: B, watch: Option<Box<W>> },
        Full { data: Option<Bytes> },
    }
}

impl<B, W> WatchedBody<B, W> {
    /// `body`, holding `watch` (if any) until it ends.
    pub(crate) fn inner(body: B, watch: Option<Box<W>>) -> Self {
        WatchedBody::Inner { body, watch }
    }
    /// The middleware's own body.
    pub(crate) fn full(data: Bytes) -> Self {
        WatchedBody::Full { data: (!data.is_empty()).then_some(data) }
    }
    /// Whether the body holds its watch.
    pub(crate) fn holds(&self) -> Option<bool> {
        match self {
            WatchedBody::Inner { watch, .. } => Some(watch.is_some()),
            WatchedBody::Full { .. } => None,
        }
    }
    /// The length of the middleware's own body.
    pub(crate) fn full_len(&self) -> usize {
        match self {
            WatchedBody::Full { data } => data.as_ref().map_or(0, Bytes::len),
            WatchedBody::Inner { .. } => 0,
        }
    }
}

impl<B: Body<Data = Bytes>, W: Watch> Body for WatchedBody<B, W> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            WatchedProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            WatchedProj::Inner { mut body, watch } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                if let Some(w) = watch {
                    let end = match &frame {
                        Some(Ok(f)) => match f.trailers_ref() {
                            Some(t) => {
                                w.trailers(t);
                                true
                            }
                            None => body.is_end_stream(),
                        },
                        Some(Err(_)) => {
                            w.error();
                            true
                        }
                        None => true,
                    };
                    if end {
                        // The watch is dropped now, not when the server gets around to dropping the body.
                        *watch = None;
                    }
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            WatchedBody::Inner { body, .. } => body.is_end_stream(),
            WatchedBody::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            WatchedBody::Inner { body, .. } => body.size_hint(),
            WatchedBody::Full { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
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
        match self.kind.holds() {
            Some(held) => f.debug_struct("ResponseBody").field("holds_entry", &held).finish_non_exhaustive(),
            None => f.debug_struct("ResponseBody").field("len", &self.kind.full_len()).finish(),
        }
    }
}
