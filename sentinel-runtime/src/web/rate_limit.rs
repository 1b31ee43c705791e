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
    let mut name = String::new();
    write_policy_name(&mut name, resource, param_idx);
    name
}

/// Writes [`policy_name`] into `out`.
fn write_policy_name(out: &mut String, resource: &str, param_idx: Option<i32>) {
    if printable(resource) {
        out.push_str(resource);
    } else {
        out.extend(resource.chars().map(|c| if (' '..='~').contains(&c) { c } else { '_' }));
    }
    if let Some(i) = param_idx {
        out.push('#');
        out.push_str(itoa::Buffer::new().format(i));
    }
}

/// Whether a structured-field String can hold `s` as it is.
fn printable(s: &str) -> bool {
    s.bytes().all(|b| (b' '..=b'~').contains(&b))
}

fn policy(name: String, quota: u64, window_secs: u64) -> Option<RateLimitPolicy> {
    RateLimitPolicy::new(name, quota).ok()?.window_secs(window_secs.max(1)).ok()
}

/// The RateLimit header fields of a request that passed, serialized as its resources' checks pass: the two
/// lists grow in place (no policy value, no header map per request) and go into the response's headers
/// once ([`write_into`](Self::write_into)).
#[derive(Debug, Default)]
pub(crate) struct PassedFields {
    lists: fields::Lists,
    /// The policy with the least remaining, the first such (the legacy fields): its quota and status.
    least: Option<(u64, RateLimitStatus)>,
    legacy: bool,
}

impl PassedFields {
    /// Appends a policy of `resource` (of its hot parameter `param_idx`, if any).
    fn push(&mut self, resource: &str, param_idx: Option<i32>, quota: u64, window_secs: u64, status: RateLimitStatus) {
        let shape = fields::Shape { quota, unit: fields::QuotaUnit::Requests, window_secs: Some(window_secs.max(1)) };
        if param_idx.is_none() && printable(resource) {
            // Printable ASCII, checked.
            let Ok(name) = sfv::StringRef::from_str(resource) else { return };
            self.lists.push(name, shape, status, None);
        } else {
            // A hot parameter's name, or a resource name with characters a field cannot hold: written into
            // the lists' name buffer (the name, `#` and an index at once, rather than growing as written).
            let write = |buf: &mut String| {
                buf.reserve(resource.len() + 12);
                write_policy_name(buf, resource, param_idx);
            };
            self.lists.push_named(write, shape, status);
        }
        if self.least.is_none_or(|(_, least)| status.remaining < least.remaining) {
            self.least = Some((quota, status));
        }
    }

    /// The fields, or `None` when no rule gave a policy.
    pub(crate) fn finish(self) -> Option<PassedFields> {
        (!self.lists.is_empty()).then_some(self)
    }

    /// Inserts the fields into a response's `headers` (replacing fields of the same names).
    pub(crate) fn write_into(self, headers: &mut HeaderMap) {
        let least = self.least.filter(|_| self.legacy);
        let Some(f) = self.lists.finish() else { return };
        headers.insert(RATELIMIT_POLICY, f.policy);
        headers.insert(RATELIMIT, f.rate_limit);
        if let Some((quota, status)) = least {
            insert_legacy(headers, fields::legacy_of(quota, status));
        }
    }
}

/// One policy of a passed call before it is written: its hot parameter (`None`: the flow rules), quota,
/// window and status.
type Peeked = (Option<i32>, u64, u64, RateLimitStatus);

/// The policies a call went through, one per name: a name told twice (two QPS rules on the resource's one
/// window, two rules on one hot parameter, the elements of a collection value) keeps the one closest to
/// running out (the least remaining, then the smaller quota): the draft's service limit items identify their
/// policy by its name.
#[derive(Default)]
struct OnePerName(smallvec::SmallVec<[Peeked; 4]>);

impl OnePerName {
    fn add(&mut self, p: Peeked) {
        match self.0.iter_mut().find(|q| q.0 == p.0) {
            Some(q) => {
                if (p.3.remaining, p.1) < (q.3.remaining, q.1) {
                    *q = p;
                }
            }
            None => self.0.push(p),
        }
    }
}

