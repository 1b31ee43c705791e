//! [`ClientError`]: why a guarded tower client's call did not return the downstream's answer.

use std::any::{Any, TypeId};

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
    /// `source()`, so that the error is known as a block behind a box or a wrapper ([`BlockError::find_in`]).
    #[error("{0}")]
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
            ClientError::Client(e) => nested_block(e),
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

/// Finds the block in a value of a type known to be able to hold one.
type BlockIn = for<'a> fn(&'a (dyn Any + 'static)) -> Option<&'a BlockError>;

/// The guards' error types (`ClientError<E>`) that have blocked a call, each with how to find the block in a
/// value of it. A guard stacked over another sees the inner guard's `ClientError<E>` as its client's error, a
/// type its generic code cannot name: it looks the type up here (the inner guard registered it before its first
/// block left it) and asks the value itself ([`AsBlockError`]), so a block is told from a failure exactly.
/// Written on a block path, read on an error path; never on a call that succeeds.
static BLOCKING_ERRORS: boxcar::Vec<(TypeId, BlockIn)> = boxcar::Vec::new();

fn block_in<'a, T: AsBlockError + 'static>(error: &'a (dyn Any + 'static)) -> Option<&'a BlockError> {
    error.downcast_ref::<T>()?.block_error()
}

/// Registers `ClientError<E>` as a type that may hold a block: called by a guard before its block leaves it.
pub(crate) fn may_block_as<E: 'static>() {
    let id = TypeId::of::<ClientError<E>>();
    // Two threads may both push the same type the first time: a duplicate is harmless.
    if !BLOCKING_ERRORS.iter().any(|(_, (t, _))| *t == id) {
        BLOCKING_ERRORS.push((id, block_in::<ClientError<E>>));
    }
}

/// The block the wrapped client's error is, when it is one: another guard's `ClientError::Blocked` (stacked
/// guards), a `BlockError`, or a boxed error or `io::Error` that is or was caused by one (tower's `BoxError`
/// holding the inner guard's `ClientError`, see [`BlockError::find_in`]). Called on the error path only.
#[cold]
pub(crate) fn nested_block<E: 'static>(error: &E) -> Option<&BlockError> {
    let any: &(dyn Any + 'static) = error;
    if let Some(b) = any.downcast_ref::<BlockError>() {
        return Some(b);
    }
    // A boxed error (tower's `BoxError`: a `Buffer`, a `Timeout` between two guards) holding a block or the
    // inner guard's `ClientError::Blocked`, whose source is its block; an `io::Error` holding one.
    if let Some(b) = any.downcast_ref::<Box<dyn std::error::Error + Send + Sync>>() {
        return b.block_error();
    }
    if let Some(b) = any.downcast_ref::<Box<dyn std::error::Error + Send>>() {
        return b.block_error();
    }
    if let Some(b) = any.downcast_ref::<Box<dyn std::error::Error>>() {
        return b.block_error();
    }
    if let Some(io) = any.downcast_ref::<std::io::Error>() {
        return io.block_error();
    }
    let id = TypeId::of::<E>();
    BLOCKING_ERRORS.iter().find(|(_, (t, _))| *t == id).and_then(|(_, (_, found))| found(any))
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
