//! Regex resources (Java's `regex: true` on flow, degrade and authority rules): the rule's resource is a
//! pattern over whole names, and each matching resource is governed separately.

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::{BlockError, RuleError, RuleKind, Sentinel};

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

fn passes(engine: &Sentinel, resource: &str, calls: usize) -> usize {
    let r = engine.resource(resource);
    (0..calls).filter(|_| r.enter().is_ok()).count()
}

#[test]
fn a_regex_flow_rule_limits_each_matching_resource_separately() {
    let (e, clock) = engine();
    e.load_flow_rules([FlowRule::new("order_.*").regex(true).count(2.0)]).unwrap();
    assert_eq!(passes(&e, "order_list", 5), 2);
    assert_eq!(passes(&e, "order_get", 5), 2, "a separate count per resource, not a shared one");
    assert_eq!(passes(&e, "user_get", 5), 5, "a name that does not match is not limited");
    clock.advance_millis(1000);
    assert_eq!(passes(&e, "order_list", 5), 2);
}

#[test]
fn a_pattern_must_match_the_whole_name() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("order").regex(true).count(1.0)]).unwrap();
    assert_eq!(passes(&e, "order", 3), 1);
    assert_eq!(passes(&e, "myorder", 3), 3, "Java's matches(): no match inside a longer name");
    assert_eq!(passes(&e, "orders", 3), 3);
}

#[test]
fn resources_created_before_and_after_the_load_both_get_the_matched_rules() {
    let (e, _clock) = engine();
    let before = e.resource("api/a");
    e.load_flow_rules([FlowRule::new("api/.*").regex(true).count(1.0)]).unwrap();
    let after = e.resource("api/b");
    let _a = before.enter().unwrap();
    assert!(before.enter().is_err());
    let _b = after.enter().unwrap();
    assert!(after.enter().is_err());
}

#[test]
fn exact_and_matched_rules_both_apply_and_the_block_names_the_rule() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("pay").count(5.0), FlowRule::new("pa.").regex(true).count(2.0)]).unwrap();
    let pay = e.resource("pay");
    let held: Vec<_> = (0..2).map(|_| pay.enter().unwrap()).collect();
    match pay.enter().unwrap_err() {
        BlockError::Flow { resource, rule, .. } => {
            assert_eq!(&*resource, "pay");
            assert_eq!(rule.resource, "pa.", "the regex rule blocked (its resource is the pattern)");
            assert!(rule.regex);
        }
        other => panic!("expected a flow block, got {other:?}"),
    }
    drop(held);
    // Removing the regex rule leaves the exact one in force for the same resource.
    e.load_flow_rules([FlowRule::new("pay").count(5.0)]).unwrap();
    assert_eq!(passes(&e, "pay", 10), 3, "5 per second, 2 of them already used");
}

#[test]
fn removing_the_regex_rules_frees_the_matched_resources() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("job-.*").regex(true).count(1.0)]).unwrap();
    assert_eq!(passes(&e, "job-1", 3), 1);
    e.load_flow_rules(Vec::<FlowRule>::new()).unwrap();
    assert_eq!(passes(&e, "job-1", 3), 3);
}

#[test]
fn a_bad_pattern_is_a_typed_error_that_names_the_rule_and_keeps_the_rules_in_force() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("ok").count(1.0)]).unwrap();
    let err = e
        .load_flow_rules([FlowRule::new("ok").count(1.0), FlowRule::new("order(").regex(true).count(1.0)])
        .unwrap_err();
    match &err {
        RuleError::Invalid { kind, index, resource, field, reason } => {
            assert_eq!((*kind, *index, resource.as_str(), *field), (RuleKind::Flow, 1, "order(", "resource"));
            assert!(reason.contains("unclosed group"), "{reason}");
        }
        other => panic!("expected an invalid rule, got {other:?}"),
    }
    assert!(err.to_string().contains("no rule of the set was loaded"), "{err}");
    assert_eq!(e.flow_rules(), vec![FlowRule::new("ok").count(1.0)]);

    let err = e.load_authority_rules([AuthorityRule::new("(?<=a)b", "x", AuthorityStrategy::White).regex(true)]);
    assert!(matches!(err, Err(RuleError::Invalid { kind: RuleKind::Authority, field: "resource", .. })), "{err:?}");
    let err = e.load_degrade_rules([DegradeRule::new("*", DegradeGrade::ErrorCount).time_window_sec(1).regex(true)]);
    assert!(matches!(err, Err(RuleError::Invalid { kind: RuleKind::Degrade, field: "resource", .. })), "{err:?}");
}