/// The policies of `resource` for a call that passed with `args`: its QPS flow rules (named after the
/// resource) and its hot-parameter token buckets (named `resource#param_idx`), read at `now_ms`; one policy
/// per name ([`OnePerName`]).
pub(crate) fn passed(resource: &Resource, args: &[&dyn HotParam], now_ms: u64, out: &mut PassedFields) {
    let inner = &*resource.inner;
    let mut policies = OnePerName::default();
    // Read in the rules' read section, as the checks read them: no reference count taken (every request on
    // every thread would write the same counters).
    inner.with_rules(|r| {
        if let Some(flow) = &r.flow {
            flow.peek(&inner.cluster.stat, now_ms, &mut |p| {
                let reset = Some(Duration::from_millis(p.refill_in_ms));
                policies.add((None, p.quota, 1, RateLimitStatus { remaining: p.remaining, reset }));
            });
        }
        if let Some(param) = &r.param {
            param.peek(args, now_ms, &mut |p| {
                let reset = Some(Duration::from_millis(p.bucket.refill_in_ms));
                let status = RateLimitStatus { remaining: p.bucket.remaining, reset };
                policies.add((Some(p.rule.param_idx), p.bucket.quota, p.window_secs, status));
            });
        }
    });
    for (param_idx, quota, window_secs, status) in policies.0 {
        out.push(resource.name(), param_idx, quota, window_secs, status);
    }
}

/// The policy a blocked call ran out of (a QPS flow rule or a hot-parameter token bucket), with nothing
/// remaining and the block's retry time as the reset.
pub(crate) fn blocked(err: &BlockError) -> Option<(RateLimitPolicy, RateLimitStatus)> {
    let status = RateLimitStatus { remaining: 0, reset: err.retry_after() };
    match err {
        BlockError::Flow { resource, rule, .. } if rule.grade == FlowGrade::Qps => {
            Some((policy(policy_name(resource, None), crate::flow::peek::qps_quota(rule), 1)?, status))
        }
        BlockError::ParamFlow { resource, rule, threshold, .. } if rule.grade == FlowGrade::Qps => {
            // The value's bucket, as the passed responses read it: its own threshold, the burst, clamped; or
            // the rate limiter's count (it reads no burst).
            let quota = crate::param_flow::value_quota(rule, *threshold);
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
    if legacy && let Some(l) = fields::legacy(&refs) {
        insert_legacy(headers, l);
    }
}

fn insert_legacy(headers: &mut HeaderMap, l: fields::LegacyFields) {
    headers.insert(X_RATELIMIT_LIMIT, l.limit);
    headers.insert(X_RATELIMIT_REMAINING, l.remaining);
    if let Some(reset) = l.reset {
        headers.insert(X_RATELIMIT_RESET, reset);
    }
}

impl RateLimitHeaders {
    /// Writes the policy a blocked call ran out of into its response's `headers`.
    pub(crate) fn write_blocked(&self, headers: &mut HeaderMap, err: &BlockError) {
        if let Some(p) = blocked(err) {
            write(headers, std::slice::from_ref(&p), self.legacy);
        }
    }

    /// The fields of a call that passed, empty: [`passed`] fills them.
    pub(crate) fn passed_fields(&self) -> PassedFields {
        PassedFields { legacy: self.legacy, ..PassedFields::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_fields_write_what_the_policies_of_the_same_calls_write() {
        // A resource name with characters a field cannot hold, a hot parameter's policy, a zero window, and a
        // tie for the least remaining (the first policy's quota is the legacy limit).
        let calls =
            [("GET:/a", None, 10, 1, 4, 300), ("caf\u{e9} \"x\"", Some(2), 5, 60, 4, 1500), ("b", None, 3, 0, 9, 1)];
        for legacy in [true, false] {
            let mut fields = RateLimitHeaders::new().legacy(legacy).passed_fields();
            let mut policies = Vec::new();
            for (name, idx, quota, window, remaining, reset_ms) in calls {
                let status = RateLimitStatus { remaining, reset: Some(Duration::from_millis(reset_ms)) };
                fields.push(name, idx, quota, window, status);
                policies.push((policy(policy_name(name, idx), quota, window).unwrap(), status));
            }
            let mut got = HeaderMap::new();
            got.insert(RATELIMIT, http::HeaderValue::from_static("replaced"));
            fields.finish().unwrap().write_into(&mut got);
            let mut want = HeaderMap::new();
            write(&mut want, &policies, legacy);
            assert_eq!(got, want);
            assert_eq!(got[RATELIMIT_POLICY], r##""GET:/a";q=10;w=1, "caf_ \"x\"#2";q=5;w=60, "b";q=3;w=1"##);
            assert_eq!(got[RATELIMIT], r##""GET:/a";r=4;t=1, "caf_ \"x\"#2";r=4;t=2, "b";r=9;t=1"##);
            assert_eq!(got.get(X_RATELIMIT_LIMIT).map(|v| v.to_str().unwrap()), legacy.then_some("10"));
        }
        assert!(RateLimitHeaders::new().passed_fields().finish().is_none(), "no policy: no fields");
    }
}
