//! The thread's context: its state and the thread-local that holds it (with what [`super::moved`] keeps of
//! the thread), below both the context module and the mailboxes of moved entries.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::node::{DefaultNode, EntranceNode};

/// A context known to an engine.
pub(crate) struct ContextInfo {
    pub(crate) id: u32,
    pub(crate) entrance: EntranceNode,
}

impl ContextInfo {
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.entrance.name
    }
}

/// An interned origin.
pub(crate) struct OriginInfo {
    pub(crate) id: u32,
    /// The name, with its per-stripe copies for the errors of blocked calls.
    pub(crate) name: crate::stat::stripe::SharedName,
}

impl OriginInfo {
    pub(crate) fn new(id: u32, name: Arc<str>) -> Self {
        OriginInfo { id, name: crate::stat::stripe::SharedName::new(name) }
    }
}

/// The thread's current context: plain pointers into an engine that outlives every entry and guard using them.
#[derive(Clone, Copy)]
pub(crate) struct ContextState {
    /// 0 when no context is active.
    pub(crate) engine_id: u64,
    pub(crate) ctx: *const ContextInfo,
    pub(crate) origin: *const OriginInfo,
    /// The innermost entry's node; null at the entrance.
    pub(crate) cur_node: *const DefaultNode,
    pub(crate) depth: u32,
    /// The installation this state belongs to (see [`super::moved`]; 0 for none), and in
    /// the top bit ([`CLOSING`]) whether the context's guard was dropped while an entry of it was in flight:
    /// the context then ends when the outermost such entry exits (Java's `ContextUtil.exit` leaves a context
    /// whose entry has not exited). In one word beside `depth`, so that the state stays six words.
    pub(crate) era: u32,
    /// An engine that annotated functions use instead of the global one (tests).
    pub(crate) override_engine: EngineOverride,
}

/// The engine that annotated functions use on this thread instead of the global one
/// ([`Sentinel::scoped`](crate::Sentinel::scoped)): the address of a `&'static Sentinel`, or null. Opaque here,
/// since contexts sit below the engine; only the engine's handle makes one and reads it back
/// (`Sentinel::overriding`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineOverride(pub(crate) *const ());

impl EngineOverride {
    /// No engine stands in: annotated functions use the global one.
    pub(crate) const NONE: EngineOverride = EngineOverride(ptr::null());
}

impl ContextState {
    /// Whether this is [`NONE`](Self::NONE): no context and no stand-in engine (a state without an engine has
    /// no context, origin, node nor depth either).
    #[inline(always)]
    pub(crate) fn is_none(&self) -> bool {
        self.engine_id == 0 && self.override_engine == EngineOverride::NONE
    }

    pub(crate) const NONE: ContextState = ContextState {
        engine_id: 0,
        ctx: ptr::null(),
        origin: ptr::null(),
        cur_node: ptr::null(),
        depth: 0,
        era: 0,
        override_engine: EngineOverride::NONE,
    };

    /// This state, or none when it is back at its context's entrance after the context's guard was dropped.
    #[inline(always)]
    pub(crate) fn closed_if_done(self) -> ContextState {
        if self.era & CLOSING != 0 && self.depth == 0 {
            ContextState { override_engine: self.override_engine, ..ContextState::NONE }
        } else {
            self
        }
    }
}

/// A thread's context and what [`super::moved`] keeps of the thread, in one thread-local (one address to find).
pub(super) struct ThreadContext {
    pub(super) state: Cell<ContextState>,
    /// The era of the thread's last installation (0: none yet).
    pub(super) era: Cell<u32>,
    /// The thread's mailbox, once it has made an installation (and until its destructors run).
    pub(super) mailbox: Cell<Option<&'static Mailbox>>,
    /// How many contexts that are not the thread's own are installed now, one in another (a future's carried
    /// context during a poll, an entry's scope): the exits posted to the thread wait while any is, since they
    /// end entries of the thread's own context, which such a context only stands in for (a future's carried
    /// context is often a copy of it, in the same installation).
    pub(super) foreign: Cell<u32>,
}

thread_local! {
    pub(super) static CURRENT: ThreadContext = const {
        ThreadContext {
            state: Cell::new(ContextState::NONE),
            era: Cell::new(0),
            mailbox: Cell::new(None),
            foreign: Cell::new(0),
        }
    };
}

#[inline]
pub(crate) fn current() -> ContextState {
    CURRENT.with(|c| c.state.get())
}

#[inline]
pub(crate) fn set_current(s: ContextState) {
    CURRENT.with(|c| c.state.set(s))
}

/// Installs `s`, a context that is not the thread's own (a future's carried context, an entry's scope), until
/// [`end_foreign`] puts back the state this returns: meanwhile the exits posted to the thread wait for its own
/// context (see [`ThreadContext::foreign`]).
#[inline]
pub(crate) fn begin_foreign(s: ContextState) -> ContextState {
    CURRENT.with(|c| {
        c.foreign.set(c.foreign.get().wrapping_add(1));
        c.state.replace(s)
    })
}

/// Whether a context that is not the thread's own is installed now (see [`begin_foreign`]).
#[inline]
pub(crate) fn in_foreign() -> bool {
    CURRENT.with(|c| c.foreign.get() != 0)
}

/// Puts back `prev`, the state [`begin_foreign`] replaced.
#[inline]
pub(crate) fn end_foreign(prev: ContextState) {
    CURRENT.with(|c| {
        c.foreign.set(c.foreign.get().saturating_sub(1));
        c.state.set(prev)
    })
}

/// Ends the thread's context (an entry that started it exits): no engine's context is active. Only the engine
/// is cleared: every reader looks at the other fields only under an engine (a stand-in engine stays).
#[inline]
pub(crate) fn leave() {
    CURRENT.with(|c| c.state.set(ContextState { engine_id: 0, ..c.state.get() }))
}

/// The bit of [`ContextState::era`] that says the context's guard was dropped while an entry was in flight.
pub(crate) const CLOSING: u32 = 1 << 31;

/// The exit of an entry on a thread other than its installation's.
#[derive(Clone, Copy)]
pub(crate) struct MovedExit {
    pub(crate) era: u32,
    pub(crate) engine_id: u64,
    pub(crate) depth: u32,
    /// The entry's node and its parent's, as addresses (compared, never dereferenced here).
    pub(crate) node: usize,
    pub(crate) parent: usize,
    /// The entry started the installation's context: its exit ends the installation.
    pub(crate) fresh: bool,
}

/// A thread's mailbox for the exits of its entries on other threads (see [`super::moved`]).
pub(super) struct Mailbox {
    pub(super) pending: AtomicBool,
    pub(super) exits: Mutex<Vec<MovedExit>>,
    /// The era of the last installation of a thread that held this slot and ended.
    pub(super) last_era: AtomicU32,
}

impl Mailbox {
    /// Whether exits wait here (a load of a flag, no lock).
    #[inline(always)]
    pub(super) fn has_mail(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }
}
