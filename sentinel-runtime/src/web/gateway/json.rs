//! Gateway rules and API definitions in Java's JSON (feature `serde`): the formats of
//! `gw-flow-rules.json`, `gw-api-definitions.json` and the dashboard's `gateway/*` commands.
//!
//! Fields are camelCase with Java's integer codes, and absent fields take Java's defaults
//! (`resourceMode` 0, `grade` 1, `intervalSec` 1, `controlBehavior` 0, `burst` 0, `maxQueueingTimeoutMs`
//! 500; `matchStrategy` 0). The fields a dashboard export adds are accepted and dropped (`id`, `app`, `ip`,
//! `port`, `gmtCreate`, `gmtModified`, and a parameter item's `index`, which the rule set assigns); the
//! dashboard's `interval` with `intervalUnit` (0 s, 1 min, 2 h, 3 days) stands for `intervalSec` when that
//! is absent. Any other field is an error, so a misspelt field is never silently dropped.
//!
//! ```
//! use sentinel_runtime::web::gateway::json;
//! let rules = json::rules_from_json(
//!     r#"[{"resource":"httpbin_route","count":10,"paramItem":{"parseStrategy":2,"fieldName":"X-Tenant"}}]"#,
//! )
//! .unwrap();
//! assert_eq!((rules[0].interval_sec, rules[0].max_queueing_timeout_ms), (1, 500));
//! let back = json::rules_to_json(&rules);
//! assert_eq!(json::rules_from_json(&back).unwrap(), rules);
//! ```

use serde::de::{self, Deserializer, IgnoredAny};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::flow::{ControlBehavior, FlowGrade};

use super::api::{ApiDefinition, ApiPredicateItem};
use super::rule::{
    GatewayFlowRule, GatewayParamItem, ParamMatchStrategy, ParseStrategy, ResourceMode, UrlMatchStrategy,
};

/// A document that is not valid JSON of the expected shape: where, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid gateway JSON at `{path}` (line {line}, column {column}): {message}")]
pub struct GatewayJsonError {
    /// The path of the offending value (`[0].paramItem.parseStrategy`), `.` for the document.
    pub path: String,
    /// The line (1-based).
    pub line: usize,
    /// The column (1-based).
    pub column: usize,
    /// What was wrong.
    pub message: String,
}

fn parse<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, GatewayJsonError> {
    let error = |path: String, e: serde_json::Error| GatewayJsonError {
        path,
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    };
    // fastjson skips a UTF-8 byte order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let strict = |text: &str| -> Result<T, GatewayJsonError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            error(path, e.into_inner())
        })?;
        de.end().map_err(|e| error(".".into(), e))?;
        Ok(value)
    };
    // fastjson's default leniency (unquoted field names, single quotes, extra commas), as Java reads a
    // hand-written document.
    strict(text).or_else(|e| match crate::lenient_json::strict_json(text) {
        Some(made_strict) => strict(&made_strict),
        None => Err(e),
    })
}

/// Reads gateway flow rules from Java's JSON (a list; `null` is an empty one).
pub fn rules_from_json(text: &str) -> Result<Vec<GatewayFlowRule>, GatewayJsonError> {
    parse::<Option<Vec<GatewayFlowRule>>>(text).map(Option::unwrap_or_default)
}

/// Reads API definitions from Java's JSON (a list; `null` is an empty one).
pub fn api_definitions_from_json(text: &str) -> Result<Vec<ApiDefinition>, GatewayJsonError> {
    parse::<Option<Vec<ApiDefinition>>>(text).map(Option::unwrap_or_default)
}

/// Writes gateway flow rules as Java writes them (every field, `paramItem` when there is one).
pub fn rules_to_json(rules: &[GatewayFlowRule]) -> String {
    serde_json::to_string(rules).unwrap_or_else(|_| "[]".into())
}

/// Writes API definitions as Java writes them.
pub fn api_definitions_to_json(definitions: &[ApiDefinition]) -> String {
    serde_json::to_string(definitions).unwrap_or_else(|_| "[]".into())
}

/// A type carried as one of Java's integer codes.
trait JavaCode: Sized {
    /// The valid codes, for the error message.
    const EXPECTED: &'static str;
    fn from_code(code: i64) -> Option<Self>;
}

