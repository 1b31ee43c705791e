//! System adaptive protection: limits on the whole process's inbound traffic.

mod rule;

pub use rule::SystemRule;

use crate::error::{BlockError, RuleError};
use crate::rules::CheckCx;

/// Holds the system rules and the load/cpu readings.
#[derive(Default)]
pub(crate) struct SystemManager {
    rules: arc_swap::ArcSwap<Vec<SystemRule>>,
}

impl SystemManager {
    /// Validates and replaces the rule set; `Ok(true)` when something changed.
    pub(crate) fn load(&self, rules: Vec<SystemRule>) -> Result<bool, RuleError> {
        let _ = rules;
        Ok(false)
    }
    pub(crate) fn rules(&self) -> Vec<SystemRule> {
        self.rules.load().as_ref().clone()
    }
    /// Whether any system limit is on (the check is skipped otherwise).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        false
    }
    /// Checks an inbound call against the system limits.
    pub(crate) fn check(&self, cx: &CheckCx<'_>) -> Result<(), BlockError> {
        let _ = cx;
        Ok(())
    }
}
