//! Sliding windows of metric buckets (Java Sentinel's `LeapArray`).
//!
//! The per-second window is written on every call. Each of its buckets is split into cache-line stripes, one
//! per core (round robin over threads), so concurrent callers of one resource write different cache lines.
//! When a per-second bucket is reused for a later period, the thread that claims it folds its totals into the
//! per-minute window, which is therefore written about twice a second and needs no striping. Readers of
//! per-minute figures add the per-second buckets that have not been folded yet, so nothing is counted twice
//! or missed: a read that a fold ran across is read again ([`StripedWindow::settled`]).

use std::sync::atomic::{fence, AtomicI64, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// The events a bucket counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
#[non_exhaustive]
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
    /// Smallest response time seen, in microseconds (5 000 000, Java's `statisticMaxRt`, when none).
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

    /// Takes back `v` of event `e` added at time `at_ms` ([`add`](Self::add)), if the bucket that holds it is
    /// still there (else it left the window, and the count with it). Never below zero.
    #[cold]
    pub(crate) fn take_back(&self, at_ms: u64, e: MetricEvent, v: u64) {
        let idx = ((at_ms / self.bucket_ms) % self.starts.len() as u64) as usize;
        if self.starts[idx].load(Ordering::Acquire) == at_ms - at_ms % self.bucket_ms {
            saturating_sub(&self.cells[idx].counts[e as usize], v);
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

/// Subtracts `v` from `c`, never below zero (a count taken back: cold).
fn saturating_sub(c: &AtomicU64, v: u64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(x.saturating_sub(v)));
}

/// Java's `isWindowDeprecated`: a bucket is deprecated when `now - start > interval` (strictly). A start in the
/// future (the clock went backwards) is not deprecated. The whole seconds of metric lines are kept by this rule
/// (a second exactly a minute old is still written); rates and totals count a bucket by [`in_window`].
#[inline]
pub(crate) fn deprecated(now_ms: u64, start: u64, interval_ms: u64) -> bool {
    now_ms > start && now_ms - start > interval_ms
}

/// Whether a bucket starting at `start` counts in a window of `interval_ms` read at `now_ms`, as Java reads
/// one: it first moves the window to `now_ms` (`LeapArray.currentWindow`), which resets the bucket exactly one
/// interval old (it shares its slot with the current bucket), then sums the buckets not deprecated. So a
/// bucket counts while `now - start < interval`. A start in the future (the clock went backwards) counts.
#[inline]
pub(crate) fn in_window(now_ms: u64, start: u64, interval_ms: u64) -> bool {
    now_ms <= start || now_ms - start < interval_ms
}

/// Length of a per-second bucket.
pub(crate) const BUCKET_MS: u64 = 500;
/// Buckets in the per-second window.
pub(crate) const SAMPLES: usize = 2;
/// Length of the per-second window.
pub(crate) const INTERVAL_MS: u64 = BUCKET_MS * SAMPLES as u64;

/// Where a write at a given time goes: the bucket slot and the bucket's start. Computed once per entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pos {
    pub(crate) idx: usize,
    pub(crate) start: u64,
}

impl Pos {
    #[inline]
    pub(crate) fn of(now_ms: u64) -> Pos {
        let b = now_ms / BUCKET_MS;
        Pos { idx: (b % SAMPLES as u64) as usize, start: b * BUCKET_MS }
    }
}

#[repr(align(64))]
struct OwnedCell {
    start: AtomicU64,
    counts: [AtomicU64; EVENT_COUNT],
    min_rt: AtomicU64,
}

impl OwnedCell {
    fn new() -> Self {
        OwnedCell { start: AtomicU64::new(EMPTY), counts: Default::default(), min_rt: AtomicU64::new(MAX_RT_MICROS) }
    }
    fn read_into(&self, t: &mut BucketTotals) {
        for i in 0..EVENT_COUNT {
            t.counts[i] += self.counts[i].load(Ordering::Relaxed);
        }
        t.min_rt_micros = t.min_rt_micros.min(self.min_rt.load(Ordering::Relaxed));
    }
    fn totals(&self) -> BucketTotals {
        let mut t = BucketTotals::default();
        self.read_into(&mut t);
        t
    }
    fn reset(&self) {
        for c in &self.counts {
            c.store(0, Ordering::Relaxed);
        }
        self.min_rt.store(MAX_RT_MICROS, Ordering::Relaxed);
    }
}

/// The per-second window. Every bucket has one cell per stripe; a cell carries its own start and is reset by
/// its owner when the owner first writes in a later bucket (folding its old totals into the per-minute
/// window). The shared stripe's cells are claimed with a compare-and-swap instead.
///
/// Each stripe also keeps its part of the node's concurrency (calls in flight), beside its cells: a call
/// finds both from its stripe with one bounds check.
pub(crate) struct StripedWindow {
    stripes: Box<[StripeCells]>,
    /// The folds of buckets into the per-minute window: under way (the low 32 bits) and done (the high
    /// 32 bits). Written only by folds (twice a second per stripe at most), read by [`settled`](Self::settled).
    folds: AtomicU64,
}

/// One fold done, in [`StripedWindow::folds`].
const FOLD_DONE: u64 = 1 << 32;
/// The folds under way, in [`StripedWindow::folds`].
const FOLDS_UNDER_WAY: u64 = FOLD_DONE - 1;

/// One stripe's cell in each bucket and its part of the concurrency.
struct StripeCells {
    cells: [OwnedCell; SAMPLES],
    threads: CachePadded<AtomicI64>,
}

/// A thread's cell in the current bucket, ready for writes.
pub(crate) struct CellRef<'a> {
    cell: &'a OwnedCell,
    threads: &'a AtomicI64,
    exclusive: bool,
}

