//! Gateway flow control (feature `tower`): API groups, gateway flow rules with request parameters, and the
//! RateLimit header fields, as Java Sentinel's gateway adapters (`sentinel-api-gateway-adapter-common`) do
//! them, in Java's formats.
//!
//! - [`ApiDefinition`]: a named group of paths (exact, Ant-style as Spring Cloud Gateway matches them, or a
//!   regular expression); a request that matches it enters the resource named after the API
//!   ([`ResourceMode::CustomApiName`]) besides its route's own ([`ResourceMode::RouteId`]). Loaded with
//!   [`Sentinel::load_api_definitions`](crate::Sentinel::load_api_definitions).
//! - [`GatewayFlowRule`]: a limit on a route or API, as a whole or per value of a request parameter
//!   ([`GatewayParamItem`]: client IP, host, header, URL parameter, cookie; values optionally matched
//!   exactly, by prefix, by regular expression or by substring). Loaded with
//!   [`Sentinel::load_gateway_rules`](crate::Sentinel::load_gateway_rules): as in Java, each becomes a
//!   hot-parameter rule ([`ParamFlowRule`](crate::param_flow::ParamFlowRule)) on its resource, beside the
//!   user's own hot-parameter rules (neither load replaces nor resets the other) and checked before them, as
//!   Java's gateway slot is: a request a gateway rule blocks spends nothing of the user's rules.
//! - [`SentinelLayer::gateway`](crate::web::SentinelLayer::gateway): the web layer's gateway mode enters
//!   each request's route and every API group it belongs to, with the values the rules read from it.
//! - [`json`] (feature `serde`): the rules and definitions in Java's JSON (`gw-flow-rules.json`,
//!   `gw-api-definitions.json` in a rules directory of a
//!   [`FileDataSource`](crate::datasource::FileDataSource), and the dashboard's `gateway/*` commands of the
//!   command center, which report `app_type=1` in their heartbeat so that the dashboard shows its gateway
//!   pages).
//! - [`rate_limit_headers`]: `RateLimit-Policy` and `RateLimit` of the IETF httpapi draft, and the older
//!   `x-ratelimit-*` names ([`SentinelLayer::rate_limit_headers`](crate::web::SentinelLayer::rate_limit_headers)).
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use axum::{routing::get, Router};
//! use sentinel_runtime::Sentinel;
//! use sentinel_runtime::web::{RateLimitHeaders, SentinelLayer, TrustedProxies};
//! use sentinel_runtime::web::gateway::{ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ResourceMode};
//!
//! let engine = Sentinel::builder().build();
//! engine.load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))]).unwrap();
//! engine
//!     .load_gateway_rules([
//!         // Each client IP: 10 requests a second to any product path.
//!         GatewayFlowRule::new("products")
//!             .resource_mode(ResourceMode::CustomApiName)
//!             .count(10.0)
//!             .param_item(GatewayParamItem::client_ip()),
//!         // The route as a whole: 1,000 a second.
//!         GatewayFlowRule::new("/product/{id}").count(1000.0),
//!     ])
//!     .unwrap();
//! let layer = SentinelLayer::new(&engine)
//!     .method_prefix(false) // route ids without the method
//!     .gateway(TrustedProxies::none())
//!     .rate_limit_headers(RateLimitHeaders::new());
//! let app: Router = Router::new().route("/product/{id}", get(|| async { "a product" })).route_layer(layer.axum());
//! # let _ = app; }
//! ```
//!
//! # Differences from Java Sentinel
//! - A prefix parameter pattern is a prefix (Java's parser lets every value through it).
//! - An invalid rule or definition rejects the whole set with a [`GatewayRuleError`] naming it and the
//!   field (Java drops it silently); a regular expression is checked when the set loads.
//! - A route id and an API name that are the same text keep their rules apart (Java switches enforcement
//!   off for such a resource).
//! - Argument positions are given in load order (Java's depend on a hash set's order).
//! - A matched value that spells the "not matched" marker `$NM` is counted under another key, so that a
//!   client cannot claim the unmatched values' budget by sending it.
//! - Under a rate-limiter rule, values that do not match the pattern pass uncounted. Java spaces them (all
//!   under `$NM`, count 10,000,000) by `round(interval / 10,000)` ms: none for intervals under 5,000 s, so
//!   the same there; 1 ms and more beyond, where Java holds them all together to a thousand a second or
//!   fewer.
//! - Parsed values are bounded: a value is matched against the pattern whole, and counted under at most
//!   [`MAX_PARAM_VALUE_LEN`] bytes of it; the number of values a rule counts is bounded by the hot-parameter
//!   cache's cap.

mod ant;
mod api;
pub(crate) mod enter;
mod error;
#[cfg(feature = "serde")]
pub mod json;
mod loading;
mod params;
pub mod rate_limit_headers;
mod rule;
mod rule_set;

