use super::circuit_breaker::degrade_finding;
use super::*;
use crate::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use crate::clock::ManualClock;
use crate::flow::FlowRule;

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

#[test]
fn explains_a_flow_rule_for_another_origin() {
    let (engine, _clock) = engine();
    engine.load_flow_rules(vec![FlowRule::new("api").count(1.0).limit_app("appA")]).unwrap();
    for _ in 0..3 {
        assert!(engine.enter("api").is_ok(), "the rule for appA does not limit calls without origin");
    }
    {
        let _ctx = engine.enter_context("web", "appB").unwrap();
        drop(engine.enter("api").unwrap());
    }
    let d = engine.diagnose("api");
    assert!(d.registered && d.ever_entered);
    assert_eq!(d.calls_without_origin, 3);
    assert_eq!(d.flow.len(), 1);
    let f = &d.flow[0];
    assert!(!f.applies);
    assert!(f.problems[0].contains("no call came with origin `appA`"), "{}", f.problems[0]);
    assert!(f.problems[0].contains("`` (no origin) (3 calls)"), "{}", f.problems[0]);
    assert!(f.problems[0].contains("`appB` (1 calls)"), "{}", f.problems[0]);
    let text = d.to_string();
    assert!(text.contains("[DOES NOT APPLY]"), "{text}");
    assert!(text.contains("limit_app \"default\""), "{text}");
    assert!(text.contains("Circuit breakers: none"), "{text}");
}

#[test]
fn a_default_rule_reads_the_cluster_node_with_current_numbers() {
    let (engine, _clock) = engine();
    engine.load_flow_rules(vec![FlowRule::new("api").count(2.0)]).unwrap();
    let api = engine.resource("api");
    let _held: Vec<_> = (0..3).filter_map(|_| api.enter().ok()).collect();
    let d = engine.diagnose("api");
    let f = &d.flow[0];
    assert!(f.applies);
    assert!(f.reads.contains("cluster node"));
    assert_eq!((f.current, f.threshold), (Some(2.0), Some(2.0)));
    assert!(f.problems.is_empty(), "{:?}", f.problems);
    assert_eq!(d.stats.as_ref().unwrap().block_qps, 1.0);
}

#[test]
fn relate_and_chain_rules_explain_missing_nodes() {
    let (engine, _clock) = engine();
    engine
        .load_flow_rules(vec![
            FlowRule::new("api").count(1.0).relate("db"),
            FlowRule::new("api").count(1.0).chain("web"),
        ])
        .unwrap();
    drop(engine.enter("api").unwrap());
    let d = engine.diagnose("api");
    assert!(d.flow[0].problems[0].contains("`db` does not exist yet"), "{:?}", d.flow[0].problems);
    assert!(d.flow[1].problems[0].contains("never entered in context `web`"), "{:?}", d.flow[1].problems);
    assert!(d.flow[1].problems[0].contains("sentinel_default_context"), "{:?}", d.flow[1].problems);
}

#[test]
fn an_other_rule_with_only_named_or_no_origins_does_not_apply() {
    let (engine, _clock) = engine();
    engine
        .load_flow_rules(vec![
            FlowRule::new("api").count(1.0).limit_app("appA"),
            FlowRule::new("api").count(1.0).limit_app("other"),
        ])
        .unwrap();
    {
        let _ctx = engine.enter_context("web", "appA").unwrap();
        drop(engine.enter("api"));
    }
    drop(engine.enter("api"));
    let d = engine.diagnose("api");
    let other = d.flow.iter().find(|f| f.summary.contains("`other`")).unwrap();
    assert!(!other.applies);
    assert!(other.problems[0].contains("never limited by `other`"), "{:?}", other.problems);
}

#[test]
fn unknown_resources_are_reported_with_similar_names() {
    let (engine, _clock) = engine();
    drop(engine.enter("queryOrder").unwrap());
    let d = engine.diagnose("queryorder");
    assert!(!d.registered);
    assert!(d.notes.iter().any(|n| n.contains("`queryOrder`")), "{:?}", d.notes);
    assert!(d.to_string().contains("registered: no; entered: never"));
}

