//! What the breakers tell of their state: the states, and the observers told of every change.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::rule::DegradeRule;

/// The state of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls pass and are counted; the breaker opens when its rule's threshold is exceeded.
    Closed,
    /// Calls are blocked until the retry time (open time + `time_window_sec`).
    Open,
    /// One probe call is out; every other call is blocked until the probe completes.
    HalfOpen,
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "CLOSED",
            BreakerState::Open => "OPEN",
            BreakerState::HalfOpen => "HALF_OPEN",
        })
    }
}

/// A state-change observer: `(previous state, new state, rule, snapshot)`.
///
/// The snapshot is the value that tripped the breaker on CLOSED → OPEN (the slow ratio, the error ratio or
/// the error count), `1.0` on HALF_OPEN → OPEN (a failed or blocked probe), and `None` on the other
/// transitions.
pub type StateObserver = dyn Fn(BreakerState, BreakerState, &DegradeRule, Option<f64>) + Send + Sync;

/// The state-change observers, by name.
#[derive(Default)]
pub(crate) struct Observers {
    list: ArcSwap<Vec<(String, Arc<StateObserver>)>>,
}

impl Observers {
    /// Tells every observer about a transition (cold: transitions only).
    #[cold]
    pub(crate) fn notify(&self, prev: BreakerState, new: BreakerState, rule: &DegradeRule, snapshot: Option<f64>) {
        let observers = self.list.load();
        for (name, o) in observers.iter() {
            if catch_unwind(AssertUnwindSafe(|| o(prev, new, rule, snapshot))).is_err() {
                tracing::warn!(observer = %name, "circuit breaker state observer panicked");
            }
        }
    }

    pub(crate) fn register(&self, name: &str, f: Arc<StateObserver>) {
        self.list.rcu(|cur| {
            let mut v: Vec<_> = cur.iter().filter(|(n, _)| n != name).cloned().collect();
            v.push((name.to_string(), f.clone()));
            v
        });
    }

    pub(crate) fn unregister(&self, name: &str) -> bool {
        let prev = self.list.rcu(|cur| cur.iter().filter(|(n, _)| n != name).cloned().collect::<Vec<_>>());
        prev.iter().any(|(n, _)| n == name)
    }
}
