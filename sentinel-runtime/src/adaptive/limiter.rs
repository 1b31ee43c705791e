//! The limiter: permits against the current limit, partitions, the window of samples and the control that
//! updates the limit.
//!
//! # Concurrency (proof sketch)
//!
//! State shared between callers: `inflight` (permits out), `limit` (published by the control), per partition
//! `inflight` and `guarantee`, the sample window's accumulators, and the wait queue (see `wait.rs`).
//!
//! * **Permits are counted exactly.** A permit is taken by exactly one successful compare-exchange: on the
//!   total (`inflight < limit`, the shared pool) or on its partition (`partition.inflight < guarantee`, the
//!   guaranteed share); the other counter is then incremented unconditionally, so both counters count the
//!   permit once. A [`Permit`] is neither `Clone` nor `Copy` and is consumed by [`Limiter::release`] or
//!   [`Limiter::cancel`], which decrement both counters once. So `inflight` is always the number of permits
//!   out, and no counter can underflow.
//! * **Bounded in flight.** The shared pool admits only while `inflight < limit` (the CAS fails if another
//!   caller took the last place first); a partition's guarantee admits only while its own count is under
//!   its guarantee. So `inflight <= limit + Σ guarantee` at all times, and `inflight <= limit` when there are
//!   no partitions. When the total is at the limit, only partitions under their guarantee are admitted,
//!   and the excess drains as borrowed permits come back (no borrower is admitted while the total is at the
//!   limit): each partition converges to at least its share under contention, and may use every idle place
//!   otherwise.
//! * **No lost wake-up.** A waiter enqueues itself (`queue.len += 1`, `SeqCst`, under the queue's lock) and
//!   then retries once before sleeping; a releaser decrements `inflight` (`SeqCst`) and then reads
//!   `queue.len` (`SeqCst`). In the single order of these `SeqCst` operations, either the releaser's read
//!   comes after the waiter's increment (the releaser then takes the queue's lock, after the waiter's
//!   critical section, and hands it the freed place), or the releaser's decrement comes before the waiter's
//!   increment, and then the waiter's retry (a `SeqCst` load) sees the freed place. Either way the place is
//!   not left idle while the waiter sleeps.
//! * **The control runs alone.** Closing a window takes the control's mutex with `try_lock` only (a caller
//!   never waits for it: if another caller is closing the window, this one just leaves). Only the holder
//!   mutates the algorithm and publishes `limit` and the guarantees; callers read them with plain loads, and a
//!   caller that reads a limit a moment old admits or refuses one call by the old limit, as any limiter does.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use super::algorithm::{Algorithm, WindowSample};
use super::permit::{AdaptiveBlock, AdaptiveBlockReason, PartitionId, Permit};
use super::rule::{AdaptiveRule, ProbeConfig, WindowConfig, DEFAULT_PARTITION};
use super::wait::{Admission, WaitQueue};

use crate::clock::NANOS_PER_MILLI as NANOS_PER_MS;

/// A partition's live state.
#[derive(Debug)]
pub(crate) struct PartitionState {
    pub(crate) origin: Box<str>,
    pub(crate) share: f64,
    pub(crate) guarantee: AtomicU32,
    pub(crate) inflight: AtomicU32,
}

/// What the limiter shows (for diagnose, gauges and the console, once wired).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LimiterView {
    pub(crate) limit: u32,
    pub(crate) inflight: u32,
    pub(crate) baseline_rtt_nanos: u64,
    pub(crate) min_rtt_nanos: u64,
    pub(crate) rtt_nanos: u64,
    pub(crate) gradient: f64,
    pub(crate) algorithm: super::rule::AlgorithmKind,
    pub(crate) probing: bool,
    pub(crate) waiting: usize,
    /// Per partition: origin, share, guarantee, in flight.
    pub(crate) partitions: Vec<(Box<str>, f64, u32, u32)>,
}

/// Envoy-style probe of the minimum RTT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// Not probing; the next probe starts at the first window that closes after `next_at` (`u64::MAX`: never).
    Idle { next_at: u64 },
    /// The limit is pinned; waiting for the calls admitted before to finish.
    Draining,
    /// The limit is pinned; measuring.
    Measuring,
}

