//! The entry path: the context, the nodes, one read of the rules, the slot chain, pass or block.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::NANOS_PER_MILLI;
use crate::context::{self, ContextState};
use crate::engine::shared::Shared;
use crate::error::BlockError;
use crate::node::{DefaultNode, OriginNode};
use crate::resource::inner::ResourceInner;
use crate::resource::EntryType;

use super::{Entry, EntryBuilder, Flags};
use crate::chain::{self, Decided};
use crate::flow;
use crate::rules::{FastPath, ResourceRules};
use crate::slot::contract::{CallCx, CheckCx};
use crate::stat::{StatNode, Writer};
use crate::wait::{Pending, RetryScope, Wait};

impl<'r, 'a> EntryBuilder<'r, 'a> {
    /// The whole entry path; the entry is built once, in place, at the end. `install`: the entry becomes the
    /// innermost entry of the thread's context (a borrowed, synchronous entry). A wait a check asked for
    /// (`crate::wait`: a cluster rule's empty lease, an adaptive rule's `maxWaitMs`) blocks here
    /// ([`Wait::Blocking`]) or, for an outcome that can hand the call back ([`MayWait`], with
    /// [`Wait::Async`]), returns the builder and the wait. The outcome type is static, so the synchronous
    /// path compiles to what it was before waits existed.
    #[inline(always)]
    pub(super) fn entry_path<O: PathResult<'r, 'a>>(self, wait: Wait, install: bool) -> O {
        let sleep = matches!(wait, Wait::Blocking(_));
        // `Shared` and `ResourceInner` stay alive as long as the entry that `self.res` moves into.
        let shared: &'r Shared = self.res.shared();
        let inner: &'r ResourceInner = self.res.inner();
        let (outer_engine, override_engine) = context::current_engine_settled();
        if !shared.enabled.load(Ordering::Relaxed) {
            return O::decided(Ok(Entry::unchecked(self.res)));
        }

        // The context: the active one, or a fresh one owned by this entry. The state is read whole only when
        // it is the entry's (a fresh one needs its engine and stand-in alone).
        let fresh = outer_engine != shared.id;
        let (state, touches_tls) = if !fresh {
            // An active context (a null one was refused by the context cap: Java's NullContext).
            (context::current(), install)
        } else {
            let mut st = match (self.context, self.origin) {
                (None, None) => shared.default_state(override_engine),
                // `name` is never the default context's (`EntryBuilder::context` leaves it out).
                (name, origin) => shared.context_state(name, origin.unwrap_or(""), override_engine),
            };
            // Another engine's context is active: enter without touching it.
            let touches_tls = install && outer_engine == 0;
            if touches_tls {
                st.era = context::next_era();
            }
            (st, touches_tls)
        };
        // SAFETY: contexts and origins are never freed while the engine (kept alive by `res`) lives; a state of
        // this engine always has a context (past the cap, the overflow context).
        let ctx = unsafe { &*state.ctx };
        let origin = unsafe { &*state.origin };

        let node_arc = inner.node_for(ctx.id);
        if state.cur_node.is_null() {
            ctx.entrance.children.ensure(node_arc);
        } else {
            // SAFETY: the parent entry's node lives as long as the engine.
            unsafe { (*state.cur_node).children.ensure(node_arc) };
        }
        let node: &'r DefaultNode = node_arc;
        let origin_node: Option<&'r OriginNode> = if origin.id == 0 {
            None
        } else {
            Some(inner.cluster.origin_node(origin.id, &origin.name, shared.config.max_origins_per_resource))
        };
        let inbound = self.entry_type == EntryType::In;
        let own = node.records();
        let site = Site {
            shared,
            inner,
            node,
            ctx,
            origin,
            nodes: Nodes::new(node, own, inner, origin_node, inbound, shared),
        };

