//! Whether and how a call may wait, and the one mechanism every wait goes through.
//!
//! A check that refuses a call which may wait (a cluster rule whose lease is empty, an adaptive rule with
//! `maxWaitMs` at its limit) leaves one [`Pending`] wait for the entry path ([`ask`]) and refuses the call.
//! The entry path takes it ([`take_pending`]) outside the rules' read section: a sync caller blocks its
//! thread on it, an async one awaits it (never blocking an executor's worker); then the checks run again
//! inside a [`RetryScope`], which hands them what the wait got ([`Grant`]: a place kept for this call) or
//! tells them that the wait ended without one ([`RetryScope::ended`]), so that they refuse rather than wait
//! again. A grant the checks do not take (the caller's future was dropped, an earlier slot refused the call
//! this time) goes back when it drops.
//!
//! Also here: the kind of wait a caller allows ([`Wait`]), the deadline of a cluster wait under way
//! ([`DeadlineScope`]) and the clock cluster waits run on ([`mono_nanos`]).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

/// Whether (and how) a call whose lease is empty waits for the token service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It does not wait: decided by the local fallback at once ([`EntryBuilder::decide`]).
    ///
    /// [`EntryBuilder::decide`]: crate::EntryBuilder::decide
    Now,
    /// It blocks its thread until the deadline ([`mono_nanos`]; 0: not waited yet).
    Blocking(u64),
    /// It awaits (the caller retries after `take_pending`'s wait completes), until the deadline (0: not
    /// waited yet).
    Async(u64),
}

const MODE_BLOCKING: u8 = 0;
const MODE_NOW: u8 = 1;
const MODE_ASYNC: u8 = 2;

impl Wait {
    /// The kind of wait as one byte (blocking is 0), without the deadline.
    #[inline(always)]
    pub(crate) fn mode(self) -> u8 {
        match self {
            Wait::Blocking(_) => MODE_BLOCKING,
            Wait::Now => MODE_NOW,
            Wait::Async(_) => MODE_ASYNC,
        }
    }
    /// The deadline of a wait under way (0: none).
    #[inline(always)]
    pub(crate) fn deadline(self) -> u64 {
        match self {
            Wait::Blocking(d) | Wait::Async(d) => d,
            Wait::Now => 0,
        }
    }
    /// The wait of [`mode`](Self::mode) `m` (its deadline is in [`DeadlineScope`]).
    #[inline(always)]
    pub(crate) fn of_mode(m: u8) -> Wait {
        match m {
            MODE_NOW => Wait::Now,
            MODE_ASYNC => Wait::Async(0),
            _ => Wait::Blocking(0),
        }
    }
}

thread_local! {
    static DEADLINE: Cell<u64> = const { Cell::new(0) };
}

/// The deadline of the wait a call decides again after (0: none), for the checks made meanwhile on this
/// thread: set for the scope of one decision, read only on a cluster rule's slow path.
pub(crate) struct DeadlineScope(bool);

impl DeadlineScope {
    /// Sets `deadline` for the scope (nothing when 0: the common case costs one compare).
    #[inline(always)]
    pub(crate) fn enter(deadline: u64) -> DeadlineScope {
        if deadline != 0 {
            Self::set(deadline);
        }
        DeadlineScope(deadline != 0)
    }
    #[cold]
    fn set(deadline: u64) {
        let _ = DEADLINE.try_with(|c| c.set(deadline));
    }
    /// The deadline set for this thread now (0: none).
    pub(crate) fn current() -> u64 {
        DEADLINE.try_with(Cell::get).unwrap_or(0)
    }
}

impl Drop for DeadlineScope {
    #[inline(always)]
    fn drop(&mut self) {
        if self.0 {
            Self::set(0);
        }
    }
}

/// Nanoseconds on a monotonic clock of the process (never 0). Calls wait for a token service in real time
/// whatever the engine's clock: the service (and the shared limit's time) runs in real time.
pub(crate) fn mono_nanos() -> u64 {
    static ANCHOR: OnceLock<std::time::Instant> = OnceLock::new();
    let anchor = *ANCHOR.get_or_init(std::time::Instant::now);
    u64::try_from(anchor.elapsed().as_nanos()).unwrap_or(u64::MAX).saturating_add(1)
}

/// A wait a check asked for: what the call waits on, outside the rules' read section, before it is decided
/// again. Made by the rule kind that refused the call; the entry path knows only this.
pub(crate) trait PendingWait: Send {
    /// The deadline (on [`mono_nanos`]) the decision made after the wait keeps in its [`DeadlineScope`]
    /// (0: none).
    fn deadline(&self) -> u64 {
        0
    }
    /// Blocks the thread until the wait ends (for sync callers).
    fn wait_blocking(self: Box<Self>) -> Waited {
        futures::executor::block_on(self.wait_async())
    }
    /// Awaits the end of the wait without blocking the thread (for async callers). Dropping the future gives
    /// back whatever it got meanwhile.
    fn wait_async(self: Box<Self>) -> Pin<Box<dyn Future<Output = Waited> + Send>>;
}

/// How a wait ended: the call is decided again, holding what the wait got.
#[derive(Default)]
pub(crate) struct Waited {
    /// A place the wait got for the call (the check that asked takes it).
    pub(crate) grant: Option<Grant>,
    /// Nonzero: the wait ended without a place, for a reason the kind that asked defines; the decision made
    /// again refuses rather than waits again.
    pub(crate) ended: u8,
}

/// A place a wait got and kept for its call. Its value's `Drop` gives the place back, so a grant nobody took
/// is never lost; the check that takes it ([`take_grant`]) disarms it.
pub(crate) struct Grant(Box<dyn Any + Send>);

