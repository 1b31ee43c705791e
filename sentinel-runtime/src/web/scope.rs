//! A request's entry, and the context the request's handler runs in.
//!
//! Resources the handler enters (annotated functions, manual entries) nest under the request's entry and
//! inherit its origin; the request's entry never changes the context of the worker threads it visits. An
//! owned entry never installs itself in a thread's context ([`Resource::entry_owned`](crate::Resource)), and
//! [`Entry::in_scope`] runs the handler's work (creating, polling and dropping its future) with the entry as
//! the innermost entry of the thread's context, put back afterwards. This is the one place the layer
//! depends on how entries and contexts meet.

use crate::{BlockError, Entry, EntryBuilder};

/// The entry of one request. Dropping it exits the entry (without an error unless one was marked),
/// wherever it is dropped.
#[derive(Debug)]
pub(crate) struct RequestEntry {
    entry: Entry<'static>,
}

impl RequestEntry {
    /// Runs the checks for the request; a queueing wait is not slept (see [`Entry::waited`]). The request
    /// joins the context active where the service is called (none on a server's workers).
    pub(crate) fn enter(builder: EntryBuilder<'static, '_>) -> Result<RequestEntry, BlockError> {
        Ok(RequestEntry { entry: builder.decide()? })
    }

    /// Runs `f` (creating, polling or dropping the handler's future) with the request's entry as the
    /// innermost entry of the thread's context: resources entered in it are its children, with its origin.
    #[inline]
    pub(crate) fn in_scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.entry.in_scope(f)
    }

    /// [`in_scope`](Self::in_scope) as a guard: the request's entry is the innermost one until it drops.
    #[inline(always)]
    pub(crate) fn scope(&self) -> Option<crate::entry::ScopeRestore> {
        self.entry.scope()
    }

    /// The entry.
    pub(crate) fn entry_mut(&mut self) -> &mut Entry<'static> {
        &mut self.entry
    }

    /// Whether the queueing rules ask the call to wait before it runs (cheaper than testing
    /// [`wait`](Self::wait) for zero).
    #[inline(always)]
    pub(crate) fn waits(&self) -> bool {
        self.entry.waits()
    }

    /// How long the queueing rules ask the call to wait before it runs.
    pub(crate) fn wait(&self) -> std::time::Duration {
        self.entry.waited()
    }
}
