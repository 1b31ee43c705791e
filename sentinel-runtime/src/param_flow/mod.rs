//! Hot-parameter flow control: limits per distinct argument value.

mod rule;

pub use rule::{ParamFlowItem, ParamFlowRule, ParamItemValue};

use std::sync::Arc;

use crate::error::{BlockError, RuleError};
use crate::rules::{CheckCx, ExitCx, RuleMap};

/// One hot-parameter value, borrowed from an argument.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ParamValue<'a> {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(&'a str),
    /// A boolean.
    Bool(bool),
    /// A character.
    Char(char),
}

/// A value that can be a hot parameter. Implement it for your own types to limit by them.
pub trait HotParam {
    /// Calls `f` with each value this argument contributes: one for a scalar, each element for a collection,
    /// none for an absent value (which always passes).
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>));
}

/// The hot-parameter rules of one resource.
pub(crate) struct ResourceParamRules {
    pub(crate) rules: Vec<Arc<ParamFlowRule>>,
}

/// What an entry remembers for its hot-parameter rules (per-value thread counts to release).
#[derive(Debug, Default)]
pub(crate) struct EntryState {}

impl EntryState {
    /// Whether the entry holds something to release at exit.
    pub(crate) fn is_active(&self) -> bool {
        false
    }
}

/// Holds the hot-parameter rules.
#[derive(Default)]
pub(crate) struct ParamFlowManager {
    map: RuleMap<ResourceParamRules>,
    rules: arc_swap::ArcSwap<Vec<ParamFlowRule>>,
}

impl ParamFlowManager {
    /// Validates and replaces the rule set; `Ok(true)` when something changed.
    pub(crate) fn load(&self, rules: Vec<ParamFlowRule>) -> Result<bool, RuleError> {
        let _ = rules;
        Ok(false)
    }
    pub(crate) fn rules(&self) -> Vec<ParamFlowRule> {
        self.rules.load().as_ref().clone()
    }
    pub(crate) fn for_resource(&self, name: &str) -> Option<Arc<ResourceParamRules>> {
        self.map.get(name)
    }
}

/// Checks the call's hot-parameter values.
pub(crate) fn check(state: &ResourceParamRules, cx: &CheckCx<'_>, es: &mut EntryState) -> Result<(), BlockError> {
    let _ = (state, cx, es);
    Ok(())
}

/// A slot after this one blocked the call.
pub(crate) fn on_later_block(state: &ResourceParamRules, cx: &CheckCx<'_>, es: &mut EntryState) {
    let _ = (state, cx, es);
}

/// A call that passed completed.
pub(crate) fn on_exit(cx: &ExitCx<'_>, es: &mut EntryState) {
    let _ = (cx, es);
}
