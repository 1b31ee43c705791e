//! Entries that exit on a thread other than the one whose context they installed themselves in.
//!
//! A borrowed entry (`resource.enter()`) is the innermost entry of the context of the thread that made it,
//! until it exits. When it exits on another thread (held across an `.await` and resumed on another worker),
//! that thread cannot write the maker's thread-local context, so it posts the exit to the maker's mailbox;
//! the maker applies it the next time it reads its context while one is active, as Java's shared `Context`
//! object would have been popped by the exit.
//!
//! **Installations.** Every context a thread installs from none (an entry that starts one, a context guard)
//! gets an *era*: the thread's sequence number in the upper 32 bits and a count of the thread's
//! installations in the lower ones. Entries nested in it keep it. An entry whose exit finds the thread's
//! current era equal to its own is in its installation; otherwise the installation is gone from this thread
//! (unwound already: nothing to do) or is another thread's (the era's thread part differs: posted).
//!
//! **Soundness.** A mailbox is leaked (`&'static`) and recycled through a pool, so a pointer to one never
//! dangles. The registry maps a live thread's sequence number to its mailbox: a thread registers at its first
//! installation and unregisters in a thread-local destructor, both under the registry's lock, and a poster
//! looks the mailbox up and pushes under the same lock, so nothing is ever posted to a mailbox after its
//! thread unregistered it (a mail for a thread that is gone is dropped, as its context is). The owner reads
//! its mailbox's `pending` flag with no lock on its path; the flag is set under the mailbox's lock after the
//! push and cleared under it before the mails are taken, so a mail is never missed: a set flag seen early
//! finds the mail once the lock is taken, and a flag set after the owner cleared it is seen at the owner's
//! next read. A mail only ever moves the owner's context outward within the same installation (its era,
//! depth and node must match), so a stale mail is dropped, not applied.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{ContextState, CURRENT};
use crate::node::DefaultNode;

/// The lower bits of an era: the thread's count of its installations.
const COUNT_MASK: u64 = u32::MAX as u64;

/// At most this many exits wait in one thread's mailbox (the oldest is dropped past it: the thread's context
/// then stays as it is, which it was before mailboxes existed). Only the outermost exit of an installation
/// matters, so a thread that never reads its context again keeps a few at most.
const MAILBOX_CAP: usize = 64;

/// The exit of an entry on a thread other than its installation's.
#[derive(Clone, Copy)]
pub(crate) struct MovedExit {
    pub(crate) era: u64,
    pub(crate) engine_id: u64,
    pub(crate) depth: u32,
    /// The entry's node and its parent's, as addresses (compared, never dereferenced here).
    pub(crate) node: usize,
    pub(crate) parent: usize,
    /// The entry started the installation's context: its exit ends the installation.
    pub(crate) fresh: bool,
}

pub(super) struct Mailbox {
    pending: AtomicBool,
    exits: Mutex<Vec<MovedExit>>,
}

impl Mailbox {
    /// Whether exits wait here (a load of a flag, no lock).
    #[inline(always)]
    pub(super) fn has_mail(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here panics while holding a lock, and every state of the data is valid.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
static REGISTRY: Mutex<Option<HashMap<u32, &'static Mailbox>>> = Mutex::new(None);
static POOL: Mutex<Vec<&'static Mailbox>> = Mutex::new(Vec::new());

thread_local! {
    /// Unregisters the thread's mailbox when the thread ends.
    static REGISTRATION: Registration = const { Registration(Cell::new(0)) };
}

struct Registration(Cell<u32>);

impl Drop for Registration {
    fn drop(&mut self) {
        let seq = self.0.get();
        let Some(mailbox) = lock(&REGISTRY).as_mut().and_then(|r| r.remove(&seq)) else {
            return;
        };
        let _ = CURRENT.try_with(|c| c.mailbox.set(None));
        lock(&mailbox.exits).clear();
        mailbox.pending.store(false, Ordering::Relaxed);
        lock(&POOL).push(mailbox);
    }
}

/// The era of a new installation on this thread.
#[inline]
pub(crate) fn next_era() -> u64 {
    CURRENT.with(|c| {
        let last = c.era.get();
        let era = if last == 0 { first_era() } else { (last & !COUNT_MASK) | (last.wrapping_add(1) & COUNT_MASK) };
        c.era.set(era);
        era
    })
}

/// This thread's first installation: its sequence number and its mailbox.
#[cold]
#[inline(never)]
fn first_era() -> u64 {
    let seq = NEXT_THREAD.fetch_add(1, Ordering::Relaxed).max(1);
    let mailbox: &'static Mailbox = lock(&POOL).pop().unwrap_or_else(|| {
        Box::leak(Box::new(Mailbox { pending: AtomicBool::new(false), exits: Mutex::new(Vec::new()) }))
    });
    // Registered only when the destructor that unregisters it is (a thread already tearing down its
    // thread-locals gets no mailbox: exits posted to it are dropped).
    let registered = REGISTRATION.try_with(|r| r.0.set(seq)).is_ok();
    if registered {
        lock(&REGISTRY).get_or_insert_with(HashMap::new).insert(seq, mailbox);
        CURRENT.with(|c| c.mailbox.set(Some(mailbox)));
    } else {
        lock(&POOL).push(mailbox);
    }
    (u64::from(seq) << 32) | 1
}

/// Whether an installation of era `era` was made on this thread (else another thread's, or none: era 0).
#[inline]
pub(crate) fn is_this_threads(era: u64) -> bool {
    era >> 32 == CURRENT.with(|c| c.era.get()) >> 32
}

/// Posts the exit of an entry of another thread's installation to that thread.
#[cold]
#[inline(never)]
pub(crate) fn post(exit: MovedExit) {
    let seq = (exit.era >> 32) as u32;
    if seq == 0 {
        return; // an installation with no thread (an entry's scope): put back by its scope
    }
    let registry = lock(&REGISTRY);
    let Some(mailbox) = registry.as_ref().and_then(|r| r.get(&seq)) else {
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
/// started it, or when its context guard has exited meanwhile). Exits of other installations are dropped.
#[cold]
#[inline(never)]
pub(crate) fn apply_mail() {
    let (cur, mailbox) = CURRENT.with(|c| (c.state.get(), c.mailbox.get()));
    if let Some(mailbox) = mailbox {
        let settled = settled(cur, mailbox);
        CURRENT.with(|c| c.state.set(settled));
    }
}

/// `cur` with the exits in `mailbox` applied (see [`apply_mail`]).
fn settled(cur: ContextState, mailbox: &Mailbox) -> ContextState {
    let exits = {
        let mut exits = lock(&mailbox.exits);
        mailbox.pending.store(false, Ordering::Relaxed);
        std::mem::take(&mut *exits)
    };
    let outermost = exits
        .iter()
        .filter(|x| x.era == cur.era && x.engine_id == cur.engine_id && cur.era != 0)
        .filter(|x| cur.depth > x.depth || (cur.depth == x.depth && cur.cur_node as usize == x.node))
        .min_by_key(|x| x.depth);
    match outermost {
        None => cur,
        Some(x) if x.fresh => ContextState { override_engine: cur.override_engine, ..ContextState::NONE },
        Some(x) => {
            let outer = ContextState { cur_node: x.parent as *const DefaultNode, depth: x.depth - 1, ..cur };
            outer.closed_if_done()
        }
    }
}
