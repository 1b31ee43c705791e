//! Gateway flow rules and API definitions in the data sources (features `serde` and `tower`): Java's files
//! `gw-flow-rules.json` and `gw-api-definitions.json` (in a rules directory, next to the other kinds'
//! files), read and written in Java's JSON ([`web::gateway::json`](crate::web::gateway::json)).

use std::path::Path;

use crate::web::gateway::json::{self, GatewayJsonError};
use crate::web::gateway::{ApiDefinition, GatewayFlowRule, GatewayRuleError};
use crate::Sentinel;

/// The stem of the gateway flow rules' file in a rules directory (Java's name).
pub const GATEWAY_RULES_FILE_STEM: &str = "gw-flow-rules";

/// The stem of the API definitions' file in a rules directory (Java's name).
pub const API_DEFINITIONS_FILE_STEM: &str = "gw-api-definitions";

/// Gateway flow rules and API definitions as a store holds them. `None`: the store does not manage that
/// list (what is in force stays); an empty list clears it.
///
/// ```
/// use sentinel_runtime::Sentinel;
/// use sentinel_runtime::datasource::GatewayDocuments;
/// use sentinel_runtime::web::gateway::{ApiDefinition, ApiPredicateItem, GatewayFlowRule};
/// let engine = Sentinel::builder().build();
/// let docs = GatewayDocuments {
///     rules: Some(vec![GatewayFlowRule::new("orders").count(5.0)]),
///     api_definitions: Some(vec![ApiDefinition::new("orders").item(ApiPredicateItem::prefix("/orders/**"))]),
/// };
/// docs.apply(&engine).unwrap();
/// assert_eq!(GatewayDocuments::snapshot(&engine), docs);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GatewayDocuments {
    /// Gateway flow rules.
    pub rules: Option<Vec<GatewayFlowRule>>,
    /// API definitions.
    pub api_definitions: Option<Vec<ApiDefinition>>,
}

