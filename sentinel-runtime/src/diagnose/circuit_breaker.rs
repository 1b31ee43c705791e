//! The findings on degrade rules and their circuit breakers: the breaker's state and numbers, and whether the
//! rule can trip at the recent rate.

use super::{names, RuleFinding};
use crate::circuit_breaker::{BreakerSnapshot, BreakerState, DegradeGrade, DegradeRule};
use crate::{NodeStats, RuleKind, Sentinel};

/// The findings on the degrade rules of `resource` (its own, or else the default `*` rules, which `notes` then
/// says) and the breakers that apply to it.
pub(super) fn findings(
    engine: &Sentinel,
    resource: &str,
    stats: Option<&NodeStats>,
    notes: &mut Vec<String>,
) -> (Vec<RuleFinding>, Vec<BreakerSnapshot>) {
    let degrade_rules = engine.degrade_rules();
    let own: Vec<(usize, &DegradeRule)> =
        degrade_rules.iter().enumerate().filter(|(_, r)| applies(engine, r, resource)).collect();
    let degrade_of: Vec<(usize, &DegradeRule)> = if own.is_empty() {
        let defaults: Vec<(usize, &DegradeRule)> =
            degrade_rules.iter().enumerate().filter(|(_, r)| r.resource == "*").collect();
        if !defaults.is_empty() {
            notes.push(format!("`{resource}` has no degrade rule of its own: the default (`*`) rules apply"));
        }
        defaults
    } else {
        own
    };
    let breakers = engine.circuit_breakers(resource);
    let now_ms = engine.now_millis();
    let degrade = degrade_of
        .iter()
        .map(|(i, r)| {
            let breaker = breakers.iter().find(|b| *b.rule == **r);
            degrade_finding(*i, r, stats, breaker, now_ms)
        })
        .collect();
    (degrade, breakers)
}

/// Whether the degrade rule is one of `resource`'s own (named or matched).
fn applies(engine: &Sentinel, rule: &DegradeRule, resource: &str) -> bool {
    names(rule.regex, &rule.resource, resource, |p, n| engine.shared.degrade.pattern_matches(p, n))
}

pub(super) fn degrade_finding(
    index: usize,
    rule: &DegradeRule,
    stats: Option<&NodeStats>,
    breaker: Option<&BreakerSnapshot>,
    now_ms: u64,
) -> RuleFinding {
    let interval_s = f64::from(rule.stat_interval_ms.max(1)) / 1000.0;
    let (summary, current) = match rule.grade {
        DegradeGrade::SlowRequestRatio => (
            format!(
                "slow-call ratio: open for {} s when more than {} of calls in {} ms take over {} ms",
                rule.time_window_sec, rule.slow_ratio_threshold, rule.stat_interval_ms, rule.count
            ),
            stats.map(|s| s.avg_rt_ms),
        ),
        DegradeGrade::ErrorRatio => (
            format!(
                "error ratio: open for {} s when more than {} of calls in {} ms fail",
                rule.time_window_sec, rule.count, rule.stat_interval_ms
            ),
            stats.map(|s| if s.success_qps > 0.0 { s.exception_qps / s.success_qps } else { 0.0 }),
        ),
        DegradeGrade::ErrorCount => (
            format!(
                "error count: open for {} s when more than {} calls fail in {} ms",
                rule.time_window_sec, rule.count, rule.stat_interval_ms
            ),
            stats.map(|s| s.exception_qps * interval_s),
        ),
    };
    let mut f = RuleFinding {
        kind: RuleKind::Degrade,
        index,
        summary,
        reads: format!("the cluster node's completed calls, in buckets of {} ms", rule.stat_interval_ms),
        current,
        threshold: Some(rule.count),
        applies: true,
        problems: Vec::new(),
        pattern: rule.regex.then(|| rule.resource.clone()),
    };
    // The breaker's own bucket, when it has one, is what the rule compares.
    let mut from_breaker = false;
    if let Some(b) = breaker {
        let ratio = if b.interval_total == 0 { 0.0 } else { b.interval_bad as f64 / b.interval_total as f64 };
        match rule.grade {
            DegradeGrade::SlowRequestRatio => {
                f.current = Some(ratio);
                f.threshold = Some(rule.slow_ratio_threshold);
            }
            DegradeGrade::ErrorRatio => f.current = Some(ratio),
            DegradeGrade::ErrorCount => f.current = Some(b.interval_bad as f64),
        }
        from_breaker = true;
        match b.state {
            BreakerState::Open => f.problems.push(format!(
                "the breaker is OPEN: calls are blocked for another {} ms, then one probe is let through",
                b.retry_at_ms.map_or(0, |r| r.saturating_sub(now_ms))
            )),
            BreakerState::HalfOpen => f.problems.push(
                "the breaker is HALF_OPEN: one probe call is out; its outcome closes or reopens the breaker".into(),
            ),
            BreakerState::Closed => {}
        }
    }
    if let Some(s) = stats {
        let recent_qps = s.pass_qps.max(s.previous_pass_qps);
        let per_interval = recent_qps * interval_s;
        if per_interval < f64::from(rule.min_request_amount) {
            f.applies = false;
            f.problems.push(format!(
                "min_request_amount {} is not reachable: at the recent {recent_qps:.1} calls/s about {per_interval:.1} \
                 calls complete per {} ms interval, so the breaker cannot trip; lower min_request_amount or \
                 lengthen stat_interval_ms",
                rule.min_request_amount, rule.stat_interval_ms
            ));
        }
        if matches!(rule.grade, DegradeGrade::ErrorRatio | DegradeGrade::ErrorCount)
            && s.minute_exception == 0
            && s.minute_success > 0
        {
            f.problems.push(
                "no error was traced in the last minute: an error-based breaker only sees errors traced on the \
                 entry (an annotated function returning Err, or `entry.trace(&err)` / `set_error()`)"
                    .to_string(),
            );
        }
    } else {
        f.applies = false;
        f.problems.push("the resource was never entered: there is nothing to measure".to_string());
    }
    if rule.grade == DegradeGrade::SlowRequestRatio && !from_breaker {
        f.problems.push(format!(
            "note: the current number is the average rt (ms); the breaker counts calls slower than {} ms",
            rule.count
        ));
    }
    f
}
