//! Flow control: QPS and concurrency limits with node selection by origin, relation and chain.
//!
//! The rules' data is in `rule.rs`; the manager (`manager.rs`) validates, loads and compiles them per
//! resource (`ResourceFlowRules`, here, with what a call holds and takes); the slot (`check.rs`) decides a
//! call on them and gives back what it took.

pub(crate) mod check;
mod cluster_status;
mod controller;
mod lease_check;
pub(crate) mod manager;
#[cfg(feature = "tower")]
pub(crate) mod peek;
pub(crate) mod rule;
pub(crate) mod token_service;

pub use cluster_status::{ClusterRuleMode, ClusterRuleStatus, ClusterServiceInfo};
pub use rule::{
    ClusterConfig, ClusterThresholdType, ControlBehavior, FallbackInstances, FlowGrade, FlowRule, FlowStrategy,
    ASSUMED_INSTANCES,
};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::slot::contract::RelatedStat;
use crate::stat::admission::Reservation;
use crate::stat::StatNode;
use crate::{LIMIT_APP_DEFAULT, LIMIT_APP_OTHER};

use controller::Controller;

/// Whose calls a rule limits, decided once at load (no string comparison per call for the common kinds).
enum LimitApp {
    Default,
    Other,
    Origin(String),
}

/// A loaded rule with its controller state.
pub(crate) struct FlowRuleState {
    pub(crate) rule: Arc<FlowRule>,
    /// Per-stripe copies of `rule`, for the errors of blocked calls.
    rule_shares: crate::stat::stripe::Shares<FlowRule>,
    limit_app: LimitApp,
    controller: Controller,
    /// The related resource, once it exists (relate strategy).
    ref_resource: OnceLock<RelatedStat>,
    /// Registry generation at the last failed lookup of `ref_resource`.
    ref_miss_generation: AtomicUsize,
    /// Whether the related resource was seen entered (relate strategy): from then on the rule reads it.
    ref_entered: AtomicBool,
    /// Cluster mode with a token service registered: the rule's leased tokens.
    pub(crate) lease: OnceLock<Arc<token_service::RuleLease>>,
    /// A thread-grade rule on one node: the calls in flight on it that hold no permit, having entered before
    /// the rule was loaded (`u64::MAX` until its first check reads them). It only goes down, to 0 once they
    /// have all exited; until then they count toward the limit, as Java's `curThreadNum` counts every call
    /// in flight. (0 for the other rules; an `other` rule reads a node per origin and does not track them.)
    in_flight_before: AtomicU64,
}

crate::stat::stripe::duplicate_by_clone!(FlowRule);

impl FlowRuleState {
    /// The rule, for a blocked call's error (see [`Shares`](crate::stat::stripe::Shares)).
    #[inline]
    pub(crate) fn rule_for_block(&self) -> Arc<FlowRule> {
        self.rule_shares.share(&self.rule)
    }

    /// A cluster rule (QPS and reject, by validation) for every caller on the resource's own node.
    fn is_cluster_only(&self) -> bool {
        self.rule.cluster_mode
            && self.rule.strategy == FlowStrategy::Direct
            && matches!(self.limit_app, LimitApp::Default)
    }

    fn is_simple(&self) -> bool {
        self.rule.grade == FlowGrade::Qps && matches!(self.controller, Controller::Reject) && self.is_plain()
    }

    /// A QPS rule (any control behaviour) for every caller on the resource's own node, local.
    fn is_plain_qps(&self) -> bool {
        self.rule.grade == FlowGrade::Qps && self.is_plain()
    }

    /// A thread-grade rule for every caller on the resource's own node, local.
    fn is_simple_threads(&self) -> bool {
        self.rule.grade == FlowGrade::Thread && self.is_plain()
    }

    /// A local chain rule for every caller (Java's `CHAIN`): it decides on the resource's node in the context it
    /// names, for the calls made in that context.
    fn is_fast_chain(&self) -> bool {
        self.rule.strategy == FlowStrategy::Chain
            && self.rule.ref_resource.is_some()
            && matches!(self.limit_app, LimitApp::Default)
            && !self.rule.cluster_mode
    }

    /// A local relate rule for every caller that only reads the related resource's node: thread grade, or QPS
    /// rejecting or warming up (a rate limiter spaces the calls on its own state: the general path).
    fn is_fast_relate(&self) -> bool {
        self.rule.strategy == FlowStrategy::Relate
            && self.rule.ref_resource.is_some()
            && matches!(self.limit_app, LimitApp::Default)
            && !self.rule.cluster_mode
            && (self.rule.grade == FlowGrade::Thread
                || matches!(self.controller, Controller::Reject | Controller::WarmUp(_)))
    }

    /// For every caller, on the resource's own node, and local.
    fn is_plain(&self) -> bool {
        self.rule.strategy == FlowStrategy::Direct
            && matches!(self.limit_app, LimitApp::Default)
            && !self.rule.cluster_mode
    }