        // When the call is decided: re-read after a wait for a place, so that the call's response time (and
        // the adaptive limit's sample and back-off epoch) starts when it got its place, as an async call's does.
        let mut now_nanos = shared.clock.now_nanos();
        let mut now_ms = now_nanos / NANOS_PER_MILLI;
        let mut checks = Decided::default();
        // The wait mode rides in `checks` (blocking is its zero: `enter` stores nothing); a retry's deadline
        // is kept where only the cluster rule's slow path looks for it.
        if wait.mode() != 0 {
            checks.tally.wait_mode = wait.mode();
        }
        let _deadline = crate::wait::DeadlineScope::enter(wait.deadline());
        // The system rules apply to an inbound call while one is loaded.
        let system = inbound && shared.system.active();
        let needs_checks =
            inner.has_rules.load(Ordering::Acquire) || system || shared.has_custom_slots.load(Ordering::Acquire);
        if needs_checks {
            // The common case (one simple flow rule, closed breakers, nothing else) is decided without building
            // the general check context; simple rules beside the system rules or an apart kind take a copy of
            // the fast path out of line; anything else takes the general path, in the same read section.
            let general = self.prioritized || shared.has_custom_slots.load(Ordering::Acquire);
            // Inlined: called out of line, the closure's frame and the values passed into it cost every call
            // 30 to 60 instructions (the call of each row of `part-entry-*`).
            let decided = inner.with_rules(
                #[inline(always)]
                |rules| {
                    if !general
                        && !system
                        && rules.fast_path == FastPath::Common
                        && chain::admits_fast(rules, site.shared, now_ms)
                    {
                        // The same chain, specialised: only the slots that can be on the fast path, on the rules
                        // the engine flagged for it.
                        let call = self.fast_view(&site, now_nanos, now_ms);
                        let (mut held, tally) = checks.split();
                        let wait = &mut tally.wait_nanos;
                        return chain::run_fast::<false, false>(rules, site.shared, &call, wait, &mut held);
                    }
                    if !general && rules.fast_path != FastPath::No && chain::admits_fast(rules, site.shared, now_ms) {
                        return self.run_fast_out_of_line(rules, &mut checks, &site, now_nanos, now_ms, system);
                    }
                    self.run_general(rules, &mut checks, &site, now_nanos)
                },
            );
            if let Err(block) = decided {
                // A check that refused a call which may wait left its wait: wait outside the rules' read
                // section, then decide again.
                // (A call that may not wait is never asked to: no thread-local is read for it.)
                let pending = if matches!(wait, Wait::Now) { None } else { crate::wait::take_pending() };
                let block = match pending {
                    Some(p) => {
                        if O::HANDS_BACK && matches!(wait, Wait::Async(_)) {
                            return O::wait(self, p, block);
                        }
                        match self.recheck_after_wait(p, &mut checks, &site) {
                            Ok(placed_at) => {
                                now_nanos = placed_at;
                                now_ms = placed_at / NANOS_PER_MILLI;
                                None
                            }
                            Err(block) => Some(block),
                        }
                    }
                    _ => Some(block),
                };
                if let Some(block) = block {
                    let w = Writer::at(now_ms);
                    site.nodes.for_each(|n| n.block_with(&w, self.acquire));
                    shared.on_block(&block, now_ms, self.acquire);
                    if let Some(o) = inner.observed.get() {
                        o.record_block(&block, self.acquire);
                    }
                    return O::decided(Err(block));
                }
            }
        }

