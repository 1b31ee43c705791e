//! A request's entry, and the context the request's handler runs in.
//!
//! Resources the handler enters (annotated functions, manual entries) nest under the request's entry and
//! inherit its origin; the request's entry never changes the context of the worker threads it visits. An
//! owned entry never installs itself in a thread's context ([`Resource::entry_owned`](crate::Resource)), and
//! [`Entry::in_scope`] runs the handler's work (creating, polling and dropping its future) with the entry as
//! the innermost entry of the thread's context, put back afterwards. This is the one place the layer
//! depends on how entries and contexts meet.

use super::rate_limit::PassedFields;
use crate::Entry;
#[cfg(doc)]
use crate::EntryBuilder;

/// The entry of one request. Dropping it exits the entry (without an error unless one was marked),
/// wherever it is dropped.
#[derive(Debug)]
pub(crate) struct RequestEntry {
    /// What only some layers have (gateway mode's API groups, RateLimit header fields), boxed so that a
    /// plain request's entry, moved into its future and body, is one word larger than the entry. Declared
    /// first: the API groups' entries exit before the route's.
    extra: Option<Box<Extra>>,
    entry: Entry<'static>,
}

/// The entries of the API groups a request belongs to (gateway mode), in definition order: the first one in
/// place, so that a request in one group allocates only its [`Extra`]'s box.
pub(crate) type ApiEntries = smallvec::SmallVec<[Entry<'static>; 1]>;

#[derive(Debug, Default)]
pub(crate) struct Extra {
    /// The entries of the API groups the request belongs to (gateway mode).
    apis: ApiEntries,
    /// The RateLimit header fields for the response, when the layer writes them.
    headers: Option<PassedFields>,
}

impl RequestEntry {
    /// The request's entry, decided by [`EntryBuilder::decide`] (a queueing wait is not slept, see
    /// [`Entry::waited`]; the request joins the context active where the service is called, none on a
    /// server's workers), with what only some layers have ([`Extras`]), put together where the entry is kept
    /// (until then the entry travels alone: 128 bytes, moved in registers rather than copied).
    #[inline(always)]
    pub(crate) fn with(entry: Entry<'static>, extra: Extras) -> RequestEntry {
        RequestEntry { extra: extra.0, entry }
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

    /// Sets the header fields the response gets.
    pub(crate) fn set_headers(&mut self, headers: Option<PassedFields>) {
        Extras::put_headers(&mut self.extra, headers);
    }

    /// The header fields the response gets (once).
    #[inline]
    pub(crate) fn take_headers(&mut self) -> Option<PassedFields> {
        self.extra.as_mut().and_then(|x| x.headers.take())
    }

    /// The API groups' entries (gateway mode; none otherwise).
    fn apis(&mut self) -> &mut [Entry<'static>] {
        self.extra.as_mut().map_or(&mut [], |x| &mut x.apis[..])
    }

    /// The service is called: until its answer comes ([`answered`](Self::answered)), an exit is a request
    /// whose client went away (its future dropped), which an adaptive limit does not sample.
    #[inline(always)]
    pub(crate) fn awaits_answer(&mut self) {
        self.entry.awaits_answer();
        self.apis().iter_mut().for_each(Entry::awaits_answer);
    }

    /// The service answered (or failed).
    #[inline(always)]
    pub(crate) fn answered(&mut self) {
        self.entry.answered();
        self.apis().iter_mut().for_each(Entry::answered);
    }

    /// Counts the request as an error (on its route and its API groups).
    pub(crate) fn set_error(&mut self) {
        self.entry.set_error();
        self.apis().iter_mut().for_each(Entry::set_error);
    }

    /// Marks the request as failed by overload (a 429 or 503 answer; on its route and its API groups) for
    /// adaptive rules, without counting an error (the layer's predicate decides that).
    pub(crate) fn mark_overload(&mut self) {
        self.entry.mark_overload();
        self.apis().iter_mut().for_each(Entry::mark_overload);
    }

    /// Judges how the request ended: an error when `error` (the layer's predicate, `trace_if`, default
    /// [`is_error_by_default`](super::is_error_by_default), said so of `outcome`), and an overload for adaptive
    /// rules when the answer is one ([`is_overload`](super::is_overload)). An overload is no error unless the
    /// predicate counts it.
    pub(crate) fn judge(&mut self, error: bool, outcome: super::Outcome) {
        if error {
            self.set_error();
        }
        if super::is_overload(outcome) {
            self.mark_overload();
        }
    }

    /// Counts the request as timed out after `limit` (on its route and its API groups).
    pub(crate) fn set_timed_out(&mut self, limit: std::time::Duration) {
        self.entry.set_timed_out(limit);
        self.apis().iter_mut().for_each(|e| e.set_timed_out(limit));
    }

    /// The request's queueing wait is over: its entries record their passes at their turn
    /// ([`Entry::at_turn`]).
    pub(crate) fn at_turn(&mut self) {
        self.entry.at_turn();
        self.apis().iter_mut().for_each(Entry::at_turn);
    }

    /// Whether the queueing rules ask the call to wait before it runs (cheaper than testing
    /// [`wait`](Self::wait) for zero).
    #[inline(always)]
    pub(crate) fn waits(&self) -> bool {
        self.entry.waits() || self.extra.as_ref().is_some_and(|x| x.apis.iter().any(Entry::waits))
    }

    /// How long the queueing rules ask the call to wait before it runs: the longest of its entries' waits,
    /// which every entry then counts as its own (the request waits it before it runs, whichever entry asked:
    /// an adaptive limit on one of them measures the service's time after it).
    pub(crate) fn wait(&mut self) -> std::time::Duration {
        let apis = self.extra.as_mut().map_or(&mut [][..], |x| &mut x.apis[..]);
        let wait = apis.iter().map(Entry::waited).fold(self.entry.waited(), std::cmp::max);
        apis.iter_mut().for_each(|e| e.waits_for(wait));
        self.entry.waits_for(wait);
        wait
    }
}

/// What a request's entry has besides the route's entry in some layers (gateway mode's API groups, RateLimit
/// header fields): nothing (no allocation) in a plain layer.
#[derive(Debug, Default)]
pub(crate) struct Extras(Option<Box<Extra>>);

impl Extras {
    /// The entries of the API groups the request belongs to (gateway mode).
    pub(crate) fn set_apis(&mut self, apis: ApiEntries) {
        if !apis.is_empty() {
            self.0.get_or_insert_with(Box::default).apis = apis;
        }
    }

    /// The header fields the response gets.
    pub(crate) fn set_headers(&mut self, headers: Option<PassedFields>) {
        Self::put_headers(&mut self.0, headers);
    }

    fn put_headers(extra: &mut Option<Box<Extra>>, headers: Option<PassedFields>) {
        match (extra, headers) {
            (Some(extra), headers) => extra.headers = headers,
            (extra @ None, Some(headers)) => {
                *extra = Some(Box::new(Extra { apis: ApiEntries::new(), headers: Some(headers) }))
            }
            (None, None) => {}
        }
    }

    /// Whether an API group's queueing rules ask the call to wait.
    #[inline(always)]
    pub(crate) fn waits(&self) -> bool {
        self.0.as_ref().is_some_and(|x| x.apis.iter().any(Entry::waits))
    }
}
