//! The answer's body: the downstream's, optionally holding the call's entry until it ends, or a fallback's.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::guard::Call;
use crate::web::watched::{Watch, WatchedBody};

impl Watch for Call {
    fn trailers(&mut self, trailers: &http::HeaderMap) {
        Call::trailers(self, trailers);
    }
    fn error(&mut self) {
        self.failed();
    }
    fn ended_without_trailers(&mut self) {
        Call::ended_without_trailers(self);
    }
    fn awaits_end(&self) -> bool {
        // A gRPC answer that ends without a status has failed (see `Call::ended_without_trailers`).
        self.grpc
    }
}

pin_project! {
    /// The body of an answer that went through [`SentinelClientLayer`](super::SentinelClientLayer): the
    /// downstream's, or a fallback's.
    ///
    /// When the call's entry is held until the body ends ([`ExitOn::BodyEnd`](crate::web::ExitOn::BodyEnd),
    /// and every gRPC call), it exits at the end of the stream (the last frame, the trailers, an error: a
    /// gRPC status in the trailers is judged there) or when the body is dropped (without an error).
    pub struct ClientBody<B> {
        #[pin]
        kind: WatchedBody<B, Call>,
    }
}

impl<B> ClientBody<B> {
    pub(crate) fn inner(body: B, call: Option<Box<Call>>) -> Self {
        ClientBody { kind: WatchedBody::inner(body, call) }
    }
    pub(crate) fn full(data: Bytes) -> Self {
        ClientBody { kind: WatchedBody::full(data) }
    }
}

impl<B: Body<Data = Bytes>> Body for ClientBody<B> {
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

impl<B> std::fmt::Debug for ClientBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind.fmt_as("ClientBody", f)
    }
}
