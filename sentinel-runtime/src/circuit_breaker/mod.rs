//! Circuit breaking (degrade rules).
//!
//! A [`DegradeRule`] gives its resource a circuit breaker that counts completed calls in one tumbling
//! interval of `stat_interval_ms` (aligned to multiples of the interval since the epoch) and opens when, with
//! at least `min_request_amount` calls in the interval:
//!
//! - [`SlowRequestRatio`](DegradeGrade::SlowRequestRatio): the share of calls slower than `count` ms is
//!   above `slow_ratio_threshold` (or both the share and the threshold are 1.0);
//! - [`ErrorRatio`](DegradeGrade::ErrorRatio): the share of calls with an error is above `count`;
//! - [`ErrorCount`](DegradeGrade::ErrorCount): the number of calls with an error is above `count`.
//!
//! The trip is judged on every completion, so an error-count breaker can open on a successful call. An OPEN
//! breaker blocks every call until `time_window_sec` after it opened; then exactly one call passes as the
//! probe (HALF_OPEN) while all others are still blocked. A fine probe closes the breaker (and empties its
//! counts); a slow or failed probe opens it again for another window; a probe blocked by a later check
//! sends the breaker back to OPEN with the same retry time, so the next call may probe at once. A call a
//! rate limiter queues is judged when its turn comes (as in Java, whose flow slot waits before the degrade
//! slot runs): made while the breaker is open, it is the probe if its turn is past the retry time.
//!
//! Rules for the resource `"*"` are default rules: every resource without degrade rules of its own gets its
//! own breakers built from them. Watch transitions with
//! [`Sentinel::register_state_observer`](crate::Sentinel::register_state_observer), read the states with
//! [`Sentinel::circuit_breakers`](crate::Sentinel::circuit_breakers), and choose which traced errors count
//! with [`Sentinel::set_trace_filter`](crate::Sentinel::set_trace_filter).
//!
//! ```
//! use sentinel_runtime::{Sentinel, clock::ManualClock};
//! use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
//!
//! let clock = ManualClock::at_millis(1_700_000_000_000);
//! let engine = Sentinel::builder().manual_clock(clock.clone()).build();
//! // Open for 5 s when more than half of at least 4 calls in a second fail.
//! engine
//!     .load_degrade_rules(vec![DegradeRule::new("inventory", DegradeGrade::ErrorRatio)
//!         .count(0.5).min_request_amount(4).time_window_sec(5)])
//!     .unwrap();
//! let inventory = engine.resource("inventory");
//! for failed in [false, true, true, true] {
//!     let mut entry = inventory.enter().unwrap();
//!     if failed {
//!         entry.set_error();
//!     }
//! }
//! assert!(inventory.enter().is_err());
//! clock.advance_millis(5_000);
//! let probe = inventory.enter().unwrap(); // the one probe
//! assert_eq!(engine.circuit_breakers("inventory")[0].state, BreakerState::HalfOpen);
//! assert!(inventory.enter().is_err()); // everyone else waits for it
//! drop(probe); // fine: closes
//! assert_eq!(engine.circuit_breakers("inventory")[0].state, BreakerState::Closed);
//! ```
//!
//! # Differences from Java Sentinel
//! - Response times are measured in microseconds and compared with `count` ms exactly: a 50.4 ms call is
//!   slow for `count = 50` (Java compares whole milliseconds and rounds `count`).
//! - Only the probe's own completion decides a HALF_OPEN breaker (Java lets any call that completes while
//!   half-open decide).
//! - A breaker past its retry time is not flipped to HALF_OPEN and back by calls that another breaker of the
//!   same resource blocks anyway (Java flips it, and tells the observers, on each such call); a call that
//!   does pass holds the probes of every due breaker, and its completion decides each of them.
//! - Counts are kept per thread stripe: a good call completing in an interval without a bad call costs no
//!   locked instruction. A completion that may trip the breaker (a bad call, or any call in an interval
//!   that has one) sums the stripes; the interval's last completion decides on the interval's final counts
//!   (this call included), so no trip on them is missed however the calls interleave.
//! - A resource has at most [`MAX_RULES_PER_RESOURCE`] degrade rules.

mod breaker;
mod manager;
mod observers;
pub(crate) mod rule;
mod trace;