    fn new(rule: FlowRule) -> Self {
        let controller = Controller::for_rule(&rule);
        let limit_app = match rule.limit_app.as_str() {
            LIMIT_APP_DEFAULT => LimitApp::Default,
            LIMIT_APP_OTHER => LimitApp::Other,
            app => LimitApp::Origin(app.to_string()),
        };
        let one_gate = rule.grade == FlowGrade::Thread
            && rule.strategy != FlowStrategy::Relate
            && !matches!(limit_app, LimitApp::Other);
        let in_flight_before = if one_gate { u64::MAX } else { 0 };
        FlowRuleState {
            rule: Arc::new(rule),
            rule_shares: Default::default(),
            limit_app,
            controller,
            ref_resource: OnceLock::new(),
            ref_miss_generation: AtomicUsize::new(usize::MAX),
            ref_entered: AtomicBool::new(false),
            lease: OnceLock::new(),
            in_flight_before: AtomicU64::new(in_flight_before),
        }
    }

    /// The calls in flight on `node` (the node the rule reads) that hold no permit of its gate: they entered
    /// before the rule was loaded (see `in_flight_before`). A permit the call being checked took already (an
    /// earlier rule's) is pending: not one of them.
    #[inline(always)]
    fn in_flight_before(&self, node: &StatNode) -> u64 {
        match self.in_flight_before.load(Ordering::Relaxed) {
            0 => 0,
            known => self.in_flight_before_now(node, known),
        }
    }

    /// Reads them again from the node: its calls in flight that hold no permit, never more than known.
    #[cold]
    #[inline(never)]
    fn in_flight_before_now(&self, node: &StatNode, known: u64) -> u64 {
        // The permits of calls counted in flight, read consistently with the calls in flight (a permit whose
        // call is not counted yet, or no longer, is not subtracted: see `ThreadGate`). A reading that is not
        // consistent answers for this call only: what is known is lowered by consistent ones alone.
        let (in_flight, permits_in_flight, consistent) = node.thread_gate.counted_permits(|| node.cur_threads());
        let now = in_flight.saturating_sub(permits_in_flight).min(known);
        if consistent {
            self.in_flight_before.fetch_min(now, Ordering::Relaxed);
        }
        now
    }
}

/// The flow rules of one resource: local ones first, cluster-mode ones last; specific origins before `"default"`.
pub(crate) struct ResourceFlowRules {
    pub(crate) rules: Vec<Arc<FlowRuleState>>,
    /// Origins named by a rule of this resource (an origin named here is not "other").
    named_origins: Vec<String>,
    /// Whether a rule of this resource is for `"default"`: a caller whose origin is literally `default` is
    /// then not "other" (Java's `isOtherOrigin` compares the origin with every rule's `limitApp`).
    names_default: bool,
    /// The limit of the resource's only rule when it is a local reject-style QPS limit on its own cluster
    /// node for every origin (the common rule): checked without the general loop.
    simple: Option<f64>,
    /// The rules when the fast path decides them ([`FastRules`]).
    pub(crate) fast: Option<FastRules>,
    /// The resource's only rule is a cluster rule for every caller on the resource's own node: a call with a
    /// leased token in hand is decided without the general loop ([`check_cluster_only`](check::check_cluster_only)).
    cluster_only: bool,
}

impl ResourceFlowRules {
    /// One resource's rules: local rules before cluster-mode ones, and among each, specific origins (and
    /// "other") before "default", keeping the given order otherwise (Java's `FlowRuleComparator`).
    fn new(mut rules: Vec<Arc<FlowRuleState>>) -> Self {
        rules.sort_by_key(|s| (s.rule.cluster_mode, s.rule.limit_app == LIMIT_APP_DEFAULT));
        let named_origins = rules
            .iter()
            .map(|s| s.rule.limit_app.clone())
            .filter(|a| a != LIMIT_APP_DEFAULT && a != LIMIT_APP_OTHER)
            .collect();
        let names_default = rules.iter().any(|s| s.rule.limit_app == LIMIT_APP_DEFAULT);
        let simple = (rules.len() == 1 && rules[0].is_simple()).then(|| rules[0].rule.count);
        let cluster_only = rules.len() == 1 && rules[0].is_cluster_only();
        let fast = FastRules::of(&rules);
        ResourceFlowRules { rules, named_origins, names_default, simple, fast, cluster_only }
    }

    /// The origins the rules name in `limit_app` (neither `default` nor `other`).
    pub(crate) fn named_origins(&self) -> &[String] {
        &self.named_origins
    }

    /// Whether a caller from `origin` is "other": it has an origin, and no rule of the resource names it in
    /// `limit_app`, `default` and `other` included (Java's `FlowRuleManager.isOtherOrigin`; an `other` rule
    /// is asking, so `other` is named).
    pub(crate) fn is_other_origin(&self, origin: &str) -> bool {
        let named = origin == LIMIT_APP_OTHER
            || (self.names_default && origin == LIMIT_APP_DEFAULT)
            || self.named_origins.iter().any(|o| o == origin);
        !origin.is_empty() && !named
    }

