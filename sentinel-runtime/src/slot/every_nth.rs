//! A test-only rule kind that proves the slot contract: it denies every n-th call of a resource. It is one
//! file (this one) plus one line in the chain table (`chain::BuiltIn`), its glue (`chain::InChain`), and the
//! field that keeps its rules per resource (`rules::ResourceRules::every_nth`, compiled in
//! `Shared::rules_for`), and its loader (`Sentinel::deny_every_nth`, in engine/kinds.rs). It sits at order 0, after the breakers, so a call it denies has entered every
//! built-in slot before it: what they took must go back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::BlockError;
use crate::slot::contract::{CheckCx, RuleSlot, Verdict};

/// One resource's rule: deny every `n`-th call.
pub(crate) struct EveryNth {
    n: u64,
    calls: AtomicU64,
}

/// The rules by resource (what a manager is to a real kind).
#[derive(Default)]
pub(crate) struct EveryNthRules {
    by_resource: Mutex<HashMap<String, Arc<EveryNth>>>,
}

impl EveryNthRules {
    /// Denies every `n`-th call of `resource` from now on (once the engine refreshed its rules).
    pub(crate) fn set(&self, resource: &str, n: u64) {
        let rule = Arc::new(EveryNth { n: n.max(1), calls: AtomicU64::new(0) });
        self.by_resource.lock().unwrap_or_else(|e| e.into_inner()).insert(resource.to_string(), rule);
    }

    /// The compiled rule of `resource`, if any.
    pub(crate) fn for_resource(&self, resource: &str) -> Option<Arc<EveryNth>> {
        self.by_resource.lock().unwrap_or_else(|e| e.into_inner()).get(resource).cloned()
    }
}

/// The slot.
pub(crate) struct EveryNthSlot;

impl RuleSlot for EveryNthSlot {
    type Rules = EveryNth;
    type State = ();
    type Held = ();
    type Taken = ();
    type FastTaken = ();
    const ORDER: i32 = 0;

    fn check(rules: &EveryNth, _: &(), cx: &CheckCx<'_>, _: &mut (), _: &mut ()) -> Result<Verdict, BlockError> {
        let call = rules.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if !call.is_multiple_of(rules.n) {
            return Ok(Verdict::PASS);
        }
        Err(BlockError::Custom {
            resource: cx.resource.share(),
            slot: "every-nth",
            reason: format!("call {call} is a multiple of {}", rules.n).into(),
            origin: cx.origin.share(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::flow::{FlowGrade, FlowRule};
    use crate::{BlockError, Sentinel};

    #[test]
    fn a_kind_added_in_one_file_runs_in_the_chain_through_the_public_entry_path() {
        let engine = Sentinel::builder().build();
        engine.deny_every_nth("api", 3);
        let api = engine.resource("api");
        let verdicts: Vec<bool> = (0..6).map(|_| api.enter().is_ok()).collect();
        assert_eq!(verdicts, [true, true, false, true, true, false]);
        match api.enter().map(drop).and_then(|()| api.enter().map(drop)).and_then(|()| api.enter().map(drop)) {
            Err(BlockError::Custom { slot, .. }) => assert_eq!(slot, "every-nth"),
            other => panic!("the third call should be denied by the test-only slot, got {other:?}"),
        }
        let stats = engine.cluster_stats("api").unwrap();
        assert_eq!(stats.threads, 0);
    }

    #[test]
    fn a_call_the_test_only_kind_denies_gives_back_what_earlier_slots_took() {
        let engine = Sentinel::builder().build();
        // A thread-grade flow rule (order -2000) takes a permit before the test-only slot (order 0) runs.
        engine.load_flow_rules([FlowRule::new("db").grade(FlowGrade::Thread).count(1.0)]).unwrap();
        engine.deny_every_nth("db", 2);
        let db = engine.resource("db");
        drop(db.enter().expect("the first call passes"));
        assert!(matches!(db.enter(), Err(BlockError::Custom { .. })), "the second call is denied");
        // Had the denied call kept the flow rule's permit, this call would be over the limit of one thread.
        let third = db.enter().expect("the permit of the denied call went back");
        assert!(matches!(db.enter(), Err(BlockError::Flow { .. })), "one thread at a time still holds");
        drop(third);
    }

    #[test]
    fn user_slots_run_at_their_order_around_the_test_only_kind() {
        use crate::slot::{Slot, SlotEntry};
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Arc;
        struct Count(Arc<AtomicU32>);
        impl Slot for Count {
            fn name(&self) -> &'static str {
                "count"
            }
            fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
                self.0.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
        let engine = Sentinel::builder().build();
        let (before, after) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        engine.add_slot(-1, Count(before.clone()));
        engine.add_slot(1, Count(after.clone()));
        engine.deny_every_nth("api", 2);
        let api = engine.resource("api");
        assert!(api.enter().is_ok());
        assert!(api.enter().is_err());
        assert_eq!(before.load(Ordering::Relaxed), 2, "the slot ordered before runs for both calls");
        assert_eq!(after.load(Ordering::Relaxed), 1, "the slot ordered after runs only for the call that passed");
    }
}
