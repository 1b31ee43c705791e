//! reqwest glue (feature `reqwest`): the guard as reqwest-middleware's `Middleware`.

use futures::future::{select, Either};
use http::Extensions;
use reqwest::ResponseBuilderExt;
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};

use super::body::ClientBody;
use super::guard::{Admission, Call};
use super::layer::{client, OutboundGuard};
use super::request::CallView;

#[async_trait::async_trait]
impl Middleware for OutboundGuard<client::Reqwest> {
    /// Runs the call's checks; a blocked call is not sent, and returns `Error::Middleware` holding the
    /// [`BlockError`](crate::BlockError) (`err.downcast_ref::<BlockError>()`), or the fallback's answer.
    async fn handle(&self, req: Request, extensions: &mut Extensions, next: Next<'_>) -> Result<Response> {
        let admission = self.state.admit(&CallView::reqwest(&req, extensions));
        let decided = match admission {
            Admission::Unguarded => return next.run(req, extensions).await,
            Admission::Blocked(blocked) => Err(blocked),
            Admission::Pass(call) => Ok(call),
            Admission::Wait(mut call, wait) => {
                call.engine().sleep(wait).await;
                call.at_turn();
                Ok(call)
            }
            Admission::Queued(queued) => queued.admitted().await,
        };
        let call = match decided {
            Ok(call) => call,
            Err(blocked) => {
                return match self.state.fallback(&blocked, &CallView::reqwest(&req, extensions)) {
                    Some(answer) => Ok(with_url(answer.map(reqwest::Body::from), req.url().clone())),
                    None => Err(Error::middleware(blocked)),
                };
            }
        };
        run(call, req, extensions, next).await
    }
}

async fn run(mut call: Call, req: Request, extensions: &mut Extensions, next: Next<'_>) -> Result<Response> {
    let sent = next.run(req, extensions);
    let result = match (call.timer(), call.limit()) {
        (Some(timer), Some(limit)) => match select(sent, timer).await {
            Either::Left((result, _)) => result,
            // The call's future is dropped, then the entry exits as a timed-out call.
            Either::Right(((), sent)) => {
                drop(sent);
                return Err(Error::middleware(call.timed_out(limit)));
            }
        },
        _ => sent.await,
    };
    let response = match result {
        Ok(r) => r,
        Err(e) => {
            // A middleware after this one blocked the call (another guard): it was not sent, and a block is
            // no failure of the downstream's (Java's `Tracer` never traces a `BlockException`).
            if crate::AsBlockError::block_error(&e).is_none() {
                call.failed();
            }
            return Err(e);
        }
    };
    if !call.head(response.status(), response.headers()) {
        return Ok(response);
    }
    // The entry stays in the body until it ends.
    let url = response.url().clone();
    let http: http::Response<reqwest::Body> = response.into();
    let watched = http.map(|b| reqwest::Body::wrap(ClientBody::inner(b, Some(Box::new(call)))));
    Ok(with_url(watched, url))
}

/// A block of a guard (this one's, or a later one's) is `Error::Middleware` holding the `BlockError` (or an
/// error caused by one, [`BlockError::find_in`](crate::BlockError::find_in)).
impl crate::AsBlockError for Error {
    #[inline]
    fn block_error(&self) -> Option<&crate::BlockError> {
        match self {
            Error::Middleware(m) => m.downcast_ref().or_else(|| crate::BlockError::find_in(m.as_ref())),
            _ => None,
        }
    }
}

/// A reqwest answer from an `http` one, keeping the URL the call went to.
fn with_url(answer: http::Response<reqwest::Body>, url: reqwest::Url) -> Response {
    let (parts, body) = answer.into_parts();
    let mut builder = http::Response::builder().status(parts.status).version(parts.version).url(url);
    if let Some(h) = builder.headers_mut() {
        *h = parts.headers;
    }
    if let Some(e) = builder.extensions_mut() {
        e.extend(parts.extensions);
    }
    match builder.body(body) {
        Ok(r) => Response::from(r),
        // Unreachable: the status and version came from a response.
        Err(_) => Response::from(http::Response::new(reqwest::Body::from(""))),
    }
}
