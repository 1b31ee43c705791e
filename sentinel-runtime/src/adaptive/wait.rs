//! The bounded LIFO wait for a permit (Netflix's blocking limiter, newest first under overload), on a timer:
//! an async caller's future sleeps on the engine clock's timer and never blocks an executor's worker; a sync
//! caller blocks its own thread on the same future.
//!
//! Waiters sit in a deque under a mutex that only the slow path takes (a call that found no room, a release
//! that sees waiters). A freed place goes to the newest waiter that may take it (for partitions: the newest
//! waiter of a partition that has room). When the queue is full, the oldest waiter is refused: under
//! overload the newest callers are the ones still likely to be waited for by their own callers.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{
    AtomicU32, AtomicU8, AtomicUsize,
    Ordering::{Acquire as Acq, Release as Rel, SeqCst},
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;

use super::permit::{AdaptiveBlock, AdaptiveBlockReason, PartitionId, Permit};
use crate::clock::{EngineClock, Sleep};

/// What the wait needs of a limiter: taking and giving back places, the numbers of a refusal, its queue and
/// its longest wait. The limiter implements it; the wait knows no more of it.
pub(crate) trait Admission {
    /// Takes a place if there is room (never waits).
    fn try_acquire(&self, partition: Option<PartitionId>) -> Option<Permit>;
    /// Gives back a place whose call never ran.
    fn cancel(&self, permit: Permit);
    /// The numbers of a refusal.
    fn blocked(&self, reason: AdaptiveBlockReason) -> AdaptiveBlock;
    /// The queue of waiting calls.
    fn queue(&self) -> &WaitQueue;
    /// The longest a call may wait, in nanoseconds (0: it never waits).
    fn max_wait_nanos(&self) -> u64;
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
    fn max_wait_nanos(&self) -> u64 {
        (**self).max_wait_nanos()
    }
}

const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const DISPLACED: u8 = 2;

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
}

impl WaitQueue {
    pub(crate) fn new(bound: usize) -> Self {
        WaitQueue { len: AtomicUsize::new(0), bound: bound.max(1), waiters: Mutex::new(VecDeque::new()) }
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
        if q.len() >= self.bound {
            if let Some(oldest) = q.pop_front() {
                self.len.fetch_sub(1, SeqCst);
                oldest.state.store(DISPLACED, Rel);
                oldest.waker.wake();
            }
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

/// A call waiting for a permit: resolves to the permit, or to [`AdaptiveBlock`] when the wait runs out or newer
/// calls displace it. Dropping it gives back a permit granted in the meantime. It holds the limiter as `L`:
/// a reference, or an owned handle for a wait that must outlive the caller's borrow (an async entry's).
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub(crate) struct WaitForPermit<L: Admission> {
    limiter: L,
    state: AcquireState,
}

#[derive(Debug)]
enum AcquireState {
    Ready(Result<Permit, AdaptiveBlock>),
    Waiting { waiter: Arc<Waiter>, sleep: Sleep },
    Done,
}

impl<L: Admission> WaitForPermit<L> {
    /// Takes a permit, waiting up to the limiter's longest wait on `clock`'s timer when the limit is reached.
    pub(crate) fn start(limiter: L, partition: Option<PartitionId>, clock: &EngineClock) -> Self {
        let state = match limiter.try_acquire(partition) {
            Some(p) => AcquireState::Ready(Ok(p)),
            None if limiter.max_wait_nanos() == 0 => {
                AcquireState::Ready(Err(limiter.blocked(AdaptiveBlockReason::AtLimit)))
            }
            None => match limiter.queue().enqueue(&limiter, partition) {
                Ok(p) => AcquireState::Ready(Ok(p)),
                Err(waiter) => AcquireState::Waiting {
                    waiter,
                    sleep: Sleep::new(clock, Duration::from_nanos(limiter.max_wait_nanos())),
                },
            },
        };
        WaitForPermit { limiter, state }
    }
}

impl<L: Admission + Unpin> Future for WaitForPermit<L> {
    type Output = Result<Permit, AdaptiveBlock>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let limiter = &this.limiter;
        match std::mem::replace(&mut this.state, AcquireState::Done) {
            AcquireState::Ready(r) => Poll::Ready(r),
            AcquireState::Done => Poll::Ready(Err(limiter.blocked(AdaptiveBlockReason::WaitTimedOut))),
            AcquireState::Waiting { waiter, mut sleep } => {
                waiter.waker.register(cx.waker());
                match waiter.state.load(Acq) {
                    GRANTED => return Poll::Ready(Ok(waiter.permit())),
                    DISPLACED => return Poll::Ready(Err(limiter.blocked(AdaptiveBlockReason::Displaced))),
                    _ => {}
                }
                if Pin::new(&mut sleep).poll(cx).is_pending() {
                    this.state = AcquireState::Waiting { waiter, sleep };
                    return Poll::Pending;
                }
                if limiter.queue().remove(&waiter) {
                    return Poll::Ready(Err(limiter.blocked(AdaptiveBlockReason::WaitTimedOut)));
                }
                // Granted or displaced between the check and the removal: the state is final now.
                Poll::Ready(match waiter.state.load(Acq) {
                    GRANTED => Ok(waiter.permit()),
                    _ => Err(limiter.blocked(AdaptiveBlockReason::Displaced)),
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
