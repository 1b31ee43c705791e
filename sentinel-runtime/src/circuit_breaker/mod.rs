//! Circuit breaking (degrade rules).

mod rule;

pub use rule::{DegradeGrade, DegradeRule};

use std::sync::Arc;

use crate::error::{BlockError, RuleError};
use crate::rules::{CheckCx, ExitCx, RuleMap};

/// The breakers of one resource.
pub(crate) struct ResourceBreakers {
    pub(crate) rules: Vec<Arc<DegradeRule>>,
}

/// What an entry remembers for its breakers.
#[derive(Debug, Default)]
pub(crate) struct EntryState {}

/// Holds the degrade rules and their breakers.
#[derive(Default)]
pub(crate) struct DegradeManager {
    map: RuleMap<ResourceBreakers>,
    rules: arc_swap::ArcSwap<Vec<DegradeRule>>,
}

impl DegradeManager {
    /// Validates and replaces the rule set; `Ok(true)` when something changed.
    pub(crate) fn load(&self, rules: Vec<DegradeRule>) -> Result<bool, RuleError> {
        let _ = rules;
        Ok(false)
    }
    pub(crate) fn rules(&self) -> Vec<DegradeRule> {
        self.rules.load().as_ref().clone()
    }
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceBreakers>> {
        self.map.get(name)
    }
    /// The breakers of the default rule (`"*"`).
    pub(crate) fn default_breakers(&self) -> Option<Arc<ResourceBreakers>> {
        None
    }
}

/// Lets the call through unless a breaker is open (or half-open with its probe out).
pub(crate) fn check(state: &ResourceBreakers, cx: &CheckCx<'_>, es: &mut EntryState) -> Result<(), BlockError> {
    let _ = (state, cx, es);
    Ok(())
}

/// A slot after the breakers blocked the call that passed them.
pub(crate) fn on_later_block(state: &ResourceBreakers, cx: &CheckCx<'_>, es: &mut EntryState) {
    let _ = (state, cx, es);
}

/// A call that passed completed.
pub(crate) fn on_exit(state: &ResourceBreakers, cx: &ExitCx<'_>, es: &mut EntryState) {
    let _ = (state, cx, es);
}