/// A Java integer code, read as its type: an invalid code is reported at the field it is in.
struct Code<T>(T);

impl<'de, T: JavaCode> Deserialize<'de> for Code<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        T::from_code(n).map(Code).ok_or_else(|| de::Error::invalid_value(de::Unexpected::Signed(n), &T::EXPECTED))
    }
}

/// The value of an optional code field, or its default.
fn or<T>(code: Option<Code<T>>, default: T) -> T {
    code.map_or(default, |Code(v)| v)
}

macro_rules! java_code_of {
    ($($t:ty),*) => {$(
        impl JavaCode for $t {
            const EXPECTED: &'static str = <$t>::EXPECTED;
            fn from_code(code: i64) -> Option<Self> {
                <$t>::from_code(code)
            }
        }
    )*};
}
java_code_of!(ResourceMode, ParseStrategy, ParamMatchStrategy, UrlMatchStrategy);

impl JavaCode for FlowGrade {
    const EXPECTED: &'static str = "0 (thread count) or 1 (QPS)";
    fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(FlowGrade::Thread),
            1 => Some(FlowGrade::Qps),
            _ => None,
        }
    }
}

impl JavaCode for ControlBehavior {
    const EXPECTED: &'static str = "0 (reject) or 2 (rate limiter)";
    fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(ControlBehavior::Reject),
            1 => Some(ControlBehavior::WarmUp),
            2 => Some(ControlBehavior::RateLimiter),
            3 => Some(ControlBehavior::WarmUpRateLimiter),
            _ => None,
        }
    }
}

/// The dashboard's `intervalUnit`, as seconds.
struct IntervalUnit(u64);

impl JavaCode for IntervalUnit {
    const EXPECTED: &'static str = "0 (second), 1 (minute), 2 (hour) or 3 (day)";
    fn from_code(code: i64) -> Option<Self> {
        [1, 60, 3_600, 86_400].get(usize::try_from(code).ok()?).map(|&s| IntervalUnit(s))
    }
}

fn grade_code(g: FlowGrade) -> i64 {
    match g {
        FlowGrade::Thread => 0,
        FlowGrade::Qps => 1,
    }
}

fn behavior_code(b: ControlBehavior) -> i64 {
    match b {
        ControlBehavior::Reject => 0,
        ControlBehavior::WarmUp => 1,
        ControlBehavior::RateLimiter => 2,
        ControlBehavior::WarmUpRateLimiter => 3,
    }
}

