//! Entries that exit on a thread other than the one whose context they installed themselves in.
//!
//! A borrowed entry (`resource.enter()`) is the innermost entry of the context of the thread that made it,
//! until it exits. When it exits on another thread (held across an `.await` and resumed on another worker),
//! that thread cannot write the maker's thread-local context, so it posts the exit to the maker's mailbox;
//! the maker applies it the next time it reads its context while one is active, as Java's shared `Context`
//! object would have been popped by the exit.
//!
//! **Installations.** Every context a thread installs from none (an entry that starts one, a context guard, an entry's
//! scope: `Entry::in_scope`, `Entry::instrument`, the web layer's request scope) gets an *era* of 31 bits: the thread's
//! *slot* (bits 19 to 30, a number from 1 to 4095 that a live thread holds and a thread that ends gives back) and the
//! slot's count of installations (bits 0 to 18, never 0). Entries nested in it keep it. An entry whose exit finds the
//! thread's current era equal to its own is in its installation; otherwise the installation is gone from this thread
//! (unwound already: nothing to do) or is another thread's (the era's slot differs: posted). A thread that ends leaves
//! its slot's count behind, and the next thread to take the slot goes on from it, so the eras of one slot repeat only
//! after 2^19 - 1 installations; a mail must also match the depth and node of the entry it ends. A thread that finds
//! every slot taken (4,095 threads with borrowed entries at once) gets slot 0: its exits on other threads are not
//! posted (its context stays as it was before mailboxes existed), and its eras come from one count shared by all
//! such threads, so that an entry of one of them that exits on another is never taken for one of its own.
//!
//! **Soundness.** A mailbox is leaked (`&'static`; one per slot, at most 4,095) and recycled with its slot, so
//! a pointer to one never dangles. The registry marks a slot live while a thread holds it: a thread takes a
//! slot at its first installation and gives it back in a thread-local destructor, both under the registry's
//! lock, and a poster looks the slot up and pushes under the same lock, so nothing is ever posted to a mailbox
//! after its thread gave its slot back (a mail for a thread that is gone is dropped, as its context is). The owner reads
//! its mailbox's `pending` flag with no lock on its path; the flag is set under the mailbox's lock after the
//! push and cleared under it before the mails are taken, so a mail is never missed: a set flag seen early
//! finds the mail once the lock is taken, and a flag set after the owner cleared it is seen at the owner's
//! next read. A mail only ever moves the owner's context outward within the same installation (its era,
//! depth and node must match), so a stale mail is dropped, not applied.
//!
//! **Entries unwound while held elsewhere.** An exit that moves the context out past entries nested in the
//! exiting one (an outer entry exiting first, or a mail applied while entries nested in its entry are still
//! in the context) leaves those entries out of the context while they may still be in flight on other
//! threads. The thread may then take their places again, with entries of the same resources at the same
//! depths, and a stale mail would match such a later entry by era, depth and node. So the context goes on
//! under a new era from there ([`unwound_to`]): entries made afterwards have it, and the unwound entries' eras
//! no longer match. The entries still in the context (at the depth it was moved to and outer ones) keep their
//! eras: the thread remembers, cold and off the call's path, that their era *continues* in the new one up to
//! that depth ([`continues`]), for their exits here, their mails and the context guard. What it remembers is
//! one record per era still in the context, so at most one per depth of the context (eras of one installation
//! hold disjoint ranges of depths, outer ones first), for the eight most recent installations whose eras moved
//! on (a context put back when another engine's context guard drops keeps its records). This is the
//! per-entry identity a mail needs, paid for only by the thread whose exits unwound an entry, not by every
//! call. A context that is not the thread's own (a future's carried context, an entry's scope) keeps its era
//! (it may be installed on another thread next, where this thread's records are not): there, the late exit of
//! an unwound entry may still end a later entry made in its place.
//!
//! **Other contexts installed.** A future's carried context and an entry's scope are installations of their
//! own (a future's copy of the thread's context too), so entries made in them and the thread's own are never
//! taken for one another. While one is installed the thread's mail waits (it is the thread's own context's);
//! an entry of the thread's own installation that exits inside one posts its exit to its own thread. Exits of
//! another engine's entries wait for that engine's context, which a context guard may have been installed
//! over.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::state::{ContextState, Mailbox, MovedExit, CLOSING, CURRENT};
use crate::node::DefaultNode;