    /// The rules, when the fast path decides them.
    pub(crate) fn fast_rules(&self) -> Option<&FastRules> {
        self.fast.as_ref()
    }

    /// The limit of the only rule, when it is simple.
    pub(crate) fn simple_limit(&self) -> Option<f64> {
        self.simple
    }

    /// Whether the only rule is a cluster rule for every caller on the resource's own node.
    pub(crate) fn cluster_only(&self) -> bool {
        self.cluster_only
    }

    /// Whether a rule reads the resource's node in the default context (a chain rule naming it).
    pub(crate) fn reads_default_context(&self) -> bool {
        self.rules.iter().any(|st| {
            st.rule.strategy == FlowStrategy::Chain
                && st.rule.ref_resource.as_deref() == Some(crate::DEFAULT_CONTEXT_NAME)
        })
    }
}

/// A resource's flow rules when the fast path decides them: for every caller, up to
/// [`FastRules::MAX_FOR_EVERY_CALLER`] rules on the resource's own node, QPS rules of any control behaviour
/// (reject, warm up, rate limiter) and at most one thread-grade rule; before them (the rules' order, as
/// Java's), rules of either grade for callers from named origins and for "other" callers, on the caller's
/// origin node, as many for one origin (or for "other") as for every caller and one of them thread-grade at
/// most: only one origin's rules (or those for "other") apply to a call. All local, on their own nodes
/// (direct), except that the rules for every caller may relate the resource to another one (Java's `RELATE`:
/// thread grade, or QPS rejecting or warming up), whose node they only read, or name an entrance (`CHAIN`: of
/// either grade and any control behaviour, one of them thread-grade at most), on whose node for the resource
/// they decide the calls made in that context. Thread-grade rules' permits (on the resource's node, the
/// origin's, the context's) are the one thing a call on the fast path holds; on each node a QPS rule after
/// one that reserved reserves in the node's second window on that reservation (a third checks there), as on
/// the general path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastRules {
    /// Where the thread-grade rule is, and its limit (calls in flight).
    pub(crate) threads: Option<(usize, f64)>,
    /// How many rules for origins (named, or "other") come first: the rules for every caller start there.
    pub(crate) by_origin: usize,
    /// Where the (first) rule for "other" callers is.
    pub(crate) other: Option<usize>,
    /// Whether each origin (and "other") has one rule at most: then at most one rule applies to a call.
    pub(crate) one_per_origin: bool,
    /// Whether there are more than two rules for every caller, or a relate or chain rule: the rules for every
    /// caller then take a loop of their own.
    pub(crate) many: bool,
    /// The relate rules, one bit each by their place.
    relate: u16,
    /// The chain rules, one bit each by their place.
    chain: u16,
    /// Whether there are rules for origins or [`many`](Self::many) rules: the checks take copies of their own.
    pub(crate) wide: bool,
}

// The rules for origins fit the mask of `origin_rules`, one bit each; every rule fits those of `relate` and
// `chain`.
const _: () = assert!(FastRules::MAX_BY_ORIGIN <= 32);
const _: () = assert!(FastRules::MAX_BY_ORIGIN + FastRules::MAX_FOR_EVERY_CALLER <= 16);

impl FastRules {
    /// The most rules for named origins the fast path looks through (a call compares its origin with each;
    /// at most 32, one bit each in [`origin_rules`](Self::origin_rules)).
    const MAX_BY_ORIGIN: usize = 8;
    /// The most rules for every caller the fast path decides (one or two in the check's own code, more in a
    /// loop out of line).
    pub(crate) const MAX_FOR_EVERY_CALLER: usize = 4;

    fn of(rules: &[Arc<FlowRuleState>]) -> Option<FastRules> {
        let mut fast = FastRules {
            threads: None,
            by_origin: 0,
            other: None,
            one_per_origin: true,
            many: false,
            relate: 0,
            chain: 0,
            wide: false,
        };
        // The rules are sorted: those for origins first (`ResourceFlowRules::new`).
        let by_origin = rules.iter().take_while(|st| !matches!(st.limit_app, LimitApp::Default)).count();
        if by_origin > Self::MAX_BY_ORIGIN || rules.len() - by_origin > Self::MAX_FOR_EVERY_CALLER {
            return None;
        }
        for (i, st) in rules[..by_origin].iter().enumerate() {
            if st.rule.strategy != FlowStrategy::Direct || st.rule.cluster_mode {
                return None;
            }
            if matches!(st.limit_app, LimitApp::Other) && fast.other.is_none() {
                fast.other = Some(i);
            }
            // The rules that apply to the same callers as this one (its origin's, or "other"), this one
            // included: as many as for every caller at most, one of them thread-grade at most (one permit on
            // the origin's node).
            let group = || rules[..by_origin].iter().filter(|o| o.rule.limit_app == st.rule.limit_app);
            let threads = group().filter(|o| o.rule.grade == FlowGrade::Thread).count();
            let size = group().count();
            if size > Self::MAX_FOR_EVERY_CALLER || threads > 1 {
                return None;
            }
            fast.one_per_origin &= size == 1;
        }
        fast.by_origin = by_origin;
        // One permit on the context's node at most, as on the resource's.
        let mut context_threads = false;
        for (i, st) in rules.iter().enumerate().skip(by_origin) {
            if st.is_plain_qps() {
                continue;
            }
            if st.is_simple_threads() && fast.threads.is_none() {
                fast.threads = Some((i, st.rule.count));
            } else if st.is_fast_relate() {
                fast.relate |= 1 << i;
            } else if st.is_fast_chain() && !(context_threads && st.rule.grade == FlowGrade::Thread) {
                context_threads |= st.rule.grade == FlowGrade::Thread;
                fast.chain |= 1 << i;
            } else {
                return None;
            }
        }
        fast.many = rules.len() - by_origin > 2 || fast.reads_others();
        fast.wide = by_origin > 0 || fast.many;
        (!rules.is_empty()).then_some(fast)
    }

