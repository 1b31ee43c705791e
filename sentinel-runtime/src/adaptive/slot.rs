//! The adaptive kind's part of the slot chain: its compiled rule per resource ([`ResourceAdaptive`]), what a
//! call holds ([`AdaptiveHeld`]: its place under the limit) and the slot ([`AdaptiveSlot`]).
//!
//! Per call: one load to find the limiter, one compare-exchange to take a place, and at exit two atomic
//! additions into the window of samples and one subtraction. No lock, no allocation, no reference count,
//! no floating point; an origin is matched against the partitions (a few string compares) only when the rule
//! has partitions.
//!
//! What a call holds fits in the entry's five spare bytes ([`AdaptiveHeld`]): the generation of the
//! resource's rule state that admitted it, its partition, and the calls in flight when it was admitted
//! (itself included: its sample's, as Netflix's limiter reads them at admission). At exit the slot reads the resource's rules
//! (a read section, as for circuit breakers) and gives the place back to the state of that generation with
//! its sample. After a reload that changed the rule, the new state shares the old one's count of calls in
//! flight (the limit is never passed because a rule changed): calls still in flight under the old rule count
//! against the new limit, and at exit give their place back to the new state's count, with no sample and in
//! none of its partitions. After a rule's removal its calls give their places to nobody, and a rule loaded
//! later starts a count of its own. A limiter's counts never go below zero, so a call given back to a count
//! that did not count it (a rule removed and loaded again during the call, or a generation that came round
//! again after 255 changed reloads) can only let one call more in, until the resource's calls drain. Calls waiting for a place on the old limiter (`maxWaitMs`) are woken once the
//! resource's rules are replaced ([`ResourceAdaptive::retire`]) and decided again against the rules in
//! force, waiting (if they must) only what is left of their wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use super::limiter::Limiter;
use super::permit::{AdaptiveBlockReason, PartitionId, Permit};
use super::rule::AdaptiveRule;
use super::wait::{Admission, WaitEnd, WaitForPermit, WaitQueue};
use crate::clock::EngineClock;
use crate::error::BlockError;
use crate::slot::contract::{CallCx, CheckCx, ExitCx, FastCall, RuleSlot, Verdict};
use crate::wait::{Grant, Pending, PendingWait, RetryScope, Wait, Waited};

/// The adaptive rule of one resource and its limiter.
///
/// The limiter is built on the resource's first checked call, which also decides the algorithm when the rule
/// names none (Gradient2 for an inbound call, AIMD for an outbound one). It lives as long as the rule stays
/// unchanged: a reload with an equal rule keeps it, and with it the limit found so far.
#[derive(Debug)]
pub(crate) struct ResourceAdaptive {
    pub(crate) rule: Arc<AdaptiveRule>,
    limiter: OnceLock<Limiter>,
    /// The resource's calls in flight, shared with the state this one replaced (a changed rule), whose calls
    /// still in flight keep counting against the new limit and give their places back to it.
    inflight: Arc<AtomicU32>,
    seed: u64,
    /// Which state of the resource this is (1..=255, the next after the one it replaced).
    pub(crate) generation: u8,
    /// The state went out of force ([`retire`](Self::retire)).
    retired: AtomicBool,
}

impl ResourceAdaptive {
    /// The rule's state for one resource; `seed` drives the jitter of its probes.
    /// `inflight` counts the resource's calls in flight: a new count, or the one of the state this one
    /// replaces.
    pub(crate) fn new(rule: Arc<AdaptiveRule>, seed: u64, generation: u8, inflight: Arc<AtomicU32>) -> Self {
        ResourceAdaptive {
            rule,
            limiter: OnceLock::new(),
            inflight,
            seed,
            generation: generation.max(1),
            retired: AtomicBool::new(false),
        }
    }

    /// The state went out of force (a changed rule replaced it, or its rule went), and the resource's rules
    /// no longer hold it: calls waiting for a place on its limiter are woken to be decided again against
    /// the rules in force, and no call waits on it any more (nobody gives its places back).
    #[cold]
    pub(crate) fn retire(&self) {
        self.retired.store(true, SeqCst);
        // Pairs with the fence in `init`: either this sees the limiter built, or `init` sees the flag.
        fence(SeqCst);
        if let Some(l) = self.limiter.get() {
            l.queue.retire();
        }
    }

    /// Whether the state went out of force.
    fn is_retired(&self) -> bool {
        self.retired.load(SeqCst)
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
        let l = self
            .limiter
            .get_or_init(|| Limiter::counting(&self.rule, inbound, now_nanos, self.seed, self.inflight.clone()));
        // A limiter built by a call that read the rules just before the state was retired.
        fence(SeqCst);
        if self.is_retired() {
            l.queue.retire();
        }
        l
    }