/// A wire struct that also accepts and drops a dashboard export's bookkeeping fields (`id`, `app`, `ip`,
/// `port`, `gmtCreate`, `gmtModified`); any other unknown field is an error.
macro_rules! with_bookkeeping {
    ($(#[$attr:meta])* struct $name:ident { $($(#[$fattr:meta])* $field:ident: $ty:ty,)* }) => {
        // The tolerated fields are read only to be dropped.
        #[allow(dead_code)]
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        $(#[$attr])*
        struct $name {
            $($(#[$fattr])* $field: $ty,)*
            #[serde(default)]
            id: Option<IgnoredAny>,
            #[serde(default)]
            app: Option<IgnoredAny>,
            #[serde(default)]
            ip: Option<IgnoredAny>,
            #[serde(default)]
            port: Option<IgnoredAny>,
            #[serde(default)]
            gmt_create: Option<IgnoredAny>,
            #[serde(default)]
            gmt_modified: Option<IgnoredAny>,
        }
    };
}

// The tolerated fields are read only to be dropped.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ParamItemIn {
    #[serde(default)]
    index: Option<IgnoredAny>,
    #[serde(default)]
    parse_strategy: Option<Code<ParseStrategy>>,
    #[serde(default)]
    field_name: Option<String>,
    #[serde(default)]
    pattern: Option<String>,
    #[serde(default)]
    match_strategy: Option<Code<ParamMatchStrategy>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ParamItemOut<'a> {
    parse_strategy: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    field_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pattern: Option<&'a str>,
    match_strategy: i64,
}

with_bookkeeping! {
    struct RuleIn {
        #[serde(default)]
        resource: Option<String>,
        #[serde(default)]
        resource_mode: Option<Code<ResourceMode>>,
        #[serde(default)]
        grade: Option<Code<FlowGrade>>,
        #[serde(default)]
        count: Option<f64>,
        #[serde(default)]
        interval_sec: Option<u64>,
        #[serde(default)]
        interval: Option<u64>,
        #[serde(default)]
        interval_unit: Option<Code<IntervalUnit>>,
        #[serde(default)]
        control_behavior: Option<Code<ControlBehavior>>,
        #[serde(default)]
        burst: Option<u64>,
        #[serde(default)]
        max_queueing_timeout_ms: Option<u64>,
        #[serde(default)]
        param_item: Option<ParamItemIn>,
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RuleOut<'a> {
    resource: &'a str,
    resource_mode: i64,
    grade: i64,
    count: f64,
    interval_sec: u64,
    control_behavior: i64,
    burst: u64,
    max_queueing_timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    param_item: Option<ParamItemOut<'a>>,
}

impl Serialize for GatewayFlowRule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RuleOut {
            resource: &self.resource,
            resource_mode: self.resource_mode.code(),
            grade: grade_code(self.grade),
            count: self.count,
            interval_sec: self.interval_sec,
            control_behavior: behavior_code(self.control_behavior),
            burst: self.burst,
            max_queueing_timeout_ms: self.max_queueing_timeout_ms,
            param_item: self.param_item.as_ref().map(|i| ParamItemOut {
                parse_strategy: i.parse_strategy.code(),
                field_name: i.field_name.as_deref(),
                pattern: i.pattern.as_deref(),
                match_strategy: i.match_strategy.code(),
            }),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for GatewayFlowRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RuleIn::deserialize(d)?;
        let interval_sec = match (r.interval_sec, r.interval) {
            (Some(s), _) => s,
            (None, Some(n)) => n
                .checked_mul(or(r.interval_unit, IntervalUnit(1)).0)
                .ok_or_else(|| de::Error::custom("`interval` × `intervalUnit` is too large"))?,
            (None, None) => 1,
        };
        Ok(GatewayFlowRule {
            resource: r.resource.unwrap_or_default(),
            resource_mode: or(r.resource_mode, ResourceMode::RouteId),
            grade: or(r.grade, FlowGrade::Qps),
            count: r.count.unwrap_or(0.0),
            interval_sec,
            control_behavior: or(r.control_behavior, ControlBehavior::Reject),
            burst: r.burst.unwrap_or(0),
            max_queueing_timeout_ms: r.max_queueing_timeout_ms.unwrap_or(500),
            param_item: r.param_item.map(|i| GatewayParamItem {
                parse_strategy: or(i.parse_strategy, ParseStrategy::ClientIp),
                field_name: i.field_name,
                pattern: i.pattern,
                match_strategy: or(i.match_strategy, ParamMatchStrategy::Exact),
            }),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PredicateIn {
    #[serde(default)]
    pattern: Option<String>,
    #[serde(default)]
    match_strategy: Option<Code<UrlMatchStrategy>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PredicateOut<'a> {
    pattern: &'a str,
    match_strategy: i64,
}

with_bookkeeping! {
    struct ApiIn {
        #[serde(default)]
        api_name: Option<String>,
        #[serde(default)]
        predicate_items: Option<Vec<PredicateIn>>,
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiOut<'a> {
    api_name: &'a str,
    predicate_items: Vec<PredicateOut<'a>>,
}

impl Serialize for ApiDefinition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ApiOut {
            api_name: &self.api_name,
            predicate_items: self
                .predicate_items
                .iter()
                .map(|i| PredicateOut { pattern: &i.pattern, match_strategy: i.match_strategy.code() })
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ApiDefinition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let a = ApiIn::deserialize(d)?;
        let predicate_items = a
            .predicate_items
            .unwrap_or_default()
            .into_iter()
            .map(|p| ApiPredicateItem {
                pattern: p.pattern.unwrap_or_default(),
                match_strategy: or(p.match_strategy, UrlMatchStrategy::Exact),
            })
            .collect();
        Ok(ApiDefinition { api_name: a.api_name.unwrap_or_default(), predicate_items })
    }
}
