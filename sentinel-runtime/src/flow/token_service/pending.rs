//! The wait of a call whose cluster rule's lease is empty: blocking its thread or awaiting, until the lease
//! changes or the deadline passes. One kind of [`crate::wait::Pending`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::RuleLease;
use crate::wait::{mono_nanos, PendingWait, Waited};

/// A call that found its lease empty and waits for the token service.
pub(crate) struct LeaseWait {
    pub(super) lease: Arc<RuleLease>,
    pub(super) deadline_nanos: u64,
    pub(super) version: u64,
}

impl LeaseWait {
    /// The wait of a call that found `lease` empty at `version`, until `deadline_nanos` ([`mono_nanos`]).
    pub(crate) fn new(lease: Arc<RuleLease>, deadline_nanos: u64, version: u64) -> LeaseWait {
        LeaseWait { lease, deadline_nanos, version }
    }
    fn ready(&self) -> bool {
        self.lease.version.load(Ordering::Acquire) != self.version || mono_nanos() >= self.deadline_nanos
    }
}

impl PendingWait for LeaseWait {
    /// The decision made again keeps this deadline: past it, the rule's local fallback decides.
    fn deadline(&self) -> u64 {
        self.deadline_nanos
    }

    /// Blocks the thread until the lease changes or the deadline passes.
    fn wait_blocking(self: Box<Self>) -> Waited {
        let mut guard = self.lease.waiters.lock().unwrap_or_else(|e| e.into_inner());
        while !self.ready() {
            let left = self.deadline_nanos.saturating_sub(mono_nanos());
            let (g, _) =
                self.lease.changed.wait_timeout(guard, Duration::from_nanos(left)).unwrap_or_else(|e| e.into_inner());
            guard = g;
        }
        Waited::default()
    }

    /// Awaits the lease's change or the deadline, without blocking the thread.
    fn wait_async(self: Box<Self>) -> std::pin::Pin<Box<dyn std::future::Future<Output = Waited> + Send>> {
        let left = self.deadline_nanos.saturating_sub(mono_nanos());
        let sleep = futures_timer::Delay::new(Duration::from_nanos(left));
        let id = self.lease.next_waiter.fetch_add(1, Ordering::Relaxed);
        Box::pin(LeaseFuture { pending: *self, sleep, id, registered: false })
    }
}

pin_project_lite::pin_project! {
    /// Completes when a waiting call's lease changed or its deadline passed.
    struct LeaseFuture {
        pending: LeaseWait,
        #[pin]
        sleep: futures_timer::Delay,
        id: u64,
        registered: bool,
    }

    impl PinnedDrop for LeaseFuture {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.registered {
                let mut w = this.pending.lease.waiters.lock().unwrap_or_else(|e| e.into_inner());
                w.retain(|(id, _)| id != this.id);
            }
        }
    }
}

impl std::future::Future for LeaseFuture {
    type Output = Waited;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Waited> {
        let this = self.project();
        let lease = &this.pending.lease;
        if lease.version.load(Ordering::Acquire) != this.pending.version {
            return std::task::Poll::Ready(Waited::default());
        }
        if this.sleep.poll(cx).is_ready() {
            return std::task::Poll::Ready(Waited::default());
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
            return std::task::Poll::Ready(Waited::default());
        }
        std::task::Poll::Pending
    }
}
