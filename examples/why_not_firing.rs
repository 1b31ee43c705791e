//! `Sentinel::diagnose` explaining a flow rule that does not fire: the rule is for callers with origin
//! `appA`, but the calls come without an origin (and from `appB`).
//!
//! Run: `cargo run --example why_not_firing`

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

fn main() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock).app_name("diagnose-example").build();
    engine.load_flow_rules(vec![FlowRule::new("queryOrder").count(2.0).limit_app("appA")]).expect("a valid rule");

    let query_order = engine.resource("queryOrder");
    let passed_without_origin = (0..10).filter(|_| query_order.enter().is_ok()).count();
    let passed_from_app_b = {
        let _ctx = engine.enter_context("http", "appB").expect("a context");
        (0..5).filter(|_| query_order.enter().is_ok()).count()
    };
    println!("limit 2 per second for `appA`; passed: {passed_without_origin}/10 without origin, {passed_from_app_b}/5 from appB\n");

    let diagnosis = engine.diagnose("queryOrder");
    println!("{diagnosis}");
    assert!(!diagnosis.flow[0].applies, "the diagnosis explains why the rule never fired");
}
