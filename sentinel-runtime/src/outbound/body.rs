//! The answer's body: the downstream's, optionally holding the call's entry until it ends, or a fallback's.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::guard::Call;

pin_project! {
    /// The body of an answer that went through [`SentinelClientLayer`](super::SentinelClientLayer): the
    /// downstream's, or a fallback's.
    ///
    /// When the call's entry is held until the body ends ([`ExitOn::BodyEnd`](crate::web::ExitOn::BodyEnd),
    /// and every gRPC call), it exits at the end of the stream (the last frame, the trailers, an error: a
    /// gRPC status in the trailers is judged there) or when the body is dropped (without an error).
    pub struct ClientBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, call: Option<Box<Call>> },
        Full { data: Option<Bytes> },
    }
}

impl<B> ClientBody<B> {
    pub(crate) fn inner(body: B, call: Option<Box<Call>>) -> Self {
        ClientBody { kind: Kind::Inner { body, call } }
    }
    pub(crate) fn full(data: Bytes) -> Self {
        ClientBody { kind: Kind::Full { data: (!data.is_empty()).then_some(data) } }
    }
}

impl<B> Body for ClientBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { mut body, call } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                if let Some(c) = call {
                    let end = match &frame {
                        Some(Ok(f)) => match f.trailers_ref() {
                            Some(t) => {
                                c.trailers(t);
                                true
                            }
                            None => body.is_end_stream(),
                        },
                        Some(Err(_)) => {
                            c.failed();
                            true
                        }
                        None => true,
                    };
                    if end {
                        *call = None;
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

impl<B> std::fmt::Debug for ClientBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { call, .. } => {
                f.debug_struct("ClientBody").field("holds_entry", &call.is_some()).finish_non_exhaustive()
            }
            Kind::Full { data } => {
                f.debug_struct("ClientBody").field("len", &data.as_ref().map_or(0, Bytes::len)).finish()
            }
        }
    }
}
