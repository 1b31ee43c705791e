//! Rules loaded from inside the engine's own callbacks (a circuit breaker observer, a user slot) take effect
//! and do not deadlock: those callbacks run while the rules they replace are being read.

use std::sync::atomic::{AtomicBool, Ordering};

use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::slot::{Slot, SlotEntry};
use sentinel_runtime::Sentinel;

const T0: u64 = 1_700_000_000_000;

#[test]
fn a_breaker_observer_can_load_rules_when_the_breaker_opens() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build();
    let handle = engine.clone();
    engine.register_state_observer("reload", move |_, new, _, _| {
        if new == BreakerState::Open {
            // Runs at the failing call's exit, inside the section that reads the breakers.
            handle.load_flow_rules([FlowRule::new("backup").count(0.0)]).expect("valid rule");
        }
    });
    let rule = DegradeRule::new("api", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(10);
    engine.load_degrade_rules([rule]).unwrap();
    let api = engine.resource("api");
    let backup = engine.resource("backup");
    assert!(backup.enter().is_ok());
    {
        let mut e = api.enter().unwrap();
        e.set_error();
    }
    assert!(api.enter().is_err(), "the breaker opened");
    assert!(backup.enter().is_err(), "the rule the observer loaded is in force");
    // And later reloads still work (the replaced rule sets are freed after a grace period).
    engine.load_flow_rules([FlowRule::new("backup").count(10.0)]).unwrap();
    assert!(backup.enter().is_ok());
}

struct ReloadingSlot {
    engine: Sentinel,
    done: AtomicBool,
}

impl Slot for ReloadingSlot {
    fn name(&self) -> &'static str {
        "reloading"
    }
    fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.engine.load_flow_rules([FlowRule::new("r").count(0.0)]).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[test]
fn a_user_slot_can_load_rules_during_a_check() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(T0)).build();
    engine.load_flow_rules([FlowRule::new("r").count(100.0)]).unwrap();
    engine.add_slot(-10, ReloadingSlot { engine: engine.clone(), done: AtomicBool::new(false) });
    let r = engine.resource("r");
    assert!(r.enter().is_ok(), "the call that loaded the rule was checked against the rules it started with");
    assert!(r.enter().is_err(), "the next call sees the new rule");
}
