//! What the limiter hands out and answers: a call's place under the limit ([`Permit`]), the partition it
//! counts against ([`PartitionId`]), and a refusal with its numbers ([`AdaptiveBlock`]). Shared by the limiter and
//! its wait queue, which know each other only through these types and [`super::wait::Admission`].

use std::fmt;

use crate::clock::NANOS_PER_MILLI as NANOS_PER_MS;

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

/// Why an adaptive rule refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdaptiveBlockReason {
    /// The limit was reached and the rule lets no call wait.
    AtLimit,
    /// The call waited `max_wait_ms` and no place freed up.
    WaitTimedOut,
    /// The call was waiting when the wait queue filled up; newer callers go first under overload.
    Displaced,
}

/// Why an adaptive rule refused a call, and its limiter's numbers at that moment: what
/// [`BlockError::Adaptive`](crate::BlockError::Adaptive) carries and its message shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveBlock {
    /// Why.
    pub reason: AdaptiveBlockReason,
    /// The limit in force.
    pub limit: u32,
    /// Calls in flight.
    pub inflight: u32,
    /// The algorithm's baseline RTT in nanoseconds (Gradient2's long-term RTT, Vegas's no-load RTT; 0 when
    /// none yet).
    pub baseline_rtt_nanos: u64,
    /// The last closed window's lowest RTT in nanoseconds (0 when none yet).
    pub min_rtt_nanos: u64,
    /// The last closed window's average RTT in nanoseconds (0 when none yet).
    pub rtt_nanos: u64,
}

impl AdaptiveBlock {
    /// When a retry may find a place: about one current round trip (a place frees when a call in flight
    /// completes), at least 1 ms; before any window closed, the baseline RTT, or else one second (the
    /// default window).
    pub fn retry_after(&self) -> std::time::Duration {
        let rtt = if self.rtt_nanos > 0 { self.rtt_nanos } else { self.baseline_rtt_nanos };
        if rtt == 0 {
            return std::time::Duration::from_secs(1);
        }
        std::time::Duration::from_nanos(rtt.max(NANOS_PER_MS))
    }
}

impl fmt::Display for AdaptiveBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |n: u64| n as f64 / NANOS_PER_MS as f64;
        match self.reason {
            AdaptiveBlockReason::AtLimit => write!(f, "adaptive limit {} reached", self.limit)?,
            AdaptiveBlockReason::WaitTimedOut => write!(f, "adaptive limit {} reached and the wait ran out", self.limit)?,
            AdaptiveBlockReason::Displaced => {
                write!(f, "adaptive limit {} reached; newer calls took the wait queue", self.limit)?
            }
        }
        write!(
            f,
            " ({} in flight; measured min RTT {:.1} ms against current RTT {:.1} ms, baseline {:.1} ms)",
            self.inflight,
            ms(self.min_rtt_nanos),
            ms(self.rtt_nanos),
            ms(self.baseline_rtt_nanos)
        )
    }
}

