//! The contract between the engine and a built-in rule kind: what a kind compiles per resource, how it checks
//! a call, what a call it passed holds, how that goes back when a later slot blocks (or a user slot panics),
//! and what it records at exit.
//!
//! The engine runs the kinds through one ordered table ([`crate::chain`]), by static dispatch: every method
//! here is resolved at compile time and inlined where the hand-written checks were. A kind implements
//! [`RuleSlot`] and knows nothing of the engine: it sees the call through [`CheckCx`] and [`ExitCx`], and the
//! state it shares across resources (its manager) as [`RuleSlot::State`].

use std::ptr::NonNull;
use std::sync::Arc;

use crate::clock::EngineClock;
use crate::error::BlockError;
use crate::param_flow::value::HotParam;
use crate::slot::EntryType;
use crate::stat::StatNode;
use crate::wait::Wait;

/// A name a check sees (the resource's, the origin's): a `str`, and
/// [`share`](crate::stat::stripe::SharedName::share) for the reference a [`BlockError`] holds.
pub(crate) type Named<'a> = &'a crate::stat::stripe::SharedName;

/// What every check sees of a call, on every path: the resource, the caller, the clock reading and the
/// arguments. The fast path's checks see only this; the general path's see it through [`CheckCx`].
pub(crate) struct CallCx<'a> {
    /// The resource's name.
    pub(crate) resource: Named<'a>,
    /// The resource's cluster node (its statistics over every context and origin).
    pub(crate) cluster: &'a StatNode,
    /// The caller's origin (empty when none).
    pub(crate) origin: Named<'a>,
    /// The resource's node for the caller's origin (none when the origin is empty), where the entry path keeps
    /// it: a reference to the slot, so that making the view costs an address, not a value kept alive across the
    /// checks.
    pub(crate) origin_node: &'a Option<&'a StatNode>,
    pub(crate) acquire: u32,
    /// The hot-parameter arguments, behind a thin reference: copying the slice itself into the context on
    /// every call costs a stalled 16-byte load, and only hot-parameter rules read it.
    pub(crate) args: &'a &'a [&'a dyn HotParam],
    pub(crate) now_nanos: u64,
    pub(crate) now_ms: u64,
    /// The engine's clock, for the checks that need a precise reading (rate limiters, value throttles).
    pub(crate) clock: &'a EngineClock,
    /// Inbound or outbound.
    pub(crate) entry_type: EntryType,
}

/// The fast path's view of a call, made in place when a check needs it: the call ([`CallCx`]; a check that reads
/// two of its fields costs two loads), and, for the checks that read it (chain rules), the call's context.
pub(crate) trait FastCall<'c> {
    /// The call.
    fn call(&self) -> CallCx<'c>;
    /// The call's context.
    fn context(&self) -> ContextCx<'c>;
}

/// The call's context as the fast path's checks see it ([`FastCall::context`]).
#[derive(Clone, Copy)]
pub(crate) struct ContextCx<'c> {
    /// The context's name.
    pub(crate) name: &'c str,
    /// The numbers of the resource's node in the context (chain rules decide on them).
    pub(crate) node: &'c StatNode,
}

/// A [`FastCall`] of two closures, which make the call's view and its context's.
pub(crate) struct FastView<C, X>(pub(crate) C, pub(crate) X);

impl<'c, C: Fn() -> CallCx<'c>, X: Fn() -> ContextCx<'c>> FastCall<'c> for FastView<C, X> {
    #[inline(always)]
    fn call(&self) -> CallCx<'c> {
        (self.0)()
    }
    #[inline(always)]
    fn context(&self) -> ContextCx<'c> {
        (self.1)()
    }
}

/// What a check on the general path sees of the entry being decided: the call ([`CallCx`], through `Deref`),
/// the nodes it records on, its context, and a lookup of other resources.
pub(crate) struct CheckCx<'a> {
    pub(crate) call: CallCx<'a>,
    /// The numbers of the resource's node in the current context (chain rules read them).
    pub(crate) node: &'a StatNode,
    pub(crate) context_name: &'a str,
    pub(crate) prioritized: bool,
    /// Whether a cluster rule whose lease is empty may make the call wait, and how.
    pub(crate) cluster_wait: Wait,
    /// Other resources by name (flow's relate strategy).
    pub(crate) resources: &'a dyn Resources,
    /// What the slots checked so far asked the call to wait (ns): a later check decides at the time the call
    /// gets to it, this long after `now_nanos` (as Java decides after the earlier slots' sleeps): a rate
    /// limiter spaces it from then, a circuit breaker judges it then.
    pub(crate) waited_nanos: std::cell::Cell<u64>,
}