        // A sync call a queueing rule spaced (a rate limiter, warm-up queueing, a prioritized call's borrowed
        // window) sleeps here, and is recorded at its turn, as Java's statistic slot records a call after the
        // flow slot's sleep: its pass falls in the second of its turn, and it is in flight (for system rules and
        // observers) only from then; its response time still starts at its arrival, as Java's does. Its
        // thread-grade permits, taken at its check, stay pending meanwhile, so exact limits still hold its place.
        // A manual clock sleeps nothing: the turn is then the arrival. An async caller awaits its wait after the
        // entry is made: its records wait for its turn in the entry ([`Entry::at_turn`]).
        let turn_pending = O::HANDS_BACK && checks.tally.wait_nanos > 0;
        let w = Writer::at(now_ms);
        if sleep && checks.tally.wait_nanos > 0 && shared.clock.manual().is_none() {
            sleep_until_turn(shared, &site.nodes, checks.tally.wait_nanos, now_ms, checks.tally.occupied, self.acquire);
        } else if !turn_pending {
            record_pass(&site.nodes, &w, checks.tally.occupied, self.acquire);
        }
        if checks.flow.is_active() && !turn_pending {
            // Counted in flight now: its thread-grade permits are no longer pending.
            checks.flow.counted(&flow::PermitNodes::new(
                &site.inner.cluster.stat,
                Some(site.node.stats()),
                site.nodes.origin(),
            ));
        }
        if touches_tls {
            context::set_current(ContextState {
                cur_node: node as *const DefaultNode,
                depth: state.depth + 1,
                ..state
            });
        }
        // Built in the room of the outcome it ends in (an async caller's pass or delayed pass): no copy.
        // An async caller's queued entry is marked as waiting for its turn where its outcome is built.
        O::admitted(checks.tally.wait_nanos > 0, || Entry {
            res: self.res,
            node: Some(node),
            origin_node,
            origin: Some(origin),
            parent: state.cur_node,
            // An entry that leaves the thread's context alone has no installation to restore: its `era` is its
            // scopes' (`Entry::scope_state`), made when first asked for.
            era: std::sync::atomic::AtomicU32::new(if touches_tls { state.era & context::ERA_MASK } else { 0 }),
            created_nanos: now_nanos,
            wait_nanos: checks.tally.wait_nanos,
            depth: state.depth + 1,
            acquire: self.acquire,
            slots_passed: checks.tally.slots_passed,
            error: false,
            flags: Flags::of(touches_tls, fresh, inbound, own, checks.tally.occupied),
            flow: checks.flow,
            param: checks.param,
            breakers: checks.breakers,
            adaptive: checks.adaptive,
        })
    }
}

/// Records a call's pass on its nodes: a pass, or for a call that borrowed a later window (whose pass was
/// counted there when it was admitted), its place in flight alone.
#[inline(always)]
fn record_pass(nodes: &Nodes<'_>, w: &Writer, occupied: bool, acquire: u32) {
    if occupied {
        nodes.for_each(|n| n.borrowed_pass_with(w));
    } else {
        nodes.for_each(|n| n.pass_with(w, acquire));
    }
}

impl Entry<'_> {
    /// The call's queueing wait is over (its async caller awaited it): records its pass, and counts it in
    /// flight, if its entry left them for its turn (a mark its resource handle keeps); nothing otherwise. The
    /// integrations call it once the wait ends; the exit calls it for a call whose turn never came (its
    /// caller gave up while it waited), so that its completion has a pass to balance.
    #[inline(always)]
    pub(crate) fn at_turn(&mut self) {
        if self.res.turn_pending() {
            self.record_turn();
        }
    }

    #[cold]
    #[inline(never)]
    fn record_turn(&mut self) {
        self.res.clear_turn_pending();
        let Some(node) = self.node else { return };
        let (shared, inner) = (self.res.shared(), self.res.inner());
        let (own, inbound) = (self.flags & Flags::OWN != 0, self.flags & Flags::INBOUND != 0);
        let nodes = Nodes::new(node, own, inner, self.origin_node, inbound, shared);
        let turn_ms = (shared.clock.now_nanos() / NANOS_PER_MILLI).max(self.created_nanos / NANOS_PER_MILLI);
        record_pass(&nodes, &Writer::at(turn_ms), self.flags & Flags::OCCUPIED != 0, self.acquire);
        if self.flow.is_active() {
            // Counted in flight now (after its nodes' calls in flight went up): its thread-grade permits are no
            // longer pending.
            self.flow.counted(&flow::PermitNodes::new(&inner.cluster.stat, Some(node.stats()), nodes.origin()));
        }
    }
}

