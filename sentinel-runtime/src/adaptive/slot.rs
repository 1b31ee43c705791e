//! The adaptive kind's part of the slot chain: its compiled rule per resource ([`ResourceAdaptive`]), what a
//! call holds ([`AdaptiveHeld`]: its place under the limit) and the slot ([`AdaptiveSlot`]).
//!
//! Per call: one load to find the limiter, one compare-exchange to take a place, and at exit two atomic
//! additions into the window of samples and one subtraction. No lock, no allocation, no reference count,
//! no floating point; an origin is matched against the partitions (a few string compares) only when the rule
//! has partitions.
//!
//! What a call holds fits in the entry's two spare bytes ([`AdaptiveHeld`]): the generation of the
//! resource's rule state that admitted it and its partition. At exit the slot reads the resource's rules
//! (a read section, as for circuit breakers) and gives the place back only to the state of that generation:
//! after a reload that changed the rule, the old limiter is dropped and calls still in flight under it give
//! their places to nobody (the new limiter starts with the calls it admits). A limiter's counts never go
//! below zero, so even a generation that came round again (255 changed reloads during one call) can only
//! let one call more in, once.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use super::limiter::Limiter;
use super::permit::{AdaptiveBlockReason, PartitionId, Permit};
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
    /// Which state of the resource this is (1..=255, the next after the one it replaced).
    pub(crate) generation: u8,
}

