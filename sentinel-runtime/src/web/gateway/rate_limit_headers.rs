//! The RateLimit header fields of the IETF httpapi draft `draft-ietf-httpapi-ratelimit-headers`
//! (`RateLimit-Policy`, `RateLimit`), and the older `x-ratelimit-*` names.
//!
//! Both fields are Structured Field Lists (RFC 9651): one item per policy, the policy's name as a String
//! with parameters. `RateLimit-Policy: "default";q=100;w=10` says the policy allows a quota `q` per window
//! `w` (seconds); `RateLimit: "default";r=50;t=30` says `r` units remain and more are available in `t`
//! seconds. [`format()`] writes both for any number of policies; [`legacy`] writes `x-ratelimit-limit`,
//! `x-ratelimit-remaining` and `x-ratelimit-reset` (seconds) for the policy closest to running out.
//!
//! ```
//! use std::time::Duration;
//! use sentinel_runtime::web::gateway::rate_limit_headers::{format, RateLimitPolicy, RateLimitStatus};
//! let policy = RateLimitPolicy::new("default", 100).unwrap().window_secs(10).unwrap();
//! let status = RateLimitStatus { remaining: 50, reset: Some(Duration::from_secs(30)) };
//! let fields = format(&[(&policy, status)]).unwrap();
//! assert_eq!(fields.policy, "\"default\";q=100;w=10");
//! assert_eq!(fields.rate_limit, "\"default\";r=50;t=30");
//! ```

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use sfv::{Integer, ItemSerializer, KeyRef, RefBareItem, StringRef};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `x-ratelimit-limit` (the older name: the quota).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining` (the older name: what remains of the quota).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset` (the older name: seconds until more quota is available).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The largest integer a structured field carries (999,999,999,999,999); larger values are written as it.
pub const MAX_FIELD_INTEGER: u64 = 999_999_999_999_999;

/// A policy that cannot be written as the draft requires.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitHeaderError {
    /// The policy name has a character a structured-field String cannot hold.
    #[error(
        "rate-limit policy name `{name}` has a character outside printable ASCII (0x20-0x7E); name the policy in ASCII"
    )]
    PolicyName {
        /// The name as given.
        name: String,
    },
    /// The window is zero: the draft requires a positive number of seconds.
    #[error("rate-limit policy `{name}`: the window must be at least 1 second")]
    ZeroWindow {
        /// The policy's name.
        name: String,
    },
}

/// The quota units of the draft's registry (`qu`); `Requests` is the default and is not written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QuotaUnit {
    /// Requests (the default).
    #[default]
    Requests,
    /// Bytes of content.
    ContentBytes,
    /// Requests in flight.
    ConcurrentRequests,
}

impl QuotaUnit {
    /// The registered name.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaUnit::Requests => "requests",
            QuotaUnit::ContentBytes => "content-bytes",
            QuotaUnit::ConcurrentRequests => "concurrent-requests",
        }
    }
}

/// A quota policy: its name, quota, window, unit and partition key (`RateLimit-Policy`'s item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitPolicy {
    name: String,
    quota: u64,
    window_secs: Option<u64>,
    quota_unit: QuotaUnit,
    partition_key: Option<Vec<u8>>,
}

impl RateLimitPolicy {
    /// The policy `name` allowing `quota` units. The name must be printable ASCII (a structured-field
    /// String).
    pub fn new(name: impl Into<String>, quota: u64) -> Result<Self, RateLimitHeaderError> {
        let name = name.into();
        if StringRef::from_str(&name).is_err() {
            return Err(RateLimitHeaderError::PolicyName { name });
        }
        Ok(RateLimitPolicy { name, quota, window_secs: None, quota_unit: QuotaUnit::Requests, partition_key: None })
    }
    /// The window the quota applies to, in whole seconds (`w`); it must be at least 1.
    pub fn window_secs(mut self, secs: u64) -> Result<Self, RateLimitHeaderError> {
        if secs == 0 {
            return Err(RateLimitHeaderError::ZeroWindow { name: self.name });
        }
        self.window_secs = Some(secs);
        Ok(self)
    }
    /// The unit of the quota (`qu`, written when it is not requests).
    pub fn quota_unit(mut self, unit: QuotaUnit) -> Self {
        self.quota_unit = unit;
        self
    }
    /// The partition key the quota is allocated to (`pk`, a Byte Sequence): what tells clients apart (a
    /// client IP, a tenant), never a secret.
    pub fn partition_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.partition_key = Some(key.into());
        self
    }
    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The quota.
    pub fn quota(&self) -> u64 {
        self.quota
    }
}