impl CheckCx<'_> {
    /// The time the call gets to the check being made (ms): [`now_ms`](CallCx::now_ms) after the waits the
    /// checks before it asked for ([`waited_nanos`](Self::waited_nanos)).
    #[inline(always)]
    pub(crate) fn turn_ms(&self) -> u64 {
        match self.waited_nanos.get() {
            0 => self.call.now_ms,
            waited => self.call.now_nanos.saturating_add(waited) / crate::clock::NANOS_PER_MILLI,
        }
    }
}

impl<'a> std::ops::Deref for CheckCx<'a> {
    type Target = CallCx<'a>;
    #[inline(always)]
    fn deref(&self) -> &CallCx<'a> {
        &self.call
    }
}

/// What a check may look up beyond its own call: another resource's statistics by name. The engine
/// implements it; a kind caches what it found ([`RelatedStat`]) and asks again only when
/// [`generation`](Resources::generation) moved (a resource was created), so the lookup is off the hot path.
pub(crate) trait Resources: Sync {
    /// A number that changes whenever a resource is created.
    fn generation(&self) -> usize;
    /// The cluster statistics of the resource `name`, if it exists.
    fn related(&self, name: &str) -> Option<RelatedStat>;
}

/// Another resource's cluster statistics, kept alive by what owns them.
pub(crate) struct RelatedStat {
    stat: NonNull<StatNode>,
    /// Whether the other resource was ever entered (Java makes its cluster node on its first entry).
    entered: Box<dyn Fn() -> bool + Send + Sync>,
    _owner: Arc<dyn Send + Sync>,
}

// SAFETY: `stat` points into `_owner`, which this value keeps alive and never moves (it is behind an `Arc`);
// `StatNode` is `Sync`, so sharing or sending a reference to it is sound.
unsafe impl Send for RelatedStat {}
unsafe impl Sync for RelatedStat {}

impl RelatedStat {
    /// The statistics `stat` finds in `owner`, kept alive with it; `entered` says whether the owner was
    /// ever entered.
    pub(crate) fn new<T: Send + Sync + 'static>(
        owner: Arc<T>,
        stat: impl FnOnce(&T) -> &StatNode,
        entered: fn(&T) -> bool,
    ) -> Self {
        let stat = NonNull::from(stat(&owner));
        let of = owner.clone();
        RelatedStat { stat, entered: Box::new(move || entered(&of)), _owner: owner }
    }

    /// Whether the other resource was ever entered.
    pub(crate) fn entered(&self) -> bool {
        (self.entered)()
    }

    /// The statistics.
    #[inline(always)]
    pub(crate) fn stat(&self) -> &StatNode {
        // SAFETY: see the `Send`/`Sync` note: `_owner` keeps the node alive at a fixed address.
        unsafe { self.stat.as_ref() }
    }
}

/// The nodes a call was checked on (as [`CheckCx`] gave them): its resource's cluster node, its context's node
/// and its origin's, for the exit hooks of kinds that hold something on them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallNodes {
    cluster: NonNull<StatNode>,
    context: Option<NonNull<StatNode>>,
    origin: Option<NonNull<StatNode>>,
}

impl CallNodes {
    /// The nodes of a call (the context's and the origin's when it has them).
    #[inline(always)]
    pub(crate) fn new(cluster: &StatNode, context: Option<&StatNode>, origin: Option<&StatNode>) -> Self {
        CallNodes {
            cluster: NonNull::from(cluster),
            context: context.map(NonNull::from),
            origin: origin.map(NonNull::from),
        }
    }

    /// The nodes: the cluster node's, the context's and the origin's.
    #[inline(always)]
    pub(crate) fn get(&self) -> (&StatNode, Option<&StatNode>, Option<&StatNode>) {
        // SAFETY: the nodes belong to the engine of the entry being exited, which the entry keeps alive while
        // its exit hooks run (an `ExitCx` lives only during them); nodes are never freed before their engine.
        unsafe { (self.cluster.as_ref(), self.context.map(|c| c.as_ref()), self.origin.map(|o| o.as_ref())) }
    }
}

