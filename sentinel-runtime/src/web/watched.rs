//! A response body that holds something until it ends: the one mechanism behind the inbound layer's
//! [`ResponseBody`](super::ResponseBody) (which holds a request's entry) and the outbound guard's
//! `ClientBody` (which holds a call's). The narrow module the two rooms
//! share; it imports neither.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// What a body holds until it ends (the inbound layer's request entry, the outbound guard's call): told of
/// the trailers and of an error, dropped at the end of the stream or with the body.
pub(crate) trait Watch {
    /// The body ended with these trailers.
    fn trailers(&mut self, trailers: &http::HeaderMap);
    /// The body failed.
    fn error(&mut self);
    /// The body ended without trailers.
    fn ended_without_trailers(&mut self) {}
    /// Whether the watch must see the body's end (whether it came with trailers): the body then does not
    /// report its end before a poll has shown it, so that a reader that trusts `is_end_stream` (tonic does)
    /// still polls it once.
    fn awaits_end(&self) -> bool {
        false
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
    /// Formats the body as `name`: whether it holds its watch, or the length of the middleware's own body.
    pub(crate) fn fmt_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchedBody::Inner { watch, .. } => {
                f.debug_struct(name).field("holds_entry", &watch.is_some()).finish_non_exhaustive()
            }
            WatchedBody::Full { data } => {
                f.debug_struct(name).field("len", &data.as_ref().map_or(0, Bytes::len)).finish()
            }
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
                            None => {
                                let end = body.is_end_stream();
                                if end {
                                    w.ended_without_trailers();
                                }
                                end
                            }
                        },
                        Some(Err(_)) => {
                            w.error();
                            true
                        }
                        None => {
                            w.ended_without_trailers();
                            true
                        }
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
            WatchedBody::Inner { body, watch } => {
                body.is_end_stream() && !watch.as_ref().is_some_and(|w| w.awaits_end())
            }
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
