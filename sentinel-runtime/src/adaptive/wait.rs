//! The bounded LIFO wait for a permit (Netflix's blocking limiter, newest first under overload), on a timer:
//! an async caller's future sleeps on the engine clock's timer and never blocks an executor's worker; a sync
//! caller blocks its own thread on the same future.
//!
//! Waiters sit in a deque under a mutex that only the slow path takes (a call that found no room, a release
//! that sees waiters). A freed place goes to the newest waiter that may take it (for partitions: the newest
//! waiter of a partition that has room). When the queue is full, the oldest waiter is refused: under
//! overload the newest callers are the ones still likely to be waited for by their own callers.
//!
//! A queue whose limiter went out of force (a changed rule replaced it, or its rule went) is retired
//! ([`WaitQueue::retire`]): its waiters are woken at once with [`WaitEnd::Retired`], and a call that comes
//! to wait on it later gets the same answer without waiting, so that no call waits on a limiter nobody gives
//! places back to.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU8, AtomicUsize,
    Ordering::{Acquire as Acq, Relaxed, Release as Rel, SeqCst},
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;

use super::permit::{AdaptiveBlock, AdaptiveBlockReason, PartitionId, Permit};
use crate::clock::{EngineClock, Sleep};

/// What the wait needs of a limiter: taking and giving back places, the numbers of a refusal and its queue
/// (how long to wait is the caller's). The limiter implements it; the wait knows no more of it.
pub(crate) trait Admission {
    /// Takes a place if there is room (never waits).
    fn try_acquire(&self, partition: Option<PartitionId>) -> Option<Permit>;
    /// Gives back a place whose call never ran.
    fn cancel(&self, permit: Permit);
    /// The numbers of a refusal.
    fn blocked(&self, reason: AdaptiveBlockReason) -> AdaptiveBlock;
    /// The queue of waiting calls.
    fn queue(&self) -> &WaitQueue;
}

impl<A: Admission + ?Sized> Admission for &A {
    fn try_acquire(&self, partition: Option<PartitionId>) -> Option<Permit> {
        (**self).try_acquire(partition)
    }
    fn cancel(&self, permit: Permit) {
        (**self).cancel(permit)
    }
    fn blocked(&self, reason: AdaptiveBlockReason) -> AdaptiveBlock {
        (**self).blocked(reason)
    }
    fn queue(&self) -> &WaitQueue {
        (**self).queue()
    }
}

const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const DISPLACED: u8 = 2;
const RETIRED: u8 = 3;

/// How a wait for a permit ended without one.
#[derive(Debug)]
pub(crate) enum WaitEnd {
    /// Refused: the wait ran out, newer callers displaced it, or the rule lets no call wait.
    Refused(AdaptiveBlock),
    /// The limiter went out of force (see [`WaitQueue::retire`]): the call is to be decided again against
    /// the rules in force.
    Retired,
}

impl WaitEnd {
    /// The refusal, with `limiter`'s numbers for a retired wait (for callers that only refuse).
    #[cfg(test)]
    pub(crate) fn into_block(self, limiter: &impl Admission) -> AdaptiveBlock {
        match self {
            WaitEnd::Refused(block) => block,
            WaitEnd::Retired => limiter.blocked(AdaptiveBlockReason::WaitTimedOut),
        }
    }
}

/// One waiting call.
#[derive(Debug)]
pub(crate) struct Waiter {
    partition: Option<PartitionId>,
    state: AtomicU8,
    /// The granted permit's in-flight count and epoch (valid once `state` is `GRANTED`).
    inflight: AtomicU32,
    epoch: AtomicU32,
    waker: AtomicWaker,
}

/// The waiting calls, oldest first.
#[derive(Debug)]
pub(crate) struct WaitQueue {
    len: AtomicUsize,
    bound: usize,
    waiters: Mutex<VecDeque<Arc<Waiter>>>,
    /// Set once, under the lock, when the limiter goes out of force; read under the lock.
    retired: AtomicBool,
}

