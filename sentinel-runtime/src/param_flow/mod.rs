//! Hot-parameter flow control: limits per distinct argument value.
//!
//! A [`ParamFlowRule`] picks one argument of a call (`param_idx`, negative counts from the end) and limits
//! each distinct value of it separately: "at most 5 calls per second per user id". The call's values come
//! from [`EntryBuilder::args`](crate::EntryBuilder::args) (or the macro's `params = [...]`) as
//! [`HotParam`]s; a collection argument checks each element, and an absent value (`None`, or an index past
//! the arguments) passes.
//!
//! - **Qps / Reject**: a lazy token bucket per value. `max = count + burst_count`; the first call of a value
//!   passes and leaves `max - acquire` tokens; once strictly more than `duration_in_sec * 1000` ms passed
//!   since the last refill, the bucket refills `elapsed * count / (duration_in_sec * 1000)` tokens, capped at
//!   `max`; otherwise a call passes while tokens remain. A count of 0 blocks.
//! - **Qps / RateLimiter**: per value, one call every `1000 * acquire * duration_in_sec / count` ms; a call
//!   may queue for strictly less than `max_queueing_time_ms`. Values (of a collection, or of several rules)
//!   are decided in turn, each at the time the waits of those before it end, as in Java: a call waits for the
//!   latest of its values' turns, not for the sum of their waits.
//! - **Thread**: at most `count` calls in flight per value, checked against the calls in flight before the
//!   call (a call that carries a value twice passes if one more fits, and then counts twice on it, as in Java).
//!
//! Exception `items` give single values their own count; matching is type-sensitive (the integer 7 is not
//! the string "7", see [`ParamValue`]).
//!
//! Memory is bounded: each rule keeps its per-value counters in a table of at most
//! `min(4000 * duration_in_sec, 200000)` values (38 bytes each, allocated in pages of 16 sets as values
//! first reach them), however many distinct values arrive; a call never allocates once its value's sets'
//! pages are made (one allocation per page in a rule's life) and takes no lock on a value already tracked (a value seen
//! for the first time holds its two candidate sets' insert bits for a few dozen instructions). Every value
//! keeps its counter until the rule tracks that many; from then on a new value replaces one used least (a
//! flood of values seen once replaces only values seen once, so a value in use keeps its count). A value
//! replaced and seen again starts a fresh counter, as in Java. Decisions are exact under concurrency: each
//! value's counter is one 128-bit word updated by compare-and-swap (40 threads at once on one value with
//! count 5: exactly 5 pass), and callers that see a value for the first time at once share one counter.
//!
//! # Differences from Java Sentinel
//! - Java's token bucket reads and writes the tokens and the refill time separately, so concurrent callers
//!   can over-admit around a refill; ours updates both at once and never does.
//! - The rate limiter keeps nanosecond precision through the engine's (mockable) clock; Java rounds the
//!   cost to whole milliseconds.
//! - A value's token bucket holds at most 2^48 − 1 tokens (2.8 · 10^14): a larger `count + burst_count` acts
//!   as that many, more calls than any process makes in a rule's duration.
//! - Thread-grade permits are taken at check time by compare-and-swap (exact), not counted after the fact.
//!   An entry keeps one word naming the rule's table and the value's cell (never the borrowed value, and no
//!   reference count) and gives the permit back at exit to the rule in force then, if it is the rule that
//!   gave it (a rule reloaded unchanged keeps its counters; a changed or removed one took them with it). If
//!   more than the cap of distinct values churn through a thread rule while a value has calls in flight,
//!   its counter is kept as long as another can go; if none can, it may be replaced and that value starts
//!   again from zero (as in Java's bounded map).
//!   A call holds at most [`MAX_THREAD_PERMITS`] per-value permits; values beyond that (a large collection
//!   argument under a thread rule) are checked but not counted.
//!
//! ```
//! use sentinel_runtime::{Sentinel, BlockError, clock::ManualClock};
//! use sentinel_runtime::param_flow::ParamFlowRule;
//!
//! let clock = ManualClock::at_millis(1_000_000);
//! let engine = Sentinel::builder().manual_clock(clock.clone()).build();
//! engine.load_param_flow_rules(vec![ParamFlowRule::new("getUser", 0).count(2.0)]).unwrap();
//! let get_user = engine.resource("getUser");
//! let call = |id: u64| get_user.entry().args(&[&id]).enter().map(drop);
//! assert!(call(1).is_ok() && call(1).is_ok());
//! assert!(matches!(call(1), Err(BlockError::ParamFlow { ref value, .. }) if value == "1"));
//! assert!(call(2).is_ok()); // each user has their own budget
//! clock.advance_millis(1001);
//! assert!(call(1).is_ok());
//! ```