impl Grant {
    /// A grant holding `place`.
    pub(crate) fn new<T: Any + Send>(place: T) -> Self {
        Grant(Box::new(place))
    }
}

/// One wait asked for by a check: see the module's documentation.
pub(crate) struct Pending(Box<dyn PendingWait>);

impl Pending {
    /// The wait `w`.
    #[cold]
    pub(crate) fn new(w: impl PendingWait + 'static) -> Self {
        Pending(Box::new(w))
    }
    /// The deadline the decision after the wait keeps ([`PendingWait::deadline`]).
    pub(crate) fn deadline(&self) -> u64 {
        self.0.deadline()
    }
    /// Blocks the thread until the wait ends.
    pub(crate) fn wait_blocking(self) -> Waited {
        self.0.wait_blocking()
    }
    /// Awaits the end of the wait.
    pub(crate) fn wait_async(self) -> Pin<Box<dyn Future<Output = Waited> + Send>> {
        self.0.wait_async()
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("deadline", &self.deadline()).finish_non_exhaustive()
    }
}

thread_local! {
    static PENDING: Cell<Option<Pending>> = const { Cell::new(None) };
    static RETRY: RefCell<(Option<Grant>, u8)> = const { RefCell::new((None, 0)) };
}

/// For a check that refuses a call which may wait: the wait the entry path takes (replacing any other).
#[cold]
pub(crate) fn ask(p: Pending) {
    let _ = PENDING.try_with(|c| c.set(Some(p)));
}

/// Whether a check on this thread asked for a wait the entry path has not taken yet: the call refused now
/// waits, then is decided again.
#[cold]
pub(crate) fn is_pending() -> bool {
    PENDING
        .try_with(|c| {
            let p = c.take();
            let asked = p.is_some();
            c.set(p);
            asked
        })
        .unwrap_or(false)
}

/// The wait a check on this thread just asked for (taken: asking again returns `None`).
#[cold]
pub(crate) fn take_pending() -> Option<Pending> {
    PENDING.try_with(Cell::take).ok().flatten()
}

/// The decision made again after a wait: what the wait got is offered to the checks for its scope; a grant
/// left untaken goes back when the scope ends. Scopes nest (a check's user code may enter another resource
/// that waits): the outer scope's offer is put back when the inner one ends.
pub(crate) struct RetryScope(Option<(Option<Grant>, u8)>);

impl RetryScope {
    /// Offers what `waited` got to the checks run on this thread until the scope drops.
    #[cold]
    pub(crate) fn enter(waited: Waited) -> RetryScope {
        let offer = (waited.grant, waited.ended);
        RetryScope(RETRY.try_with(|r| std::mem::replace(&mut *r.borrow_mut(), offer)).ok())
    }
    /// Why the wait of the call decided now ended without a place (0: it did not, or there was none).
    #[cold]
    pub(crate) fn ended() -> u8 {
        RETRY.try_with(|r| r.borrow().1).unwrap_or(0)
    }
}

impl Drop for RetryScope {
    fn drop(&mut self) {
        let outer = self.0.take().unwrap_or_default();
        // Taken out before it drops: the place's `Drop` may wake other waiters.
        let left = RETRY.try_with(|r| std::mem::replace(&mut *r.borrow_mut(), outer)).ok();
        drop(left);
    }
}

/// The grant offered to this decision, if it is a `T` that `mine` accepts (taken: offered once).
#[cold]
pub(crate) fn take_grant<T: Any + Send>(mine: impl FnOnce(&T) -> bool) -> Option<T> {
    RETRY
        .try_with(|r| {
            let mut r = r.borrow_mut();
            match r.0.take() {
                Some(Grant(g)) if g.downcast_ref::<T>().is_some_and(mine) => g.downcast::<T>().ok().map(|b| *b),
                other => {
                    r.0 = other;
                    None
                }
            }
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// A place that counts how often it was given back.
    struct Place(u32, Arc<AtomicU32>);
    impl Drop for Place {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn offer(id: u32, returned: &Arc<AtomicU32>) -> Waited {
        Waited { grant: Some(Grant::new(Place(id, returned.clone()))), ended: 0 }
    }

    #[test]
    fn a_grant_nobody_takes_goes_back_once_and_a_taken_one_is_the_takers() {
        let returned = Arc::new(AtomicU32::new(0));
        drop(RetryScope::enter(offer(1, &returned)));
        assert_eq!(returned.load(Ordering::SeqCst), 1, "untaken: given back when the scope ends");
        let scope = RetryScope::enter(offer(2, &returned));
        assert!(take_grant::<Place>(|p| p.0 == 3).is_none(), "not the taker's");
        let taken = take_grant::<Place>(|p| p.0 == 2).expect("offered");
        assert!(take_grant::<Place>(|_| true).is_none(), "offered once");
        drop(scope);
        assert_eq!(returned.load(Ordering::SeqCst), 1, "the scope gives back nothing it no longer holds");
        drop(taken);
        assert_eq!(returned.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_nested_retry_puts_the_outer_offer_back_when_it_ends() {
        let returned = Arc::new(AtomicU32::new(0));
        let outer = RetryScope::enter(Waited { grant: Some(Grant::new(Place(1, returned.clone()))), ended: 0 });
        {
            let _inner = RetryScope::enter(Waited { grant: None, ended: 2 });
            assert_eq!(RetryScope::ended(), 2);
            assert!(take_grant::<Place>(|_| true).is_none(), "the outer offer is not the inner decision's");
        }
        assert_eq!((RetryScope::ended(), returned.load(Ordering::SeqCst)), (0, 0));
        assert_eq!(take_grant::<Place>(|_| true).map(|p| p.0), Some(1));
        drop(outer);
        assert_eq!(RetryScope::ended(), 0);
    }
}