    /// Whether a call the limiter refuses never waits for a place (`maxWaitMs` 0): only such a rule is
    /// decided on the fast path, which cannot hand a call a wait.
    pub(crate) fn never_waits(&self) -> bool {
        self.rule.max_wait_ms == 0
    }

    /// The limiter, once a call built it.
    pub(crate) fn built(&self) -> Option<&Limiter> {
        self.limiter.get()
    }

    /// The resource's calls in flight, for the state that replaces this one.
    pub(crate) fn inflight_count(&self) -> Arc<AtomicU32> {
        self.inflight.clone()
    }

    /// A call that an earlier state of the resource admitted exits: its place, counted in the shared count,
    /// goes back (no sample: the limiter that measured it is gone).
    #[cold]
    fn give_back_carried(&self) {
        match self.built() {
            Some(l) => l.give_back_carried(),
            None => {
                let _ = self.inflight.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
            }
        }
    }
}

/// What a call held, as the state at its exit sees it.
enum Taken {
    /// Nothing.
    Nothing,
    /// A place of this state, in this partition, taken with this many calls in flight (itself included).
    Here(Option<PartitionId>, u32),
    /// A place an earlier state of the resource gave it (a rule changed since).
    Earlier,
}

/// What a call the adaptive slot passed holds: the generation of the state that admitted it (0: nothing),
/// its partition plus one (0: none), and the calls in flight when it was admitted, itself included (three
/// bytes, little-endian: more than any limit lets in). Bytes only, so that it takes five of the entry's spare
/// bytes and no alignment.
#[derive(Debug, Default)]
pub(crate) struct AdaptiveHeld([u8; 5]);

/// The calls in flight [`AdaptiveHeld`] records: three bytes, more than any limit lets in (a limit is at most
/// [`MAX_LIMIT_CAP`](super::rule::MAX_LIMIT_CAP), its partitions' guarantees at most as many again).
const HELD_INFLIGHT_MASK: u64 = (1 << 24) - 1;

impl AdaptiveHeld {
    #[inline(always)]
    fn of(cell: &ResourceAdaptive, permit: &Permit) -> Self {
        let p = permit.partition.map_or(0, |p| u64::from(p.0) + 1);
        let v = u64::from(cell.generation) | (p << 8) | ((u64::from(permit.inflight) & HELD_INFLIGHT_MASK) << 16);
        let [a, b, c, d, e, ..] = v.to_le_bytes();
        AdaptiveHeld([a, b, c, d, e])
    }
    /// Whether the call holds a place.
    #[inline(always)]
    pub(crate) fn holds(&self) -> bool {
        self.0[0] != 0
    }
    /// Takes what the call holds: a place of `cell` (its partition, the calls in flight at its admission), or
    /// of an earlier state of the resource.
    #[inline(always)]
    fn take_from(&mut self, cell: &ResourceAdaptive) -> Taken {
        let [a, b, c, d, e] = std::mem::take(&mut self.0);
        let v = u64::from_le_bytes([a, b, c, d, e, 0, 0, 0]);
        if v as u8 == 0 {
            return Taken::Nothing;
        }
        if v as u8 != cell.generation {
            return Taken::Earlier;
        }
        let partition = match (v >> 8) as u8 {
            0 => None,
            p => Some(PartitionId(p - 1)),
        };
        Taken::Here(partition, (v >> 16) as u32)
    }
}

/// The slot of adaptive concurrency rules.
pub(crate) struct AdaptiveSlot;

impl RuleSlot for AdaptiveSlot {
    type Rules = Arc<ResourceAdaptive>;
    type State = ();
    type Held = AdaptiveHeld;
    type Taken = ();
    type FastTaken = ();
    const ORDER: i32 = crate::slot::ORDER_ADAPTIVE;
    const EXIT_READS_RULES: bool = true;
    /// An adaptive limit whose calls never wait ([`ResourceAdaptive::never_waits`]) is decided on the fast
    /// path, beside the other kinds there: the slot is the path's last that can refuse, so the place it takes
    /// needs no undo, and the kinds before it give back what they took when it refuses.
    const ON_FAST_PATH: bool = true;
    const HOLDS_ON_FAST_PATH: bool = true;
    /// Beside flow or hot-parameter rules, the fast path's copy in which they keep what they took.
    const FAST_PATH_APART: bool = true;

