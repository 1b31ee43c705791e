//! Panics in user code that runs inside an entry (issue 10 §4): user slots, `HotParam` impls, breaker observers,
//! block listeners and error filters. What the checks took before the panic goes back; a panic in an exit hook
//! cannot leave the entry's context installed; slot exit hooks are matched to the slots that passed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::param_flow::{HotParam, ParamFlowRule, ParamValue};
use sentinel_runtime::slot::{Slot, SlotEntry, SlotExit};
use sentinel_runtime::Sentinel;

const T0: u64 = 1_700_000_000_000;

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}

/// A user slot that panics while its switch is on.
struct Panicky {
    on_entry: Arc<AtomicBool>,
    on_exit: Arc<AtomicBool>,
}
impl Slot for Panicky {
    fn name(&self) -> &'static str {
        "panicky"
    }
    fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
        if self.on_entry.load(Ordering::SeqCst) {
            panic!("user slot entry panics");
        }
        Ok(())
    }
    fn exit(&self, _: &SlotExit<'_>) {
        if self.on_exit.load(Ordering::SeqCst) {
            panic!("user slot exit panics");
        }
    }
}

/// A panicky slot after every built-in check (order 0); returns its entry switch.
fn add_panicky_slot(engine: &Sentinel) -> (Arc<AtomicBool>, Arc<AtomicBool>) {
    let (on_entry, on_exit) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    engine.add_slot(0, Panicky { on_entry: on_entry.clone(), on_exit: on_exit.clone() });
    (on_entry, on_exit)
}

#[test]
fn a_thread_grade_permit_goes_back_when_a_later_user_slot_panics() {
    quiet_panics();
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("conc").grade(FlowGrade::Thread).count(2.0)]).unwrap();
    let (panic_entry, _) = add_panicky_slot(&engine);
    let r = engine.resource("conc");
    panic_entry.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        assert!(catch_unwind(AssertUnwindSafe(|| drop(r.enter()))).is_err(), "the panic goes on to the caller");
    }
    panic_entry.store(false, Ordering::SeqCst);
    let (a, b) = (r.enter(), r.enter());
    assert!(a.is_ok() && b.is_ok(), "both permits of the limit are free after five panics");
    assert!(r.enter().is_err(), "and the limit still holds");
}

#[test]
fn qps_tokens_taken_by_a_call_whose_later_slot_panicked_go_back() {
    quiet_panics();
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("q").count(2.0)]).unwrap();
    let (panic_entry, _) = add_panicky_slot(&engine);
    let r = engine.resource("q");
    panic_entry.store(true, Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| drop(r.enter()))).is_err());
    panic_entry.store(false, Ordering::SeqCst);
    let passed = (0..5).filter(|_| r.enter().is_ok()).count();
    assert_eq!(passed, 2, "the panicked call did not pass, so the window still admits two");
    assert_eq!(engine.cluster_stats("q").unwrap().pass_qps, 2.0);
}

#[test]
fn a_half_open_probe_goes_back_when_a_later_user_slot_panics() {
    quiet_panics();
    let (engine, clock) = engine();
    let rule = DegradeRule::new("svc", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(1);
    engine.load_degrade_rules([rule]).unwrap();
    let (panic_entry, _) = add_panicky_slot(&engine);
    let r = engine.resource("svc");
    r.enter().unwrap().set_error();
    assert_eq!(engine.circuit_breakers("svc")[0].state, BreakerState::Open);
    clock.advance_millis(1_000);
    panic_entry.store(true, Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| drop(r.enter()))).is_err());
    panic_entry.store(false, Ordering::SeqCst);
    assert_ne!(engine.circuit_breakers("svc")[0].state, BreakerState::HalfOpen, "the probe was given back");
    clock.advance_millis(3_600_000);
    let probe = r.enter();
    assert!(probe.is_ok(), "an hour later the breaker lets a probe through");
    drop(probe);
    assert_eq!(engine.circuit_breakers("svc")[0].state, BreakerState::Closed, "the probe succeeded");
}

#[test]
fn a_per_value_thread_permit_goes_back_when_a_later_user_slot_panics() {
    quiet_panics();
    let (engine, _clock) = engine();
    engine.load_param_flow_rules([ParamFlowRule::new("p", 0).grade(FlowGrade::Thread).count(1.0)]).unwrap();
    let (panic_entry, _) = add_panicky_slot(&engine);
    let r = engine.resource("p");
    panic_entry.store(true, Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| drop(r.entry().args(&[&7u64]).enter()))).is_err());
    panic_entry.store(false, Ordering::SeqCst);
    let e = r.entry().args(&[&7u64]).enter();
    assert!(e.is_ok(), "value 7's only permit is free");
    assert!(r.entry().args(&[&7u64]).enter().is_err(), "and the limit still holds");
}