#[test]
fn a_pattern_is_only_a_pattern_when_regex_is_set() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("order(").count(1.0)]).unwrap();
    assert_eq!(passes(&e, "order(", 3), 1, "an exact name may hold any character");
    assert_eq!(passes(&e, "order", 3), 3);
}

#[test]
fn a_regex_flow_rule_in_cluster_mode_is_refused() {
    let (e, _clock) = engine();
    let rule = FlowRule {
        cluster_mode: true,
        cluster_config: Some(Default::default()),
        ..FlowRule::new("a.*").regex(true).count(1.0)
    };
    let err = e.load_flow_rules([rule]).unwrap_err();
    assert!(matches!(err, RuleError::Invalid { field: "cluster_mode", .. }), "{err}");
}

#[test]
fn each_matching_resource_has_its_own_rate_limiter_and_it_survives_reloads() {
    let (e, _clock) = engine();
    let limiter = FlowRule::new("q/.*")
        .regex(true)
        .count(1.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(100);
    e.load_flow_rules([limiter.clone()]).unwrap();
    let (a, b) = (e.resource("q/a"), e.resource("q/b"));
    drop(a.enter().unwrap());
    drop(b.enter().unwrap()); // its own spacing: b's first call passes at once
    assert!(a.enter().is_err(), "the next pass of q/a is 1 s away, past the 100 ms queue");
    // Another kind's reload and an equal flow rule reloaded with a new one keep q/a's limiter state.
    e.load_degrade_rules([DegradeRule::new("other", DegradeGrade::ErrorCount).time_window_sec(1)]).unwrap();
    assert!(a.enter().is_err());
    e.load_flow_rules([limiter, FlowRule::new("unrelated").count(1.0)]).unwrap();
    assert!(a.enter().is_err());
}

#[test]
fn other_limit_app_sees_origins_named_by_matched_rules() {
    let (e, _clock) = engine();
    e.load_flow_rules([
        FlowRule::new("svc").count(1.0).limit_app("other"),
        FlowRule::new("s.c").regex(true).count(100.0).limit_app("vip"),
    ])
    .unwrap();
    let svc = e.resource("svc");
    let vip = (0..3).filter(|_| svc.entry().origin("vip").enter().is_ok()).count();
    assert_eq!(vip, 3, "`vip` is named by the regex rule, so `other` does not cover it");
    let web = (0..3).filter(|_| svc.entry().origin("web").enter().is_ok()).count();
    assert_eq!(web, 1);
}

#[test]
fn a_regex_authority_rule_checks_the_callers_of_every_matching_resource() {
    let (e, _clock) = engine();
    e.load_authority_rules([AuthorityRule::new("testRegex_.*", "appA", AuthorityStrategy::Black).regex(true)]).unwrap();
    for name in ["testRegex_1", "testRegex_2"] {
        let r = e.resource(name);
        assert!(matches!(r.entry().origin("appA").enter(), Err(BlockError::Authority { .. })), "{name}");
        assert!(r.entry().origin("appB").enter().is_ok(), "{name}");
    }
    assert!(e.resource("other").entry().origin("appA").enter().is_ok());
}

#[test]
fn a_regex_degrade_rule_gives_each_matching_resource_its_own_breaker() {
    let (e, clock) = engine();
    e.load_degrade_rules([
        DegradeRule::new("*", DegradeGrade::ErrorCount).count(100.0).time_window_sec(10),
        DegradeRule::new("pay_.*", DegradeGrade::ErrorCount)
            .count(0.0)
            .min_request_amount(1)
            .time_window_sec(10)
            .regex(true),
    ])
    .unwrap();
    let (card, wallet) = (e.resource("pay_card"), e.resource("pay_wallet"));
    let mut failed = card.enter().unwrap();
    failed.set_error();
    drop(failed);
    assert!(matches!(card.enter(), Err(BlockError::Degrade { .. })));
    assert!(wallet.enter().is_ok(), "pay_wallet's breaker is its own and still closed");
    let breakers = e.circuit_breakers("pay_card");
    assert_eq!(breakers.len(), 1, "a matched rule is the resource's own: the `*` default does not apply");
    assert_eq!(breakers[0].state, BreakerState::Open);
    assert!(!breakers[0].is_default);
    assert_eq!(e.circuit_breakers("pay_wallet")[0].state, BreakerState::Closed);
    assert!(e.circuit_breakers("orders").is_empty() || e.circuit_breakers("orders")[0].is_default);
    // A reload of flow rules (which refreshes every resource's rules) keeps the open breaker.
    e.load_flow_rules([FlowRule::new("x").count(1.0)]).unwrap();
    assert_eq!(e.circuit_breakers("pay_card")[0].state, BreakerState::Open);
    clock.advance_millis(10_000);
    drop(card.enter().unwrap()); // the probe succeeds
    assert_eq!(e.circuit_breakers("pay_card")[0].state, BreakerState::Closed);
}

#[test]
fn diagnose_names_the_pattern_that_matched() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("report").count(9.0), FlowRule::new("rep.*").regex(true).count(3.0)]).unwrap();
    e.load_authority_rules([AuthorityRule::new("re.*", "ops", AuthorityStrategy::White).regex(true)]).unwrap();
    e.load_degrade_rules([DegradeRule::new("r.*", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(5).regex(true)])
        .unwrap();
    drop(e.resource("report").enter());
    let d = e.diagnose("report");
    let flow: Vec<_> = d.flow.iter().map(|f| (f.threshold, f.pattern.as_deref())).collect();
    assert_eq!(flow, vec![(Some(9.0), None), (Some(3.0), Some("rep.*"))]);
    assert_eq!(d.authority[0].pattern.as_deref(), Some("re.*"));
    assert_eq!(d.degrade[0].pattern.as_deref(), Some("r.*"));
    let text = d.to_string();
    assert!(text.contains("matched by pattern: `rep.*`"), "{text}");
    assert!(e.diagnose("unrelated").flow.is_empty(), "a pattern that does not match is not reported");
}

