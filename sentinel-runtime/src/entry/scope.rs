//! An entry as the innermost entry of a thread's context: for a closure, until a guard drops, or for a
//! future's every poll.

use std::fmt;

use crate::context::{self, ContextState};
use crate::node::DefaultNode;

use super::Entry;

/// Puts the thread's context back when dropped (see [`Entry::scope`]).
#[must_use = "the entry's scope ends when this is dropped"]
pub(crate) struct ScopeRestore(ContextState);

impl Drop for ScopeRestore {
    #[inline]
    fn drop(&mut self) {
        context::end_foreign(self.0);
    }
}

impl<'r> Entry<'r> {
    /// The thread-context state in which this entry is the innermost entry (`None` when unchecked).
    #[inline]
    fn scope_state(&self, override_engine: context::EngineOverride) -> Option<ContextState> {
        let node = self.node?;
        let shared = self.res.shared();
        let ctx = shared.context_by_id(node.context_id)?;
        let origin = self.origin?;
        Some(ContextState {
            engine_id: shared.id,
            ctx: ctx as *const crate::context::ContextInfo,
            origin: origin as *const crate::context::OriginInfo,
            cur_node: node as *const DefaultNode,
            depth: self.depth,
            // An installation of its own (see `context::moved`): the entries made in it exit from it, and from
            // no other scope's state a thread has installed when they exit (another request's, say).
            era: self.scope_era(),
            override_engine,
        })
    }

    /// The era of this entry's scopes: for an entry that leaves the thread's context alone (an owned one), one
    /// era for all of them, made at the first (a request's scope is installed at each poll of its handler,
    /// and an entry held across an await inside it exits from the same installation, on any thread); for one
    /// that installed itself, whose `era` is its installation's, a new era for each.
    #[inline]
    fn scope_era(&self) -> u32 {
        use std::sync::atomic::Ordering;
        if self.flags & super::Flags::TOUCHES_TLS != 0 {
            return context::next_era();
        }
        match self.era.load(Ordering::Relaxed) {
            0 => {
                // A plain store, no locked instruction: two threads that scope one shared entry at once for its
                // first time may each keep an era of their own, and an entry made in one scope that exits in
                // the other then leaves that scope's context as it is (as an entry of another installation).
                let era = context::next_era();
                self.era.store(era, Ordering::Relaxed);
                era
            }
            era => era,
        }
    }

    /// Runs `f` with this entry as the innermost entry of the thread's context: entries made in `f` are its
    /// children in the call tree and inherit its context and origin. The thread's context is put back after
    /// `f` (also when `f` panics). Meant for owned entries ([`Resource::entry_owned`](crate::Resource::entry_owned), [`EntryBuilder::enter_async`](crate::EntryBuilder::enter_async)),
    /// which never install themselves.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let request = engine.resource("GET:/orders").entry_owned().origin("appA").enter().unwrap();
    /// let db = engine.resource("db");
    /// request.in_scope(|| {
    ///     let db = db.enter().unwrap();
    ///     assert_eq!(db.origin(), "appA");
    /// });
    /// assert!(engine.current_context().is_none());
    /// ```
    #[inline]
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _scope = self.scope();
        f()
    }

    /// Installs this entry as the innermost entry of the thread's context until the returned guard drops
    /// (which puts the thread's context back, also when unwinding); `None` for an unchecked entry, which
    /// installs nothing. [`in_scope`](Self::in_scope) without a closure, for callers that would otherwise move
    /// large values into one.
    #[inline]
    pub(crate) fn scope(&self) -> Option<ScopeRestore> {
        let cur = context::current();
        let state = self.scope_state(cur.override_engine)?;
        context::begin_foreign(state);
        Some(ScopeRestore(cur))
    }

    /// A future that runs `fut` with this entry as its innermost entry, on whatever thread polls it (the
    /// entry's context is installed during every poll and while `fut` is dropped), and yields `fut`'s output
    /// with the entry, so the caller can trace an error before the entry exits. Dropped early (cancelled),
    /// it drops `fut`, then the entry: the call exits without an error.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// let engine = Sentinel::builder().build();
    /// let request = engine.resource("GET:/orders").entry_owned().origin("appA").enter().unwrap();
    /// let db = engine.resource("db");
    /// let work = async {
    ///     // Entered while the request's entry is installed: its child, with its origin.
    ///     let db = db.enter().unwrap();
    ///     db.origin().to_string()
    /// };
    /// let (origin, mut entry) = futures::executor::block_on(request.instrument(work));
    /// assert_eq!(origin, "appA");
    /// entry.set_error(); // e.g. the response was a 5xx; the entry exits when dropped
    /// ```
    pub fn instrument<F: std::future::Future>(self, fut: F) -> Instrumented<'r, F> {
        let carried = match self.scope_state(context::current().override_engine) {
            Some(state) => crate::context::CarriedContext::from_state(state),
            None => crate::context::CarriedContext::capture(),
        };
        Instrumented { inner: crate::macro_support::InContext::carrying(fut, carried), entry: Some(self) }
    }
}

pin_project_lite::pin_project! {
    /// A future run with an entry as its innermost entry: see [`Entry::instrument`]. `Send` when the inner
    /// future is.
    #[must_use = "futures do nothing unless polled"]
    pub struct Instrumented<'r, F> {
        // Declared first, so it is dropped before the entry.
        #[pin]
        inner: crate::macro_support::InContext<F>,
        entry: Option<Entry<'r>>,
    }
}

impl<'r, F: std::future::Future> std::future::Future for Instrumented<'r, F> {
    type Output = (F::Output, Entry<'r>);

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        match this.entry.take() {
            Some(entry) => std::task::Poll::Ready((out, entry)),
            None => panic!("`Instrumented` polled after it completed"),
        }
    }
}

impl<F> fmt::Debug for Instrumented<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instrumented").field("entry", &self.entry).finish_non_exhaustive()
    }
}
