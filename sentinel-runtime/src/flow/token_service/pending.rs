//! The wait of a call whose cluster rule's lease is empty: blocking its thread or awaiting, until the lease
//! changes or the deadline passes.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::RuleLease;
use crate::wait::mono_nanos;

/// A call that found its lease empty and waits for the token service.
pub(crate) struct Pending {
    pub(super) lease: Arc<RuleLease>,
    pub(super) deadline_nanos: u64,
    pub(super) version: u64,
}

thread_local! {
    static PENDING: Cell<Option<Pending>> = const { Cell::new(None) };
}

/// Leaves the wait a check asked for, for the entry path to take.
pub(super) fn set_pending(p: Pending) {
    PENDING.with(|c| c.set(Some(p)));
}

/// Whether a check on this thread asked for a wait not taken yet.
pub(crate) fn has_pending() -> bool {
    PENDING
        .try_with(|c| {
            let p = c.take();
            let some = p.is_some();
            c.set(p);
            some
        })
        .unwrap_or(false)
}

/// The wait a check on this thread just asked for (taken: asking again returns `None`).
pub(crate) fn take_pending() -> Option<Pending> {
    PENDING.try_with(|c| c.take()).ok().flatten()
}

impl Pending {
    /// The deadline, to decide the call again with ([`Wait::Blocking`] / [`Wait::Async`]).
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline_nanos
    }

    fn ready(&self) -> bool {
        self.lease.version.load(Ordering::Acquire) != self.version || mono_nanos() >= self.deadline_nanos
    }

    /// Blocks the thread until the lease changes or the deadline passes.
    pub(crate) fn wait_blocking(&self) {
        let mut guard = self.lease.waiters.lock().unwrap_or_else(|e| e.into_inner());
        while !self.ready() {
            let left = self.deadline_nanos.saturating_sub(mono_nanos());
            let (g, _) =
                self.lease.changed.wait_timeout(guard, Duration::from_nanos(left)).unwrap_or_else(|e| e.into_inner());
            guard = g;
        }
    }

    /// Awaits the lease's change or the deadline, without blocking the thread.
    pub(crate) fn wait_async(self) -> PendingFuture {
        let left = self.deadline_nanos.saturating_sub(mono_nanos());
        let sleep = futures_timer::Delay::new(Duration::from_nanos(left));
        let id = self.lease.next_waiter.fetch_add(1, Ordering::Relaxed);
        PendingFuture { pending: self, sleep, id, registered: false }
    }
}

pin_project_lite::pin_project! {
    /// Completes when a waiting call's lease changed or its deadline passed.
    pub(crate) struct PendingFuture {
        pending: Pending,
        #[pin]
        sleep: futures_timer::Delay,
        id: u64,
        registered: bool,
    }

    impl PinnedDrop for PendingFuture {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.registered {
                let mut w = this.pending.lease.waiters.lock().unwrap_or_else(|e| e.into_inner());
                w.retain(|(id, _)| id != this.id);
            }
        }
    }
}

impl std::future::Future for PendingFuture {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let this = self.project();
        let lease = &this.pending.lease;
        if lease.version.load(Ordering::Acquire) != this.pending.version {
            return std::task::Poll::Ready(());
        }
        if this.sleep.poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        {
            let mut w = lease.waiters.lock().unwrap_or_else(|e| e.into_inner());
            match w.iter_mut().find(|(id, _)| id == this.id) {
                Some((_, waker)) => waker.clone_from(cx.waker()),
                None => w.push((*this.id, cx.waker().clone())),
            }
            *this.registered = true;
        }
        // A change published before the registration would have found no waker to wake.
        if lease.version.load(Ordering::Acquire) != this.pending.version {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    }
}
