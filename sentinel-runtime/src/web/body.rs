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

impl BodyWatch {
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
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // Boxed: most responses hold nothing, and a response is moved several times on its way out.
        Inner { #[pin] body: B, watch: Option<Box<BodyWatch>> },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The service's body, with nothing held.
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody { kind: Kind::Inner { body, watch: None } }
    }
    /// The service's body, holding the entry until it ends.
    pub(crate) fn watched(body: B, watch: Box<BodyWatch>) -> Self {
        ResponseBody { kind: Kind::Inner { body, watch: Some(watch) } }
    }
    /// The layer's own body.
    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody { kind: Kind::Full { data: (!data.is_empty()).then_some(data) } }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { mut body, watch } => {
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
                        // The entry exits now, not when the server gets around to dropping the body.
                        *watch = None;
                    }
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
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
        match &self.kind {
            Kind::Inner { watch, .. } => {
                f.debug_struct("ResponseBody").field("holds_entry", &watch.is_some()).finish_non_exhaustive()
            }
            Kind::Full { data } => {
                f.debug_struct("ResponseBody").field("len", &data.as_ref().map_or(0, Bytes::len)).finish()
            }
        }
    }
}
