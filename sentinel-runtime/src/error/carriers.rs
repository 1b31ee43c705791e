//! Blocks in errors known only as a type parameter (the web layer and the outbound guards, feature `tower`).

use std::any::{Any, TypeId};

use super::{AsBlockError, BlockError};

/// Finds the block in a value of a type known to be able to hold one.
type BlockIn = for<'a> fn(&'a (dyn Any + 'static)) -> Option<&'a BlockError>;

/// Error types that may hold a block and that the code checking a value of them knows only as a type parameter
/// (an outbound guard's `ClientError<E>`, seen by a guard stacked over it or by the web layer around a proxy),
/// each with how to find the block in a value of it. A type is registered on its first block path and looked
/// up on an error path ([`nested_block`]); a call that succeeds touches neither. One entry per such type in the
/// program (a duplicate pushed by two threads at once is harmless).
static BLOCK_CARRIERS: boxcar::Vec<(TypeId, BlockIn)> = boxcar::Vec::new();

fn block_in<'a, T: AsBlockError + 'static>(error: &'a (dyn Any + 'static)) -> Option<&'a BlockError> {
    error.downcast_ref::<T>()?.block_error()
}

/// Registers `T` as a type whose values may be a block, for [`nested_block`].
pub(crate) fn register_block_carrier<T: AsBlockError + 'static>() {
    let id = TypeId::of::<T>();
    if !BLOCK_CARRIERS.iter().any(|(_, (t, _))| *t == id) {
        BLOCK_CARRIERS.push((id, block_in::<T>));
    }
}

/// The block an error of a type known only as a type parameter is, when it is one: a `BlockError`, a boxed
/// error, `io::Error` or `tonic::Status` that is or was caused by one (tower's `BoxError`, see
/// [`BlockError::find_in`]), or a value of a registered type ([`register_block_carrier`]: another guard's
/// `ClientError::Blocked`). Called on error paths only.
#[cold]
pub(crate) fn nested_block<E: 'static>(error: &E) -> Option<&BlockError> {
    let any: &(dyn Any + 'static) = error;
    if let Some(b) = any.downcast_ref::<BlockError>() {
        return Some(b);
    }
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
    // A block converted to a status (`From<BlockError> for Status`) is the status's source.
    #[cfg(feature = "tonic")]
    if let Some(status) = any.downcast_ref::<tonic::Status>() {
        return BlockError::find_in(status);
    }
    let id = TypeId::of::<E>();
    BLOCK_CARRIERS.iter().find(|(_, (t, _))| *t == id).and_then(|(_, (_, found))| found(any))
}
