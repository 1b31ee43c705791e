//! The holds of an engine's owned entries in flight: one counter per statistics stripe, and the orphan flag.
//! The protocol and why it is sound: [`keep`](super::keep).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::stat::stripe;

/// The holds of the owned entries in flight, and whether the state is orphaned.
pub(crate) struct Holds {
    /// One counter per stripe (wrapping: a stripe's counter alone may go below zero).
    counts: Box<[CachePadded<AtomicUsize>]>,
    /// Whether an owned entry ever took a hold (else the orphan frees the state at once).
    ever: AtomicBool,
    /// Set when the last handle is gone.
    orphaned: AtomicBool,
    /// Set by the one claimer that frees the state.
    claimed: AtomicBool,
}

impl Holds {
    pub(crate) fn new() -> Holds {
        Holds {
            counts: (0..stripe::total_stripes()).map(|_| CachePadded::new(AtomicUsize::new(0))).collect(),
            ever: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
        }
    }

    /// Takes a hold for an owned entry; the caller has a handle of the engine.
    ///
    /// An atomic add even on a stripe the thread owns (uncontended: the line stays in the thread's cache):
    /// every change of a counter is then a read-modify-write, so a claimer that reads a counter reads the end
    /// of a release sequence that every earlier release on it heads (`keep`'s module docs, 5).
    #[inline]
    pub(crate) fn hold(&self) {
        self.counts[stripe::lease().index].fetch_add(1, Ordering::Relaxed);
        if !self.ever.load(Ordering::Relaxed) {
            self.ever.store(true, Ordering::Relaxed);
        }
    }

    /// Whether an owned entry ever took a hold.
    pub(crate) fn ever_held(&self) -> bool {
        self.ever.load(Ordering::Relaxed)
    }

    /// Releases a hold (on the calling thread's stripe, whichever took it): whether the state was orphaned and
    /// this caller claims it. The caller is in a read section that began before this call.
    pub(super) fn release(&self) -> bool {
        self.counts[stripe::lease().index].fetch_sub(1, Ordering::SeqCst);
        #[cfg(test)]
        hook::after_release();
        self.orphaned.load(Ordering::SeqCst) && self.claim()
    }

    /// Orphans the state (its last handle is gone): `None` when no owned entry ever held it (the caller frees
    /// it at once), else whether this caller claims it. The caller is in a read section.
    pub(super) fn orphan(&self) -> Option<bool> {
        if !self.ever_held() {
            return None;
        }
        self.orphaned.store(true, Ordering::SeqCst);
        Some(self.claim())
    }

    /// Whether the holds sum to zero and this caller is the one that claims the state.
    fn claim(&self) -> bool {
        let sum = self.counts.iter().fold(0usize, |s, c| s.wrapping_add(c.load(Ordering::SeqCst)));
        sum == 0 && !self.claimed.swap(true, Ordering::AcqRel)
    }
}

#[cfg(test)]
pub(super) mod hook {
    use crate::rcu::test_hooks::{run, Hook};
    use std::cell::RefCell;

    thread_local! {
        /// Runs once on this thread between a release's subtraction and its read of `orphaned`.
        pub(crate) static AFTER_RELEASE: Hook = const { RefCell::new(None) };
    }

    pub(crate) fn after_release() {
        run(&AFTER_RELEASE);
    }
}