/// The bits of an era that count a slot's installations.
const COUNT_MASK: u32 = (1 << 19) - 1;
/// The bits of an era that hold the slot.
const SLOT_SHIFT: u32 = 19;
/// Slots 1 to 4095 (0: none).
const SLOTS: usize = 1 << 12;
/// The bits of a [`ContextState`]'s `era` that are the era (the top bit says the context's guard is gone).
pub(crate) const ERA_MASK: u32 = (1 << 31) - 1;

/// At most this many exits wait in one thread's mailbox (the oldest is dropped past it: the thread's context
/// then stays as it is, which it was before mailboxes existed). Only the outermost exit of an installation
/// matters, so a thread that never reads its context again keeps a few at most.
const MAILBOX_CAP: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here panics while holding a lock, and every state of the data is valid.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every slot's mailbox (index 0 unused), whether a live thread holds the slot, and the slots free for reuse.
/// A slot keeps its mailbox for good: the next thread to take the slot takes the mailbox, and goes on from the
/// era the last holder reached.
struct Registry {
    slots: Vec<(&'static Mailbox, bool)>,
    free: Vec<u32>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { slots: Vec::new(), free: Vec::new() });

thread_local! {
    /// Unregisters the thread's mailbox when the thread ends.
    static REGISTRATION: Registration = const { Registration(Cell::new(0)) };
}

struct Registration(Cell<u32>);

impl Drop for Registration {
    fn drop(&mut self) {
        let slot = self.0.get() as usize;
        // The thread's installations from now on (made by destructors that run after this one) are of slot 0:
        // the slot goes to another thread, whose eras go on from `last_era`.
        let last_era = CURRENT.try_with(|c| {
            c.mailbox.set(None);
            c.era.replace(NO_SLOT)
        });
        let mut registry = lock(&REGISTRY);
        if let Some((mailbox, live)) = registry.slots.get_mut(slot).filter(|(_, live)| *live) {
            *live = false;
            let mailbox: &Mailbox = mailbox;
            lock(&mailbox.exits).clear();
            mailbox.pending.store(false, Ordering::Relaxed);
            if let Ok(era) = last_era {
                mailbox.last_era.store(era, Ordering::Relaxed);
            }
            registry.free.push(slot as u32);
        }
    }
}

/// The era of a new installation on this thread.
#[inline]
pub(crate) fn next_era() -> u32 {
    CURRENT.with(|c| {
        let next = c.era.get().wrapping_add(1);
        // The count carries into the slot's bits when it wraps (and the first installation finds 0 + 1; a
        // thread without a slot, `NO_SLOT`, finds 0 each time).
        let (last, era) = if next & COUNT_MASK <= 1 { first_era(c.era.get()) } else { (next, next) };
        c.era.set(last);
        era
    })
}

/// What a thread without a slot keeps as its last era (slot 0, the count at its end: every installation of
/// such a thread takes [`first_era`]'s path, and its era from [`no_slot_era`]).
const NO_SLOT: u32 = COUNT_MASK;

/// The era of an installation of a thread without a slot: slot 0 and the next of one count shared by all
/// such threads (never 0), so that two of them never have the same era at once (an entry of one exiting on
/// another is never taken for one of that thread's own), unless 2^19 - 1 installations were made meanwhile.
fn no_slot_era() -> u32 {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    loop {
        let era = COUNT.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & COUNT_MASK;
        if era != 0 {
            return era;
        }
    }
}

/// The era after the thread's last (`last`) when its count wraps, or this thread's first (its slot and
/// mailbox taken then), or that of an installation of a thread without a slot: the thread's last era to keep,
/// and the installation's era.
#[cold]
#[inline(never)]
fn first_era(last: u32) -> (u32, u32) {
    if last == NO_SLOT {
        return (NO_SLOT, no_slot_era());
    }
    if last != 0 {
        let next = (last & !COUNT_MASK) | 1; // the count wrapped: it starts again, skipping 0
        return (next, next);
    }
    match take_slot() {
        Some(era) => (era, era),
        None => (NO_SLOT, no_slot_era()),
    }
}

/// The first era of a slot for this thread, with its mailbox, or `None` when every slot is taken (or the
/// thread is tearing down its thread-locals).
fn take_slot() -> Option<u32> {
    let mut registry = lock(&REGISTRY);
    let slot = match registry.free.pop() {
        Some(slot) => slot,
        None if registry.slots.len() < SLOTS => {
            if registry.slots.is_empty() {
                registry.slots.push((new_mailbox(), false)); // slot 0: none, never handed out
            }
            registry.slots.push((new_mailbox(), false));
            (registry.slots.len() - 1) as u32
        }
        None => return None, // every slot taken: slot 0, exits not posted
    };
    // Registered only when the destructor that unregisters it is (a thread already tearing down its
    // thread-locals gets no slot: exits posted to it are dropped).
    if REGISTRATION.try_with(|r| r.0.set(slot)).is_err() {
        registry.free.push(slot);
        return None;
    }
    let (mailbox, live) = &mut registry.slots[slot as usize];
    *live = true;
    let mailbox: &'static Mailbox = mailbox;
    CURRENT.with(|c| c.mailbox.set(Some(mailbox)));
    // The slot's eras go on from those of the thread that held it last.
    let count = (mailbox.last_era.load(Ordering::Relaxed) & COUNT_MASK).wrapping_add(1) & COUNT_MASK;
    Some((slot << SLOT_SHIFT) | count.max(1))
}

fn new_mailbox() -> &'static Mailbox {
    Box::leak(Box::new(Mailbox {
        pending: AtomicBool::new(false),
        exits: Mutex::new(Vec::new()),
        last_era: AtomicU32::new(0),
    }))
}