    /// Whether a rule reads a node other than the resource's and the origin's: a relate or a chain rule.
    #[inline(always)]
    pub(crate) fn reads_others(&self) -> bool {
        self.relate | self.chain != 0
    }

    /// Whether a rule is a chain rule.
    #[inline(always)]
    pub(crate) fn chains_any(&self) -> bool {
        self.chain != 0
    }

    /// Whether the rule at `at` is a relate or a chain rule.
    #[inline(always)]
    pub(crate) fn reads_other(&self, at: usize) -> bool {
        (self.relate | self.chain) & (1 << at) != 0
    }

    /// Whether the rule at `at` is a relate rule.
    #[inline(always)]
    pub(crate) fn relates(&self, at: usize) -> bool {
        self.relate & (1 << at) != 0
    }

    /// The rule for the caller's `origin` among the rules for origins, when each origin has one at most
    /// ([`one_per_origin`](Self::one_per_origin)): at most one applies (Java's
    /// `selectNodeByRequesterAndStrategy`, which takes the origin's node for a rule naming it, and for the rule
    /// for "other" when no rule names it).
    #[inline]
    pub(crate) fn origin_rule(&self, rules: &ResourceFlowRules, origin: &str) -> Option<usize> {
        if origin.is_empty() {
            return None;
        }
        let named = rules.rules[..self.by_origin]
            .iter()
            .position(|st| matches!(&st.limit_app, LimitApp::Origin(app) if app == origin));
        match (named, self.other) {
            (Some(i), _) => Some(i),
            (None, Some(i)) if rules.is_other_origin(origin) => Some(i),
            _ => None,
        }
    }

    /// The rules for the caller's `origin` among the rules for origins, one bit each by their place: those
    /// naming it, or, when none does, those for "other" if it is "other" (Java's
    /// `selectNodeByRequesterAndStrategy`, rule by rule). One comparison of the origin with each rule's.
    pub(crate) fn origin_rules(&self, rules: &ResourceFlowRules, origin: &str) -> u32 {
        if origin.is_empty() {
            return 0;
        }
        let (mut named, mut other) = (0u32, 0u32);
        for (i, st) in rules.rules[..self.by_origin].iter().enumerate() {
            match &st.limit_app {
                LimitApp::Origin(app) if app == origin => named |= 1 << i,
                LimitApp::Other => other |= 1 << i,
                _ => {}
            }
        }
        match named {
            0 if other != 0 && rules.is_other_origin(origin) => other,
            0 => 0,
            named => named,
        }
    }
}

/// What a call can take per node while it is decided: its rules can reserve on three nodes (the resource's,
/// the caller's origin's and the context's; a relate rule only reads another resource's node), so a call is
/// never short of a place for what it took.
const MAX_HELD: usize = 3;

/// Concurrency permits an entry holds until it exits: one per node, whatever the entry's acquire count, on the
/// three nodes a thread-grade rule can hold a call to ([`PermitNodes`]), one bit each.
#[derive(Debug, Default)]
pub(crate) struct EntryState {
    permits: u8,
}

/// The nodes whose permits an entry can hold ([`EntryState`]): the resource's (its cluster node), the context's
/// and the caller's origin's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PermitNodes {
    cluster: NodePtr,
    context: Option<NodePtr>,
    origin: Option<NodePtr>,
}

impl PermitNodes {
    const CLUSTER: u8 = 1;
    const CONTEXT: u8 = 2;
    const ORIGIN: u8 = 4;

    /// The nodes of a call (the context's and the origin's when it has them).
    #[inline(always)]
    pub(crate) fn new(cluster: &StatNode, context: Option<&StatNode>, origin: Option<&StatNode>) -> Self {
        PermitNodes {
            cluster: NodePtr::of(cluster),
            context: context.map(NodePtr::of),
            origin: origin.map(NodePtr::of),
        }
    }

    /// The bit of `node` (0 when it is none of them).
    #[inline]
    fn bit(&self, node: &StatNode) -> u8 {
        let is = |p: Option<NodePtr>| p.is_some_and(|p| std::ptr::eq(p.0.as_ptr(), node));
        if is(Some(self.cluster)) {
            Self::CLUSTER
        } else if is(self.context) {
            Self::CONTEXT
        } else if is(self.origin) {
            Self::ORIGIN
        } else {
            0
        }
    }