/// What the exit hooks see of an entry that passed.
pub(crate) struct ExitCx {
    pub(crate) now_nanos: u64,
    pub(crate) now_ms: u64,
    pub(crate) rt_micros: u64,
    /// The part of `rt_micros` the call waited before it ran (a queueing rule's wait, [`Entry::waited`]
    /// (crate::Entry::waited)): not the downstream's time, which an adaptive limit measures.
    pub(crate) waited_nanos: u64,
    /// The nodes the call was checked on, when it holds something on them until the exit (flow's
    /// thread-grade permits: `None` when it holds none).
    pub(crate) nodes: Option<CallNodes>,
    pub(crate) error: bool,
    /// The call failed by overload ([`Entry::set_overload`](crate::Entry::set_overload)): a drop for adaptive
    /// limits.
    pub(crate) overload: bool,
    /// The call never completed (its caller gave up on it, or it panicked) and was not marked as an overload:
    /// its time is no round trip of the downstream, so an adaptive limit takes no sample of it (Netflix's
    /// `onIgnore`).
    pub(crate) abandoned: bool,
}

/// What a slot's check answered for a call it lets through.
pub(crate) enum Verdict {
    /// The call passes this slot, after waiting `wait_nanos` (a queueing or rate-limiting rule).
    Pass { wait_nanos: u64 },
    /// A prioritized call admitted by borrowing a later window: it passes without the circuit breakers and
    /// the user slots after this one ([`SKIPPED_WHEN_OCCUPIED`](RuleSlot::SKIPPED_WHEN_OCCUPIED)), as in
    /// Java; a later limit of calls in flight (an adaptive rule) still holds it, and refusing it gives back
    /// the borrow.
    Occupied { wait_nanos: u64 },
}

impl Verdict {
    /// A pass with no wait.
    pub(crate) const PASS: Verdict = Verdict::Pass { wait_nanos: 0 };
}

/// A built-in slot: one rule kind's part of the chain.
///
/// The chain calls [`check`](RuleSlot::check) only when the resource has rules of the kind (or, for kinds
/// with no per-resource rules, when the kind applies to the call). A call the check passes keeps
/// [`Held`](RuleSlot::Held) until it exits; what the check took while deciding ([`Taken`](RuleSlot::Taken))
/// stays with the call only if every later slot passes it too, and otherwise goes back through
/// [`give_back`](RuleSlot::give_back). A check that blocks gives back what it took itself.
pub(crate) trait RuleSlot {
    /// The kind's compiled rules for one resource.
    type Rules;
    /// What the kind shares across resources and the engine hands to every check (its manager, or the
    /// engine's lookup of other resources, [`Resources`]).
    type State: ?Sized;
    /// What a call that passed holds until it exits (permits, a probe).
    type Held: Default;
    /// What the check takes while deciding, kept only if the call passes every later slot.
    type Taken: Default;
    /// What the fast path's check takes ([`check_fast`](RuleSlot::check_fast)), likewise: given back by
    /// [`undo_fast`](RuleSlot::undo_fast) when a later check refuses.
    type FastTaken: Default;

    /// Java's order of the slot (see [`crate::slot`]).
    const ORDER: i32;
    /// Whether the kind's rules can be on the fast path (the common case decided without the general check
    /// context): the engine's rule-presence flags then say when they are.
    const ON_FAST_PATH: bool = false;
    /// Whether [`exit`](RuleSlot::exit) reads the resource's rules (read once for every such slot).
    const EXIT_READS_RULES: bool = false;
    /// Whether a prioritized call that borrowed a later window ([`Verdict::Occupied`]) passes this slot
    /// unchecked (the circuit breakers, as in Java). A slot that bounds the calls in flight says no: a
    /// borrowed pass is a call in flight like any other.
    const SKIPPED_WHEN_OCCUPIED: bool = false;

    /// Checks a call: `Err` blocks it (after giving back what this check took).
    fn check(
        rules: &Self::Rules,
        state: &Self::State,
        cx: &CheckCx<'_>,
        held: &mut Self::Held,
        taken: &mut Self::Taken,
    ) -> Result<Verdict, BlockError>;

