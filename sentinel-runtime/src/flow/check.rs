//! The flow slot (order -2000): decides a call on its resource's flow rules, gives back what it took when a
//! later slot blocks, and releases concurrency permits on exit.

use std::sync::atomic::Ordering;

use crate::clock::EngineClock;
use crate::error::BlockError;
use crate::flow::controller::{reject_qps, Controller, Decision};
use crate::flow::rule::{FlowGrade, FlowStrategy};
use crate::flow::token_service;
use crate::flow::{EntryState, FastRules, FastTaken, FlowRuleState, LimitApp, PermitNodes, ResourceFlowRules, Scratch};
use crate::slot::contract::{
    CallCx, CheckCx, ContextCx, ExitCx, FastCall, Named, RelatedStat, Resources, RuleSlot, Verdict,
};
use crate::stat::admission::Reservation;
use crate::stat::StatNode;

/// The flow slot (order -2000): the resource's flow rules, in order; the first that blocks decides.
pub(crate) struct FlowSlot;

impl RuleSlot for FlowSlot {
    type Rules = ResourceFlowRules;
    /// Other resources by name, for relate rules on the fast path (the general path has them in its context).
    type State = dyn Resources;
    /// Concurrency permits of thread-grade rules.
    type Held = EntryState;
    /// Reservations of QPS rules and tokens of cluster leases.
    type Taken = Scratch;
    /// The token of the QPS rule, while the later checks of the fast path run.
    type FastTaken = FastTaken;
    const ORDER: i32 = crate::slot::ORDER_FLOW;
    const ON_FAST_PATH: bool = true;
    const HOLDS_ON_FAST_PATH: bool = true;

    #[inline(always)]
    fn check(
        rules: &ResourceFlowRules,
        _: &dyn Resources,
        cx: &CheckCx<'_>,
        held: &mut EntryState,
        taken: &mut Scratch,
    ) -> Result<Verdict, BlockError> {
        check(rules, cx, held, taken)
    }

    /// On the fast path the resource's flow rules are [`FastRules`] (or it has none that applies). A
    /// thread-grade rule's permit is held until exit; a QPS rule's token stays in `taken` while the later checks
    /// run; a rate limiter's wait adds to `wait`.
    #[inline(always)]
    fn check_fast<'c>(
        rules: &ResourceFlowRules,
        resources: &dyn Resources,
        call: &impl FastCall<'c>,
        wait: &mut u64,
        held: &mut EntryState,
        taken: Option<&mut FastTaken>,
    ) -> Result<(), BlockError> {
        match rules.simple {
            Some(limit) => check_simple_only(rules, limit, &call.call(), taken),
            None => match (rules.fast_rules(), taken) {
                // Rules for origins, and more than two rules for every caller (or a relate or chain rule), take
                // copies of their own, so that the others compile as if they were not there.
                (Some(fast), None) if !fast.wide => {
                    check_fast_rules::<false, false>(rules, fast, &call.call(), held, wait)
                }
                (Some(fast), None) if !fast.many => {
                    check_fast_rules::<true, false>(rules, fast, &call.call(), held, wait)
                }
                (Some(fast), None) if !fast.reads_others() => {
                    check_fast_rules::<true, true>(rules, fast, &call.call(), held, wait)
                }
                (Some(fast), None) => {
                    let context = fast.chains_any().then(|| call.context());
                    check_fast_others(rules, fast, &call.call(), held, wait, None, resources, context)
                }
                (Some(fast), Some(t)) if !fast.wide => {
                    check_fast_rules_keeping::<false, false>(rules, fast, &call.call(), held, wait, t)
                }
                (Some(fast), Some(t)) if !fast.many => {
                    check_fast_rules_keeping::<true, false>(rules, fast, &call.call(), held, wait, t)
                }
                (Some(fast), Some(t)) if !fast.reads_others() => {
                    check_fast_rules_keeping::<true, true>(rules, fast, &call.call(), held, wait, t)
                }
                (Some(fast), Some(t)) => {
                    let context = fast.chains_any().then(|| call.context());
                    check_fast_others(rules, fast, &call.call(), held, wait, Some(t), resources, context)
                }
                (None, _) => Ok(()),
            },
        }
    }

    /// A later check of the fast path (an adaptive limit) refused the call: its token and its permit go back.
    const UNDOES_ON_FAST_PATH: bool = true;

    #[inline(always)]
    fn undo_fast<'c>(
        _: &ResourceFlowRules,
        _: &dyn Resources,
        call: &impl FastCall<'c>,
        held: &mut EntryState,
        taken: Option<&mut FastTaken>,
    ) {
        let view = call.call();
        // The context's node only when a chain rule holds a permit there (made here, in place: the call's view
        // is not passed out of line).
        let context = held.holds_context_permit().then(|| call.context().node);
        undo_fast(view.cluster, *view.origin_node, context, held, taken);
    }

    #[inline(always)]
    fn give_back(
        _: &ResourceFlowRules,
        _: &dyn Resources,
        cx: &CheckCx<'_>,
        held: &mut EntryState,
        taken: &mut Scratch,
    ) {
        taken.release();
        held.release_permits(&permit_nodes(cx), true);
    }

    #[inline(always)]
    fn holds(held: &EntryState) -> bool {
        held.is_active()
    }

    #[inline(always)]
    fn exit(_: Option<&ResourceFlowRules>, _: &dyn Resources, cx: &ExitCx, held: &mut EntryState) {
        if let Some(nodes) = &cx.nodes {
            let (cluster, context, origin) = nodes.get();
            held.release_permits(&PermitNodes::new(cluster, context, origin), false);
        }
    }
}