mod manager;
#[cfg(feature = "tower")]
pub(crate) mod peek;
pub(crate) mod rule;
mod state;
mod table;
pub(crate) mod value;

pub use rule::{ItemClass, ParamFlowItem, ParamFlowRule, ParamItemValue};
pub use state::{counter_capacity, BASE_PARAM_MAX_CAPACITY, TOTAL_MAX_CAPACITY};
pub use value::{HotParam, ParamValue};

use std::sync::Arc;

use crate::error::{BlockError, RuleError, RuleKind};
use crate::flow::{ControlBehavior, FlowGrade};
use crate::slot::contract::{CallCx, CheckCx, ExitCx, FastCall, RuleSlot, Verdict};

pub(crate) use manager::{ParamFlowManager, ParamRuleOwner};
#[cfg(feature = "tower")]
pub(crate) use state::value_quota;
pub(crate) use state::ParamRuleState;
use state::{ThrottleSlot, ValueDecision, ValuePermit};

/// The hot-parameter rules of one resource.
pub(crate) struct ResourceParamRules {
    pub(crate) rules: Vec<Arc<ParamRuleState>>,
    /// Whether a rule is thread-grade (a call it passes holds a per-value permit until exit).
    holds_permits: bool,
}

/// The most per-value thread permits one call holds (see the module docs).
pub const MAX_THREAD_PERMITS: usize = 2;

/// What an entry remembers for its hot-parameter rules: the per-value thread permits to release at exit.
/// Fixed size: taking a permit never allocates.
#[derive(Debug, Default)]
pub(crate) struct EntryState {
    /// Filled from the front.
    permits: [Option<ValuePermit>; MAX_THREAD_PERMITS],
}

impl EntryState {
    /// Whether the entry holds something to release at exit.
    #[inline]
    pub(crate) fn is_active(&self) -> bool {
        self.permits[0].is_some()
    }
    /// Whether the entry holds `permit` (the same rule's counter of the same value).
    #[inline]
    fn holds(&self, permit: ValuePermit) -> bool {
        self.permits.contains(&Some(permit))
    }
    /// Keeps a permit `st` gave, or gives it back at once beyond the fixed storage (checked, not counted).
    fn push(&mut self, permit: ValuePermit, st: &ParamRuleState) {
        match self.permits.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(permit),
            None => {
                st.release(permit);
            }
        }
    }
    /// Gives every permit back to the rule (of `rules`, the resource's rules now) that gave it.
    fn release_all(&mut self, rules: &ResourceParamRules) {
        for permit in self.permits.iter_mut().filter_map(Option::take) {
            // A rule replaced since took its counters with it: nothing to give back.
            let _ = rules.rules.iter().any(|st| st.release(permit));
        }
    }
}

