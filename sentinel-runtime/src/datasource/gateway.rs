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
        if let Some(rules) = &self.rules {
            if let Err(e) = engine.load_gateway_rules(rules.clone()) {
                if self.api_definitions.is_some() {
                    // The previous set was in force: it loads again.
                    if let Err(rollback) = engine.load_api_definitions(before) {
                        tracing::error!(error = %rollback, "could not restore the previous API definitions");
                    }
                }
                return Err(e);
            }
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

/// The gateway file stems, in the order they are applied (definitions first: the rules name them).
pub(crate) const GATEWAY_FILE_STEMS: [&str; 2] = [API_DEFINITIONS_FILE_STEM, GATEWAY_RULES_FILE_STEM];

/// The gateway file stem `path` names (`gw-flow-rules.json`, `gw-api-definitions.json`), if it names one.
pub(crate) fn gateway_stem(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    GATEWAY_FILE_STEMS.into_iter().find(|stem| name.strip_prefix(stem) == Some(".json"))
}
