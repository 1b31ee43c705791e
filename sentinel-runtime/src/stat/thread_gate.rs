//! The exact concurrency gate of a node: the permits that thread-grade rules take and give back.

use std::sync::atomic::{AtomicU64, Ordering};

/// Exact concurrency gate on a node, used by thread-grade rules.
#[derive(Debug, Default)]
pub(crate) struct ThreadGate {
    permits: AtomicU64,
}

impl ThreadGate {
    pub(crate) fn try_acquire(&self, n: u32, limit: f64) -> bool {
        self.permits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                ((v + n as u64) as f64 <= limit).then_some(v + n as u64)
            })
            .is_ok()
    }
    pub(crate) fn release(&self, n: u32) {
        let _ = self.permits.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n as u64)));
    }
    /// The permits taken now.
    pub(crate) fn permits(&self) -> u64 {
        self.permits.load(Ordering::Acquire)
    }
}