/// Sleeps a sync call's queueing wait (`wait_nanos`), then records its pass at its turn: the clock read again
/// after the sleep, never before the call's decision (`decided_ms`).
#[cold]
#[inline(never)]
fn sleep_until_turn(
    shared: &Shared,
    nodes: &Nodes<'_>,
    wait_nanos: u64,
    decided_ms: u64,
    occupied: bool,
    acquire: u32,
) {
    std::thread::sleep(Duration::from_nanos(wait_nanos));
    let turn_ms = (shared.clock.now_nanos() / NANOS_PER_MILLI).max(decided_ms);
    record_pass(nodes, &Writer::at(turn_ms), occupied, acquire);
}

impl EntryBuilder<'_, '_> {
    /// A check asked the call to wait (`p`): blocks the thread until the wait ends, and decides again with
    /// what the wait got, as often as a check asks again. Admitted, it answers the clock reading of the
    /// decision that admitted it (after the wait): where the call's response time starts.
    #[cold]
    #[inline(never)]
    fn recheck_after_wait(&self, mut p: Pending, checks: &mut Decided, site: &Site<'_>) -> Result<u64, BlockError> {
        loop {
            let deadline = p.deadline();
            let _retry = RetryScope::enter(p.wait_blocking());
            // The checks undid what they took when the call was asked to wait.
            *checks = Decided::default();
            let _deadline = crate::wait::DeadlineScope::enter(deadline);
            let now_nanos = site.shared.clock.now_nanos();
            let decided = site.inner.with_rules(|rules| self.run_general(rules, checks, site, now_nanos));
            match (decided, crate::wait::take_pending()) {
                (Err(_), Some(again)) => p = again,
                (decided, _) => return decided.map(|()| now_nanos),
            }
        }
    }

