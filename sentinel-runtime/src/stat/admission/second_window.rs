//! The window that a second reject rule with another limit on the same node reserves in
//! ([`AdmissionWindow::within`](super::AdmissionWindow::within)): two buckets under one lock. A reservation
//! reads the other bucket and adds to its own, which a concurrent reservation must not interleave with; only
//! such a second rule comes here (rare), so a lock serves where the primary window needs none.

use std::sync::{Mutex, MutexGuard};

use crate::stat::window::{deprecated, BUCKET_MS, INTERVAL_MS, SAMPLES};

/// The bits of a bucket's number that tag a reservation's second bucket (see `Reservation`).
pub(super) const TAG_MASK: u64 = (1 << 18) - 1;

/// A bucket slot that holds no bucket yet.
const EMPTY: u64 = u64::MAX;

/// Bucket starts and reserved counts (the same geometry as the per-second window): a count is valid for the
/// start beside it.
pub(crate) struct SecondWindow {
    buckets: Mutex<Buckets>,
}

struct Buckets {
    starts: [u64; SAMPLES],
    counts: [u64; SAMPLES],
}

/// A reservation in a [`SecondWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SecondReservation {
    pub(crate) bucket_start: u64,
    pub(crate) count: u32,
}

impl Buckets {
    /// The slot of the bucket at `now_ms`, reset to it if it held an older one (with what prioritized calls
    /// borrowed in it: they count in it already).
    fn current(&mut self, now_ms: u64, borrowed: &dyn Fn(u64) -> u64) -> usize {
        let b = now_ms / BUCKET_MS;
        let idx = (b % SAMPLES as u64) as usize;
        let start = b * BUCKET_MS;
        let s = self.starts[idx];
        // Current, or newer (the clock went backwards): counted in the newer bucket.
        if s == EMPTY || s < start {
            self.starts[idx] = start;
            self.counts[idx] = borrowed(start);
        }
        idx
    }

    /// What the window's other buckets hold: their reservations, or, for the previous bucket when no call
    /// reserved in it, what prioritized calls borrowed in it (they pass in it all the same).
    fn others(&self, now_ms: u64, cur: usize, borrowed: &dyn Fn(u64) -> u64) -> u64 {
        let prev = (now_ms / BUCKET_MS).checked_sub(1);
        let mut total = 0;
        for i in 0..SAMPLES {
            if i == cur {
                continue;
            }
            let s = self.starts[i];
            if s != EMPTY && !deprecated(now_ms, s, INTERVAL_MS) {
                total += self.counts[i];
            } else if let Some(b) = prev.filter(|b| (b % SAMPLES as u64) as usize == i) {
                total += borrowed(b * BUCKET_MS);
            }
        }
        total
    }

    /// Gives a reservation back (if its bucket is still there).
    fn release(&mut self, r: SecondReservation) {
        let idx = ((r.bucket_start / BUCKET_MS) % SAMPLES as u64) as usize;
        if self.starts[idx] == r.bucket_start {
            self.counts[idx] = self.counts[idx].saturating_sub(r.count as u64);
        }
    }
}

impl SecondWindow {
    pub(crate) fn new() -> Self {
        SecondWindow { buckets: Mutex::new(Buckets { starts: [EMPTY; SAMPLES], counts: [0; SAMPLES] }) }
    }

    fn lock(&self) -> MutexGuard<'_, Buckets> {
        #[cfg(test)]
        test_hooks::WAITERS.arrive(self as *const Self as usize);
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(test)]
        test_hooks::WAITERS.leave(self as *const Self as usize);
        buckets
    }

    /// Reserves `acquire` passes if the window stays within `limit`; `None` means block.
    pub(crate) fn try_reserve(
        &self,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
    ) -> Option<SecondReservation> {
        let mut b = self.lock();
        let cur = b.current(now_ms, borrowed);
        let others = b.others(now_ms, cur, borrowed);
        #[cfg(test)]
        crate::rcu::test_hooks::run(&test_hooks::AFTER_OTHERS);
        if (others + b.counts[cur] + acquire as u64) as f64 > limit {
            return None;
        }
        b.counts[cur] += acquire as u64;
        Some(SecondReservation { bucket_start: b.starts[cur], count: acquire })
    }

    /// Whether the window (already holding this call's reservation) is within `limit`.
    pub(crate) fn within(&self, now_ms: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> bool {
        let mut b = self.lock();
        let cur = b.current(now_ms, borrowed);
        (b.others(now_ms, cur, borrowed) + b.counts[cur]) as f64 <= limit
    }

    /// Gives back `count` reserved in the bucket whose index has these low bits (if it is still there).
    pub(crate) fn release_tagged(&self, bucket_low: u64, count: u32) {
        let idx = (bucket_low % SAMPLES as u64) as usize;
        let mut b = self.lock();
        let s = b.starts[idx];
        if s != EMPTY && (s / BUCKET_MS) & TAG_MASK == bucket_low {
            b.release(SecondReservation { bucket_start: s, count });
        }
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only points of the window (the machinery is rcu's, `rcu::test_hooks`).
    use crate::rcu::test_hooks::{Hook, Waiters};

    thread_local! {
        /// Runs once on this thread in `SecondWindow::try_reserve`, between its read of the other bucket and
        /// its read of its own count (a test forces the interleaving).
        pub(crate) static AFTER_OTHERS: Hook = const { std::cell::RefCell::new(None) };
    }

    /// The windows whose reservations wait for their lock.
    pub(crate) static WAITERS: Waiters = Waiters::new();
}