/// The eras that continue in a later one of the same installation, up to a depth: see "Entries unwound while
/// held elsewhere" above. Read and written only on cold paths.
struct Continued {
    /// The era these records continue in.
    into: u32,
    /// The depth from which `into`'s own entries start (0: the installation's first era).
    start: u32,
    /// Per earlier era still in the context: the era, the depth its entries start from, the deepest of its
    /// entries still in the context.
    eras: Vec<(u32, u32, u32)>,
}

/// At most this many installations keep records (see [`CONTINUED`]).
const CONTINUED_GROUPS: usize = 8;

thread_local! {
    /// The records of the thread's installations whose eras moved on, most recent last: one for the context
    /// installed now, and a few for contexts it may put back (another engine's context guard installed over
    /// one, then dropped); past [`CONTINUED_GROUPS`], the oldest are dropped (its context's entries left in it
    /// would then exit as if unwound, as before eras went on). A thread-local of its own: the context's has no
    /// destructor, so that it can be read while the thread's other thread-locals are dropped.
    static CONTINUED: RefCell<Vec<Continued>> = const { RefCell::new(Vec::new()) };
}

impl Continued {
    /// The context moved out to `depth`: no record reaches deeper, and an era none of whose entries is left
    /// (its first depth is past the depth kept) needs no record; the installation's first era keeps its record
    /// (its context guard is at depth 0).
    fn clamp(&mut self, depth: u32) {
        for e in self.eras.iter_mut() {
            e.2 = e.2.min(depth);
        }
        self.eras.retain(|&(_, start, deepest)| start == 0 || start <= deepest);
    }
}