    /// What every check sees of this call (`now_ms`: `now_nanos` in milliseconds, computed once by the caller).
    #[inline(always)]
    fn call_cx<'c>(&'c self, site: &'c Site<'c>, now_nanos: u64, now_ms: u64) -> CallCx<'c> {
        CallCx {
            resource: &site.inner.name,
            cluster: &site.inner.cluster.stat,
            origin: &site.origin.name,
            origin_node: site.nodes.origin_slot(),
            acquire: self.acquire,
            args: &self.args,
            now_nanos,
            now_ms,
            clock: &site.shared.clock,
            entry_type: self.entry_type,
        }
    }

    /// What the checks of the fast path see of this call, made when one needs it.
    #[inline(always)]
    fn fast_view<'c>(
        &'c self,
        site: &'c Site<'c>,
        now_nanos: u64,
        now_ms: u64,
    ) -> impl crate::slot::contract::FastCall<'c> {
        crate::slot::contract::FastView(
            move || self.call_cx(site, now_nanos, now_ms),
            move || crate::slot::contract::ContextCx { name: site.ctx.name(), node: site.node.stats() },
        )
    }

    /// What the checks of the general path see of this call.
    #[inline(always)]
    fn check_cx<'c>(&'c self, site: &'c Site<'c>, now_nanos: u64, cluster_wait: Wait) -> CheckCx<'c> {
        CheckCx {
            call: self.call_cx(site, now_nanos, now_nanos / NANOS_PER_MILLI),
            node: site.node.stats(),
            context_name: site.ctx.name(),
            prioritized: self.prioritized,
            cluster_wait,
            resources: site.shared,
            waited_nanos: std::cell::Cell::new(0),
        }
    }

    /// Whether the call needs every check whatever its rules (the system rules or user slots apply).
    fn is_general(&self, shared: &Shared) -> bool {
        (self.entry_type == EntryType::In && shared.system.active()) || shared.has_custom_slots.load(Ordering::Acquire)
    }

    /// The fast path's other copies ([`chain::run_fast`]): for rules with an apart kind beside a kind that
    /// holds ([`FastPath::Apart`], the copy that keeps what the checks take), and with the system rules
    /// (`system`: an inbound call while one is loaded). Out of line, as the general path is, so that the common
    /// case's copy compiles as if they were not there.
    #[inline(never)]
    fn run_fast_out_of_line(
        &self,
        rules: &ResourceRules,
        checks: &mut Decided,
        site: &Site<'_>,
        now_nanos: u64,
        now_ms: u64,
        system: bool,
    ) -> Result<(), BlockError> {
        let call = self.fast_view(site, now_nanos, now_ms);
        let (mut held, tally) = checks.split();
        let (shared, wait) = (site.shared, &mut tally.wait_nanos);
        match (rules.fast_path == FastPath::Apart, system) {
            (true, true) => chain::run_fast::<true, true>(rules, shared, &call, wait, &mut held),
            (true, false) => chain::run_fast::<true, false>(rules, shared, &call, wait, &mut held),
            (false, true) => chain::run_fast::<false, true>(rules, shared, &call, wait, &mut held),
            (false, false) => chain::run_fast::<false, false>(rules, shared, &call, wait, &mut held),
        }
    }

    /// Every check in slot order (the general path), on the rules read by the caller.
    #[inline(never)]
    fn run_general(
        &self,
        rules: &ResourceRules,
        checks: &mut Decided,
        site: &Site<'_>,
        now_nanos: u64,
    ) -> Result<(), BlockError> {
        if rules.cluster_only && !self.prioritized && !self.is_general(site.shared) {
            // A lone cluster rule with a leased token in hand, decided before the general check context is
            // built (here rather than beside the fast path, which then compiles as before); without a token
            // in hand, the general path below waits, falls back or blocks.
            let now_ms = now_nanos / NANOS_PER_MILLI;
            if let Some(f) = &rules.flow
                && chain::admits_fast(rules, site.shared, now_ms)
                && flow::check::check_cluster_only(f, now_ms, self.acquire)
            {
                return Ok(());
            }
        }
        let cx = self.check_cx(site, now_nanos, Wait::of_mode(checks.tally.wait_mode));
        chain::run(rules, site.shared, &cx, checks, &mut chain::Taken::default())
    }
}

/// What the entry path returns ([`EntryBuilder::entry_path`]): a decision, or, for async callers, the
/// builder and the wait a check asked for.
pub(super) trait PathResult<'r, 'a>: Sized {
    /// Whether the call may be handed back to wait (else a wait blocks the thread).
    const HANDS_BACK: bool;
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self;
    /// An admitted call's entry, made by `entry` (`waits`: whether it was given a queueing wait). No default:
    /// an outcome that hands its call back ([`HANDS_BACK`](PathResult::HANDS_BACK)) and gives a waiting call its
    /// entry must mark that entry's turn as pending (`ResRef::mark_turn_pending`), since the entry path then
    /// leaves its pass to the turn ([`Entry::at_turn`]); without the mark the pass is never recorded.
    fn admitted(waits: bool, entry: impl FnOnce() -> Entry<'r>) -> Self;
    /// The call must wait (only called when [`HANDS_BACK`](PathResult::HANDS_BACK)); `block` is what the
    /// checks answered meanwhile.
    fn wait(b: EntryBuilder<'r, 'a>, p: Pending, block: BlockError) -> Self;
}

impl<'r, 'a> PathResult<'r, 'a> for Result<Entry<'r>, BlockError> {
    const HANDS_BACK: bool = false;
    #[inline(always)]
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self {
        d
    }
    /// A waiting call sleeps in the entry path, which records its pass at its turn: nothing to mark.
    #[inline(always)]
    fn admitted(_waits: bool, entry: impl FnOnce() -> Entry<'r>) -> Self {
        Ok(entry())
    }
    fn wait(_: EntryBuilder<'r, 'a>, _: Pending, block: BlockError) -> Self {
        Err(block)
    }
}

