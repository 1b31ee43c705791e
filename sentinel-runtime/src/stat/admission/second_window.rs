//! The window that a second reject rule with another limit on the same node reserves in
//! ([`AdmissionWindow::within`](super::AdmissionWindow::within)): the per-second window's two buckets in one
//! 128-bit word, changed only by compare-and-swap.
//!
//! A reservation reads both buckets and adds to its own in one step: it computes the window at its time from
//! the word it loaded (rolled forward to its bucket when that bucket is newer) and stores the window with its
//! reservation added only if the word is still the one it loaded. Every change of the word is such a swap,
//! so each reservation decided on the window exactly as it was when it took effect, and the word never holds
//! more than the limit from reservations (a rolled bucket may start with what prioritized calls borrowed in
//! it, which they pass in all the same). Releases only take away. No lock: a reservation that loses the swap
//! to another computes again from the word that won.

use std::sync::atomic::Ordering;

use portable_atomic::AtomicU128;

use crate::stat::window::BUCKET_MS;

/// The word: the current bucket's index plus one (0: no bucket yet) in the high 40 bits (a nanosecond `u64`
/// clock reaches bucket 3.7e10 < 2^40), then its count and the previous bucket's, 44 bits each.
const COUNT_BITS: u32 = 44;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

/// The window as one reservation sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Window {
    /// The current bucket's index.
    bucket: u64,
    /// Reserved (and borrowed) in the current bucket.
    cur: u64,
    /// In the previous one.
    prev: u64,
}

impl Window {
    fn pack(self) -> u128 {
        ((self.bucket as u128 + 1) << (2 * COUNT_BITS))
            | ((self.cur.min(COUNT_MAX) as u128) << COUNT_BITS)
            | self.prev.min(COUNT_MAX) as u128
    }

    fn unpack(w: u128) -> Option<Window> {
        let tagged = (w >> (2 * COUNT_BITS)) as u64;
        let count = |shift: u32| (w >> shift) as u64 & COUNT_MAX;
        (tagged != 0).then(|| Window { bucket: tagged - 1, cur: count(COUNT_BITS), prev: count(0) })
    }

    /// The window at `now_ms`, given the stored one: rolled forward when `now_ms` is in a later bucket (a
    /// bucket new to the window starts with what prioritized calls borrowed in it: they pass in it all the
    /// same); the stored one when it is in the same bucket or an earlier one (a clock that went back: counted
    /// in the newest bucket).
    fn at(stored: Option<Window>, now_ms: u64, borrowed: &dyn Fn(u64) -> u64) -> Window {
        let bucket = now_ms / BUCKET_MS;
        let borrowed_in = |b: u64| borrowed(b * BUCKET_MS);
        match stored {
            Some(w) if bucket <= w.bucket => w,
            Some(w) if bucket == w.bucket + 1 => Window { bucket, cur: borrowed_in(bucket), prev: w.cur },
            _ => Window { bucket, cur: borrowed_in(bucket), prev: bucket.checked_sub(1).map_or(0, borrowed_in) },
        }
    }

    fn total(&self) -> u64 {
        self.cur.saturating_add(self.prev)
    }
}

/// A second limit's window on one node (see the module documentation).
pub(crate) struct SecondWindow {
    word: AtomicU128,
}

/// A reservation in a [`SecondWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SecondReservation {
    pub(crate) bucket_start: u64,
    pub(crate) count: u32,
}

impl SecondWindow {
    pub(crate) fn new() -> Self {
        SecondWindow { word: AtomicU128::new(0) }
    }

    /// Reserves `acquire` passes if the window stays within `limit`; `None` means block.
    pub(crate) fn try_reserve(
        &self,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
    ) -> Option<SecondReservation> {
        let mut stored = self.word.load(Ordering::Acquire);
        loop {
            let w = Window::at(Window::unpack(stored), now_ms, borrowed);
            #[cfg(test)]
            crate::rcu::test_hooks::run(&test_hooks::AFTER_OTHERS);
            let after = w.cur.saturating_add(acquire as u64);
            if w.prev.saturating_add(after) as f64 > limit || after > COUNT_MAX {
                self.keep_rolled(stored, w);
                return None;
            }
            let next = Window { cur: after, ..w }.pack();
            match self.word.compare_exchange(stored, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(SecondReservation { bucket_start: w.bucket * BUCKET_MS, count: acquire }),
                Err(now) => stored = now,
            }
        }
    }