/// `state` (the context after an exit moved it out to `state.depth`, past entries nested in the one that
/// exited) under a new era, in which the entries still in the context, up to `state.depth`, go on (see
/// [`continues`]). Entries made from now on have the new era, and a mail of an entry that was unwound (its
/// era, at a greater depth) matches no entry any more.
#[cold]
#[inline(never)]
pub(crate) fn unwound_to(state: ContextState) -> ContextState {
    // A context that is not the thread's own (a future's carried context, an entry's scope) keeps its era: it
    // may be installed on another thread next, where this thread's records are not.
    let foreign = CURRENT.with(|c| c.foreign.get() != 0);
    if state.engine_id == 0 || state.era & ERA_MASK == 0 || foreign {
        return state;
    }
    let (old, depth) = (state.era & ERA_MASK, state.depth);
    let era = next_era();
    let kept = CONTINUED.try_with(|groups| {
        let mut groups = groups.borrow_mut();
        // The records of the context's era so far, or none: `old` is then its installation's first era.
        let mut c = match groups.iter().position(|g| g.into == old) {
            Some(at) => groups.remove(at),
            None => Continued { into: old, start: 0, eras: Vec::new() },
        };
        let start = c.start;
        c.eras.push((old, start, depth));
        c.clamp(depth);
        c.into = era;
        c.start = depth + 1;
        if groups.len() >= CONTINUED_GROUPS {
            groups.remove(0);
        }
        groups.push(c);
    });
    match kept {
        Ok(()) => ContextState { era: era | (state.era & CLOSING), ..state },
        // The thread's thread-locals are being dropped: the context keeps its era (as before eras went on).
        Err(_) => state,
    }
}

/// An entry of an era that continues in the current one exited (here, or by a mail), and the context moved
/// out to `depth`, of era `current`: no record reaches deeper, and entries of the current era may be made from
/// `depth + 1` on (the only way the context goes below the depth the current era started at is through such
/// exits, since every entry there is of an earlier era).
#[cold]
#[inline(never)]
pub(crate) fn left_continued(depth: u32, current: u32) {
    let _ = CONTINUED.try_with(|groups| {
        if let Some(c) = groups.borrow_mut().iter_mut().find(|g| g.into == current & ERA_MASK) {
            c.start = c.start.min(depth + 1);
            c.clamp(depth);
        }
    });
}

/// Whether an entry (or context guard: depth 0) of era `era` at `depth` is in the thread's current context,
/// of era `current`, having been left there when an exit moved the context out past entries nested in it
/// (see [`unwound_to`]).
#[cold]
#[inline(never)]
pub(crate) fn continues(era: u32, depth: u32, current: u32) -> bool {
    // (Records hold no era 0 and never the era they continue in.)
    let current = current & ERA_MASK;
    CONTINUED
        .try_with(|groups| {
            let groups = groups.borrow();
            groups
                .iter()
                .any(|c| c.into == current && c.eras.iter().any(|&(e, _, deepest)| e == era && depth <= deepest))
        })
        .unwrap_or(false)
}

/// Whether an installation of era `era` was made on this thread (else another thread's, or none: era 0).
#[inline]
pub(crate) fn is_this_threads(era: u32) -> bool {
    era >> SLOT_SHIFT == CURRENT.with(|c| c.era.get()) >> SLOT_SHIFT
}

/// Posts the exit of an entry of another thread's installation to that thread.
#[cold]
#[inline(never)]
pub(crate) fn post(exit: MovedExit) {
    let slot = (exit.era >> SLOT_SHIFT) as usize;
    if slot == 0 {
        return; // no thread's installation (a thread without a slot)
    }
    let registry = lock(&REGISTRY);
    let Some(&(mailbox, true)) = registry.slots.get(slot) else {
        return; // the thread is gone, and its context with it
    };
    let mut exits = lock(&mailbox.exits);
    if exits.len() >= MAILBOX_CAP {
        exits.remove(0);
    }
    exits.push(exit);
    mailbox.pending.store(true, Ordering::Release);
}

/// Applies the exits posted to this thread to its context: the outermost exit of the current installation
/// that the context is inside of, if any, moves it out of that entry (ending the installation when the entry
/// started it, or when its context guard has exited meanwhile). Exits of the engine's other installations are
/// dropped; those of another engine's entries wait (see [`settled`]).
/// Nothing while a context that is not the thread's own is installed (a future's carried context, an entry's
/// scope): the exits wait for the thread's own.
#[cold]
#[inline(never)]
pub(crate) fn apply_mail() {
    let (cur, mailbox, foreign) = CURRENT.with(|c| (c.state.get(), c.mailbox.get(), c.foreign.get()));
    if foreign != 0 {
        return; // the exits wait for the thread's own context (see `ThreadContext::foreign`)
    }
    if let Some(mailbox) = mailbox {
        let settled = settled(cur, mailbox);
        CURRENT.with(|c| c.state.set(settled));
    }
}