/// A decision, or the builder back with the wait a check asked for.
pub(super) type MayWait<'r, 'a> = Result<Result<Entry<'r>, BlockError>, (EntryBuilder<'r, 'a>, Pending)>;

impl<'r, 'a> PathResult<'r, 'a> for MayWait<'r, 'a> {
    const HANDS_BACK: bool = true;
    #[inline(always)]
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self {
        Ok(d)
    }
    #[inline(always)]
    fn admitted(waits: bool, entry: impl FnOnce() -> Entry<'r>) -> Self {
        let mut decided = Ok(Ok(entry()));
        if let (true, Ok(Ok(e))) = (waits, &mut decided) {
            // Its caller awaits its wait: its pass waits for its turn.
            e.res.mark_turn_pending();
        }
        decided
    }
    fn wait(b: EntryBuilder<'r, 'a>, p: Pending, _: BlockError) -> Self {
        Err((b, p))
    }
}

/// The first decision of an annotated `async fn` when it is not a plain pass (`EntryBuilder::decide_now`).
#[derive(Debug)]
pub enum Slow<'r> {
    /// Refused.
    Blocked(BlockError),
    /// Admitted after a queueing wait ([`Entry::waited`]), not awaited yet.
    Delayed(Entry<'r>),
    /// A check asks the call to wait, then to be decided again (an adaptive rule's `maxWaitMs`, a cluster
    /// rule's empty lease).
    Wait(AskedToWait),
}

/// The wait a check asked an async call for ([`Slow::Wait`]).
pub struct AskedToWait(pub(crate) Pending);

impl std::fmt::Debug for AskedToWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AskedToWait")
    }
}

/// The decision an async call takes straight on (a pass without a wait), or what it must do first: built in
/// place by the entry path, so the common case moves the entry once.
impl<'r, 'a> PathResult<'r, 'a> for Result<Entry<'r>, Slow<'r>> {
    const HANDS_BACK: bool = true;
    #[inline(always)]
    fn decided(d: Result<Entry<'r>, BlockError>) -> Self {
        match d {
            Ok(entry) if !entry.waits() => Ok(entry),
            Ok(entry) => Err(Slow::Delayed(entry)),
            Err(block) => Err(Slow::Blocked(block)),
        }
    }
    #[inline(always)]
    fn admitted(waits: bool, entry: impl FnOnce() -> Entry<'r>) -> Self {
        if waits {
            let mut delayed = Err(Slow::Delayed(entry()));
            if let Err(Slow::Delayed(e)) = &mut delayed {
                // Its caller awaits its wait: its pass waits for its turn.
                e.res.mark_turn_pending();
            }
            delayed
        } else {
            Ok(entry())
        }
    }
    fn wait(_: EntryBuilder<'r, 'a>, p: Pending, _: BlockError) -> Self {
        Err(Slow::Wait(AskedToWait(p)))
    }
}

/// Where a call stands while it is checked: its engine, its resource, its node in its context, its context and
/// origin, and the nodes it records on (built once in [`EntryBuilder::entry_path`], seen by every check).
struct Site<'c> {
    shared: &'c Shared,
    inner: &'c ResourceInner,
    node: &'c DefaultNode,
    ctx: &'c crate::context::ContextInfo,
    origin: &'c crate::context::OriginInfo,
    nodes: Nodes<'c>,
}

/// The nodes an entry records on: the cluster node first, then the context's node (unless it shows the
/// cluster node's numbers), the origin's and the inbound node when there are.
///
/// Kept as one array and visited by reference: copying it into a temporary would read it back with 16-byte
/// loads while its 8-byte stores are still in flight (a store-forwarding stall).
pub(super) struct Nodes<'r> {
    list: [Option<&'r StatNode>; 4],
}