impl ResourceAdaptive {
    /// The rule's state for one resource; `seed` drives the jitter of its probes.
    pub(crate) fn new(rule: Arc<AdaptiveRule>, seed: u64, generation: u8) -> Self {
        ResourceAdaptive { rule, limiter: OnceLock::new(), seed, generation: generation.max(1) }
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

/// What a call the adaptive slot passed holds: the generation of the state that admitted it (0: nothing)
/// and its partition plus one (0: none).
#[derive(Debug, Default)]
pub(crate) struct AdaptiveHeld(u16);

impl AdaptiveHeld {
    #[inline(always)]
    fn of(cell: &ResourceAdaptive, partition: Option<PartitionId>) -> Self {
        let p = partition.map_or(0, |p| u16::from(p.0) + 1);
        AdaptiveHeld(u16::from(cell.generation) | (p << 8))
    }
    /// Whether the call holds a place.
    #[inline(always)]
    pub(crate) fn holds(&self) -> bool {
        self.0 != 0
    }
    /// Takes what the call holds if `cell` admitted it: its partition.
    #[inline(always)]
    fn take_from(&mut self, cell: &ResourceAdaptive) -> Option<Option<PartitionId>> {
        let held = std::mem::take(&mut self.0);
        if held == 0 || held as u8 != cell.generation {
            return None;
        }
        Some(match (held >> 8) as u8 {
            0 => None,
            p => Some(PartitionId(p - 1)),
        })
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
    const EXIT_READS_RULES: bool = true;

    #[inline]
    fn check(
        rules: &Arc<ResourceAdaptive>,
        _: &(),
        cx: &CheckCx<'_>,
        held: &mut AdaptiveHeld,
        _: &mut (),
    ) -> Result<Verdict, BlockError> {
        let limiter = rules.limiter(cx.now_nanos, cx.entry_type == crate::slot::EntryType::In);
        let partition = if limiter.has_partitions() { limiter.partition_of(cx.origin) } else { None };
        match limiter.try_acquire(partition).or_else(|| granted_to(rules)) {
            Some(permit) => {
                // The place is counted in the limiter; the call keeps only where it came from.
                let _ = permit;
                *held = AdaptiveHeld::of(rules, partition);
                Ok(Verdict::PASS)
            }
            None => {
                if matches!(cx.cluster_wait, crate::wait::Wait::Blocking(_)) {
                    ask_to_wait(rules, partition, limiter.max_wait_nanos > 0);
                }
                Err(blocked(limiter, AdaptiveBlockReason::AtLimit, cx))
            }
        }
    }

    #[inline(always)]
    fn give_back(rules: &Arc<ResourceAdaptive>, _: &(), cx: &CheckCx<'_>, held: &mut AdaptiveHeld, _: &mut ()) {
        if let (Some(partition), Some(l)) = (held.take_from(rules), rules.built()) {
            l.cancel(l.permit_of(partition, cx.now_nanos));
        }
    }

    #[inline(always)]
    fn holds(held: &AdaptiveHeld) -> bool {
        held.holds()
    }

    #[inline]
    fn exit(rules: Option<&Arc<ResourceAdaptive>>, _: &(), cx: &ExitCx, held: &mut AdaptiveHeld) {
        let Some(cell) = rules else { return };
        if let (Some(partition), Some(l)) = (held.take_from(cell), cell.built()) {
            let rtt = cx.rt_micros.saturating_mul(1_000);
            l.release(l.permit_of(partition, cx.now_nanos.saturating_sub(rtt)), cx.now_nanos, rtt, cx.overload);
        }
    }
}

thread_local! {
    /// A sync call the limiter refused and that may wait (`maxWaitMs`): where to wait, set by the check and
    /// taken by the entry path, which waits outside the rules' read section.
    static WAIT: RefCell<Option<(Arc<ResourceAdaptive>, Option<PartitionId>)>> = const { RefCell::new(None) };
    /// The place a wait got, for the check of the same call made again after it.
    static GRANTED: RefCell<Option<(Arc<ResourceAdaptive>, Permit)>> = const { RefCell::new(None) };
}

/// Notes whether the refused call may wait (always set, so that the entry path never sees an older call's).
#[cold]
fn ask_to_wait(cell: &Arc<ResourceAdaptive>, partition: Option<PartitionId>, may_wait: bool) {
    let _ = WAIT.try_with(|w| *w.borrow_mut() = may_wait.then(|| (cell.clone(), partition)));
}

/// The place a wait got for this call, if it came from `cell`.
#[cold]
fn granted_to(cell: &Arc<ResourceAdaptive>) -> Option<Permit> {
    if GRANTED.try_with(|g| g.borrow().is_none()).unwrap_or(true) {
        return None;
    }
    GRANTED
        .try_with(|g| {
            let mut g = g.borrow_mut();
            match g.take() {
                Some((c, permit)) if Arc::ptr_eq(&c, cell) => Some(permit),
                other => {
                    *g = other;
                    None
                }
            }
        })
        .ok()
        .flatten()
}

/// For the entry path: a sync call refused by an adaptive rule with `maxWaitMs` waits here, outside the rules'
/// read section, blocking its thread (newest first, up to the rule's wait) on `clock`. `Ok(true)`: it got a
/// place, and the checks made again for it take that place; `Ok(false)`: there was nothing to wait for.
/// `Err`: the wait ran out or newer calls displaced it.
#[cold]
pub(crate) fn wait_blocking(
    clock: &crate::clock::EngineClock,
    cx_resource: &Arc<str>,
    origin: &Arc<str>,
) -> Result<bool, BlockError> {
    let Some((cell, partition)) = WAIT.try_with(|w| w.borrow_mut().take()).ok().flatten() else {
        return Ok(false);
    };
    let Some(limiter) = cell.built() else { return Ok(false) };
    match limiter.acquire_blocking(partition, clock) {
        Ok(permit) => {
            let _ = GRANTED.try_with(|g| *g.borrow_mut() = Some((cell.clone(), permit)));
            Ok(true)
        }
        Err(block) => Err(BlockError::Adaptive { resource: cx_resource.clone(), origin: origin.clone(), block }),
    }
}

/// For the entry path, after the checks made again: a place a wait got that no check took (the rules
/// changed, or an earlier slot refused the call this time) goes back.
#[cold]
pub(crate) fn return_unused_grant() {
    let _ = WAIT.try_with(|w| w.borrow_mut().take());
    if let Some((cell, permit)) = GRANTED.try_with(|g| g.borrow_mut().take()).ok().flatten() {
        if let Some(l) = cell.built() {
            l.cancel(permit);
        }
    }
}

/// The block of a call the limiter refused.
#[cold]
fn blocked(limiter: &Limiter, reason: AdaptiveBlockReason, cx: &CheckCx<'_>) -> BlockError {
    BlockError::Adaptive { resource: cx.resource.clone(), origin: cx.origin.clone(), block: limiter.blocked(reason) }
}