/// The nodes a call's permits can be on.
#[inline(always)]
fn permit_nodes(cx: &CheckCx<'_>) -> PermitNodes {
    PermitNodes::new(cx.cluster, Some(cx.node), *cx.origin_node)
}

/// A check that only reads a node: `retry_after` is computed only when it blocks.
#[inline(always)]
fn read_only(pass: bool, retry_after: impl FnOnce() -> Option<std::time::Duration>) -> Decision {
    if pass {
        Decision::Pass { reservation: None, wait_nanos: 0 }
    } else {
        Decision::Block { retry_after: retry_after() }
    }
}

/// Java's `FlowRuleChecker.selectNodeByRequesterAndStrategy`.
#[inline]
fn select_node<'a>(st: &'a FlowRuleState, rules: &ResourceFlowRules, cx: &'a CheckCx<'a>) -> Option<&'a StatNode> {
    let direct = st.rule.strategy == FlowStrategy::Direct;
    let origin: &str = cx.origin.as_str();
    let applies = match &st.limit_app {
        LimitApp::Default => return if direct { Some(cx.cluster) } else { reference_node(st, cx) },
        LimitApp::Origin(app) => !origin.is_empty() && app == origin,
        LimitApp::Other => rules.is_other_origin(origin),
    };
    if !applies {
        return None;
    }
    if direct {
        *cx.origin_node
    } else {
        reference_node(st, cx)
    }
}

/// The node a relate or a chain rule decides on (out of line: most rules are direct, and the general path's
/// loop stays small without it).
#[inline(never)]
fn reference_node<'a>(st: &'a FlowRuleState, cx: &'a CheckCx<'a>) -> Option<&'a StatNode> {
    let r = st.rule.ref_resource.as_deref()?;
    match st.rule.strategy {
        FlowStrategy::Relate => related_node(st, cx.resources),
        FlowStrategy::Chain => (cx.context_name == r).then_some(cx.node),
        FlowStrategy::Direct => None,
    }
}

/// The node a relate rule reads: the related resource's cluster node, once that resource was entered (Java
/// makes the node at its first entry: until then the rule has no node, and lets calls through). Found by name
/// once; a resource not found is looked up again only after a resource was created.
#[inline(always)]
fn related_node<'a>(st: &'a FlowRuleState, resources: &dyn Resources) -> Option<&'a StatNode> {
    let res = match st.ref_resource.get() {
        Some(res) if st.ref_entered.load(Ordering::Relaxed) => return Some(res.stat()),
        Some(res) => res,
        None => find_related(st, resources)?,
    };
    if !res.entered() {
        return None;
    }
    st.ref_entered.store(true, Ordering::Relaxed);
    Some(res.stat())
}

/// [`related_node`]'s lookup by name, until the related resource is found.
#[cold]
#[inline(never)]
fn find_related<'a>(st: &'a FlowRuleState, resources: &dyn Resources) -> Option<&'a RelatedStat> {
    let r = st.rule.ref_resource.as_deref()?;
    let generation = resources.generation();
    if st.ref_miss_generation.load(Ordering::Relaxed) == generation {
        return None;
    }
    match resources.related(r) {
        Some(res) => Some(st.ref_resource.get_or_init(|| res)),
        None => {
            st.ref_miss_generation.store(generation, Ordering::Relaxed);
            None
        }
    }
}

