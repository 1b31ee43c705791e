//! The holds of an engine's owned entries in flight: one counter per statistics stripe, the orphan flag, and
//! the count of holds left once the state is orphaned. The protocol and why it is sound:
//! [`keep`](super::keep).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::rcu;
use crate::stat::stripe;

/// Added to [`Holds::left`] from the start, and taken off by the orphan when it adds the counters' sum: until
/// then, releases after the orphan cannot bring it to zero.
const BIAS: usize = 1 << (usize::BITS - 2);

/// The holds of the owned entries in flight, and whether the state is orphaned.
pub(crate) struct Holds {
    /// Before the orphan: one counter per stripe (wrapping: a stripe's counter alone may go below zero).
    counts: Box<[CachePadded<AtomicUsize>]>,
    /// Whether an owned entry ever took a hold (else the orphan frees the state at once).
    ever: AtomicBool,
    /// Set when the last handle is gone: releases that see it count down `left` instead of their stripe.
    orphaned: AtomicBool,
    /// After the orphan: the holds left, plus [`BIAS`] until the orphan settles.
    left: AtomicUsize,
}

impl Holds {
    pub(crate) fn new() -> Holds {
        Holds {
            counts: (0..stripe::total_stripes()).map(|_| CachePadded::new(AtomicUsize::new(0))).collect(),
            ever: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            left: AtomicUsize::new(BIAS),
        }
    }

    /// Takes a hold for an owned entry; the caller has a handle of the engine.
    #[inline]
    pub(crate) fn hold(&self) {
        self.add(stripe::lease(), 1);
        if !self.ever.load(Ordering::Relaxed) {
            self.ever.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the last handle is gone (tests).
    #[cfg(test)]
    pub(crate) fn is_orphaned(&self) -> bool {
        self.orphaned.load(Ordering::Relaxed)
    }

    /// Whether an owned entry ever took a hold.
    pub(crate) fn ever_held(&self) -> bool {
        self.ever.load(Ordering::Relaxed)
    }

    /// Adds `delta` to the counter of the stripe `lease` (the calling thread's): a plain store of the new value
    /// on a stripe the thread owns (no other thread writes it: no locked instruction), an atomic add on the
    /// shared stripe.
    #[inline(always)]
    fn add(&self, lease: stripe::Lease, delta: usize) {
        let c = &self.counts[lease.index];
        if lease.exclusive {
            c.store(c.load(Ordering::Relaxed).wrapping_add(delta), Ordering::Relaxed);
        } else {
            c.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// Releases a hold (on the calling thread's stripe, whichever took it), inside `section`, the caller's read
    /// section: whether this was the last hold of an orphaned state (the caller then frees it).
    #[inline(always)]
    pub(super) fn release(&self, section: &rcu::ReadGuard) -> bool {
        let orphaned = self.orphaned.load(Ordering::Relaxed);
        #[cfg(test)]
        hook::after_orphan_read();
        if !orphaned {
            // The orphan's grace period waits for this section: the orphan sums the counters after it.
            self.add(section.lease(), usize::MAX);
            return false;
        }
        self.left.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Marks the state orphaned (its last handle is gone): `false` when no owned entry ever held it (the caller
    /// frees it at once). Else the caller waits for a grace period, then calls [`settle`](Holds::settle).
    pub(super) fn orphan(&self) -> bool {
        if !self.ever_held() {
            return false;
        }
        // Before the grace period's flips, as a writer's unpublished pointer is (`keep`'s docs, 2).
        self.orphaned.store(true, Ordering::SeqCst);
        true
    }

    /// After the grace period that followed [`orphan`](Holds::orphan): adds the counters' sum to `left` and
    /// takes the bias off; whether no hold is left (the caller then frees the state).
    pub(super) fn settle(&self) -> bool {
        let sum = self.counts.iter().fold(0usize, |s, c| s.wrapping_add(c.load(Ordering::Relaxed)));
        let delta = sum.wrapping_sub(BIAS);
        self.left.fetch_add(delta, Ordering::AcqRel).wrapping_add(delta) == 0
    }
}

#[cfg(test)]
pub(super) mod hook {
    use crate::rcu::test_hooks::{run, Hook};
    use std::cell::RefCell;

    thread_local! {
        /// Runs once on this thread between a release's read of `orphaned` and what it does on it.
        pub(crate) static AFTER_ORPHAN_READ: Hook = const { RefCell::new(None) };
    }

    pub(crate) fn after_orphan_read() {
        run(&AFTER_ORPHAN_READ);
    }
}
