//! The last circuit breaker transitions, for the console: recorded by a breaker state observer.
//!
//! The observer runs on the thread whose call caused the transition (a cold path: transitions only) and only
//! appends to a bounded list; it holds the engine weakly, so it never keeps the engine alive.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use crate::circuit_breaker::{BreakerState, DegradeRule};
use crate::Sentinel;

/// Transitions kept (the newest).
pub(crate) const KEPT: usize = 200;

/// One transition of one breaker.
#[derive(Clone, Debug)]
pub(crate) struct Transition {
    /// When (engine time, ms).
    pub(crate) at_ms: u64,
    /// The breaker's rule (resource `"*"` for a default rule).
    pub(crate) rule: Arc<DegradeRule>,
    pub(crate) from: BreakerState,
    pub(crate) to: BreakerState,
    /// The value that tripped it (see [`StateObserver`](crate::circuit_breaker::StateObserver)).
    pub(crate) snapshot: Option<f64>,
}

/// The recorded transitions of one engine's breakers.
pub(crate) struct Transitions {
    list: Mutex<VecDeque<Transition>>,
}

impl Transitions {
    /// Starts recording the transitions of `engine`'s breakers under the observer name `observer`.
    pub(crate) fn attach(engine: &Sentinel, observer: &str) -> Arc<Transitions> {
        let t = Arc::new(Transitions { list: Mutex::new(VecDeque::with_capacity(16)) });
        let sink = Arc::downgrade(&t);
        let clock: Weak<crate::engine::keep::SharedHandle> = Arc::downgrade(&engine.shared);
        engine.register_state_observer(observer, move |from, to, rule, snapshot| {
            let (Some(sink), Some(shared)) = (sink.upgrade(), clock.upgrade()) else { return };
            let at_ms = shared.now_ms();
            let mut list = sink.list.lock().unwrap_or_else(|e| e.into_inner());
            if list.len() == KEPT {
                list.pop_front();
            }
            list.push_back(Transition { at_ms, rule: Arc::new(rule.clone()), from, to, snapshot });
        });
        t
    }

    /// The transitions, newest first.
    pub(crate) fn newest_first(&self) -> Vec<Transition> {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).iter().rev().cloned().collect()
    }
}