#[test]
fn regex_rules_are_not_reported_as_naming_unknown_resources() {
    let (e, _clock) = engine();
    e.load_flow_rules([FlowRule::new("nothing_.*").regex(true).count(1.0)]).unwrap();
    assert!(e.unknown_rule_resources().iter().all(|u| u.resource != "nothing_.*"));
}

#[cfg(feature = "serde")]
#[test]
fn a_java_rule_file_with_regex_rules_loads_and_behaves_as_in_java() {
    use sentinel_runtime::datasource::{parse_rules, Format};
    let flow = r#"[
        {"resource": "GET:/api/.*", "limitApp": "default", "grade": 1, "count": 1, "strategy": 0,
         "controlBehavior": 0, "clusterMode": false, "regex": true},
        {"resource": "GET:/health", "limitApp": "default", "grade": 1, "count": 100, "regex": false}
    ]"#;
    let authority = r#"[{"resource": "GET:/admin/.*", "limitApp": "ops", "strategy": 0, "regex": true}]"#;
    let (e, _clock) = engine();
    e.load_flow_rules(parse_rules::<FlowRule>(flow, Format::Json).unwrap()).unwrap();
    e.load_authority_rules(parse_rules::<AuthorityRule>(authority, Format::Json).unwrap()).unwrap();
    assert_eq!(passes(&e, "GET:/api/users", 3), 1);
    assert_eq!(passes(&e, "GET:/api/orders", 3), 1);
    assert_eq!(passes(&e, "GET:/health", 3), 3);
    let admin = e.resource("GET:/admin/users");
    assert!(admin.entry().origin("web").enter().is_err());
    assert!(admin.entry().origin("ops").enter().is_ok());
}

// Hot-parameter rules with `regex` (Java >= 1.8.7: `ParamFlowRuleUtil.checkRegexField`).

fn param_passes(engine: &Sentinel, resource: &str, value: &str, calls: usize) -> usize {
    let r = engine.resource(resource);
    (0..calls).filter(|_| r.entry().args(&[&value]).enter().is_ok()).count()
}

