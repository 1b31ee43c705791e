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
//! sends the breaker back to OPEN with the same retry time, so the next call may probe at once.
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
//! - No count is lost when concurrent calls start a new statistics interval (one compare-exchange per call).

mod breaker;
mod manager;
mod rule;
mod trace;

pub use breaker::BreakerState;
pub use manager::{BreakerSnapshot, StateObserver, DEFAULT_RESOURCE};
pub use rule::{DegradeGrade, DegradeRule};
pub use trace::TraceFilter;

pub(crate) use manager::DegradeManager;

use std::sync::Arc;

use crate::error::BlockError;
use crate::rules::{CheckCx, ExitCx};
use breaker::{Breaker, Pass};

/// The breakers of one resource.
pub(crate) struct ResourceBreakers {
    pub(crate) breakers: Vec<Arc<Breaker>>,
}

/// How many half-open probes one entry can hold (one per breaker of its resource that is half-open).
const MAX_PROBES: usize = 4;

/// What an entry remembers for its breakers: those whose half-open probe it holds. Fixed size; holding a
/// probe costs a reference-count increment, no allocation.
#[derive(Debug, Default)]
pub(crate) struct EntryState {
    probes: [Option<Arc<Breaker>>; MAX_PROBES],
}

impl EntryState {
    #[inline]
    fn holds_any(&self) -> bool {
        self.probes[0].is_some()
    }

    fn hold(&mut self, b: &Arc<Breaker>) -> bool {
        match self.probes.iter_mut().find(|s| s.is_none()) {
            Some(slot) => {
                *slot = Some(b.clone());
                true
            }
            None => false,
        }
    }

    fn holds(&self, b: &Arc<Breaker>) -> bool {
        self.probes.iter().flatten().any(|p| Arc::ptr_eq(p, b))
    }

    /// Gives every held probe back: its breaker returns to OPEN with the same retry time.
    fn abort_all(&mut self, mgr: &DegradeManager) {
        for p in self.probes.iter_mut() {
            if let Some(b) = p.take() {
                b.abort_probe(mgr);
            }
        }
    }
}

/// Lets the call through unless a breaker is open (or half-open with its probe out).
#[inline]
pub(crate) fn check(state: &ResourceBreakers, cx: &CheckCx<'_>, es: &mut EntryState) -> Result<(), BlockError> {
    let mgr = &cx.shared.degrade;
    for b in &state.breakers {
        let blocked = match b.try_pass(cx.now_ms, mgr) {
            Pass::Closed => false,
            Pass::Probe => {
                if es.hold(b) {
                    false
                } else {
                    // More half-open breakers than an entry can track: give this probe back and block.
                    b.abort_probe(mgr);
                    true
                }
            }
            Pass::Blocked => true,
        };
        if blocked {
            // Probes won from earlier breakers of this resource go back too.
            es.abort_all(mgr);
            return Err(BlockError::Degrade {
                resource: cx.resource.name.clone(),
                rule: b.rule.clone(),
                origin: cx.origin.clone(),
            });
        }
    }
    Ok(())
}

/// A slot after the breakers blocked the call that passed them: its probes go back to OPEN, keeping their
/// retry time.
pub(crate) fn on_later_block(_state: &ResourceBreakers, cx: &CheckCx<'_>, es: &mut EntryState) {
    es.abort_all(&cx.shared.degrade);
}

/// A call that passed completed: every breaker of the resource counts it; a probe's completion decides its
/// breaker.
#[inline]
pub(crate) fn on_exit(state: &ResourceBreakers, cx: &ExitCx<'_>, es: &mut EntryState) {
    let mgr = &cx.shared.degrade;
    if es.holds_any() {
        // Probes are decided on the breaker that issued them, even if the rules changed meanwhile.
        for p in es.probes.iter_mut() {
            if let Some(b) = p.as_ref() {
                b.on_complete(cx.now_ms, cx.rt_micros, cx.error, true, mgr);
            }
        }
        for b in &state.breakers {
            if !es.holds(b) {
                b.on_complete(cx.now_ms, cx.rt_micros, cx.error, false, mgr);
            }
        }
        es.probes = Default::default();
        return;
    }
    for b in &state.breakers {
        b.on_complete(cx.now_ms, cx.rt_micros, cx.error, false, mgr);
    }
}
