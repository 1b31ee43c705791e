//! Property-based fuzzing of every rule parser: no input panics.
//!
//! Run: `cargo test -p sentinel-runtime --features serde,logs --test fuzz_parsers`
//! Longer: `PROPTEST_CASES=200000 cargo test --release -p sentinel-runtime --features serde,logs --test fuzz_parsers`
#![cfg(feature = "serde")]

use proptest::prelude::*;
use sentinel_runtime::authority::AuthorityRule;
use sentinel_runtime::circuit_breaker::DegradeRule;
use sentinel_runtime::datasource::{parse_rules, rules_to_string, Format, RuleSet};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::Sentinel;
use serde_json::{json, Map, Value};

const FORMATS: [Format; 3] = [Format::Json, Format::Yaml, Format::Toml];

/// Parses `text` with every parser in `format`; whatever parses is written back and loaded into an engine.
fn exercise(text: &str, format: Format) {
    let engine = Sentinel::builder().build();
    if let Ok(r) = parse_rules::<FlowRule>(text, format) {
        let _ = rules_to_string(&r, format);
        let _ = engine.load_flow_rules(r);
    }
    if let Ok(r) = parse_rules::<DegradeRule>(text, format) {
        let _ = rules_to_string(&r, format);
        let _ = engine.load_degrade_rules(r);
    }
    if let Ok(r) = parse_rules::<SystemRule>(text, format) {
        let _ = rules_to_string(&r, format);
        let _ = engine.load_system_rules(r);
    }
    if let Ok(r) = parse_rules::<AuthorityRule>(text, format) {
        let _ = rules_to_string(&r, format);
        let _ = engine.load_authority_rules(r);
    }
    if let Ok(r) = parse_rules::<ParamFlowRule>(text, format) {
        let _ = rules_to_string(&r, format);
        let _ = engine.load_param_flow_rules(r);
    }
    if let Ok(set) = RuleSet::parse(text, format) {
        let _ = set.to_string(format);
        let _ = set.apply(&engine);
    }
}

const FIELDS: &[&str] = &[
    "id",
    "resource",
    "limitApp",
    "grade",
    "count",
    "strategy",
    "refResource",
    "controlBehavior",
    "warmUpPeriodSec",
    "maxQueueingTimeMs",
    "coldFactor",
    "clusterMode",
    "clusterConfig",
    "flowId",
    "thresholdType",
    "fallbackToLocalWhenFail",
    "sampleCount",
    "windowIntervalMs",
    "timeWindow",
    "minRequestAmount",
    "statIntervalMs",
    "slowRatioThreshold",
    "highestSystemLoad",
    "highestCpuUsage",
    "qps",
    "avgRt",
    "maxThread",
    "paramIdx",
    "burstCount",
    "durationInSec",
    "paramFlowItemList",
    "object",
    "classType",
    "regex",
    "app",
    "ip",
    "port",
    "gmtCreate",
    "hotItems",
    "flowRules",
    "degradeRules",
    "systemRules",
    "authorityRules",
    "paramFlowRules",
    "rules",
];

const CLASS_TYPES: &[&str] = &[
    "int",
    "java.lang.Integer",
    "long",
    "short",
    "byte",
    "double",
    "float",
    "boolean",
    "char",
    "String",
    "Integer",
    "",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..5).prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-zA-Z0-9_.,: -]{0,12}".prop_map(Value::from),
        prop::sample::select(CLASS_TYPES).prop_map(Value::from),
        prop::sample::select(FIELDS).prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Map<_, _>>())
            }),
        ]
    })
}

/// A valid-looking rule with some fields replaced, removed or added.
fn near_valid_rule() -> impl Strategy<Value = Value> {
    let base = json!({
        "resource": "api", "limitApp": "default", "grade": 1, "count": 10, "strategy": 0,
        "controlBehavior": 0, "paramIdx": 0, "timeWindow": 5, "qps": 100,
        "paramFlowItemList": [{"object": "7", "count": 1, "classType": "int"}],
        "clusterConfig": {"flowId": 1, "thresholdType": 0}
    });
    (prop::collection::vec((prop::sample::select(FIELDS), value(), any::<bool>()), 0..6)).prop_map(move |edits| {
        let mut v = base.clone();
        if let Value::Object(m) = &mut v {
            for (k, val, remove) in edits {
                if remove {
                    m.remove(k);
                } else {
                    m.insert(k.to_string(), val);
                }
            }
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        for f in FORMATS {
            exercise(&text, f);
        }
    }

    #[test]
    fn rule_like_text_never_panics(text in "[\\[\\]{}\":,0-9a-zA-Z\\-. \n=]{0,80}") {
        for f in FORMATS {
            exercise(&text, f);
        }
    }

    #[test]
    fn near_valid_json_yaml_toml_never_panics(rules in prop::collection::vec(near_valid_rule(), 0..4)) {
        let list = Value::Array(rules.clone());
        exercise(&list.to_string(), Format::Json);
        exercise(&json!({"flowRules": list.clone(), "paramFlowRules": list.clone()}).to_string(), Format::Json);
        if let Ok(yaml) = serde_yaml_ng::to_string(&list) {
            exercise(&yaml, Format::Yaml);
        }
        if let Ok(toml) = toml::to_string(&json!({"rules": list.clone()})) {
            exercise(&toml, Format::Toml);
        }
    }

    #[test]
    fn truncated_valid_documents_never_panic(cut in 0usize..400) {
        let doc = r#"{"flowRules": [{"resource": "api", "grade": 1, "count": 5, "clusterMode": true,
            "clusterConfig": {"flowId": 3, "thresholdType": 1}}], "paramFlowRules": [{"resource": "a",
            "paramIdx": -1, "paramFlowItemList": [{"object": "x", "count": 2, "classType": "char"}]}],
            "systemRules": [{"qps": -1, "maxThread": 10}]}"#;
        let cut = cut.min(doc.len());
        if doc.is_char_boundary(cut) {
            exercise(&doc[..cut], Format::Json);
        }
    }
}

#[cfg(feature = "logs")]
proptest! {
    #[test]
    fn metric_lines_never_panic(line in "[0-9|a-z: -]{0,60}") {
        let _ = line.parse::<sentinel_runtime::log::MetricLine>();
    }
}
