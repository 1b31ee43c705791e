//! Sentinel's (Java) rule JSON shapes: camelCase names, numeric codes, Java's defaults.
//!
//! Each rule kind has a wire struct (`*Dto`, every field optional so that Java's defaults apply to absent or
//! `null` fields) and a wrapper (`Java*`) that converts to and from the rule type inside deserialization, so
//! a bad code or value is reported with the position the parser knows.

// The tolerated Java fields are read only to be dropped.
#![allow(dead_code)]

use serde::de::{self, Deserializer, IgnoredAny, Unexpected};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::authority::{AuthorityRule, AuthorityStrategy};
use crate::circuit_breaker::{DegradeGrade, DegradeRule};
use crate::flow::{ClusterConfig, ClusterThresholdType, ControlBehavior, FlowGrade, FlowRule, FlowStrategy};
use crate::param_flow::{ItemClass, ParamFlowItem, ParamFlowRule, ParamItemValue};
use crate::system::SystemRule;
use crate::LIMIT_APP_DEFAULT;

// ---------------------------------------------------------------------------------------------------------
// Values as fastjson reads them

/// A number as read from a rule document.
#[derive(Clone, Copy, Debug)]
pub enum Num {
    /// A negative (or any signed) integer.
    I(i64),
    /// A non-negative integer.
    U(u64),
    /// A number with a fraction or an exponent.
    F(f64),
}

/// A numeric field's type, made from a [`Num`] as fastjson makes it: an integer field takes a whole number
/// written with a fraction (`10.0`); a fraction (`1.5`, which fastjson truncates) or an out-of-range value is
/// refused.
pub trait FromNum: Sized {
    /// What the field holds, for error messages.
    const EXPECTED: &'static str;
    /// The value, if `n` is one.
    fn from_num(n: Num) -> Option<Self>;
}

impl FromNum for f64 {
    const EXPECTED: &'static str = "a number";
    fn from_num(n: Num) -> Option<f64> {
        Some(match n {
            Num::I(v) => v as f64,
            Num::U(v) => v as f64,
            Num::F(v) => v,
        })
    }
}

/// 2^63: the first whole `f64` past `i64::MAX`.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

macro_rules! from_num_int {
    ($($t:ty => $expected:literal),+ $(,)?) => {$(
        impl FromNum for $t {
            const EXPECTED: &'static str = $expected;
            fn from_num(n: Num) -> Option<$t> {
                match n {
                    Num::I(v) => <$t>::try_from(v).ok(),
                    Num::U(v) => <$t>::try_from(v).ok(),
                    // Whole and within i64 (2^63, exact as an f64, is out of range): then in range of the type.
                    Num::F(v) if v.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&v) => {
                        <$t>::try_from(v as i64).ok()
                    }
                    Num::F(_) => None,
                }
            }
        }
    )+};
}
from_num_int!(i64 => "an integer", u64 => "a non-negative integer", i32 => "a 32-bit integer",
    u32 => "a non-negative 32-bit integer");

/// A numeric field: a number, or (as fastjson reads it) a string holding one (`"count": "10"`).
#[derive(Clone, Copy, Debug)]
pub struct N<T>(pub T);