    /// The node of `bit`.
    fn node(&self, bit: u8) -> Option<NodePtr> {
        match bit {
            Self::CLUSTER => Some(self.cluster),
            Self::CONTEXT => self.context,
            Self::ORIGIN => self.origin,
            _ => None,
        }
    }
}

/// The tokens the fast path's QPS rules took (one on the resource's node, one on the origin's and one on the
/// context's at most), while the later checks run: given back if one refuses the call
/// ([`FlowSlot`](check::FlowSlot)'s `undo_fast`), spent if the call passes.
#[derive(Debug, Default)]
pub(crate) struct FastTaken {
    /// The token of the rules for every caller, on the resource's node.
    cluster: Option<(NodePtr, Reservation)>,
    /// The token of the rule for the caller's origin, on the origin's node.
    origin: Option<(NodePtr, Reservation)>,
    /// The token of the chain rules, on the resource's node in the call's context.
    context: Option<(NodePtr, Reservation)>,
}

impl FastTaken {
    #[inline(always)]
    pub(crate) fn keep(&mut self, node: &StatNode, r: Reservation) {
        self.cluster = Some((NodePtr::of(node), r));
    }
    /// Keeps the token the rule for the caller's origin took on its node.
    #[inline(always)]
    pub(crate) fn keep_origin(&mut self, node: &StatNode, r: Reservation) {
        self.origin = Some((NodePtr::of(node), r));
    }
    /// Keeps the token the chain rules took on the resource's node in the call's context.
    pub(crate) fn keep_context(&mut self, node: &StatNode, r: Reservation) {
        self.context = Some((NodePtr::of(node), r));
    }
    pub(crate) fn release(&mut self) {
        give_back_token(&mut self.cluster);
        give_back_token(&mut self.origin);
        give_back_token(&mut self.context);
    }
}

/// Gives a reserved token back to its node's admission window (emptying `slot`), if `slot` holds one.
fn give_back_token(slot: &mut Option<(NodePtr, Reservation)>) {
    if let Some((p, r)) = slot.take() {
        p.get().admission().release(r);
    }
}

/// Reservations taken while deciding an entry: given back if a later check blocks it.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    reservations: [Option<(NodePtr, Reservation)>; MAX_HELD],
    /// Tokens taken from cluster leases: the lease, its key, the count.
    leased: [Option<(std::ptr::NonNull<token_service::RuleLease>, u64, u32)>; MAX_HELD],
    /// A prioritized call's borrow of a later bucket ([`controller::Decision::Occupied`]): the node, when it
    /// was recorded, the bucket's start, the count.
    borrow: Option<(NodePtr, u64, u64, u32)>,
    /// The slots rate limiters gave the call (the rule's state, the slot): given back if the call refused now
    /// waits to be decided again (its next decision takes a slot again), kept otherwise (as in Java, whose
    /// rate limiter has slept through it when a later check refuses the call).
    throttled: [Option<Throttled>; MAX_HELD],
}

/// A rate limiter's slot a call took: the rule's state, the slot ([`controller::Throttle::give_back`]).
type Throttled = (std::ptr::NonNull<FlowRuleState>, (u64, u64));

