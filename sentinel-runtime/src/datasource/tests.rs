use super::*;
use crate::authority::AuthorityStrategy;
use crate::circuit_breaker::DegradeGrade;
use crate::clock::ManualClock;
use crate::flow::{ClusterConfig, ClusterThresholdType, ControlBehavior, FlowGrade, FlowStrategy};
use crate::param_flow::{ItemClass, ParamFlowItem, ParamItemValue};

const FORMATS: [Format; 3] = [Format::Json, Format::Yaml, Format::Toml];

fn sample_flow() -> Vec<FlowRule> {
    vec![
        FlowRule::new("getUser").count(20.0).id(7),
        FlowRule::new("getUser").count(5.0).limit_app("appA").grade(FlowGrade::Thread),
        FlowRule::new("createOrder").count(100.0).control_behavior(ControlBehavior::WarmUp).warm_up_period_sec(30),
        FlowRule::new("pay").count(10.0).relate("createOrder").control_behavior(ControlBehavior::RateLimiter),
        FlowRule::new("list")
            .count(50.5)
            .chain("web")
            .control_behavior(ControlBehavior::WarmUpRateLimiter)
            .cold_factor(5),
        FlowRule {
            cluster_mode: true,
            cluster_config: Some(ClusterConfig {
                flow_id: Some(111),
                threshold_type: ClusterThresholdType::Global,
                fallback_to_local_when_fail: false,
                sample_count: 5,
                window_interval_ms: 2000,
                expected_instances: Some(3),
            }),
            ..FlowRule::new("cluster").count(33.0)
        },
    ]
}

fn sample_degrade() -> Vec<DegradeRule> {
    vec![
        DegradeRule::new("getUser", DegradeGrade::SlowRequestRatio)
            .count(50.0)
            .time_window_sec(10)
            .slow_ratio_threshold(0.5),
        DegradeRule::new("pay", DegradeGrade::ErrorRatio).count(0.25).time_window_sec(5).min_request_amount(20),
        DegradeRule::new("*", DegradeGrade::ErrorCount).count(3.0).time_window_sec(1).stat_interval_ms(60_000),
    ]
}

fn sample_system() -> Vec<SystemRule> {
    vec![
        SystemRule { qps: Some(1000.0), ..Default::default() },
        SystemRule { highest_system_load: Some(4.5), highest_cpu_usage: Some(0.8), ..Default::default() },
        SystemRule { id: Some(3), avg_rt: Some(200), max_thread: Some(64), ..Default::default() },
    ]
}

fn sample_authority() -> Vec<AuthorityRule> {
    vec![
        AuthorityRule::new("getUser", "appA,appB", AuthorityStrategy::White),
        AuthorityRule::new("pay", "bad", AuthorityStrategy::Black),
    ]
}

fn sample_param() -> Vec<ParamFlowRule> {
    vec![
        ParamFlowRule::new("getUser", 0)
            .count(5.0)
            .burst_count(2)
            .duration_in_sec(3)
            .item(ParamItemValue::Int(7), 100.0)
            .item(ParamItemValue::Int(1 << 40), 1.0)
            .item(ParamItemValue::Str("7".into()), 50.0)
            .item(ParamItemValue::Bool(true), 3.0)
            .item(ParamItemValue::Float(2.5), 4.0)
            .item(ParamItemValue::Char('x'), 0.0),
        ParamFlowRule::new("search", -1)
            .grade(FlowGrade::Thread)
            .count(2.0)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_time_ms(300),
    ]
}