/// A relate rule's decision on the related resource's `node`, which it only reads (that resource's calls are
/// admitted by its own rules): the same for the general path and the fast path.
#[inline(always)]
fn related_decision(st: &FlowRuleState, node: &StatNode, now_ms: u64, acquire: u32) -> Decision {
    let rule = &*st.rule;
    match (rule.grade, &st.controller) {
        // Concurrency frees up when calls finish: no retry time is known.
        (FlowGrade::Thread, _) => read_only(node.cur_threads() as f64 + acquire as f64 <= rule.count, || None),
        (FlowGrade::Qps, Controller::WarmUp(w)) => {
            w.sync(now_ms, node);
            let allowed = w.allowed_qps();
            read_only(node.pass_qps(now_ms) + acquire as f64 <= allowed, || {
                node.qps_retry_after(now_ms, acquire, allowed)
            })
        }
        (FlowGrade::Qps, _) => read_only(node.pass_qps(now_ms) + acquire as f64 <= rule.count, || {
            node.qps_retry_after(now_ms, acquire, rule.count)
        }),
    }
}

/// Checks the resource's flow rules in order; the first that blocks decides.
pub(crate) fn check(
    rules: &ResourceFlowRules,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
    scratch: &mut Scratch,
) -> Result<Verdict, BlockError> {
    if let Some(limit) = rules.simple_limit() {
        return check_simple(rules, limit, cx, es, scratch);
    }
    let mut wait_nanos = 0u64;
    for st in &rules.rules {
        let rule = &*st.rule;
        if rule.cluster_mode {
            if let Some(lease) = st.lease.get() {
                let Some(node) = select_node(st, rules, cx) else {
                    continue;
                };
                let decision = lease.check(node, cx, scratch);
                if let Some(r) = apply(decision, st, node, cx, es, scratch, &mut wait_nanos) {
                    return r;
                }
                continue;
            }
            if !token_service::no_service(rule) {
                // No token service: cluster rules without local fallback pass (Java's behaviour).
                continue;
            }
        }
        let Some(node) = select_node(st, rules, cx) else {
            continue;
        };
        // A relate rule reads another resource's node: its traffic is not admitted here, so the rule can only
        // read it. Every other node is entered only through this resource's rules and is reserved exactly.
        let owned = rule.strategy != FlowStrategy::Relate;
        let decision = match rule.grade {
            FlowGrade::Thread if !owned => related_decision(st, node, cx.now_ms, cx.acquire),
            FlowGrade::Thread => {
                if es.has_permit(&permit_nodes(cx), node) {
                    // The permits count this call already: the others in flight, plus its acquire count.
                    let others = node.thread_permits().saturating_sub(1) + st.in_flight_before(node);
                    read_only((others + cx.acquire as u64) as f64 <= rule.count, || None)
                } else if node.try_thread_permit(cx.acquire as u64 + st.in_flight_before(node), rule.count) {
                    Decision::ThreadPermit
                } else {
                    Decision::Block { retry_after: None }
                }
            }
            FlowGrade::Qps => match &st.controller {
                Controller::Reject | Controller::WarmUp(_) if !owned => {
                    related_decision(st, node, cx.now_ms, cx.acquire)
                }
                _ => {
                    let after = cx.waited_nanos.get().saturating_add(wait_nanos);
                    let mut slot = None;
                    let held = scratch.held(node);
                    let d =
                        owned_qps(st, node, cx.now_ms, cx.acquire, cx.prioritized, held, cx.clock, after, &mut slot);
                    if let Some(slot) = slot {
                        scratch.push_throttled(st, slot);
                    }
                    d
                }
            },
        };
        if let Some(r) = apply(decision, st, node, cx, es, scratch, &mut wait_nanos) {
            return r;
        }
    }
    Ok(Verdict::Pass { wait_nanos })
}

/// The check of a resource whose only rule is simple (see [`ResourceFlowRules::simple_limit`]), without the
/// general rule loop.
#[inline(always)]
fn check_simple(
    rules: &ResourceFlowRules,
    limit: f64,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
    scratch: &mut Scratch,
) -> Result<Verdict, BlockError> {
    let node = cx.cluster;
    match reject_qps(node, cx.now_ms, cx.acquire, limit, cx.prioritized, None) {
        Decision::Pass { reservation, wait_nanos } => {
            if let Some(r) = reservation {
                scratch.push_reservation(node, r);
            }
            Ok(Verdict::Pass { wait_nanos })
        }
        decision => {
            let mut wait_nanos = 0u64;
            match apply(decision, &rules.rules[0], node, cx, es, scratch, &mut wait_nanos) {
                Some(r) => r,
                None => Ok(Verdict::Pass { wait_nanos }),
            }
        }
    }
}