pub use manager::{BreakerSnapshot, DEFAULT_RESOURCE};
pub use observers::{BreakerState, StateObserver};
pub use rule::{DegradeGrade, DegradeRule};
pub use trace::TraceFilter;

pub(crate) use manager::{snapshot, DegradeManager};
use observers::Observers;

use std::sync::Arc;

use crate::error::BlockError;
use crate::slot::contract::{CheckCx, ExitCx, RuleSlot, Verdict};
use breaker::{Breaker, Peek};

/// The breakers of one resource.
pub(crate) struct ResourceBreakers {
    pub(crate) breakers: Vec<Arc<Breaker>>,
}

impl ResourceBreakers {
    /// Whether every breaker is closed now (an entry then passes them all and holds no probe).
    #[inline]
    pub(crate) fn all_closed(&self, now_ms: u64) -> bool {
        self.breakers.iter().all(|b| b.peek(now_ms) == Peek::Closed)
    }
}

/// Most degrade rules one resource can have (an entry tracks the probes it holds in one `u64`).
pub const MAX_RULES_PER_RESOURCE: usize = 64;

/// What an entry remembers for its breakers: which of them it holds the half-open probe of (a bit per
/// breaker of the set it was checked against). Fixed size; taking a probe costs one reference-count
/// increment, no allocation.
#[derive(Default)]
pub(crate) struct EntryState {
    /// The breakers the entry was checked against, kept while it holds a probe of one of them.
    set: Option<Arc<ResourceBreakers>>,
    /// Bit i: the entry holds the probe of `set.breakers[i]`.
    probes: u64,
}

impl std::fmt::Debug for EntryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryState").field("probes", &format_args!("{:#b}", self.probes)).finish()
    }
}

impl EntryState {
    /// The held probes' breakers.
    fn held(&self) -> impl Iterator<Item = &Arc<Breaker>> {
        let probes = self.probes;
        self.set
            .iter()
            .flat_map(|s| s.breakers.iter().enumerate())
            .filter(move |(i, _)| probes.checked_shr(*i as u32).is_some_and(|p| p & 1 != 0))
            .map(|(_, b)| b)
    }

    /// Gives every held probe back: its breaker returns to OPEN with the same retry time.
    fn abort_all(&mut self, mgr: &Observers) {
        for b in self.held() {
            b.abort_probe(mgr);
        }
        self.probes = 0;
        self.set = None;
    }
}

/// The circuit breaker slots: `BreakerSlot<true>` (order -1500) checks the default (`"*"`) breakers of a
/// resource with none of its own, `BreakerSlot<false>` (order -1000) the resource's own.
pub(crate) struct BreakerSlot<const DEFAULT: bool>;

impl<const DEFAULT: bool> RuleSlot for BreakerSlot<DEFAULT> {
    type Rules = Arc<ResourceBreakers>;
    /// The observers told of every state change.
    type State = Observers;
    /// The half-open probes a call holds.
    type Held = EntryState;
    type Taken = ();
    type FastTaken = ();
    const ORDER: i32 = if DEFAULT { crate::slot::ORDER_DEFAULT_CIRCUIT_BREAKER } else { crate::slot::ORDER_DEGRADE };
    /// On the fast path every breaker is closed: a call passes them and holds nothing.
    const ON_FAST_PATH: bool = true;
    const CHECKS_ON_FAST_PATH: bool = false;
    /// A call that exits is counted by the breakers in force then.
    const EXIT_READS_RULES: bool = true;
    /// Java's prioritized calls that borrow a later window skip the circuit breakers.
    const SKIPPED_WHEN_OCCUPIED: bool = true;

    #[inline(always)]
    fn check(
        rules: &Arc<ResourceBreakers>,
        mgr: &Observers,
        cx: &CheckCx<'_>,
        held: &mut EntryState,
        _: &mut (),
    ) -> Result<Verdict, BlockError> {
        check(rules, mgr, cx, held).map(|()| Verdict::PASS)
    }

    #[inline(always)]
    fn admits_fast(rules: &Arc<ResourceBreakers>, now_ms: u64) -> bool {
        rules.all_closed(now_ms)
    }

    /// The probes go back to OPEN, keeping their retry time.
    #[inline(always)]
    fn give_back(_: &Arc<ResourceBreakers>, mgr: &Observers, _: &CheckCx<'_>, held: &mut EntryState, _: &mut ()) {
        held.abort_all(mgr);
    }