fn round_trip<R: RuleData + PartialEq + std::fmt::Debug>(rules: Vec<R>) {
    for f in FORMATS {
        let text = rules_to_string(&rules, f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let back: Vec<R> = parse_rules(&text, f).unwrap_or_else(|e| panic!("{f}: {e}\n{text}"));
        assert_eq!(back, rules, "{f} round trip of\n{text}");
    }
}

#[test]
fn flow_rules_round_trip_in_every_format() {
    round_trip(sample_flow());
}

#[test]
fn degrade_rules_round_trip_in_every_format() {
    round_trip(sample_degrade());
}

#[test]
fn system_rules_round_trip_in_every_format() {
    round_trip(sample_system());
}

#[test]
fn authority_rules_round_trip_in_every_format() {
    round_trip(sample_authority());
}

#[test]
fn param_flow_rules_round_trip_in_every_format() {
    round_trip(sample_param());
}

#[test]
fn rule_set_round_trips_and_keeps_absent_kinds_absent() {
    let set = RuleSet {
        flow: Some(sample_flow()),
        degrade: Some(sample_degrade()),
        system: None,
        authority: Some(Vec::new()),
        param_flow: Some(sample_param()),
        adaptive: Some(vec![crate::adaptive::AdaptiveRule::new("db").limits(2, 4, 40).partition("mobile", 0.6)]),
        ..RuleSet::default()
    };
    for f in FORMATS {
        let text = set.to_string(f).unwrap();
        assert_eq!(RuleSet::parse(&text, f).unwrap(), set, "{f}:\n{text}");
    }
    assert_eq!(
        set.kinds(),
        vec![RuleKind::Authority, RuleKind::ParamFlow, RuleKind::Flow, RuleKind::Degrade, RuleKind::Adaptive]
    );
}

#[test]
fn java_codes_and_names_are_written() {
    let text = rules_to_string(&[FlowRule::new("a").count(3.0).relate("b")], Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let r = &v[0];
    assert_eq!(r["grade"], 1);
    assert_eq!(r["strategy"], 1);
    assert_eq!(r["refResource"], "b");
    assert_eq!(r["controlBehavior"], 0);
    assert_eq!(r["limitApp"], "default");
    assert_eq!(r["warmUpPeriodSec"], 10);
    assert_eq!(r["maxQueueingTimeMs"], 500);
    assert!(r.get("coldFactor").is_none(), "the default cold factor is not written");

    let text = rules_to_string(&sample_system()[..1], Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v[0]["qps"], 1000.0);
    assert_eq!(v[0]["maxThread"], -1, "unset is Java's -1");
    assert_eq!(v[0]["highestSystemLoad"], -1.0);

    let text = rules_to_string(&sample_degrade()[..1], Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v[0]["timeWindow"], 10);
    assert_eq!(v[0]["slowRatioThreshold"], 0.5);
    assert_eq!(v[0]["statIntervalMs"], 1000);
    assert_eq!(v[0]["minRequestAmount"], 5);
}

/// Rules as a Java setup exports them: the dashboard's entities (`id`, `app`, `ip`, `port`, `gmtCreate`,
/// `gmtModified`), Java's cluster config fields, `regex: false`, `hotItems`.
#[test]
fn java_dashboard_export_loads_as_it_is() {
    let flow = r#"[
      {"id": 1, "app": "order-service", "ip": "10.0.0.5", "port": 8719, "resource": "GET:/orders",
       "limitApp": "default", "grade": 1, "count": 20.0, "strategy": 0, "refResource": null,
       "controlBehavior": 0, "warmUpPeriodSec": 10, "maxQueueingTimeMs": 500, "clusterMode": false,
       "clusterConfig": {"flowId": null, "thresholdType": 0, "fallbackToLocalWhenFail": true, "strategy": 0,
                         "sampleCount": 10, "windowIntervalMs": 1000, "resourceTimeout": 2000,
                         "resourceTimeoutStrategy": 0, "acquireRefuseStrategy": 0, "clientOfflineTime": 2000},
       "gmtCreate": 1700000000000, "gmtModified": 1700000000000, "regex": false},
      {"resource": "cluster-resource", "grade": 1, "count": 33, "clusterMode": true,
       "clusterConfig": {"flowId": 111, "thresholdType": 1, "fallbackToLocalWhenFail": false}}
    ]"#;
    let rules: Vec<FlowRule> = parse_rules(flow, Format::Json).unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].id, Some(1));
    assert_eq!(rules[0].resource, "GET:/orders");
    assert_eq!(rules[0].ref_resource, None);
    assert_eq!(rules[1].cluster_config.as_ref().unwrap().threshold_type, ClusterThresholdType::Global);
    assert!(!rules[1].cluster_config.as_ref().unwrap().fallback_to_local_when_fail);
    assert_eq!(rules[1].cluster_config.as_ref().unwrap().sample_count, 10, "Java's default");

    let degrade = r#"[{"resource": "pay", "limitApp": "default", "grade": 2, "count": 5, "timeWindow": 10,
        "minRequestAmount": 5, "statIntervalMs": 60000, "slowRatioThreshold": 1.0, "app": "x", "id": 3}]"#;
    let d: Vec<DegradeRule> = parse_rules(degrade, Format::Json).unwrap();
    assert_eq!(d[0].grade, DegradeGrade::ErrorCount);
    assert_eq!(d[0].stat_interval_ms, 60_000);

    let system = r#"[{"id": 9, "app": "x", "ip": "1.2.3.4", "port": 8719, "highestSystemLoad": -1.0,
        "highestCpuUsage": -1, "qps": 800, "avgRt": -1, "maxThread": -1, "resource": null, "limitApp": null}]"#;
    let s: Vec<SystemRule> = parse_rules(system, Format::Json).unwrap();
    assert_eq!(s[0], SystemRule { id: Some(9), qps: Some(800.0), ..Default::default() });

    let authority = r#"[{"resource": "getUser", "limitApp": "appA,appB", "strategy": 1, "gmtCreate": 1}]"#;
    let a: Vec<AuthorityRule> = parse_rules(authority, Format::Json).unwrap();
    assert_eq!(a[0].strategy, AuthorityStrategy::Black);

    let param = r#"[{"resource": "getUser", "limitApp": "default", "grade": 1, "paramIdx": 0, "count": 5,
        "controlBehavior": 0, "maxQueueingTimeMs": 0, "burstCount": 0, "durationInSec": 1,
        "paramFlowItemList": [
          {"object": "7", "count": 100, "classType": "int"},
          {"object": "9", "count": 1, "classType": "java.lang.Long"},
          {"object": "7", "count": 50, "classType": "java.lang.String"},
          {"object": "vip", "count": 10},
          {"object": "TRUE", "count": 2, "classType": "java.lang.Boolean"},
          {"object": "1.5", "count": 3, "classType": "float"},
          {"object": "q", "count": 4, "classType": "char"}
        ],
        "hotItems": {"7": 100}, "clusterMode": false, "clusterConfig": {"flowId": 5}}]"#;
    let p: Vec<ParamFlowRule> = parse_rules(param, Format::Json).unwrap();
    let items: Vec<ParamItemValue> = p[0].items.iter().map(|i| i.value.clone()).collect();
    assert_eq!(
        items,
        vec![
            ParamItemValue::Int(7),
            ParamItemValue::Int(9),
            ParamItemValue::Str("7".into()),
            ParamItemValue::Str("vip".into()),
            ParamItemValue::Bool(true),
            ParamItemValue::Float(1.5),
            ParamItemValue::Char('q'),
        ]
    );
    assert_eq!(p[0].items[0], ParamFlowItem::new(ParamItemValue::Int(7), 100.0));
    assert!(!p[0].cluster_config.as_ref().unwrap().fallback_to_local_when_fail, "param cluster default is false");
}

/// fastjson's default parser features (`JSON.DEFAULT_PARSER_FEATURE`) take unquoted field names, single
/// quotes and arbitrary commas, so a hand-written Java rules file with them loads in Java.
#[test]
fn a_hand_written_java_document_with_fastjson_leniency_loads_as_java_loads_it() {
    let text =
        "[{resource: 'api', 'count': 10, grade: 1,}, // a comment\n,{\"resource\": \"it's\", count: 2 /* two */},]";
    let rules: Vec<FlowRule> = parse_rules(text, Format::Json).unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!((rules[0].resource.as_str(), rules[0].count), ("api", 10.0));
    assert_eq!((rules[1].resource.as_str(), rules[1].count), ("it's", 2.0));
    let set = RuleSet::parse("{flowRules: [{resource: 'a\\'b\"c', count: 3,}],}", Format::Json).unwrap();
    assert_eq!(set.flow.unwrap()[0].resource, "a'b\"c");
    #[cfg(feature = "tower")]
    assert_eq!(crate::web::gateway::json::rules_from_json("[{resource: 'r', count: 1,}]").unwrap().len(), 1);
    // What no leniency makes a document is reported where the text has it.
    let e = parse_rules::<FlowRule>("[{'resource': 'a',\n 'count': }]", Format::Json).unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
}

