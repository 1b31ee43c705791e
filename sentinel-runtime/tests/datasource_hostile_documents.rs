//! Rule documents with hostile contents (review): values YAML and TOML can write but JSON cannot.
#![cfg(all(feature = "serde", feature = "tower"))]

use sentinel_runtime::datasource::{Format, RuleSet};
use sentinel_runtime::web::gateway::GatewayFlowRule;
use sentinel_runtime::Sentinel;

/// A gateway rule's `count` (or another number) that is not finite, or that a file cut after `count:` left
/// empty (null), is a parse error naming the field, as for every other kind: it loaded as a limit of 0
/// (every request of the route blocked), or as the field's default.
#[test]
fn a_gateway_rule_with_a_non_finite_or_empty_number_in_yaml_or_toml_is_refused_naming_the_field() {
    let cases = [
        ("gwFlowRules:\n- resource: a\n  count: .nan\n", Format::Yaml, "count"),
        ("gwFlowRules:\n- resource: a\n  count: .inf\n", Format::Yaml, "count"),
        ("gwFlowRules:\n- resource: a\n  count: -.inf\n", Format::Yaml, "count"),
        ("gwFlowRules:\n- resource: a\n  count:\n", Format::Yaml, "count"),
        ("gwFlowRules:\n- resource: a\n  count: 5\n  intervalSec: .inf\n", Format::Yaml, "intervalSec"),
        ("gwFlowRules:\n- resource: a\n  count: 5\n  burst: .nan\n", Format::Yaml, "burst"),
        ("[[gwFlowRules]]\nresource = \"a\"\ncount = nan\n", Format::Toml, "count"),
        ("[[gwFlowRules]]\nresource = \"a\"\ncount = inf\n", Format::Toml, "count"),
    ];
    for (text, format, field) in cases {
        let engine = Sentinel::builder().build();
        engine.load_gateway_rules([GatewayFlowRule::new("a").count(7.0)]).unwrap();
        let parsed = RuleSet::parse(text, format);
        let Err(e) = parsed else {
            let set = parsed.unwrap();
            let _ = set.apply_all(&engine);
            panic!("{text:?} parsed as {:?}; in force: {:?}", set.gateway.rules, engine.gateway_rules());
        };
        assert!(e.to_string().contains(field), "{text:?}: the error names `{field}`: {e}");
        assert!(e.field.as_deref().is_some_and(|f| f.starts_with("gwFlowRules[0]")), "{e:?}");
        assert_eq!(engine.gateway_rules()[0].count, 7.0, "the rules in force stay");
    }
}