#[test]
fn min_request_amount_reachability_and_error_tracing() {
    let (engine, clock) = engine();
    let api = engine.resource("api");
    for _ in 0..2 {
        drop(api.enter().unwrap());
    }
    clock.advance_millis(100);
    let stats = engine.cluster_stats("api").unwrap();
    let rule = DegradeRule::new("api", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(5).min_request_amount(10);
    let f = degrade_finding(0, &rule, Some(&stats), None, clock.now_millis());
    assert!(!f.applies);
    assert!(f.problems[0].contains("min_request_amount 10 is not reachable"), "{:?}", f.problems);
    assert!(f.problems[1].contains("no error was traced"), "{:?}", f.problems);

    let reachable =
        DegradeRule::new("api", DegradeGrade::ErrorCount).count(1.0).time_window_sec(5).min_request_amount(1);
    let f = degrade_finding(0, &reachable, Some(&stats), None, clock.now_millis());
    assert!(f.applies, "{:?}", f.problems);

    let d = engine.diagnose("api");
    assert_eq!((d.errors.completions, d.errors.exceptions), (2, 0));
    assert!(d.errors.hint.is_some());
    let mut e = api.enter().unwrap();
    e.set_error();
    drop(e);
    let d = engine.diagnose("api");
    assert_eq!(d.errors.exceptions, 1);
    assert!(d.errors.hint.is_none());
}

#[test]
fn an_open_breaker_is_shown_with_its_state_and_numbers() {
    let (engine, clock) = engine();
    engine
        .load_degrade_rules(vec![DegradeRule::new("pay", DegradeGrade::ErrorCount)
            .count(1.0)
            .time_window_sec(10)
            .min_request_amount(1)])
        .unwrap();
    let pay = engine.resource("pay");
    for _ in 0..3 {
        if let Ok(mut e) = pay.enter() {
            e.set_error();
        }
    }
    let d = engine.diagnose("pay");
    assert_eq!(d.breakers.len(), 1);
    assert_eq!(d.breakers[0].state, BreakerState::Open);
    let f = &d.degrade[0];
    assert!(f.problems.iter().any(|p| p.contains("the breaker is OPEN")), "{:?}", f.problems);
    let text = d.to_string();
    assert!(text.contains("ErrorCount count 1 (own rule): OPEN"), "{text}");
    clock.advance_millis(10_000);
    assert!(pay.enter().is_ok(), "the probe");
}

#[test]
fn a_regex_hot_parameter_rule_shows_under_each_resource_it_matches_and_nowhere_else() {
    use crate::param_flow::ParamFlowRule;
    let (engine, _clock) = engine();
    engine
        .load_param_flow_rules(vec![
            ParamFlowRule::new("order_get", 0).count(9.0),
            ParamFlowRule::new("order_.*", 0).count(3.0).regex(true),
        ])
        .unwrap();
    for name in ["order_get", "order_put", "user_get"] {
        drop(engine.resource(name).enter());
    }
    let get = engine.diagnose("order_get");
    let found: Vec<_> = get.param_flow.iter().map(|f| (f.index, f.threshold, f.pattern.as_deref())).collect();
    assert_eq!(found, vec![(0, Some(9.0), None), (1, Some(3.0), Some("order_.*"))]);
    let put = engine.diagnose("order_put");
    let found: Vec<_> = put.param_flow.iter().map(|f| (f.index, f.pattern.as_deref())).collect();
    assert_eq!(found, vec![(1, Some("order_.*"))], "the pattern's rule, not the exact rule of another name");
    assert!(put.param_flow[0].applies);
    assert!(put.to_string().contains("matched by pattern: `order_.*`"), "{put}");
    assert!(engine.diagnose("user_get").param_flow.is_empty(), "a pattern that does not match is not reported");
}

#[test]
fn a_regex_hot_parameter_rule_that_matches_nothing_is_not_an_unknown_resource() {
    use crate::param_flow::ParamFlowRule;
    let (engine, _clock) = engine();
    drop(engine.resource("order_get").enter());
    engine
        .load_param_flow_rules(vec![
            ParamFlowRule::new("nothing_.*", 0).count(1.0).regex(true),
            ParamFlowRule::new("order_gt", 0).count(1.0),
        ])
        .unwrap();
    let unknown: Vec<String> = engine.unknown_rule_resources().into_iter().map(|u| u.resource).collect();
    assert_eq!(unknown, vec!["order_gt".to_string()], "as for a regex flow rule: a pattern names no resource");
    assert!(engine.diagnose("order_get").param_flow.is_empty());
}