impl Scratch {
    fn push_leased(&mut self, lease: &token_service::RuleLease, key: u64, n: u32) {
        if let Some(slot) = self.leased.iter_mut().find(|s| s.is_none()) {
            *slot = Some((std::ptr::NonNull::from(lease), key, n));
        }
    }
    fn held(&mut self, node: &StatNode) -> Option<&mut Reservation> {
        self.reservations.iter_mut().flatten().find(|(p, _)| std::ptr::eq(p.0.as_ptr(), node)).map(|(_, r)| r)
    }
    fn push_borrow(&mut self, node: &StatNode, at_ms: u64, future_ms: u64, count: u32) {
        self.borrow = Some((NodePtr::of(node), at_ms, future_ms, count));
    }
    fn push_throttled(&mut self, st: &FlowRuleState, slot: (u64, u64)) {
        if let Some(t) = self.throttled.iter_mut().find(|s| s.is_none()) {
            *t = Some((std::ptr::NonNull::from(st), slot));
        }
    }
    fn push_reservation(&mut self, node: &StatNode, r: Reservation) {
        if let Some(slot) = self.reservations.iter_mut().find(|s| s.is_none()) {
            *slot = Some((NodePtr::of(node), r));
        }
    }
    fn release(&mut self) {
        self.reservations.iter_mut().for_each(give_back_token);
        for t in self.leased.iter_mut() {
            if let Some((p, key, n)) = t.take() {
                // SAFETY: a lease lives as long as its rule state, which the check being undone holds.
                unsafe { p.as_ref() }.release(key, n as u64);
            }
        }
        if let Some((node, at_ms, future_ms, n)) = self.borrow.take() {
            controller::give_back_borrow(node.get(), at_ms, future_ms, n);
        }
        if self.throttled[0].is_some() {
            self.give_back_slots();
        }
    }
    /// The rate limiters' slots go back if the call will be decided again after a wait.
    #[cold]
    fn give_back_slots(&mut self) {
        let again = crate::wait::is_pending();
        for t in self.throttled.iter_mut() {
            if let Some((st, slot)) = t.take() {
                // SAFETY: a rule state lives as long as the rules that hold it, which the check being undone holds.
                match &unsafe { st.as_ref() }.controller {
                    controller::Controller::RateLimiter(t) | controller::Controller::WarmUpRateLimiter(_, t)
                        if again =>
                    {
                        t.give_back(slot)
                    }
                    _ => {}
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodePtr(std::ptr::NonNull<StatNode>);

impl NodePtr {
    fn of(node: &StatNode) -> NodePtr {
        NodePtr(std::ptr::NonNull::from(node))
    }
    /// The node (a `NodePtr` is only made from a node of the engine of the call that holds it).
    fn get(&self) -> &StatNode {
        // SAFETY: a `NodePtr` lives in what a call holds (its checks' scratch, its entry's state), made from a
        // node of the call's engine; nodes are freed only with their engine, which the call's resource handle
        // (borrowed, or a hold of an owned entry) keeps alive until the call's exit has run.
        unsafe { self.0.as_ref() }
    }
}

impl EntryState {
    pub(crate) fn is_active(&self) -> bool {
        self.permits != 0
    }
    fn has_permit(&self, nodes: &PermitNodes, node: &StatNode) -> bool {
        self.permits & nodes.bit(node) != 0
    }
    /// Keeps a permit of `node`: `false` when it is none of `nodes` (the caller gives it back).
    fn push_permit(&mut self, nodes: &PermitNodes, node: &StatNode) -> bool {
        let bit = nodes.bit(node);
        self.permits |= bit;
        bit != 0
    }
    /// The call passed and is counted in its nodes' calls in flight: its permits are no longer pending.
    pub(crate) fn counted(&self, nodes: &PermitNodes) {
        for bit in [PermitNodes::CLUSTER, PermitNodes::CONTEXT, PermitNodes::ORIGIN] {
            if self.permits & bit != 0
                && let Some(p) = nodes.node(bit)
            {
                p.get().thread_gate.counted();
            }
        }
    }
    /// Keeps a permit of the resource's own node (the fast path's).
    #[inline(always)]
    fn push_cluster_permit(&mut self) {
        self.permits |= PermitNodes::CLUSTER;
    }
    /// Keeps a permit of the caller's origin's node (the fast path's rule for the origin).
    fn push_origin_permit(&mut self) {
        self.permits |= PermitNodes::ORIGIN;
    }
    /// Keeps a permit of the resource's node in the call's context (the fast path's chain rule).
    fn push_context_permit(&mut self) {
        self.permits |= PermitNodes::CONTEXT;
    }
    /// Whether a permit of the resource's node in the call's context is kept.
    #[inline(always)]
    fn holds_context_permit(&self) -> bool {
        self.permits & PermitNodes::CONTEXT != 0
    }
    /// Gives back the permits (one per node: a call in flight counts once, whatever its acquire count):
    /// `pending` when the call was never counted in flight (a check refused it).
    pub(crate) fn release_permits(&mut self, nodes: &PermitNodes, pending: bool) {
        for bit in [PermitNodes::CLUSTER, PermitNodes::CONTEXT, PermitNodes::ORIGIN] {
            if self.permits & bit != 0
                && let Some(p) = nodes.node(bit)
            {
                p.get().release_thread_permit(pending);
            }
        }
        self.permits = 0;
    }
}

impl StatNode {
    /// A permit, when the calls in flight that hold one plus `acquire` stay within `limit` (`acquire`
    /// counts as well the calls in flight that hold none).
    fn try_thread_permit(&self, acquire: u64, limit: f64) -> bool {
        self.thread_gate.try_acquire(acquire, limit)
    }
    fn release_thread_permit(&self, pending: bool) {
        self.thread_gate.release(pending)
    }
    fn thread_permits(&self) -> u64 {
        self.thread_gate.permits()
    }
}

#[cfg(test)]
mod fast_rules_tests {
    use super::*;
    use crate::flow::{ControlBehavior, FlowRule};

    /// The fast rules of a resource with `rules`, sorted as the engine sorts them.
    fn fast(rules: Vec<FlowRule>) -> Option<FastRules> {
        let states: Vec<_> = rules.into_iter().map(|r| Arc::new(FlowRuleState::new(r))).collect();
        ResourceFlowRules::new(states).fast
    }

    fn threads(count: f64) -> FlowRule {
        FlowRule::new("r").grade(FlowGrade::Thread).count(count)
    }

    #[test]
    fn the_fast_path_takes_up_to_four_rules_for_every_caller_at_most_one_of_them_thread_grade() {
        let qps = |count| FlowRule::new("r").count(count);
        let f = fast(vec![qps(5.0)]).unwrap();
        assert_eq!((f.by_origin, f.threads), (0, None));
        let f = fast(vec![threads(2.0)]).unwrap();
        assert_eq!(f.threads, Some((0, 2.0)));
        let f = fast(vec![qps(5.0), threads(2.0)]).unwrap();
        assert_eq!(f.threads, Some((1, 2.0)));
        let f = fast(vec![threads(2.0), qps(5.0)]).unwrap();
        assert_eq!(f.threads, Some((0, 2.0)));
        for behavior in [ControlBehavior::WarmUp, ControlBehavior::RateLimiter, ControlBehavior::WarmUpRateLimiter] {
            let f = fast(vec![threads(2.0), qps(5.0).control_behavior(behavior)]).unwrap();
            assert_eq!(f.threads, Some((0, 2.0)), "{behavior:?}");
            let f = fast(vec![qps(5.0).control_behavior(behavior), qps(3.0)]).unwrap();
            assert_eq!(f.threads, None, "{behavior:?}");
            let f = fast(vec![qps(5.0), qps(4.0).control_behavior(behavior), threads(2.0), qps(3.0)]).unwrap();
            assert_eq!(f.threads, Some((2, 2.0)), "{behavior:?}");
        }
        let f = fast(vec![qps(5.0), qps(4.0), qps(3.0)]).unwrap();
        assert_eq!(f.threads, None);
        let most: Vec<_> = (0..FastRules::MAX_FOR_EVERY_CALLER).map(|i| qps(i as f64 + 1.0)).collect();
        assert!(fast(most).is_some());
    }

    #[test]
    fn rules_for_origins_come_first_one_per_origin_and_the_other_rules_after_them() {
        let qps = || FlowRule::new("r").count(5.0);
        let f = fast(vec![qps(), qps().limit_app("shop")]).unwrap();
        assert_eq!((f.by_origin, f.other, f.threads), (1, None, None));
        let f = fast(vec![threads(1.0).limit_app("shop")]).unwrap();
        assert_eq!((f.by_origin, f.other, f.threads), (1, None, None));
        let f = fast(vec![threads(1.0), qps().limit_app("other"), qps().limit_app("shop"), qps()]).unwrap();
        assert_eq!((f.by_origin, f.other, f.threads), (2, Some(0), Some((2, 1.0))));
        let named: Vec<_> = (0..FastRules::MAX_BY_ORIGIN).map(|i| qps().limit_app(format!("app{i}"))).collect();
        assert_eq!(fast(named).unwrap().by_origin, FastRules::MAX_BY_ORIGIN);
        let f = fast(vec![qps(), qps().limit_app("shop"), threads(1.0), qps(), qps()]).unwrap();
        assert_eq!((f.by_origin, f.other, f.threads), (1, None, Some((2, 1.0))));
        assert!(f.one_per_origin);
        // Several rules for one origin, or for "other": as many as for every caller, one thread-grade at most.
        for rules in [
            vec![qps().limit_app("shop"), threads(1.0).limit_app("shop")],
            vec![qps().limit_app("other"), qps().count(3.0).limit_app("other"), qps()],
            vec![qps().limit_app("shop"), qps().limit_app("bar"), threads(1.0).limit_app("shop"), threads(2.0)],
        ] {
            let f = fast(rules.clone()).unwrap_or_else(|| panic!("{rules:?}"));
            assert!(!f.one_per_origin, "{rules:?}");
        }
    }

    #[test]
    fn chain_rules_for_every_caller_take_the_loop_of_the_fast_path_one_of_them_thread_grade_at_most() {
        let qps = |count| FlowRule::new("r").count(count);
        for (rules, chain) in [
            (vec![qps(5.0).chain("ctx")], 0b1),
            (vec![threads(1.0).chain("ctx")], 0b1),
            (vec![qps(5.0), qps(4.0), qps(3.0).chain("ctx")], 0b100),
            // One thread-grade rule on the resource's node and one on the context's.
            (vec![threads(2.0), threads(1.0).chain("ctx"), qps(3.0).chain("ctx")], 0b110),
            (vec![qps(5.0).chain("ctx").control_behavior(ControlBehavior::RateLimiter), qps(3.0).relate("s")], 0b1),
            (vec![qps(2.0).limit_app("shop"), qps(4.0).chain("a"), qps(3.0).chain("b")], 0b110),
        ] {
            let f = fast(rules.clone()).unwrap_or_else(|| panic!("{rules:?}"));
            assert_eq!(f.chain, chain, "{rules:?}");
            assert!(f.many && f.wide && f.reads_others(), "{rules:?}");
            assert!((0..rules.len()).all(|i| f.reads_other(i) == ((f.chain | f.relate) & (1 << i) != 0)));
        }
    }

    #[test]
    fn relate_rules_for_every_caller_take_the_loop_of_the_fast_path() {
        let qps = |count| FlowRule::new("r").count(count);
        for (rules, relate) in [
            (vec![qps(5.0).relate("s")], 0b1),
            (vec![threads(2.0).relate("s")], 0b1),
            (vec![qps(5.0), qps(3.0).relate("s")], 0b10),
            (vec![qps(5.0).relate("s").control_behavior(ControlBehavior::WarmUp), threads(2.0)], 0b1),
            // A thread-grade relate rule holds no permit: beside the one thread-grade rule of the node.
            (vec![threads(2.0), threads(1.0).relate("s"), qps(5.0), qps(4.0).relate("t")], 0b1010),
            (vec![qps(2.0).limit_app("shop"), threads(1.0).relate("s"), qps(5.0)], 0b10),
        ] {
            let f = fast(rules.clone()).unwrap_or_else(|| panic!("{rules:?}"));
            assert_eq!(f.relate, relate, "{rules:?}");
            assert!(f.many && f.wide && f.reads_others(), "{rules:?}");
            assert!((0..rules.len()).all(|i| f.relates(i) == (relate & (1 << i) != 0)), "{rules:?}");
        }
        let f = fast(vec![threads(2.0), threads(1.0).relate("s")]).unwrap();
        assert_eq!(f.threads, Some((0, 2.0)));
        assert!(!fast(vec![qps(5.0), qps(4.0), qps(3.0)]).unwrap().reads_others());
    }

    #[test]
    fn any_other_rule_set_takes_the_general_path() {
        let qps = || FlowRule::new("r").count(5.0);
        let too_many: Vec<_> = (0..=FastRules::MAX_BY_ORIGIN).map(|i| qps().limit_app(format!("app{i}"))).collect();
        for rules in [
            (0..=FastRules::MAX_FOR_EVERY_CALLER).map(|i| qps().count(i as f64 + 1.0)).collect(),
            vec![threads(1.0), threads(2.0)],
            vec![qps(), threads(1.0), qps(), threads(2.0)],
            vec![threads(1.0).limit_app("shop"), threads(2.0).limit_app("shop")],
            vec![threads(1.0).limit_app("other"), threads(2.0).limit_app("other")],
            (0..=FastRules::MAX_FOR_EVERY_CALLER).map(|i| qps().count(i as f64 + 1.0).limit_app("shop")).collect(),
            vec![qps().limit_app("shop").relate("s")],
            too_many,
            // Two thread-grade chain rules (two permits on a context's node), or a chain rule for an origin.
            vec![threads(1.0).chain("ctx"), threads(2.0).chain("other-ctx")],
            vec![qps().chain("ctx").limit_app("shop")],
            // A relate rule that spaces calls (its own state, not the related node's), or a clustered one.
            vec![qps().relate("s").control_behavior(ControlBehavior::RateLimiter)],
            vec![qps(), qps().relate("s").control_behavior(ControlBehavior::WarmUpRateLimiter)],
            vec![FlowRule { cluster_mode: true, ..qps().relate("s") }],
            // Five rules for every caller, one of them relating the resource to another.
            [vec![qps().relate("s")], (0..FastRules::MAX_FOR_EVERY_CALLER).map(|_| qps()).collect()].concat(),
            vec![FlowRule { cluster_mode: true, ..qps() }, threads(1.0)],
        ] {
            assert!(fast(rules.clone()).is_none(), "{rules:?}");
        }
    }
}

#[cfg(test)]
mod block_error_tests {
    use crate::flow::FlowRule;
    use crate::{BlockError, Sentinel};
    use std::sync::Arc;

    /// The counts of the resource's name, the origin's and the rule that every thread would share.
    fn shared_counts(r: &crate::Resource, origin: &Arc<str>) -> (usize, usize, usize) {
        let rule = r.inner.with_rules(|rules| rules.flow.as_ref().map(|f| f.rules[0].rule.clone()));
        let rule = rule.expect("a flow rule");
        (Arc::strong_count(&r.inner.name), Arc::strong_count(origin), Arc::strong_count(&rule) - 1)
    }

    #[test]
    fn a_thread_that_owns_a_stripe_blocks_without_a_count_on_what_every_thread_shares() {
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([FlowRule::new("full").count(0.0)]).unwrap();
        let r = engine.resource("full");
        let origin = engine.shared.origin("app").name.clone();
        let block = || match r.entry().origin("app").enter() {
            Err(e @ BlockError::Flow { .. }) => e,
            other => panic!("blocked by the flow rule, got {other:?}"),
        };
        drop(block());
        let before = shared_counts(&r, &origin);
        // One thread after the other (a thread on the shared stripe takes counts on the shared ones).
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let owns = crate::stat::stripe::lease().exclusive;
                    let (a, b) = (block(), block());
                    let (BlockError::Flow { resource, rule, origin: o, .. }, BlockError::Flow { rule: rule_b, .. }) =
                        (&a, &b)
                    else {
                        unreachable!()
                    };
                    assert_eq!((&**resource, &**o, rule.count), ("full", "app", 0.0));
                    if owns {
                        assert!(Arc::ptr_eq(rule, rule_b), "one copy per stripe, kept");
                        assert_eq!(shared_counts(&r, &origin), before, "no count taken on the shared ones");
                    }
                })
                .join()
                .unwrap();
            }
        });
        assert_eq!(shared_counts(&r, &origin), before);
    }
}
