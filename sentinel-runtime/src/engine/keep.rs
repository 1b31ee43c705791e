//! What keeps an engine's state alive: its handles, and the owned entries in flight.
//!
//! Handles ([`Sentinel`](crate::Sentinel), [`Resource`](crate::Resource), the layers built on them) hold an
//! `Arc<SharedHandle>`, whose drop orphans the engine's [`Shared`] state. An owned entry
//! ([`Resource::entry_owned`](crate::Resource::entry_owned)) must keep that state alive without a handle (it
//! moves into futures and response bodies that may outlive every handle). A reference count shared by every
//! thread would be a word that every worker writes twice per request, which does not scale across cores (two
//! threads entering one resource: 79 to 201 ns a call in aggregate with a count on the engine and one on the
//! resource, against 62 ns on one thread). So an owned entry takes a **hold**: one counter per statistics
//! stripe ([`stripe::lease`](crate::stat::stripe::lease)), incremented on the entering thread's stripe and
//! decremented on the exiting thread's, each by a plain store on a stripe its thread owns (a stripe's counter
//! alone may go below zero; their sum is the number of holds). The state is freed when it is orphaned and no
//! hold is left, by whichever comes last. The global engine and leaked ones are never orphaned: their owned
//! entries take no hold. With holds, two threads cost 24.1 ns a call in aggregate against 49.1 ns on one
//! (`--bench entry`, `entry_exit_aggregate`).
//!
//! # Protocol
//!
//! The counters are summed once, after a grace period of the rules' RCU ([`rcu`]) has made them final; from
//! the orphan on, releases count down one shared word instead (the engine is being dropped: they do not need
//! to scale).
//!
//! - **Hold**: the caller has a handle. Adds one to its stripe's counter; marks the state as ever held.
//! - **Release**, inside a read section ([`rcu::ReadGuard`]): reads `orphaned`. Unset: subtracts one from its
//!   stripe's counter. Set: subtracts one from `left`; the release that brings it to zero frees the state,
//!   after its section.
//! - **Orphan** (`SharedHandle`'s drop, the last handle gone): a state never held is freed at once. Else it
//!   sets `orphaned`, waits for a grace period ([`rcu::retire_boxed`]: later, with the values retired there,
//!   when the last handle is dropped inside a read section), then **settles**: sums the counters and adds the
//!   sum to `left` while taking off the bias `left` started with. If that brings `left` to zero, it frees the
//!   state.
//! - **Free**: after a grace period.
//!
//! # Why the state is freed once, and never while an entry can reach it
//!
//! 1. *No hold after the orphan.* A hold needs a handle, and the orphan runs when the last one is gone (a
//!    weak handle cannot be upgraded then). Every hold happens before the orphan: the holder's handle is given
//!    back after its hold, and the last drop of an `Arc` acquires what every earlier drop released.
//! 2. *The sum is final and every release is counted once.* A release that read `orphaned` unset ran in a
//!    read section that the orphan's grace period waited for (the RCU argument: the store of `orphaned`
//!    comes before the grace period's flips, as a writer's unpublished pointer does), so its subtraction
//!    happens before the settle's sum, and so does every hold (1). A release that read it set changes no
//!    counter. So the sum is the number of holds not released on a stripe, each of which is released, or
//!    will be, on `left`.
//! 3. *`left` reaches zero once, when no hold is left.* It starts at the bias (a quarter of the word's range,
//!    far beyond any count of holds); releases take one each, the settle adds the sum and takes the bias off.
//!    Before the settle it stays above zero; after it, it equals the holds not yet released (2); so it reaches
//!    zero exactly once, at the last of the settle and the releases on it, and only that one frees.
//! 4. *No use after free.* Each release reads the state inside its section, which began before the read of
//!    `orphaned`. Releases on `left` come before the freeing change of `left` in its order of changes
//!    (read-modify-writes, acquire and release), so their sections began before the free's grace period,
//!    which waits for them to end. Releases on a stripe ended before the settle (2), which comes before the
//!    free. The settle itself touches the state only before its change of `left`. Nothing else reaches the
//!    state after the last handle and the last hold are gone.
//!
//! `keep::tests` forces the interleavings: the orphan between a release's read of `orphaned` and its
//! subtraction, a release after the orphan, the last handle dropped inside a read section (the settle
//! deferred), and many threads' entries exiting while the last handle drops.

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
#[inline(always)]
pub(crate) unsafe fn release(state: NonNull<Shared>) {
    let last = {
        let section = rcu::ReadGuard::enter();
        // SAFETY: the hold keeps the state alive until it is released, which happens in this section; the free
        // waits for the section to end (module docs, 4).
        unsafe { state.as_ref() }.holds.release(&section)
    };
    if last {
        // SAFETY: the last hold of an orphaned state: nothing else frees it (module docs, 3).
        unsafe { free(state) };
    }
}