/// The fast path's check of a resource whose only flow rule is one simple rule (`limit`, the only rule of
/// `rules`), for a call that is not prioritized: the token it takes goes to `taken`.
#[inline(always)]
fn check_simple_only(
    rules: &ResourceFlowRules,
    limit: f64,
    call: &CallCx<'_>,
    taken: Option<&mut FastTaken>,
) -> Result<(), BlockError> {
    let (now_ms, acquire) = (call.now_ms, call.acquire);
    // `reject_qps` without a held reservation and not prioritized, reduced to the reservation itself: going
    // through it (and its `Decision`) measured 1.5 ns more per call on this path.
    let node = call.cluster;
    match node
        .admission()
        .try_reserve(now_ms, acquire, limit, &|start| super::controller::borrowed_for_open(node, start))
    {
        Some(r) => {
            if let Some(t) = taken {
                t.keep(node, r);
            }
            Ok(())
        }
        // The block is built from two of the call's fields, not from `call`: passing `call` to the cold
        // function would make the fast path store the whole call view on the stack first.
        None => Err(fast_block(rules, 0, call.resource, call.origin, node.qps_retry_after(now_ms, acquire, limit))),
    }
}

/// The fast path's check of [`FastRules`] other than a lone reject-style QPS rule (which takes
/// [`check_simple_only`]): for every caller a QPS rule of any control behaviour, a thread-grade rule, one of
/// each, or two QPS rules (`MANY`: three or more, up to [`FastRules::MAX_FOR_EVERY_CALLER`]; with a relate or
/// chain rule among them, [`check_fast_others`]), after the rules for the caller's origin if some apply
/// (`BY_ORIGIN`: the resource may have rules for origins), in the rules' order. A thread-grade rule's permit is held (`held`) until exit; what the earlier rules took is given back
/// when a later one refuses; a QPS rule's token goes to `taken`; a rate limiter's wait adds to `wait`.
#[inline(never)]
fn check_fast_rules<const BY_ORIGIN: bool, const MANY: bool>(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    call: &CallCx<'_>,
    held: &mut EntryState,
    wait: &mut u64,
) -> Result<(), BlockError> {
    fast_rules::<BY_ORIGIN, MANY>(rules, fast, call, held, wait, None, None)
}

/// [`check_fast_rules`] where a later check may refuse the call: the QPS rule's token goes to `taken`.
#[inline(never)]
fn check_fast_rules_keeping<const BY_ORIGIN: bool, const MANY: bool>(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    call: &CallCx<'_>,
    held: &mut EntryState,
    wait: &mut u64,
    taken: &mut FastTaken,
) -> Result<(), BlockError> {
    fast_rules::<BY_ORIGIN, MANY>(rules, fast, call, held, wait, Some(taken), None)
}

/// The fast path's check of [`FastRules`] with a relate or a chain rule among the rules for every caller: they
/// take the loop of [`check_fast_rules`]'s `MANY` copies, in a copy of its own that finds the related resources
/// through `resources` and reads the call's `context` (made only for chain rules), so that the other copies
/// test nothing for them. The tokens go to `taken` when a later check may refuse the call.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn check_fast_others(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    call: &CallCx<'_>,
    held: &mut EntryState,
    wait: &mut u64,
    taken: Option<&mut FastTaken>,
    resources: &dyn Resources,
    context: Option<ContextCx<'_>>,
) -> Result<(), BlockError> {
    let mut others = Others { resources, context, took: Took::Nothing };
    fast_rules::<true, true>(rules, fast, call, held, wait, taken, Some(&mut others))
}

/// What the rules' loop reads for relate and chain rules, and what the chain rules took.
struct Others<'a> {
    /// Other resources by name (relate rules).
    resources: &'a dyn Resources,
    /// The call's context (when the resource has chain rules).
    context: Option<ContextCx<'a>>,
    /// What the chain rules took on the resource's node in the context (a token, a permit).
    took: Took,
}

impl Others<'_> {
    /// A rule refused the call: what the chain rules took goes back.
    fn give_back(&mut self) {
        if let Some(context) = self.context {
            std::mem::replace(&mut self.took, Took::Nothing).give_back_to(context.node);
        }
    }
}

