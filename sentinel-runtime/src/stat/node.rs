//! Statistic nodes: the numbers of a resource, per context, per origin, per entrance and inbound.

use std::sync::atomic::{AtomicI64, Ordering};

use crossbeam_utils::CachePadded;

use super::stripe::{current_stripe, stripe_count};
use super::window::{deprecated, BucketTotals, MetricEvent, PlainWindow, StripedWindow, MAX_RT_MICROS};

/// The per-second window: 2 buckets of 500 ms (Java's defaults).
pub const SECOND_SAMPLE_COUNT: usize = 2;
/// Length of the per-second window.
pub const SECOND_INTERVAL_MS: u64 = 1000;
/// The per-minute window: 60 buckets of 1 s.
pub const MINUTE_SAMPLE_COUNT: usize = 60;
/// Length of the per-minute window.
pub const MINUTE_INTERVAL_MS: u64 = 60_000;

/// The counters of one node over two sliding windows, plus its current concurrency.
pub struct StatNode {
    second: StripedWindow,
    minute: PlainWindow,
    /// Prioritized requests that borrowed a later bucket: keyed by that bucket's start.
    borrowed: PlainWindow,
    threads: Box<[CachePadded<AtomicI64>]>,
    /// Exact pass counter for reject-style QPS rules (see `flow`): a single word, touched only when such a
    /// rule reads this node.
    pub(crate) admission: super::admission::AdmissionWindow,
    /// Exact concurrency count for thread-grade rules.
    pub(crate) thread_gate: crate::flow::ThreadGate,
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
        Self::with_windows(SECOND_SAMPLE_COUNT, SECOND_INTERVAL_MS)
    }

    /// A node whose per-second window has `sample_count` buckets over `interval_ms`.
    pub fn with_windows(sample_count: usize, interval_ms: u64) -> Self {
        StatNode {
            second: StripedWindow::new(sample_count, interval_ms),
            minute: PlainWindow::new(MINUTE_SAMPLE_COUNT, MINUTE_INTERVAL_MS),
            borrowed: PlainWindow::new(sample_count, interval_ms),
            threads: (0..stripe_count()).map(|_| CachePadded::new(AtomicI64::new(0))).collect(),
            admission: super::admission::AdmissionWindow::new(sample_count, interval_ms),
            thread_gate: Default::default(),
        }
    }

    #[inline]
    fn slot(&self, now_ms: u64) -> super::window::Slot {
        let borrowed = |start: u64| -> u64 {
            let mut b = 0;
            self.borrowed.for_each_valid(start, |s, t| {
                if s == start {
                    b += t.get(MetricEvent::Pass);
                }
            });
            b
        };
        self.second.slot(now_ms, &self.minute, &borrowed)
    }

    /// Records `count` passed requests and one more concurrent call.
    #[inline]
    pub fn on_pass(&self, now_ms: u64, count: u32) {
        let slot = self.slot(now_ms);
        self.second.add(slot, MetricEvent::Pass, count as u64);
        self.increase_threads();
    }

    /// Records a call admitted by borrowing a later window: it was counted as a pass there.
    #[inline]
    pub fn on_pass_borrowed(&self) {
        self.increase_threads();
    }

    /// Records `count` blocked requests.
    #[inline]
    pub fn on_block(&self, now_ms: u64, count: u32) {
        let slot = self.slot(now_ms);
        self.second.add(slot, MetricEvent::Block, count as u64);
    }

    /// Records the completion of a passed call: response time, success, and the error if one was traced.
    #[inline]
    pub fn on_complete(&self, now_ms: u64, rt_micros: u64, count: u32, error: bool) {
        let slot = self.slot(now_ms);
        self.second.add(slot, MetricEvent::Success, count as u64);
        self.second.add(slot, MetricEvent::RtMicros, rt_micros);
        self.second.add_min_rt(slot, rt_micros);
        if error {
            self.second.add(slot, MetricEvent::Exception, count as u64);
        }
        self.decrease_threads();
    }

    /// Records an exception outside of a completion (rarely needed).
    pub fn add_exception(&self, now_ms: u64, count: u32) {
        let slot = self.slot(now_ms);
        self.second.add(slot, MetricEvent::Exception, count as u64);
    }

    /// Records a prioritized request that will pass in the bucket starting at `future_ms`.
    pub(crate) fn add_waiting(&self, now_ms: u64, future_ms: u64, count: u32) {
        let slot = self.slot(now_ms);
        self.second.add(slot, MetricEvent::OccupiedPass, count as u64);
        let t = BucketTotals {
            counts: {
                let mut c = [0; super::window::EVENT_COUNT];
                c[MetricEvent::Pass as usize] = count as u64;
                c
            },
            min_rt_micros: MAX_RT_MICROS,
        };
        self.borrowed.add(future_ms, &t);
    }

    #[inline]
    pub(crate) fn increase_threads(&self) {
        self.threads[current_stripe() & (self.threads.len() - 1)].fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn decrease_threads(&self) {
        self.threads[current_stripe() & (self.threads.len() - 1)].fetch_sub(1, Ordering::Relaxed);
    }

    /// Calls in flight now.
    pub fn cur_threads(&self) -> u64 {
        self.threads.iter().map(|t| t.load(Ordering::Relaxed)).sum::<i64>().max(0) as u64
    }

    /// Totals over the per-second window at `now_ms`.
    pub fn window_totals(&self, now_ms: u64) -> BucketTotals {
        let mut t = BucketTotals::default();
        self.second.for_each_valid(now_ms, |_, b| t.merge(b));
        t
    }

    fn interval_secs(&self) -> f64 {
        self.second.interval_ms() as f64 / 1000.0
    }

    /// Passed requests per second over the window.
    pub fn pass_qps(&self, now_ms: u64) -> f64 {
        self.window_totals(now_ms).get(MetricEvent::Pass) as f64 / self.interval_secs()
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
        max as f64 * self.second.sample_count() as f64 / self.interval_secs()
    }

    /// The totals of the whole second starting at `second_start_ms`, from the per-minute window plus the
    /// per-second buckets not folded into it yet.
    pub fn second_totals(&self, now_ms: u64, second_start_ms: u64) -> BucketTotals {
        let mut t = BucketTotals::default();
        self.minute.for_each_valid(now_ms, |s, b| {
            if s == second_start_ms {
                t.merge(b)
            }
        });
        let minute_bucket = self.minute.bucket_ms();
        self.second.for_each_unfolded(|s, b| {
            if s - s % minute_bucket == second_start_ms {
                t.merge(b)
            }
        });
        t
    }

    /// Passed requests in the previous whole second.
    pub fn previous_pass_qps(&self, now_ms: u64) -> f64 {
        let prev = (now_ms - now_ms % 1000).saturating_sub(1000);
        self.second_totals(now_ms, prev).get(MetricEvent::Pass) as f64
    }
    /// Blocked requests in the previous whole second.
    pub fn previous_block_qps(&self, now_ms: u64) -> f64 {
        let prev = (now_ms - now_ms % 1000).saturating_sub(1000);
        self.second_totals(now_ms, prev).get(MetricEvent::Block) as f64
    }

    /// Per-second totals over the last minute, oldest first, seconds with no events left out.
    pub fn seconds(&self, now_ms: u64) -> Vec<(u64, BucketTotals)> {
        let mut out: Vec<(u64, BucketTotals)> = Vec::new();
        let mut add = |s: u64, b: &BucketTotals| match out.iter_mut().find(|(k, _)| *k == s) {
            Some((_, t)) => t.merge(b),
            None => out.push((s, *b)),
        };
        self.minute.for_each_valid(now_ms, |s, b| add(s, b));
        let minute_bucket = self.minute.bucket_ms();
        self.second.for_each_unfolded(|s, b| {
            let sec = s - s % minute_bucket;
            if !deprecated(now_ms, sec, MINUTE_INTERVAL_MS) {
                add(sec, b)
            }
        });
        out.retain(|(_, t)| t.counts.iter().any(|c| *c != 0));
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// Totals over the last minute.
    pub fn minute_totals(&self, now_ms: u64) -> BucketTotals {
        let mut t = BucketTotals::default();
        for (_, b) in self.seconds(now_ms) {
            t.merge(&b);
        }
        t
    }

    /// Passes counted in the bucket of the per-second window that holds `at_ms`, if the window holds it.
    pub(crate) fn window_pass_at(&self, at_ms: u64) -> u64 {
        let bucket = self.second.bucket_ms();
        self.second.bucket_at(at_ms - at_ms % bucket).map(|t| t.get(MetricEvent::Pass)).unwrap_or(0)
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
        (self.second.sample_count(), self.second.interval_ms())
    }
}
