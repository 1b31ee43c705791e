//! The current window of samples: lock-free accumulation on every completed call.
//!
//! Recording a sample is two `fetch_add`s (RTT sum and count) and two loads (the lowest RTT and the highest
//! in-flight count are written only when a sample beats them). The limiter's control lock swaps the
//! accumulators out when the window closes. The four accumulators are swapped one by one, so a sample that
//! lands during the swap may count its RTT in one window and itself in the next: the average is off by at
//! most that one sample's share, which the algorithms' smoothing absorbs.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use super::algorithm::WindowSample;

#[derive(Debug)]
pub(crate) struct SampleWindow {
    rtt_sum: AtomicU64,
    count: AtomicU32,
    min_rtt: AtomicU64,
    max_inflight: AtomicU32,
    dropped: AtomicBool,
}

impl SampleWindow {
    pub(crate) fn new() -> Self {
        SampleWindow {
            rtt_sum: AtomicU64::new(0),
            count: AtomicU32::new(0),
            min_rtt: AtomicU64::new(u64::MAX),
            max_inflight: AtomicU32::new(0),
            dropped: AtomicBool::new(false),
        }
    }

    /// Adds one completed call.
    #[inline]
    pub(crate) fn record(&self, rtt_nanos: u64, inflight: u32, dropped: bool) {
        self.rtt_sum.fetch_add(rtt_nanos, Relaxed);
        self.count.fetch_add(1, Relaxed);
        if rtt_nanos < self.min_rtt.load(Relaxed) {
            self.min_rtt.fetch_min(rtt_nanos, Relaxed);
        }
        if inflight > self.max_inflight.load(Relaxed) {
            self.max_inflight.fetch_max(inflight, Relaxed);
        }
        if dropped {
            self.dropped.store(true, Relaxed);
        }
    }

    /// Whether a sample of the window was a drop.
    pub(crate) fn has_drop(&self) -> bool {
        self.dropped.load(Relaxed)
    }

    /// Samples so far.
    pub(crate) fn count(&self) -> u32 {
        self.count.load(Relaxed)
    }

    /// Takes the window's samples and starts an empty one; `None` when it held none.
    pub(crate) fn take(&self) -> Option<WindowSample> {
        let count = self.count.swap(0, Relaxed);
        let sum = self.rtt_sum.swap(0, Relaxed);
        let min = self.min_rtt.swap(u64::MAX, Relaxed);
        let max_inflight = self.max_inflight.swap(0, Relaxed);
        let dropped = self.dropped.swap(false, Relaxed);
        if count == 0 {
            return None;
        }
        let avg = (sum / u64::from(count)).max(1);
        Some(WindowSample { rtt_nanos: avg, min_rtt_nanos: min.clamp(1, avg), max_inflight, samples: count, dropped })
    }
}
