//! Invocation contexts: a named scope with a caller origin, holding the current position in the call tree.
//!
//! In synchronous code the context lives in a thread-local. Async code carries it in the future
//! ([`CarriedContext`], used by the macro's wrapper future) and installs it during every poll.

use std::fmt;

mod moved;
mod state;
pub(crate) use moved::{
    continues, is_this_threads, left_continued, next_era, post as post_moved_exit, unwound_to, ERA_MASK,
};
use state::CURRENT;
pub(crate) use state::{
    begin_foreign, current, end_foreign, in_foreign, leave, set_current, ContextInfo, ContextState, EngineOverride,
    MovedExit, OriginInfo, CLOSING,
};

pub use crate::names::DEFAULT_CONTEXT_NAME;

/// `name` as the name of a context of its own: `None` for the default context's name or an empty one, which
/// both mean the default context.
#[inline]
pub(crate) fn named_context(name: &str) -> Option<&str> {
    (!name.is_empty() && name != DEFAULT_CONTEXT_NAME).then_some(name)
}

/// The thread's current context, with the exits of its entries made on other threads applied (see
/// [`moved`]): what every reader that acts on the context reads. A thread with no context active reads no
/// mail (a mail only ever ends part of an active one).
#[inline(always)]
pub(crate) fn current_settled() -> ContextState {
    settle();
    current()
}

/// [`current_settled`]'s engine id and stand-in engine alone (what an entry that starts a context of its own
/// reads: the other fields are read only when the context is the entry's).
#[inline(always)]
pub(crate) fn current_engine_settled() -> (u64, EngineOverride) {
    settle();
    CURRENT.with(|c| {
        let s = c.state.get();
        (s.engine_id, s.override_engine)
    })
}

/// Applies the exits of the thread's entries made on other threads, if any wait.
#[inline(always)]
fn settle() {
    // The mail is applied in place and the state read after it, so that the common case reads only the
    // fields its caller uses (a state passed out of a branch is copied whole).
    let pending = CURRENT.with(|c| {
        // A thread with no context active reads no mail; `mailbox` is `None` until its first installation.
        c.state.get().engine_id != 0 && c.mailbox.get().is_some_and(state::Mailbox::has_mail)
    });
    if pending {
        moved::apply_mail();
    }
}

/// Whether no context (and no stand-in engine) is active on this thread.
#[inline]
fn current_is_none() -> bool {
    current().is_none()
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
    /// The era of the context the guard installed (see [`moved`]).
    pub(crate) era: u32,
    pub(crate) _not_send: std::marker::PhantomData<*const ()>,
}