    #[inline]
    fn check(
        rules: &Arc<ResourceAdaptive>,
        _: &(),
        cx: &CheckCx<'_>,
        held: &mut AdaptiveHeld,
        _: &mut (),
    ) -> Result<Verdict, BlockError> {
        take_place(rules, cx, cx.cluster_wait, held).map(|()| Verdict::PASS)
    }

    #[inline(always)]
    fn check_fast<'c>(
        rules: &Arc<ResourceAdaptive>,
        _: &(),
        call: &impl FastCall<'c>,
        _: &mut u64,
        held: &mut AdaptiveHeld,
        _: Option<&mut ()>,
    ) -> Result<(), BlockError> {
        take_place_fast(rules, &call.call(), held)
    }

    #[inline(always)]
    fn give_back(rules: &Arc<ResourceAdaptive>, _: &(), cx: &CheckCx<'_>, held: &mut AdaptiveHeld, _: &mut ()) {
        match (held.take_from(rules), rules.built()) {
            (Taken::Here(partition, inflight), Some(l)) => l.cancel(l.permit_of(partition, inflight, cx.now_nanos)),
            (Taken::Earlier, _) => rules.give_back_carried(),
            _ => {}
        }
    }

    #[inline(always)]
    fn holds(held: &AdaptiveHeld) -> bool {
        held.holds()
    }

    #[inline]
    fn exit(rules: Option<&Arc<ResourceAdaptive>>, _: &(), cx: &ExitCx, held: &mut AdaptiveHeld) {
        let Some(cell) = rules else { return };
        let (partition, inflight) = match held.take_from(cell) {
            Taken::Here(partition, inflight) => (partition, inflight),
            Taken::Earlier => return cell.give_back_carried(),
            Taken::Nothing => return,
        };
        if let Some(l) = cell.built() {
            // The downstream's time: a queueing rule's wait before the call ran is not part of it. The call
            // took its place when it was admitted, before that wait (the back-off epoch it belongs to). Its
            // sample counts the calls in flight then (Netflix's `createListener` reads them at admission).
            let since_admitted = cx.rt_micros.saturating_mul(1_000);
            let rtt = since_admitted.saturating_sub(cx.waited_nanos);
            let permit = l.permit_of(partition, inflight, cx.now_nanos.saturating_sub(since_admitted));
            if cx.abandoned {
                // Given up on or panicked: no round trip of the downstream to measure (Netflix's `onIgnore`).
                l.cancel(permit);
            } else {
                l.release(permit, cx.now_nanos, rtt, cx.overload);
            }
        }
    }
}

/// A call the limiter refused that may wait (`maxWaitMs`): its wait, handed to the entry path through
/// [`crate::wait`] (blocking a sync caller's thread, awaited by an async one), on the engine clock's timer,
/// until `until` (engine clock nanoseconds).
struct PlaceWait {
    limiter: OwnedLimiter,
    partition: Option<PartitionId>,
    clock: EngineClock,
    until: u64,
}

/// What a wait whose limiter went out of force hands to the decision made again: when its wait ends, so
/// that a call waiting again on the new limiter waits no longer in all than it was told to.
struct WaitLeft {
    until: u64,
}

/// The limiter of a rule state, held by a wait that outlives the check that asked for it.
#[derive(Debug)]
struct OwnedLimiter(Arc<ResourceAdaptive>);

impl OwnedLimiter {
    fn get(&self) -> &Limiter {
        // Built: only a call the built limiter refused waits. (Were it not, the direction only picks the
        // default algorithm of a limiter nobody has used.)
        self.0.limiter(0, true)
    }
}

impl Admission for OwnedLimiter {
    fn try_acquire(&self, partition: Option<PartitionId>) -> Option<Permit> {
        self.get().try_acquire(partition)
    }
    fn cancel(&self, permit: Permit) {
        self.get().cancel(permit)
    }
    fn blocked(&self, reason: AdaptiveBlockReason) -> super::permit::AdaptiveBlock {
        self.get().blocked(reason)
    }
    fn queue(&self) -> &WaitQueue {
        &self.get().queue
    }
}

/// A place a wait got, kept for the decision made again after it; dropped untaken, it goes back.
struct PlaceGrant {
    cell: Arc<ResourceAdaptive>,
    permit: Option<Permit>,
}

impl Drop for PlaceGrant {
    fn drop(&mut self) {
        if let (Some(permit), Some(l)) = (self.permit.take(), self.cell.built()) {
            l.cancel(permit);
        }
    }
}