#[test]
fn a_regex_hot_parameter_rule_counts_each_value_of_each_matching_resource_on_its_own() {
    let (e, clock) = engine();
    let before = e.resource("order_list"); // created before the load: resolved when rules load
    e.load_param_flow_rules([ParamFlowRule::new("order_.*", 0).regex(true).count(2.0)]).unwrap();
    assert_eq!(param_passes(&e, before.name(), "ann", 5), 2);
    assert_eq!(param_passes(&e, "order_list", "bob", 5), 2, "another value has its own budget");
    assert_eq!(param_passes(&e, "order_get", "ann", 5), 2, "created after the load: its own counters");
    assert_eq!(param_passes(&e, "user_get", "ann", 5), 5, "a name that does not match is not limited");
    assert_eq!(param_passes(&e, "my_order_list", "ann", 5), 5, "the whole name must match");
    clock.advance_millis(1001);
    assert_eq!(param_passes(&e, "order_list", "ann", 5), 2);
}

#[test]
fn a_regex_hot_parameter_rule_keeps_its_counters_across_a_reload_and_joins_exact_rules() {
    let (e, _clock) = engine();
    let regex = ParamFlowRule::new("order_.*", 0).regex(true).count(2.0);
    e.load_param_flow_rules([regex.clone()]).unwrap();
    assert_eq!(param_passes(&e, "order_list", "ann", 1), 1);
    e.load_param_flow_rules([regex, ParamFlowRule::new("order_list", 0).count(10.0)]).unwrap();
    assert_eq!(param_passes(&e, "order_list", "ann", 5), 1, "the reload kept the value's counter");
    match e.resource("order_list").entry().args(&[&"ann"]).enter() {
        Err(BlockError::ParamFlow { rule, .. }) => assert!(rule.regex && rule.resource == "order_.*"),
        other => panic!("expected the regex rule to block, got {other:?}"),
    }
}

#[test]
fn a_regex_hot_parameter_rule_must_reject_and_stay_local_and_the_error_names_it() {
    let (e, _clock) = engine();
    e.load_param_flow_rules([ParamFlowRule::new("kept", 0).count(1.0)]).unwrap();
    let queueing =
        ParamFlowRule::new("order_.*", 0).regex(true).count(2.0).control_behavior(ControlBehavior::RateLimiter);
    let cluster = ParamFlowRule::new("order_.*", 0)
        .regex(true)
        .count(2.0)
        .cluster(sentinel_runtime::flow::ClusterConfig { flow_id: Some(7), ..Default::default() });
    let bad_pattern = ParamFlowRule::new("order_(", 0).regex(true).count(2.0);
    for (rule, field) in [(queueing, "control_behavior"), (cluster, "cluster_mode"), (bad_pattern, "resource")] {
        let e2 = e.load_param_flow_rules([ParamFlowRule::new("ok", 0).count(1.0), rule]).unwrap_err();
        let RuleError::Invalid { kind, index, field: f, .. } = &e2 else { panic!("{e2}") };
        assert_eq!((*kind, *index, *f), (RuleKind::ParamFlow, 1, field), "{e2}");
    }
    assert_eq!(e.param_flow_rules(), [ParamFlowRule::new("kept", 0).count(1.0)], "the rules in force stay");
}

#[test]
fn the_patterns_of_one_load_hold_16_mib_compiled_in_all_and_a_load_past_it_changes_nothing() {
    // `.{1000}` is seven characters and about 1 MiB compiled: each is within the 1 MiB a pattern may
    // hold, thirty are past what a kind's patterns may hold together.
    let (e, _clock) = engine();
    let heavy = |i: usize| FlowRule::new(format!("r{i}_.{{1000}}")).regex(true).count(1.0);
    e.load_flow_rules((0..10).map(heavy)).unwrap();
    let err = e.load_flow_rules((0..30).map(heavy)).unwrap_err();
    let RuleError::Invalid { kind, field, reason, .. } = &err else { panic!("{err}") };
    assert_eq!((*kind, *field), (RuleKind::Flow, "resource"), "{err}");
    assert!(reason.contains("16 MiB compiled in all"), "{err}");
    assert_eq!(e.flow_rules().len(), 10, "the rules in force stay");
}
