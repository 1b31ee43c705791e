//! The findings on hot-parameter rules.

use super::{names, RuleFinding};
use crate::{RuleKind, Sentinel};

/// The findings on the hot-parameter rules that apply to `resource` (name it, or their pattern matches).
pub(super) fn findings(engine: &Sentinel, resource: &str, ever_entered: bool) -> Vec<RuleFinding> {
    engine
        .param_flow_rules()
        .iter()
        .enumerate()
        .filter(|(_, r)| names(r.regex, &r.resource, resource, |p, n| engine.shared.param.pattern_matches(p, n)))
        .map(|(i, r)| RuleFinding {
            kind: RuleKind::ParamFlow,
            index: i,
            summary: format!(
                "{:?} limit {} per value of argument {} per {} s (burst {}, {} exception items)",
                r.grade,
                r.count,
                r.param_idx,
                r.duration_in_sec,
                r.burst_count,
                r.items.len()
            ),
            reads: format!("per-value counters of argument {}", r.param_idx),
            current: None,
            threshold: Some(r.count),
            applies: ever_entered,
            problems: vec!["note: the rule only sees arguments passed with the entry (`.args(...)`, or the annotated \
                 function's parameters); a call without that argument passes"
                .to_string()],
            pattern: r.regex.then(|| r.resource.clone()),
        })
        .collect()
}
