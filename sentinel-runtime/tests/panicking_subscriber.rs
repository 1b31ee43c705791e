//! The engine logs through the application's `tracing` subscriber from places where it holds shared state:
//! the first read section decides how rule reads are fenced (and logs that decision), an exact limit's bucket
//! close runs the process-wide barrier (and logs its failure). A subscriber that panics there must cost its
//! event only: the decision is made, and every later call is served.
//!
//! One test in its own binary: the fence's mode is decided once per process, by the first read section.

use std::sync::atomic::{AtomicUsize, Ordering};

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{BlockError, Sentinel};
use sentinel_testkit::logs::{Logged, OnEvent};

static FROM_RCU: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_subscriber_that_panics_on_the_fences_decision_costs_its_event_and_no_call() {
    // Full fences, switched off by the environment, are logged when the first read section decides them.
    // SAFETY: no other thread reads or writes the environment meanwhile: this binary's one test sets it before
    // any thread of the engine exists.
    unsafe { std::env::set_var("SENTINEL_MEMBARRIER", "off") };
    // Panics on every event the engine's read sections log (the others pass).
    let panicking = OnEvent(|e: Logged| {
        if e.module_path == Some("sentinel_runtime::rcu") {
            FROM_RCU.fetch_add(1, Ordering::SeqCst);
            panic!("the application's subscriber panics (expected by the test)");
        }
    });
    tracing::subscriber::set_global_default(panicking).expect("the first subscriber of this process");
    std::panic::set_hook(Box::new(|_| {}));

    let engine = Sentinel::builder().build();
    engine.load_flow_rules([FlowRule::new("api").count(2.0)]).unwrap();
    let api = engine.resource("api");
    let first = api.enter();
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(FROM_RCU.load(Ordering::SeqCst), 1, "the decision was logged, once, to the subscriber");
    // The limit still holds exactly, on every later call.
    let second = api.enter();
    assert!(second.is_ok(), "{second:?}");
    assert!(matches!(api.enter(), Err(BlockError::Flow { .. })));
    drop((first, second));
    let stats = engine.cluster_stats("api").unwrap();
    assert_eq!(stats.threads, 0);
}