pub use api::{ApiDefinition, ApiMatcher, ApiPredicateItem};
pub use error::GatewayRuleError;
pub use params::{GatewayArguments, MAX_COOKIE_PAIRS, MAX_PARAM_VALUE_LEN, MAX_QUERY_PAIRS};
pub use rule::{
    GatewayFlowRule, GatewayParamItem, ParamMatchStrategy, ParseStrategy, ResourceMode, UrlMatchStrategy,
    MAX_INTERVAL_SEC,
};
pub use rule_set::GatewayRuleSet;

/// The value every parameter value that does not match its rule's pattern is counted under (Java's
/// `GATEWAY_NOT_MATCH_PARAM`); its budget ([`NOT_MATCHED_COUNT`]) makes such values unlimited in practice.
pub const NOT_MATCHED_PARAM: &str = "$NM";

/// The budget of [`NOT_MATCHED_PARAM`] per interval (Java's).
pub const NOT_MATCHED_COUNT: f64 = 10_000_000.0;

/// The constant argument of a rule without a parameter item (Java's `GATEWAY_DEFAULT_PARAM`): the
/// resource is limited as a whole.
pub const DEFAULT_PARAM: &str = "$D";

/// The largest compiled program of a regular expression of a gateway rule or API definition (and of its
/// lazy DFA cache): a pushed rule cannot exhaust memory.
const GATEWAY_REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The largest lazy DFA cache a gateway regular expression grows as requests are matched against it (on each
/// thread that matches it at once). Counted with its program against [`GATEWAY_REGEX_TOTAL_LIMIT`].
const GATEWAY_DFA_LIMIT: usize = 128 << 10;

/// What the compiled regular expressions of one set of gateway rules, or of API definitions, may hold in all
/// (their automata): each is held to [`GATEWAY_REGEX_SIZE_LIMIT`], and a push of many (`.{1000}` is seven
/// characters and about 1 MiB compiled) cannot make their sum grow without bound.
const GATEWAY_REGEX_TOTAL_LIMIT: usize = crate::pattern::PATTERNS_TOTAL_LIMIT;

thread_local! {
    /// The bytes left to the set being compiled on this thread ([`within_regex_budget`]).
    static REGEX_BUDGET: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `f`, which compiles one set (gateway rules, API definitions), with [`GATEWAY_REGEX_TOTAL_LIMIT`] bytes
/// for the regular expressions it compiles: past them, compiling one more is an error naming it.
pub(crate) fn within_regex_budget<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            REGEX_BUDGET.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(REGEX_BUDGET.with(|b| b.replace(Some(GATEWAY_REGEX_TOTAL_LIMIT))));
    f()
}

/// Spends the size of `compiled` (the anchored source) from the budget of the set being compiled, if any.
fn spend_regex_budget(compiled: &str) -> Result<(), String> {
    let Some(left) = REGEX_BUDGET.with(|b| b.get()) else { return Ok(()) };
    let bytes = crate::pattern::compiled_bytes(compiled, GATEWAY_REGEX_SIZE_LIMIT) + GATEWAY_DFA_LIMIT;
    if bytes > left {
        return Err(format!(
            "takes {} KiB (its program and its search cache), past what the set's regular expressions may hold in \
             all ({} MiB); simplify them or use fewer",
            bytes.div_ceil(1024),
            GATEWAY_REGEX_TOTAL_LIMIT >> 20
        ));
    }
    REGEX_BUDGET.with(|b| b.set(Some(left - bytes)));
    Ok(())
}

/// Compiles a regular expression the whole text must match (Java's `Pattern.matcher(text).matches()`),
/// spending its size from the budget of the set being compiled ([`within_regex_budget`]).
fn compile_regex(source: &str) -> Result<regex::Regex, String> {
    let regex = check_regex(source)?;
    spend_regex_budget(regex.as_str())?;
    Ok(regex)
}

/// [`compile_regex`] without spending from a budget (a check; the regex kept is compiled again).
fn check_regex(source: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(&format!(r"\A(?:{})\z", crate::pattern::java_syntax(source)))
        .size_limit(GATEWAY_REGEX_SIZE_LIMIT)
        .dfa_size_limit(GATEWAY_DFA_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::Syntax(text) => {
                let what = text.lines().rev().find_map(|l| l.strip_prefix("error: ")).unwrap_or(text.as_str());
                format!("is not a valid regular expression ({what}; look-around and backreferences do not exist)")
            }
            regex::Error::CompiledTooBig(limit) => format!("compiles to more than {limit} bytes; simplify it"),
            other => format!("is not a valid regular expression ({other})"),
        })
}

#[cfg(test)]
mod tests;