    #[inline(always)]
    fn exit(rules: Option<&Arc<ResourceBreakers>>, mgr: &Observers, cx: &ExitCx, held: &mut EntryState) {
        if let Some(rules) = rules {
            on_exit(rules, mgr, cx, held);
        }
    }
}

/// Lets the call through unless a breaker is open (or half-open with its probe out).
///
/// Two passes: first, a breaker that blocks outright (open before its retry time, or half-open) blocks the
/// call before any probe is taken, so breakers past their retry time do not flip to HALF_OPEN and back for
/// every call another breaker blocks. Only when nothing blocks does the call try to win the due probes.
#[inline]
fn check(
    state: &Arc<ResourceBreakers>,
    mgr: &Observers,
    cx: &CheckCx<'_>,
    es: &mut EntryState,
) -> Result<(), BlockError> {
    // A call a rate limiter queued is judged when its turn comes (Java's flow slot waits before the degrade
    // slot runs).
    let now_ms = cx.turn_ms();
    let mut probe_due = false;
    for b in &state.breakers {
        match b.peek(now_ms) {
            Peek::Closed => {}
            Peek::ProbeDue(_) => probe_due = true,
            Peek::Blocked => return Err(degrade_block(b, cx)),
        }
    }
    if probe_due {
        take_probes(state, mgr, cx, now_ms, es)
    } else {
        Ok(())
    }
}

#[cold]
fn take_probes(
    state: &Arc<ResourceBreakers>,
    mgr: &Observers,
    cx: &CheckCx<'_>,
    now_ms: u64,
    es: &mut EntryState,
) -> Result<(), BlockError> {
    for (i, b) in state.breakers.iter().enumerate().take(MAX_RULES_PER_RESOURCE) {
        let blocked = match b.peek(now_ms) {
            Peek::Closed => false,
            Peek::ProbeDue(seen) => {
                if b.try_probe(seen, mgr) {
                    es.set.get_or_insert_with(|| state.clone());
                    es.probes |= 1 << i;
                    false
                } else {
                    true // another caller won the probe
                }
            }
            Peek::Blocked => true,
        };
        if blocked {
            // Probes won from earlier breakers of this resource go back, keeping their retry time.
            es.abort_all(mgr);
            return Err(degrade_block(b, cx));
        }
    }
    Ok(())
}

#[cold]
fn degrade_block(b: &Breaker, cx: &CheckCx<'_>) -> BlockError {
    // Open: a probe may pass at the retry time. Half-open (the probe is out) or a probe another caller won:
    // the probe's completion decides, at a time nobody knows. Counted from the call's arrival (a call a rate
    // limiter queued is judged at its turn).
    let now_ms = cx.now_ms;
    let retry_after = b.retry_ms().filter(|&at| at > now_ms).map(|at| std::time::Duration::from_millis(at - now_ms));
    BlockError::Degrade {
        resource: cx.resource.share(),
        rule: b.rule_for_block(),
        origin: cx.origin.share(),
        retry_after,
    }
}

/// A call that passed completed: every breaker of the resource counts it; a probe's completion decides its
/// breaker.
#[inline(always)]
fn on_exit(state: &Arc<ResourceBreakers>, mgr: &Observers, cx: &ExitCx, es: &mut EntryState) {
    if es.probes == 0 {
        for b in &state.breakers {
            b.on_complete(cx.now_ms, cx.rt_micros, cx.error, false, mgr);
        }
        return;
    }
    exit_with_probes(state, mgr, cx, es);
}

#[cold]
fn exit_with_probes(state: &Arc<ResourceBreakers>, mgr: &Observers, cx: &ExitCx, es: &mut EntryState) {
    // Probes are decided on the breakers that issued them, even if the rules changed meanwhile (an equal
    // rule reloaded keeps its breaker, and one reloaded with a new id its state: then it is in both sets).
    for b in es.held() {
        b.on_complete(cx.now_ms, cx.rt_micros, cx.error, true, mgr);
    }
    for b in &state.breakers {
        if !es.held().any(|p| p.same_as(b)) {
            b.on_complete(cx.now_ms, cx.rt_micros, cx.error, false, mgr);
        }
    }
    es.probes = 0;
    es.set = None;
}