impl WaitQueue {
    pub(crate) fn new(bound: usize) -> Self {
        WaitQueue {
            len: AtomicUsize::new(0),
            bound: bound.max(1),
            waiters: Mutex::new(VecDeque::new()),
            retired: AtomicBool::new(false),
        }
    }

    /// The limiter went out of force: every waiter is woken with [`WaitEnd::Retired`] (to be decided again
    /// against the rules in force, within what is left of its wait), and a call that comes to wait later is
    /// answered so at once. Idempotent.
    #[cold]
    pub(crate) fn retire(&self) {
        let mut q = self.lock();
        self.retired.store(true, Relaxed);
        for w in q.drain(..) {
            self.len.fetch_sub(1, SeqCst);
            w.state.store(RETIRED, Rel);
            w.waker.wake();
        }
    }

    /// Waiting calls (a `SeqCst` read: see the limiter's proof sketch).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Waiter>>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands freed places to waiters, newest first: for each partition (and the shared pool) the newest
    /// waiter is offered a place; a partition with no room is skipped.
    pub(crate) fn grant(&self, limiter: &impl Admission) {
        let mut q = self.lock();
        // Partitions (bit 0..64) and "no partition" (bit 64) already found without room.
        let mut full: u128 = 0;
        let mut i = q.len();
        while i > 0 {
            i -= 1;
            let bit = 1u128 << q[i].partition.map_or(64, |p| u32::from(p.0));
            if full & bit != 0 {
                continue;
            }
            match limiter.try_acquire(q[i].partition) {
                Some(permit) => {
                    if let Some(w) = q.remove(i) {
                        self.len.fetch_sub(1, SeqCst);
                        // The waiter now owns the permit: it rebuilds it from `partition` and `inflight`.
                        let Permit { inflight, epoch, .. } = permit;
                        w.inflight.store(inflight, Rel);
                        w.epoch.store(epoch, Rel);
                        w.state.store(GRANTED, Rel);
                        w.waker.wake();
                    }
                }
                None => full |= bit,
            }
        }
    }

    /// Enqueues a waiter (refusing the oldest if full), then retries once so that a place freed since the
    /// caller's failed attempt is not missed.
    fn enqueue(&self, limiter: &impl Admission, partition: Option<PartitionId>) -> Result<Permit, Arc<Waiter>> {
        let w = Arc::new(Waiter {
            partition,
            state: AtomicU8::new(WAITING),
            inflight: AtomicU32::new(0),
            epoch: AtomicU32::new(0),
            waker: AtomicWaker::new(),
        });
        let mut q = self.lock();
        if self.retired.load(Relaxed) {
            // Not queued: the wait ends at its first poll.
            w.state.store(RETIRED, Rel);
            return Err(w);
        }
        if q.len() >= self.bound
            && let Some(oldest) = q.pop_front()
        {
            self.len.fetch_sub(1, SeqCst);
            oldest.state.store(DISPLACED, Rel);
            oldest.waker.wake();
        }
        q.push_back(w.clone());
        self.len.fetch_add(1, SeqCst);
        if let Some(permit) = limiter.try_acquire(partition) {
            q.pop_back();
            self.len.fetch_sub(1, SeqCst);
            return Ok(permit);
        }
        Err(w)
    }

    /// Takes `w` out of the queue if it is still there; `false` if a grant or displacement came first.
    fn remove(&self, w: &Arc<Waiter>) -> bool {
        let mut q = self.lock();
        match q.iter().position(|x| Arc::ptr_eq(x, w)) {
            Some(i) => {
                q.remove(i);
                self.len.fetch_sub(1, SeqCst);
                true
            }
            None => false,
        }
    }
}

impl Waiter {
    fn permit(&self) -> Permit {
        Permit { partition: self.partition, inflight: self.inflight.load(Acq), epoch: self.epoch.load(Acq) }
    }
}

