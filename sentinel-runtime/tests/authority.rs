//! Authority rules (SPEC §9): white/black lists by origin, matched exactly, empty origin passes.

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{BlockError, RuleError, RuleKind, Sentinel};

fn engine() -> Sentinel {
    Sentinel::builder().manual_clock(ManualClock::at_millis(1_700_000_000_000)).build()
}

fn enter_as(engine: &Sentinel, resource: &str, origin: &str) -> Result<(), BlockError> {
    engine.resource(resource).entry().origin(origin).enter().map(drop)
}

#[test]
fn white_list_admits_only_listed_origins() {
    let e = engine();
    e.load_authority_rules(vec![AuthorityRule::new("api", "appA,appB", AuthorityStrategy::White)]).unwrap();
    assert!(enter_as(&e, "api", "appA").is_ok());
    assert!(enter_as(&e, "api", "appB").is_ok());
    let err = enter_as(&e, "api", "appC").unwrap_err();
    match &err {
        BlockError::Authority { resource, rule, origin } => {
            assert_eq!(&**resource, "api");
            assert_eq!(&**origin, "appC");
            assert_eq!(rule.limit_app, "appA,appB");
            assert_eq!(rule.strategy, AuthorityStrategy::White);
        }
        other => panic!("expected an authority block, got {other:?}"),
    }
    assert_eq!(err.origin(), "appC");
    assert!(err.to_string().contains("origin `appC` not allowed"), "{err}");
}

#[test]
fn black_list_blocks_only_listed_origins() {
    let e = engine();
    e.load_authority_rules(vec![AuthorityRule::new("api", "bad", AuthorityStrategy::Black)]).unwrap();
    assert!(matches!(enter_as(&e, "api", "bad"), Err(BlockError::Authority { .. })));
    assert!(enter_as(&e, "api", "good").is_ok());
}

#[test]
fn default_strategy_is_white() {
    let rule = AuthorityRule { resource: "api".into(), limit_app: "appA".into(), ..Default::default() };
    assert_eq!(rule.strategy, AuthorityStrategy::White);
    let e = engine();
    e.load_authority_rules(vec![rule]).unwrap();
    assert!(enter_as(&e, "api", "appB").is_err());
}

#[test]
fn empty_origin_passes_both_lists() {
    let e = engine();
    e.load_authority_rules(vec![
        AuthorityRule::new("white", "appA", AuthorityStrategy::White),
        AuthorityRule::new("black", "appA", AuthorityStrategy::Black),
    ])
    .unwrap();
    assert!(e.resource("white").enter().is_ok());
    assert!(e.resource("black").enter().is_ok());
}

#[test]
fn membership_is_exact_equality_with_no_trimming() {
    let e = engine();
    e.load_authority_rules(vec![AuthorityRule::new("api", "appA, appB,app", AuthorityStrategy::White)]).unwrap();
    assert!(enter_as(&e, "api", "appA").is_ok());
    assert!(enter_as(&e, "api", "appB").is_err(), "the list holds ` appB`, with its space");
    assert!(enter_as(&e, "api", " appB").is_ok());
    assert!(enter_as(&e, "api", "app").is_ok());
    assert!(enter_as(&e, "api", "ap").is_err(), "a substring of the list is not a member");
    assert!(enter_as(&e, "api", "APPA").is_err(), "case matters");
}

#[test]
fn every_rule_of_the_resource_must_pass() {
    let e = engine();
    e.load_authority_rules(vec![
        AuthorityRule::new("api", "appA,appB", AuthorityStrategy::White),
        AuthorityRule::new("api", "appB", AuthorityStrategy::Black),
    ])
    .unwrap();
    assert!(enter_as(&e, "api", "appA").is_ok());
    let err = enter_as(&e, "api", "appB").unwrap_err();
    assert!(matches!(err, BlockError::Authority { ref rule, .. } if rule.strategy == AuthorityStrategy::Black));
    assert!(enter_as(&e, "other", "appB").is_ok(), "rules apply to their own resource only");
}

#[test]
fn authority_runs_before_flow_and_counts_as_a_block() {
    let e = engine();
    e.load_flow_rules(vec![FlowRule::new("api").count(0.0)]).unwrap();
    e.load_authority_rules(vec![AuthorityRule::new("api", "appA", AuthorityStrategy::White)]).unwrap();
    assert!(matches!(enter_as(&e, "api", "appB"), Err(BlockError::Authority { .. })));
    assert!(matches!(enter_as(&e, "api", "appA"), Err(BlockError::Flow { .. })));
    let stats = e.cluster_stats("api").unwrap();
    assert_eq!(stats.block_qps, 2.0);
    assert_eq!(stats.pass_qps, 0.0);
}

#[test]
fn invalid_rules_are_rejected_as_a_set_and_the_old_rules_stay() {
    let e = engine();
    let good = AuthorityRule::new("api", "appA", AuthorityStrategy::White);
    e.load_authority_rules(vec![good.clone()]).unwrap();

    let err = e
        .load_authority_rules(vec![good.clone(), AuthorityRule::new("  ", "appA", AuthorityStrategy::White)])
        .unwrap_err();
    assert!(matches!(err, RuleError::Invalid { kind: RuleKind::Authority, index: 1, field: "resource", .. }));

    let err = e.load_authority_rules(vec![AuthorityRule::new("api", "", AuthorityStrategy::Black)]).unwrap_err();
    assert!(matches!(err, RuleError::Invalid { index: 0, field: "limit_app", .. }), "{err}");

    assert_eq!(e.authority_rules(), vec![good]);
    assert!(enter_as(&e, "api", "appB").is_err(), "the old rule is still in force");
}

#[test]
fn equal_rules_are_deduplicated_and_unloading_removes_the_check() {
    let e = engine();
    let r = AuthorityRule::new("api", "appA", AuthorityStrategy::White);
    e.load_authority_rules(vec![r.clone(), r.clone()]).unwrap();
    assert_eq!(e.authority_rules().len(), 1);
    assert!(enter_as(&e, "api", "appB").is_err());
    e.load_authority_rules(vec![]).unwrap();
    assert!(enter_as(&e, "api", "appB").is_ok());
}
