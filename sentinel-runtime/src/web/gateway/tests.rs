//! Tests of the rule set (validation, conversion to hot-parameter rules, arguments) and of the JSON formats.

use std::borrow::Cow;

use http::Request;

use super::*;
use crate::flow::{ControlBehavior, FlowGrade};
use crate::param_flow::ParamItemValue;
use crate::web::{PeerAddr, RequestView, TrustedProxies};

const ROUTE: &str = "my_test_route_A";

/// The rules of Java's `GatewayParamParserTest.testParseParametersWithItems`, in that order.
fn java_route_rules() -> Vec<GatewayFlowRule> {
    vec![
        GatewayFlowRule::new(ROUTE).count(2.0).interval_sec(2).burst(2).param_item(GatewayParamItem::client_ip()),
        GatewayFlowRule::new(ROUTE)
            .count(10.0)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_timeout_ms(600)
            .param_item(GatewayParamItem::header("X-Sentinel-Flag")),
        GatewayFlowRule::new(ROUTE).count(20.0).burst(5).param_item(GatewayParamItem::url_param("p")),
        GatewayFlowRule::new(ROUTE).count(120.0).interval_sec(10).burst(30).param_item(GatewayParamItem::host()),
        GatewayFlowRule::new(ROUTE).count(50.0).interval_sec(30).param_item(GatewayParamItem::cookie("myCookie")),
        GatewayFlowRule::new(ROUTE).count(10.0).interval_sec(10),
        GatewayFlowRule::new("my_test_route_B")
            .resource_mode(ResourceMode::CustomApiName)
            .count(5.0)
            .param_item(GatewayParamItem::url_param("p")),
    ]
}

fn java_request() -> Request<()> {
    let mut req = Request::get("/x?p=17")
        .header("host", "hello.test.sentinel")
        .header("X-Sentinel-Flag", "Sentinel")
        .header("cookie", "myCookie=Sentinel-Foo")
        .body(())
        .unwrap();
    req.extensions_mut().insert(PeerAddr("66.77.88.99:5000".parse().unwrap()));
    req
}

fn extract(set: &GatewayRuleSet, mode: ResourceMode, name: &str, req: &Request<()>) -> Vec<Option<String>> {
    let args = set.arguments(mode, name).expect("rules for the resource");
    args.extract(&RequestView::new(req), &TrustedProxies::none()).into_iter().map(|v| v.map(Cow::into_owned)).collect()
}

#[test]
fn each_parameter_rule_reads_its_own_argument_and_rules_without_one_read_the_constant_last() {
    let set = GatewayRuleSet::new(java_route_rules()).unwrap();
    let args = extract(&set, ResourceMode::RouteId, ROUTE, &java_request());
    let want = ["66.77.88.99", "Sentinel", "17", "hello.test.sentinel", "Sentinel-Foo", DEFAULT_PARAM];
    assert_eq!(args, want.map(|v| Some(v.to_string())), "six arguments, as Java's parser gives");
    let api = extract(&set, ResourceMode::CustomApiName, "my_test_route_B", &java_request());
    assert_eq!(api, [Some("17".to_string())]);
    assert!(set.arguments(ResourceMode::CustomApiName, ROUTE).is_none(), "no API rule names the route");
}

#[test]
fn a_gateway_rule_becomes_the_hot_parameter_rule_java_converts_it_to() {
    let set = GatewayRuleSet::new(java_route_rules()).unwrap();
    let converted = set.param_flow_rules();
    assert_eq!(converted.len(), 7);
    let ip = &converted[0];
    assert_eq!((ip.resource.as_str(), ip.param_idx, ip.count), (ROUTE, 0, 2.0));
    assert_eq!((ip.duration_in_sec, ip.burst_count, ip.grade), (2, 2, FlowGrade::Qps));
    assert!(ip.items.is_empty(), "no pattern: no not-matched item");
    let header = &converted[1];
    assert_eq!(
        (header.param_idx, header.control_behavior, header.max_queueing_time_ms),
        (1, ControlBehavior::RateLimiter, 600)
    );
    let whole = &converted[5];
    assert_eq!((whole.param_idx, whole.count, whole.duration_in_sec), (5, 10.0, 10), "the constant's position");
    let api = &converted[6];
    assert_eq!((api.resource.as_str(), api.param_idx), ("my_test_route_B", 0));
    for rule in converted {
        crate::param_flow::validate(rule, 0).expect("a converted rule is a valid hot-parameter rule");
    }
}

