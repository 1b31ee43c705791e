//! The typed errors of gateway rules and API definitions.

/// A set of gateway flow rules or API definitions was rejected; the set in force stays.
///
/// Each variant names the entry (its position in the set and its name) and the field that is wrong, with
/// the reason and what a valid value looks like.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayRuleError {
    /// A field of one gateway flow rule is invalid.
    #[error(
        "invalid gateway flow rule #{index} (resource `{resource}`): `{field}` {reason}; no rule of the set was loaded"
    )]
    InvalidRule {
        /// The rule's position in the set (0-based).
        index: usize,
        /// The rule's resource (a route id or an API name).
        resource: String,
        /// The field, as the rule type names it (`param_item.field_name`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A field of one API definition is invalid.
    #[error(
        "invalid API definition #{index} (`{api_name}`): `{field}` {reason}; no API definition of the set was loaded"
    )]
    InvalidApi {
        /// The definition's position in the set (0-based).
        index: usize,
        /// The definition's name.
        api_name: String,
        /// The field, as the definition type names it (`predicate_items.pattern`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl GatewayRuleError {
    pub(crate) fn rule(index: usize, resource: &str, field: &'static str, reason: impl Into<String>) -> Self {
        GatewayRuleError::InvalidRule { index, resource: resource.to_string(), field, reason: reason.into() }
    }

    pub(crate) fn api(index: usize, api_name: &str, field: &'static str, reason: impl Into<String>) -> Self {
        GatewayRuleError::InvalidApi { index, api_name: api_name.to_string(), field, reason: reason.into() }
    }

    /// The field that is wrong.
    pub fn field(&self) -> &'static str {
        match self {
            GatewayRuleError::InvalidRule { field, .. } | GatewayRuleError::InvalidApi { field, .. } => field,
        }
    }

    /// The position of the wrong entry in its set.
    pub fn index(&self) -> usize {
        match self {
            GatewayRuleError::InvalidRule { index, .. } | GatewayRuleError::InvalidApi { index, .. } => *index,
        }
    }
}