    /// Whether the window (already holding this call's reservation) is within `limit`.
    pub(crate) fn within(&self, now_ms: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> bool {
        let stored = self.word.load(Ordering::Acquire);
        let w = Window::at(Window::unpack(stored), now_ms, borrowed);
        self.keep_rolled(stored, w);
        w.total() as f64 <= limit
    }

    /// Stores a window rolled forward that no reservation changed (once, if the word is still `stored`), so
    /// that the calls after it take the borrowed passes it started with from the word rather than reading the
    /// node's borrowed counts again.
    fn keep_rolled(&self, stored: u128, w: Window) {
        if Window::unpack(stored).is_none_or(|s| s.bucket != w.bucket) {
            let _ = self.word.compare_exchange(stored, w.pack(), Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Gives back `count` reserved in bucket `bucket` (if it is still in the window).
    pub(crate) fn release(&self, bucket: u64, count: u32) {
        let mut stored = self.word.load(Ordering::Acquire);
        loop {
            let Some(mut w) = Window::unpack(stored) else { return };
            if w.bucket == bucket {
                w.cur = w.cur.saturating_sub(count as u64);
            } else if w.bucket.checked_sub(1) == Some(bucket) {
                w.prev = w.prev.saturating_sub(count as u64);
            } else {
                return;
            }
            match self.word.compare_exchange(stored, w.pack(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => stored = now,
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only points of the window (the machinery is rcu's, `rcu::test_hooks`).
    use crate::rcu::test_hooks::Hook;

    thread_local! {
        /// Runs once on this thread in `SecondWindow::try_reserve`, between its read of the window and its
        /// compare-and-swap (a test forces the interleaving).
        pub(crate) static AFTER_OTHERS: Hook = const { std::cell::RefCell::new(None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE_BORROWED: &dyn Fn(u64) -> u64 = &|_| 0;

    #[test]
    fn the_word_holds_a_window_whole() {
        let w = Window { bucket: 36_000_000_000, cur: COUNT_MAX, prev: 7 };
        assert_eq!(Window::unpack(w.pack()), Some(w));
        assert_eq!(Window::unpack(0), None);
        let zero = Window { bucket: 0, cur: 0, prev: 0 };
        assert_eq!(Window::unpack(zero.pack()), Some(zero), "bucket 0 is a bucket");
    }

    #[test]
    fn a_window_rolls_forward_and_counts_a_clock_that_went_back_in_its_newest_bucket() {
        let borrowed = |start: u64| start / BUCKET_MS % 10;
        let w = Window { bucket: 100, cur: 5, prev: 3 };
        assert_eq!(Window::at(Some(w), 100 * BUCKET_MS + 1, &borrowed), w);
        assert_eq!(Window::at(Some(w), 99 * BUCKET_MS, &borrowed), w, "the clock went back");
        assert_eq!(Window::at(Some(w), 101 * BUCKET_MS, &borrowed), Window { bucket: 101, cur: 1, prev: 5 });
        assert_eq!(Window::at(Some(w), 103 * BUCKET_MS, &borrowed), Window { bucket: 103, cur: 3, prev: 2 });
        assert_eq!(Window::at(None, 7 * BUCKET_MS, &borrowed), Window { bucket: 7, cur: 7, prev: 6 });
    }

    #[test]
    fn reservations_hold_the_limit_over_the_window_and_go_back_to_their_bucket() {
        let sw = SecondWindow::new();
        let t0 = 1_700_000_000_000;
        let r: Vec<_> = (0..4).map(|_| sw.try_reserve(t0, 1, 4.0, NONE_BORROWED)).collect();
        assert!(r.iter().all(Option::is_some));
        assert_eq!(sw.try_reserve(t0 + BUCKET_MS, 1, 4.0, NONE_BORROWED), None, "the previous bucket is in the window");
        sw.release(r[0].unwrap().bucket_start / BUCKET_MS, 1);
        assert!(sw.try_reserve(t0 + BUCKET_MS, 1, 4.0, NONE_BORROWED).is_some(), "one went back to its bucket");
        assert!(sw.try_reserve(t0 + 2 * BUCKET_MS, 4, 4.0, NONE_BORROWED).is_none(), "3 + 1 in the window");
        assert!(sw.try_reserve(t0 + 3 * BUCKET_MS, 4, 4.0, NONE_BORROWED).is_some());
        assert!(
            sw.within(t0 + 3 * BUCKET_MS, 4.0, NONE_BORROWED) && !sw.within(t0 + 3 * BUCKET_MS, 3.0, NONE_BORROWED)
        );
    }

    #[test]
    fn threads_reserving_at_once_admit_the_limit_exactly() {
        for round in 0..20u64 {
            let sw = SecondWindow::new();
            let t0 = 1_700_000_000_000 + round * 7 * BUCKET_MS;
            let kept = std::sync::atomic::AtomicU64::new(0);
            let barrier = std::sync::Barrier::new(4);
            std::thread::scope(|sc| {
                for t in 0..4u64 {
                    let (sw, kept, barrier) = (&sw, &kept, &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        for i in 0..100u64 {
                            // Half the calls in the next bucket: the window rolls while others reserve.
                            let now = t0 + BUCKET_MS - 1 + (i + t) % 2;
                            if let Some(r) = sw.try_reserve(now, 1, 100.0, NONE_BORROWED) {
                                kept.fetch_add(1, Ordering::Relaxed);
                                if i % 10 == 0 {
                                    sw.release(r.bucket_start / BUCKET_MS, 1);
                                    kept.fetch_sub(1, Ordering::Relaxed);
                                }
                            }
                        }
                    });
                }
            });
            let kept = kept.load(Ordering::Relaxed);
            assert_eq!(kept, 100, "round {round}: 400 calls for a limit of 100");
            assert!(sw.within(t0 + BUCKET_MS, 100.0, NONE_BORROWED) && !sw.within(t0 + BUCKET_MS, 99.0, NONE_BORROWED));
        }
    }

    #[test]
    fn a_bucket_that_admits_nothing_reads_its_borrowed_passes_once() {
        let sw = SecondWindow::new();
        let reads = std::cell::Cell::new(0);
        let borrowed = |_: u64| {
            reads.set(reads.get() + 1);
            5
        };
        for _ in 0..10 {
            assert_eq!(sw.try_reserve(1_700_000_000_000, 1, 9.0, &borrowed), None);
        }
        assert_eq!(reads.get(), 2, "the bucket's and the previous one's, when the window rolled");
    }
}
