//! The exact concurrency gate of a node: the permits that thread-grade rules take and give back.

use std::sync::atomic::{AtomicU64, Ordering};

/// Exact concurrency gate on a node, used by thread-grade rules.
#[derive(Debug, Default)]
pub(crate) struct ThreadGate {
    permits: AtomicU64,
}

impl ThreadGate {
    /// Takes a permit when the calls in flight plus `acquire` stay within `limit`. A call in flight holds one
    /// permit whatever its acquire count, as Java counts it once (`increaseThreadNum`) and blocks when
    /// `curThreadNum + acquireCount > count`.
    pub(crate) fn try_acquire(&self, acquire: u64, limit: f64) -> bool {
        self.permits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v.saturating_add(acquire) as f64 <= limit).then_some(v + 1)
            })
            .is_ok()
    }
    /// Gives back a call's permit.
    pub(crate) fn release(&self) {
        let _ = self.permits.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(1)));
    }
    /// The permits taken now (the calls in flight that took one).
    pub(crate) fn permits(&self) -> u64 {
        self.permits.load(Ordering::Acquire)
    }
}
