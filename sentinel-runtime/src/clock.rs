//! Time sources.
//!
//! Every time the engine reads goes through a [`Clock`]: nanoseconds since the Unix epoch. The default
//! [`SystemClock`] reads the CPU's time-stamp counter (through `quanta`), which is several times cheaper than
//! `Instant::now()`, anchored once to the wall clock. Tests use a [`ManualClock`] and advance it by hand,
//! so that no test has to sleep for time to pass.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in nanoseconds since the Unix epoch.
///
/// Implementations must be cheap: the engine reads the clock on every entry and exit.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in nanoseconds since the Unix epoch.
    fn now_nanos(&self) -> u64;
    /// The current time with the finest resolution the clock has (the rate limiter's spacing uses it).
    fn precise_nanos(&self) -> u64 {
        self.now_nanos()
    }
}

struct Base {
    clock: quanta::Clock,
    anchor_raw: u64,
    anchor_epoch_nanos: u64,
}

impl Base {
    fn get() -> &'static Base {
        static BASE: OnceLock<Base> = OnceLock::new();
        BASE.get_or_init(|| {
            let clock = quanta::Clock::new();
            let anchor_raw = clock.raw();
            let anchor_epoch_nanos =
                SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            Base { clock, anchor_raw, anchor_epoch_nanos }
        })
    }
    #[inline]
    fn precise(&self) -> u64 {
        self.anchor_epoch_nanos + self.clock.delta_as_nanos(self.anchor_raw, self.clock.raw())
    }
}

/// The cached time, refreshed every millisecond by one background thread (Java Sentinel's `TimeUtil` does the
/// same): a read is one load of a shared word.
static CACHED_NANOS: AtomicU64 = AtomicU64::new(0);

