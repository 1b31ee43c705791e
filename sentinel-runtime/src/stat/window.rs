//! Sliding windows of metric buckets (Java Sentinel's `LeapArray`).
//!
//! The per-second window is written on every call. Each of its buckets is split into cache-line stripes, one
//! per core (round robin over threads), so concurrent callers of one resource write different cache lines.
//! When a per-second bucket is reused for a later period, the thread that claims it folds its totals into the
//! per-minute window, which is therefore written about twice a second and needs no striping. Readers of
//! per-minute figures add the per-second buckets that have not been folded yet, so nothing is counted twice
//! or missed.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::stripe::{current_stripe, stripe_count};

/// The events a bucket counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum MetricEvent {
    /// Entries that passed every check.
    Pass = 0,
    /// Entries that were blocked.
    Block = 1,
    /// Completed entries on which an error was traced.
    Exception = 2,
    /// Completed entries (with or without error).
    Success = 3,
    /// Sum of response times, in microseconds.
    RtMicros = 4,
    /// Prioritized entries that borrowed from a later window.
    OccupiedPass = 5,
}

pub(crate) const EVENT_COUNT: usize = 6;
/// Minimum-rt sentinel for an empty bucket: Java's `statisticMaxRt` (5000 ms), in microseconds.
pub(crate) const MAX_RT_MICROS: u64 = 5_000_000;

const EMPTY: u64 = u64::MAX;
const RESETTING: u64 = u64::MAX - 1;

/// Totals of one bucket or of a range of buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketTotals {
    /// Counts indexed by [`MetricEvent`].
    pub counts: [u64; EVENT_COUNT],
    /// Smallest response time seen, in microseconds ([`MAX_RT_MICROS`] when none).
    pub min_rt_micros: u64,
}

impl Default for BucketTotals {
    fn default() -> Self {
        BucketTotals { counts: [0; EVENT_COUNT], min_rt_micros: MAX_RT_MICROS }
    }
}

impl BucketTotals {
    /// The count of one event.
    #[inline]
    pub fn get(&self, e: MetricEvent) -> u64 {
        self.counts[e as usize]
    }
    pub(crate) fn merge(&mut self, other: &BucketTotals) {
        for i in 0..EVENT_COUNT {
            self.counts[i] += other.counts[i];
        }
        self.min_rt_micros = self.min_rt_micros.min(other.min_rt_micros);
    }
    fn is_empty(&self) -> bool {
        self.counts.iter().all(|c| *c == 0)
    }
}

#[derive(Default)]
struct Cell {
    counts: [AtomicU64; EVENT_COUNT],
    min_rt: AtomicU64,
}

impl Cell {
    fn new() -> Self {
        let c = Cell::default();
        c.min_rt.store(MAX_RT_MICROS, Ordering::Relaxed);
        c
    }
    fn read_into(&self, t: &mut BucketTotals) {
        for i in 0..EVENT_COUNT {
            t.counts[i] += self.counts[i].load(Ordering::Relaxed);
        }
        t.min_rt_micros = t.min_rt_micros.min(self.min_rt.load(Ordering::Relaxed));
    }
    fn reset(&self) {
        for c in &self.counts {
            c.store(0, Ordering::Relaxed);
        }
        self.min_rt.store(MAX_RT_MICROS, Ordering::Relaxed);
    }
    fn add_totals(&self, t: &BucketTotals) {
        for i in 0..EVENT_COUNT {
            if t.counts[i] != 0 {
                self.counts[i].fetch_add(t.counts[i], Ordering::Relaxed);
            }
        }
        self.min_rt.fetch_min(t.min_rt_micros, Ordering::Relaxed);
    }
}

/// A window of `sample_count` buckets over `interval_ms`, without striping: written rarely.
pub(crate) struct PlainWindow {
    bucket_ms: u64,
    interval_ms: u64,
    starts: Box<[AtomicU64]>,
    cells: Box<[Cell]>,
}

impl PlainWindow {
    pub(crate) fn new(sample_count: usize, interval_ms: u64) -> Self {
        let n = sample_count.max(1);
        PlainWindow {
            bucket_ms: (interval_ms / n as u64).max(1),
            interval_ms,
            starts: (0..n).map(|_| AtomicU64::new(EMPTY)).collect(),
            cells: (0..n).map(|_| Cell::new()).collect(),
        }
    }

    /// Adds totals that belong to time `at_ms` (dropped when `at_ms` is older than the bucket now there).
    pub(crate) fn add(&self, at_ms: u64, t: &BucketTotals) {
        if t.is_empty() {
            return;
        }
        let n = self.starts.len();
        let idx = ((at_ms / self.bucket_ms) % n as u64) as usize;
        let start = at_ms - at_ms % self.bucket_ms;
        loop {
            let s = self.starts[idx].load(Ordering::Acquire);
            if s == start {
                self.cells[idx].add_totals(t);
                return;
            }
            if s == RESETTING {
                std::hint::spin_loop();
                continue;
            }
            if s != EMPTY && s > start {
                return; // older than what the slot holds: outside the window already
            }
            if self.starts[idx].compare_exchange(s, RESETTING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.cells[idx].reset();
                self.starts[idx].store(start, Ordering::Release);
            }
        }
    }

    /// Visits every bucket still inside the window at `now_ms`, with its start.
    pub(crate) fn for_each_valid(&self, now_ms: u64, mut f: impl FnMut(u64, &BucketTotals)) {
        for (i, s) in self.starts.iter().enumerate() {
            let s = s.load(Ordering::Acquire);
            if s == EMPTY || s == RESETTING || deprecated(now_ms, s, self.interval_ms) {
                continue;
            }
            let mut t = BucketTotals::default();
            self.cells[i].read_into(&mut t);
            f(s, &t);
        }
    }

