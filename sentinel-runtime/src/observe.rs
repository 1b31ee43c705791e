//! What integrations (the Prometheus exporter) may observe of calls beyond the sliding windows: per resource,
//! a response-time histogram and the blocked calls by rule kind. Nothing is recorded until an integration
//! asks for it (the engine's `Shared::observe`); until then an exit pays one load and a branch that is not taken, and so
//! does a blocked call.
//!
//! This is the narrow internal module the exporter is built on; the core knows nothing of the exporter.
#![cfg_attr(not(feature = "prometheus"), allow(dead_code))]

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::BlockError;
use crate::stat::stripe;

/// The rule kinds a block is counted under, in [`BLOCK_KIND_NAMES`] order.
pub(crate) const BLOCK_KINDS: usize = 7;

/// Label values of the block kinds.
pub(crate) const BLOCK_KIND_NAMES: [&str; BLOCK_KINDS] =
    ["flow", "degrade", "system", "param_flow", "authority", "adaptive", "custom"];

fn kind_index(err: &BlockError) -> usize {
    match err {
        BlockError::Flow { .. } => 0,
        BlockError::Degrade { .. } => 1,
        BlockError::System { .. } => 2,
        BlockError::ParamFlow { .. } => 3,
        BlockError::Authority { .. } => 4,
        BlockError::Adaptive { .. } => 5,
        _ => 6,
    }
}

/// Most stripes of a histogram: threads past them share the last one (with atomic adds).
const MAX_HISTOGRAM_STRIPES: usize = 8;

/// One resource's observations since they were asked for.
///
/// The histogram is striped like the statistics ([`crate::stat::stripe`]): a thread that owns a stripe adds
/// with plain stores to cache lines only it writes, so recording costs no locked instruction. Memory: up to
/// 9 stripes of `(buckets + 2)` counters rounded up to a cache line (1152 bytes with the 14 default
/// buckets), plus 48 bytes of block counts.
pub(crate) struct Observed {
    /// Upper bounds of the histogram buckets, in microseconds, increasing.
    bounds_micros: Arc<[u64]>,
    /// Per stripe, `width` counters: the calls of each bucket (not cumulative; the one after the last bound
    /// is `+Inf`), then the sum of response times in microseconds.
    cells: Box<[AtomicU64]>,
    width: usize,
    /// Stripes owned by one thread each; the stripe after them is shared.
    owned: usize,
    blocks: [AtomicU64; BLOCK_KINDS],
}

/// A copy of one resource's observations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ObservedSnapshot {
    /// Cumulative calls at or under each bound, then the total (`+Inf`).
    pub(crate) cumulative: Vec<u64>,
    pub(crate) sum_micros: u64,
    /// Blocked calls (permits) by kind, in [`BLOCK_KIND_NAMES`] order.
    pub(crate) blocks: [u64; BLOCK_KINDS],
}

impl Observed {
    fn new(bounds_micros: Arc<[u64]>) -> Self {
        // Buckets, `+Inf`, the sum; rounded up to whole cache lines so that stripes share none.
        let width = (bounds_micros.len() + 2).next_multiple_of(8);
        let owned = stripe::owned_stripes().min(MAX_HISTOGRAM_STRIPES);
        let cells = (0..width * (owned + 1)).map(|_| AtomicU64::new(0)).collect();
        Observed { bounds_micros, cells, width, owned, blocks: Default::default() }
    }

    /// Counts one completed call of `rt_micros` (whatever its acquire count: one call, one observation).
    #[inline]
    pub(crate) fn record_rt(&self, rt_micros: u64) {
        let lease = stripe::lease();
        let (index, exclusive) =
            if lease.index < self.owned { (lease.index, lease.exclusive) } else { (self.owned, false) };
        // The first bucket whose bound is >= the value (Prometheus buckets are `le`).
        let bucket = self.bounds_micros.partition_point(|b| *b < rt_micros);
        let base = index * self.width;
        if let Some(c) = self.cells.get(base + bucket) {
            stripe::add(c, 1, exclusive);
        }
        if let Some(c) = self.cells.get(base + self.bounds_micros.len() + 1) {
            stripe::add(c, rt_micros, exclusive);
        }
    }

    /// Counts a blocked call under the kind of rule that blocked it.
    #[inline]
    pub(crate) fn record_block(&self, err: &BlockError, acquire: u32) {
        self.blocks[kind_index(err)].fetch_add(u64::from(acquire), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ObservedSnapshot {
        let n = self.bounds_micros.len() + 1;
        let mut counts = vec![0u64; n];
        let mut sum_micros = 0u64;
        for stripe in self.cells.chunks(self.width) {
            for (c, cell) in counts.iter_mut().zip(stripe) {
                *c += cell.load(Ordering::Relaxed);
            }
            sum_micros += stripe.get(n).map_or(0, |c| c.load(Ordering::Relaxed));
        }
        let mut total = 0;
        let cumulative = counts
            .into_iter()
            .map(|c| {
                total += c;
                total
            })
            .collect();
        let mut blocks = [0; BLOCK_KINDS];
        for (b, a) in blocks.iter_mut().zip(&self.blocks) {
            *b = a.load(Ordering::Relaxed);
        }
        ObservedSnapshot { cumulative, sum_micros, blocks }
    }
}

/// The engine's side: which histogram bounds are observed, and the state integrations keep with the engine.
#[derive(Default)]
pub(crate) struct Observers {
    bounds_micros: std::sync::OnceLock<Arc<[u64]>>,
    extensions: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Observers {
    /// Starts observing a resource (at its creation, once observation is on): `observed` is its cell.
    pub(crate) fn start(&self, observed: &std::sync::OnceLock<Observed>) {
        if let Some(b) = self.bounds_micros.get() {
            observed.get_or_init(|| Observed::new(b.clone()));
        }
    }

    /// Turns observation on with `bounds_micros` unless it is on already; returns the bounds in force.
    pub(crate) fn set_bounds(&self, bounds_micros: Arc<[u64]>) -> Arc<[u64]> {
        self.bounds_micros.get_or_init(|| bounds_micros).clone()
    }

    /// The state of type `T` an integration keeps with this engine, made by `init` on first use.
    pub(crate) fn extension<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        let mut all = self.extensions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = all.iter().find_map(|e| e.clone().downcast::<T>().ok()) {
            return found;
        }
        let made = Arc::new(init());
        all.push(made.clone());
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fall_in_the_first_bucket_whose_bound_is_not_below_them() {
        let o = Observed::new(Arc::from(vec![1_000, 5_000, 10_000]));
        for rt in [0, 1_000, 1_001, 5_000, 9_999, 10_001, 60_000_000] {
            o.record_rt(rt);
        }
        let s = o.snapshot();
        assert_eq!(s.cumulative, vec![2, 4, 5, 7], "le 1 ms: 0 and 1000; le 5 ms: +1001, 5000; ...");
        assert_eq!(s.sum_micros, 1_000 + 1_001 + 5_000 + 9_999 + 10_001 + 60_000_000);
    }

    #[test]
    fn threads_record_on_their_own_stripes_and_the_snapshot_sums_them() {
        let o = Arc::new(Observed::new(Arc::from(vec![10, 100])));
        let threads: Vec<_> = (0..12)
            .map(|t| {
                let o = o.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u64 {
                        o.record_rt(if t % 2 == 0 { 5 } else { 50 + i % 2 });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = o.snapshot();
        assert_eq!(s.cumulative, vec![6_000, 12_000, 12_000], "12 threads, more than the stripes: nothing lost");
        assert_eq!(s.sum_micros, 6_000 * 5 + 6 * (500 * 50 + 500 * 51));
    }
}
