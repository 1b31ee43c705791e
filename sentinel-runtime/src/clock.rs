//! Time sources.
//!
//! Every time the engine reads goes through a [`Clock`]: nanoseconds since the Unix epoch. The default
//! [`SystemClock`] reads the CPU's time-stamp counter (through `quanta`), which is several times cheaper than
//! `Instant::now()`, anchored once to the wall clock. Tests use a [`ManualClock`] and advance it by hand,
//! so that no test has to sleep for time to pass.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in nanoseconds since the Unix epoch.
///
/// Implementations must be cheap: the engine reads the clock on every entry and exit.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in nanoseconds since the Unix epoch.
    fn now_nanos(&self) -> u64;
}

/// The default clock: monotonic, cheap (a TSC read where the CPU has a stable one), anchored to the wall clock.
#[derive(Clone)]
pub struct SystemClock {
    inner: quanta::Clock,
    anchor_raw: u64,
    anchor_epoch_nanos: u64,
}

impl SystemClock {
    /// Creates a clock anchored to the current wall-clock time.
    pub fn new() -> Self {
        let inner = quanta::Clock::new();
        let anchor_raw = inner.raw();
        let anchor_epoch_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        SystemClock { inner, anchor_raw, anchor_epoch_nanos }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemClock").field("anchor_epoch_nanos", &self.anchor_epoch_nanos).finish()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        let raw = self.inner.raw();
        self.anchor_epoch_nanos + self.inner.delta_as_nanos(self.anchor_raw, raw)
    }
}

/// A clock that only moves when told to. Cloning it shares the same time.
///
/// ```
/// use sentinel_runtime::clock::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::at_millis(1_000);
/// clock.advance(Duration::from_millis(250));
/// assert_eq!(clock.now_nanos(), 1_250_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at the given number of nanoseconds since the epoch.
    pub fn at_nanos(nanos: u64) -> Self {
        ManualClock { nanos: Arc::new(AtomicU64::new(nanos)) }
    }
    /// A clock at the given number of milliseconds since the epoch.
    pub fn at_millis(millis: u64) -> Self {
        Self::at_nanos(millis.saturating_mul(1_000_000))
    }
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_millis(&self, ms: u64) {
        self.advance(Duration::from_millis(ms));
    }
    /// Sets the clock to an absolute time (it may go backwards, which the engine tolerates).
    pub fn set_millis(&self, millis: u64) {
        self.nanos.store(millis.saturating_mul(1_000_000), Ordering::SeqCst);
    }
    /// Sets the clock to an absolute time in nanoseconds.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::SeqCst);
    }
    /// The current time in milliseconds.
    pub fn now_millis(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst) / 1_000_000
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::Relaxed)
    }
}

/// The clock an engine uses: the common kinds are matched without a virtual call.
#[derive(Clone)]
pub(crate) enum EngineClock {
    System(SystemClock),
    Manual(ManualClock),
    Custom(Arc<dyn Clock>),
}

impl EngineClock {
    #[inline]
    pub(crate) fn now_nanos(&self) -> u64 {
        match self {
            EngineClock::System(c) => c.now_nanos(),
            EngineClock::Manual(c) => c.now_nanos(),
            EngineClock::Custom(c) => c.now_nanos(),
        }
    }

    /// Whether waiting should really sleep (a manual clock is advanced instead).
    pub(crate) fn manual(&self) -> Option<&ManualClock> {
        match self {
            EngineClock::Manual(c) => Some(c),
            _ => None,
        }
    }
}

impl fmt::Debug for EngineClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineClock::System(_) => f.write_str("SystemClock"),
            EngineClock::Manual(c) => write!(f, "ManualClock({} ms)", c.now_millis()),
            EngineClock::Custom(_) => f.write_str("CustomClock"),
        }
    }
}

/// Nanoseconds in a millisecond.
pub(crate) const NANOS_PER_MILLI: u64 = 1_000_000;
