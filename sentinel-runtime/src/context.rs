//! Invocation contexts: a named scope with a caller origin, holding the current position in the call tree.
//!
//! In synchronous code the context lives in a thread-local. Async code carries it in the future
//! ([`CarriedContext`], used by the macro's wrapper future) and installs it during every poll.

use std::cell::Cell;
use std::fmt;
use std::ptr;
use std::sync::Arc;

use crate::node::{DefaultNode, EntranceNode};

pub use crate::names::DEFAULT_CONTEXT_NAME;

/// `name` as the name of a context of its own: `None` for the default context's name or an empty one, which
/// both mean the default context.
#[inline]
pub(crate) fn named_context(name: &str) -> Option<&str> {
    (!name.is_empty() && name != DEFAULT_CONTEXT_NAME).then_some(name)
}

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
    pub(crate) name: Arc<str>,
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
    pub(crate) const NONE: ContextState = ContextState {
        engine_id: 0,
        ctx: ptr::null(),
        origin: ptr::null(),
        cur_node: ptr::null(),
        depth: 0,
        override_engine: EngineOverride::NONE,
    };
}

thread_local! {
    static CURRENT: Cell<ContextState> = const { Cell::new(ContextState::NONE) };
}

#[inline]
pub(crate) fn current() -> ContextState {
    CURRENT.with(|c| c.get())
}

#[inline]
pub(crate) fn set_current(s: ContextState) {
    CURRENT.with(|c| c.set(s))
}

/// Errors entering a context.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// The default context's name was used explicitly.
    #[error("the context name `{DEFAULT_CONTEXT_NAME}` is reserved for the default context; choose another name")]
    ReservedName,
    /// The name is empty.
    #[error("a context name must not be empty")]
    EmptyName,
}

/// An entered context: leaving the scope exits it. See [`Sentinel::enter_context`](crate::Sentinel::enter_context).
#[must_use = "the context is exited when the guard is dropped"]
pub struct ContextGuard<'e> {
    /// The id of the engine the guard borrows.
    pub(crate) engine_id: u64,
    pub(crate) _engine: std::marker::PhantomData<&'e ()>,
    /// The state to restore, or `None` when another context was already active (nothing to undo).
    pub(crate) restore: Option<ContextState>,
    pub(crate) _not_send: std::marker::PhantomData<*const ()>,
}

impl ContextGuard<'_> {
    /// The name of the active context.
    pub fn name(&self) -> String {
        let s = current();
        if s.engine_id == self.engine_id && !s.ctx.is_null() {
            // SAFETY: contexts live as long as the engine, which this guard borrows.
            unsafe { (*s.ctx).name().to_string() }
        } else {
            String::new()
        }
    }
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore.take() {
            set_current(prev);
        }
    }
}

impl fmt::Debug for ContextGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextGuard").field("owns", &self.restore.is_some()).finish()
    }
}

/// A context carried by a future across polls (and threads), installed in the thread-local while it runs.
#[doc(hidden)]
pub struct CarriedContext {
    state: ContextState,
}

// SAFETY: the pointers refer to engine-owned data (contexts, origins, nodes) that is `Sync` and outlives every
// entry; the state is only dereferenced by the thread that has it installed.
unsafe impl Send for CarriedContext {}
unsafe impl Sync for CarriedContext {}

impl CarriedContext {
    /// Captures the calling thread's current context (what the future's parent had when it was created).
    pub fn capture() -> Self {
        CarriedContext { state: current() }
    }

    /// Carries `state` (an entry's scope, see [`Entry::instrument`](crate::Entry::instrument)).
    pub(crate) fn from_state(state: ContextState) -> Self {
        CarriedContext { state }
    }

    /// Installs the carried context on this thread for the duration of `f`, then carries away what `f` left.
    #[inline]
    pub fn scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a> {
            carried: &'a mut ContextState,
            outer: ContextState,
        }
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                *self.carried = current();
                set_current(self.outer);
            }
        }
        let outer = current();
        set_current(self.state);
        let _restore = Restore { carried: &mut self.state, outer };
        f()
    }
}

impl fmt::Debug for CarriedContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CarriedContext").field("depth", &self.state.depth).finish()
    }
}
