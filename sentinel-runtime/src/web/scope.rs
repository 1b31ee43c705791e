//! A request's entry, and the context the request's handler runs in.
//!
//! Resources the handler enters (annotated functions) must nest under the request's entry and inherit its
//! origin, and the request's entry must never change the context of the worker threads it visits. The core
//! gives that with `Entry::instrument` / `Entry::in_scope` (owned entries that never touch a thread's
//! context); until those land, this module carries the request's context in a [`CarriedContext`] (as the
//! macro's futures do) and installs it only while it runs the handler, enters or exits. This is the one
//! place the layer depends on how entries and contexts meet.

use crate::context::CarriedContext;
use crate::{BlockError, Entry, EntryBuilder};

/// The entry of one request, with the context its handler runs in. Dropping it exits the entry (without an
/// error unless one was marked), wherever it is dropped.
pub(crate) struct RequestEntry {
    entry: Option<Entry<'static>>,
    context: CarriedContext,
}

impl RequestEntry {
    /// Runs the checks for the request (a queueing wait is not slept: see [`Entry::waited`]).
    pub(crate) fn enter(builder: EntryBuilder<'static, '_>) -> Result<RequestEntry, BlockError> {
        // The request joins the context active where the service is called (none on a server's workers).
        let mut context = CarriedContext::capture();
        let entry = context.scope(|| builder.decide())?;
        Ok(RequestEntry { entry: Some(entry), context })
    }

    /// Runs `f` (creating or polling the handler's future) as the request's context: resources entered in
    /// it are children of the request's entry, with its origin.
    #[inline]
    pub(crate) fn in_scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.context.scope(f)
    }

    /// The entry (present until drop).
    pub(crate) fn entry_mut(&mut self) -> Option<&mut Entry<'static>> {
        self.entry.as_mut()
    }

    /// How long the queueing rules ask the call to wait before it runs.
    pub(crate) fn wait(&self) -> std::time::Duration {
        self.entry.as_ref().map_or(std::time::Duration::ZERO, Entry::waited)
    }
}

impl Drop for RequestEntry {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            // Exit as the innermost entry of the request's own context, so no thread's context changes.
            self.context.scope(move || drop(entry));
        }
    }
}

impl std::fmt::Debug for RequestEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestEntry").field("entry", &self.entry).finish()
    }
}