/// `BY_ORIGIN`: the resource may have rules for origins ([`FastRules::by_origin`]; always with `MANY`).
/// `MANY`: it has more than two rules for every caller, or a relate or chain rule ([`FastRules::many`]);
/// `others` reads for those (`None`: the resource has none, and the copy tests for none).
#[inline(always)]
fn fast_rules<const BY_ORIGIN: bool, const MANY: bool>(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    call: &CallCx<'_>,
    held: &mut EntryState,
    wait: &mut u64,
    taken: Option<&mut FastTaken>,
    mut others: Option<&mut Others<'_>>,
) -> Result<(), BlockError> {
    let block = |at, retry_after| fast_block(rules, at, call.resource, call.origin, retry_after);
    // The rule for the caller's origin first, as the rules' order has it (Java checks the rules for origins
    // before those for every caller), on the origin's node.
    let by_origin = match BY_ORIGIN && (!MANY || fast.by_origin > 0) {
        false => None,
        true => fast_by_origin(rules, fast, call, wait).map_err(|(at, retry_after)| block(at, retry_after))?,
    };
    let base = if BY_ORIGIN { fast.by_origin } else { 0 };
    let give_back_by_origin = |by_origin: OriginTaken<'_>| {
        if let Some((node, took)) = by_origin {
            took.give_back_to(node);
        }
    };
    let (first, second) = if MANY {
        // More than two rules for every caller, or a relate or chain rule: the token, the permit.
        let many = match others.as_deref_mut() {
            None => fast_many::<false>(rules, fast, base, call, wait, None),
            Some(o) => fast_many::<true>(rules, fast, base, call, wait, Some(o)),
        };
        match many {
            Ok(took) => took,
            Err((at, retry_after)) => {
                give_back_by_origin(by_origin);
                return Err(block(at, retry_after));
            }
        }
    } else if rules.rules.len() > base {
        let mut first = match fast_one(rules, fast, base, call, wait, None) {
            Ok(took) => took,
            Err(retry_after) => {
                give_back_by_origin(by_origin);
                return Err(block(base, retry_after));
            }
        };
        let second = if rules.rules.len() > base + 1 {
            // A second QPS rule reserves in the node's second window, on the first one's reservation (as the
            // general path does), so that each limit holds exactly.
            let held = match &mut first {
                Took::Reservation(r) if fast.threads.is_none() => Some(r),
                _ => None,
            };
            match fast_one(rules, fast, base + 1, call, wait, held) {
                Ok(took) => took,
                Err(retry_after) => {
                    first.give_back_to(call.cluster);
                    give_back_by_origin(by_origin);
                    return Err(block(base + 1, retry_after));
                }
            }
        } else {
            Took::Nothing
        };
        (first, second)
    } else {
        (Took::Nothing, Took::Nothing)
    };
    if let Some(t) = taken {
        // One reservation at most on the resource's node (a later QPS rule's is the first's), one on the
        // origin's: their tokens, kept for an undo.
        match (&first, &second) {
            (Took::Reservation(r), _) | (_, Took::Reservation(r)) => t.keep(call.cluster, *r),
            _ => {}
        }
        if let Some((node, Took::Reservation(r) | Took::Both(r))) = &by_origin {
            t.keep_origin(node, *r);
        }
        if let Some(Others { context: Some(context), took: Took::Reservation(r) | Took::Both(r), .. }) = &others {
            t.keep_context(context.node, *r);
        }
    }
    if matches!(first, Took::Permit) || matches!(second, Took::Permit) {
        held.push_cluster_permit();
    }
    if let Some((_, Took::Permit | Took::Both(_))) = by_origin {
        held.push_origin_permit();
    }
    if let Some(Others { took: Took::Permit | Took::Both(_), .. }) = others {
        held.push_context_permit();
    }
    Ok(())
}

/// What the rule for the caller's origin took (a token or a permit), on the origin's node.
type OriginTaken<'c> = Option<(&'c StatNode, Took)>;

/// The rule for the caller's origin, if one applies, on the origin's node: what it took, or the rule that
/// refused the call with its retry time. Out of line: only resources with rules for origins take it.
#[inline(never)]
fn fast_by_origin<'c>(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    call: &CallCx<'c>,
    wait: &mut u64,
) -> Result<OriginTaken<'c>, (usize, Option<std::time::Duration>)> {
    if !fast.one_per_origin {
        return fast_by_origins(rules, fast, call, wait);
    }
    let (Some(node), Some(at)) = (*call.origin_node, fast.origin_rule(rules, call.origin.as_str())) else {
        return Ok(None);
    };
    match fast_on(&rules.rules[at], node, call, wait, None) {
        Ok(took) => Ok(Some((node, took))),
        Err(retry_after) => Err((at, retry_after)),
    }
}

/// [`fast_by_origin`] where an origin (or "other") has several rules: those that apply to the call, in order,
/// on the origin's node, as on the general path (a QPS rule after one that reserved on the node checks on that
/// reservation). What they took together, or the rule that refused the call with its retry time (what the
/// rules before it took went back then).
#[inline(never)]
fn fast_by_origins<'c>(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    call: &CallCx<'c>,
    wait: &mut u64,
) -> Result<OriginTaken<'c>, (usize, Option<std::time::Duration>)> {
    let Some(node) = *call.origin_node else {
        return Ok(None);
    };
    let mut applying = fast.origin_rules(rules, call.origin.as_str());
    if applying == 0 {
        return Ok(None);
    }
    let mut took = Took::Nothing;
    while applying != 0 {
        let at = applying.trailing_zeros() as usize;
        applying &= applying - 1;
        let held = took.reservation();
        match fast_on(&rules.rules[at], node, call, wait, held) {
            Ok(t) => took = took.with(t),
            Err(retry_after) => {
                took.give_back_to(node);
                return Err((at, retry_after));
            }
        }
    }
    Ok(Some((node, took)))
}