#[test]
fn absent_fields_take_java_defaults() {
    let r: Vec<FlowRule> = parse_rules(r#"[{"resource": "a"}]"#, Format::Json).unwrap();
    assert_eq!(r[0], FlowRule::new("a"));
    let r: Vec<FlowRule> = parse_rules(r#"[{"resource": "a", "limitApp": ""}]"#, Format::Json).unwrap();
    assert_eq!(r[0].limit_app, "default", "blank limitApp is default, as in Java");
    let d: Vec<DegradeRule> = parse_rules(r#"[{"resource": "a", "count": 1}]"#, Format::Json).unwrap();
    assert_eq!(d[0].min_request_amount, 5);
    assert_eq!(d[0].grade, DegradeGrade::SlowRequestRatio);
    let s: Vec<SystemRule> = parse_rules("[{}]", Format::Json).unwrap();
    assert_eq!(s[0], SystemRule::default());
}

#[test]
fn unknown_field_is_reported_with_line_and_path() {
    let text = "[\n  {\"resource\": \"a\",\n   \"grad\": 0}\n]";
    let e = parse_rules::<FlowRule>(text, Format::Json).unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("unknown field `grad`"), "{e}");
    assert!(e.to_string().contains("line 3"), "{e}");

    let e = RuleSet::parse("{\"flowRule\": []}", Format::Json).unwrap_err();
    assert!(e.message.contains("unknown field `flowRule`"), "{e}");
}

#[test]
fn wrong_type_is_reported_with_field_path() {
    let text = "{\"flowRules\": [\n {\"resource\": \"a\"},\n {\"resource\": \"b\", \"count\": \"ten\"}\n]}";
    let e = RuleSet::parse(text, Format::Json).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("flowRules[1].count"));
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("invalid type"), "{e}");
}

#[test]
fn bad_code_is_reported_with_what_is_expected() {
    let e = parse_rules::<FlowRule>("[{\"resource\": \"a\", \"grade\": 7}]", Format::Json).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("[0].grade"));
    assert!(e.message.contains("1 (QPS)"), "{e}");
    let e = parse_rules::<DegradeRule>("- resource: a\n  grade: 3\n", Format::Yaml).unwrap_err();
    assert!(e.line.is_some(), "{e}");
    assert_eq!(e.field.as_deref(), Some("[0].grade"));
    assert!(e.message.starts_with("invalid value"), "{e}");
    let e = parse_rules::<AuthorityRule>("[[rules]]\nresource = \"a\"\nstrategy = 2\n", Format::Toml).unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("white list"), "{e}");
}

