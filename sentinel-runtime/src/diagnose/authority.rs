//! The findings on authority rules: which origins the list names, and the calls that come without one.

use super::{names, RuleFinding, Seen};
use crate::{RuleKind, Sentinel};

/// The findings on the authority rules of `resource`, given the callers `seen` in the last minute.
pub(super) fn findings(engine: &Sentinel, resource: &str, seen: &Seen<'_>) -> Vec<RuleFinding> {
    let (origins, calls_without_origin) = (seen.origins, seen.without_origin);
    engine
        .authority_rules()
        .iter()
        .enumerate()
        .filter(|(_, r)| names(r.regex, &r.resource, resource, |p, n| engine.shared.authority.pattern_matches(p, n)))
        .map(|(i, r)| {
            let list: Vec<&str> = r.limit_app.split(',').collect();
            let mut problems = Vec::new();
            for o in &list {
                if o.trim() != *o {
                    problems.push(format!("`{o}` has surrounding spaces: membership is exact, no trimming"));
                }
            }
            if calls_without_origin > 0 {
                problems.push(format!(
                    "{calls_without_origin} calls came without an origin: they always pass an authority rule"
                ));
            }
            let listed = origins.iter().filter(|(o, _)| list.contains(&o.as_str())).count();
            RuleFinding {
                kind: RuleKind::Authority,
                index: i,
                summary: format!("{:?} list `{}`", r.strategy, r.limit_app),
                reads: "the caller's origin".to_string(),
                current: None,
                threshold: None,
                applies: !origins.is_empty(),
                problems: {
                    problems.push(format!("{listed} of the {} origins seen are in the list", origins.len()));
                    problems
                },
                pattern: r.regex.then(|| r.resource.clone()),
            }
        })
        .collect()
}