/// The fast path's undo ([`RuleSlot::undo_fast`]): the tokens the check took and the permits it holds go back
/// (`context`: the resource's node in the call's context, when a chain rule holds a permit there).
#[cold]
#[inline(never)]
fn undo_fast(
    cluster: &StatNode,
    origin: Option<&StatNode>,
    context: Option<&StatNode>,
    held: &mut EntryState,
    taken: Option<&mut FastTaken>,
) {
    if let Some(t) = taken {
        t.release();
    }
    held.release_permits(&PermitNodes::new(cluster, context, origin), true);
}

/// What one rule of [`FastRules`] took for a call it let through (or, `Both`, several rules together on one
/// node: in [`fast_many`], [`fast_by_origins`]).
enum Took {
    Nothing,
    Reservation(Reservation),
    Permit,
    /// A token and a permit: only of several rules together on one node ([`fast_many`], [`fast_by_origins`]).
    Both(Reservation),
}

impl Took {
    /// A later rule refused the call: back to `node`, where it was taken.
    #[cold]
    fn give_back_to(self, node: &StatNode) {
        match self {
            Took::Nothing => {}
            Took::Reservation(r) => node.admission().release(r),
            Took::Permit => node.release_thread_permit(true),
            Took::Both(r) => {
                node.admission().release(r);
                node.release_thread_permit(true);
            }
        }
    }

    /// The token taken, which a later QPS rule on the same node reserves on (or checks on).
    #[inline(always)]
    fn reservation(&mut self) -> Option<&mut Reservation> {
        match self {
            Took::Reservation(r) | Took::Both(r) => Some(r),
            Took::Nothing | Took::Permit => None,
        }
    }

    /// What this and `other` took together, on one node, when at most one of them took a token and at most
    /// one a permit.
    fn with(self, other: Took) -> Took {
        match (self, other) {
            (Took::Nothing, t) | (t, Took::Nothing) => t,
            (Took::Reservation(r), Took::Permit) | (Took::Permit, Took::Reservation(r)) => Took::Both(r),
            // Two tokens or two permits on one node: the rules' limits (one thread-grade rule; a later QPS rule
            // checks on the reservation held) never let that happen.
            _ => unreachable!("two tokens or two permits taken on one node"),
        }
    }
}

/// Three or more rules for every caller (at most [`FastRules::MAX_FOR_EVERY_CALLER`]), or rules among which a
/// relate or a chain rule, from `from` on, each decided as on the general path: a QPS rule after one that
/// reserved on its node checks on that reservation; a relate rule reads the related resource's node (found
/// through `others`); a chain rule naming the call's context decides on the resource's node in it. What they
/// took together on the resource's node (the token, the permit; the chain rules' go to `others`), or the rule
/// that refused the call with its retry time (what the rules before it took went back then). Out of line: few
/// resources have more than two rules for every caller.
///
/// `OTHERS`: a rule may be a relate or a chain rule (the copy without tests nothing for them).
#[inline(never)]
fn fast_many<const OTHERS: bool>(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    from: usize,
    call: &CallCx<'_>,
    wait: &mut u64,
    mut others: Option<&mut Others<'_>>,
) -> Result<(Took, Took), (usize, Option<std::time::Duration>)> {
    let mut took = Took::Nothing;
    for at in from..rules.rules.len() {
        if OTHERS
            && fast.reads_other(at)
            && let Some(o) = others.as_deref_mut()
        {
            let st = &rules.rules[at];
            let decided = match fast.relates(at) {
                // Takes nothing: it only reads the other resource's node.
                true => fast_related(st, o.resources, call),
                false => fast_chain(st, o, call, wait),
            };
            if let Err(retry_after) = decided {
                took.give_back_to(call.cluster);
                o.give_back();
                return Err((at, retry_after));
            }
            continue;
        }
        let held = took.reservation();
        match fast_one(rules, fast, at, call, wait, held) {
            Ok(t) => took = took.with(t),
            Err(retry_after) => {
                took.give_back_to(call.cluster);
                if OTHERS && let Some(o) = others {
                    o.give_back();
                }
                return Err((at, retry_after));
            }
        }
    }
    Ok(match took {
        Took::Both(r) => (Took::Reservation(r), Took::Permit),
        t => (t, Took::Nothing),
    })
}

/// The rule at `at` of [`FastRules`] on the call (neither a relate rule, [`fast_related`], nor a chain rule,
/// [`fast_chain`]): `Err` with the retry time when it refuses. `held`: a reservation an earlier rule took on
/// the resource's node.
#[inline(always)]
fn fast_one(
    rules: &ResourceFlowRules,
    fast: &FastRules,
    at: usize,
    call: &CallCx<'_>,
    wait: &mut u64,
    held: Option<&mut Reservation>,
) -> Result<Took, Option<std::time::Duration>> {
    let node = call.cluster;
    if let Some((i, limit)) = fast.threads
        && i == at
    {
        return fast_permit(&rules.rules[i], limit, node, call);
    }
    fast_qps(&rules.rules[at], node, call, wait, held)
}

