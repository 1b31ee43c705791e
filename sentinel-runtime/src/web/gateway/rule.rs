//! Gateway flow rule data: Java's `GatewayFlowRule` and `GatewayParamFlowItem`, with Java's codes and defaults.

use crate::flow::{ControlBehavior, FlowGrade};

use super::check_regex;
use super::error::GatewayRuleError;

/// An enum carried as one of Java's integer codes (`SentinelGatewayConstants`).
macro_rules! java_code {
    ($(#[$doc:meta])* $name:ident, $expected:literal, { $($(#[$vdoc:meta])* $variant:ident = $code:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }
        impl $name {
            /// Java's integer code.
            pub fn code(self) -> i64 {
                match self { $($name::$variant => $code,)+ }
            }
            /// The variant of Java's integer `code`, if there is one.
            pub fn from_code(code: i64) -> Option<Self> {
                match code { $($code => Some($name::$variant),)+ _ => None }
            }
            /// The valid codes, as error messages name them.
            pub const EXPECTED: &'static str = $expected;
        }
    };
}

java_code!(
    /// Which resource a gateway rule names (`resourceMode`).
    ResourceMode, "0 (route id) or 1 (API name)", {
        /// A route: the route id (for us the route template, or the name the user gives a route). Java's 0.
        #[default]
        RouteId = 0,
        /// A named API group ([`ApiDefinition`](super::ApiDefinition)). Java's 1.
        CustomApiName = 1,
    }
);

java_code!(
    /// Where a gateway rule's parameter comes from (`parseStrategy`).
    ParseStrategy, "0 (client IP), 1 (host), 2 (header), 3 (URL parameter) or 4 (cookie)", {
        /// The client's address (the peer, or the one a trusted proxy forwarded). Java's 0.
        #[default]
        ClientIp = 0,
        /// The host the request was sent to (`:authority`, else the `Host` header). Java's 1.
        Host = 1,
        /// The first value of the header `field_name`. Java's 2.
        Header = 2,
        /// The first value of the query parameter `field_name`, percent-decoded (`?name` without `=` has no
        /// value, as Spring reads it). Java's 3.
        UrlParam = 3,
        /// The first cookie named `field_name`. Java's 4.
        Cookie = 4,
    }
);

java_code!(
    /// How a parameter value is compared with the item's `pattern` (`matchStrategy`).
    ParamMatchStrategy, "0 (exact), 1 (prefix), 2 (regex) or 3 (contains)", {
        /// The whole value equals the pattern. Java's 0.
        #[default]
        Exact = 0,
        /// The value starts with the pattern (Java's parser lets every value through here; ours does not).
        /// Java's 1.
        Prefix = 1,
        /// The whole value matches the regular expression. Java's 2.
        Regex = 2,
        /// The value contains the pattern. Java's 3.
        Contains = 3,
    }
);

java_code!(
    /// How an API definition's path pattern is matched (`matchStrategy` of a predicate item).
    UrlMatchStrategy, "0 (exact), 1 (prefix: an Ant-style pattern) or 2 (regex)", {
        /// The whole path equals the pattern. Java's 0.
        #[default]
        Exact = 0,
        /// An Ant-style pattern (`/product/**`), as Spring Cloud Gateway matches it. Java's 1.
        Prefix = 1,
        /// The whole path matches the regular expression. Java's 2.
        Regex = 2,
    }
);

/// The longest interval of a gateway rule, in seconds (about 136 years): its nanoseconds fit in 64 bits.
pub const MAX_INTERVAL_SEC: u64 = u32::MAX as u64;

/// Where a gateway rule's parameter comes from, and which values it limits one by one (Java's
/// `GatewayParamFlowItem`).
///
/// Without a `pattern` every value is limited separately. With one, values that match are limited one by
/// one and the others share Java's "not matched" value ([`NOT_MATCHED_PARAM`](super::NOT_MATCHED_PARAM)),
/// whose budget makes them unlimited in practice (under a rate-limiter rule they pass uncounted, never
/// waiting). A request without the value (no such header) is never limited by the rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct GatewayParamItem {
    /// Where the value comes from.
    pub parse_strategy: ParseStrategy,
    /// The header, URL parameter or cookie name (required by those strategies, ignored by the others).
    pub field_name: Option<String>,
    /// The pattern values are matched against; `None` or empty: every value is limited separately.
    pub pattern: Option<String>,
    /// How values are matched against `pattern`.
    pub match_strategy: ParamMatchStrategy,
}

impl GatewayParamItem {
    fn of(parse_strategy: ParseStrategy, field_name: Option<String>) -> Self {
        GatewayParamItem { parse_strategy, field_name, ..Default::default() }
    }
    /// The client's address.
    pub fn client_ip() -> Self {
        Self::of(ParseStrategy::ClientIp, None)
    }
    /// The host the request was sent to.
    pub fn host() -> Self {
        Self::of(ParseStrategy::Host, None)
    }
    /// The first value of header `name`.
    pub fn header(name: impl Into<String>) -> Self {
        Self::of(ParseStrategy::Header, Some(name.into()))
    }
    /// The first value of URL (query) parameter `name`.
    pub fn url_param(name: impl Into<String>) -> Self {
        Self::of(ParseStrategy::UrlParam, Some(name.into()))
    }
    /// The first cookie named `name`.
    pub fn cookie(name: impl Into<String>) -> Self {
        Self::of(ParseStrategy::Cookie, Some(name.into()))
    }
    /// Limits only values matching `pattern` one by one (see the type's docs).
    pub fn pattern(mut self, pattern: impl Into<String>, strategy: ParamMatchStrategy) -> Self {
        self.pattern = Some(pattern.into());
        self.match_strategy = strategy;
        self
    }
    /// The pattern, when there is a non-empty one (Java treats an empty pattern as none).
    pub(crate) fn effective_pattern(&self) -> Option<&str> {
        self.pattern.as_deref().filter(|p| !p.is_empty())
    }
}

