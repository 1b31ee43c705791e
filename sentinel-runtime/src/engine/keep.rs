//! What keeps an engine's state alive: its handles, and the owned entries in flight.
//!
//! Handles ([`Sentinel`](crate::Sentinel), [`Resource`](crate::Resource), the layers built on them) hold an
//! `Arc<SharedHandle>`, whose drop orphans the engine's [`Shared`] state. An owned entry
//! ([`Resource::entry_owned`](crate::Resource::entry_owned)) must keep that state alive without a handle (it
//! moves into futures and response bodies that may outlive every handle). A reference count shared by every
//! thread would be a word that every worker writes twice per request, which does not scale across cores
//! (186 ns a call in aggregate on two threads against 51 ns without it). So an owned entry takes a **hold**:
//! one counter per statistics stripe ([`stripe::lease`]), incremented on the entering thread's stripe and
//! decremented on the exiting thread's (a stripe's counter alone may go below zero; their sum is the number of
//! holds). The engine's state is freed when it is orphaned and the holds sum to zero, by whichever comes last.
//! The global engine and leaked ones are never orphaned: their owned entries take no hold.
//!
//! # Protocol
//!
//! - **Hold** (`hold`): the caller has a handle, so the state is not orphaned. Adds one to its stripe's
//!   counter (an atomic add, uncontended on a stripe the thread owns) and marks the state as ever held.
//! - **Release** (`release`), inside an RCU read section ([`rcu::ReadGuard`]): subtracts one from its
//!   stripe's counter (sequentially consistent), then reads `orphaned` (sequentially consistent); when set,
//!   claims the state if the counters sum to zero. After the section, the claimer frees the state.
//! - **Orphan** (`SharedHandle`'s drop, the last handle gone), inside a read section: sets `orphaned`
//!   (sequentially consistent), then claims the state if the counters sum to zero. After the section, the
//!   claimer frees the state. A state never held is freed at once (no entry can reach it).
//! - **Claim**: the counters read zero and `claimed` was false (swapped to true): at most one claimer.
//! - **Free**: after a grace period ([`rcu::synchronize`]), or, for a claimer inside another read section, with
//!   the values retired there (after a later grace period).
//!
//! # Why the state is freed once, and never while an entry can reach it
//!
//! 1. *No hold after the orphan.* A hold needs a handle, and the orphan runs when the last one is gone (a
//!    weak handle cannot be upgraded then). Every hold happens before the orphan: the holder's handle is given
//!    back after its hold, and the last drop of an `Arc` acquires what every earlier drop released. So from
//!    the orphan on, counters only decrease.
//! 2. *The last release is seen.* Take the last release `R` (its subtraction is the last change to any
//!    counter) and the orphan `O`. Both run "write, then read" on sequentially consistent accesses: `R`
//!    subtracts and then reads `orphaned`, `O` sets `orphaned` and then reads the counters. In the single
//!    order of those accesses, `R`'s read of `orphaned` comes after `O`'s write (so `R` sees it and scans the
//!    counters after its own subtraction, reading zero) or `O`'s reads of the counters come after `R`'s
//!    subtraction (so `O` reads every counter after its last change: zero). Either way one of them claims.
//! 3. *No claim while a hold is live.* A scan reads each counter once; counters only decrease (1), so each read
//!    is at least the counter's value when the scan ends, and a scan that sums to zero ends when every hold
//!    has been released.
//! 4. *Once.* Claiming swaps `claimed`; one swap reads false.
//! 5. *No use after free.* A release reads the state after its subtraction (`orphaned`, the counters) inside
//!    a read section that began before the subtraction. The claimer's scan read that subtraction or a later
//!    change of the counter (it summed to zero: 3), every change of a counter is a read-modify-write, and the
//!    subtraction is a release and the scan's reads acquire: so the subtraction, and the start of the section
//!    before it, happen before the claimer's grace period, which waits for the section to end. The orphan
//!    reads the state in a section too. Nothing else reaches the state after the last handle and the last
//!    hold are gone.
//!
//! `keep::tests` forces the interleavings: the orphan between a release's subtraction and its read of
//! `orphaned`, a release after the orphan, and many threads' entries exiting while the last handle drops.