#[test]
fn cluster_config_fields_are_read_and_checked_as_java_checks_them() {
    let doc = r#"[{"resource": "api", "grade": 1, "count": 1000, "clusterMode": true,
        "clusterConfig": {"flowId": 42, "thresholdType": 1, "fallbackToLocalWhenFail": false, "strategy": 0,
                          "sampleCount": 4, "windowIntervalMs": 2000, "resourceTimeout": 2000}}]"#;
    let rules = parse_rules::<FlowRule>(doc, Format::Json).unwrap();
    let c = rules[0].cluster_config.as_ref().unwrap();
    assert_eq!(
        (c.flow_id, c.threshold_type, c.fallback_to_local_when_fail),
        (Some(42), ClusterThresholdType::Global, false)
    );
    assert_eq!((c.sample_count, c.window_interval_ms), (4, 2000));
    // Java's only cluster strategy is 0.
    let e = parse_rules::<FlowRule>(&doc.replace(r#""strategy": 0"#, r#""strategy": 1"#), Format::Json).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("[0].clusterConfig.strategy"), "{e}");
    // A window that does not split into equal buckets, and a zero flow id, are rejected with the field.
    let engine = Sentinel::builder().build();
    for (bad, field) in [
        (doc.replace(r#""sampleCount": 4"#, r#""sampleCount": 3"#), "cluster_config.window_interval_ms"),
        (doc.replace(r#""flowId": 42"#, r#""flowId": 0"#), "cluster_config.flow_id"),
        (doc.replace(r#""sampleCount": 4"#, r#""sampleCount": 0"#), "cluster_config.sample_count"),
    ] {
        let rules = parse_rules::<FlowRule>(&bad, Format::Json).unwrap();
        match engine.load_flow_rules(rules) {
            Err(RuleError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected an error on {field}, got {other:?}"),
        }
    }
    assert!(engine.flow_rules().is_empty(), "nothing was loaded");
}

#[test]
fn bad_param_item_values_are_errors_and_regex_param_rules_load_as_patterns() {
    let e = parse_rules::<ParamFlowRule>(
        r#"[{"resource": "a", "paramIdx": 0, "paramFlowItemList": [{"object": "abc", "count": 1, "classType": "int"}]}]"#,
        Format::Json,
    )
    .unwrap_err();
    assert!(e.message.contains("not a valid int"), "{e}");
    let e = parse_rules::<ParamFlowRule>(r#"[{"resource": "a", "count": 1}]"#, Format::Json).unwrap_err();
    assert!(e.message.contains("paramIdx"), "{e}");
    let rules = parse_rules::<ParamFlowRule>(
        r#"[{"resource": "a.*", "paramIdx": 0, "count": 1, "regex": true}]"#,
        Format::Json,
    )
    .unwrap();
    assert!(rules[0].regex, "Java >= 1.8.7 reads `regex` on hot-parameter rules");
    let back = rules_to_string(&rules, Format::Json).unwrap();
    assert!(back.contains("\"regex\": true") || back.contains("\"regex\":true"), "{back}");
}

#[test]
fn regex_rules_of_flow_degrade_and_authority_load_as_patterns() {
    let flow =
        parse_rules::<FlowRule>(r#"[{"resource": "order.*", "regex": true, "count": 2}]"#, Format::Json).unwrap();
    assert!(flow[0].regex);
    assert_eq!(flow[0].resource, "order.*");
    let degrade = parse_rules::<DegradeRule>(
        r#"[{"resource": "pay.*", "regex": true, "grade": 2, "count": 1, "timeWindow": 5}]"#,
        Format::Json,
    )
    .unwrap();
    assert!(degrade[0].regex);
    let authority = parse_rules::<AuthorityRule>(
        r#"[{"resource": "admin.*", "regex": true, "limitApp": "ops", "strategy": 0}]"#,
        Format::Json,
    )
    .unwrap();
    assert!(authority[0].regex);
    // `regex: false` names the resource exactly, and a written rule keeps the flag.
    let exact = parse_rules::<FlowRule>(r#"[{"resource": "a.*", "regex": false}]"#, Format::Json).unwrap();
    assert!(!exact[0].regex);
    let text = rules_to_string(&flow, Format::Json).unwrap();
    assert!(text.contains(r#""regex":true"#) || text.contains(r#""regex": true"#), "{text}");
    assert_eq!(parse_rules::<FlowRule>(&text, Format::Json).unwrap(), flow);
}

#[test]
fn syntax_errors_carry_positions_in_every_format() {
    // (Extra commas are fastjson's leniency, which loads: a missing value is an error in Java too.)
    let e = parse_rules::<FlowRule>("[{\"resource\": \"a\",\n \"count\": }]", Format::Json).unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.column.is_some());
    let e = parse_rules::<FlowRule>("- resource: a\n  count: [1\n", Format::Yaml).unwrap_err();
    assert!(e.line.is_some(), "{e}");
    let e = parse_rules::<FlowRule>("[[rules]]\nresource = \"a\"\ncount = \n", Format::Toml).unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    let e = parse_rules::<FlowRule>("[] trailing", Format::Json).unwrap_err();
    assert!(e.message.contains("trailing"), "{e}");
}

#[test]
fn yaml_and_toml_use_the_same_field_names() {
    let yaml = "flowRules:\n  - resource: api\n    grade: 0\n    count: 4\n    limitApp: appA\n";
    let toml = "[[flowRules]]\nresource = \"api\"\ngrade = 0\ncount = 4\nlimitApp = \"appA\"\n";
    let a = RuleSet::parse(yaml, Format::Yaml).unwrap();
    let b = RuleSet::parse(toml, Format::Toml).unwrap();
    assert_eq!(a, b);
    let r = &a.flow.unwrap()[0];
    assert_eq!(
        (r.grade, r.count, r.limit_app.as_str(), r.strategy),
        (FlowGrade::Thread, 4.0, "appA", FlowStrategy::Direct)
    );
}

#[test]
fn a_yaml_document_nesting_flow_collections_deeper_than_any_rule_document_is_refused_before_parsing() {
    // The parser takes time in the square of the depth: such a document would hold the reloading thread.
    for open in ["[", "{a: "] {
        let deep = format!("flowRules:\n  - resource: api\n    count: 1\nx: {}", open.repeat(100_000));
        let e = RuleSet::parse(&deep, Format::Yaml).unwrap_err();
        assert!(e.message.contains("nested more than 64"), "{e}");
        assert_eq!((e.line, e.column), (Some(4), Some(4 + 64 * open.len())), "where the 65th opens: {e}");
    }
    // Flow style within the bound parses as before.
    let flow = "flowRules: [{resource: api, count: 4, limitApp: appA}]\n";
    assert_eq!(RuleSet::parse(flow, Format::Yaml).unwrap().flow.unwrap()[0].count, 4.0);
    let nested = format!("x: {}1{}", "[".repeat(64), "]".repeat(64));
    let e = RuleSet::parse(&nested, Format::Yaml).unwrap_err();
    assert!(!e.message.contains("nested more than"), "64 levels are parsed (and refused as unknown): {e}");
}

#[test]
fn applied_rule_set_limits_calls() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let set = RuleSet::parse(r#"{"flowRules": [{"resource": "api", "grade": 1, "count": 2}]}"#, Format::Json).unwrap();
    assert_eq!(set.apply(&engine).unwrap(), vec![RuleKind::Flow]);
    let api = engine.resource("api");
    let passed = (0..5).filter(|_| api.enter().is_ok()).count();
    assert_eq!(passed, 2);
}

#[test]
fn invalid_rule_set_is_rejected_and_rules_stay() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_000_000)).build();
    engine.load_flow_rules(vec![FlowRule::new("api").count(3.0)]).unwrap();
    let set = RuleSet::parse(r#"{"flowRules": [{"resource": "api", "count": -1}]}"#, Format::Json).unwrap();
    let e = set.apply(&engine).unwrap_err();
    let RuleError::Invalid { field, index, .. } = &e;
    assert_eq!((*field, *index), ("count", 0));
    assert_eq!(engine.flow_rules(), vec![FlowRule::new("api").count(3.0)]);
}

/// A set whose second kind is rejected leaves the first kind as it was. (Degrade validation lives in the
/// circuit breaker module: where it accepts everything, the set simply applies.)
#[test]
fn a_rejected_kind_rolls_back_the_kinds_loaded_before_it() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_000_000)).build();
    engine.load_flow_rules(vec![FlowRule::new("api").count(3.0)]).unwrap();
    let set = RuleSet {
        flow: Some(vec![FlowRule::new("api").count(9.0)]),
        degrade: Some(vec![DegradeRule::new("api", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(0)]),
        ..Default::default()
    };
    match set.apply(&engine) {
        Err(RuleError::Invalid { kind, field, .. }) => {
            assert_eq!((kind, field), (RuleKind::Degrade, "time_window_sec"));
            assert_eq!(engine.flow_rules(), vec![FlowRule::new("api").count(3.0)], "flow rolled back");
        }
        Ok(kinds) => {
            assert_eq!(kinds, vec![RuleKind::Flow, RuleKind::Degrade]);
            assert_eq!(engine.flow_rules(), vec![FlowRule::new("api").count(9.0)]);
        }
    }
}

mod file_source {
    use super::*;
    use std::fs;

    fn engine() -> (Sentinel, ManualClock) {
        let clock = ManualClock::at_millis(1_700_000_000_000);
        (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
    }

    fn flow_doc(count: u32) -> String {
        format!("{{\"flowRules\": [{{\"resource\": \"api\", \"grade\": 1, \"count\": {count}}}]}}")
    }

    fn passes(engine: &Sentinel, clock: &ManualClock) -> usize {
        clock.advance_millis(1000);
        let api = engine.resource("api");
        (0..10).filter(|_| api.enter().is_ok()).count()
    }

    #[test]
    fn an_edit_takes_effect() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.json");
        fs::write(&path, flow_doc(2)).unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::new(&engine, &path);
        assert_eq!(src.reload_now().unwrap(), Reloaded::Applied { kinds: vec![RuleKind::Flow] });
        assert_eq!(passes(&engine, &clock), 2);
        assert_eq!(src.reload_now().unwrap(), Reloaded::Unchanged);
        fs::write(&path, flow_doc(5)).unwrap();
        assert!(matches!(src.reload_now().unwrap(), Reloaded::Applied { .. }));
        assert_eq!(passes(&engine, &clock), 5);
    }

    #[test]
    fn a_half_written_file_does_not_replace_good_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.json");
        fs::write(&path, flow_doc(2)).unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::new(&engine, &path);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        src.on_reload(move |r| s2.lock().unwrap().push(r.is_ok()));
        src.reload_now().unwrap();
        let full = flow_doc(9);
        fs::write(&path, &full[..full.len() / 2]).unwrap();
        let err = src.reload_now().unwrap_err();
        match &err {
            SourceError::Parse { path: p, error } => {
                assert_eq!(p, &path);
                assert_eq!(error.line, Some(1));
            }
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains("rules.json"), "{err}");
        assert!(src.last_error().is_some());
        assert_eq!(passes(&engine, &clock), 2, "the good rules stay");
        fs::write(&path, full).unwrap();
        src.reload_now().unwrap();
        assert!(src.last_error().is_none());
        assert_eq!(passes(&engine, &clock), 9);
        assert_eq!(*seen.lock().unwrap(), vec![true, false, true]);
    }

    #[test]
    fn an_invalid_rule_or_unknown_field_is_reported_with_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        fs::write(&path, "flowRules:\n  - resource: api\n    count: 2\n").unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::new(&engine, &path);
        src.reload_now().unwrap();

        fs::write(&path, "flowRules:\n  - resource: api\n    count: -4\n").unwrap();
        match src.reload_now().unwrap_err() {
            SourceError::Invalid { path: p, error: RuleError::Invalid { field, .. } } => {
                assert_eq!((p, field), (path.clone(), "count"))
            }
            other => panic!("unexpected {other}"),
        }
        fs::write(&path, "flowRules:\n  - resource: api\n    count: 3\n    limitapp: appA\n").unwrap();
        match src.reload_now().unwrap_err() {
            SourceError::Parse { error, .. } => {
                assert_eq!(error.line, Some(4));
                assert!(error.message.contains("limitapp"), "{error}");
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(passes(&engine, &clock), 2);
    }

    #[test]
    fn deleting_the_file_is_reported_and_keeps_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flow-rules.json");
        fs::write(&path, r#"[{"resource": "api", "count": 4}]"#).unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::new(&engine, &path);
        src.reload_now().unwrap();
        fs::remove_file(&path).unwrap();
        let err = src.reload_now().unwrap_err();
        assert!(matches!(&err, SourceError::Missing { path: p } if p == &path), "{err}");
        assert_eq!(passes(&engine, &clock), 4);
        fs::write(&path, r#"[{"resource": "api", "count": 1}]"#).unwrap();
        src.reload_now().unwrap();
        assert_eq!(passes(&engine, &clock), 1);
    }

    #[test]
    fn a_directory_holds_one_file_per_kind() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("flow-rules.json"), r#"[{"resource": "api", "count": 3}]"#).unwrap();
        fs::write(
            dir.path().join("degrade-rules.yaml"),
            "- resource: api\n  grade: 1\n  count: 0.5\n  timeWindow: 5\n",
        )
        .unwrap();
        fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::new(&engine, dir.path());
        assert_eq!(src.reload_now().unwrap(), Reloaded::Applied { kinds: vec![RuleKind::Flow, RuleKind::Degrade] });
        assert_eq!(passes(&engine, &clock), 3);

        fs::write(dir.path().join("degrade-rules.yaml"), "- resource: api\n  grade: 9\n").unwrap();
        let err = src.reload_now().unwrap_err();
        assert_eq!(err.path(), dir.path().join("degrade-rules.yaml"));

        fs::remove_file(dir.path().join("degrade-rules.yaml")).unwrap();
        let err = src.reload_now().unwrap_err();
        assert!(matches!(err, SourceError::Missing { .. }), "{err}");
        assert_eq!(passes(&engine, &clock), 3);
        // Reported once; the next change of the other files applies.
        fs::write(dir.path().join("flow-rules.json"), r#"[{"resource": "api", "count": 6}]"#).unwrap();
        src.reload_now().unwrap();
        assert_eq!(passes(&engine, &clock), 6);
    }

    /// A rules directory is Java's per-kind files, each a `FileRefreshableDataSource` of its own: a file that
    /// does not parse, or that the engine refuses, keeps its kind's rules in force and is reported, and does
    /// not hold back a change of another kind's file.
    #[test]
    fn a_bad_file_in_a_directory_does_not_hold_back_a_change_of_another_kinds_file() {
        #[allow(unused_mut)]
        let mut bad: Vec<(&str, &str)> = vec![
            ("degrade-rules.json", r#"[{"resource": "api", "grade": "#),
            ("degrade-rules.json", r#"[{"resource": "api", "grade": 1, "count": 5, "timeWindow": 5}]"#),
        ];
        #[cfg(feature = "tower")]
        bad.push(("gw-flow-rules.json", r#"[{"resource": "r", "count": "#));
        for (name, text) in bad {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join("flow-rules.json"), r#"[{"resource": "api", "count": 3}]"#).unwrap();
            fs::write(
                dir.path().join("degrade-rules.json"),
                r#"[{"resource": "api", "grade": 1, "count": 0.5, "timeWindow": 5}]"#,
            )
            .unwrap();
            let (engine, clock) = engine();
            let src = FileDataSource::new(&engine, dir.path());
            src.reload_now().unwrap();
            let degrade = engine.degrade_rules();
            fs::write(dir.path().join(name), text).unwrap();
            let err = src.reload_now().unwrap_err();
            assert_eq!(err.path(), dir.path().join(name), "{name}: {err}");
            // The flow file changes meanwhile: its change is in force, the bad file is reported again.
            fs::write(dir.path().join("flow-rules.json"), r#"[{"resource": "api", "count": 6}]"#).unwrap();
            let err = src.reload_now().unwrap_err();
            assert_eq!(err.path(), dir.path().join(name), "{name}: {err}");
            assert_eq!(passes(&engine, &clock), 6, "{name}: the flow file's change is in force");
            assert_eq!(engine.degrade_rules(), degrade, "{name}: the degrade rules in force stay");
            assert_eq!(src.last_error().map(|e| e.path().to_path_buf()), Some(dir.path().join(name)));
            // Fixed: loads, and the error is gone.
            fs::write(dir.path().join(name), "[]").unwrap();
            assert!(src.reload_now().is_ok(), "{name}");
            assert!(src.last_error().is_none());
        }
    }

    #[test]
    fn adaptive_rules_load_from_the_rules_directory_and_the_combined_document_in_every_format() {
        use crate::adaptive::{AdaptiveRule, AlgorithmKind};
        let expected = vec![AdaptiveRule::new("db")
            .algorithm(AlgorithmKind::Vegas)
            .limits(2, 8, 40)
            .max_wait_ms(50)
            .partition("mobile", 0.6)];
        let per_kind = [
            ("json", r#"[{"resource": "db", "algorithm": "vegas", "minLimit": 2, "initialLimit": 8, "maxLimit": 40, "maxWaitMs": 50, "partitions": {"mobile": 0.6}}]"#),
            ("yaml", "- resource: db\n  algorithm: vegas\n  minLimit: 2\n  initialLimit: 8\n  maxLimit: 40\n  maxWaitMs: 50\n  partitions:\n    mobile: 0.6\n"),
            ("toml", "[[rules]]\nresource = \"db\"\nalgorithm = \"vegas\"\nminLimit = 2\ninitialLimit = 8\nmaxLimit = 40\nmaxWaitMs = 50\npartitions = { mobile = 0.6 }\n"),
        ];
        for (ext, text) in per_kind {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(format!("adaptive-rules.{ext}")), text).unwrap();
            let engine = Sentinel::builder().build();
            let src = FileDataSource::new(&engine, dir.path());
            assert_eq!(src.reload_now().unwrap(), Reloaded::Applied { kinds: vec![RuleKind::Adaptive] }, "{ext}");
            assert_eq!(engine.adaptive_rules(), expected, "adaptive-rules.{ext}");
            // A bad rule (min over max): a typed error naming the field, the rules in force stay.
            let bad = text.replace("40", "1");
            fs::write(dir.path().join(format!("adaptive-rules.{ext}")), bad).unwrap();
            match src.reload_now().unwrap_err() {
                SourceError::Invalid { error: RuleError::Invalid { field, .. }, .. } => {
                    assert!(field.contains("imit"), "{ext}: {field}")
                }
                other => panic!("{ext}: unexpected {other}"),
            }
            assert_eq!(engine.adaptive_rules(), expected, "{ext}: the rules in force stay");
        }
        for f in FORMATS {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("rules.{}", f.extension()));
            let set = RuleSet::new().with_adaptive(expected.clone()).with_flow(vec![FlowRule::new("api").count(3.0)]);
            fs::write(&path, set.to_string(f).unwrap()).unwrap();
            assert!(set.to_string(f).unwrap().contains("adaptiveRules"), "{f}");
            let engine = Sentinel::builder().build();
            FileDataSource::new(&engine, &path).reload_now().unwrap();
            assert_eq!(engine.adaptive_rules(), expected, "{f}: adaptiveRules of a combined document");
            assert_eq!(engine.flow_rules().len(), 1);
        }
    }

    #[test]
    fn a_java_per_kind_file_loads_whatever_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("FlowRule.json");
        fs::write(&path, r#"[{"resource": "api", "grade": 1, "count": 4, "limitApp": "default"}]"#).unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::for_kind(&engine, &path, RuleKind::Flow);
        assert_eq!(src.reload_now().unwrap(), Reloaded::Applied { kinds: vec![RuleKind::Flow] });
        assert_eq!(passes(&engine, &clock), 4);
    }

    #[cfg(feature = "file-watch")]
    #[test]
    fn the_watcher_reloads_on_change() {
        use std::sync::mpsc;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.toml");
        fs::write(&path, "[[flowRules]]\nresource = \"api\"\ncount = 2\n").unwrap();
        let (engine, clock) = engine();
        let src = FileDataSource::new(&engine, &path);
        src.reload_now().unwrap();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        src.on_reload(move |r| {
            let _ = tx.lock().unwrap().send(r.clone().map_err(|e| e.to_string()));
        });
        let _watcher = src.watch(Duration::from_millis(50)).unwrap();
        fs::write(&path, "[[flowRules]]\nresource = \"api\"\ncount = 7\n").unwrap();
        // Wait (generously) for the reload the write causes; no timing is asserted.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(Reloaded::Applied { .. })) => break,
                Ok(_) => continue,
                Err(e) => panic!("no reload within 30 s: {e}"),
            }
        }
        assert_eq!(passes(&engine, &clock), 7);
    }
}

mod write_back {
    use super::*;
    use std::fs;

    fn flow(count: f64) -> RuleSet {
        RuleSet { flow: Some(vec![FlowRule::new("api").count(count)]), ..RuleSet::default() }
    }

    #[test]
    fn a_combined_document_keeps_its_other_kinds_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        fs::write(&path, "flowRules:\n- resource: api\n  count: 1\ndegradeRules:\n- resource: db\n  grade: 2\n  count: 3\n  timeWindow: 5\n").unwrap();
        let engine = Sentinel::builder().build();
        let src = FileDataSource::new(&engine, &path);
        src.reload_now().unwrap();
        flow(8.0).apply(&engine).unwrap(); // a write-back stores what is in force
        src.write_rules(&flow(8.0)).unwrap();
        let back = RuleSet::parse(&fs::read_to_string(&path).unwrap(), Format::Yaml).unwrap();
        assert_eq!(back.flow.unwrap()[0].count, 8.0);
        assert_eq!(back.degrade.unwrap()[0].resource, "db", "the other kind stays");
        assert_eq!(src.reload_now().unwrap(), Reloaded::Unchanged, "the write is what is in force");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    }

    #[test]
    fn a_directory_gets_the_kind_file_in_its_existing_format() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("flow-rules.toml"), "[[rules]]\nresource = \"api\"\ncount = 1\n").unwrap();
        let engine = Sentinel::builder().build();
        let src = FileDataSource::new(&engine, dir.path());
        src.reload_now().unwrap();
        let degrade = vec![DegradeRule::new("db", crate::circuit_breaker::DegradeGrade::ErrorCount)
            .count(2.0)
            .time_window_sec(5)];
        let set = RuleSet { degrade: Some(degrade), ..flow(4.0) };
        set.apply(&engine).unwrap(); // a write-back stores what is in force
        src.write_rules(&set).unwrap();
        let toml = fs::read_to_string(dir.path().join("flow-rules.toml")).unwrap();
        assert_eq!(parse_rules::<FlowRule>(&toml, Format::Toml).unwrap()[0].count, 4.0);
        let json = fs::read_to_string(dir.path().join("degrade-rules.json")).unwrap();
        assert_eq!(parse_rules::<DegradeRule>(&json, Format::Json).unwrap()[0].resource, "db");
        assert_eq!(src.reload_now().unwrap(), Reloaded::Unchanged);
    }

    #[test]
    fn a_single_kind_file_refuses_another_kind_and_an_invalid_document_is_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let single = dir.path().join("flow-rules.json");
        let engine = Sentinel::builder().build();
        let src = FileDataSource::new(&engine, &single);
        let set = RuleSet { system: Some(vec![SystemRule::default()]), ..RuleSet::default() };
        let err = src.write_rules(&set).unwrap_err();
        assert!(matches!(err, WriteError::WrongKind { .. }), "{err}");
        src.write_rules(&flow(3.0)).unwrap();
        assert_eq!(parse_rules::<FlowRule>(&fs::read_to_string(&single).unwrap(), Format::Json).unwrap().len(), 1);

        let combined = dir.path().join("rules.json");
        fs::write(&combined, "{ not json").unwrap();
        let err = FileDataSource::new(&engine, &combined).write_rules(&flow(3.0)).unwrap_err();
        assert!(matches!(err, WriteError::Unreadable { .. }), "{err}");
        assert_eq!(fs::read_to_string(&combined).unwrap(), "{ not json");
    }

    #[cfg(feature = "file-watch")]
    #[test]
    fn the_reload_a_write_triggers_finds_nothing_to_do() {
        use std::sync::mpsc;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.json");
        fs::write(&path, r#"{"flowRules": [{"resource": "api", "count": 1}]}"#).unwrap();
        let engine = Sentinel::builder().build();
        let src = FileDataSource::new(&engine, &path);
        src.reload_now().unwrap();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        src.on_reload(move |r| {
            let _ = tx.lock().unwrap().send(r.clone().map_err(|e| e.to_string()));
        });
        let _watcher = src.watch(Duration::from_millis(50)).unwrap();
        let rules = vec![FlowRule::new("api").count(6.0)];
        engine.load_flow_rules(rules.clone()).unwrap();
        src.write_rules(&RuleSet { flow: Some(rules), ..RuleSet::default() }).unwrap();
        // The watcher sees the rename and reloads: it finds what is in force (waits generously; no timing
        // is asserted).
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(r) => assert_eq!(r, Ok(Reloaded::Unchanged)),
            Err(e) => panic!("the watcher did not report the write within 30 s: {e}"),
        }
        assert_eq!(engine.flow_rules()[0].count, 6.0);
    }

    #[test]
    fn a_failed_write_is_an_io_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // The directory is gone: the temporary file cannot be created next to the rules file.
        let path = dir.path().join("gone").join("rules.json");
        let engine = Sentinel::builder().build();
        let err = FileDataSource::new(&engine, &path).write_rules(&flow(3.0)).unwrap_err();
        assert!(matches!(err, WriteError::Io { .. }), "{err}");
        assert!(err.to_string().contains("rules.json"), "{err}");
        assert!(!path.exists());
    }
}

use std::sync::{Arc, Mutex};

/// fastjson (Java's reader of rule files and pushes) reads a number written as a string (`"count": "10"`), a
/// whole number written with a fraction (`"grade": 1.0`) and a boolean written as a string or 0/1 into the
/// field's type: Java loads such a rule as if the value were written plainly.
#[test]
fn values_fastjson_coerces_load_as_java_loads_them() {
    let flow = r#"[{"resource": "a", "grade": "1", "count": "10", "strategy": "0", "controlBehavior": 1.0,
        "warmUpPeriodSec": "20", "maxQueueingTimeMs": 500.0, "clusterMode": "false", "regex": 0,
        "clusterConfig": {"flowId": "5", "thresholdType": "1", "fallbackToLocalWhenFail": "true",
                          "sampleCount": "10", "windowIntervalMs": "1000"}}]"#;
    let r: Vec<FlowRule> = parse_rules(flow, Format::Json).unwrap();
    assert_eq!((r[0].grade, r[0].count, r[0].control_behavior), (FlowGrade::Qps, 10.0, ControlBehavior::WarmUp));
    assert_eq!((r[0].warm_up_period_sec, r[0].max_queueing_time_ms, r[0].cluster_mode), (20, 500, false));
    let c = r[0].cluster_config.as_ref().unwrap();
    assert_eq!((c.flow_id, c.threshold_type, c.sample_count), (Some(5), ClusterThresholdType::Global, 10));

    let degrade = r#"[{"resource": "d", "grade": "2", "count": "5", "timeWindow": "10", "minRequestAmount": "3",
        "statIntervalMs": "60000", "slowRatioThreshold": "0.5"}]"#;
    let d: Vec<DegradeRule> = parse_rules(degrade, Format::Json).unwrap();
    assert_eq!((d[0].grade, d[0].count, d[0].time_window_sec), (DegradeGrade::ErrorCount, 5.0, 10));
    assert_eq!((d[0].min_request_amount, d[0].stat_interval_ms, d[0].slow_ratio_threshold), (3, 60_000, 0.5));

    let s: Vec<SystemRule> =
        parse_rules(r#"[{"qps": "800", "avgRt": "-1", "maxThread": 64.0, "highestCpuUsage": "0.8"}]"#, Format::Json)
            .unwrap();
    assert_eq!(
        s[0],
        SystemRule { qps: Some(800.0), max_thread: Some(64), highest_cpu_usage: Some(0.8), ..Default::default() }
    );

    let a: Vec<AuthorityRule> =
        parse_rules(r#"[{"resource": "x", "limitApp": "a", "strategy": "1", "id": "4"}]"#, Format::Json).unwrap();
    assert_eq!((a[0].strategy, a[0].id), (AuthorityStrategy::Black, Some(4)));

    let p: Vec<ParamFlowRule> = parse_rules(
        r#"[{"resource": "p", "paramIdx": "0", "count": "5", "durationInSec": "2", "burstCount": "1",
            "paramFlowItemList": [{"object": "7", "count": "100", "classType": "int"}]}]"#,
        Format::Json,
    )
    .unwrap();
    assert_eq!((p[0].param_idx, p[0].count, p[0].duration_in_sec, p[0].burst_count), (0, 5.0, 2, 1));
    assert_eq!(p[0].items[0], ParamFlowItem::new(ParamItemValue::Int(7), 100.0));

    // A string that is not a number stays refused (as in fastjson); so does a fraction for an integer field
    // (fastjson truncates it silently: a documented difference).
    for bad in [r#"[{"resource": "a", "count": "ten"}]"#, r#"[{"resource": "a", "warmUpPeriodSec": 1.5}]"#] {
        assert!(parse_rules::<FlowRule>(bad, Format::Json).is_err(), "{bad}");
    }
}

/// The dashboard's hot-parameter page offers `float` items; Java's `getParamFlowRules` gives back the item as
/// it was pushed (`"object": "1.1", "classType": "float"`), and so must ours: the page lists what the user
/// typed, and the value written back to the data source reads the same in Java.
#[test]
fn a_float_param_item_reads_back_as_it_was_pushed() {
    let pushed = r#"[{"resource": "p", "paramIdx": 0, "count": 5,
        "paramFlowItemList": [{"object": "1.1", "count": 10, "classType": "float"},
                              {"object": "0.1", "count": 3, "classType": "double"}]}]"#;
    let rules: Vec<ParamFlowRule> = parse_rules(pushed, Format::Json).unwrap();
    let text = rules_to_string(&rules, Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let items = &v[0]["paramFlowItemList"];
    assert_eq!((items[0]["object"].as_str(), items[0]["classType"].as_str()), (Some("1.1"), Some("float")), "{text}");
    assert_eq!((items[1]["object"].as_str(), items[1]["classType"].as_str()), (Some("0.1"), Some("double")), "{text}");
    // And it reads back to the same item: the f32 1.1 widened.
    let back: Vec<ParamFlowRule> = parse_rules(&text, Format::Json).unwrap();
    assert_eq!(back, rules);
}

/// Java matches an exception item by its class (`Long` 7 is not `Integer` 7), and its `getParamFlowRules` gives
/// the class back as pushed. A `long`, `short` or `byte` item written back as `int` (to the dashboard, and to a
/// data source a Java instance also reads) would match other arguments there.
#[test]
fn integer_param_items_read_back_with_their_class() {
    let pushed = r#"[{"resource": "p", "paramIdx": 0, "count": 5,
        "paramFlowItemList": [{"object": "7", "count": 10, "classType": "long"},
                              {"object": "3", "count": 2, "classType": "byte"},
                              {"object": "4", "count": 2, "classType": "short"}]}]"#;
    let rules: Vec<ParamFlowRule> = parse_rules(pushed, Format::Json).unwrap();
    let text = rules_to_string(&rules, Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let classes: Vec<_> =
        v[0]["paramFlowItemList"].as_array().unwrap().iter().map(|i| i["classType"].as_str().unwrap()).collect();
    assert_eq!(classes, ["long", "byte", "short"], "{text}");
    let back: Vec<ParamFlowRule> = parse_rules(&text, Format::Json).unwrap();
    assert_eq!(back, rules);
    assert_eq!(back[0].items[0].class_type(), Some(ItemClass::Long));
}

