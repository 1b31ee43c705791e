//! Statistic nodes: the numbers of a resource, per context, per origin, per entrance and inbound.

use super::stripe::{self, Lease};
use super::window::{deprecated, in_window, BucketTotals, MetricEvent, PlainWindow, Pos, StripedWindow};

/// The per-second window: 2 buckets of 500 ms (Java's defaults).
pub const SECOND_SAMPLE_COUNT: usize = super::window::SAMPLES;
/// Length of the per-second window.
pub const SECOND_INTERVAL_MS: u64 = super::window::INTERVAL_MS;
/// The per-minute window: 60 buckets of 1 s.
pub const MINUTE_SAMPLE_COUNT: usize = 60;
/// Length of the per-minute window.
pub const MINUTE_INTERVAL_MS: u64 = 60_000;

/// Where this thread writes at one instant: computed once per entry or exit, used for every node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Writer {
    pos: Pos,
    lease: Lease,
}

impl Writer {
    #[inline]
    pub(crate) fn at(now_ms: u64) -> Writer {
        Writer { pos: Pos::of(now_ms), lease: stripe::lease() }
    }
}

/// The counters of one node over two sliding windows, plus its current concurrency.
pub struct StatNode {
    second: StripedWindow,
    minute: PlainWindow,
    /// Prioritized requests that borrowed a later bucket: keyed by that bucket's start.
    borrowed: PlainWindow,
    /// Exact pass counter for reject-style QPS rules (see `flow`): a single word, touched only when such a
    /// rule reads this node.
    /// Allocated on first use: most nodes are never read by a reject rule.
    admission: std::sync::OnceLock<Box<super::admission::AdmissionWindow>>,
    /// Exact concurrency count for thread-grade rules.
    pub(crate) thread_gate: super::ThreadGate,
}

impl Default for StatNode {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StatNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatNode").field("threads", &self.cur_threads()).finish_non_exhaustive()
    }
}

impl StatNode {
    /// A node with Java's default windows (2 × 500 ms, 60 × 1 s).
    pub fn new() -> Self {
        StatNode {
            second: StripedWindow::new(),
            minute: PlainWindow::new(MINUTE_SAMPLE_COUNT, MINUTE_INTERVAL_MS),
            borrowed: PlainWindow::new(SECOND_SAMPLE_COUNT, SECOND_INTERVAL_MS),
            admission: std::sync::OnceLock::new(),
            thread_gate: Default::default(),
        }
    }

    /// The exact admission window of reject-style QPS rules reading this node.
    #[inline]
    pub(crate) fn admission(&self) -> &super::admission::AdmissionWindow {
        self.admission.get_or_init(|| Box::new(super::admission::AdmissionWindow::new()))
    }

    /// Passes borrowed by prioritized calls for the bucket starting at `start`.
    pub(crate) fn borrowed_at(&self, start: u64) -> u64 {
        let mut b = 0;
        self.borrowed.for_each_valid(start, |s, t| {
            if s == start {
                b += t.get(MetricEvent::Pass);
            }
        });
        b
    }