/// A call waiting for a permit: resolves to the permit, or to [`WaitEnd::Refused`] when the wait runs out or
/// newer calls displace it, or to [`WaitEnd::Retired`] when the limiter goes out of force meanwhile. Dropping
/// it gives back a permit granted in the meantime. It holds the limiter as `L`:
/// a reference, or an owned handle for a wait that must outlive the caller's borrow (an async entry's).
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub(crate) struct WaitForPermit<L: Admission> {
    limiter: L,
    state: AcquireState,
}

#[derive(Debug)]
enum AcquireState {
    Ready(Result<Permit, WaitEnd>),
    Waiting { waiter: Arc<Waiter>, sleep: Sleep },
    Done,
}

impl<L: Admission> WaitForPermit<L> {
    /// Takes a permit, waiting up to `wait_nanos` on `clock`'s timer when the limit is reached (0: refused
    /// at once).
    pub(crate) fn start(limiter: L, partition: Option<PartitionId>, clock: &EngineClock, wait_nanos: u64) -> Self {
        let state = match limiter.try_acquire(partition) {
            Some(p) => AcquireState::Ready(Ok(p)),
            None if wait_nanos == 0 => {
                AcquireState::Ready(Err(WaitEnd::Refused(limiter.blocked(AdaptiveBlockReason::AtLimit))))
            }
            None => match limiter.queue().enqueue(&limiter, partition) {
                Ok(p) => AcquireState::Ready(Ok(p)),
                Err(waiter) => {
                    AcquireState::Waiting { waiter, sleep: Sleep::new(clock, Duration::from_nanos(wait_nanos)) }
                }
            },
        };
        WaitForPermit { limiter, state }
    }
}

impl<L: Admission + Unpin> Future for WaitForPermit<L> {
    type Output = Result<Permit, WaitEnd>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let limiter = &this.limiter;
        let refused = |reason| Err(WaitEnd::Refused(limiter.blocked(reason)));
        match std::mem::replace(&mut this.state, AcquireState::Done) {
            AcquireState::Ready(r) => Poll::Ready(r),
            AcquireState::Done => Poll::Ready(refused(AdaptiveBlockReason::WaitTimedOut)),
            AcquireState::Waiting { waiter, mut sleep } => {
                waiter.waker.register(cx.waker());
                match waiter.state.load(Acq) {
                    GRANTED => return Poll::Ready(Ok(waiter.permit())),
                    DISPLACED => return Poll::Ready(refused(AdaptiveBlockReason::Displaced)),
                    RETIRED => return Poll::Ready(Err(WaitEnd::Retired)),
                    _ => {}
                }
                if Pin::new(&mut sleep).poll(cx).is_pending() {
                    this.state = AcquireState::Waiting { waiter, sleep };
                    return Poll::Pending;
                }
                if limiter.queue().remove(&waiter) {
                    return Poll::Ready(refused(AdaptiveBlockReason::WaitTimedOut));
                }
                // Granted, displaced or retired between the check and the removal: the state is final now.
                Poll::Ready(match waiter.state.load(Acq) {
                    GRANTED => Ok(waiter.permit()),
                    RETIRED => Err(WaitEnd::Retired),
                    _ => refused(AdaptiveBlockReason::Displaced),
                })
            }
        }
    }
}

impl<L: Admission> Drop for WaitForPermit<L> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, AcquireState::Done) {
            AcquireState::Waiting { waiter, .. } => {
                if !self.limiter.queue().remove(&waiter) && waiter.state.load(Acq) == GRANTED {
                    // Cancelled after a grant it never saw: the place goes back.
                    self.limiter.cancel(waiter.permit());
                }
            }
            AcquireState::Ready(Ok(permit)) => self.limiter.cancel(permit),
            AcquireState::Ready(Err(_)) | AcquireState::Done => {}
        }
    }
}