/// The current state of a policy for one request (`RateLimit`'s item).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitStatus {
    /// The quota units that remain (`r`).
    pub remaining: u64,
    /// When more quota is available (`t`, written in whole seconds, rounded up so a client never comes back
    /// early); `None`: not said.
    pub reset: Option<Duration>,
}

/// The two field values, ready to insert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitFields {
    /// The value of `RateLimit-Policy`.
    pub policy: HeaderValue,
    /// The value of `RateLimit`.
    pub rate_limit: HeaderValue,
}

/// The older header values (`x-ratelimit-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegacyFields {
    /// `x-ratelimit-limit`: the quota.
    pub limit: HeaderValue,
    /// `x-ratelimit-remaining`.
    pub remaining: HeaderValue,
    /// `x-ratelimit-reset`: seconds until more quota is available, when known.
    pub reset: Option<HeaderValue>,
}

/// Seconds written for `d`: whole seconds, rounded up.
pub fn delay_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

fn integer(v: u64) -> RefBareItem<'static> {
    RefBareItem::Integer(Integer::try_from(v.min(MAX_FIELD_INTEGER)).unwrap_or(Integer::MAX))
}

/// Appends the parameter `;k=v` as RFC 9651 serializes an Integer parameter (what sfv writes for
/// `parameter(key(k), integer(v))`, without its formatter), `k` one of the draft's keys.
fn integer_param(out: &mut String, k: &'static str, v: u64) {
    out.push(';');
    out.push_str(k);
    out.push('=');
    out.push_str(itoa::Buffer::new().format(v.min(MAX_FIELD_INTEGER)));
}

/// Appends `name` as RFC 9651 serializes a String (what sfv writes for `bare_item(name)`): whole when it
/// has nothing to escape, the usual case, where sfv pushes a character at a time.
fn string_item(out: &mut String, name: &StringRef) {
    let text = name.as_str();
    if text.bytes().any(|b| b == b'"' || b == b'\\') {
        let _ = ItemSerializer::with_buffer(out).bare_item(name).finish();
        return;
    }
    out.push('"');
    out.push_str(text);
    out.push('"');
}