fn start_ticker() {
    static TICKER: OnceLock<()> = OnceLock::new();
    TICKER.get_or_init(|| {
        let base = Base::get();
        CACHED_NANOS.store(base.precise(), Ordering::Release);
        let spawned = std::thread::Builder::new().name("sentinel-clock".into()).spawn(move || loop {
            CACHED_NANOS.store(base.precise(), Ordering::Release);
            std::thread::sleep(Duration::from_millis(1));
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the clock ticker; the cached clock will not advance");
        }
    });
}

/// The default clock: wall-clock anchored, monotonic, cheap.
///
/// [`SystemClock::new`] (the default, also [`SystemClock::precise`]) reads the CPU's time-stamp counter on
/// every call: about 10 ns, response times to the microsecond, and no thread. [`SystemClock::cached`] reads
/// a millisecond timestamp that a ticker thread refreshes 1,000 times a second, as Java Sentinel's `TimeUtil`
/// does: a read is one load, but response times are then whole milliseconds, and the ticker's wake-ups cost
/// CPU all the time (in a KVM guest each one measured 24–35 µs of CPU: 2–3 % of a core, idle or loaded) and
/// preempt the workers of a process that runs on one or two CPUs. Either way the rate limiter spaces calls
/// with the precise reading.
#[derive(Clone)]
pub struct SystemClock {
    /// The time-stamp counter's base for the precise clock (held here, so that a read does not look the
    /// process-wide base up again); `None` for the cached clock.
    base: Option<&'static Base>,
}

impl SystemClock {
    /// The precise clock (the default).
    pub fn new() -> Self {
        Self::precise()
    }
    /// The precise clock: a time-stamp counter read per call, no background thread.
    pub fn precise() -> Self {
        SystemClock { base: Some(Base::get()) }
    }
    /// The cached (millisecond) clock; starts the process-wide ticker thread on first use.
    pub fn cached() -> Self {
        start_ticker();
        SystemClock { base: None }
    }
    /// Whether this clock reads the cached time.
    pub fn is_cached(&self) -> bool {
        self.base.is_none()
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemClock").field("cached", &self.is_cached()).finish()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        match self.base {
            Some(base) => base.precise(),
            None => CACHED_NANOS.load(Ordering::Relaxed),
        }
    }
    #[inline]
    fn precise_nanos(&self) -> u64 {
        self.base.unwrap_or_else(Base::get).precise()
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
///
/// Timers made by [`Sentinel::sleep`](crate::Sentinel::sleep) on an engine with a manual clock complete when
/// the clock is moved past their deadline.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
    timers: Arc<Mutex<ManualTimers>>,
}

/// Wakers of the timers waiting for a manual clock to reach their deadlines.
#[derive(Debug, Default)]
struct ManualTimers {
    next_id: u64,
    waiting: Vec<(u64, u64, Waker)>,
}

impl ManualClock {
    /// A clock at the given number of nanoseconds since the epoch.
    pub fn at_nanos(nanos: u64) -> Self {
        ManualClock { nanos: Arc::new(AtomicU64::new(nanos)), timers: Default::default() }
    }
    /// A clock at the given number of milliseconds since the epoch.
    pub fn at_millis(millis: u64) -> Self {
        Self::at_nanos(millis.saturating_mul(1_000_000))
    }
    /// Moves the clock forward (saturating at `u64::MAX` nanoseconds), and wakes the timers now due.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self.nanos.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_add(by)));
        self.wake_due();
    }
    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_millis(&self, ms: u64) {
        self.advance(Duration::from_millis(ms));
    }
    /// Sets the clock to an absolute time (it may go backwards, which the engine tolerates).
    pub fn set_millis(&self, millis: u64) {
        self.set_nanos(millis.saturating_mul(1_000_000));
    }
    /// Sets the clock to an absolute time in nanoseconds.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::SeqCst);
        self.wake_due();
    }
    fn timers(&self) -> std::sync::MutexGuard<'_, ManualTimers> {
        self.timers.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn wake_due(&self) {
        let now = self.nanos.load(Ordering::SeqCst);
        let due: Vec<Waker> = {
            let mut t = self.timers();
            let (due, waiting) = std::mem::take(&mut t.waiting).into_iter().partition(|(d, _, _)| *d <= now);
            t.waiting = waiting;
            due.into_iter().map(|(_, _, w)| w).collect()
        };
        due.into_iter().for_each(Waker::wake);
    }
    /// Registers (or refreshes) the waker of timer `id` for `deadline`; returns the timer's id.
    fn register(&self, id: Option<u64>, deadline: u64, waker: &Waker) -> u64 {
        let mut t = self.timers();
        if let Some(id) = id
            && let Some(slot) = t.waiting.iter_mut().find(|(_, i, _)| *i == id)
        {
            slot.2.clone_from(waker);
            return id;
        }
        let id = id.unwrap_or_else(|| {
            t.next_id += 1;
            t.next_id
        });
        t.waiting.push((deadline, id, waker.clone()));
        id
    }
    fn deregister(&self, id: u64) {
        self.timers().waiting.retain(|(_, i, _)| *i != id);
    }
    /// How many timers wait for this clock (tests use it to know that a future is asleep).
    pub fn pending_timers(&self) -> usize {
        self.timers().waiting.len()
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

    #[inline]
    pub(crate) fn precise_nanos(&self) -> u64 {
        match self {
            EngineClock::System(c) => c.precise_nanos(),
            EngineClock::Manual(c) => c.now_nanos(),
            EngineClock::Custom(c) => c.precise_nanos(),
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

/// A timer on an engine's clock: made by [`Sentinel::sleep`](crate::Sentinel::sleep).
///
/// On the system clock it is a real timer (runtime-agnostic: it needs no tokio); on a [`ManualClock`] it
/// completes when the clock is moved past its deadline, so tests never wait for real time to pass.
#[must_use = "futures do nothing unless polled"]
pub struct Sleep {
    inner: SleepInner,
}

enum SleepInner {
    Real(futures_timer::Delay),
    Manual { clock: ManualClock, deadline: u64, id: Option<u64> },
}

impl Sleep {
    pub(crate) fn new(clock: &EngineClock, duration: Duration) -> Sleep {
        let inner = match clock {
            EngineClock::Manual(c) => {
                let d = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
                SleepInner::Manual { clock: c.clone(), deadline: c.now_nanos().saturating_add(d), id: None }
            }
            _ => SleepInner::Real(futures_timer::Delay::new(duration)),
        };
        Sleep { inner }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.inner {
            SleepInner::Real(d) => Pin::new(d).poll(cx),
            SleepInner::Manual { clock, deadline, id } => {
                if clock.now_nanos() >= *deadline {
                    if let Some(i) = id.take() {
                        clock.deregister(i);
                    }
                    return Poll::Ready(());
                }
                *id = Some(clock.register(*id, *deadline, cx.waker()));
                // The clock may have moved between the check and the registration.
                if clock.now_nanos() >= *deadline {
                    if let Some(i) = id.take() {
                        clock.deregister(i);
                    }
                    return Poll::Ready(());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let SleepInner::Manual { clock, id: Some(i), .. } = &self.inner {
            clock.deregister(*i);
        }
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            SleepInner::Real(_) => f.write_str("Sleep(system clock)"),
            SleepInner::Manual { deadline, .. } => write!(f, "Sleep(manual clock, until {deadline} ns)"),
        }
    }
}

/// Nanoseconds in a millisecond.
pub(crate) const NANOS_PER_MILLI: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_system_clock_is_the_precise_one() {
        assert!(!SystemClock::new().is_cached());
        assert!(!SystemClock::default().is_cached());
        assert!(SystemClock::cached().is_cached());
        let c = SystemClock::new();
        let (a, b) = (c.now_nanos(), c.now_nanos());
        assert!(b >= a, "monotonic: {a} then {b}");
        assert!(a > 1_600_000_000_000_000_000, "anchored to the wall clock: {a}");
    }
}