/// Frees a state after a grace period.
///
/// # Safety
/// `state` came from `Box::leak` in [`SharedHandle::new`], no handle is left and no hold, and no one else frees
/// it.
unsafe fn free(state: NonNull<Shared>) {
    // SAFETY: see the function's contract.
    let state = unsafe { Box::from_raw(state.as_ptr()) };
    rcu::retire_boxed(state);
}

/// An orphaned state whose holds were not summed yet: dropped after the grace period that followed the orphan,
/// it settles them.
struct Orphaned(NonNull<Shared>);

// SAFETY: it stands for the orphan's claim on the state, which any thread may finish.
unsafe impl Send for Orphaned {}

impl Drop for Orphaned {
    fn drop(&mut self) {
        // SAFETY: the state is not freed before it is settled (module docs, 3); the settle reads it only before
        // its change of `left`.
        if unsafe { self.0.as_ref() }.holds.settle() {
            // SAFETY: no hold is left and the settle brought `left` to zero: nothing else frees it.
            unsafe { free(self.0) };
        }
    }
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
        // SAFETY: the last handle: the state is not freed before this orphan settles it (module docs, 3).
        if unsafe { state.as_ref() }.holds.orphan() {
            // The settle, after a grace period.
            rcu::retire_boxed(Box::new(Orphaned(state)));
        } else {
            // No owned entry ever held it: nothing but this handle reaches it (module docs, 1).
            // SAFETY: from `Box::leak` in `new`; the last handle, and no hold.
            drop(unsafe { Box::from_raw(state.as_ptr()) });
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
    use crate::rcu::test_hooks::set;

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
    fn the_orphan_between_a_release_and_its_subtraction_frees_the_state_once() {
        // The exiting entry reads `orphaned` (unset); before it subtracts its hold, another thread drops the
        // last handle and marks the state orphaned: its grace period waits for the exiting entry's read
        // section, so the settle sums the counters after the subtraction, finds no hold and frees the state.
        use std::sync::Mutex;

        let (engine, r, weak) = engine();
        let state = engine.shared.state();
        let e = owned(&r);
        let last = Arc::new(Mutex::new(Some((r, engine))));
        let orphan = Arc::new(Mutex::new(None));
        {
            let (last, orphan) = (last.clone(), orphan.clone());
            set(&hook::AFTER_ORPHAN_READ, move || {
                let last = last.clone();
                let t = std::thread::spawn(move || drop(last.lock().unwrap().take()));
                // The orphan marks the state (and then waits for a grace period, which waits for this section).
                // SAFETY: the state is not freed before this section ends.
                while !unsafe { state.as_ref() }.holds.is_orphaned() {
                    std::thread::yield_now();
                }
                *orphan.lock().unwrap() = Some(t);
            });
        }
        drop(e);
        let t = orphan.lock().unwrap().take().expect("the hook ran");
        t.join().unwrap();
        assert!(last.lock().unwrap().is_none());
        assert!(weak.upgrade().is_none(), "freed once, by the orphan's settle");
    }

    #[test]
    fn a_release_after_the_orphan_frees_the_state() {
        // The settle finds a hold and leaves the state; the entry's release, on another thread, frees it.
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
    fn the_last_handle_dropped_inside_a_read_section_settles_after_a_later_grace_period() {
        // A thread inside a read section cannot wait for a grace period: the settle is deferred with the values
        // retired there, and runs after the next grace period that frees them.
        let (engine, r, weak) = engine();
        let e = owned(&r);
        {
            let _section = crate::rcu::ReadGuard::enter();
            drop((r, engine));
        }
        assert!(weak.upgrade().is_some(), "held by the entry, and not settled yet");
        // A grace period outside any section frees what was deferred: the settle finds the entry's hold.
        crate::rcu::retire_boxed(Box::new(()));
        assert!(weak.upgrade().is_some(), "the entry still holds the state");
        drop(e);
        // Freed by this release, or, when another test's grace period took the deferred settle first and is
        // running it now, by that settle when it ends.
        let mut turns = 0u64;
        while weak.upgrade().is_some() {
            turns += 1;
            assert!(turns < 100_000_000, "the state is never freed");
            std::thread::yield_now();
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