/// A relate rule of the fast path ([`related_decision`] on [`related_node`]): `Err` with the retry time when it
/// refuses. It lets the call through while the related resource has no node (not entered yet), as Java's does.
#[inline(always)]
fn fast_related(
    st: &FlowRuleState,
    resources: &dyn Resources,
    call: &CallCx<'_>,
) -> Result<(), Option<std::time::Duration>> {
    let Some(node) = related_node(st, resources) else {
        return Ok(());
    };
    match related_decision(st, node, call.now_ms, call.acquire) {
        Decision::Block { retry_after } => Err(retry_after),
        _ => Ok(()),
    }
}

/// A chain rule of the fast path: for a call in the context it names, its decision on the resource's node in
/// that context ([`fast_on`]; a QPS rule after a chain rule that reserved there checks on that reservation),
/// what it took added to `others`' (Java's `selectNodeByRequesterAndStrategy`: no node, and no decision, in
/// any other context). `Err` with the retry time when it refuses.
#[inline(always)]
fn fast_chain(
    st: &FlowRuleState,
    others: &mut Others<'_>,
    call: &CallCx<'_>,
    wait: &mut u64,
) -> Result<(), Option<std::time::Duration>> {
    let Some(context) = others.context.filter(|c| st.rule.ref_resource.as_deref() == Some(c.name)) else {
        return Ok(());
    };
    // The context's node records its own calls whenever a chain rule names the context (the engine splits the
    // default context's node before such a rule is published): never the resource's node.
    debug_assert!(!std::ptr::eq(context.node, call.cluster));
    let held = others.took.reservation();
    let took = fast_on(st, context.node, call, wait, held)?;
    others.took = std::mem::replace(&mut others.took, Took::Nothing).with(took);
    Ok(())
}

/// A rule of the fast path on a node other than the resource's (the caller's origin's, or for a chain rule the
/// resource's node in the call's context): a thread-grade rule's permit, or a QPS rule's decision
/// ([`fast_qps`]; `held`: a reservation an earlier rule took on `node`).
#[inline(always)]
fn fast_on(
    st: &FlowRuleState,
    node: &StatNode,
    call: &CallCx<'_>,
    wait: &mut u64,
    held: Option<&mut Reservation>,
) -> Result<Took, Option<std::time::Duration>> {
    if st.rule.grade == FlowGrade::Thread {
        return fast_permit(st, st.rule.count, node, call);
    }
    fast_qps(st, node, call, wait, held)
}

/// A thread-grade rule's permit on `node` for the call, within `limit` calls in flight (counting the calls from
/// before the rule that are still in flight); `Err` (no retry time: concurrency frees up when calls finish).
#[inline(always)]
fn fast_permit(
    st: &FlowRuleState,
    limit: f64,
    node: &StatNode,
    call: &CallCx<'_>,
) -> Result<Took, Option<std::time::Duration>> {
    let acquire = call.acquire as u64 + st.in_flight_before(node);
    if node.try_thread_permit(acquire, limit) {
        Ok(Took::Permit)
    } else {
        Err(None)
    }
}

/// A QPS rule of the fast path on `node` (the resource's, the caller's origin's, or the resource's node in the
/// call's context): `Err` with the retry time when it refuses. `held`: a reservation an earlier rule took on
/// `node` (this rule then reserves in the node's second window on it, or checks there).
#[inline(always)]
fn fast_qps(
    st: &FlowRuleState,
    node: &StatNode,
    call: &CallCx<'_>,
    wait: &mut u64,
    held: Option<&mut Reservation>,
) -> Result<Took, Option<std::time::Duration>> {
    let (now_ms, acquire) = (call.now_ms, call.acquire);
    if held.is_none() && matches!(st.controller, Controller::Reject) {
        let count = st.rule.count;
        return match node
            .admission()
            .try_reserve(now_ms, acquire, count, &|start| super::controller::borrowed_for_open(node, start))
        {
            Some(r) => Ok(Took::Reservation(r)),
            None => Err(node.qps_retry_after(now_ms, acquire, count)),
        };
    }
    // `wait`: what the checks before this one asked the call to wait.
    // The fast path never decides a call again after a wait: the rate limiter's slot needs no undo.
    match owned_qps(st, node, now_ms, acquire, false, held, call.clock, *wait, &mut None) {
        Decision::Pass { reservation, wait_nanos } => {
            *wait += wait_nanos;
            Ok(reservation.map_or(Took::Nothing, Took::Reservation))
        }
        Decision::Block { retry_after } => Err(retry_after),
        // Not prioritized: never borrowed nor a permit.
        Decision::Occupied { .. } | Decision::ThreadPermit => Ok(Took::Nothing),
    }
}