use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;

use super::shared::Shared;
use crate::rcu;

/// Releases a hold taken by [`Holds::hold`](super::holds::Holds::hold) on `state`, and frees the state when it
/// was orphaned and this was the last hold.
///
/// # Safety
/// `state` points to an engine's state on which the caller took a hold it has not released.
pub(crate) unsafe fn release(state: NonNull<Shared>) {
    let claimed = {
        let _section = rcu::ReadGuard::enter();
        // SAFETY: the hold keeps the state alive until its subtraction; after it, the section does (module
        // docs, 5).
        unsafe { state.as_ref() }.holds.release()
    };
    if claimed {
        // SAFETY: claimed: the state is orphaned, holds no entry, and no other claimer frees it.
        unsafe { free(state) };
    }
}

/// Frees a claimed state after a grace period.
///
/// # Safety
/// `state` came from `Box::into_raw` in [`SharedHandle::new`] and was claimed by the caller.
unsafe fn free(state: NonNull<Shared>) {
    // SAFETY: see the function's contract.
    let state = unsafe { Box::from_raw(state.as_ptr()) };
    rcu::retire_boxed(state);
}

/// An engine's state, owned by its handles (through an `Arc`) and by the holds of its owned entries.
pub(crate) struct SharedHandle {
    state: NonNull<Shared>,
    /// Set once a handle of this engine can never be dropped ([`Sentinel::leak`](crate::Sentinel::leak), the
    /// global engine), and never cleared: the state then lives until the process ends, and so do its checked
    /// resources (each is held by `resource_list`, which only grows). An owned entry of such an engine takes
    /// no hold ([`Resource::entry_owned`](crate::Resource::entry_owned)). Kept here rather than in the state,
    /// so that an owned entry reads it beside the state's address, not after it.
    pub(crate) immortal: AtomicBool,
}

// SAFETY: a handle stands for a `&Shared` that lives as long as the handle; `Shared` is `Send` and `Sync`.
unsafe impl Send for SharedHandle {}
unsafe impl Sync for SharedHandle {}

impl SharedHandle {
    pub(crate) fn new(state: Shared) -> SharedHandle {
        SharedHandle { state: NonNull::from(Box::leak(Box::new(state))), immortal: AtomicBool::new(false) }
    }

    /// The state's address (valid while this handle lives).
    #[inline(always)]
    pub(crate) fn state(&self) -> NonNull<Shared> {
        self.state
    }
}

impl Deref for SharedHandle {
    type Target = Shared;
    #[inline(always)]
    fn deref(&self) -> &Shared {
        // SAFETY: the state is freed only once the handle is dropped (the orphan) and no hold remains.
        unsafe { self.state.as_ref() }
    }
}

impl Drop for SharedHandle {
    fn drop(&mut self) {
        let state = self.state;
        let orphaned = {
            let _section = rcu::ReadGuard::enter();
            // SAFETY: the state is not freed before it is orphaned, here; after that, the section keeps it
            // (module docs, 5).
            unsafe { state.as_ref() }.holds.orphan()
        };
        match orphaned {
            // No owned entry ever held it: nothing but this handle reaches it (module docs, 1).
            // SAFETY: from `Box::leak` in `new`; the last handle, and no hold.
            None => drop(unsafe { Box::from_raw(state.as_ptr()) }),
            // SAFETY: claimed: orphaned, no hold, no other claimer.
            Some(true) => unsafe { free(state) },
            Some(false) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Weak};

    use crate::flow::FlowRule;
    use crate::resource::inner::ResourceInner;
    use crate::{Entry, Sentinel};

    use super::super::holds::hook;

    /// An engine with a passing rule, its resource, and a weak reference to the resource (which the engine's
    /// state holds until it is freed).
    fn engine() -> (Sentinel, crate::Resource, Weak<ResourceInner>) {
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([FlowRule::new("api").count(1e9)]).unwrap();
        let r = engine.resource("api");
        let weak = Arc::downgrade(&r.inner);
        (engine, r, weak)
    }

    fn owned(r: &crate::Resource) -> Entry<'static> {
        r.entry_owned().enter().unwrap()
    }

