//! The exact concurrency gate of a node: the permits that thread-grade rules take and give back.
//!
//! One word holds the permits taken, how many of them belong to calls not counted in the node's calls in
//! flight yet (taken by a check, the call not passed yet: *pending*), and a version that every change bumps.
//! A call's permit is pending from its check until the entry path has counted it in flight
//! ([`counted`](ThreadGate::counted), after the node's thread count went up), and it is given back before the
//! call's thread count goes down at exit. So a reader that sees the same word before and after reading the
//! node's calls in flight ([`ThreadGate::counted_permits`]) knows that every permit counted then belongs to a
//! call its reading counted: the calls in flight that hold no permit are never undercounted.

use std::sync::atomic::{AtomicU64, Ordering};

const FIELD_BITS: u32 = 24;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const ONE_PERMIT: u64 = 1;
const ONE_PENDING: u64 = 1 << FIELD_BITS;
const ONE_VERSION: u64 = 1 << (2 * FIELD_BITS);

#[inline(always)]
fn permits_of(w: u64) -> u64 {
    w & FIELD_MASK
}

#[inline(always)]
fn pending_of(w: u64) -> u64 {
    (w >> FIELD_BITS) & FIELD_MASK
}

/// `w` changed by `delta` (permit and pending fields), its version bumped.
#[inline(always)]
fn bumped(w: u64, delta: impl FnOnce(u64) -> u64) -> u64 {
    let fields = delta(w & !(u64::MAX << (2 * FIELD_BITS)));
    (w & (u64::MAX << (2 * FIELD_BITS))).wrapping_add(ONE_VERSION) | fields
}

/// Exact concurrency gate on a node, used by thread-grade rules.
#[derive(Debug, Default)]
pub(crate) struct ThreadGate {
    word: AtomicU64,
}

impl ThreadGate {
    /// Takes a permit (pending until [`counted`](Self::counted)) when the calls in flight that hold one plus
    /// `acquire` stay within `limit`. A call in flight holds one permit whatever its acquire count, as Java
    /// counts it once (`increaseThreadNum`) and blocks when `curThreadNum + acquireCount > count`.
    pub(crate) fn try_acquire(&self, acquire: u64, limit: f64) -> bool {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let permits = permits_of(w);
                (permits.saturating_add(acquire) as f64 <= limit && permits < FIELD_MASK && pending_of(w) < FIELD_MASK)
                    .then(|| bumped(w, |f| f + ONE_PERMIT + ONE_PENDING))
            })
            .is_ok()
    }

    /// The call holding a pending permit is counted in the node's calls in flight now.
    pub(crate) fn counted(&self) {
        let _ = self.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(bumped(w, |f| if pending_of(f) > 0 { f - ONE_PENDING } else { f }))
        });
    }

    /// Gives back a call's permit: `pending` when the call was never counted in flight (a later check
    /// refused it), else at its exit, before its thread count goes down.
    pub(crate) fn release(&self, pending: bool) {
        let _ = self.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(bumped(w, |f| {
                let f = if permits_of(f) > 0 { f - ONE_PERMIT } else { f };
                if pending && pending_of(f) > 0 {
                    f - ONE_PENDING
                } else {
                    f
                }
            }))
        });
    }

    /// The permits taken now (the calls in flight that took one, and those whose checks are under way).
    pub(crate) fn permits(&self) -> u64 {
        permits_of(self.word.load(Ordering::Acquire))
    }

    /// The node's calls in flight (`in_flight`, read between two reads of the gate) and the permits of those
    /// counted among them, and whether the reading is consistent (the gate did not change meanwhile; after
    /// a few tries changed every time, the last reading, with the fewer permits of its two reads of the gate).
    pub(crate) fn counted_permits(&self, in_flight: impl Fn() -> u64) -> (u64, u64, bool) {
        let counted = |w: u64| permits_of(w) - pending_of(w).min(permits_of(w));
        let mut last = (0, 0);
        for _ in 0..8 {
            let before = self.word.load(Ordering::SeqCst);
            let calls = in_flight();
            let after = self.word.load(Ordering::SeqCst);
            if after == before {
                return (calls, counted(before), true);
            }
            last = (calls, counted(after).min(counted(before)));
        }
        (last.0, last.1, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permit_is_pending_until_counted_and_given_back_either_way() {
        let g = ThreadGate::default();
        assert!(g.try_acquire(1, 2.0));
        assert!(g.try_acquire(1, 2.0));
        assert!(!g.try_acquire(1, 2.0));
        assert_eq!(g.counted_permits(|| 0), (0, 0, true));
        g.counted();
        assert_eq!(g.counted_permits(|| 1), (1, 1, true));
        g.release(true);
        assert_eq!((g.permits(), g.counted_permits(|| 1)), (1, (1, 1, true)));
        g.release(false);
        assert_eq!((g.permits(), g.counted_permits(|| 0)), (0, (0, 0, true)));
    }
}