/// State only the window's closer touches.
#[derive(Debug)]
struct Control {
    algorithm: Algorithm,
    window_start: u64,
    probe: Probe,
    rng: fastrand::Rng,
    last: Option<WindowSample>,
}

/// An adaptive concurrency limiter for one resource. It knows no engine: time is passed in.
#[derive(Debug)]
pub(crate) struct Limiter {
    limit: AtomicU32,
    /// Permits out: shared with the limiters of the resource's earlier rules whose calls are still in
    /// flight (a changed rule's limiter starts with them, see `slot.rs`).
    inflight: Arc<AtomicU32>,
    /// Counts the limit's decreases: a drop of a call admitted since the last decrease closes the window at
    /// once when the algorithm backs off on drops (one back-off per round of calls, as TCP backs off once per round trip), while drops of calls
    /// admitted under the older, higher limit only count in the window.
    epoch: AtomicU32,
    /// Whether the algorithm lowers the limit on a drop (AIMD, Vegas), so that a drop closes the window at
    /// once. Gradient2 leaves drops out of its formula: for it a drop is a sample like any other, and the
    /// window closes on time (else each drop would close a window of one sample and add its queue allowance
    /// to the limit, growing it faster the more calls the downstream sheds).
    drop_closes_window: bool,
    /// When the epoch last changed (nanoseconds of the caller's clock): a call admitted since belongs to it.
    epoch_since: AtomicU64,
    partitions: Box<[PartitionState]>,
    default_partition: Option<PartitionId>,
    window: super::window::SampleWindow,
    /// The time after which a release tries to close the window.
    next_close: AtomicU64,
    control: Mutex<Control>,
    pub(crate) queue: WaitQueue,
    window_cfg: WindowConfig,
    probe_cfg: ProbeConfig,
    ignore_under_nanos: u64,
    min_limit: u32,
    max_limit: u32,
    pub(crate) max_wait_nanos: u64,
}

impl Limiter {
    /// A limiter for a validated `rule`, for an inbound or outbound resource, starting at `now`. `seed` drives
    /// the jitter of probes (tests pass a fixed one).
    #[cfg(test)]
    pub(crate) fn new(rule: &AdaptiveRule, inbound: bool, now: u64, seed: u64) -> Self {
        Self::counting(rule, inbound, now, seed, Arc::default())
    }

    /// [`new`](Self::new), counting its calls in flight in `inflight` (which may already count calls of the
    /// limiter it replaces).
    pub(crate) fn counting(rule: &AdaptiveRule, inbound: bool, now: u64, seed: u64, inflight: Arc<AtomicU32>) -> Self {
        let algorithm = Algorithm::new(rule, rule.algorithm_for(inbound), seed);
        let drop_closes_window = algorithm.backs_off_on_drop();
        let partitions: Box<[PartitionState]> = rule
            .partitions
            .iter()
            .map(|p| PartitionState {
                origin: p.origin.as_str().into(),
                share: p.share,
                guarantee: AtomicU32::new(0),
                inflight: AtomicU32::new(0),
            })
            .collect();
        let default_partition =
            partitions.iter().position(|p| &*p.origin == DEFAULT_PARTITION).map(|i| PartitionId(i as u8));
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
        let probe = Probe::Idle { next_at: next_probe(&rule.probe, now, &mut rng) };
        let limiter = Limiter {
            limit: AtomicU32::new(rule.initial_limit),
            inflight,
            epoch: AtomicU32::new(0),
            drop_closes_window,
            epoch_since: AtomicU64::new(now),
            partitions,
            default_partition,
            window: super::window::SampleWindow::new(),
            next_close: AtomicU64::new(now.saturating_add(rule.window.window_ms * NANOS_PER_MS)),
            control: Mutex::new(Control { algorithm, window_start: now, probe, rng, last: None }),
            queue: WaitQueue::new(rule.waiters_bound() as usize),
            window_cfg: rule.window,
            probe_cfg: rule.probe,
            ignore_under_nanos: rule.window.ignore_rtt_under_us.saturating_mul(1_000),
            min_limit: rule.min_limit,
            max_limit: rule.max_limit,
            max_wait_nanos: rule.max_wait_ms.saturating_mul(NANOS_PER_MS),
        };
        limiter.publish(rule.initial_limit);
        limiter
    }