/// Checks one hot-parameter rule; the first invalid field is reported.
pub(crate) fn validate(rule: &ParamFlowRule, index: usize) -> Result<(), RuleError> {
    let bad = |field, reason: &str| Err(RuleError::invalid(RuleKind::ParamFlow, index, &rule.resource, field, reason));
    if rule.resource.trim().is_empty() {
        return bad("resource", "must not be blank");
    }
    if !rule.count.is_finite() || rule.count < 0.0 {
        return bad("count", "must be a finite number >= 0");
    }
    if rule.duration_in_sec == 0 {
        return bad("duration_in_sec", "must be > 0");
    }
    if !matches!(rule.control_behavior, ControlBehavior::Reject | ControlBehavior::RateLimiter) {
        return bad("control_behavior", "must be Reject or RateLimiter for hot-parameter rules");
    }
    if rule.burst_count > i64::MAX as u64 {
        return bad("burst_count", "is too large");
    }
    for it in &rule.items {
        if !it.count.is_finite() || it.count < 0.0 {
            return bad("items.count", "must be a finite number >= 0");
        }
    }
    // Java's `ParamFlowRuleUtil.checkRegexField`: a pattern counts each matching resource on its own, which
    // the rate limiter's shared queue and a cluster flow id cannot.
    if rule.regex && rule.cluster_mode {
        return bad(
            "cluster_mode",
            "cannot be combined with regex: one cluster flow id cannot count each matching resource",
        );
    }
    if rule.regex && rule.control_behavior != ControlBehavior::Reject {
        return bad("control_behavior", "must be Reject (the default) for a regex rule, as in Java");
    }
    // Java's `ParamFlowRuleUtil.checkCluster`: a flow id > 0, and a window split into equal buckets.
    if rule.cluster_mode {
        let Some(c) = &rule.cluster_config else {
            return bad("cluster_config", "is required when cluster_mode is on");
        };
        match c.flow_id {
            None => return bad("cluster_config.flow_id", "is required in cluster mode"),
            Some(0) => return bad("cluster_config.flow_id", "must be > 0"),
            Some(_) => {}
        }
        if c.sample_count == 0 {
            return bad("cluster_config.sample_count", "must be > 0");
        }
        if c.window_interval_ms == 0 {
            return bad("cluster_config.window_interval_ms", "must be > 0");
        }
        if c.window_interval_ms % u64::from(c.sample_count) != 0 {
            return bad(
                "cluster_config.window_interval_ms",
                "must be a multiple of sample_count (the window is split into equal buckets)",
            );
        }
    }
    Ok(())
}

fn normalize(mut rule: ParamFlowRule) -> ParamFlowRule {
    if rule.limit_app.trim().is_empty() {
        rule.limit_app = crate::LIMIT_APP_DEFAULT.to_string();
    }
    rule
}

/// The argument a rule reads: `param_idx`, negative from the end; `None` past either end.
#[inline]
fn argument<'a>(args: &'a [&'a dyn HotParam], idx: i32) -> Option<&'a dyn HotParam> {
    let i = if idx < 0 { args.len() as i64 + idx as i64 } else { idx as i64 };
    usize::try_from(i).ok().and_then(|i| args.get(i)).copied()
}

/// The slots rate limiters gave a call's values while it was decided (on the general path): given back if the
/// call refused now waits to be decided again (its next decision takes a slot again), kept otherwise (as in
/// Java, whose rate limiter has slept through it when a later check refuses the call). Beyond its storage, a
/// slot stays taken.
#[derive(Default)]
pub(crate) struct Scratch {
    slots: [Option<(std::ptr::NonNull<ParamRuleState>, ThrottleSlot)>; MAX_THREAD_PERMITS],
    /// The check passed, so every value of every rule took its tokens: a later check that refuses the call
    /// gives them back ([`RuleSlot::give_back`]).
    passed: bool,
}

impl Scratch {
    fn push(&mut self, st: &ParamRuleState, slot: ThrottleSlot) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.is_none()) {
            *s = Some((std::ptr::NonNull::from(st), slot));
        }
    }
    /// The call was refused: the slots go back if it will be decided again after a wait.
    fn release(&mut self) {
        if self.slots[0].is_some() {
            self.give_back_slots();
        }
    }
    #[cold]
    fn give_back_slots(&mut self) {
        let again = crate::wait::is_pending();
        for (st, slot) in self.slots.iter_mut().filter_map(Option::take) {
            if again {
                // SAFETY: a rule state lives as long as the rules that hold it, which the check being undone
                // holds.
                unsafe { st.as_ref() }.give_back_slot(slot);
            }
        }
    }
}

/// A value over its limit: its text, when a retry could pass, and the count it was held to.
type Blocked = (String, Option<std::time::Duration>, f64);

