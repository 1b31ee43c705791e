//! What a call an adaptive rule refused carries: why, and the limiter's numbers at that moment (the data of
//! [`BlockError::Adaptive`](crate::BlockError::Adaptive), apart from the rule so that the errors depend only on
//! data).

use std::fmt;

use crate::clock::NANOS_PER_MILLI as NANOS_PER_MS;

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
            AdaptiveBlockReason::WaitTimedOut => {
                write!(f, "adaptive limit {} reached and the wait ran out", self.limit)?
            }
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