    /// The partition of calls from `origin`: the one naming it, else `default`, else none (such calls only
    /// use the shared pool). Resolve once per origin, not per call.
    pub(crate) fn partition_of(&self, origin: &str) -> Option<PartitionId> {
        self.partitions
            .iter()
            .position(|p| &*p.origin == origin)
            .map(|i| PartitionId(i as u8))
            .or(self.default_partition)
    }

    /// Whether the rule has partitions (else no origin needs matching).
    #[inline(always)]
    pub(crate) fn has_partitions(&self) -> bool {
        !self.partitions.is_empty()
    }

    /// The limit in force.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.load(Relaxed)
    }

    /// Calls in flight.
    pub(crate) fn inflight(&self) -> u32 {
        self.inflight.load(Relaxed)
    }

    fn partition(&self, id: PartitionId) -> &PartitionState {
        &self.partitions[usize::from(id.0)]
    }

    /// Takes a permit if there is room: the shared pool under the limit, or the partition's guarantee.
    #[inline]
    pub(crate) fn try_acquire(&self, partition: Option<PartitionId>) -> Option<Permit> {
        let limit = self.limit.load(Relaxed);
        let mut total = self.inflight.load(SeqCst);
        while total < limit {
            match self.inflight.compare_exchange_weak(total, total + 1, SeqCst, SeqCst) {
                Ok(_) => {
                    if let Some(id) = partition {
                        self.partition(id).inflight.fetch_add(1, SeqCst);
                    }
                    return Some(Permit { partition, inflight: total + 1, epoch: self.epoch.load(Relaxed) });
                }
                Err(now) => total = now,
            }
        }
        let id = partition?;
        let p = self.partition(id);
        let guarantee = p.guarantee.load(Relaxed);
        let mut own = p.inflight.load(SeqCst);
        while own < guarantee {
            match p.inflight.compare_exchange_weak(own, own + 1, SeqCst, SeqCst) {
                Ok(_) => {
                    let total = self.inflight.fetch_add(1, SeqCst) + 1;
                    return Some(Permit { partition, inflight: total, epoch: self.epoch.load(Relaxed) });
                }
                Err(now) => own = now,
            }
        }
        None
    }

    /// Takes a permit, waiting up to the rule's `max_wait_ms` on `clock`'s timer when the limit is reached.
    /// (The engine's calls wait through `slot::PlaceWait`, which owns its limiter.)
    #[cfg(test)]
    pub(crate) fn acquire(
        &self,
        partition: Option<PartitionId>,
        clock: &crate::clock::EngineClock,
    ) -> impl std::future::Future<Output = Result<Permit, AdaptiveBlock>> + Send + '_ + use<'_> {
        use futures::FutureExt;
        super::wait::WaitForPermit::start(self, partition, clock, self.max_wait_nanos)
            .map(move |r| r.map_err(|end| end.into_block(self)))
    }

    /// The blocking variant for sync callers: parks this thread until a permit or the end of the wait. Never
    /// call it on an async executor's worker (use [`Limiter::acquire`] there).
    #[cfg(test)]
    pub(crate) fn acquire_blocking(
        &self,
        partition: Option<PartitionId>,
        clock: &crate::clock::EngineClock,
    ) -> Result<Permit, AdaptiveBlock> {
        futures::executor::block_on(self.acquire(partition, clock))
    }

    /// The permit of a call admitted at `admitted_at` (nanoseconds) with `inflight` calls in flight (itself
    /// included) that its caller did not keep: its partition, those calls in flight and the back-off epoch it
    /// was admitted in (the current one if it was admitted since the last decrease, else an older one).
    pub(crate) fn permit_of(&self, partition: Option<PartitionId>, inflight: u32, admitted_at: u64) -> Permit {
        let epoch = self.epoch.load(Relaxed);
        let epoch = if admitted_at >= self.epoch_since.load(Relaxed) { epoch } else { epoch.wrapping_sub(1) };
        Permit { partition, inflight, epoch }
    }

    /// Takes a permit or says why not (no waiting).
    #[cfg(test)]
    pub(crate) fn acquire_now(&self, partition: Option<PartitionId>) -> Result<Permit, AdaptiveBlock> {
        self.try_acquire(partition).ok_or_else(|| self.blocked(AdaptiveBlockReason::AtLimit))
    }

    /// The numbers of a refusal.
    pub(crate) fn blocked(&self, reason: AdaptiveBlockReason) -> AdaptiveBlock {
        // The numbers are for the message: if the window's closer holds the control, they are left out.
        let (baseline, last) = match self.control.try_lock() {
            Ok(c) => (c.algorithm.baseline_rtt_nanos(), c.last.unwrap_or_default()),
            Err(_) => (0, WindowSample::default()),
        };
        AdaptiveBlock {
            reason,
            limit: self.limit(),
            inflight: self.inflight(),
            baseline_rtt_nanos: baseline,
            min_rtt_nanos: last.min_rtt_nanos,
            rtt_nanos: last.rtt_nanos,
        }
    }

    /// A call completed after `rtt_nanos`; `dropped` when it failed by overload (a time limit, 429, 503,
    /// `RESOURCE_EXHAUSTED`, ...). Records the sample, closes the window when due, and frees the place.
    #[inline]
    pub(crate) fn release(&self, permit: Permit, now: u64, rtt_nanos: u64, dropped: bool) {
        if rtt_nanos >= self.ignore_under_nanos || dropped {
            self.window.record(rtt_nanos, permit.inflight, dropped);
        }
        let early = dropped && self.drop_closes_window && permit.epoch == self.epoch.load(Relaxed);
        if early || now >= self.next_close.load(Relaxed) {
            self.close_window(now);
        }
        self.give_back(permit);
    }

    /// Gives a permit back without a sample (the call never ran).
    pub(crate) fn cancel(&self, permit: Permit) {
        self.give_back(permit);
    }

    fn give_back(&self, permit: Permit) {
        // A count at zero is never taken below it (a place given back to a limiter that did not count it, see
        // `slot.rs`): the check costs nothing on the common path.
        if let Some(p) = permit.partition.and_then(|id| self.partitions.get(usize::from(id.0)))
            && p.inflight.fetch_sub(1, SeqCst) == 0
        {
            p.inflight.fetch_add(1, SeqCst);
        }
        if self.inflight.fetch_sub(1, SeqCst) == 0 {
            self.inflight.fetch_add(1, SeqCst);
        }
        if self.queue.len() > 0 {
            self.queue.grant(self);
        }
    }

    /// Gives back the place of a call that an earlier rule's limiter admitted (counted in the shared
    /// `inflight`, in none of this limiter's partitions): no sample.
    pub(crate) fn give_back_carried(&self) {
        if self.inflight.fetch_sub(1, SeqCst) == 0 {
            self.inflight.fetch_add(1, SeqCst);
        }
        if self.queue.len() > 0 {
            self.queue.grant(self);
        }
    }

    /// Publishes a limit and the partitions' guarantees (`ceil(limit · share)`).
    fn publish(&self, limit: u32) {
        for p in self.partitions.iter() {
            let g = (f64::from(limit) * p.share).ceil() as u32;
            p.guarantee.store(g, Relaxed);
        }
        self.limit.store(limit, Relaxed);
    }

    fn publish_estimate(&self, estimate: f64) {
        let limit = (estimate.floor() as u32).clamp(self.min_limit, self.max_limit);
        self.publish(limit);
    }

    /// Closes the window if it is ready (the caller's `now` is past `next_close`). Never waits: if another
    /// caller holds the control, this one leaves.
    #[cold]
    fn close_window(&self, now: u64) {
        let Ok(mut c) = self.control.try_lock() else { return };
        let cfg = self.window_cfg;
        let elapsed = now.saturating_sub(c.window_start);
        let count = self.window.count();
        match c.probe {
            Probe::Draining => {
                // Partitions' guarantees may keep a little more than the pinned limit in flight: the drain
                // is bounded in time too, so a probe can never pin the limit for good.
                if self.inflight.load(SeqCst) <= self.probe_limit() || elapsed >= cfg.max_window_ms * NANOS_PER_MS {
                    // The calls admitted under the old limit are done (or had their time): measure from here.
                    let _ = self.window.take();
                    c.probe = Probe::Measuring;
                    c.window_start = now;
                }
                return;
            }
            Probe::Measuring => {
                if count < self.probe_cfg.samples && elapsed < cfg.max_window_ms * NANOS_PER_MS {
                    return;
                }
                if let Some(s) = self.window.take() {
                    c.algorithm.reset_baseline(&s);
                    c.last = Some(s);
                }
                let next_at = next_probe(&self.probe_cfg, now, &mut c.rng);
                c.probe = Probe::Idle { next_at };
                self.publish_estimate(c.algorithm.limit());
            }
            Probe::Idle { next_at } => {
                if count == 0 {
                    c.window_start = now;
                } else if count < cfg.min_samples
                    && elapsed < cfg.max_window_ms * NANOS_PER_MS
                    && !(self.drop_closes_window
                        && self.window.has_drop()
                        && elapsed >= c.last.map_or(0, |s| s.rtt_nanos))
                {
                    // Too few samples yet: extend the window (never drop it: slow responses are few). A drop
                    // closes it at once, once the window is one round trip old, for an algorithm that backs
                    // off on drops.
                    return;
                } else if let Some(s) = self.window.take() {
                    let before = self.limit();
                    let estimate = c.algorithm.update(&s);
                    c.last = Some(s);
                    self.publish_estimate(estimate);
                    if self.limit() < before {
                        self.epoch_since.store(now, Relaxed);
                        self.epoch.fetch_add(1, Relaxed);
                    }
                }
                if now >= next_at {
                    c.probe = Probe::Draining;
                    self.publish(self.probe_limit());
                    c.window_start = now;
                    // Every release checks while probing (at most `probe.concurrency` calls run).
                    self.next_close.store(now, Relaxed);
                    return;
                }
            }
        }
        c.window_start = now;
        self.next_close.store(now.saturating_add(cfg.window_ms * NANOS_PER_MS), Relaxed);
        drop(c);
        // A higher limit may let waiters in.
        if self.queue.len() > 0 {
            self.queue.grant(self);
        }
    }

    fn probe_limit(&self) -> u32 {
        self.probe_cfg.concurrency.clamp(1, self.max_limit)
    }

    /// The limiter's numbers.
    pub(crate) fn view(&self) -> LimiterView {
        let c = self.control.lock().unwrap_or_else(|e| e.into_inner());
        LimiterView {
            limit: self.limit(),
            inflight: self.inflight(),
            baseline_rtt_nanos: c.algorithm.baseline_rtt_nanos(),
            min_rtt_nanos: c.last.map_or(0, |s| s.min_rtt_nanos),
            rtt_nanos: c.last.map_or(0, |s| s.rtt_nanos),
            gradient: c.algorithm.gradient(),
            algorithm: c.algorithm.kind(),
            probing: !matches!(c.probe, Probe::Idle { .. }),
            waiting: self.queue.len(),
            partitions: self
                .partitions
                .iter()
                .map(|p| (p.origin.clone(), p.share, p.guarantee.load(Relaxed), p.inflight.load(Relaxed)))
                .collect(),
        }
    }
}

impl Admission for Limiter {
    fn try_acquire(&self, partition: Option<PartitionId>) -> Option<Permit> {
        Limiter::try_acquire(self, partition)
    }
    fn cancel(&self, permit: Permit) {
        Limiter::cancel(self, permit)
    }
    fn blocked(&self, reason: AdaptiveBlockReason) -> AdaptiveBlock {
        Limiter::blocked(self, reason)
    }
    fn queue(&self) -> &WaitQueue {
        &self.queue
    }
}

/// The time of the next probe: `interval · (1 + jitter · u)`, `u` uniform in [0, 1) (Envoy's: the jitter only
/// delays a probe), or never.
fn next_probe(cfg: &ProbeConfig, now: u64, rng: &mut fastrand::Rng) -> u64 {
    if cfg.interval_ms == 0 {
        return u64::MAX;
    }
    let spread = 1.0 + cfg.jitter * rng.f64();
    let interval = (cfg.interval_ms as f64 * spread * NANOS_PER_MS as f64) as u64;
    now.saturating_add(interval)
}