fn key(k: &'static str) -> &'static KeyRef {
    // The keys are the draft's (`q`, `w`, `qu`, `pk`, `r`, `t`): valid by construction.
    KeyRef::constant(k)
}

/// A field's value: one allocation of exactly its length (a value made from a `String` with room to spare
/// takes a second one, the bytes' shared header).
fn value(text: &str) -> HeaderValue {
    // A serialized structured field is printable ASCII by construction.
    HeaderValue::from_bytes(text.as_bytes()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// An integer's value, written on the stack and copied once (`HeaderValue::from(u64)` allocates twice).
fn integer_value(n: u64) -> HeaderValue {
    value(itoa::Buffer::new().format(n))
}

/// The buffers a thread keeps between requests (the two lists and a policy name), so that serializing a
/// request's fields allocates nothing once the thread served one: taken by a request's first policy (on
/// whichever thread it is then), given back when its fields are made (on that thread). One set per thread,
/// each buffer at most [`SPARE_MAX_BYTES`]: a larger one is dropped.
mod spare {
    use std::cell::Cell;

    /// The largest buffer a thread keeps.
    pub(super) const SPARE_MAX_BYTES: usize = 4096;

    thread_local! {
        static BUFFERS: Cell<Option<[String; 3]>> = const { Cell::new(None) };
    }

    /// This thread's spare buffers, or new empty ones.
    pub(super) fn take() -> [String; 3] {
        BUFFERS.try_with(Cell::take).ok().flatten().unwrap_or_default()
    }

    /// Keeps `buffers`, emptied, for this thread's next request (unless it already keeps a set, or a buffer
    /// is too large, or the thread is exiting).
    pub(super) fn give_back(mut buffers: [String; 3]) {
        if buffers.iter().any(|b| b.capacity() > SPARE_MAX_BYTES) {
            return;
        }
        buffers.iter_mut().for_each(String::clear);
        let _ = BUFFERS.try_with(|b| {
            let kept = b.take();
            b.set(Some(kept.unwrap_or(buffers)));
        });
    }
}

/// `RateLimit-Policy` and `RateLimit` for `policies` (one item each, in order); `None` when there is none.
pub fn format(policies: &[(&RateLimitPolicy, RateLimitStatus)]) -> Option<RateLimitFields> {
    let mut lists = Lists::default();
    for (policy, status) in policies {
        // The name was checked when the policy was made.
        let Ok(name) = StringRef::from_str(&policy.name) else { continue };
        let shape = Shape { quota: policy.quota, unit: policy.quota_unit, window_secs: policy.window_secs };
        lists.push(name, shape, *status, policy.partition_key.as_deref());
    }
    lists.finish()
}

/// What a policy's item says besides its name and partition key.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) quota: u64,
    pub(crate) unit: QuotaUnit,
    pub(crate) window_secs: Option<u64>,
}

/// The two fields' lists, serialized as policies come (one item each, in order).
#[derive(Debug, Default)]
pub(crate) struct Lists {
    policy: String,
    limit: String,
    /// A policy name built for the request ([`push_named`](Self::push_named)).
    name: String,
}

impl Lists {
    /// Takes the thread's spare buffers at the first policy.
    #[inline]
    fn ready(&mut self) {
        if self.policy.capacity() == 0 {
            [self.policy, self.limit, self.name] = spare::take();
        }
    }

    /// Appends one policy whose name `write_name` writes (printable ASCII, or the policy is left out), with
    /// integer parameters only.
    pub(crate) fn push_named(&mut self, write_name: impl FnOnce(&mut String), shape: Shape, status: RateLimitStatus) {
        self.ready();
        let mut name = std::mem::take(&mut self.name);
        name.clear();
        write_name(&mut name);
        if let Ok(n) = StringRef::from_str(&name) {
            self.push(n, shape, status, None);
        }
        self.name = name;
    }

    /// Appends one policy's items.
    pub(crate) fn push(&mut self, name: &StringRef, shape: Shape, status: RateLimitStatus, pk: Option<&[u8]>) {
        // Room for the item as most are (the name, three short integers, a window), so that each list is
        // one allocation rather than one per doubling; at the first item, room for a second as well (a
        // request often passes two policies: its route's and an API group's, or a flow rule's and a hot
        // parameter's), so that it is not moved to grow.
        let room = name.as_str().len() + 40;
        self.ready();
        let room = if self.policy.is_empty() { 2 * room + 2 } else { room + 2 };
        self.policy.reserve(room);
        self.limit.reserve(room);
        if !self.policy.is_empty() {
            // RFC 9651's list separator (the item serializer writes members one at a time).
            self.policy.push_str(", ");
            self.limit.push_str(", ");
        }
        if shape.unit == QuotaUnit::Requests && pk.is_none() {
            // Integer parameters only (every policy of a passed request): written without sfv's formatter.
            let p = &mut self.policy;
            string_item(p, name);
            integer_param(p, "q", shape.quota);
            if let Some(w) = shape.window_secs {
                integer_param(p, "w", w);
            }
            let l = &mut self.limit;
            string_item(l, name);
            integer_param(l, "r", status.remaining);
            if let Some(t) = status.reset {
                integer_param(l, "t", delay_seconds(t));
            }
            return;
        }
        let mut p =
            ItemSerializer::with_buffer(&mut self.policy).bare_item(name).parameter(key("q"), integer(shape.quota));
        if shape.unit != QuotaUnit::Requests {
            p = p.parameter(key("qu"), StringRef::constant(shape.unit.as_str()));
        }
        if let Some(w) = shape.window_secs {
            p = p.parameter(key("w"), integer(w));
        }
        if let Some(pk) = pk {
            p = p.parameter(key("pk"), RefBareItem::ByteSequence(pk));
        }
        let _ = p.finish();
        let mut l =
            ItemSerializer::with_buffer(&mut self.limit).bare_item(name).parameter(key("r"), integer(status.remaining));
        if let Some(t) = status.reset {
            l = l.parameter(key("t"), integer(delay_seconds(t)));
        }
        if let Some(pk) = pk {
            l = l.parameter(key("pk"), RefBareItem::ByteSequence(pk));
        }
        let _ = l.finish();
    }

    /// Whether no policy was pushed.
    pub(crate) fn is_empty(&self) -> bool {
        self.policy.is_empty()
    }

    /// The two values; `None` when no policy was pushed (an empty list is not written). The buffers go back
    /// to the thread's spare set.
    pub(crate) fn finish(self) -> Option<RateLimitFields> {
        let fields =
            (!self.is_empty()).then(|| RateLimitFields { policy: value(&self.policy), rate_limit: value(&self.limit) });
        if self.policy.capacity() > 0 {
            spare::give_back([self.policy, self.limit, self.name]);
        }
        fields
    }
}

/// The older `x-ratelimit-*` values for the policy with the least remaining (the first such); `None` when
/// there is no policy.
pub fn legacy(policies: &[(&RateLimitPolicy, RateLimitStatus)]) -> Option<LegacyFields> {
    let (policy, status) = policies.iter().min_by_key(|(_, s)| s.remaining)?;
    Some(legacy_of(policy.quota, *status))
}

/// The older values for one policy's quota and status.
pub(crate) fn legacy_of(quota: u64, status: RateLimitStatus) -> LegacyFields {
    LegacyFields {
        limit: integer_value(quota),
        remaining: integer_value(status.remaining),
        reset: status.reset.map(|t| integer_value(delay_seconds(t))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_one_spare_set_of_bounded_emptied_buffers() {
        std::thread::spawn(|| {
            let caps = |b: &[String; 3]| b.each_ref().map(String::capacity);
            assert_eq!(caps(&spare::take()), [0; 3], "a new thread keeps none");
            let mut first = [(); 3].map(|_| String::with_capacity(100));
            first[0].push_str("q=1");
            spare::give_back(first);
            spare::give_back([(); 3].map(|_| String::with_capacity(300)));
            let kept = spare::take();
            assert!(caps(&kept).iter().all(|c| (100..300).contains(c)), "the first kept");
            assert!(kept[0].is_empty(), "emptied");
            assert_eq!(caps(&spare::take()), [0; 3], "one set");
            spare::give_back([String::new(), String::with_capacity(spare::SPARE_MAX_BYTES + 1), String::new()]);
            assert_eq!(caps(&spare::take()), [0; 3], "a buffer too large: none kept");
        })
        .join()
        .expect("the thread");
    }

    fn policy(name: &str, q: u64, w: u64) -> RateLimitPolicy {
        RateLimitPolicy::new(name, q).unwrap().window_secs(w).unwrap()
    }
    fn status(r: u64, t: u64) -> RateLimitStatus {
        RateLimitStatus { remaining: r, reset: Some(Duration::from_secs(t)) }
    }

    #[test]
    fn the_drafts_single_policy_examples_are_written_exactly() {
        let default = policy("default", 100, 10);
        let f = format(&[(&default, status(50, 30))]).unwrap();
        assert_eq!(f.policy, r#""default";q=100;w=10"#);
        assert_eq!(f.rate_limit, r#""default";r=50;t=30"#);
        let basic = policy("basic", 100, 60);
        let f = format(&[(&basic, status(60, 58))]).unwrap();
        assert_eq!(
            (f.policy.to_str().unwrap(), f.rate_limit.to_str().unwrap()),
            (r#""basic";q=100;w=60"#, r#""basic";r=60;t=58"#)
        );
    }

    #[test]
    fn the_drafts_multiple_policy_example_is_one_list() {
        // RFC 9651 serializes list members separated by ", " (the draft's example omits the optional space).
        let (permin, perhr) = (policy("permin", 50, 60), policy("perhr", 1000, 3600));
        let f = format(&[(&permin, status(10, 20)), (&perhr, status(900, 1800))]).unwrap();
        assert_eq!(f.policy, r#""permin";q=50;w=60, "perhr";q=1000;w=3600"#);
        assert_eq!(f.rate_limit, r#""permin";r=10;t=20, "perhr";r=900;t=1800"#);
    }

    #[test]
    fn partition_keys_are_byte_sequences_and_units_other_than_requests_are_named() {
        let p = RateLimitPolicy::new("default", 65535)
            .unwrap()
            .quota_unit(QuotaUnit::ContentBytes)
            .window_secs(60)
            .unwrap()
            .partition_key(&b"App-999"[..]);
        let f = format(&[(&p, status(300_000_000, 60))]).unwrap();
        assert_eq!(f.policy, r#""default";q=65535;qu="content-bytes";w=60;pk=:QXBwLTk5OQ==:"#);
        assert_eq!(f.rate_limit, r#""default";r=300000000;t=60;pk=:QXBwLTk5OQ==:"#, "the draft's example");
        let trial = RateLimitPolicy::new("default", 1000).unwrap().partition_key(&b"trial121323"[..]);
        let f = format(&[(&trial, RateLimitStatus { remaining: 999, reset: None })]).unwrap();
        assert_eq!(f.rate_limit, r#""default";r=999;pk=:dHJpYWwxMjEzMjM=:"#, "the draft's example without t");
        assert_eq!(f.policy, r#""default";q=1000;pk=:dHJpYWwxMjEzMjM=:"#, "no window: no w");
    }

    #[test]
    fn names_are_escaped_or_refused_and_integers_are_clamped() {
        let odd = policy(r#"GET:/a "b" \c"#, 1, 1);
        let f = format(&[(&odd, status(0, 1))]).unwrap();
        assert_eq!(f.policy, r#""GET:/a \"b\" \\c";q=1;w=1"#);
        assert!(matches!(RateLimitPolicy::new("caf\u{e9}", 1), Err(RateLimitHeaderError::PolicyName { .. })));
        assert!(matches!(RateLimitPolicy::new("x\n", 1), Err(RateLimitHeaderError::PolicyName { .. })));
        assert!(matches!(
            RateLimitPolicy::new("d", 1).unwrap().window_secs(0),
            Err(RateLimitHeaderError::ZeroWindow { .. })
        ));
        let huge = policy("h", u64::MAX, u64::MAX);
        let f = format(&[(&huge, status(u64::MAX, 0))]).unwrap();
        assert_eq!(f.policy, r#""h";q=999999999999999;w=999999999999999"#);
        assert_eq!(f.rate_limit, r#""h";r=999999999999999;t=0"#);
        assert_eq!(format(&[]), None, "an empty list is not written");
    }

    #[test]
    fn integer_parameters_are_written_as_sfv_writes_them() {
        let mut values = vec![0, 1, 9, 10, 99, 100, 12_345, u32::MAX as u64, MAX_FIELD_INTEGER - 1];
        values.extend([MAX_FIELD_INTEGER, MAX_FIELD_INTEGER + 1, u64::MAX]);
        values.extend((0..64).map(|b| 1u64 << b));
        for v in values {
            for k in ["q", "w", "r", "t"] {
                let mut ours = String::new();
                integer_param(&mut ours, k, v);
                let theirs =
                    ItemSerializer::new().bare_item(StringRef::constant("n")).parameter(key(k), integer(v)).finish();
                assert_eq!(format!("\"n\"{ours}"), theirs, "{k}={v}");
            }
        }
    }

    #[test]
    fn string_items_are_written_as_sfv_writes_them() {
        let printable: String = (b' '..=b'~').map(char::from).collect();
        let unescaped: String = printable.chars().filter(|c| !matches!(c, '"' | '\\')).collect();
        for name in ["", "GET:/hello", "/product/{id}#0", r#"a "quoted" \ name"#, "\\", "\"", &printable, &unescaped] {
            let name = StringRef::from_str(name).unwrap();
            let mut ours = String::new();
            string_item(&mut ours, name);
            assert_eq!(ours, ItemSerializer::new().bare_item(name).finish(), "{name:?}");
        }
    }

    #[test]
    fn reset_rounds_up_to_whole_seconds() {
        let p = policy("default", 3, 1);
        let at =
            |ms| format(&[(&p, RateLimitStatus { remaining: 0, reset: Some(Duration::from_millis(ms)) })]).unwrap();
        assert_eq!(at(1).rate_limit, r#""default";r=0;t=1"#);
        assert_eq!(at(1000).rate_limit, r#""default";r=0;t=1"#);
        assert_eq!(at(1001).rate_limit, r#""default";r=0;t=2"#);
        assert_eq!(at(0).rate_limit, r#""default";r=0;t=0"#);
    }

    #[test]
    fn legacy_fields_describe_the_policy_closest_to_running_out() {
        let (a, b) = (policy("a", 100, 60), policy("b", 10, 1));
        let l = legacy(&[(&a, status(40, 30)), (&b, status(2, 1))]).unwrap();
        assert_eq!(
            (l.limit, l.remaining, l.reset),
            ("10".parse().unwrap(), "2".parse().unwrap(), Some("1".parse().unwrap()))
        );
        assert_eq!(legacy(&[]), None);
    }
}