    /// Whether the kind checks anything on the fast path (a kind that is on it only to let it through, as
    /// closed breakers do, says no: its [`admits_fast`](RuleSlot::admits_fast) is its whole part).
    const CHECKS_ON_FAST_PATH: bool = Self::ON_FAST_PATH;

    /// The check on the fast path ([`ON_FAST_PATH`](RuleSlot::ON_FAST_PATH) kinds only, on rules the engine
    /// flagged as such): only a kind that says [`HOLDS_ON_FAST_PATH`](RuleSlot::HOLDS_ON_FAST_PATH) may leave
    /// something in `held` or `taken`, and unless it is the path's last check that can refuse, it gives that
    /// back in [`undo_fast`](RuleSlot::undo_fast) (the chain asserts it); `call` makes the call's view when the
    /// check needs it (made in place, so a check that reads two of its fields costs two loads); a wait it asks
    /// for adds to `wait`. `taken` (`None` where no later check can refuse the call) starts empty and is
    /// dropped when the call passes, as on the general path.
    #[inline(always)]
    fn check_fast<'c>(
        rules: &Self::Rules,
        state: &Self::State,
        call: &impl FastCall<'c>,
        wait: &mut u64,
        held: &mut Self::Held,
        taken: Option<&mut Self::FastTaken>,
    ) -> Result<(), BlockError> {
        let _ = (rules, state, call, wait, held, taken);
        Ok(())
    }

    /// Whether [`check_fast`](RuleSlot::check_fast) may leave the call holding something (a thread-grade
    /// rule's permit, released by [`exit`](RuleSlot::exit)) or having taken something (a QPS rule's token).
    const HOLDS_ON_FAST_PATH: bool = false;

    /// Whether the kind's rules are the uncommon case beside rules of a kind that
    /// [holds](RuleSlot::HOLDS_ON_FAST_PATH) before it (an adaptive limit beside flow or hot-parameter rules):
    /// the fast path is compiled twice, and only the copy the engine takes for a resource with both makes the
    /// kinds that hold before it keep what they take for an undo, so that the common case pays nothing for it.
    const FAST_PATH_APART: bool = false;

    /// Whether [`undo_fast`](RuleSlot::undo_fast) gives back what [`check_fast`](RuleSlot::check_fast) left
    /// in `held` and `taken`: a kind that holds on the fast path and is not its last check that can refuse
    /// must (the chain asserts it).
    const UNDOES_ON_FAST_PATH: bool = false;

    /// A later check of the fast path refused the call this kind's [`check_fast`](RuleSlot::check_fast)
    /// passed: give back what it left in `held` and `taken` (the fast path's one undo; it runs no user code).
    #[inline(always)]
    fn undo_fast<'c>(
        rules: &Self::Rules,
        state: &Self::State,
        call: &impl FastCall<'c>,
        held: &mut Self::Held,
        taken: Option<&mut Self::FastTaken>,
    ) {
        let _ = (rules, state, call, held, taken);
    }

    /// Whether the fast path may decide the call, as far as this kind goes (a breaker that is not closed
    /// sends the call down the general path).
    #[inline(always)]
    fn admits_fast(rules: &Self::Rules, now_ms: u64) -> bool {
        let _ = (rules, now_ms);
        true
    }

    /// A later slot blocked the call (or a slot panicked): give back what this check took and holds. Called
    /// for every slot the call entered, including the one that blocked, so it must be idempotent.
    #[inline(always)]
    fn give_back(
        rules: &Self::Rules,
        state: &Self::State,
        cx: &CheckCx<'_>,
        held: &mut Self::Held,
        taken: &mut Self::Taken,
    ) {
        let _ = (rules, state, cx, held, taken);
    }

    /// Whether a passed call holds something this kind must see at exit.
    #[inline(always)]
    fn holds(held: &Self::Held) -> bool {
        let _ = held;
        false
    }

    /// The call exits: record it and give back what it holds. `rules`: the resource's rules of the kind
    /// now, when [`EXIT_READS_RULES`](RuleSlot::EXIT_READS_RULES) (else `None`).
    #[inline(always)]
    fn exit(rules: Option<&Self::Rules>, state: &Self::State, cx: &ExitCx, held: &mut Self::Held) {
        let _ = (rules, state, cx, held);
    }
}