/// Checks one rule against one argument; `Err` when a value is over its limit, with the number of values
/// decided before it (they took their tokens). `wait`: see [`decide_value`].
fn check_rule(
    st: &ParamRuleState,
    arg: &dyn HotParam,
    cx: &CallCx<'_>,
    es: &mut EntryState,
    wait: &mut u64,
    slots: &mut Option<&mut Scratch>,
) -> Result<(), (Blocked, usize)> {
    // A scalar is decided here, without calling back through the argument's `visit_values`.
    let (blocked, before) = match arg.single_value() {
        Some(v) => (decide_value(st, v, cx, es, wait, slots), 0),
        None => {
            let mut blocked: Option<Blocked> = None;
            let mut before = 0;
            arg.visit_values(&mut |v| {
                if blocked.is_none() {
                    blocked = decide_value(st, v, cx, es, wait, slots);
                    before += usize::from(blocked.is_none());
                }
            });
            (blocked, before)
        }
    };
    match blocked {
        Some(value) => Err((value, before)),
        None => Ok(()),
    }
}

/// Whether `check` decides `rule` locally (a cluster QPS rule without local fallback passes: no token service
/// is connected; as in Java, only QPS rules ask one, and a thread-grade rule in cluster mode is checked here).
#[inline(always)]
fn checked_locally(rule: &ParamFlowRule) -> bool {
    !(rule.cluster_mode
        && rule.grade == FlowGrade::Qps
        && !rule.cluster_config.as_ref().is_some_and(|c| c.fallback_to_local_when_fail))
}

/// Gives back the tokens a refused call took from the token buckets of the resource's rules: every value
/// of the first `rules` rules `check` passed, and the first `values` values of the next one. The values are
/// visited again in the order `check` decided them (a value carried twice took twice).
#[cold]
#[inline(never)]
fn give_back_tokens(state: &ResourceParamRules, cx: &CallCx<'_>, rules: usize, values: usize) {
    for (i, st) in state.rules.iter().enumerate().take(rules + 1) {
        let rule = &*st.rule;
        if !checked_locally(rule) || !matches!(rule.grade, FlowGrade::Qps) {
            continue;
        }
        let Some(arg) = argument(cx.args, rule.param_idx) else { continue };
        let mut left = if i < rules { usize::MAX } else { values };
        let mut back = |v: ParamValue<'_>| {
            if left > 0 {
                left -= 1;
                st.give_back_tokens(&v.key(), cx.acquire);
            }
        };
        match arg.single_value() {
            Some(v) => back(v),
            None => arg.visit_values(&mut back),
        }
    }
}

/// Decides one value of an argument against one rule: `Some` when it is over its limit; a permit it takes
/// goes to `es`. `wait` is what the call waits for the values decided before this one: the value is decided
/// at the instant the call gets to it, `wait` after the call's time (as Java decides each value after the
/// waits of those before it), and a wait it asks for beyond that adds to `wait`. Several rate limiters thus
/// make a call wait for the latest of them, not for the sum of their waits. `slots` (the general path's) keeps
/// the slots rate limiters give.
#[inline(always)]
fn decide_value(
    st: &ParamRuleState,
    v: ParamValue<'_>,
    cx: &CallCx<'_>,
    es: &mut EntryState,
    wait: &mut u64,
    slots: &mut Option<&mut Scratch>,
) -> Option<Blocked> {
    let key = v.key();
    let after = *wait;
    let now = cx.now_nanos.saturating_add(after);
    match st.decide_value(&key, cx.acquire, now, || cx.clock.precise_nanos().saturating_add(after)) {
        ValueDecision::Pass => None,
        ValueDecision::Spaced(w, slot) => {
            *wait = after.saturating_add(w);
            if let Some(slots) = slots {
                slots.push(st, slot);
            }
            None
        }
        ValueDecision::Permit(permit) => {
            es.push(permit, st);
            None
        }
        // The value again in one call (a list holding it twice), which its first element filled: Java checks
        // each element against the calls in flight before the call, so it passes, then counts one call in
        // flight per element (`ParameterMetric.addThreadCount`): this one too.
        ValueDecision::Full(permit) if es.holds(permit) => {
            st.add_again(permit);
            es.push(permit, st);
            None
        }
        // In-flight calls free up when they finish: no retry time is known.
        ValueDecision::Full(_) => Some((v.to_string(), None, st.count_for(&key))),
        // Decided `after` the call's time: a retry is that much further away.
        ValueDecision::Block(retry_after) => {
            let retry_after = retry_after.map(|r| r.saturating_add(std::time::Duration::from_nanos(after)));
            Some((v.to_string(), retry_after, st.count_for(&key)))
        }
    }
}