    #[test]
    fn an_owned_entry_takes_no_reference_count_and_keeps_the_state_after_every_handle() {
        let (engine, r, weak) = engine();
        let counts = (Arc::strong_count(&r.shared), Arc::strong_count(&r.inner));
        let e = owned(&r);
        assert_eq!((Arc::strong_count(&r.shared), Arc::strong_count(&r.inner)), counts);
        drop((r, engine));
        assert!(weak.upgrade().is_some(), "the entry holds the state");
        assert_eq!(e.resource(), "api");
        drop(e);
        assert!(weak.upgrade().is_none(), "the last release freed the state");
    }

    #[test]
    fn a_state_never_held_is_freed_with_its_last_handle() {
        let (engine, r, weak) = engine();
        drop(r.enter().unwrap());
        drop((r, engine));
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn held_and_released_before_the_orphan_the_state_goes_with_the_last_handle() {
        let (engine, r, weak) = engine();
        for _ in 0..3 {
            drop(owned(&r));
        }
        drop((r, engine));
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn entries_entered_on_one_thread_and_exited_on_others_free_the_state_once() {
        let (engine, r, weak) = engine();
        let entries: Vec<_> = (0..8).map(|_| owned(&r)).collect();
        drop((r, engine));
        let mut threads = Vec::new();
        for e in entries {
            threads.push(std::thread::spawn(move || drop(e)));
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn the_orphan_between_a_release_and_its_look_at_the_orphan_flag_frees_the_state_once() {
        // The exiting entry subtracts its hold; before it reads `orphaned`, another thread drops the last
        // handle, finds no hold and claims the state: its grace period then waits for the exiting entry's read
        // section, so the exiting entry still reads the state, sees it claimed, and leaves it.
        use crate::rcu::test_hooks::{set, WRITER_WAITS};
        use std::sync::mpsc;
        use std::sync::Mutex;

        let (engine, r, weak) = engine();
        let e = owned(&r);
        let last = Arc::new(Mutex::new(Some((r, engine))));
        let orphan = Arc::new(Mutex::new(None));
        {
            let (last, orphan) = (last.clone(), orphan.clone());
            set(&hook::AFTER_RELEASE, move || {
                let (waits_tx, waits_rx) = mpsc::channel();
                let last = last.clone();
                let t = std::thread::spawn(move || {
                    set(&WRITER_WAITS, move || {
                        let _ = waits_tx.send(());
                    });
                    drop(last.lock().unwrap().take());
                });
                // The orphan claimed the state and its grace period waits for this section.
                waits_rx.recv().expect("the orphan waits for the releasing section");
                *orphan.lock().unwrap() = Some(t);
            });
        }
        drop(e);
        let t = orphan.lock().unwrap().take().expect("the hook ran");
        t.join().unwrap();
        assert!(last.lock().unwrap().is_none());
        assert!(weak.upgrade().is_none(), "freed once, by the orphan");
    }

    #[test]
    fn a_release_after_the_orphan_frees_the_state() {
        // The orphan finds a hold and leaves the state; the entry's release, on another thread, frees it.
        let (engine, r, weak) = engine();
        let e = owned(&r);
        drop((r, engine));
        assert!(weak.upgrade().is_some());
        std::thread::spawn(move || drop(e)).join().unwrap();
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn many_threads_exit_while_the_last_handle_drops() {
        for _ in 0..20 {
            let (engine, r, weak) = engine();
            let barrier = Arc::new(std::sync::Barrier::new(5));
            let mut threads = Vec::new();
            for _ in 0..4 {
                let r = r.clone();
                let barrier = barrier.clone();
                threads.push(std::thread::spawn(move || {
                    let entries: Vec<_> = (0..50).map(|_| owned(&r)).collect();
                    drop(r);
                    barrier.wait();
                    drop(entries);
                }));
            }
            drop(r);
            barrier.wait();
            drop(engine);
            for t in threads {
                t.join().unwrap();
            }
            assert!(weak.upgrade().is_none());
        }
    }

    #[test]
    fn a_leaked_engine_takes_no_hold() {
        let engine = Sentinel::builder().build().leak();
        let r = engine.resource("api");
        drop(owned(&r));
        assert!(!engine.shared.holds.ever_held());
    }
}
