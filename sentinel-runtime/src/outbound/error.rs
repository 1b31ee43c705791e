//! [`ClientError`]: why a guarded tower client's call did not return the downstream's answer.

use crate::{AsBlockError, BlockError, Timeout};

/// The error of a call through [`SentinelClientLayer`](super::SentinelClientLayer): the call was blocked
/// (it never went out), ran past the guard's time limit, or the wrapped client failed.
///
/// With feature `tonic` it converts into a `tonic::Status` (`RESOURCE_EXHAUSTED`, `UNAVAILABLE` or
/// `PERMISSION_DENIED` for a block, with `grpc-retry-pushback-ms` when known; `DEADLINE_EXCEEDED` for the time
/// limit; the client's error as tonic would map it): add `.map_err(tonic::Status::from)` after the layer, and
/// a generated client returns that status to the caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError<E> {
    /// A rule, or the downstream's own back-off, blocked the call: it was not sent. The block is the error's
    /// `source()`, so that the error is known as a block behind a box or a wrapper ([`BlockError::find_in`]);
    /// the error's own message names the resource alone, so that a printer of the error's chain (`{:#}` of an
    /// `anyhow::Error`) shows the block's reason once.
    #[error("call to `{}` not sent: blocked", .0.resource())]
    Blocked(#[from] BlockError),
    /// The guard's time limit ran out (the call's future was dropped).
    #[error(transparent)]
    TimedOut(#[from] Timeout),
    /// The wrapped client's error.
    #[error(transparent)]
    Client(E),
}

impl<E: 'static> ClientError<E> {
    /// The block, when the call was blocked: by this guard, or by a guard the client holds (stacked guards, the
    /// client's error then being the inner guard's `ClientError::Blocked`, or a boxed error holding it).
    pub fn block_error(&self) -> Option<&BlockError> {
        match self {
            ClientError::Blocked(b) => Some(b),
            ClientError::Client(e) => crate::error::nested_block(e),
            ClientError::TimedOut(_) => None,
        }
    }
}

impl<E: 'static> AsBlockError for ClientError<E> {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        ClientError::block_error(self)
    }
}

/// Registers `ClientError<E>` as a type that may hold a block ([`crate::error::nested_block`] then finds it
/// behind a guard stacked over this one): called by a guard before its block leaves it.
pub(crate) fn may_block_as<E: 'static>() {
    crate::error::register_block_carrier::<ClientError<E>>();
}

#[cfg(feature = "tonic")]
impl<E> From<ClientError<E>> for tonic::Status
where
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    fn from(e: ClientError<E>) -> tonic::Status {
        match e {
            ClientError::Blocked(b) => b.into(),
            ClientError::TimedOut(t) => t.into(),
            ClientError::Client(e) => tonic::Status::from_error(e.into()),
        }
    }
}