#[test]
fn a_pattern_adds_javas_not_matched_item_with_its_budget() {
    let rule = GatewayFlowRule::new("r")
        .count(3.0)
        .param_item(GatewayParamItem::url_param("a").pattern("rt", ParamMatchStrategy::Regex));
    let set = GatewayRuleSet::new(vec![rule]).unwrap();
    let items = &set.param_flow_rules()[0].items;
    assert_eq!(items.len(), 1);
    assert_eq!((&items[0].value, items[0].count), (&ParamItemValue::Str(NOT_MATCHED_PARAM.into()), NOT_MATCHED_COUNT));
    let req = |q: &str| Request::get(format!("/?a={q}")).body(()).unwrap();
    assert_eq!(extract(&set, ResourceMode::RouteId, "r", &req("rt")), [Some("rt".to_string())]);
    assert_eq!(extract(&set, ResourceMode::RouteId, "r", &req("rtx")), [Some(NOT_MATCHED_PARAM.to_string())]);
    assert_eq!(extract(&set, ResourceMode::RouteId, "r", &Request::get("/").body(()).unwrap()), [None], "absent");
}

#[test]
fn several_whole_resource_rules_share_one_constant_position() {
    let set = GatewayRuleSet::new(vec![
        GatewayFlowRule::new("r").count(5.0),
        GatewayFlowRule::new("r").count(10.0).control_behavior(ControlBehavior::RateLimiter),
    ])
    .unwrap();
    assert!(set.param_flow_rules().iter().all(|r| r.param_idx == 0));
    assert_eq!(extract(&set, ResourceMode::RouteId, "r", &java_request()), [Some(DEFAULT_PARAM.to_string())]);
}

#[test]
fn a_name_used_as_route_and_api_keeps_each_modes_rules_to_its_own_entries() {
    let set = GatewayRuleSet::new(vec![
        GatewayFlowRule::new("shared").count(1.0).param_item(GatewayParamItem::header("x-a")),
        GatewayFlowRule::new("shared").resource_mode(ResourceMode::CustomApiName).count(2.0),
        GatewayFlowRule::new("shared").count(3.0),
        GatewayFlowRule::new("shared")
            .resource_mode(ResourceMode::CustomApiName)
            .count(4.0)
            .param_item(GatewayParamItem::header("x-b")),
    ])
    .unwrap();
    let idx: Vec<i32> = set.param_flow_rules().iter().map(|r| r.param_idx).collect();
    assert_eq!(idx, [0, 3, 2, 1], "parameters first, then the route's constant, then the API's");
    let req = Request::get("/").header("x-a", "A").header("x-b", "B").body(()).unwrap();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(extract(&set, ResourceMode::RouteId, "shared", &req), [some("A"), None, some(DEFAULT_PARAM), None]);
    assert_eq!(
        extract(&set, ResourceMode::CustomApiName, "shared", &req),
        [None, some("B"), None, some(DEFAULT_PARAM)]
    );
}

