//! Whether and how a call may wait for a cluster token service: the kind of wait a caller allows
//! ([`Wait`]), the deadline of a wait under way ([`DeadlineScope`]) and the clock waits run on
//! ([`mono_nanos`]). The waits themselves hold a rule's lease: `flow::token_service::pending`.

use std::cell::Cell;
use std::sync::OnceLock;

/// Whether (and how) a call whose lease is empty waits for the token service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It does not wait: decided by the local fallback at once ([`EntryBuilder::decide`]).
    ///
    /// [`EntryBuilder::decide`]: crate::EntryBuilder::decide
    Now,
    /// It blocks its thread until the deadline ([`mono_nanos`]; 0: not waited yet).
    Blocking(u64),
    /// It awaits (the caller retries after `take_pending`'s wait completes), until the deadline (0: not
    /// waited yet).
    Async(u64),
}

const MODE_BLOCKING: u8 = 0;
const MODE_NOW: u8 = 1;
const MODE_ASYNC: u8 = 2;

impl Wait {
    /// The kind of wait as one byte (blocking is 0), without the deadline.
    #[inline(always)]
    pub(crate) fn mode(self) -> u8 {
        match self {
            Wait::Blocking(_) => MODE_BLOCKING,
            Wait::Now => MODE_NOW,
            Wait::Async(_) => MODE_ASYNC,
        }
    }
    /// The deadline of a wait under way (0: none).
    #[inline(always)]
    pub(crate) fn deadline(self) -> u64 {
        match self {
            Wait::Blocking(d) | Wait::Async(d) => d,
            Wait::Now => 0,
        }
    }
    /// The wait of [`mode`](Self::mode) `m` (its deadline is in [`DeadlineScope`]).
    #[inline(always)]
    pub(crate) fn of_mode(m: u8) -> Wait {
        match m {
            MODE_NOW => Wait::Now,
            MODE_ASYNC => Wait::Async(0),
            _ => Wait::Blocking(0),
        }
    }
}

thread_local! {
    static DEADLINE: Cell<u64> = const { Cell::new(0) };
}

/// The deadline of the wait a call decides again after (0: none), for the checks made meanwhile on this
/// thread: set for the scope of one decision, read only on a cluster rule's slow path.
pub(crate) struct DeadlineScope(bool);

impl DeadlineScope {
    /// Sets `deadline` for the scope (nothing when 0: the common case costs one compare).
    #[inline(always)]
    pub(crate) fn enter(deadline: u64) -> DeadlineScope {
        if deadline != 0 {
            Self::set(deadline);
        }
        DeadlineScope(deadline != 0)
    }
    #[cold]
    fn set(deadline: u64) {
        let _ = DEADLINE.try_with(|c| c.set(deadline));
    }
    /// The deadline set for this thread now (0: none).
    pub(crate) fn current() -> u64 {
        DEADLINE.try_with(Cell::get).unwrap_or(0)
    }
}

impl Drop for DeadlineScope {
    #[inline(always)]
    fn drop(&mut self) {
        if self.0 {
            Self::set(0);
        }
    }
}

/// Nanoseconds on a monotonic clock of the process (never 0). Calls wait for a token service in real time
/// whatever the engine's clock: the service (and the shared limit's time) runs in real time.
pub(crate) fn mono_nanos() -> u64 {
    static ANCHOR: OnceLock<std::time::Instant> = OnceLock::new();
    let anchor = *ANCHOR.get_or_init(std::time::Instant::now);
    u64::try_from(anchor.elapsed().as_nanos()).unwrap_or(u64::MAX).saturating_add(1)
}
