//! The adaptive kind's part of the slot chain: its compiled rule per resource ([`ResourceAdaptive`]), what a
//! call holds ([`AdaptiveHeld`]: its place under the limit) and the slot ([`AdaptiveSlot`]).
//!
//! Per call: one load to find the limiter, one compare-exchange to take a place, and at exit two atomic
//! additions into the window of samples and one subtraction. No lock, no allocation, no floating point; an
//! origin is matched against the partitions (a few string compares) only when the rule has partitions.

use std::sync::{Arc, OnceLock};

use super::limiter::Limiter;
use super::permit::{AdaptiveBlockReason, Permit};
use super::rule::AdaptiveRule;
use crate::error::BlockError;
use crate::slot::contract::{CheckCx, ExitCx, RuleSlot, Verdict};

/// The adaptive rule of one resource and its limiter.
///
/// The limiter is built on the resource's first checked call, which also decides the algorithm when the rule
/// names none (Gradient2 for an inbound call, AIMD for an outbound one). It lives as long as the rule stays
/// unchanged: a reload with an equal rule keeps it, and with it the limit found so far.
#[derive(Debug)]
pub(crate) struct ResourceAdaptive {
    pub(crate) rule: Arc<AdaptiveRule>,
    limiter: OnceLock<Limiter>,
    seed: u64,
}

impl ResourceAdaptive {
    /// The rule's state for one resource; `seed` drives the jitter of its probes.
    pub(crate) fn new(rule: Arc<AdaptiveRule>, seed: u64) -> Self {
        ResourceAdaptive { rule, limiter: OnceLock::new(), seed }
    }

    /// The limiter, built at `now_nanos` for a resource of that direction on the first call.
    #[inline(always)]
    pub(crate) fn limiter(&self, now_nanos: u64, inbound: bool) -> &Limiter {
        match self.limiter.get() {
            Some(l) => l,
            None => self.init(now_nanos, inbound),
        }
    }

    #[cold]
    fn init(&self, now_nanos: u64, inbound: bool) -> &Limiter {
        self.limiter.get_or_init(|| Limiter::new(&self.rule, inbound, now_nanos, self.seed))
    }

    /// The limiter, once a call built it.
    pub(crate) fn built(&self) -> Option<&Limiter> {
        self.limiter.get()
    }
}

/// What a call the adaptive slot passed holds: its place under the limit of the limiter it came from (kept
/// alive by the call, so a reload meanwhile cannot send the place back to another limiter).
#[derive(Debug, Default)]
pub(crate) struct AdaptiveHeld(Option<(Arc<ResourceAdaptive>, Permit)>);

impl AdaptiveHeld {
    /// Gives the place back without a sample (the call never ran).
    fn cancel(&mut self) {
        if let Some((cell, permit)) = self.0.take() {
            if let Some(l) = cell.built() {
                l.cancel(permit);
            }
        }
    }
}

/// The slot of adaptive concurrency rules.
pub(crate) struct AdaptiveSlot;

impl RuleSlot for AdaptiveSlot {
    type Rules = Arc<ResourceAdaptive>;
    type State = ();
    type Held = AdaptiveHeld;
    type Taken = ();
    const ORDER: i32 = crate::slot::ORDER_ADAPTIVE;

    #[inline]
    fn check(
        rules: &Arc<ResourceAdaptive>,
        _: &(),
        cx: &CheckCx<'_>,
        held: &mut AdaptiveHeld,
        _: &mut (),
    ) -> Result<Verdict, BlockError> {
        let limiter = rules.limiter(cx.now_nanos, cx.entry_type == crate::EntryType::In);
        let partition = if limiter.has_partitions() { limiter.partition_of(cx.origin) } else { None };
        match limiter.try_acquire(partition) {
            Some(permit) => {
                held.0 = Some((rules.clone(), permit));
                Ok(Verdict::PASS)
            }
            None => Err(blocked(limiter, AdaptiveBlockReason::AtLimit, cx)),
        }
    }

    #[inline(always)]
    fn give_back(_: &Arc<ResourceAdaptive>, _: &(), _: &CheckCx<'_>, held: &mut AdaptiveHeld, _: &mut ()) {
        held.cancel();
    }

    #[inline(always)]
    fn holds(held: &AdaptiveHeld) -> bool {
        held.0.is_some()
    }

    #[inline]
    fn exit(_: Option<&Arc<ResourceAdaptive>>, _: &(), cx: &ExitCx, held: &mut AdaptiveHeld) {
        if let Some((cell, permit)) = held.0.take() {
            if let Some(l) = cell.built() {
                l.release(permit, cx.now_nanos, cx.rt_micros.saturating_mul(1_000), cx.overload);
            }
        }
    }
}

/// The block of a call the limiter refused.
#[cold]
fn blocked(limiter: &Limiter, reason: AdaptiveBlockReason, cx: &CheckCx<'_>) -> BlockError {
    BlockError::Adaptive {
        resource: cx.resource.name.clone(),
        origin: cx.origin.clone(),
        block: limiter.blocked(reason),
    }
}