impl<'r> Nodes<'r> {
    #[inline(always)]
    pub(super) fn new(
        node: &'r DefaultNode,
        own: bool,
        inner: &'r ResourceInner,
        origin: Option<&'r OriginNode>,
        inbound: bool,
        shared: &'r Shared,
    ) -> Self {
        Nodes {
            list: [
                Some(&inner.cluster.stat),
                own.then_some(&node.stat),
                origin.map(|o| &o.stat),
                inbound.then_some(&shared.inbound),
            ],
        }
    }

    /// The origin's node, if the call has an origin.
    #[inline(always)]
    pub(super) fn origin(&self) -> Option<&'r StatNode> {
        self.list[2]
    }

    /// Where the origin's node is kept ([`origin`](Self::origin)).
    #[inline(always)]
    fn origin_slot(&self) -> &Option<&'r StatNode> {
        &self.list[2]
    }

    /// Calls `f` on each node: one call site, so `f` is inlined once rather than outlined.
    #[inline(always)]
    pub(super) fn for_each(&self, f: impl Fn(&StatNode)) {
        for n in self.list.iter().flatten() {
            f(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_decision_that_may_wait_is_returned_in_the_room_of_one_that_may_not() {
        // The web layer and async entries take the decision that may hand the call back: it must cost no
        // more to return than a plain one.
        let plain = std::mem::size_of::<Result<super::Entry<'static>, crate::BlockError>>();
        let may_wait = std::mem::size_of::<super::MayWait<'static, 'static>>();
        assert_eq!(may_wait, plain, "{may_wait} bytes against {plain}");
    }

    #[test]
    fn a_queued_calls_thread_grade_permit_is_pending_until_its_turn_and_never_stays_pending() {
        use crate::clock::ManualClock;
        use crate::flow::{ControlBehavior, FlowGrade, FlowRule};
        use crate::Sentinel;
        let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_000_000)).build();
        let spaced = FlowRule::new("rq").count(10.0).control_behavior(ControlBehavior::RateLimiter);
        let threads = FlowRule::new("rq").grade(FlowGrade::Thread).count(5.0);
        engine.load_flow_rules([spaced.max_queueing_time_ms(500), threads]).unwrap();
        let rq = engine.resource("rq");
        let stat = &rq.inner.cluster.stat;
        // (calls in flight, permits, permits counted in flight): a pending permit is one not counted yet.
        let gate = || {
            let (in_flight, counted, consistent) = stat.thread_gate.counted_permits(|| stat.cur_threads());
            assert!(consistent, "no other thread changes the gate");
            (in_flight, stat.thread_gate.permits(), counted)
        };
        let decide = || match rq.entry().decide_or_queue() {
            Ok(Ok(e)) => e,
            _ => panic!("the rate limiter queues the call, the thread-grade rule has room"),
        };
        let first = decide();
        assert_eq!(gate(), (1, 1, 1), "a call that does not wait is counted at once");
        // Each later call waits 100 ms more for its turn: its permit is pending until then.
        let mut waits_for_its_turn = decide();
        assert!(waits_for_its_turn.waited() > Duration::ZERO);
        assert_eq!(gate(), (1, 2, 1), "the waiting call holds a permit, pending");
        waits_for_its_turn.at_turn();
        assert_eq!(gate(), (2, 2, 2), "counted in flight at its turn");
        waits_for_its_turn.at_turn();
        assert_eq!(gate(), (2, 2, 2), "a turn is counted once");
        let given_up_on = decide();
        assert_eq!(gate(), (2, 3, 2));
        drop(given_up_on);
        assert_eq!(gate(), (2, 2, 2), "a call given up on while it waits leaves no permit, pending or counted");
        drop((first, waits_for_its_turn));
        assert_eq!(gate(), (0, 0, 0));
        let s = engine.cluster_stats("rq").unwrap();
        assert_eq!((s.minute_pass, s.minute_success, s.threads), (3, 3, 0), "{s:?}");
    }
}
