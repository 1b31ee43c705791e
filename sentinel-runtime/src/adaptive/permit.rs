//! What the limiter hands out and answers: a call's place under the limit ([`Permit`]), the partition it
//! counts against ([`PartitionId`]), and a refusal with its numbers ([`AdaptiveBlock`]). Shared by the limiter and
//! its wait queue, which know each other only through these types and [`super::wait::Admission`].

pub(crate) use super::block::{AdaptiveBlock, AdaptiveBlockReason};

/// A partition of a limiter, by index (resolved once per origin with `Limiter::partition_of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartitionId(pub(crate) u8);

/// One call's place under the limit. Give it back with `Limiter::release` (the call completed: a sample)
/// or `Limiter::cancel` (the call never ran, e.g. a later check blocked it).
#[must_use = "a permit holds a place under the limit until it is released"]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Permit {
    pub(crate) partition: Option<PartitionId>,
    /// Calls in flight when this one was admitted, itself included.
    pub(crate) inflight: u32,
    /// The limiter's back-off epoch when it was admitted.
    pub(crate) epoch: u32,
}