/// A QPS rule's decision on a node its resource owns (any node but a related resource's): the same for the
/// general path and the fast path. `held`: a reservation this call already took on the node. `after`: what
/// the checks before this one asked the call to wait; a rate limiter spaces the call from the time it gets
/// there, that long after now (as Java's does after the earlier checks' sleeps), so the waits of several
/// rate limiters overlap instead of adding up. `slot`: the slot a rate limiter's pass took.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn owned_qps(
    st: &FlowRuleState,
    node: &StatNode,
    now_ms: u64,
    acquire: u32,
    prioritized: bool,
    held: Option<&mut Reservation>,
    clock: &EngineClock,
    after: u64,
    slot: &mut Option<(u64, u64)>,
) -> Decision {
    let count = st.rule.count;
    match &st.controller {
        Controller::Reject => reject_qps(node, now_ms, acquire, count, prioritized, held),
        Controller::WarmUp(w) => {
            w.sync(now_ms, node);
            reject_qps(node, now_ms, acquire, w.allowed_qps(), false, held)
        }
        Controller::RateLimiter(t) => {
            later(t.acquire(clock.precise_nanos().saturating_add(after), acquire, count, slot), after)
        }
        Controller::WarmUpRateLimiter(w, t) => {
            w.sync(now_ms, node);
            later(t.acquire(clock.precise_nanos().saturating_add(after), acquire, w.allowed_qps(), slot), after)
        }
    }
}

/// A rate limiter's decision made `after` ns past the call's time: a retry is that much further away.
#[inline(always)]
fn later(decision: Decision, after: u64) -> Decision {
    match decision {
        Decision::Block { retry_after: Some(r) } if after > 0 => {
            Decision::Block { retry_after: Some(r.saturating_add(std::time::Duration::from_nanos(after))) }
        }
        d => d,
    }
}

/// The whole check of a resource whose only rule is a cluster rule for every caller (and only closed
/// breakers), for a call that is not prioritized: true when a leased token paid for it. Anything else (no
/// token in hand, no token service) takes the general path, which waits, falls back or blocks.
#[inline(always)]
pub(crate) fn check_cluster_only(rules: &ResourceFlowRules, now_ms: u64, acquire: u32) -> bool {
    match rules.rules[0].lease.get() {
        Some(lease) => lease.take_in_hand(now_ms, acquire),
        None => false,
    }
}

/// The fast path's block by the rule at `at` of `rules`.
#[cold]
fn fast_block(
    rules: &ResourceFlowRules,
    at: usize,
    resource: Named<'_>,
    origin: Named<'_>,
    retry_after: Option<std::time::Duration>,
) -> BlockError {
    BlockError::Flow {
        resource: resource.share(),
        rule: rules.rules[at].rule_for_block(),
        origin: origin.share(),
        retry_after,
    }
}

/// Acts on one rule's decision: `Some` ends the check (occupied or blocked), `None` goes on to the next rule.
#[inline(always)]
fn apply(
    decision: Decision,
    st: &FlowRuleState,
    node: &StatNode,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
    scratch: &mut Scratch,
    wait_nanos: &mut u64,
) -> Option<Result<Verdict, BlockError>> {
    match decision {
        Decision::Pass { reservation, wait_nanos: w } => {
            if let Some(r) = reservation {
                scratch.push_reservation(node, r);
            }
            *wait_nanos += w;
            None
        }
        Decision::ThreadPermit => {
            if !es.push_permit(&permit_nodes(cx), node) {
                node.release_thread_permit(true);
            }
            None
        }
        Decision::Occupied { wait_nanos: w, at_ms, future_ms } => {
            // The call passes in a later window: the tokens the earlier rules took in this one go back (Java
            // counts a borrower only in the window it borrowed), while the thread-grade permits stay until its
            // exit (it is a call in flight, counted in Java's `curThreadNum`).
            scratch.release();
            // Kept only if the later checks that still apply to a borrower (an adaptive limit) pass it.
            scratch.push_borrow(node, at_ms, future_ms, cx.acquire);
            Some(Ok(Verdict::Occupied { wait_nanos: *wait_nanos + w }))
        }
        Decision::Block { retry_after } => {
            scratch.release();
            es.release_permits(&permit_nodes(cx), true);
            Some(Err(BlockError::Flow {
                resource: cx.resource.share(),
                rule: st.rule_for_block(),
                origin: cx.origin.share(),
                retry_after,
            }))
        }
    }
}