/// The thread put back a context of another engine than the one it had installed over it (a context guard
/// dropped): the exits waiting for it (see [`settled`]) are read at its next read of its context.
#[cold]
#[inline(never)]
pub(crate) fn rearm() {
    if let Some(mailbox) = CURRENT.with(|c| c.mailbox.get())
        && !lock(&mailbox.exits).is_empty()
    {
        mailbox.pending.store(true, Ordering::Release);
    }
}

/// `cur` with the exits in `mailbox` applied (see [`apply_mail`]).
fn settled(cur: ContextState, mailbox: &Mailbox) -> ContextState {
    let mut exits = {
        let mut exits = lock(&mailbox.exits);
        mailbox.pending.store(false, Ordering::Relaxed);
        std::mem::take(&mut *exits)
    };
    let in_context = |x: &MovedExit| x.era == cur.era & ERA_MASK || continues(x.era, x.depth, cur.era);
    let outermost = exits
        .iter()
        .filter(|x| x.engine_id == cur.engine_id && x.era != 0 && in_context(x))
        .filter(|x| cur.depth > x.depth || (cur.depth == x.depth && cur.cur_node as usize == x.node))
        .min_by_key(|x| x.depth)
        .copied();
    // The exits of another engine's entries wait: they may be for that engine's context, which a context of
    // this engine was installed over (a context guard of this engine), and is put back when that guard drops
    // (`rearm`). Oldest first, at most `MAILBOX_CAP` kept, as when posted.
    exits.retain(|x| x.engine_id != cur.engine_id);
    if !exits.is_empty() {
        let mut waiting = lock(&mailbox.exits);
        exits.append(&mut waiting);
        let excess = exits.len().saturating_sub(MAILBOX_CAP);
        exits.drain(..excess);
        *waiting = exits;
    }
    match outermost {
        None => cur,
        Some(x) if x.fresh => ContextState { override_engine: cur.override_engine, ..ContextState::NONE },
        Some(x) => {
            let outer = ContextState { cur_node: x.parent as *const DefaultNode, depth: x.depth - 1, ..cur };
            if cur.depth > x.depth {
                // Entries nested in the one that exited leave the context with it, and may still be in flight.
                unwound_to(outer).closed_if_done()
            } else {
                if x.era != cur.era & ERA_MASK {
                    left_continued(outer.depth, cur.era);
                }
                outer.closed_if_done()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eras_keep_their_slot_skip_count_zero_when_they_wrap_and_are_never_zero() {
        std::thread::spawn(|| {
            let first = next_era();
            let slot = first >> SLOT_SHIFT;
            assert_ne!(first & COUNT_MASK, 0);
            assert!(is_this_threads(first));
            CURRENT.with(|c| c.era.set((slot << SLOT_SHIFT) | (COUNT_MASK - 1)));
            assert_eq!(next_era(), (slot << SLOT_SHIFT) | COUNT_MASK);
            assert_eq!(next_era(), (slot << SLOT_SHIFT) | 1, "wraps within the slot, skipping 0");
            // The slot's next holder goes on from `first`, as if the count had not been moved on: the test
            // beside this one checks that threads taking slots one after another never see an era twice.
            CURRENT.with(|c| c.era.set(first));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_slot_given_back_at_a_threads_end_goes_on_from_the_era_its_last_holder_reached() {
        // Threads one after the other: each takes a slot and gives it back; a slot taken again goes on
        // counting where it stopped, so no era of a slot repeats soon.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..64 {
            let eras = std::thread::spawn(|| (0..3).map(|_| next_era()).collect::<Vec<_>>()).join().unwrap();
            for era in eras {
                assert!(era >> SLOT_SHIFT != 0, "a slot is free");
                assert!(seen.insert(era), "era {era:#x} handed out twice");
            }
        }
    }

    #[test]
    fn a_thread_that_gave_its_slot_back_makes_no_more_eras_of_that_slot() {
        // A thread-local whose destructor runs after the registration's (registered before it: destructors run
        // in the reverse order) makes an installation, as an entry made in a destructor does. The slot is
        // free by then, and its next holder goes on from the era the thread reached: the same eras.
        struct Late(std::sync::mpsc::Sender<u32>);
        impl Drop for Late {
            fn drop(&mut self) {
                let _ = self.0.send(next_era());
            }
        }
        thread_local! {
            static LATE: std::cell::RefCell<Option<Late>> = const { std::cell::RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let first = std::thread::spawn(move || {
            LATE.with(|l| *l.borrow_mut() = Some(Late(tx)));
            next_era()
        })
        .join()
        .unwrap();
        let late = rx.recv().unwrap();
        assert_ne!(first >> SLOT_SHIFT, 0, "the thread had a slot");
        assert_ne!(late >> SLOT_SHIFT, first >> SLOT_SHIFT, "era {late:#x} made after the slot was given back");
    }

    #[test]
    fn entries_left_in_the_context_continue_under_its_new_eras_and_unwound_ones_never_do() {
        // A model of one installation: the context's chain of entries (each its era), exits of the innermost
        // entry, and exits that unwind entries nested in the exiting one. Every entry left in the chain is in
        // the context (its era is the context's, or continues in it at its depth); no entry ever unwound is;
        // the records stay within one per era left in the chain, plus the installation's first.
        std::thread::spawn(|| {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = move |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            let mut state = ContextState { engine_id: 1, era: next_era(), ..ContextState::NONE };
            let mut chain: Vec<u32> = Vec::new(); // the era of the entry at depth i + 1
            let mut unwound: Vec<(u32, u32)> = Vec::new();
            for step in 0..20_000 {
                match next(10) {
                    0..=4 if chain.len() < 40 => chain.push(state.era & ERA_MASK),
                    5..=7 => {
                        // An entry of an earlier era exits through the cold path, which reports it.
                        let popped = chain.pop();
                        if popped.is_some_and(|era| era != state.era & ERA_MASK) {
                            left_continued(chain.len() as u32, state.era);
                        }
                    }
                    _ if chain.len() >= 2 => {
                        // The entry at depth d + 1 exits while deeper ones are in the context.
                        let d = next(chain.len() as u64 - 1) as usize;
                        for (i, &era) in chain.iter().enumerate().skip(d + 1) {
                            unwound.push((era, i as u32 + 1));
                        }
                        chain.truncate(d);
                        state = unwound_to(ContextState { depth: d as u32, ..state });
                    }
                    _ => {}
                }
                state.depth = chain.len() as u32;
                let cur = state.era & ERA_MASK;
                for (i, &era) in chain.iter().enumerate() {
                    let depth = i as u32 + 1;
                    assert!(era == cur || continues(era, depth, cur), "step {step}: depth {depth} left out");
                }
                if step % 64 == 0 {
                    for &(era, depth) in &unwound {
                        assert!(era != cur && !continues(era, depth, cur), "step {step}: unwound {era:#x} at {depth}");
                    }
                }
                let records = CONTINUED.with(|g| g.borrow().iter().find(|c| c.into == cur).map_or(0, |c| c.eras.len()));
                assert!(records <= chain.len() + 1, "step {step}: {records} records for {} entries", chain.len());
                assert!(CONTINUED.with(|g| g.borrow().len()) <= CONTINUED_GROUPS);
            }
            assert!(!unwound.is_empty());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_exit_posted_to_a_thread_that_is_gone_is_dropped() {
        let era = std::thread::spawn(next_era).join().unwrap();
        post(MovedExit { era, engine_id: 1, depth: 1, node: 8, parent: 0, fresh: true });
        let registry = lock(&REGISTRY);
        let (mailbox, live) = registry.slots[(era >> SLOT_SHIFT) as usize];
        // Another test's thread may hold the slot again by now; if not, nothing waits in it.
        if !live {
            assert!(lock(&mailbox.exits).is_empty());
        }
    }
}