impl ContextGuard<'_> {
    /// The name of the active context.
    pub fn name(&self) -> String {
        let s = current_settled();
        if s.engine_id == self.engine_id && !s.ctx.is_null() {
            // SAFETY: `s` is a state of the guard's engine (its id was compared above, and ids are never
            // reused), whose contexts are freed only with it, and the guard borrows it.
            unsafe { (*s.ctx).name().to_string() }
        } else {
            String::new()
        }
    }
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore.take() {
            let cur = current_settled();
            let ours = cur.era & ERA_MASK == self.era || continues(self.era, 0, cur.era);
            if ours && cur.engine_id == self.engine_id && cur.depth > 0 && prev.engine_id == 0 {
                // An entry of the context is in flight: the context ends when it exits (Java's
                // `ContextUtil.exit` does nothing while the context has a current entry). Not over another
                // engine's context, which the end of this one could not give back (a state has no room for it):
                // that one comes back at once, as the guard installed it over.
                set_current(ContextState { era: cur.era | CLOSING, ..cur });
            } else {
                set_current(prev);
                if prev.engine_id != 0 && prev.engine_id != self.engine_id {
                    // Another engine's context is back: exits of its entries may have waited for it.
                    moved::rearm();
                }
            }
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

// SAFETY: the state is plain data (an engine id, addresses, numbers) and `&CarriedContext` gives access to none
// of it. Its pointers refer to engine-owned data (contexts, origins, nodes) that is `Sync` and freed only with
// its engine; a carried state may outlive that engine (a future kept past the engine's drop), but a pointer
// of a state is dereferenced only under a live engine whose id equals the state's `engine_id` (every reader
// compares it first: `entry_path`, `current_context`, `ContextGuard::name`, `Entry::restore_context`), and
// engine ids are never reused (`NEXT_ENGINE_ID`), so a state of a dropped engine is never dereferenced on any
// thread it is installed on. The engine override is the address of a `&'static Sentinel`.
unsafe impl Send for CarriedContext {}
// SAFETY: as for `Send`.
unsafe impl Sync for CarriedContext {}

impl CarriedContext {
    /// Captures the calling thread's current context (what the future's parent had when it was created).
    pub fn capture() -> Self {
        Self::copy_of(current_settled())
    }

    /// Carries a copy of `state`, a context this thread has installed as its own (and keeps): the copy is an
    /// installation of its own (see [`moved`]), so that an entry made in it and one of the thread's own are
    /// never taken for one another where they exit, and an entry of the thread's own that exits inside the
    /// copy tells the thread's own context ([`in_foreign`]).
    pub(crate) fn copy_of(state: ContextState) -> Self {
        if state.engine_id == 0 {
            return CarriedContext { state };
        }
        CarriedContext { state: ContextState { era: next_era() | (state.era & CLOSING), ..state } }
    }

    /// Carries `state` (an entry's scope, see [`Entry::instrument`](crate::Entry::instrument)).
    pub(crate) fn from_state(state: ContextState) -> Self {
        CarriedContext { state }
    }

    /// Installs the carried context on this thread for the duration of `f`, then carries away what `f` left.
    #[inline]
    pub fn scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        // The common case, a future with no context polled on a thread with none: nothing to install or put
        // back, unless `f` leaves a context behind (an entry still open across an await).
        if self.state.is_none() && current_is_none() {
            struct Carry<'a>(&'a mut ContextState);
            impl Drop for Carry<'_> {
                #[inline]
                fn drop(&mut self) {
                    if !current_is_none() {
                        *self.0 = current();
                        set_current(ContextState::NONE);
                    }
                }
            }
            let _carry = Carry(&mut self.state);
            return f();
        }
        self.scope_installed(f)
    }

    /// [`scope`](Self::scope) with a context to install or to put back.
    fn scope_installed<R>(&mut self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a> {
            carried: &'a mut ContextState,
            outer: ContextState,
        }
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                *self.carried = current();
                end_foreign(self.outer);
            }
        }
        let outer = begin_foreign(self.state);
        let _restore = Restore { carried: &mut self.state, outer };
        f()
    }
}

impl fmt::Debug for CarriedContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CarriedContext").field("depth", &self.state.depth).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state as an entry installs it (only its identity matters here).
    fn some_state() -> ContextState {
        ContextState { engine_id: 7, depth: 1, ..ContextState::NONE }
    }

    #[test]
    fn a_future_without_context_carries_away_what_its_poll_left_and_leaves_the_thread_without_one() {
        set_current(ContextState::NONE);
        let mut carried = CarriedContext::capture();
        carried.scope(|| set_current(some_state())); // an entry opened and held across an await
        assert!(current().is_none(), "the thread is left as it was");
        assert_eq!(carried.state.engine_id, 7, "the future carries the open entry's context");
        // The next poll installs it, and the entry's exit inside it is carried away too.
        carried.scope(|| {
            assert_eq!(current().engine_id, 7);
            set_current(ContextState::NONE);
        });
        assert!(carried.state.is_none());
        assert!(current().is_none());
    }

    #[test]
    fn a_poll_that_panics_leaves_the_thread_without_the_futures_context() {
        set_current(ContextState::NONE);
        let mut carried = CarriedContext::capture();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            carried.scope(|| {
                set_current(some_state());
                panic!("user code");
            })
        }));
        assert!(unwound.is_err());
        assert!(current().is_none());
        assert_eq!(carried.state.engine_id, 7);
    }

    #[test]
    fn a_thread_with_a_context_gets_it_back_after_polling_a_future_without_one() {
        set_current(some_state());
        let mut carried = CarriedContext::from_state(ContextState::NONE);
        carried.scope(|| assert!(current().is_none(), "the future's own (empty) context is installed"));
        assert_eq!(current().engine_id, 7);
        set_current(ContextState::NONE);
    }
}