/// Why a gateway document could not be used; the rules in force stay.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayDocumentError {
    /// Not Java's JSON for that list.
    #[error(transparent)]
    Parse(#[from] GatewayJsonError),
    /// A rule or definition is invalid.
    #[error(transparent)]
    Invalid(#[from] GatewayRuleError),
}

impl GatewayDocuments {
    /// What the engine has in force (both lists).
    pub fn snapshot(engine: &Sentinel) -> Self {
        GatewayDocuments { rules: Some(engine.gateway_rules()), api_definitions: Some(engine.api_definitions()) }
    }

    /// Whether the documents manage neither list.
    pub fn is_empty(&self) -> bool {
        self.rules.is_none() && self.api_definitions.is_none()
    }

    /// The number of rules and definitions.
    pub fn len(&self) -> usize {
        self.rules.as_ref().map_or(0, Vec::len) + self.api_definitions.as_ref().map_or(0, Vec::len)
    }

    /// Adds the lists `other` manages (replacing this one's).
    pub fn merge(&mut self, other: GatewayDocuments) {
        if other.rules.is_some() {
            self.rules = other.rules;
        }
        if other.api_definitions.is_some() {
            self.api_definitions = other.api_definitions;
        }
    }

    /// Loads the lists the documents manage, as one change: when the rules are refused, the definitions
    /// loaded before them are put back.
    pub fn apply(&self, engine: &Sentinel) -> Result<(), GatewayRuleError> {
        let before = engine.api_definitions();
        if let Some(defs) = &self.api_definitions {
            engine.load_api_definitions(defs.clone())?;
        }
        if let Some(rules) = &self.rules
            && let Err(e) = engine.load_gateway_rules(rules.clone())
        {
            if self.api_definitions.is_some() {
                // The previous set was in force: it loads again.
                if let Err(rollback) = engine.load_api_definitions(before) {
                    tracing::error!(error = %rollback, "could not restore the previous API definitions");
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Parses the file named by `stem` ([`GATEWAY_RULES_FILE_STEM`] or [`API_DEFINITIONS_FILE_STEM`]).
    pub(crate) fn parse_file(stem: &str, text: &str) -> Result<Self, GatewayJsonError> {
        Ok(if stem == GATEWAY_RULES_FILE_STEM {
            GatewayDocuments { rules: Some(json::rules_from_json(text)?), api_definitions: None }
        } else {
            GatewayDocuments { rules: None, api_definitions: Some(json::api_definitions_from_json(text)?) }
        })
    }

    /// The text of the file named by `stem`; `None` when the documents do not manage that list.
    pub(crate) fn file_text(&self, stem: &str) -> Option<String> {
        if stem == GATEWAY_RULES_FILE_STEM {
            self.rules.as_deref().map(json::rules_to_json)
        } else {
            self.api_definitions.as_deref().map(json::api_definitions_to_json)
        }
    }
}

/// What the gateway file named by `stem` holds, in words.
pub(crate) fn list_name(stem: &str) -> &'static str {
    if stem == GATEWAY_RULES_FILE_STEM {
        "gateway flow rules"
    } else {
        "API definitions"
    }
}

/// A gateway list that is not Java's gateway JSON, as a JSON [`ParseError`](super::ParseError) naming the
/// field.
pub(crate) fn parse_error(e: GatewayJsonError) -> super::ParseError {
    let field = (e.path != ".").then_some(e.path);
    super::ParseError::new(super::Format::Json, Some(e.line), Some(e.column), field, e.message)
}

/// The gateway file stems, in the order they are applied (definitions first: the rules name them).
pub(crate) const GATEWAY_FILE_STEMS: [&str; 2] = [API_DEFINITIONS_FILE_STEM, GATEWAY_RULES_FILE_STEM];

/// The gateway file stem `path` names (`gw-flow-rules.json`, `gw-api-definitions.json`), if it names one.
pub(crate) fn gateway_stem(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    GATEWAY_FILE_STEMS.into_iter().find(|stem| name.strip_prefix(stem) == Some(".json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasource::{ApplyError, Format, RuleSet};
    use crate::flow::FlowRule;
    use crate::web::gateway::{ApiPredicateItem, GatewayParamItem};

    fn gateway() -> GatewayDocuments {
        GatewayDocuments {
            rules: Some(vec![
                GatewayFlowRule::new("orders").count(5.0),
                GatewayFlowRule::new("search").count(2.0).burst(1).param_item(GatewayParamItem::header("X-Tenant")),
            ]),
            api_definitions: Some(vec![ApiDefinition::new("orders").item(ApiPredicateItem::prefix("/orders/**"))]),
        }
    }

    #[test]
    fn a_combined_document_carries_the_gateway_lists_in_every_format() {
        let set =
            RuleSet { flow: Some(vec![FlowRule::new("api").count(3.0)]), gateway: gateway(), ..RuleSet::default() };
        for format in [Format::Json, Format::Yaml, Format::Toml] {
            let text = set.to_string(format).unwrap();
            assert!(text.contains("gwFlowRules") && text.contains("gwApiDefinitions"), "{format}: {text}");
            assert_eq!(RuleSet::parse(&text, format).unwrap(), set, "{format}: {text}");
        }
        let json = r#"{"gwFlowRules": [{"resource": "orders", "count": 5}], "flowRules": []}"#;
        let parsed = RuleSet::parse(json, Format::Json).unwrap();
        assert_eq!(parsed.gateway.rules.as_ref().map(Vec::len), Some(1));
        assert_eq!(parsed.gateway.api_definitions, None, "a list left out is not managed");
        assert_eq!(parsed.len(), 1);
    }

    #[test]
    fn a_malformed_gateway_list_in_a_combined_document_names_its_field() {
        let text = r#"{"flowRules": [], "gwFlowRules": [{"resource": "orders", "paramItem": {"parseStrategy": 7}}]}"#;
        let e = RuleSet::parse(text, Format::Json).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("gwFlowRules[0].paramItem.parseStrategy"), "{e}");
        let e =
            RuleSet::parse(r#"{"gwApiDefinitions": [{"apiName": "a", "predicates": []}]}"#, Format::Json).unwrap_err();
        assert!(e.to_string().contains("predicates"), "{e}");
    }

    #[test]
    fn a_gateway_rule_cut_short_in_yaml_or_toml_is_refused_as_the_other_kinds_are() {
        let yaml = "gwFlowRules:\n- resource: orders\n  intervalSec: 1\n";
        let e = RuleSet::parse(yaml, Format::Yaml).unwrap_err();
        assert!(e.message.contains("missing field `count`"), "{e}");
        assert_eq!(e.field.as_deref(), Some("gwFlowRules[0]"), "{e}");
        let toml = "[[gwFlowRules]]\nresource = \"orders\"\n";
        assert!(RuleSet::parse(toml, Format::Toml).unwrap_err().message.contains("missing field `count`"));
        // JSON keeps Java's defaults (a dashboard export omits nothing; `count` defaults to 0 as in Java).
        let json = r#"{"gwFlowRules": [{"resource": "orders"}]}"#;
        assert_eq!(RuleSet::parse(json, Format::Json).unwrap().gateway.rules.unwrap()[0].count, 0.0);
        let complete = "gwFlowRules:\n- resource: orders\n  count: 4\n  paramItem:\n    parseStrategy: 0\n";
        let rules = RuleSet::parse(complete, Format::Yaml).unwrap().gateway.rules.unwrap();
        assert_eq!((rules[0].count, rules[0].param_item.is_some()), (4.0, true));
    }

    #[test]
    fn apply_all_loads_the_gateway_lists_and_puts_them_back_when_a_kind_is_refused() {
        let engine = Sentinel::builder().build();
        let first =
            RuleSet { flow: Some(vec![FlowRule::new("api").count(3.0)]), gateway: gateway(), ..RuleSet::default() };
        assert!(first.apply_all(&engine).is_ok());
        assert_eq!(GatewayDocuments::snapshot(&engine), gateway());

        let refused = RuleSet {
            flow: Some(vec![FlowRule::new("api").count(-1.0)]),
            gateway: GatewayDocuments {
                rules: Some(vec![GatewayFlowRule::new("other").count(1.0)]),
                api_definitions: Some(vec![]),
            },
            ..RuleSet::default()
        };
        assert!(matches!(refused.apply_all(&engine), Err(ApplyError::Rules(_))));
        assert_eq!(GatewayDocuments::snapshot(&engine), gateway(), "the gateway's lists are put back");
        assert_eq!(engine.flow_rules(), vec![FlowRule::new("api").count(3.0)]);

        let bad_gateway = RuleSet {
            flow: Some(vec![FlowRule::new("api").count(9.0)]),
            gateway: GatewayDocuments {
                rules: Some(vec![GatewayFlowRule::new("orders").count(-1.0)]),
                api_definitions: None,
            },
            ..RuleSet::default()
        };
        match bad_gateway.apply_all(&engine) {
            Err(ApplyError::Gateway(e)) => assert_eq!(e.field(), "count"),
            other => panic!("expected a refused gateway rule, got {other:?}"),
        }
        assert_eq!(engine.flow_rules(), vec![FlowRule::new("api").count(3.0)], "the kinds are untouched");
        assert_eq!(GatewayDocuments::snapshot(&engine), gateway());
    }

    #[cfg(feature = "file-watch")]
    #[test]
    fn the_watcher_of_a_rules_directory_reloads_a_changed_gateway_file() {
        use crate::datasource::{FileDataSource, Reloaded};
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gw-flow-rules.json");
        std::fs::write(&file, r#"[{"resource": "orders", "count": 2}]"#).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, dir.path());
        source.reload_now().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        source.on_reload(move |r| {
            let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(r.clone().map_err(|e| e.to_string()));
        });
        let _watcher = source.watch(Duration::from_millis(50)).unwrap();
        std::fs::write(&file, r#"[{"resource": "orders", "count": 7}]"#).unwrap();
        // Wait (generously) for the reload the write causes; no timing is asserted.
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(Ok(Reloaded::Applied { .. })) => break,
                Ok(_) => continue,
                Err(e) => panic!("no reload within 30 s: {e}"),
            }
        }
        assert_eq!(engine.gateway_rules()[0].count, 7.0);
    }
}