    #[inline(always)]
    fn cell(&self, w: &Writer) -> super::window::CellRef<'_> {
        self.second.cell(w.pos, w.lease, &self.minute)
    }

    #[inline(always)]
    pub(crate) fn pass_with(&self, w: &Writer, count: u32) {
        let c = self.cell(w);
        c.add(MetricEvent::Pass, count as u64);
        c.add_threads(1);
    }

    #[inline(always)]
    pub(crate) fn block_with(&self, w: &Writer, count: u32) {
        self.cell(w).add(MetricEvent::Block, count as u64);
    }

    #[inline(always)]
    pub(crate) fn complete_with(&self, w: &Writer, rt_micros: u64, count: u32, error: bool) {
        let c = self.cell(w);
        c.add(MetricEvent::Success, count as u64);
        c.add(MetricEvent::RtMicros, rt_micros);
        c.min_rt(rt_micros);
        if error {
            c.add(MetricEvent::Exception, count as u64);
        }
        c.add_threads(-1);
    }

    #[inline(always)]
    pub(crate) fn borrowed_pass_with(&self, w: &Writer) {
        self.second.add_threads(w.lease, 1);
    }

    /// Records `count` passed requests and one more concurrent call.
    pub fn on_pass(&self, now_ms: u64, count: u32) {
        self.pass_with(&Writer::at(now_ms), count)
    }

    /// Records `count` blocked requests.
    pub fn on_block(&self, now_ms: u64, count: u32) {
        self.block_with(&Writer::at(now_ms), count)
    }

    /// Records the completion of a passed call: response time, success, and the error if one was traced.
    pub fn on_complete(&self, now_ms: u64, rt_micros: u64, count: u32, error: bool) {
        self.complete_with(&Writer::at(now_ms), rt_micros, count, error)
    }

    /// Records a prioritized request that will pass in the bucket starting at `future_ms`.
    pub(crate) fn add_waiting(&self, now_ms: u64, future_ms: u64, count: u32) {
        self.cell(&Writer::at(now_ms)).add(MetricEvent::OccupiedPass, count as u64);
        let mut t = BucketTotals::default();
        t.counts[MetricEvent::Pass as usize] = count as u64;
        self.borrowed.add(future_ms, &t);
        // Per-second and per-minute figures count it as a pass in the second it passes in.
        self.minute.add(future_ms, &t);
    }

    /// Takes back a borrow [`add_waiting`](Self::add_waiting) recorded at `now_ms` (this thread) for the
    /// bucket starting at `future_ms`: the prioritized call was refused by a later check after all.
    pub(crate) fn take_back_waiting(&self, now_ms: u64, future_ms: u64, count: u32) {
        let w = Writer::at(now_ms);
        self.second.take_back(w.pos, w.lease, MetricEvent::OccupiedPass, count as u64);
        self.borrowed.take_back(future_ms, MetricEvent::Pass, count as u64);
        self.minute.take_back(future_ms, MetricEvent::Pass, count as u64);
    }

    /// Calls in flight now.
    pub fn cur_threads(&self) -> u64 {
        self.second.threads().max(0) as u64
    }

    /// Totals over the per-second window at `now_ms`.
    pub fn window_totals(&self, now_ms: u64) -> BucketTotals {
        let mut t = BucketTotals::default();
        self.second.for_each_valid(now_ms, |start, b| {
            t.merge(b);
            t.counts[MetricEvent::Pass as usize] += self.borrowed_at(start);
        });
        t
    }

    fn interval_secs(&self) -> f64 {
        SECOND_INTERVAL_MS as f64 / 1000.0
    }

    /// Passed requests per second over the window.
    pub fn pass_qps(&self, now_ms: u64) -> f64 {
        // The passes alone (a system rule's QPS limit reads this on every inbound call).
        let passed = self.second.event_sum(now_ms, MetricEvent::Pass, |start| self.borrowed_at(start));
        passed as f64 / self.interval_secs()
    }
    /// Blocked requests per second.
    pub fn block_qps(&self, now_ms: u64) -> f64 {
        self.window_totals(now_ms).get(MetricEvent::Block) as f64 / self.interval_secs()
    }
    /// Completed requests per second.
    pub fn success_qps(&self, now_ms: u64) -> f64 {
        self.window_totals(now_ms).get(MetricEvent::Success) as f64 / self.interval_secs()
    }
    /// Completed requests with a traced error, per second.
    pub fn exception_qps(&self, now_ms: u64) -> f64 {
        self.window_totals(now_ms).get(MetricEvent::Exception) as f64 / self.interval_secs()
    }
    /// Occupied (borrowed) passes per second.
    pub fn occupied_pass_qps(&self, now_ms: u64) -> f64 {
        self.window_totals(now_ms).get(MetricEvent::OccupiedPass) as f64 / self.interval_secs()
    }
    /// Pass plus block per second.
    pub fn total_qps(&self, now_ms: u64) -> f64 {
        let t = self.window_totals(now_ms);
        (t.get(MetricEvent::Pass) + t.get(MetricEvent::Block)) as f64 / self.interval_secs()
    }
    /// Average response time in milliseconds (0 when nothing completed).
    pub fn avg_rt_ms(&self, now_ms: u64) -> f64 {
        let t = self.window_totals(now_ms);
        let success = t.get(MetricEvent::Success);
        if success == 0 {
            0.0
        } else {
            t.get(MetricEvent::RtMicros) as f64 / success as f64 / 1000.0
        }
    }
    /// Minimum response time in milliseconds (5000 when nothing completed, at least 1, as in Java).
    pub fn min_rt_ms(&self, now_ms: u64) -> f64 {
        let t = self.window_totals(now_ms);
        (t.min_rt_micros as f64 / 1000.0).max(1.0)
    }
    /// `max(1, max bucket success) * sample_count / interval_secs` (used by the BBR check).
    pub fn max_success_qps(&self, now_ms: u64) -> f64 {
        let mut max = 1u64;
        self.second.for_each_valid(now_ms, |_, b| max = max.max(b.get(MetricEvent::Success)));
        max as f64 * SECOND_SAMPLE_COUNT as f64 / self.interval_secs()
    }

    /// The totals of the whole second starting at `second_start_ms`, from the per-minute window plus the
    /// per-second buckets not folded into it yet. Exact for a second whose calls have all stored their
    /// counts: a read that a bucket's fold ran across is read again, and a fold under way on another thread
    /// is waited for (a few dozen instructions once that thread runs; the engine never reads this on a call).
    pub fn second_totals(&self, now_ms: u64, second_start_ms: u64) -> BucketTotals {
        self.second_totals_within(now_ms, second_start_ms, None)
    }

    /// [`second_totals`](Self::second_totals) in at most `attempts` reads (any number without).
    fn second_totals_within(&self, now_ms: u64, second_start_ms: u64, attempts: Option<u32>) -> BucketTotals {
        let minute_bucket = self.minute.bucket_ms();
        self.second.settled(attempts, || {
            let mut t = BucketTotals::default();
            self.minute.for_each_valid(now_ms, |s, b| {
                if s == second_start_ms {
                    t.merge(b)
                }
            });
            #[cfg(test)]
            super::window::test_hooks::run(&super::window::test_hooks::BETWEEN_MINUTE_AND_CELLS);
            self.second.for_each_unfolded(|s, b| {
                if s - s % minute_bucket == second_start_ms {
                    t.merge(b)
                }
            });
            t
        })
    }

    /// Passed requests in the previous whole second.
    pub fn previous_pass_qps(&self, now_ms: u64) -> f64 {
        let prev = (now_ms - now_ms % 1000).saturating_sub(1000);
        self.second_totals(now_ms, prev).get(MetricEvent::Pass) as f64
    }
    /// Passed requests in the previous whole second, read on a call's path (a warm-up rule's refill): a fold
    /// under way makes it read once more at most, never wait.
    pub(crate) fn previous_pass_qps_on_call(&self, now_ms: u64) -> f64 {
        let prev = (now_ms - now_ms % 1000).saturating_sub(1000);
        self.second_totals_within(now_ms, prev, Some(2)).get(MetricEvent::Pass) as f64
    }
    /// Blocked requests in the previous whole second.
    pub fn previous_block_qps(&self, now_ms: u64) -> f64 {
        let prev = (now_ms - now_ms % 1000).saturating_sub(1000);
        self.second_totals(now_ms, prev).get(MetricEvent::Block) as f64
    }

    /// Per-second totals over the last minute, oldest first, seconds with no events left out. Exact for the
    /// seconds whose calls have all stored their counts (see [`second_totals`](Self::second_totals)).
    pub fn seconds(&self, now_ms: u64) -> Vec<(u64, BucketTotals)> {
        let minute_bucket = self.minute.bucket_ms();
        let mut out: Vec<(u64, BucketTotals)> = self.second.settled(None, || {
            let mut out: Vec<(u64, BucketTotals)> = Vec::new();
            let mut add = |s: u64, b: &BucketTotals| match out.iter_mut().find(|(k, _)| *k == s) {
                Some((_, t)) => t.merge(b),
                None => out.push((s, *b)),
            };
            self.minute.for_each_valid(now_ms, |s, b| add(s, b));
            #[cfg(test)]
            super::window::test_hooks::run(&super::window::test_hooks::BETWEEN_MINUTE_AND_CELLS);
            self.second.for_each_unfolded(|s, b| {
                let sec = s - s % minute_bucket;
                if !deprecated(now_ms, sec, MINUTE_INTERVAL_MS) {
                    add(sec, b)
                }
            });
            out
        });
        out.retain(|(_, t)| t.counts.iter().any(|c| *c != 0));
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// Totals over the last minute: the seconds that start less than a minute before `now_ms` (Java's
    /// `rollingCounterInMinute`, whose read resets the second exactly a minute old).
    pub fn minute_totals(&self, now_ms: u64) -> BucketTotals {
        let mut t = BucketTotals::default();
        for (_, b) in self.seconds(now_ms).iter().filter(|(s, _)| in_window(now_ms, *s, MINUTE_INTERVAL_MS)) {
            t.merge(b);
        }
        t
    }

    /// Passes counted in the bucket of the per-second window that holds `at_ms`, if the window holds it.
    pub(crate) fn window_pass_at(&self, at_ms: u64) -> u64 {
        let start = at_ms - at_ms % super::window::BUCKET_MS;
        self.second.bucket_at(start).map(|t| t.get(MetricEvent::Pass)).unwrap_or(0) + self.borrowed_at(start)
    }

    /// How long until a QPS limit of `limit` over the per-second window could admit `acquire` more passes,
    /// for a call blocked now (block paths only): the end of the current bucket when the passes counted in it
    /// leave room once the older bucket slides out, else when every bucket of the window starts after now.
    /// `None` when the limit can never admit `acquire`.
    ///
    /// A bucket leaves the window at the boundary one interval after its start (see
    /// [`in_window`](super::window::in_window)), for the read-only checks on [`pass_qps`](Self::pass_qps)
    /// (relate rules, system QPS) as for the exact admission of reject rules.
    #[inline]
    pub(crate) fn qps_retry_after(&self, now_ms: u64, acquire: u32, limit: f64) -> Option<std::time::Duration> {
        // A NaN limit never admits either.
        if limit.is_nan() || limit < acquire as f64 {
            return None;
        }
        self.qps_retry_after_in_window(now_ms, acquire, limit)
    }

    /// [`qps_retry_after`](Self::qps_retry_after) for a limit that can admit `acquire`.
    #[cold]
    #[inline(never)]
    fn qps_retry_after_in_window(&self, now_ms: u64, acquire: u32, limit: f64) -> Option<std::time::Duration> {
        let bucket = super::window::BUCKET_MS;
        let to_end = bucket - now_ms % bucket;
        let current = self.window_pass_at(now_ms) as f64;
        let ms = if current + acquire as f64 <= limit {
            to_end
        } else {
            to_end + bucket * (super::window::SAMPLES as u64 - 1)
        };
        Some(std::time::Duration::from_millis(ms))
    }

    /// Requests waiting in (borrowed from) later buckets.
    pub(crate) fn waiting(&self, now_ms: u64) -> u64 {
        let mut w = 0;
        self.borrowed.for_each_valid(now_ms, |s, t| {
            if s > now_ms {
                w += t.get(MetricEvent::Pass)
            }
        });
        w
    }

    pub(crate) fn second_window(&self) -> (usize, u64) {
        (SECOND_SAMPLE_COUNT, SECOND_INTERVAL_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::window::test_hooks::{self, BETWEEN_MINUTE_AND_CELLS, READ_AGAIN, ROLL_MARKED};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn passes(node: &StatNode, at_ms: u64, n: u32) {
        node.pass_with(&Writer::at(at_ms), n);
    }

    fn pass_of(node: &StatNode, now_ms: u64, second: u64, attempts: u32) -> u64 {
        node.second_totals_within(now_ms, second, Some(attempts)).get(MetricEvent::Pass)
    }

    #[test]
    fn a_fold_between_the_minute_read_and_the_cells_read_makes_the_read_run_again() {
        // Second 1000's bucket (slot 0) is folded into the per-minute window by this thread's first write in
        // the bucket at 2000 (slot 0 again), made after the read took the per-minute window and before it
        // took the cells: the read saw the bucket in neither.
        let node = Arc::new(StatNode::new());
        passes(&node, 1_000, 5);
        let n = node.clone();
        test_hooks::set(&BETWEEN_MINUTE_AND_CELLS, move || passes(&n, 2_000, 1));
        assert_eq!(pass_of(&node, 2_000, 1_000, 1), 0, "one read alone misses the folded bucket");

        let node = Arc::new(StatNode::new());
        passes(&node, 1_000, 5);
        let n = node.clone();
        test_hooks::set(&BETWEEN_MINUTE_AND_CELLS, move || passes(&n, 2_000, 1));
        assert_eq!(node.second_totals(2_000, 1_000).get(MetricEvent::Pass), 5, "read again after the fold");

        // The same for every second at once (the metric lines' read).
        let n = node.clone();
        test_hooks::set(&BETWEEN_MINUTE_AND_CELLS, move || passes(&n, 3_000, 2));
        let seconds: Vec<(u64, u64)> =
            node.seconds(3_000).iter().map(|(s, t)| (*s, t.get(MetricEvent::Pass))).collect();
        assert_eq!(seconds, [(1_000, 5), (2_000, 1), (3_000, 2)]);
    }

    #[test]
    fn a_fold_is_announced_before_its_cell_is_marked_and_a_read_after_it_is_exact() {
        let node = Arc::new(StatNode::new());
        passes(&node, 1_000, 5);
        let n = node.clone();
        let under_way = Arc::new(AtomicU64::new(u64::MAX));
        let seen = under_way.clone();
        // Stopped where a reader would find the cell marked and its totals not yet in the per-minute window.
        test_hooks::set(&ROLL_MARKED, move || seen.store(n.second.folds_under_way(), Ordering::SeqCst));
        passes(&node, 2_000, 1);
        assert_eq!(under_way.load(Ordering::SeqCst), 1, "the fold was under way for readers");
        assert_eq!(node.second.folds_under_way(), 0, "and is over");
        assert_eq!(pass_of(&node, 2_000, 1_000, 1), 5);
        assert_eq!(pass_of(&node, 2_000, 2_000, 1), 1);
    }

    /// Sets a hook that lets `reads` reads of whole seconds on this thread be made again, then sends on `then`.
    fn after_reads_again(reads: u32, then: std::sync::mpsc::Sender<()>) {
        test_hooks::set(&READ_AGAIN, move || {
            if reads == 0 {
                then.send(()).expect("the folder waits");
            } else {
                after_reads_again(reads - 1, then.clone());
            }
        });
    }

    #[test]
    fn a_read_of_whole_seconds_waits_for_a_fold_however_long_its_thread_is_off_the_cpu() {
        // The folder stops where its cell is marked and its totals are not in the per-minute window yet (a
        // preemption there), and stays stopped until the reader has made its read again 200 times: a read
        // kept after some number of tries would miss the bucket.
        let node = Arc::new(StatNode::new());
        let (marked_tx, marked) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let n = node.clone();
        let folder = std::thread::spawn(move || {
            passes(&n, 1_000, 5);
            test_hooks::set(&ROLL_MARKED, move || {
                marked_tx.send(()).expect("the reader waits");
                released.recv().expect("the reader releases the fold");
            });
            passes(&n, 2_000, 1);
        });
        marked.recv().expect("the fold is under way");
        after_reads_again(200, release);
        assert_eq!(node.second_totals(2_999, 1_000).get(MetricEvent::Pass), 5);
        assert_eq!(
            node.seconds(2_999).iter().map(|(s, t)| (*s, t.get(MetricEvent::Pass))).collect::<Vec<_>>(),
            [(1_000, 5), (2_000, 1)]
        );
        folder.join().expect("the folder ends");
    }

    #[test]
    fn whole_seconds_read_while_every_writer_folds_are_exact() {
        // Writers count `PER_BUCKET` passes in each bucket of each second, in step (a barrier between seconds,
        // as threads on one clock are), so that moving to a second folds the buckets of the one before. The
        // reader checks each second as soon as every writer has written it: while they fold it.
        const WRITERS: usize = 3;
        const SECONDS: u64 = 300;
        const PER_BUCKET: u32 = 7;
        // Writers stay within `AHEAD` seconds of the reader (the per-minute window keeps 60).
        const AHEAD: u64 = 20;
        let node = Arc::new(StatNode::new());
        let done = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
        let read = Arc::new(AtomicU64::new(0));
        let step = Arc::new(std::sync::Barrier::new(WRITERS));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (node, done, read, step) = (node.clone(), done.clone(), read.clone(), step.clone());
                std::thread::spawn(move || {
                    for s in 1..=SECONDS {
                        while read.load(Ordering::Acquire) + AHEAD < s {
                            std::thread::yield_now();
                        }
                        step.wait();
                        passes(&node, s * 1_000, PER_BUCKET);
                        passes(&node, s * 1_000 + 500, PER_BUCKET);
                        done[w].store(s, Ordering::Release);
                    }
                })
            })
            .collect();
        for s in 1..=SECONDS {
            // Wait until every writer has written second `s` (they may be folding it now).
            while done.iter().map(|d| d.load(Ordering::Acquire)).min().unwrap_or(0) < s {
                std::thread::yield_now();
            }
            assert_eq!(
                node.second_totals(s * 1_000 + 999, s * 1_000).get(MetricEvent::Pass),
                WRITERS as u64 * 2 * u64::from(PER_BUCKET),
                "second {s}"
            );
            read.store(s, Ordering::Release);
        }
        for w in writers {
            w.join().unwrap();
        }
    }
}
