//! Hot-parameter, system and authority checks make no heap allocation on a passing call once the value is
//! tracked (counted per thread with a counting global allocator).

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::flow::{ControlBehavior, FlowGrade};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::{EntryType, Sentinel};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

#[test]
fn passing_calls_on_tracked_values_allocate_nothing() {
    let engine = Sentinel::builder().build();
    engine.set_system_readings(Some(0.1), Some(0.1));
    engine
        .load_param_flow_rules(vec![
            ParamFlowRule::new("api", 0).count(1e12),
            ParamFlowRule::new("api", 1).count(1e9).control_behavior(ControlBehavior::RateLimiter),
            ParamFlowRule::new("api", -1).grade(FlowGrade::Thread).count(1e6),
        ])
        .unwrap();
    engine
        .load_system_rules(vec![SystemRule {
            qps: Some(1e12),
            max_thread: Some(1_000_000),
            avg_rt: Some(1_000_000),
            highest_system_load: Some(100.0),
            highest_cpu_usage: Some(1.0),
            ..Default::default()
        }])
        .unwrap();
    engine.load_authority_rules(vec![AuthorityRule::new("api", "appA", AuthorityStrategy::Black)]).unwrap();
    let api = engine.resource_typed("api", EntryType::In);
    let users: Vec<String> = (0..16).map(|i| format!("user-{i}")).collect();
    let call = |i: usize| {
        let user = &users[i % users.len()];
        let region = "eu";
        api.entry().args(&[&(i as u64 % 16), &user, &region]).enter().is_ok()
    };
    for i in 0..1000 {
        assert!(call(i));
    }
    let before = allocations();
    for i in 0..100_000 {
        assert!(call(i));
    }
    assert_eq!(allocations() - before, 0, "allocations on 100k passing calls");
}

#[test]
fn calls_on_values_beyond_the_capacity_allocate_nothing() {
    // Each call a value never seen, ten times the rule's 4,000 tracked values: every call past the first
    // 4,000 replaces a value in the rule's table. The table's pages (16 sets each) are made as the first
    // values reach them: 36 allocations at most in the rule's life, none once the table is full.
    let engine = Sentinel::builder().build();
    engine.load_param_flow_rules(vec![ParamFlowRule::new("api", 0).count(1e12)]).unwrap();
    let api = engine.resource("api");
    assert!(api.entry().args(&[&u64::MAX]).enter().is_ok());
    let before = allocations();
    for v in 0..4_000u64 {
        assert!(api.entry().args(&[&v]).enter().is_ok());
    }
    let filling = allocations() - before;
    assert!(filling <= 36, "{filling} allocations filling the table: one per page at most");
    let before = allocations();
    for v in 4_000..40_000u64 {
        assert!(api.entry().args(&[&v]).enter().is_ok());
    }
    assert_eq!(allocations() - before, 0, "allocations on 36k calls, each a new value");
}