/// Checks the call's hot-parameter values against every rule of the resource. `Ok(wait)`: pass, after
/// waiting `wait` ns (rate limiter).
pub(crate) fn check(
    state: &ResourceParamRules,
    cx: &CallCx<'_>,
    es: &mut EntryState,
    mut slots: Option<&mut Scratch>,
) -> Result<u64, BlockError> {
    let mut wait = 0u64;
    for (i, st) in state.rules.iter().enumerate() {
        let rule = &*st.rule;
        if !checked_locally(rule) {
            continue;
        }
        let Some(arg) = argument(cx.args, rule.param_idx) else { continue };
        match check_rule(st, arg, cx, es, &mut wait, &mut slots) {
            Ok(()) => {}
            Err(((value, retry_after, threshold), before)) => {
                es.release_all(state);
                // What the rules before took goes back (Java keeps it: not copied).
                if i > 0 || before > 0 {
                    give_back_tokens(state, cx, i, before);
                }
                return Err(BlockError::ParamFlow {
                    resource: cx.resource.share(),
                    rule: st.rule_for_block(),
                    value,
                    threshold,
                    origin: cx.origin.share(),
                    retry_after,
                });
            }
        }
    }
    Ok(wait)
}

/// The hot-parameter slot (order -3000): the call's argument values against every rule of the resource.
pub(crate) struct ParamSlot;

impl RuleSlot for ParamSlot {
    type Rules = ResourceParamRules;
    type State = ();
    /// Per-value thread permits.
    type Held = EntryState;
    /// The slots of rate limiters, and whether the check passed (the general path's).
    type Taken = Scratch;
    type FastTaken = ();
    const ORDER: i32 = crate::slot::ORDER_PARAM_FLOW;
    const ON_FAST_PATH: bool = true;
    /// Permits go back to the rules in force at exit (the entry holds no reference to them): a rule that
    /// stayed kept its counters, one replaced or removed took them with it.
    const EXIT_READS_RULES: bool = true;

    #[inline(always)]
    fn check(
        rules: &ResourceParamRules,
        _: &(),
        cx: &CheckCx<'_>,
        held: &mut EntryState,
        taken: &mut Scratch,
    ) -> Result<Verdict, BlockError> {
        let wait_nanos = check(rules, &cx.call, held, Some(&mut *taken))?;
        taken.passed = true;
        Ok(Verdict::Pass { wait_nanos })
    }

    /// On the fast path the rules are local ([`ResourceParamRules::on_fast_path`]). Rules that hold nothing
    /// need no undo and no unwind guard; thread-grade ones leave their permits in `held`, given back by
    /// [`undo_fast`](RuleSlot::undo_fast) when a later check refuses, and by a guard when a `HotParam` impl
    /// panics.
    #[inline(always)]
    fn check_fast<'c>(
        rules: &ResourceParamRules,
        _: &(),
        call: &impl FastCall<'c>,
        wait: &mut u64,
        held: &mut EntryState,
        _: Option<&mut ()>,
    ) -> Result<(), BlockError> {
        // The first check of the fast path that can ask for a wait (the authority lists before it never do).
        *wait = if rules.holds_permits {
            check_holding_permits(rules, &call.call(), held)?
        } else {
            check_holding_nothing(rules, &call.call())?
        };
        Ok(())
    }

    const HOLDS_ON_FAST_PATH: bool = true;
    const UNDOES_ON_FAST_PATH: bool = true;

    #[inline(always)]
    fn undo_fast<'c>(
        rules: &ResourceParamRules,
        _: &(),
        call: &impl FastCall<'c>,
        held: &mut EntryState,
        _: Option<&mut ()>,
    ) {
        if held.is_active() {
            give_back_cold(rules, held);
        }
        // The check passed (a later one refused): every value took its tokens.
        give_back_tokens(rules, &call.call(), rules.rules.len(), 0);
    }

    /// The call was refused: its thread permits go back, and the tokens it took if the check passed it (a
    /// check that refuses gave them back itself; one that panicked keeps what it took).
    #[inline(always)]
    fn give_back(rules: &ResourceParamRules, _: &(), cx: &CheckCx<'_>, held: &mut EntryState, taken: &mut Scratch) {
        held.release_all(rules);
        taken.release();
        if std::mem::take(&mut taken.passed) {
            give_back_tokens(rules, &cx.call, rules.rules.len(), 0);
        }
    }

    #[inline(always)]
    fn holds(held: &EntryState) -> bool {
        held.is_active()
    }

    #[inline(always)]
    fn exit(rules: Option<&ResourceParamRules>, _: &(), _: &ExitCx, held: &mut EntryState) {
        if let Some(rules) = rules {
            held.release_all(rules);
        }
    }
}