impl<'de, T: FromNum> Deserialize<'de> for N<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<T: FromNum> V<T> {
            fn num<E: de::Error>(n: Num) -> Result<N<T>, E> {
                let unexpected = match n {
                    Num::I(v) => Unexpected::Signed(v),
                    Num::U(v) => Unexpected::Unsigned(v),
                    Num::F(v) => Unexpected::Float(v),
                };
                T::from_num(n).map(N).ok_or_else(|| E::invalid_value(unexpected, &T::EXPECTED))
            }
        }
        impl<T: FromNum> de::Visitor<'_> for V<T> {
            type Value = N<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(T::EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<N<T>, E> {
                Self::num(Num::I(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<N<T>, E> {
                Self::num(Num::U(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<N<T>, E> {
                Self::num(Num::F(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<N<T>, E> {
                let t = v.trim();
                let n = match (t.parse::<i64>(), t.parse::<u64>(), t.parse::<f64>()) {
                    (Ok(i), _, _) => Num::I(i),
                    (_, Ok(u), _) => Num::U(u),
                    (_, _, Ok(f)) if !t.is_empty() => Num::F(f),
                    _ => return Err(E::invalid_type(Unexpected::Str(v), &self)),
                };
                Self::num(n)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl<T: Serialize> Serialize for N<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// A boolean field: `true`/`false`, or as fastjson reads one, `"true"`/`"false"` and `1`/`0` (or `"1"`/`"0"`).
#[derive(Clone, Copy, Debug)]
pub struct B(pub bool);

impl<'de> Deserialize<'de> for B {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = B;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a boolean (true or false)")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<B, E> {
                Ok(B(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<B, E> {
                match v {
                    0 => Ok(B(false)),
                    1 => Ok(B(true)),
                    _ => Err(E::invalid_value(Unexpected::Signed(v), &self)),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<B, E> {
                match v {
                    0 => Ok(B(false)),
                    1 => Ok(B(true)),
                    _ => Err(E::invalid_value(Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<B, E> {
                match v.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" => Ok(B(true)),
                    "false" | "0" => Ok(B(false)),
                    _ => Err(E::invalid_value(Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for B {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(self.0)
    }
}

/// An enum carried as one of Java's integer codes.
macro_rules! code {
    ($name:ident, $target:ty, $expected:literal, { $($code:literal => $variant:path),+ $(,)? }) => {
        #[derive(Clone, Copy, Debug)]
        pub struct $name(pub $target);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let N(n) = N::<i64>::deserialize(d)?;
                match n {
                    $($code => Ok($name($variant)),)+
                    _ => Err(de::Error::invalid_value(Unexpected::Signed(n), &$expected)),
                }
            }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_i64(match self.0 { $($variant => $code,)+ })
            }
        }
    };
}

code!(FlowGradeCode, FlowGrade, "0 (thread count) or 1 (QPS)", { 0 => FlowGrade::Thread, 1 => FlowGrade::Qps });
code!(StrategyCode, FlowStrategy, "0 (direct), 1 (relate) or 2 (chain)", {
    0 => FlowStrategy::Direct, 1 => FlowStrategy::Relate, 2 => FlowStrategy::Chain
});
code!(BehaviorCode, ControlBehavior, "0 (reject), 1 (warm up), 2 (rate limiter) or 3 (warm up rate limiter)", {
    0 => ControlBehavior::Reject,
    1 => ControlBehavior::WarmUp,
    2 => ControlBehavior::RateLimiter,
    3 => ControlBehavior::WarmUpRateLimiter,
});
code!(ThresholdCode, ClusterThresholdType, "0 (average local) or 1 (global)", {
    0 => ClusterThresholdType::AvgLocal, 1 => ClusterThresholdType::Global
});
/// Java's `ClusterFlowConfig.strategy`: only 0 (normal) is valid, as `FlowRuleUtil.checkClusterField` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterStrategy {
    /// The only cluster strategy.
    Normal,
}
code!(ClusterStrategyCode, ClusterStrategy, "0 (the only cluster strategy)", { 0 => ClusterStrategy::Normal });
code!(DegradeGradeCode, DegradeGrade, "0 (slow request ratio), 1 (error ratio) or 2 (error count)", {
    0 => DegradeGrade::SlowRequestRatio, 1 => DegradeGrade::ErrorRatio, 2 => DegradeGrade::ErrorCount
});
code!(AuthorityCode, AuthorityStrategy, "0 (white list) or 1 (black list)", {
    0 => AuthorityStrategy::White, 1 => AuthorityStrategy::Black
});

// Every rule struct accepts and drops the fields a Java rule or a dashboard export carries that mean nothing
// to the engine (`app`, `ip`, `port`, `gmtCreate`, `gmtModified`); `id` is kept (it is part of the rule).
// Any other unknown field is an error.

thread_local! {
    /// Whether the document being read is a YAML or TOML file (see [`strict_fields`]).
    static STRICT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the documents deserialized while the guard lives as YAML or TOML: their required fields have no
/// default. A YAML list cut short by a half-written file is still valid YAML (`- resource: b` and no more);
/// were `count` to default to 0 as in Java's JSON, the cut-off rule would block every call.
pub(crate) struct StrictFields(bool);

impl StrictFields {
    pub(crate) fn enter(strict: bool) -> StrictFields {
        StrictFields(STRICT.with(|s| s.replace(strict)))
    }
}

impl Drop for StrictFields {
    fn drop(&mut self) {
        STRICT.with(|s| s.set(self.0));
    }
}

/// In a YAML or TOML document, a field Java's JSON may omit but a complete rule always has must be there.
fn required<T>(value: &Option<T>, field: &str) -> Result<(), String> {
    if value.is_none() && STRICT.with(|s| s.get()) {
        return Err(format!(
            "missing field `{field}` (required in YAML and TOML rules files, where a rule cut short by a \
             half-written file must not load; Java's JSON defaults apply to JSON only)"
        ));
    }
    Ok(())
}

/// A gateway flow rule of a combined document, in Java's gateway JSON: in YAML and TOML its `count` is
/// required, as the other kinds' (a rule cut short would otherwise limit its route or API to 0).
#[cfg(feature = "tower")]
#[derive(Clone, Debug, Serialize)]
#[serde(transparent)]
pub struct GatewayRuleWire(pub crate::web::gateway::GatewayFlowRule);

#[cfg(feature = "tower")]
impl<'de> Deserialize<'de> for GatewayRuleWire {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use crate::web::gateway::GatewayFlowRule;
        if !STRICT.with(|s| s.get()) {
            return GatewayFlowRule::deserialize(d).map(GatewayRuleWire);
        }
        // Read whole first, to see which fields are there. A JSON value holds no NaN or infinity: they read as
        // null, as an empty field (`count:` of a file cut short) does, and null reads as the field's default
        // (a count of 0). YAML and TOML have no use for null here, so any null is refused, naming its field.
        let value = serde_json::Value::deserialize(d)?;
        required(&value.get("count"), "count").map_err(serde::de::Error::custom)?;
        if let Some(field) = null_field(&value, "") {
            return Err(serde::de::Error::custom(format!(
                "field `{field}` is empty or not a finite number (required in YAML and TOML rules files)"
            )));
        }
        serde_json::from_value(value).map(GatewayRuleWire).map_err(serde::de::Error::custom)
    }
}

/// The path of the first null in `value` (`count`, `paramItem.pattern`), if any.
#[cfg(feature = "tower")]
fn null_field(value: &serde_json::Value, path: &str) -> Option<String> {
    let at = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        serde_json::Value::Null => Some(path.to_string()),
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| null_field(v, &at(k))),
        serde_json::Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, v)| null_field(v, &format!("{path}[{i}]")))
        }
        _ => None,
    }
}

fn limit_app_or_default(app: Option<String>) -> String {
    match app {
        Some(a) if !a.trim().is_empty() => a,
        _ => LIMIT_APP_DEFAULT.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Flow

/// `clusterConfig` of a flow or param-flow rule.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfigDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flow_id: Option<N<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    threshold_type: Option<ThresholdCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fallback_to_local_when_fail: Option<B>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sample_count: Option<N<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_interval_ms: Option<N<u64>>,
    /// Ours (Java has no such field): see `ClusterConfig::expected_instances`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expected_instances: Option<N<u32>>,
    #[serde(default, skip_serializing)]
    strategy: Option<ClusterStrategyCode>,
    // Java fields of the token service we accept and do not use.
    #[serde(default, skip_serializing)]
    resource_timeout: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    resource_timeout_strategy: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    acquire_refuse_strategy: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    client_offline_time: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    prefetch_cnt_ratio: Option<IgnoredAny>,
}

impl ClusterConfigDto {
    fn into_config(self, fallback_default: bool) -> ClusterConfig {
        let d = ClusterConfig::default();
        ClusterConfig {
            flow_id: self.flow_id.map(|v| v.0),
            threshold_type: self.threshold_type.map(|c| c.0).unwrap_or(d.threshold_type),
            fallback_to_local_when_fail: self.fallback_to_local_when_fail.map(|v| v.0).unwrap_or(fallback_default),
            sample_count: self.sample_count.map(|v| v.0).unwrap_or(d.sample_count),
            window_interval_ms: self.window_interval_ms.map(|v| v.0).unwrap_or(d.window_interval_ms),
            expected_instances: self.expected_instances.map(|v| v.0),
        }
    }
    fn from_config(c: &ClusterConfig) -> Self {
        ClusterConfigDto {
            flow_id: c.flow_id.map(N),
            threshold_type: Some(ThresholdCode(c.threshold_type)),
            fallback_to_local_when_fail: Some(B(c.fallback_to_local_when_fail)),
            sample_count: Some(N(c.sample_count)),
            window_interval_ms: Some(N(c.window_interval_ms)),
            expected_instances: c.expected_instances.map(N),
            ..Default::default()
        }
    }
}

/// A flow rule as Sentinel writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowRuleDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<N<u64>>,
    resource: String,
    #[serde(default)]
    limit_app: Option<String>,
    #[serde(default)]
    grade: Option<FlowGradeCode>,
    #[serde(default)]
    count: Option<N<f64>>,
    #[serde(default)]
    strategy: Option<StrategyCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ref_resource: Option<String>,
    #[serde(default)]
    control_behavior: Option<BehaviorCode>,
    #[serde(default)]
    warm_up_period_sec: Option<N<u32>>,
    #[serde(default)]
    max_queueing_time_ms: Option<N<u64>>,
    /// An extension of ours (Java reads the cold factor from a system property); written only when not 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cold_factor: Option<N<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_mode: Option<B>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_config: Option<ClusterConfigDto>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<B>,
    #[serde(default, skip_serializing)]
    app: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    ip: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    port: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_create: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_modified: Option<IgnoredAny>,
}

/// A [`FlowRule`] in Sentinel's JSON shape.
#[derive(Clone, Debug)]
pub struct JavaFlowRule(pub FlowRule);

impl TryFrom<FlowRuleDto> for JavaFlowRule {
    type Error = String;
    fn try_from(d: FlowRuleDto) -> Result<Self, String> {
        required(&d.count.map(|v| v.0), "count")?;
        let def = FlowRule::default();
        Ok(JavaFlowRule(FlowRule {
            id: d.id.map(|v| v.0),
            resource: d.resource,
            regex: d.regex.map(|v| v.0).unwrap_or(false),
            limit_app: limit_app_or_default(d.limit_app),
            grade: d.grade.map(|c| c.0).unwrap_or(def.grade),
            count: d.count.map(|v| v.0).unwrap_or(def.count),
            strategy: d.strategy.map(|c| c.0).unwrap_or(def.strategy),
            ref_resource: d.ref_resource.filter(|r| !r.is_empty()),
            control_behavior: d.control_behavior.map(|c| c.0).unwrap_or(def.control_behavior),
            warm_up_period_sec: d.warm_up_period_sec.map(|v| v.0).unwrap_or(def.warm_up_period_sec),
            max_queueing_time_ms: d.max_queueing_time_ms.map(|v| v.0).unwrap_or(def.max_queueing_time_ms),
            cold_factor: d.cold_factor.map(|v| v.0).unwrap_or(def.cold_factor),
            cluster_mode: d.cluster_mode.map(|v| v.0).unwrap_or(false),
            cluster_config: d.cluster_config.map(|c| c.into_config(true)),
        }))
    }
}

impl From<JavaFlowRule> for FlowRuleDto {
    fn from(JavaFlowRule(r): JavaFlowRule) -> Self {
        FlowRuleDto {
            id: r.id.map(N),
            resource: r.resource,
            limit_app: Some(r.limit_app),
            grade: Some(FlowGradeCode(r.grade)),
            count: Some(N(r.count)),
            strategy: Some(StrategyCode(r.strategy)),
            ref_resource: r.ref_resource,
            control_behavior: Some(BehaviorCode(r.control_behavior)),
            warm_up_period_sec: Some(N(r.warm_up_period_sec)),
            max_queueing_time_ms: Some(N(r.max_queueing_time_ms)),
            cold_factor: (r.cold_factor != 3).then_some(N(r.cold_factor)),
            cluster_mode: Some(B(r.cluster_mode)),
            cluster_config: r.cluster_config.as_ref().map(ClusterConfigDto::from_config),
            regex: r.regex.then_some(B(true)),
            app: None,
            ip: None,
            port: None,
            gmt_create: None,
            gmt_modified: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Degrade

/// A degrade rule as Sentinel writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DegradeRuleDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<N<u64>>,
    resource: String,
    #[serde(default)]
    limit_app: Option<String>,
    #[serde(default)]
    grade: Option<DegradeGradeCode>,
    #[serde(default)]
    count: Option<N<f64>>,
    #[serde(default)]
    time_window: Option<N<u32>>,
    #[serde(default)]
    min_request_amount: Option<N<u32>>,
    #[serde(default)]
    stat_interval_ms: Option<N<u32>>,
    #[serde(default)]
    slow_ratio_threshold: Option<N<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<B>,
    #[serde(default, skip_serializing)]
    app: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    ip: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    port: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_create: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_modified: Option<IgnoredAny>,
}

/// A [`DegradeRule`] in Sentinel's JSON shape.
#[derive(Clone, Debug)]
pub struct JavaDegradeRule(pub DegradeRule);

impl TryFrom<DegradeRuleDto> for JavaDegradeRule {
    type Error = String;
    fn try_from(d: DegradeRuleDto) -> Result<Self, String> {
        required(&d.count.map(|v| v.0), "count")?;
        required(&d.time_window.map(|v| v.0), "timeWindow")?;
        let def = DegradeRule::default();
        Ok(JavaDegradeRule(DegradeRule {
            id: d.id.map(|v| v.0),
            resource: d.resource,
            regex: d.regex.map(|v| v.0).unwrap_or(false),
            limit_app: limit_app_or_default(d.limit_app),
            grade: d.grade.map(|c| c.0).unwrap_or(def.grade),
            count: d.count.map(|v| v.0).unwrap_or(def.count),
            time_window_sec: d.time_window.map(|v| v.0).unwrap_or(def.time_window_sec),
            min_request_amount: d.min_request_amount.map(|v| v.0).unwrap_or(def.min_request_amount),
            stat_interval_ms: d.stat_interval_ms.map(|v| v.0).unwrap_or(def.stat_interval_ms),
            slow_ratio_threshold: d.slow_ratio_threshold.map(|v| v.0).unwrap_or(def.slow_ratio_threshold),
        }))
    }
}

impl From<JavaDegradeRule> for DegradeRuleDto {
    fn from(JavaDegradeRule(r): JavaDegradeRule) -> Self {
        DegradeRuleDto {
            id: r.id.map(N),
            resource: r.resource,
            limit_app: Some(r.limit_app),
            grade: Some(DegradeGradeCode(r.grade)),
            count: Some(N(r.count)),
            time_window: Some(N(r.time_window_sec)),
            min_request_amount: Some(N(r.min_request_amount)),
            stat_interval_ms: Some(N(r.stat_interval_ms)),
            slow_ratio_threshold: Some(N(r.slow_ratio_threshold)),
            regex: r.regex.then_some(B(true)),
            app: None,
            ip: None,
            port: None,
            gmt_create: None,
            gmt_modified: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// System

/// A system rule as Sentinel writes it: a negative value (Java writes -1) means "not set".
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SystemRuleDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<N<u64>>,
    #[serde(default)]
    highest_system_load: Option<N<f64>>,
    #[serde(default)]
    highest_cpu_usage: Option<N<f64>>,
    #[serde(default)]
    qps: Option<N<f64>>,
    #[serde(default)]
    avg_rt: Option<N<i64>>,
    #[serde(default)]
    max_thread: Option<N<i64>>,
    // System rules carry AbstractRule's fields in Java; they mean nothing here.
    #[serde(default, skip_serializing)]
    resource: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    limit_app: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    regex: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    app: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    ip: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    port: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_create: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_modified: Option<IgnoredAny>,
}

/// A [`SystemRule`] in Sentinel's JSON shape.
#[derive(Clone, Debug)]
pub struct JavaSystemRule(pub SystemRule);

fn set_f(v: Option<f64>) -> Option<f64> {
    v.filter(|v| *v >= 0.0 || v.is_nan())
}
fn set_i(v: Option<i64>) -> Option<u64> {
    v.filter(|v| *v >= 0).map(|v| v as u64)
}

impl TryFrom<SystemRuleDto> for JavaSystemRule {
    type Error = String;
    fn try_from(d: SystemRuleDto) -> Result<Self, String> {
        Ok(JavaSystemRule(SystemRule {
            id: d.id.map(|v| v.0),
            highest_system_load: set_f(d.highest_system_load.map(|v| v.0)),
            highest_cpu_usage: set_f(d.highest_cpu_usage.map(|v| v.0)),
            qps: set_f(d.qps.map(|v| v.0)),
            avg_rt: set_i(d.avg_rt.map(|v| v.0)),
            max_thread: set_i(d.max_thread.map(|v| v.0)),
        }))
    }
}

impl From<JavaSystemRule> for SystemRuleDto {
    fn from(JavaSystemRule(r): JavaSystemRule) -> Self {
        let unset_f = |v: Option<f64>| Some(N(v.unwrap_or(-1.0)));
        let unset_i = |v: Option<u64>| Some(N(v.map(|v| v.min(i64::MAX as u64) as i64).unwrap_or(-1)));
        SystemRuleDto {
            id: r.id.map(N),
            highest_system_load: unset_f(r.highest_system_load),
            highest_cpu_usage: unset_f(r.highest_cpu_usage),
            qps: unset_f(r.qps),
            avg_rt: unset_i(r.avg_rt),
            max_thread: unset_i(r.max_thread),
            resource: None,
            limit_app: None,
            regex: None,
            app: None,
            ip: None,
            port: None,
            gmt_create: None,
            gmt_modified: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Authority

/// An authority rule as Sentinel writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorityRuleDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<N<u64>>,
    resource: String,
    #[serde(default)]
    limit_app: Option<String>,
    #[serde(default)]
    strategy: Option<AuthorityCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<B>,
    #[serde(default, skip_serializing)]
    app: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    ip: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    port: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_create: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_modified: Option<IgnoredAny>,
}

/// An [`AuthorityRule`] in Sentinel's JSON shape.
#[derive(Clone, Debug)]
pub struct JavaAuthorityRule(pub AuthorityRule);

impl TryFrom<AuthorityRuleDto> for JavaAuthorityRule {
    type Error = String;
    fn try_from(d: AuthorityRuleDto) -> Result<Self, String> {
        required(&d.limit_app, "limitApp")?;
        Ok(JavaAuthorityRule(AuthorityRule {
            id: d.id.map(|v| v.0),
            resource: d.resource,
            regex: d.regex.map(|v| v.0).unwrap_or(false),
            // The origin list is kept as given: an empty list is the rule's own (invalid) business.
            limit_app: d.limit_app.unwrap_or_default(),
            strategy: d.strategy.map(|c| c.0).unwrap_or_default(),
        }))
    }
}

impl From<JavaAuthorityRule> for AuthorityRuleDto {
    fn from(JavaAuthorityRule(r): JavaAuthorityRule) -> Self {
        AuthorityRuleDto {
            id: r.id.map(N),
            resource: r.resource,
            limit_app: Some(r.limit_app),
            strategy: Some(AuthorityCode(r.strategy)),
            regex: r.regex.then_some(B(true)),
            app: None,
            ip: None,
            port: None,
            gmt_create: None,
            gmt_modified: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Param flow

/// A scalar written as text: Java's `object` is a String, but hand-written files often hold a bare number.
#[derive(Debug)]
pub struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_char<E: de::Error>(self, v: char) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// An item count: written as an integer when it is one (Java's `Integer`).
#[derive(Debug)]
pub struct ItemCount(f64);

impl<'de> Deserialize<'de> for ItemCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        N::<f64>::deserialize(d).map(|n| ItemCount(n.0))
    }
}

impl Serialize for ItemCount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.fract() == 0.0 && self.0.abs() < 9.0e15 {
            s.serialize_i64(self.0 as i64)
        } else {
            s.serialize_f64(self.0)
        }
    }
}

/// One `paramFlowItemList` entry.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParamItemDto {
    object: Text,
    count: ItemCount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    class_type: Option<String>,
}

/// A [`ParamFlowItem`] in Sentinel's JSON shape.
#[derive(Clone, Debug)]
pub struct JavaParamItem(pub ParamFlowItem);

fn parse_int(text: &str, class: &str, min: i64, max: i64) -> Result<ParamItemValue, String> {
    match text.trim().parse::<i64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(ParamItemValue::Int(v)),
        _ => Err(format!("`object` \"{text}\" is not a valid {class}")),
    }
}

/// The numeric class a `classType` names, primitive or boxed (kept on the item to be written back as pushed).
fn item_class(class_type: Option<&str>) -> Option<ItemClass> {
    match class_type.map(str::trim).unwrap_or("") {
        "int" | "java.lang.Integer" => Some(ItemClass::Int),
        "long" | "java.lang.Long" => Some(ItemClass::Long),
        "short" | "java.lang.Short" => Some(ItemClass::Short),
        "byte" | "java.lang.Byte" => Some(ItemClass::Byte),
        "float" | "java.lang.Float" => Some(ItemClass::Float),
        "double" | "java.lang.Double" => Some(ItemClass::Double),
        _ => None,
    }
}

/// Java's `ParamFlowRuleUtil.parseItemValue`: the class names Java knows, primitive or boxed.
pub(crate) fn parse_item_value(text: &str, class_type: Option<&str>) -> Result<ParamItemValue, String> {
    let class = class_type.map(str::trim).unwrap_or("");
    match class {
        "" | "String" | "java.lang.String" => Ok(ParamItemValue::Str(text.to_string())),
        "int" | "java.lang.Integer" => parse_int(text, class, i32::MIN as i64, i32::MAX as i64),
        "long" | "java.lang.Long" => parse_int(text, class, i64::MIN, i64::MAX),
        "short" | "java.lang.Short" => parse_int(text, class, i16::MIN as i64, i16::MAX as i64),
        "byte" | "java.lang.Byte" => parse_int(text, class, i8::MIN as i64, i8::MAX as i64),
        "double" | "java.lang.Double" => text
            .trim()
            .parse::<f64>()
            .map(ParamItemValue::Float)
            .map_err(|_| format!("`object` \"{text}\" is not a valid {class}")),
        // Java's `Float.parseFloat`: the nearest `f32`, which an `f32` argument equals once widened ("1.1" as a
        // double would never match the `f32` 1.1, and would match the double 1.1, which a Java float does not).
        "float" | "java.lang.Float" => text
            .trim()
            .parse::<f32>()
            .map(|v| ParamItemValue::Float(f64::from(v)))
            .map_err(|_| format!("`object` \"{text}\" is not a valid {class}")),
        "boolean" | "java.lang.Boolean" => match text.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(ParamItemValue::Bool(true)),
            "false" => Ok(ParamItemValue::Bool(false)),
            _ => Err(format!("`object` \"{text}\" is not a boolean (true or false)")),
        },
        "char" | "java.lang.Character" => {
            text.chars().next().map(ParamItemValue::Char).ok_or_else(|| "`object` is empty for a char".to_string())
        }
        other => {
            // Java treats an unknown class as a string; so do we, with a warning (a typo like "Integer" is
            // a classic reason why an item never matches).
            tracing::warn!(class_type = other, "unknown param item classType: the value is matched as a string");
            Ok(ParamItemValue::Str(text.to_string()))
        }
    }
}

impl TryFrom<ParamItemDto> for JavaParamItem {
    type Error = String;
    fn try_from(d: ParamItemDto) -> Result<Self, String> {
        let value = parse_item_value(&d.object.0, d.class_type.as_deref())?;
        let class = item_class(d.class_type.as_deref());
        Ok(JavaParamItem(ParamFlowItem { value, count: d.count.0, class }))
    }
}

/// A float item's `object`, for its class ([`ParamFlowItem::class_type`]). A `float` item holds its `f32`
/// value widened (1.1 is kept as 1.100000023841858) and is written as the `f32` (`"1.1"`), as Java gives it
/// back; a `double` as the `f64`. Infinities are written as Java's `Double.parseDouble` reads them.
fn float_item_text(v: f64, class: Option<ItemClass>) -> String {
    let text = if class == Some(ItemClass::Float) { format!("{:?}", v as f32) } else { format!("{v:?}") };
    match text.as_str() {
        "inf" => "Infinity".to_string(),
        "-inf" => "-Infinity".to_string(),
        _ => text,
    }
}

impl From<JavaParamItem> for ParamItemDto {
    fn from(JavaParamItem(i): JavaParamItem) -> Self {
        // Numbers with the class they were pushed with (Java matches by it, and gives it back as pushed).
        let class = i.class_type();
        let numeric = class.map_or("", ItemClass::java_name);
        let (object, class) = match i.value {
            ParamItemValue::Int(v) => (v.to_string(), numeric),
            ParamItemValue::Float(v) => (float_item_text(v, class), numeric),
            ParamItemValue::Str(s) => (s, "java.lang.String"),
            ParamItemValue::Bool(b) => (b.to_string(), "boolean"),
            ParamItemValue::Char(c) => (c.to_string(), "char"),
        };
        ParamItemDto { object: Text(object), count: ItemCount(i.count), class_type: Some(class.to_string()) }
    }
}

/// The wire form of [`JavaParamItem`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "ParamItemDto", into = "ParamItemDto")]
pub struct ParamItemWire(JavaParamItem);

impl TryFrom<ParamItemDto> for ParamItemWire {
    type Error = String;
    fn try_from(d: ParamItemDto) -> Result<Self, String> {
        JavaParamItem::try_from(d).map(ParamItemWire)
    }
}
impl From<ParamItemWire> for ParamItemDto {
    fn from(w: ParamItemWire) -> Self {
        w.0.into()
    }
}

/// A param-flow rule as Sentinel writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParamFlowRuleDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<N<u64>>,
    resource: String,
    #[serde(default)]
    limit_app: Option<String>,
    #[serde(default)]
    grade: Option<FlowGradeCode>,
    /// Required, as in Java (`paramIdx` null is an invalid rule there).
    param_idx: N<i32>,
    #[serde(default)]
    count: Option<N<f64>>,
    #[serde(default)]
    control_behavior: Option<BehaviorCode>,
    #[serde(default)]
    max_queueing_time_ms: Option<N<u64>>,
    #[serde(default)]
    burst_count: Option<N<u64>>,
    #[serde(default)]
    duration_in_sec: Option<N<u64>>,
    #[serde(default)]
    param_flow_item_list: Option<Vec<ParamItemWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_mode: Option<B>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_config: Option<ClusterConfigDto>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<B>,
    /// Java's parsed copy of the items (internal; some exports carry it).
    #[serde(default, skip_serializing)]
    hot_items: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    app: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    ip: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    port: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_create: Option<IgnoredAny>,
    #[serde(default, skip_serializing)]
    gmt_modified: Option<IgnoredAny>,
}

/// A [`ParamFlowRule`] in Sentinel's JSON shape.
#[derive(Clone, Debug)]
pub struct JavaParamFlowRule(pub ParamFlowRule);

impl TryFrom<ParamFlowRuleDto> for JavaParamFlowRule {
    type Error = String;
    fn try_from(d: ParamFlowRuleDto) -> Result<Self, String> {
        required(&d.count.map(|v| v.0), "count")?;
        let def = ParamFlowRule::default();
        Ok(JavaParamFlowRule(ParamFlowRule {
            id: d.id.map(|v| v.0),
            resource: d.resource,
            limit_app: limit_app_or_default(d.limit_app),
            param_idx: d.param_idx.0,
            grade: d.grade.map(|c| c.0).unwrap_or(def.grade),
            count: d.count.map(|v| v.0).unwrap_or(def.count),
            control_behavior: d.control_behavior.map(|c| c.0).unwrap_or(def.control_behavior),
            max_queueing_time_ms: d.max_queueing_time_ms.map(|v| v.0).unwrap_or(def.max_queueing_time_ms),
            burst_count: d.burst_count.map(|v| v.0).unwrap_or(def.burst_count),
            duration_in_sec: d.duration_in_sec.map(|v| v.0).unwrap_or(def.duration_in_sec),
            items: d.param_flow_item_list.unwrap_or_default().into_iter().map(|w| w.0 .0).collect(),
            cluster_mode: d.cluster_mode.map(|v| v.0).unwrap_or(false),
            // Java's param cluster config falls back to local limiting only when told to.
            cluster_config: d.cluster_config.map(|c| c.into_config(false)),
            regex: d.regex.map(|v| v.0).unwrap_or(false),
        }))
    }
}

impl From<JavaParamFlowRule> for ParamFlowRuleDto {
    fn from(JavaParamFlowRule(r): JavaParamFlowRule) -> Self {
        ParamFlowRuleDto {
            id: r.id.map(N),
            resource: r.resource,
            limit_app: Some(r.limit_app),
            grade: Some(FlowGradeCode(r.grade)),
            param_idx: N(r.param_idx),
            count: Some(N(r.count)),
            control_behavior: Some(BehaviorCode(r.control_behavior)),
            max_queueing_time_ms: Some(N(r.max_queueing_time_ms)),
            burst_count: Some(N(r.burst_count)),
            duration_in_sec: Some(N(r.duration_in_sec)),
            param_flow_item_list: Some(r.items.into_iter().map(|i| ParamItemWire(JavaParamItem(i))).collect()),
            cluster_mode: Some(B(r.cluster_mode)),
            cluster_config: r.cluster_config.as_ref().map(ClusterConfigDto::from_config),
            regex: r.regex.then_some(B(true)),
            hot_items: None,
            app: None,
            ip: None,
            port: None,
            gmt_create: None,
            gmt_modified: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Wire wrappers: the rule types as (de)serialized.

macro_rules! wire_impls {
    ($wire:ident, $java:ident, $dto:ident) => {
        impl TryFrom<$dto> for $wire {
            type Error = String;
            fn try_from(d: $dto) -> Result<Self, String> {
                $java::try_from(d).map($wire)
            }
        }
        impl From<$wire> for $dto {
            fn from(w: $wire) -> Self {
                w.0.into()
            }
        }
    };
}

/// The serde form of a flow rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "FlowRuleDto", into = "FlowRuleDto")]
pub struct FlowWire(pub JavaFlowRule);
/// The serde form of a degrade rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "DegradeRuleDto", into = "DegradeRuleDto")]
pub struct DegradeWire(pub JavaDegradeRule);
/// The serde form of a system rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "SystemRuleDto", into = "SystemRuleDto")]
pub struct SystemWire(pub JavaSystemRule);
/// The serde form of an authority rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "AuthorityRuleDto", into = "AuthorityRuleDto")]
pub struct AuthorityWire(pub JavaAuthorityRule);
/// The serde form of a param-flow rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "ParamFlowRuleDto", into = "ParamFlowRuleDto")]
pub struct ParamFlowWire(pub JavaParamFlowRule);

wire_impls!(FlowWire, JavaFlowRule, FlowRuleDto);
wire_impls!(DegradeWire, JavaDegradeRule, DegradeRuleDto);
wire_impls!(SystemWire, JavaSystemRule, SystemRuleDto);
wire_impls!(AuthorityWire, JavaAuthorityRule, AuthorityRuleDto);
wire_impls!(ParamFlowWire, JavaParamFlowRule, ParamFlowRuleDto);

/// Rules of every kind in one document: `{"flowRules": [...], "degradeRules": [...], ...}`. A kind that is
/// absent is not managed by the document (its rules in force are left alone); an empty list clears it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSetDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_rules: Option<Vec<FlowWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degrade_rules: Option<Vec<DegradeWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_rules: Option<Vec<SystemWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority_rules: Option<Vec<AuthorityWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_flow_rules: Option<Vec<ParamFlowWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_rules: Option<Vec<crate::adaptive::AdaptiveRule>>,
    #[cfg(feature = "tower")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw_flow_rules: Option<Vec<GatewayRuleWire>>,
    #[cfg(feature = "tower")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw_api_definitions: Option<Vec<crate::web::gateway::ApiDefinition>>,
}