/// A hot parameter whose `HotParam` impl panics.
struct Exploding;
impl HotParam for Exploding {
    fn visit_values(&self, _f: &mut dyn FnMut(ParamValue<'_>)) {
        panic!("user HotParam panics");
    }
}

#[test]
fn a_panicking_hot_param_impl_gives_back_the_permits_of_earlier_arguments() {
    quiet_panics();
    let (engine, _clock) = engine();
    engine
        .load_param_flow_rules([
            ParamFlowRule::new("p", 0).grade(FlowGrade::Thread).count(1.0),
            ParamFlowRule::new("p", 1).count(100.0),
        ])
        .unwrap();
    engine.load_flow_rules([FlowRule::new("p").grade(FlowGrade::Thread).count(1.0)]).unwrap();
    let r = engine.resource("p");
    assert!(catch_unwind(AssertUnwindSafe(|| drop(r.entry().args(&[&7u64, &Exploding]).enter()))).is_err());
    let e = r.entry().args(&[&7u64, &1u64]).enter();
    assert!(e.is_ok(), "value 7's permit and the resource's permit went back: {e:?}");
}

#[test]
fn a_panicking_slot_exit_hook_does_not_leave_the_entrys_context_installed() {
    quiet_panics();
    let (engine, _clock) = engine();
    let (_, panic_exit) = add_panicky_slot(&engine);
    let r = engine.resource("x");
    let eng = engine.clone();
    let origin = std::thread::spawn(move || {
        panic_exit.store(true, Ordering::SeqCst);
        let e = r.entry().origin("appA").enter().unwrap();
        assert!(catch_unwind(AssertUnwindSafe(|| drop(e))).is_err(), "the exit hook's panic goes on");
        panic_exit.store(false, Ordering::SeqCst);
        assert_eq!(eng.current_context(), None);
        let next = r.enter().unwrap();
        next.origin().to_string()
    })
    .join()
    .unwrap();
    assert_eq!(origin, "", "the next origin-less call runs in a fresh default context");
    assert_eq!(engine.cluster_stats("x").unwrap().threads, 0);
}

#[test]
fn a_slot_exit_hook_that_panics_while_the_body_unwinds_does_not_abort() {
    quiet_panics();
    let (engine, _clock) = engine();
    let (_, panic_exit) = add_panicky_slot(&engine);
    panic_exit.store(true, Ordering::SeqCst);
    let r = engine.resource("x");
    let res = catch_unwind(AssertUnwindSafe(|| {
        let _e = r.enter().unwrap();
        panic!("the body panics");
    }));
    let msg = res.unwrap_err().downcast::<&str>().map(|m| *m).unwrap_or("");
    assert_eq!(msg, "the body panics", "the body's panic is the one that goes on");
    let stats = engine.cluster_stats("x").unwrap();
    assert_eq!((stats.threads, stats.exception_qps), (0, 1.0), "the unwound call counts as an exception");
}

/// Counts the entry and exit calls of a slot.
struct Counting {
    entries: Arc<AtomicUsize>,
    exits: Arc<AtomicUsize>,
}
impl Slot for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
        self.entries.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn exit(&self, _: &SlotExit<'_>) {
        self.exits.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_slot_added_while_an_entry_is_open_does_not_receive_that_entrys_exit() {
    let (engine, _clock) = engine();
    let counters = || (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let ((ae, ax), (be, bx)) = (counters(), counters());
    engine.add_slot(0, Counting { entries: ae.clone(), exits: ax.clone() });
    let r = engine.resource("x");
    let e = r.enter().unwrap();
    // Sorts before the first slot: by index, it would take the first slot's place.
    engine.add_slot(-9999, Counting { entries: be.clone(), exits: bx.clone() });
    drop(e);
    let load = |a: &Arc<AtomicUsize>| a.load(Ordering::SeqCst);
    assert_eq!((load(&ae), load(&ax), load(&be), load(&bx)), (1, 1, 0, 0));
    drop(r.enter().unwrap());
    assert_eq!((load(&ae), load(&ax), load(&be), load(&bx)), (2, 2, 1, 1));
}

#[test]
fn a_panicking_block_listener_is_contained_and_the_caller_gets_its_block_error() {
    quiet_panics();
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("x").count(0.0)]).unwrap();
    let heard = Arc::new(AtomicUsize::new(0));
    engine.on_block(|_, _, _| panic!("listener panics"));
    let h = heard.clone();
    engine.on_block(move |_, _, _| {
        h.fetch_add(1, Ordering::SeqCst);
    });
    let r = engine.resource("x");
    for _ in 0..3 {
        let res = catch_unwind(AssertUnwindSafe(|| r.enter().map(drop)));
        assert!(matches!(res, Ok(Err(_))), "enter returns the block error");
    }
    assert_eq!(heard.load(Ordering::SeqCst), 3, "the other listener still hears every block");
}

#[test]
fn a_panicking_error_filter_still_exits_the_entry_as_an_error() {
    quiet_panics();
    let (engine, _clock) = engine();
    let rule = DegradeRule::new("x", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(1);
    engine.load_degrade_rules([rule]).unwrap();
    engine.set_error_filter(|_| panic!("filter panics"));
    let r = engine.resource("x");
    let res = catch_unwind(AssertUnwindSafe(|| {
        let mut e = r.enter().unwrap();
        e.trace(&std::io::Error::other("boom"));
    }));
    assert!(res.is_err());
    assert_eq!(engine.cluster_stats("x").unwrap().threads, 0);
    assert_eq!(engine.circuit_breakers("x")[0].state, BreakerState::Open, "the unwinding call counted as an error");
}

#[test]
fn a_panicking_breaker_observer_does_not_break_the_breaker() {
    quiet_panics();
    let (engine, clock) = engine();
    let rule = DegradeRule::new("obs", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(1);
    engine.load_degrade_rules([rule]).unwrap();
    engine.register_state_observer("boom", |_, _, _, _| panic!("observer panics"));
    let r = engine.resource("obs");
    r.enter().unwrap().set_error();
    assert_eq!(engine.circuit_breakers("obs")[0].state, BreakerState::Open);
    clock.advance_millis(1_000);
    drop(r.enter().unwrap());
    assert_eq!(engine.circuit_breakers("obs")[0].state, BreakerState::Closed);
}
