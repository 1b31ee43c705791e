//! The plain compare-and-swap window that a second reject rule with another limit on the same node reserves in
//! ([`AdmissionWindow::within`](super::AdmissionWindow::within)).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::stat::window::{deprecated, BUCKET_MS, INTERVAL_MS, SAMPLES};

/// The bits of a bucket's number that tag a reservation's second bucket (see `Reservation`).
pub(super) const TAG_MASK: u64 = (1 << 18) - 1;

const EMPTY: u64 = u64::MAX;
const RESETTING: u64 = u64::MAX - 1;

/// Bucket starts and reserved counts (the same geometry as the per-second window); a count is valid for the
/// start beside it, and a bucket is reset by whoever claims its start.
pub(crate) struct CasWindow {
    starts: [AtomicU64; SAMPLES],
    counts: [AtomicU64; SAMPLES],
    /// Serializes reservations: a reservation reads the other bucket and then adds to its own, and two calls
    /// in adjacent buckets (or one that read the window before its bucket was reset) must not both pass on
    /// counts that miss each other's add. Only a second reject rule with another limit on a node comes here.
    lock: std::sync::Mutex<()>,
}

/// A reservation in a [`CasWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CasReservation {
    pub(crate) bucket_start: u64,
    pub(crate) count: u32,
}

impl CasWindow {
    pub(crate) fn new() -> Self {
        CasWindow {
            starts: std::array::from_fn(|_| AtomicU64::new(EMPTY)),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            lock: std::sync::Mutex::new(()),
        }
    }

    #[inline]
    fn current(&self, now_ms: u64, borrowed: &dyn Fn(u64) -> u64) -> usize {
        let b = now_ms / BUCKET_MS;
        let idx = (b % SAMPLES as u64) as usize;
        let start = b * BUCKET_MS;
        loop {
            let s = self.starts[idx].load(Ordering::Acquire);
            if s == start || (s < RESETTING && s > start) {
                return idx;
            }
            if s == RESETTING {
                std::hint::spin_loop();
                continue;
            }
            // Claim the stale bucket: whoever wins the CAS on its start zeroes its count, then publishes it.
            if self.starts[idx].compare_exchange(s, RESETTING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                // Prioritized calls that borrowed this bucket already count in it.
                self.counts[idx].store(borrowed(start), Ordering::Release);
                self.starts[idx].store(start, Ordering::Release);
                return idx;
            }
        }
    }

    /// What the window's other buckets hold: their reservations, or, for the previous bucket when no call
    /// reserved in it, what prioritized calls borrowed in it (they pass in it all the same).
    fn others(&self, now_ms: u64, cur: usize, borrowed: &dyn Fn(u64) -> u64) -> u64 {
        let prev = (now_ms / BUCKET_MS).checked_sub(1);
        let mut total = 0;
        for i in 0..self.starts.len() {
            if i == cur {
                continue;
            }
            let s = self.starts[i].load(Ordering::Acquire);
            if s < RESETTING && !deprecated(now_ms, s, INTERVAL_MS) {
                total += self.counts[i].load(Ordering::Acquire);
            } else if let Some(b) = prev.filter(|b| (b % SAMPLES as u64) as usize == i) {
                total += borrowed(b * BUCKET_MS);
            }
        }
        total
    }

    /// Reserves `acquire` passes if the window stays within `limit`; `None` means block.
    #[inline]
    pub(crate) fn try_reserve(
        &self,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
    ) -> Option<CasReservation> {
        #[cfg(test)]
        test_hooks::WAITERS.arrive(self as *const Self as usize);
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(test)]
        test_hooks::WAITERS.leave(self as *const Self as usize);
        let cur = self.current(now_ms, borrowed);
        let others = self.others(now_ms, cur, borrowed);
        #[cfg(test)]
        crate::rcu::test_hooks::run(&test_hooks::AFTER_OTHERS);
        let c = &self.counts[cur];
        let mut v = c.load(Ordering::Acquire);
        loop {
            if (others + v + acquire as u64) as f64 > limit {
                return None;
            }
            match c.compare_exchange_weak(v, v + acquire as u64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Some(CasReservation {
                        bucket_start: self.starts[cur].load(Ordering::Relaxed),
                        count: acquire,
                    })
                }
                Err(now) => v = now,
            }
        }
    }

    /// Whether the window (already holding this call's reservation) is within `limit`.
    pub(crate) fn within(&self, now_ms: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> bool {
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current(now_ms, borrowed);
        (self.others(now_ms, cur, borrowed) + self.counts[cur].load(Ordering::Acquire)) as f64 <= limit
    }

    /// Gives back `count` reserved in the bucket whose index has these low bits (if it is still there).
    pub(crate) fn release_tagged(&self, bucket_low: u64, count: u32) {
        let idx = (bucket_low % SAMPLES as u64) as usize;
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.starts[idx].load(Ordering::Acquire);
        if s < RESETTING && (s / BUCKET_MS) & TAG_MASK == bucket_low {
            self.release_locked(CasReservation { bucket_start: s, count });
        }
    }

    /// Gives a reservation back (if its bucket is still there), under the lock.
    fn release_locked(&self, r: CasReservation) {
        let idx = ((r.bucket_start / BUCKET_MS) % SAMPLES as u64) as usize;
        if self.starts[idx].load(Ordering::Acquire) == r.bucket_start {
            let _ = self.counts[idx]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(r.count as u64)));
        }
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only points of the window (the machinery is rcu's, `rcu::test_hooks`).
    use crate::rcu::test_hooks::{Hook, Waiters};

    thread_local! {
        /// Runs once on this thread in `CasWindow::try_reserve`, between its read of the other bucket and its
        /// read of its own count (a test forces the interleaving).
        pub(crate) static AFTER_OTHERS: Hook = const { std::cell::RefCell::new(None) };
    }

    /// The windows whose reservations wait for their lock.
    pub(crate) static WAITERS: Waiters = Waiters::new();
}