impl CellRef<'_> {
    #[inline(always)]
    pub(crate) fn add(&self, e: MetricEvent, v: u64) {
        super::stripe::add(&self.cell.counts[e as usize], v, self.exclusive);
    }
    /// Adds `delta` to the calls in flight (this stripe's part).
    #[inline(always)]
    pub(crate) fn add_threads(&self, delta: i64) {
        add_threads(self.threads, delta, self.exclusive);
    }
    #[inline(always)]
    pub(crate) fn min_rt(&self, rt_micros: u64) {
        let m = &self.cell.min_rt;
        if rt_micros < m.load(Ordering::Relaxed) {
            if self.exclusive {
                m.store(rt_micros, Ordering::Relaxed);
            } else {
                m.fetch_min(rt_micros, Ordering::Relaxed);
            }
        }
    }
}

impl StripedWindow {
    pub(crate) fn new() -> Self {
        let stripes = super::stripe::total_stripes();
        let stripe = || StripeCells { cells: [OwnedCell::new(), OwnedCell::new()], threads: Default::default() };
        StripedWindow { stripes: (0..stripes).map(|_| stripe()).collect(), folds: AtomicU64::new(0) }
    }

    /// The folds under way now.
    #[cfg(test)]
    pub(crate) fn folds_under_way(&self) -> u64 {
        self.folds.load(Ordering::SeqCst) & FOLDS_UNDER_WAY
    }