/// A gateway flow rule (Java's `GatewayFlowRule`): limits a route or an API group as a whole, or per value of
/// a request parameter.
///
/// Java's defaults: QPS, `interval_sec` 1, reject, no burst, `max_queueing_timeout_ms` 500.
///
/// ```
/// use sentinel_runtime::web::gateway::{GatewayFlowRule, GatewayParamItem, ParamMatchStrategy, ResourceMode};
/// let per_client = GatewayFlowRule::new("orders_api")
///     .resource_mode(ResourceMode::CustomApiName)
///     .count(5.0)
///     .param_item(GatewayParamItem::header("X-Tenant").pattern("vip-.*", ParamMatchStrategy::Regex));
/// assert_eq!((per_client.interval_sec, per_client.max_queueing_timeout_ms), (1, 500));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayFlowRule {
    /// The route id or API name.
    pub resource: String,
    /// Whether `resource` is a route id or an API name.
    pub resource_mode: ResourceMode,
    /// QPS (per `interval_sec`) or calls in flight.
    pub grade: FlowGrade,
    /// The threshold (per interval for QPS).
    pub count: f64,
    /// The interval the count applies to, in seconds.
    pub interval_sec: u64,
    /// Reject, or space calls evenly (rate limiter); other behaviours are invalid.
    pub control_behavior: ControlBehavior,
    /// Extra calls a bucket may hold beyond `count`.
    pub burst: u64,
    /// The longest queueing wait of the rate limiter, in milliseconds.
    pub max_queueing_timeout_ms: u64,
    /// The request parameter limited per value; `None`: the resource as a whole.
    pub param_item: Option<GatewayParamItem>,
}

impl Default for GatewayFlowRule {
    fn default() -> Self {
        GatewayFlowRule {
            resource: String::new(),
            resource_mode: ResourceMode::RouteId,
            grade: FlowGrade::Qps,
            count: 0.0,
            interval_sec: 1,
            control_behavior: ControlBehavior::Reject,
            burst: 0,
            max_queueing_timeout_ms: 500,
            param_item: None,
        }
    }
}

impl GatewayFlowRule {
    /// A QPS reject rule on the route `resource` with Java's defaults (and a count of 0 until set).
    pub fn new(resource: impl Into<String>) -> Self {
        GatewayFlowRule { resource: resource.into(), ..Default::default() }
    }
    /// Sets whether the resource is a route id or an API name.
    pub fn resource_mode(mut self, mode: ResourceMode) -> Self {
        self.resource_mode = mode;
        self
    }
    /// Sets the grade.
    pub fn grade(mut self, grade: FlowGrade) -> Self {
        self.grade = grade;
        self
    }
    /// Sets the threshold.
    pub fn count(mut self, count: f64) -> Self {
        self.count = count;
        self
    }
    /// Sets the interval in seconds.
    pub fn interval_sec(mut self, secs: u64) -> Self {
        self.interval_sec = secs;
        self
    }
    /// Sets the control behaviour.
    pub fn control_behavior(mut self, behavior: ControlBehavior) -> Self {
        self.control_behavior = behavior;
        self
    }
    /// Sets the burst.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = burst;
        self
    }
    /// Sets the longest queueing wait.
    pub fn max_queueing_timeout_ms(mut self, ms: u64) -> Self {
        self.max_queueing_timeout_ms = ms;
        self
    }
    /// Limits per value of a request parameter.
    pub fn param_item(mut self, item: GatewayParamItem) -> Self {
        self.param_item = Some(item);
        self
    }
}

/// Checks one gateway rule; the first invalid field is reported.
pub(crate) fn validate(rule: &GatewayFlowRule, index: usize) -> Result<(), GatewayRuleError> {
    let bad = |field, reason: &str| Err(GatewayRuleError::rule(index, &rule.resource, field, reason));
    if rule.resource.trim().is_empty() {
        return bad("resource", "must not be blank (a route id or an API name)");
    }
    if !rule.count.is_finite() || rule.count < 0.0 {
        return bad("count", "must be a finite number >= 0");
    }
    if rule.interval_sec == 0 || rule.interval_sec > MAX_INTERVAL_SEC {
        return bad("interval_sec", &format!("must be between 1 and {MAX_INTERVAL_SEC} seconds"));
    }
    if !matches!(rule.control_behavior, ControlBehavior::Reject | ControlBehavior::RateLimiter) {
        return bad("control_behavior", "must be Reject (0) or RateLimiter (2) for gateway rules");
    }
    if rule.burst > i64::MAX as u64 {
        return bad("burst", "is too large");
    }
    let Some(item) = &rule.param_item else { return Ok(()) };
    let needs_name =
        matches!(item.parse_strategy, ParseStrategy::Header | ParseStrategy::UrlParam | ParseStrategy::Cookie);
    let name = item.field_name.as_deref().map(str::trim).unwrap_or("");
    if needs_name && name.is_empty() {
        return bad("param_item.field_name", "must name the header, URL parameter or cookie");
    }
    if item.parse_strategy == ParseStrategy::Header && http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return bad("param_item.field_name", "is not a valid header name (letters, digits and `!#$%&'*+-.^_`|~`)");
    }
    if let (Some(pattern), ParamMatchStrategy::Regex) = (item.effective_pattern(), item.match_strategy)
        && let Err(reason) = check_regex(pattern)
    {
        return bad("param_item.pattern", &format!("`{pattern}` {reason}"));
    }
    Ok(())
}
