//! The RateLimit header fields a layer writes when asked ([`SentinelLayer::rate_limit_headers`]): each QPS
//! flow rule and each hot-parameter (gateway) token bucket the request went through becomes a policy, read
//! from the rule's window or bucket without taking from it.
//!
//! [`SentinelLayer::rate_limit_headers`]: super::SentinelLayer::rate_limit_headers

use std::time::Duration;

use http::HeaderMap;

use super::gateway::rate_limit_headers::{
    self as fields, RateLimitPolicy, RateLimitStatus, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::flow::FlowGrade;
use crate::param_flow::HotParam;
use crate::{BlockError, Resource};

/// Which RateLimit header fields a layer writes on the responses of limited resources
/// ([`SentinelLayer::rate_limit_headers`](super::SentinelLayer::rate_limit_headers)).
///
/// ```
/// use sentinel_runtime::web::RateLimitHeaders;
/// let headers = RateLimitHeaders::new().legacy(true).grpc(false);
/// # let _ = headers;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitHeaders {
    legacy: bool,
    grpc: bool,
}

impl Default for RateLimitHeaders {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimitHeaders {
    /// `RateLimit-Policy` and `RateLimit` (the IETF httpapi draft), on HTTP responses and gRPC calls.
    pub fn new() -> Self {
        RateLimitHeaders { legacy: false, grpc: true }
    }
    /// Also `x-ratelimit-limit`, `x-ratelimit-remaining` and `x-ratelimit-reset` (seconds), for the policy
    /// closest to running out, for clients that know only those.
    pub fn legacy(mut self, on: bool) -> Self {
        self.legacy = on;
        self
    }
    /// Whether gRPC calls get them too, as response metadata (default true).
    pub fn grpc(mut self, on: bool) -> Self {
        self.grpc = on;
        self
    }
    /// Whether a request of this kind gets them.
    pub(crate) fn applies(&self, grpc: bool) -> bool {
        !grpc || self.grpc
    }
}

/// A structured-field String holds printable ASCII only: other characters of a resource name become `_`.
fn policy_name(resource: &str, param_idx: Option<i32>) -> String {
    let clean: String = resource.chars().map(|c| if (' '..='~').contains(&c) { c } else { '_' }).collect();
    match param_idx {
        None => clean,
        Some(i) => format!("{clean}#{i}"),
    }
}

fn policy(name: String, quota: u64, window_secs: u64) -> Option<RateLimitPolicy> {
    RateLimitPolicy::new(name, quota).ok()?.window_secs(window_secs.max(1)).ok()
}

/// The policies of `resource` for a call that passed with `args`: its QPS flow rules (named after the
/// resource) and its hot-parameter token buckets (named `resource#param_idx`), read at `now_ms`.
pub(crate) fn passed(
    resource: &Resource,
    args: &[&dyn HotParam],
    now_ms: u64,
    out: &mut Vec<(RateLimitPolicy, RateLimitStatus)>,
) {
    let inner = &*resource.inner;
    let (flow, param) = inner.with_rules(|r| (r.flow.clone(), r.param.clone()));
    if let Some(flow) = flow {
        let mut peeks = Vec::new();
        flow.peek(&inner.cluster.stat, now_ms, &mut peeks);
        for p in peeks {
            if let Some(pol) = policy(policy_name(resource.name(), None), p.quota, 1) {
                let status =
                    RateLimitStatus { remaining: p.remaining, reset: Some(Duration::from_millis(p.refill_in_ms)) };
                out.push((pol, status));
            }
        }
    }
    if let Some(param) = param {
        let mut peeks = Vec::new();
        param.peek(args, now_ms, &mut peeks);
        for p in peeks {
            let name = policy_name(resource.name(), Some(p.rule.param_idx));
            if let Some(pol) = policy(name, p.bucket.quota, p.window_secs) {
                let reset = Some(Duration::from_millis(p.bucket.refill_in_ms));
                out.push((pol, RateLimitStatus { remaining: p.bucket.remaining, reset }));
            }
        }
    }
}

/// The policy a blocked call ran out of (a QPS flow rule or a hot-parameter token bucket), with nothing
/// remaining and the block's retry time as the reset.
pub(crate) fn blocked(err: &BlockError) -> Option<(RateLimitPolicy, RateLimitStatus)> {
    let status = RateLimitStatus { remaining: 0, reset: err.retry_after() };
    match err {
        BlockError::Flow { resource, rule, .. } if rule.grade == FlowGrade::Qps => {
            Some((policy(policy_name(resource, None), rule.count.max(0.0).floor() as u64, 1)?, status))
        }
        BlockError::ParamFlow { resource, rule, .. } if rule.grade == FlowGrade::Qps => {
            let quota = (rule.count.max(0.0).floor() as u64).saturating_add(rule.burst_count);
            Some((policy(policy_name(resource, Some(rule.param_idx)), quota, rule.duration_in_sec)?, status))
        }
        _ => None,
    }
}

/// Writes the fields for `policies` into `headers` (nothing when there is none).
pub(crate) fn write(headers: &mut HeaderMap, policies: &[(RateLimitPolicy, RateLimitStatus)], legacy: bool) {
    let refs: Vec<(&RateLimitPolicy, RateLimitStatus)> = policies.iter().map(|(p, s)| (p, *s)).collect();
    if let Some(f) = fields::format(&refs) {
        headers.insert(RATELIMIT_POLICY, f.policy);
        headers.insert(RATELIMIT, f.rate_limit);
    }
    if legacy {
        if let Some(l) = fields::legacy(&refs) {
            headers.insert(X_RATELIMIT_LIMIT, l.limit);
            headers.insert(X_RATELIMIT_REMAINING, l.remaining);
            if let Some(reset) = l.reset {
                headers.insert(X_RATELIMIT_RESET, reset);
            }
        }
    }
}

impl RateLimitHeaders {
    /// Writes the policy a blocked call ran out of into its response's `headers`.
    pub(crate) fn write_blocked(&self, headers: &mut HeaderMap, err: &BlockError) {
        if let Some(p) = blocked(err) {
            write(headers, std::slice::from_ref(&p), self.legacy);
        }
    }

    /// The header map for the policies of a call that passed; `None` when no rule gave one.
    pub(crate) fn map(&self, policies: &[(RateLimitPolicy, RateLimitStatus)]) -> Option<HeaderMap> {
        if policies.is_empty() {
            return None;
        }
        let mut map = HeaderMap::new();
        write(&mut map, policies, self.legacy);
        Some(map)
    }
}