#[test]
fn repeated_rules_are_loaded_once_and_take_no_position() {
    let per_ip = GatewayFlowRule::new("r").count(1.0).param_item(GatewayParamItem::client_ip());
    let set = GatewayRuleSet::new(vec![per_ip.clone(), per_ip.clone(), GatewayFlowRule::new("r").count(2.0)]).unwrap();
    assert_eq!(set.rules().len(), 2);
    assert_eq!(set.param_flow_rules().iter().map(|r| r.param_idx).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn invalid_rules_reject_the_set_naming_the_rule_and_the_field() {
    let ok = GatewayFlowRule::new("abc");
    let cases: Vec<(GatewayFlowRule, &str)> = vec![
        (GatewayFlowRule::default(), "resource"),
        (ok.clone().interval_sec(0), "interval_sec"),
        (ok.clone().interval_sec(MAX_INTERVAL_SEC + 1), "interval_sec"),
        (ok.clone().count(-1.0), "count"),
        (ok.clone().count(f64::NAN), "count"),
        (ok.clone().control_behavior(ControlBehavior::WarmUp), "control_behavior"),
        (ok.clone().param_item(GatewayParamItem::url_param("")), "param_item.field_name"),
        (ok.clone().param_item(GatewayParamItem::cookie("  ")), "param_item.field_name"),
        (
            ok.clone().param_item(GatewayParamItem { parse_strategy: ParseStrategy::Header, ..Default::default() }),
            "param_item.field_name",
        ),
        (ok.clone().param_item(GatewayParamItem::header("bad header")), "param_item.field_name"),
        (
            ok.clone().param_item(GatewayParamItem::header("x").pattern("(", ParamMatchStrategy::Regex)),
            "param_item.pattern",
        ),
    ];
    for (bad, field) in cases {
        let err = GatewayRuleSet::new(vec![ok.clone(), bad.clone()]).unwrap_err();
        assert_eq!((err.index(), err.field()), (1, field), "{bad:?}");
        assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
    }
    // Java's valid examples stay valid.
    for good in [
        ok.clone(),
        ok.clone().param_item(GatewayParamItem::client_ip()),
        ok.clone().param_item(GatewayParamItem::header("Origin").pattern("def", ParamMatchStrategy::Exact)),
        ok.clone().param_item(GatewayParamItem::client_ip().pattern("", ParamMatchStrategy::Regex)),
    ] {
        GatewayRuleSet::new(vec![good]).unwrap();
    }
}

/// The converted rules run on today's hot-parameter machinery (an engine of its own, on a manual clock),
/// entered with the arguments taken from requests: what the wiring will do per request.
mod on_the_engine {
    use super::*;
    use crate::clock::ManualClock;
    use crate::param_flow::HotParam;
    use crate::{BlockError, Sentinel};

    struct Gateway {
        engine: Sentinel,
        clock: ManualClock,
        set: GatewayRuleSet,
    }

    impl Gateway {
        fn new(rules: Vec<GatewayFlowRule>) -> Self {
            let clock = ManualClock::at_millis(1_000_000);
            let engine = Sentinel::builder().manual_clock(clock.clone()).build();
            let set = GatewayRuleSet::new(rules).unwrap();
            engine.load_param_flow_rules(set.param_flow_rules().to_vec()).unwrap();
            Gateway { engine, clock, set }
        }
        /// Whether a request passes the rules of route `name`.
        fn pass(&self, name: &str, req: &Request<()>) -> bool {
            let args = self.set.arguments(ResourceMode::RouteId, name).unwrap();
            let values = args.extract(&RequestView::new(req), &TrustedProxies::none());
            let refs: Vec<&dyn HotParam> = values.iter().map(|v| v as &dyn HotParam).collect();
            match self.engine.resource(name).entry().args(&refs).enter() {
                Ok(_entry) => true,
                Err(BlockError::ParamFlow { .. }) => false,
                Err(other) => panic!("unexpected block: {other}"),
            }
        }
    }

    fn from(ip: &str) -> Request<()> {
        let mut req = Request::get("/").body(()).unwrap();
        req.extensions_mut().insert(PeerAddr(format!("{ip}:1").parse().unwrap()));
        req
    }

    #[test]
    fn a_whole_route_rule_admits_exactly_its_count_per_interval() {
        let gw = Gateway::new(vec![GatewayFlowRule::new("r").count(3.0)]);
        let passed = (0..10).filter(|_| gw.pass("r", &from("192.0.2.1"))).count();
        assert_eq!(passed, 3);
        assert!(!gw.pass("r", &from("192.0.2.2")), "the route as a whole, whoever calls");
        gw.clock.advance_millis(1001);
        assert!(gw.pass("r", &from("192.0.2.3")));
    }

    #[test]
    fn burst_and_a_sixty_second_interval_refill_only_after_strictly_more_than_the_interval() {
        let rule =
            GatewayFlowRule::new("r").count(2.0).interval_sec(60).burst(1).param_item(GatewayParamItem::client_ip());
        let gw = Gateway::new(vec![rule]);
        let a = from("192.0.2.1");
        assert_eq!((0..5).filter(|_| gw.pass("r", &a)).count(), 3, "count + burst");
        assert!(gw.pass("r", &from("192.0.2.2")), "each client has its own bucket");
        gw.clock.advance_millis(60_000);
        assert!(!gw.pass("r", &a), "exactly the interval: no refill yet");
        gw.clock.advance_millis(1);
        assert_eq!((0..5).filter(|_| gw.pass("r", &a)).count(), 2, "refilled in proportion: 60.001 s × 2 / 60 s");
    }

    #[test]
    fn values_outside_the_pattern_are_not_limited_and_matching_ones_are_one_by_one() {
        let rule = GatewayFlowRule::new("r")
            .count(1.0)
            .param_item(GatewayParamItem::header("x-tenant").pattern("vip-.*", ParamMatchStrategy::Regex));
        let gw = Gateway::new(vec![rule]);
        let tenant = |t: &str| Request::get("/").header("x-tenant", t).body(()).unwrap();
        assert!(gw.pass("r", &tenant("vip-1")) && !gw.pass("r", &tenant("vip-1")));
        assert!(gw.pass("r", &tenant("vip-2")), "its own budget");
        assert_eq!((0..1000).filter(|_| gw.pass("r", &tenant("basic"))).count(), 1000, "not matched");
        assert_eq!((0..1000).filter(|_| gw.pass("r", &Request::get("/").body(()).unwrap())).count(), 1000, "absent");
        let marker = tenant(NOT_MATCHED_PARAM);
        assert_eq!((0..3).filter(|_| gw.pass("r", &marker)).count(), 3, "the marker is not a matching value");
        let any = GatewayFlowRule::new("s")
            .count(1.0)
            .param_item(GatewayParamItem::header("x-k").pattern(".*", ParamMatchStrategy::Regex));
        let gw = Gateway::new(vec![any]);
        let sneaky = Request::get("/").header("x-k", NOT_MATCHED_PARAM).body(()).unwrap();
        assert!(gw.pass("s", &sneaky) && !gw.pass("s", &sneaky), "a matching value spelling the marker is limited");
    }

    #[test]
    fn a_prefix_parameter_pattern_limits_only_values_with_the_prefix() {
        let rule = GatewayFlowRule::new("r")
            .count(1.0)
            .param_item(GatewayParamItem::url_param("key").pattern("test-", ParamMatchStrategy::Prefix));
        let gw = Gateway::new(vec![rule]);
        let key = |k: &str| Request::get(format!("/?key={k}")).body(()).unwrap();
        assert!(gw.pass("r", &key("test-1")) && !gw.pass("r", &key("test-1")));
        assert_eq!((0..100).filter(|_| gw.pass("r", &key("prod-1"))).count(), 100, "Java would limit these too");
    }
}

#[cfg(feature = "serde")]
mod java_json {
    use super::*;

    const JAVA_RULES: &str = r#"[
      {"resource":"httpbin_route","count":0,"paramItem":{"parseStrategy":3,"fieldName":"a","pattern":"rt","matchStrategy":2}},
      {"resource":"httpbin_route","count":10,"intervalSec":2,"burst":2,"paramItem":{"parseStrategy":0}},
      {"resource":"httpbin_route","count":2,"controlBehavior":2,"maxQueueingTimeoutMs":600,
       "paramItem":{"parseStrategy":2,"fieldName":"X-Sentinel-Flag"}},
      {"resource":"some_customized_api","resourceMode":1,"count":5,"paramItem":{"parseStrategy":1,"pattern":"pre","matchStrategy":1}},
      {"resource":"another_customized_api","resourceMode":1,"grade":0,"count":3,"intervalSec":60,
       "paramItem":{"parseStrategy":4,"fieldName":"session","pattern":"vip","matchStrategy":3}},
      {"resource":"aliyun_route","count":100}
    ]"#;

    /// What Java's `gateway/getRules` writes after loading (fastjson: every field, the assigned `index`).
    const JAVA_GET_RULES: &str = r#"[{"burst":0,"controlBehavior":0,"count":5.0,"grade":1,"intervalSec":1,
      "maxQueueingTimeoutMs":500,"paramItem":{"fieldName":"X-Tenant","index":0,"matchStrategy":0,"parseStrategy":2},
      "resource":"r","resourceMode":0}]"#;

    const JAVA_APIS: &str = r#"[
      {"apiName":"some_customized_api","predicateItems":[{"pattern":"/product/baz"},{"pattern":"/product/foo/**","matchStrategy":1}]},
      {"apiName":"another_customized_api","predicateItems":[{"pattern":"/ahas"},{"pattern":"/aliyun_product/.*","matchStrategy":2}]}
    ]"#;

    #[test]
    fn javas_rule_json_reads_with_javas_defaults_and_round_trips() {
        let rules = json::rules_from_json(JAVA_RULES).unwrap();
        assert_eq!(rules.len(), 6);
        let first = &rules[0];
        assert_eq!((first.resource_mode, first.grade, first.interval_sec), (ResourceMode::RouteId, FlowGrade::Qps, 1));
        assert_eq!(
            (first.control_behavior, first.burst, first.max_queueing_timeout_ms),
            (ControlBehavior::Reject, 0, 500)
        );
        assert_eq!(first.param_item, Some(GatewayParamItem::url_param("a").pattern("rt", ParamMatchStrategy::Regex)));
        assert_eq!(rules[4].param_item.as_ref().unwrap().match_strategy, ParamMatchStrategy::Contains);
        assert_eq!((rules[4].grade, rules[4].interval_sec), (FlowGrade::Thread, 60));
        assert_eq!(rules[5].param_item, None);
        let written = json::rules_to_json(&rules);
        assert_eq!(json::rules_from_json(&written).unwrap(), rules);
        GatewayRuleSet::new(rules).expect("Java's example rules are valid");
    }

    #[test]
    fn what_java_writes_for_get_rules_reads_back_and_is_written_the_same_way() {
        let rules = json::rules_from_json(JAVA_GET_RULES).unwrap();
        assert_eq!(rules, [GatewayFlowRule::new("r").count(5.0).param_item(GatewayParamItem::header("X-Tenant"))]);
        let ours: serde_json::Value = serde_json::from_str(&json::rules_to_json(&rules)).unwrap();
        let mut java: serde_json::Value = serde_json::from_str(JAVA_GET_RULES).unwrap();
        java[0]["paramItem"].as_object_mut().unwrap().remove("index"); // assigned when the set loads
        assert_eq!(ours, java);
    }

    #[test]
    fn javas_api_definition_json_reads_with_exact_as_the_default_and_round_trips() {
        let defs = json::api_definitions_from_json(JAVA_APIS).unwrap();
        assert_eq!(
            defs[0],
            ApiDefinition::new("some_customized_api")
                .item(ApiPredicateItem::exact("/product/baz"))
                .item(ApiPredicateItem::prefix("/product/foo/**"))
        );
        assert_eq!(json::api_definitions_from_json(&json::api_definitions_to_json(&defs)).unwrap(), defs);
        let apis = ApiMatcher::new(&defs).unwrap();
        assert_eq!(apis.matching("/product/foo/1").collect::<Vec<_>>(), ["some_customized_api"]);
        assert_eq!(apis.matching("/aliyun_product/x").collect::<Vec<_>>(), ["another_customized_api"]);
        assert_eq!(apis.matching("/product/bar").count(), 0);
    }

    #[test]
    fn the_dashboards_interval_and_unit_stand_for_interval_sec() {
        let r = json::rules_from_json(r#"[{"resource":"r","count":1,"interval":2,"intervalUnit":1}]"#).unwrap();
        assert_eq!(r[0].interval_sec, 120);
        let r = json::rules_from_json(r#"[{"resource":"r","interval":3}]"#).unwrap();
        assert_eq!(r[0].interval_sec, 3, "seconds by default");
        let r = json::rules_from_json(r#"[{"resource":"r","intervalSec":7,"interval":1,"intervalUnit":3}]"#).unwrap();
        assert_eq!(r[0].interval_sec, 7, "intervalSec wins");
        let export = r#"[{"id":3,"app":"gw","ip":"10.0.0.1","port":8719,"gmtCreate":1,"gmtModified":null,
          "resource":"r","count":1,"interval":1,"intervalUnit":2}]"#;
        assert_eq!(json::rules_from_json(export).unwrap()[0].interval_sec, 3600, "a dashboard export reads");
    }

    #[test]
    fn bad_json_is_refused_with_the_path_of_the_offending_value() {
        let cases = [
            (r#"[{"resource":"r","resourceMode":2}]"#, "[0].resourceMode"),
            (r#"[{"resource":"r"},{"resource":"r","paramItem":{"parseStrategy":5}}]"#, "[1].paramItem.parseStrategy"),
            (
                r#"[{"resource":"r","paramItem":{"parseStrategy":3,"fieldName":"p","pattern":"x","matchStrategy":-1}}]"#,
                "[0].paramItem.matchStrategy",
            ),
            (r#"[{"resource":"r","burst":-1}]"#, "[0].burst"),
            (r#"[{"resource":"r","cont":1}]"#, "[0].cont"),
            (r#"[{"resource":"r","interval":1,"intervalUnit":9}]"#, "[0].intervalUnit"),
            (r#"[{"resource":"r","interval":18446744073709551615,"intervalUnit":3}]"#, "[0]"),
        ];
        for (text, path) in cases {
            let err = json::rules_from_json(text).unwrap_err();
            assert_eq!(err.path, path, "{text}: {err}");
            assert!(err.to_string().contains("invalid gateway JSON"), "{err}");
        }
        let err = json::api_definitions_from_json(
            r#"[{"apiName":"a","predicateItems":[{"pattern":"/x","matchStrategy":3}]}]"#,
        )
        .unwrap_err();
        assert_eq!(err.path, "[0].predicateItems[0].matchStrategy", "{err}");
        assert!(json::rules_from_json("[] []").is_err(), "trailing data");
        assert_eq!(json::rules_from_json("null").unwrap(), []);
    }
}

#[test]
fn a_sets_regular_expressions_hold_16_mib_in_all_and_each_set_has_its_own_budget() {
    let heavy = |i: usize| format!("/{i}/.{{1000}}");
    let apis = |n: usize, item: &dyn Fn(usize) -> ApiPredicateItem| {
        vec![(0..n).fold(ApiDefinition::new("a"), |d, i| d.item(item(i)))]
    };
    assert!(ApiMatcher::new(&apis(10, &|i| ApiPredicateItem::regex(heavy(i)))).is_ok());
    let refused = |r: Result<_, GatewayRuleError>| r.map(|_| ()).expect_err("past the budget");
    let e = refused(ApiMatcher::new(&apis(30, &|i| ApiPredicateItem::regex(heavy(i)))));
    assert!(e.to_string().contains("16 MiB") && e.to_string().contains("in all"), "{e}");
    // An Ant pattern's `{name:regex}` segments count too.
    let ant = |i: usize| ApiPredicateItem::prefix(format!("/{i}/{{v:.{{1000}}}}/**"));
    assert!(ApiMatcher::new(&apis(10, &ant)).is_ok());
    let e = refused(ApiMatcher::new(&apis(30, &ant)));
    assert!(e.to_string().contains("in all"), "{e}");
    // So do gateway rules' parameter patterns; a set compiled after a refused one has its whole budget.
    let rule = |i: usize| {
        GatewayFlowRule::new(format!("r{i}"))
            .count(1.0)
            .param_item(GatewayParamItem::header("x").pattern(".{1000}", ParamMatchStrategy::Regex))
    };
    let e = GatewayRuleSet::new((0..30).map(rule).collect()).map(|_| ()).expect_err("past the budget");
    assert!(e.to_string().contains("in all"), "{e}");
    assert!(GatewayRuleSet::new((0..10).map(rule).collect()).is_ok());
}