    /// Runs `read` (a read of the per-minute window, then of the buckets not folded into it) until no
    /// fold ran during it: with `attempts`, at most that many times (the last read is kept if folds never let
    /// up: a call's path never waits); without, until a read is clean.
    ///
    /// A fold moves a bucket's totals from a stripe's cell into the per-minute window. A read that took the
    /// per-minute window before a fold and the cells after it would miss the bucket (and the other way round
    /// count it twice), so a read counts only when no fold was under way when it began and none began or
    /// ended before it ended. Why that is enough: a fold announces itself (`folds` + 1, then a release fence)
    /// before it writes anything a read looks at, and says it is done (`folds` + `FOLD_DONE` - 1, release)
    /// after its last write. A read that sees any of a fold's writes, followed by its acquire fence, is
    /// ordered after the fold's announcement (fence-to-fence synchronization), so its second load of `folds`
    /// sees the fold under way or done: changed from the first load, which found none under way. A read that
    /// sees none of them read the cells and the window as they were without that fold. Failed attempts of a
    /// shared stripe's fold (another thread claimed the cell) announce and withdraw themselves without
    /// writing: they can only make a read run again.
    ///
    /// Why a read without a bound ends: a fold under way ends as soon as its thread runs again (it is
    /// straight-line code over the node's own atomics: no lock, no allocation, no user code, nothing that
    /// panics; the per-minute window's add may wait for another fold of its bucket, which is the same kind of
    /// code), so a descheduled folder only delays the read. New folds come once per stripe's cell per bucket
    /// the clock enters (2 per second per stripe on a clock that moves in real time), in a burst as threads
    /// open a new bucket: a read runs again only while such a burst lasts.
    pub(crate) fn settled<R>(&self, attempts: Option<u32>, mut read: impl FnMut() -> R) -> R {
        let mut tried: u32 = 0;
        loop {
            tried = tried.saturating_add(1);
            let last = attempts.is_some_and(|a| tried >= a);
            let before = self.folds.load(Ordering::Acquire);
            if before & FOLDS_UNDER_WAY == 0 || last {
                let r = read();
                fence(Ordering::Acquire);
                if self.folds.load(Ordering::Relaxed) == before || last {
                    return r;
                }
            }
            #[cfg(test)]
            test_hooks::run(&test_hooks::READ_AGAIN);
            // A fold is a few dozen instructions: spin first, then let a descheduled folder run, then stop
            // burning a core while it waits for one (a reader off the call's path: the dashboard, the logs).
            if tried < 4 {
                std::hint::spin_loop();
            } else if tried < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// This thread's cell for the bucket at `pos`, rolled over (and the old totals folded) if stale.
    #[inline]
    pub(crate) fn cell(&self, pos: Pos, lease: super::stripe::Lease, fold: &PlainWindow) -> CellRef<'_> {
        let stripe = &self.stripes[lease.index];
        let cell = &stripe.cells[pos.idx];
        let s = cell.start.load(Ordering::Acquire);
        // Current, or the clock went backwards: count in the newer bucket (totals stay consistent).
        if s != pos.start && !(s > pos.start && s < RESETTING) {
            roll(cell, pos.start, lease.exclusive, fold, &self.folds);
        }
        CellRef { cell, threads: &stripe.threads, exclusive: lease.exclusive }
    }

    /// Takes back `v` of event `e` that this thread (`lease`) added in the bucket at `pos`, if its cell still
    /// holds that bucket (else the count rolled out with it). Never below zero.
    #[cold]
    pub(crate) fn take_back(&self, pos: Pos, lease: super::stripe::Lease, e: MetricEvent, v: u64) {
        let cell = &self.stripes[lease.index].cells[pos.idx];
        if cell.start.load(Ordering::Acquire) == pos.start {
            saturating_sub(&cell.counts[e as usize], v);
        }
    }

    /// Adds `delta` to the calls in flight, on `lease`'s stripe.
    #[inline(always)]
    pub(crate) fn add_threads(&self, lease: super::stripe::Lease, delta: i64) {
        add_threads(&self.stripes[lease.index].threads, delta, lease.exclusive);
    }

    /// The calls in flight, over every stripe.
    pub(crate) fn threads(&self) -> i64 {
        self.stripes.iter().map(|s| s.threads.load(Ordering::Relaxed)).sum()
    }

    /// The cells of bucket slot `slot`, one per stripe.
    fn slot_cells(&self, slot: usize) -> impl Iterator<Item = &OwnedCell> {
        self.stripes.iter().map(move |s| &s.cells[slot])
    }

    /// For each slot, the newest start any of its cells holds that is inside the window at `now_ms`.
    fn valid_start(&self, slot: usize, now_ms: u64) -> Option<u64> {
        self.slot_cells(slot)
            .map(|c| c.start.load(Ordering::Acquire))
            .filter(|&s| s < RESETTING && in_window(now_ms, s, INTERVAL_MS))
            .max()
    }

    fn slot_totals(&self, slot: usize, start: u64) -> BucketTotals {
        let mut t = BucketTotals::default();
        for c in self.slot_cells(slot) {
            if c.start.load(Ordering::Acquire) == start {
                c.read_into(&mut t);
            }
        }
        t
    }

    /// Visits every bucket inside the window at `now_ms` with its start and totals (Java's `values(now)`).
    pub(crate) fn for_each_valid(&self, now_ms: u64, mut f: impl FnMut(u64, &BucketTotals)) {
        for slot in 0..SAMPLES {
            if let Some(start) = self.valid_start(slot, now_ms) {
                f(start, &self.slot_totals(slot, start));
            }
        }
    }

    /// One event's count over the buckets inside the window at `now_ms` (what [`for_each_valid`] gives, summed
    /// for that event alone), with `extra(start)` added for each such bucket: the same cells read, one counter
    /// of each rather than every event's.
    ///
    /// [`for_each_valid`]: Self::for_each_valid
    pub(crate) fn event_sum(&self, now_ms: u64, event: MetricEvent, mut extra: impl FnMut(u64) -> u64) -> u64 {
        let mut n = 0;
        for slot in 0..SAMPLES {
            // One pass over the slot's cells: the newest start inside the window, and the count of its cells.
            let mut newest: Option<(u64, u64)> = None;
            for c in self.slot_cells(slot) {
                let s = c.start.load(Ordering::Acquire);
                if s >= RESETTING || !in_window(now_ms, s, INTERVAL_MS) {
                    continue;
                }
                let count = c.counts[event as usize].load(Ordering::Relaxed);
                newest = match newest {
                    Some((start, sum)) if s == start => Some((start, sum + count)),
                    Some((start, _)) if s < start => newest,
                    _ => Some((s, count)),
                };
            }
            if let Some((start, sum)) = newest {
                n += sum + extra(start);
            }
        }
        n
    }

    /// Visits every cell not yet folded (whatever its age), with its start and totals.
    pub(crate) fn for_each_unfolded(&self, mut f: impl FnMut(u64, &BucketTotals)) {
        for c in self.stripes.iter().flat_map(|s| s.cells.iter()) {
            let s = c.start.load(Ordering::Acquire);
            if s < RESETTING {
                f(s, &c.totals());
            }
        }
    }

    /// The totals of the bucket starting at `start`, if the window holds it.
    pub(crate) fn bucket_at(&self, start: u64) -> Option<BucketTotals> {
        let slot = ((start / BUCKET_MS) % SAMPLES as u64) as usize;
        let t = self.slot_totals(slot, start);
        Some(t)
    }
}

/// Adds `delta` to a stripe's calls in flight: a plain store on an owned stripe, else an atomic add.
#[inline(always)]
fn add_threads(t: &AtomicI64, delta: i64, exclusive: bool) {
    if exclusive {
        t.store(t.load(Ordering::Relaxed).wrapping_add(delta), Ordering::Relaxed);
    } else {
        t.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Announces a fold to readers ([`StripedWindow::settled`]): before any of its writes.
#[inline(always)]
fn fold_begins(folds: &AtomicU64) {
    folds.fetch_add(1, Ordering::Relaxed);
    fence(Ordering::Release);
}

/// A fold is over: after its last write (`done`: it wrote; else it gave up without writing).
#[inline(always)]
fn fold_ends(folds: &AtomicU64, done: bool) {
    if done {
        folds.fetch_add(FOLD_DONE - 1, Ordering::Release);
    } else {
        folds.fetch_sub(1, Ordering::Release);
    }
}

#[cold]
#[inline(never)]
fn roll(cell: &OwnedCell, start: u64, exclusive: bool, fold: &PlainWindow, folds: &AtomicU64) {
    if exclusive {
        // Only this thread writes this cell: mark it, fold, reset, publish. A cell never used holds nothing to
        // fold, and readers skip it as they skip the reset one.
        let folding = cell.start.load(Ordering::Relaxed) < RESETTING;
        if folding {
            fold_begins(folds);
        }
        let old = cell.start.swap(RESETTING, Ordering::AcqRel);
        #[cfg(test)]
        test_hooks::run(&test_hooks::ROLL_MARKED);
        if old < RESETTING {
            fold.add(old, &cell.totals());
        }
        cell.reset();
        cell.start.store(start, Ordering::Release);
        if folding {
            fold_ends(folds, true);
        }
        return;
    }
    loop {
        let s = cell.start.load(Ordering::Acquire);
        if s == start || (s > start && s < RESETTING) {
            return;
        }
        if s == RESETTING {
            std::hint::spin_loop();
            continue;
        }
        let folding = s != EMPTY;
        if folding {
            fold_begins(folds);
        }
        if cell.start.compare_exchange(s, RESETTING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            #[cfg(test)]
            test_hooks::run(&test_hooks::ROLL_MARKED);
            if folding {
                fold.add(s, &cell.totals());
            }
            cell.reset();
            cell.start.store(start, Ordering::Release);
            if folding {
                fold_ends(folds, true);
            }
            return;
        }
        if folding {
            fold_ends(folds, false);
        }
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only points where a test makes a thread stop, to force an interleaving (a preemption there); set
    //! and run as the read sections' (`crate::rcu::test_hooks`).
    use std::cell::RefCell;

    use crate::rcu::test_hooks::Hook;
    pub(crate) use crate::rcu::test_hooks::{run, set};

    thread_local! {
        /// Runs once on this thread when a roll-over has marked its cell and not folded it yet.
        pub(crate) static ROLL_MARKED: Hook = const { RefCell::new(None) };
        /// Runs once on this thread when a read of whole seconds has read the per-minute window and not the
        /// cells yet.
        pub(crate) static BETWEEN_MINUTE_AND_CELLS: Hook = const { RefCell::new(None) };
        /// Runs once on this thread when a read of whole seconds is about to be made again (a fold was or
        /// is under way).
        pub(crate) static READ_AGAIN: Hook = const { RefCell::new(None) };
    }
}