/// Every format a rule file is written in keeps an item's class, and so does a float pushed as one class
/// whose value the other would be written as by default (a `float` 2.5, a `double` that an `f32` holds).
#[test]
fn every_written_format_keeps_each_items_class() {
    let pushed = r#"[{"resource": "p", "paramIdx": 0, "count": 5,
        "paramFlowItemList": [{"object": "7", "count": 10, "classType": "java.lang.Long"},
                              {"object": "3", "count": 2, "classType": "byte"},
                              {"object": "4", "count": 2, "classType": "short"},
                              {"object": "5", "count": 2, "classType": "int"},
                              {"object": "2.5", "count": 2, "classType": "float"},
                              {"object": "1.100000023841858", "count": 2, "classType": "double"},
                              {"object": "1.1", "count": 2, "classType": "float"},
                              {"object": "x", "count": 2}]}]"#;
    let rules: Vec<ParamFlowRule> = parse_rules(pushed, Format::Json).unwrap();
    let expected = [
        ("7", "long"),
        ("3", "byte"),
        ("4", "short"),
        ("5", "int"),
        ("2.5", "float"),
        ("1.100000023841858", "double"),
        ("1.1", "float"),
        ("x", "java.lang.String"),
    ];
    for format in [Format::Json, Format::Yaml, Format::Toml] {
        let text = rules_to_string(&rules, format).unwrap();
        let back: Vec<ParamFlowRule> = parse_rules(&text, format).unwrap();
        assert_eq!(back, rules, "{format:?}: {text}");
        // Read back through JSON to look at the written fields.
        let v: serde_json::Value = serde_json::from_str(&rules_to_string(&back, Format::Json).unwrap()).unwrap();
        let items: Vec<(&str, &str)> = v[0]["paramFlowItemList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["object"].as_str().unwrap(), i["classType"].as_str().unwrap()))
            .collect();
        assert_eq!(items, expected, "{format:?}: {text}");
        for (object, class) in expected {
            assert!(text.contains(object) && text.contains(class), "{format:?}: {object} {class} in {text}");
        }
    }
    // An item built in code: the class it is given, or its value's when that class cannot be the value.
    let built = ParamFlowRule::new("p", 0)
        .count(1.0)
        .with_item(ParamFlowItem::new(ParamItemValue::Int(7), 1.0).with_class(ItemClass::Long))
        .with_item(ParamFlowItem::new(ParamItemValue::Int(1000), 1.0).with_class(ItemClass::Byte))
        .with_item(ParamFlowItem::new(ParamItemValue::Str("s".into()), 1.0).with_class(ItemClass::Long))
        .item(ParamItemValue::Int(1 << 40), 1.0);
    let v: serde_json::Value = serde_json::from_str(&rules_to_string(&[built], Format::Json).unwrap()).unwrap();
    let classes: Vec<_> =
        v[0]["paramFlowItemList"].as_array().unwrap().iter().map(|i| i["classType"].as_str().unwrap()).collect();
    assert_eq!(classes, ["long", "int", "java.lang.String", "long"]);
    // Items equal when they are written alike: no class and the class the value gives are the same item.
    assert_eq!(
        ParamFlowItem::new(ParamItemValue::Int(7), 1.0),
        ParamFlowItem::new(ParamItemValue::Int(7), 1.0).with_class(ItemClass::Int)
    );
    assert_ne!(
        ParamFlowItem::new(ParamItemValue::Int(7), 1.0),
        ParamFlowItem::new(ParamItemValue::Int(7), 1.0).with_class(ItemClass::Long)
    );
}