    pub(crate) fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }
}

/// Java's rule: a bucket is deprecated when `now - start > interval` (strictly). A start in the future (the clock
/// went backwards) is not deprecated.
#[inline]
pub(crate) fn deprecated(now_ms: u64, start: u64, interval_ms: u64) -> bool {
    now_ms > start && now_ms - start > interval_ms
}

/// The per-second window: buckets split into stripes; folds expired buckets into a [`PlainWindow`].
pub(crate) struct StripedWindow {
    bucket_ms: u64,
    interval_ms: u64,
    stripes: usize,
    starts: Box<[CachePadded<AtomicU64>]>,
    /// `sample_count * stripes` cells, bucket-major.
    cells: Box<[CachePadded<Cell>]>,
}

/// Where a write went: the bucket index, so that several events can be added without finding it again.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    cell: usize,
}

impl StripedWindow {
    pub(crate) fn new(sample_count: usize, interval_ms: u64) -> Self {
        let n = sample_count.max(1);
        let stripes = stripe_count();
        StripedWindow {
            bucket_ms: (interval_ms / n as u64).max(1),
            interval_ms,
            stripes,
            starts: (0..n).map(|_| CachePadded::new(AtomicU64::new(EMPTY))).collect(),
            cells: (0..n * stripes).map(|_| CachePadded::new(Cell::new())).collect(),
        }
    }

    pub(crate) fn sample_count(&self) -> usize {
        self.starts.len()
    }
    pub(crate) fn interval_ms(&self) -> u64 {
        self.interval_ms
    }
    pub(crate) fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// Finds (claiming and folding a stale bucket if needed) the bucket for `now_ms`, and returns this thread's
    /// cell in it. `on_reset(start)` gives the totals a fresh bucket starts with (borrowed passes).
    #[inline]
    pub(crate) fn slot(&self, now_ms: u64, fold: &PlainWindow, borrowed: &impl Fn(u64) -> u64) -> Slot {
        let n = self.starts.len();
        let idx = ((now_ms / self.bucket_ms) % n as u64) as usize;
        let start = now_ms - now_ms % self.bucket_ms;
        let stripe = current_stripe() & (self.stripes - 1);
        let cell = idx * self.stripes + stripe;
        let s = self.starts[idx].load(Ordering::Acquire);
        if s == start || (s > start && s < RESETTING) {
            // Current, or the clock went backwards: count in the newer bucket (totals stay consistent).
            return Slot { cell };
        }
        self.slot_slow(idx, start, fold, borrowed);
        Slot { cell }
    }

    #[cold]
    fn slot_slow(&self, idx: usize, start: u64, fold: &PlainWindow, borrowed: &impl Fn(u64) -> u64) {
        loop {
            let s = self.starts[idx].load(Ordering::Acquire);
            if s == start || (s > start && s < RESETTING) {
                return;
            }
            if s == RESETTING {
                std::hint::spin_loop();
                continue;
            }
            if self.starts[idx].compare_exchange(s, RESETTING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                let base = idx * self.stripes;
                if s != EMPTY {
                    let mut t = BucketTotals::default();
                    for c in &self.cells[base..base + self.stripes] {
                        c.read_into(&mut t);
                    }
                    fold.add(s, &t);
                }
                for c in &self.cells[base..base + self.stripes] {
                    c.reset();
                }
                let b = borrowed(start);
                if b > 0 {
                    self.cells[base].counts[MetricEvent::Pass as usize].fetch_add(b, Ordering::Relaxed);
                }
                self.starts[idx].store(start, Ordering::Release);
                return;
            }
        }
    }

    #[inline]
    pub(crate) fn add(&self, slot: Slot, e: MetricEvent, v: u64) {
        self.cells[slot.cell].counts[e as usize].fetch_add(v, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add_min_rt(&self, slot: Slot, rt_micros: u64) {
        let m = &self.cells[slot.cell].min_rt;
        if rt_micros < m.load(Ordering::Relaxed) {
            m.fetch_min(rt_micros, Ordering::Relaxed);
        }
    }

    /// Visits every bucket inside the window at `now_ms` with its start and totals.
    pub(crate) fn for_each_valid(&self, now_ms: u64, mut f: impl FnMut(u64, &BucketTotals)) {
        for i in 0..self.starts.len() {
            let s = self.starts[i].load(Ordering::Acquire);
            if s == EMPTY || s == RESETTING || deprecated(now_ms, s, self.interval_ms) {
                continue;
            }
            f(s, &self.read_bucket(i));
        }
    }

    /// Visits every bucket not yet folded (whatever its age), with its start and totals.
    pub(crate) fn for_each_unfolded(&self, mut f: impl FnMut(u64, &BucketTotals)) {
        for i in 0..self.starts.len() {
            let s = self.starts[i].load(Ordering::Acquire);
            if s == EMPTY || s == RESETTING {
                continue;
            }
            f(s, &self.read_bucket(i));
        }
    }

    /// The totals of the bucket starting at `start`, if the window holds it.
    pub(crate) fn bucket_at(&self, start: u64) -> Option<BucketTotals> {
        let idx = ((start / self.bucket_ms) % self.starts.len() as u64) as usize;
        if self.starts[idx].load(Ordering::Acquire) == start {
            Some(self.read_bucket(idx))
        } else {
            None
        }
    }

    fn read_bucket(&self, i: usize) -> BucketTotals {
        let mut t = BucketTotals::default();
        let base = i * self.stripes;
        for c in &self.cells[base..base + self.stripes] {
            c.read_into(&mut t);
        }
        t
    }
}