impl PendingWait for PlaceWait {
    fn wait_async(self: Box<Self>) -> Pin<Box<dyn Future<Output = Waited> + Send>> {
        let PlaceWait { limiter, partition, clock, until } = *self;
        let cell = limiter.0.clone();
        let wait = WaitForPermit::start(limiter, partition, &clock, until.saturating_sub(clock.now_nanos()).max(1));
        Box::pin(async move {
            match wait.await {
                Ok(permit) => Waited { grant: Some(Grant::new(PlaceGrant { cell, permit: Some(permit) })), ended: 0 },
                Err(WaitEnd::Refused(block)) => Waited { grant: None, ended: ended_code(block.reason) },
                // Decided again (not refused): against the rules in force, with what is left of the wait.
                Err(WaitEnd::Retired) => Waited { grant: Some(Grant::new(WaitLeft { until })), ended: 0 },
            }
        })
    }
}

/// Why a wait ended without a place, as [`Waited::ended`] says it (never 0), and back.
fn ended_code(reason: AdaptiveBlockReason) -> u8 {
    match reason {
        AdaptiveBlockReason::Displaced => 2,
        _ => 1,
    }
}

fn ended_reason(code: u8) -> AdaptiveBlockReason {
    match code {
        2 => AdaptiveBlockReason::Displaced,
        _ => AdaptiveBlockReason::WaitTimedOut,
    }
}

/// The check, on either path: a place under the limit (or the one a wait got), kept in `held`; `wait` says
/// whether a refused call may wait, and how.
#[inline(always)]
fn take_place(
    rules: &Arc<ResourceAdaptive>,
    cx: &CallCx<'_>,
    wait: Wait,
    held: &mut AdaptiveHeld,
) -> Result<(), BlockError> {
    let limiter = rules.limiter(cx.now_nanos, cx.entry_type == crate::slot::EntryType::In);
    let partition = if limiter.has_partitions() { limiter.partition_of(cx.origin.as_str()) } else { None };
    match limiter.try_acquire(partition).or_else(|| granted_to(rules)) {
        Some(permit) => {
            // The place is counted in the limiter; the call keeps where it came from and its sample's count.
            *held = AdaptiveHeld::of(rules, &permit);
            Ok(())
        }
        None => Err(refuse(rules, limiter, partition, cx, wait)),
    }
}

/// [`take_place`] on the fast path, which takes only rules whose calls never wait
/// ([`ResourceAdaptive::never_waits`]); out of line, so that the entry path inlines only the call to it.
#[inline(never)]
fn take_place_fast(rules: &Arc<ResourceAdaptive>, cx: &CallCx<'_>, held: &mut AdaptiveHeld) -> Result<(), BlockError> {
    take_place(rules, cx, Wait::Now, held)
}

/// The limiter refused the call: it waits if the rule and the caller allow, and had not waited already.
#[cold]
#[inline(never)]
fn refuse(
    cell: &Arc<ResourceAdaptive>,
    limiter: &Limiter,
    partition: Option<PartitionId>,
    cx: &CallCx<'_>,
    wait: Wait,
) -> BlockError {
    let ended = RetryScope::ended();
    if ended != 0 {
        return blocked(limiter, ended_reason(ended), cx);
    }
    if limiter.max_wait_nanos > 0 && !matches!(wait, Wait::Now) {
        let mut until = cx.now_nanos.saturating_add(limiter.max_wait_nanos);
        // Woken because the limiter it waited on went out of force: the call waits what is left of its wait
        // (and never again on a retired state, which could only wake it again at once).
        if let Some(left) = crate::wait::take_grant::<WaitLeft>(|_| true) {
            if cell.is_retired() || left.until <= cx.now_nanos {
                return blocked(limiter, AdaptiveBlockReason::WaitTimedOut, cx);
            }
            until = until.min(left.until);
        }
        let clock = cx.clock.clone();
        crate::wait::ask(Pending::new(PlaceWait { limiter: OwnedLimiter(cell.clone()), partition, clock, until }));
    }
    blocked(limiter, AdaptiveBlockReason::AtLimit, cx)
}

/// The place a wait got for this call, if it came from `cell`.
#[cold]
fn granted_to(cell: &Arc<ResourceAdaptive>) -> Option<Permit> {
    crate::wait::take_grant::<PlaceGrant>(|g| Arc::ptr_eq(&g.cell, cell)).and_then(|mut g| g.permit.take())
}

/// The block of a call the limiter refused.
#[cold]
fn blocked(limiter: &Limiter, reason: AdaptiveBlockReason, cx: &CallCx<'_>) -> BlockError {
    BlockError::Adaptive { resource: cx.resource.share(), origin: cx.origin.share(), block: limiter.blocked(reason) }
}
