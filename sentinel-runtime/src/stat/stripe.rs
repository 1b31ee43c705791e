//! Per-thread striping so that counters written on every call do not bounce one cache line between cores.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// How many stripes each striped counter has: the core count rounded up to a power of two, at most 16.
pub(crate) fn stripe_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        cores.next_power_of_two().clamp(1, 16)
    })
}

/// The stripe of the current thread (assigned round robin on first use).
#[inline]
pub(crate) fn current_stripe() -> usize {
    STRIPE.with(|s| {
        let v = s.get();
        if v != usize::MAX {
            v
        } else {
            let n = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed);
            s.set(n);
            n
        }
    })
}