/// What a call refused after the hot-parameter check passed it gives back (out of the passing path's way).
#[cold]
#[inline(never)]
fn give_back_cold(rules: &ResourceParamRules, held: &mut EntryState) {
    held.release_all(rules);
}

/// The check of rules that leave a call holding nothing.
#[inline(always)]
fn check_holding_nothing(rules: &ResourceParamRules, call: &CallCx<'_>) -> Result<u64, BlockError> {
    // The rules take no permit, so the entry state stays empty.
    let mut held = EntryState::default();
    // The fast path never decides a call again after a wait: a rate limiter's slot needs no undo.
    check(rules, call, &mut held, None)
}

/// The check of rules of which one or more is thread-grade, off the general path's unwind guard: if a
/// `HotParam` impl panics, the permits already taken go back before the panic goes on (or their values
/// would stay blocked).
#[inline(never)]
fn check_holding_permits(
    rules: &ResourceParamRules,
    call: &CallCx<'_>,
    held: &mut EntryState,
) -> Result<u64, BlockError> {
    /// Gives the permits back when dropped, which only an unwind does (the normal path forgets it).
    struct OnUnwind<'a> {
        rules: &'a ResourceParamRules,
        held: &'a mut EntryState,
    }
    impl Drop for OnUnwind<'_> {
        fn drop(&mut self) {
            self.held.release_all(self.rules);
        }
    }
    let guard = OnUnwind { rules, held };
    let checked = check(guard.rules, call, guard.held, None);
    std::mem::forget(guard);
    checked
}

impl ResourceParamRules {
    /// One resource's rules, in order.
    pub(crate) fn new(rules: Vec<Arc<ParamRuleState>>) -> Self {
        let holds_permits = rules.iter().any(|s| s.holds_permits());
        ResourceParamRules { rules, holds_permits }
    }

    /// Whether every rule is local (no cluster mode): the rules can then be checked on the entry's fast path
    /// (see `EntryBuilder::entry_path`), thread-grade ones included.
    pub(crate) fn on_fast_path(&self) -> bool {
        self.rules.iter().all(|s| !s.rule.cluster_mode)
    }

    /// (tracked values, capacity) of each rule, in order (tests and inspection).
    pub(crate) fn tracked(&self) -> Vec<(usize, usize)> {
        self.rules.iter().map(|s| (s.tracked(), s.capacity())).collect()
    }
}

impl crate::slot::toolkit::DedupKey for crate::param_flow::ParamFlowRule {
    fn dedup_key<H: std::hash::Hasher>(&self, h: &mut H) {
        std::hash::Hash::hash(&(&self.resource, &self.limit_app, self.param_idx), h);
        crate::slot::toolkit::hash_f64(self.count, h);
    }
    /// Rules that differ only in their id are one rule, the first kept (Java's rule equality leaves the id
    /// out, and its rule manager keeps a set).
    fn repeats(&self, other: &Self) -> bool {
        if self.id == other.id {
            self == other
        } else {
            Self { id: other.id, ..self.clone() } == *other
        }
    }
}
