//! What integrations (the Prometheus exporter) may observe of calls beyond the sliding windows: per resource,
//! a response-time histogram and the blocked calls by rule kind. Nothing is recorded until an integration
//! asks for it ([`Shared::observe`]); until then an exit pays one load and a branch that is not taken, and so
//! does a blocked call.
//!
//! This is the narrow internal module the exporter is built on; the core knows nothing of the exporter.
#![cfg_attr(not(feature = "prometheus"), allow(dead_code))]

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::engine::Shared;
use crate::error::BlockError;
use crate::resource::ResourceInner;

/// The rule kinds a block is counted under, in [`BLOCK_KIND_NAMES`] order.
pub(crate) const BLOCK_KINDS: usize = 6;

/// Label values of the block kinds.
pub(crate) const BLOCK_KIND_NAMES: [&str; BLOCK_KINDS] =
    ["flow", "degrade", "system", "param_flow", "authority", "custom"];

fn kind_index(err: &BlockError) -> usize {
    match err {
        BlockError::Flow { .. } => 0,
        BlockError::Degrade { .. } => 1,
        BlockError::System { .. } => 2,
        BlockError::ParamFlow { .. } => 3,
        BlockError::Authority { .. } => 4,
        _ => 5,
    }
}

/// One resource's observations since they were asked for. Memory: 8 bytes per histogram bucket plus 64.
pub(crate) struct Observed {
    /// Upper bounds of the histogram buckets, in microseconds, increasing.
    bounds_micros: Arc<[u64]>,
    /// Calls per bucket (not cumulative); the last one is past every bound (`+Inf`).
    counts: Box<[AtomicU64]>,
    sum_micros: AtomicU64,
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
        let counts = (0..=bounds_micros.len()).map(|_| AtomicU64::new(0)).collect();
        Observed { bounds_micros, counts, sum_micros: AtomicU64::new(0), blocks: Default::default() }
    }

    /// Counts one completed call of `rt_micros` (whatever its acquire count: one call, one observation).
    #[inline]
    pub(crate) fn record_rt(&self, rt_micros: u64) {
        // The first bucket whose bound is >= the value (Prometheus buckets are `le`).
        let i = self.bounds_micros.partition_point(|b| *b < rt_micros);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(rt_micros, Ordering::Relaxed);
    }

    /// Counts a blocked call under the kind of rule that blocked it.
    #[inline]
    pub(crate) fn record_block(&self, err: &BlockError, acquire: u32) {
        self.blocks[kind_index(err)].fetch_add(u64::from(acquire), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ObservedSnapshot {
        // The sum is read first: a call recorded between the reads is then in the counts but maybe not the
        // sum, never the other way round (a scrape sees at worst a slightly low average).
        let sum_micros = self.sum_micros.load(Ordering::Relaxed);
        let mut total = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|c| {
                total += c.load(Ordering::Relaxed);
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
    /// Starts observing a resource (at its creation, once observation is on).
    pub(crate) fn start(&self, inner: &ResourceInner) {
        if let Some(b) = self.bounds_micros.get() {
            inner.observed.get_or_init(|| Observed::new(b.clone()));
        }
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

impl Shared {
    /// Starts recording response-time histograms (with `bounds_micros`, increasing) and blocks by kind for
    /// every resource, present and future. Returns the bounds in force: the first call's.
    pub(crate) fn observe(&self, bounds_micros: Arc<[u64]>) -> Arc<[u64]> {
        let bounds = self.observers.bounds_micros.get_or_init(|| bounds_micros).clone();
        self.for_each_resource_locked(|inner| self.observers.start(inner));
        bounds
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
}
