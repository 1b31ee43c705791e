//! The flow check of a cluster rule on its lease: leased tokens spent on the calling thread, a wait for the
//! token service when the lease is empty ([`LeaseWait`]), or the rule's local fallback. Apart from the lease
//! ([`token_service`](super::token_service)) so that the lease knows neither the call's scratch nor its wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::controller::{reject_qps, Decision};
use super::token_service::pending::LeaseWait;
use super::token_service::{mono_nanos, no_service, DeadlineScope, RuleLease, Wait, MODE_DETACHED, MODE_LEASING};
use super::Scratch;
use crate::slot::contract::CheckCx;
use crate::stat::StatNode;

impl RuleLease {
    /// Decides a call on the rule (on `node`, the node the rule selected): spends leased tokens, or takes the
    /// slow path.
    #[inline(always)]
    pub(crate) fn check(self: &Arc<Self>, node: &StatNode, cx: &CheckCx<'_>, scratch: &mut Scratch) -> Decision {
        if cx.acquire > 0
            && let Some(key) = self.window.lease_take(cx.now_ms, cx.acquire, &**self)
        {
            scratch.push_leased(self, key, cx.acquire);
            return Decision::Pass { reservation: None, wait_nanos: 0 };
        }
        self.check_slow(node, cx, scratch)
    }

    /// No leased token for the call: `acquire == 0`, an empty or expired lease, or a failing service.
    #[cold]
    #[inline(never)]
    fn check_slow(self: &Arc<Self>, node: &StatNode, cx: &CheckCx<'_>, scratch: &mut Scratch) -> Decision {
        if cx.acquire == 0 {
            return Decision::Pass { reservation: None, wait_nanos: 0 };
        }
        if self.mode.load(Ordering::Acquire) != MODE_LEASING {
            return self.fallback(node, cx, scratch);
        }
        // Read before the second look at the pool: a change published after it is not missed.
        let version = self.version.load(Ordering::Acquire);
        if let Some(key) = self.window.lease_take(cx.now_ms, cx.acquire, &**self) {
            scratch.push_leased(self, key, cx.acquire);
            return Decision::Pass { reservation: None, wait_nanos: 0 };
        }
        let exhausted_until = self.exhausted_until.load(Ordering::Acquire);
        if cx.now_ms < exhausted_until {
            self.counters.exhausted.fetch_add(1, Ordering::Relaxed);
            // The cluster's window is spent until then.
            return Decision::Block { retry_after: Some(Duration::from_millis(exhausted_until - cx.now_ms)) };
        }
        self.request_for(cx.acquire);
        let now = mono_nanos();
        let deadline = match (cx.cluster_wait, DeadlineScope::current()) {
            (Wait::Now, _) => return self.fallback(node, cx, scratch),
            // A call deciding again after a wait keeps that wait's deadline.
            (_, d) if d != 0 => d,
            _ => {
                self.counters.waits.fetch_add(1, Ordering::Relaxed);
                now.saturating_add(self.timeout_nanos)
            }
        };
        if now >= deadline {
            self.counters.wait_timeouts.fetch_add(1, Ordering::Relaxed);
            return self.fallback(node, cx, scratch);
        }
        // The call waits outside the rules' read section and is decided again (see `crate::wait`).
        crate::wait::ask(crate::wait::Pending::new(LeaseWait::new(self.clone(), deadline, version)));
        Decision::Block { retry_after: None }
    }

    /// The local decision: the fallback limit on the rule's node (a prioritized call may borrow the next
    /// window), or a pass without local fallback.
    fn fallback(&self, node: &StatNode, cx: &CheckCx<'_>, scratch: &mut Scratch) -> Decision {
        self.counters.fallback.fetch_add(1, Ordering::Relaxed);
        let mode = self.mode.load(Ordering::Acquire);
        let limit = match mode {
            // As with no service at all (Java's behaviour): the whole count.
            MODE_DETACHED => self.rule.count,
            // While what the shared window held when the service failed is still in it, its share counts.
            _ => {
                let limit = f64::from_bits(self.fallback_limit.load(Ordering::Relaxed));
                (limit - self.fallback_debt_at(cx.now_ms) as f64).max(0.0)
            }
        };
        let decision = if no_service(&self.rule) {
            // Java's `fallbackToLocalOrPass` is the rule's local check with the call's priority: a prioritized
            // call over the local limit borrows the next window, as with no token service at all.
            reject_qps(node, cx.now_ms, cx.acquire, limit, cx.prioritized, scratch.held(node))
        } else {
            Decision::Pass { reservation: None, wait_nanos: 0 }
        };
        if mode != MODE_DETACHED && !matches!(decision, Decision::Block { .. }) {
            // Admitted without a token of the shared limit: the service counts it there when it can.
            self.local.record(cx.now_ms, u64::from(cx.acquire));
        }
        decision
    }
}
