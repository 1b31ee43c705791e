//! Rules as data: Sentinel's own rule JSON (and the same fields in YAML and TOML), and a file data source
//! that hot-reloads a rules file or directory.
//!
//! The stores rules live in: [`FileDataSource`], Redis (`cluster::RedisDataSource`, feature
//! `cluster-redis`), ZooKeeper (`ZookeeperDataSource`, feature `zookeeper`) and etcd (`EtcdDataSource`,
//! feature `etcd`). Each is a [`WritableDataSource`], the interface the command center writes pushed rules
//! back through; a store of your own implements it too.
//!
//! # The format
//! Field names and numeric codes are Java Sentinel's, so a rule set exported from a Java setup (a dashboard
//! push to a config center, `getRules` output, a `FileRefreshableDataSource` file) loads as it is:
//!
//! | kind | fields (codes) |
//! |------|----------------|
//! | flow | `resource`, `limitApp`, `grade` (0 thread, 1 QPS), `count`, `strategy` (0 direct, 1 relate, 2 chain), `refResource`, `controlBehavior` (0 reject, 1 warm up, 2 rate limiter, 3 warm up + rate limiter), `warmUpPeriodSec`, `maxQueueingTimeMs`, `clusterMode`, `clusterConfig` {`flowId`, `thresholdType` (0 avg local, 1 global), `fallbackToLocalWhenFail`, `sampleCount`, `windowIntervalMs`} |
//! | degrade | `resource`, `limitApp`, `grade` (0 slow ratio, 1 error ratio, 2 error count), `count`, `timeWindow`, `minRequestAmount`, `statIntervalMs`, `slowRatioThreshold` |
//! | system | `highestSystemLoad`, `highestCpuUsage`, `qps`, `avgRt`, `maxThread` (negative, e.g. Java's -1, = not set) |
//! | authority | `resource`, `limitApp` (comma-separated origins), `strategy` (0 white, 1 black) |
//! | adaptive | no Java form: `resource`, `regex`, `algorithm`, `minLimit`, `initialLimit`, `maxLimit`, `maxWaitMs`, `partitions`, ... (see [`crate::adaptive`]) |
//! | param flow | `resource`, `paramIdx` (required), `grade`, `count`, `controlBehavior`, `maxQueueingTimeMs`, `burstCount`, `durationInSec`, `paramFlowItemList` [{`object`, `count`, `classType`}], `clusterMode`, `clusterConfig` |
//!
//! Values are read as fastjson reads them: a number may be written as a string (`"count": "10"`), an integer
//! field takes a whole number written with a fraction (`10.0`) but refuses a fraction (`1.5`, which fastjson
//! truncates silently), and a boolean may be written as `"true"`/`"false"` or `1`/`0`. So is the syntax: a
//! hand-written document with fastjson's default leniency (unquoted field names, single-quoted strings, extra
//! commas such as a trailing one, `//` and `/* */` comments) loads, as Java loads it.
//!
//! In JSON, absent (or `null`) fields take Java's defaults (`resource` is required, as Java's rule managers
//! refuse a rule without one). Every rule may carry `id` (kept).
//!
//! **Required fields in YAML and TOML.** These formats have no Java legacy, and a file cut short by a writer
//! that is not atomic is often still valid YAML (`- resource: b` and nothing more): with Java's defaults the
//! cut-off rule would load with `count` 0 and block every call. So in YAML and TOML the fields a complete
//! rule always has are required, and a rule without one is an error naming the field: `count` (flow,
//! degrade, param flow), `timeWindow` (degrade; Java refuses 0, its default), `limitApp` (authority; Java
//! refuses an empty one), besides `resource` and `paramIdx`. System rules have none (each threshold is
//! optional). A file cut inside a number (`count: 1` of `count: 100`) still parses: write rules files
//! atomically (write a temporary file, then rename it over the rules file) where that matters.
//!
//! **Unknown fields.** Java (fastjson) ignores every unknown field, which hides typos (`"grad": 0` silently
//! becomes a QPS rule). We accept the fields Java's rule classes and the dashboard's rule entities really
//! carry — `app`, `ip`, `port`, `gmtCreate`, `gmtModified`, `hotItems`, and the token-service fields of
//! `clusterConfig` (`strategy`, `resourceTimeout`, `resourceTimeoutStrategy`, `acquireRefuseStrategy`,
//! `clientOfflineTime`, `prefetchCntRatio`) — and report any other as an error with its line and path.
//!
//! **`regex`.** Flow, degrade, authority and hot-parameter rules with `"regex": true` load as they are:
//! `resource` is a pattern over whole resource names and each matching resource is governed separately (see
//! [`crate::pattern`]); a pattern that does not compile is a [`RuleError`] at load, naming
//! the rule. A regex hot-parameter rule must use the default behaviour and no cluster mode, as in Java.
//!
//! **Param item values.** `classType` is read as Java reads it (`int`/`java.lang.Integer`, `long`, `short`,
//! `byte` → integer; `double`/`float` → float; `boolean`; `char`; `String`/`java.lang.String` or none →
//! string; an unknown class → string, with a warning). Unlike Java, a value that does not parse as its class
//! (`"abc"` as `int`, `"yes"` as `boolean`) is an error instead of a silently dropped item.
//!
//! # Documents
//! * One kind per document (Java's files): a list of rules — a JSON or YAML array; in TOML, `[[rules]]`
//!   tables. See [`parse_rules`] / [`rules_to_string`].
//! * All kinds in one document ([`RuleSet`]): `{"flowRules": [...], "degradeRules": [...], "systemRules":
//!   [...], "authorityRules": [...], "paramFlowRules": [...], "adaptiveRules": [...]}`. A kind left out is not managed by the document.
//! * The gateway's lists (feature `tower`; Java's gateway JSON, see
//!   [`web::gateway::json`](crate::web::gateway::json)): in a combined document under `gwFlowRules` (gateway
//!   flow rules) and `gwApiDefinitions` (API definitions), loaded with the rest as one change
//!   ([`RuleSet::apply_all`]); as Java's files `gw-flow-rules.json` and `gw-api-definitions.json`, alone or
//!   in a rules directory; in Redis, etcd and ZooKeeper as a key or node of their own
//!   (`gateway_rules(..)`, `api_definitions(..)` on each builder) or in a combined one. A gateway list that
//!   does not parse or that the engine refuses is an error naming the document and the field, and nothing
//!   of that document is applied.
//!
//! ```
//! use sentinel_runtime::datasource::{parse_rules, Format};
//! use sentinel_runtime::flow::{FlowRule, FlowGrade};
//! let rules: Vec<FlowRule> =
//!     parse_rules(r#"[{"resource": "getUser", "grade": 1, "count": 20, "limitApp": "default"}]"#, Format::Json)
//!         .unwrap();
//! assert_eq!(rules[0].grade, FlowGrade::Qps);
//! assert_eq!(rules[0].count, 20.0);
//! ```

#[cfg(any(feature = "etcd", feature = "zookeeper", feature = "cluster-redis"))]
pub(crate) mod entry;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod file;
#[cfg(all(test, any(feature = "etcd", feature = "zookeeper", feature = "cluster-redis")))]
pub(crate) mod gate;
#[cfg(feature = "tower")]
mod gateway;
mod java;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod remote;
#[cfg(feature = "file-watch")]
mod watch;
mod writable;
#[cfg(feature = "zookeeper")]
mod zookeeper;

pub use error::{ApplyError, ParseError, SerializeError, SourceError, WriteError};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdDataSource, EtcdDataSourceBuilder, EtcdReload, EtcdSourceError};
pub use file::{FileDataSource, FileLimits, Reloaded};
#[cfg(feature = "tower")]
pub use gateway::{GatewayDocumentError, GatewayDocuments, API_DEFINITIONS_FILE_STEM, GATEWAY_RULES_FILE_STEM};
#[cfg(feature = "file-watch")]
pub use watch::{WatchError, Watcher};
#[cfg(any(feature = "etcd", feature = "zookeeper", feature = "cluster-redis"))]
pub(crate) use writable::now_ms;
pub use writable::{SourceStatus, WritableDataSource, WriteBackError};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{ZookeeperDataSource, ZookeeperDataSourceBuilder, ZookeeperReload, ZookeeperSourceError};

use std::fmt;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::adaptive::AdaptiveRule;
use crate::authority::AuthorityRule;
use crate::circuit_breaker::DegradeRule;
use crate::flow::FlowRule;
use crate::param_flow::ParamFlowRule;
use crate::system::SystemRule;
use crate::{RuleError, RuleKind, Sentinel};

/// A document format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// JSON (Sentinel's own).
    Json,
    /// YAML, same field names.
    Yaml,
    /// TOML, same field names.
    Toml,
}

impl Format {
    /// The format a file's extension names (`.json`, `.yaml`/`.yml`, `.toml`), if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
    /// The usual file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Yaml => "yaml",
            Format::Toml => "toml",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
        })
    }
}

mod sealed {
    pub trait Sealed {
        type Wire: serde::Serialize + serde::de::DeserializeOwned + Clone;
        fn wrap(self) -> Self::Wire;
        fn unwrap(w: Self::Wire) -> Self;
    }
}

/// A rule type with a Sentinel data format: [`FlowRule`], [`DegradeRule`], [`SystemRule`],
/// [`AuthorityRule`], [`ParamFlowRule`].
pub trait RuleData: Clone + Sized + sealed::Sealed {
    /// The kind.
    const KIND: RuleKind;
    /// The key of this kind in a [`RuleSet`] document (`flowRules`, ...).
    const KEY: &'static str;
    /// The stem of this kind's file in a rules directory (`flow-rules`, ...).
    const FILE_STEM: &'static str;
}

macro_rules! rule_data {
    ($rule:ty, $wire:ident, $java:ident, $kind:expr, $key:literal, $stem:literal) => {
        impl sealed::Sealed for $rule {
            type Wire = java::$wire;
            fn wrap(self) -> java::$wire {
                java::$wire(java::$java(self))
            }
            fn unwrap(w: java::$wire) -> Self {
                w.0 .0
            }
        }
        impl RuleData for $rule {
            const KIND: RuleKind = $kind;
            const KEY: &'static str = $key;
            const FILE_STEM: &'static str = $stem;
        }
    };
}

rule_data!(FlowRule, FlowWire, JavaFlowRule, RuleKind::Flow, "flowRules", "flow-rules");
rule_data!(DegradeRule, DegradeWire, JavaDegradeRule, RuleKind::Degrade, "degradeRules", "degrade-rules");
rule_data!(SystemRule, SystemWire, JavaSystemRule, RuleKind::System, "systemRules", "system-rules");
rule_data!(AuthorityRule, AuthorityWire, JavaAuthorityRule, RuleKind::Authority, "authorityRules", "authority-rules");
rule_data!(ParamFlowRule, ParamFlowWire, JavaParamFlowRule, RuleKind::ParamFlow, "paramFlowRules", "param-flow-rules");

// Adaptive rules have no Java form: their own serde shape (see `crate::adaptive`) is the wire format.
impl sealed::Sealed for AdaptiveRule {
    type Wire = AdaptiveRule;
    fn wrap(self) -> AdaptiveRule {
        self
    }
    fn unwrap(w: AdaptiveRule) -> Self {
        w
    }
}
impl RuleData for AdaptiveRule {
    const KIND: RuleKind = RuleKind::Adaptive;
    const KEY: &'static str = "adaptiveRules";
    const FILE_STEM: &'static str = "adaptive-rules";
}

/// The file stem of a kind's file in a rules directory.
pub fn file_stem(kind: RuleKind) -> &'static str {
    match kind {
        RuleKind::Flow => FlowRule::FILE_STEM,
        RuleKind::Degrade => DegradeRule::FILE_STEM,
        RuleKind::System => SystemRule::FILE_STEM,
        RuleKind::Authority => AuthorityRule::FILE_STEM,
        RuleKind::ParamFlow => ParamFlowRule::FILE_STEM,
        RuleKind::Adaptive => AdaptiveRule::FILE_STEM,
    }
}

/// Every kind, in the order a [`RuleSet`] is applied.
pub const ALL_KINDS: [RuleKind; 6] =
    [RuleKind::Authority, RuleKind::System, RuleKind::ParamFlow, RuleKind::Flow, RuleKind::Degrade, RuleKind::Adaptive];

/// TOML documents must be tables: a single kind's list sits under `rules`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlList<W> {
    rules: Vec<W>,
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let col = before.iter().rev().take_while(|b| **b != b'\n').count() + 1;
    (line, col)
}

fn field_of(path: &serde_path_to_error::Path) -> Option<String> {
    let p = path.to_string();
    // `?` stands for a key the parser had not finished reading (e.g. a file cut in the middle of one).
    let p = p.trim_end_matches(".?").trim_end_matches('?');
    (p != "." && !p.is_empty()).then(|| p.to_string())
}

/// `text` without its UTF-8 byte order mark, if it starts with one (as files saved by Windows editors do):
/// fastjson skips it, so Java loads such a document.
pub(crate) fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Deserializes `text` in `format`, reporting the line, column and field path of the first problem.
pub(crate) fn from_text<T: DeserializeOwned>(text: &str, format: Format) -> Result<T, ParseError> {
    let text = strip_bom(text);
    let _strict = java::StrictFields::enter(format != Format::Json);
    match format {
        Format::Json => {
            let strict = |text: &str| -> Result<T, ParseError> {
                let mut de = serde_json::Deserializer::from_str(text);
                let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let field = field_of(e.path());
                    let inner = e.into_inner();
                    let (line, column) = (Some(inner.line()), Some(inner.column()));
                    ParseError::new(format, line, column, field, strip_json_position(&inner))
                })?;
                de.end().map_err(|e| {
                    ParseError::new(format, Some(e.line()), Some(e.column()), None, strip_json_position(&e))
                })?;
                Ok(value)
            };
            // fastjson's default leniency (unquoted field names, single quotes, extra commas), as Java reads a
            // hand-written document: read again made strict (an error then names the line of the text).
            strict(text).or_else(|e| match crate::lenient_json::strict_json(text) {
                Some(made_strict) => strict(&made_strict),
                None => Err(e),
            })
        }
        Format::Yaml => {
            if let Some(at) = yaml_flow_too_deep(text) {
                let (line, col) = line_col(text, at);
                let message = format!("flow collections ([ or {{) nested more than {MAX_YAML_FLOW_DEPTH} levels deep");
                return Err(ParseError::new(format, Some(line), Some(col), None, message));
            }
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let field = field_of(e.path());
                let inner = e.into_inner();
                let (line, col) = match inner.location() {
                    Some(l) => (Some(l.line()), Some(l.column())),
                    None => (None, None),
                };
                ParseError::new(format, line, col, field, strip_yaml_position(&inner.to_string()))
            })
        }
        Format::Toml => {
            let de = toml::Deserializer::parse(text).map_err(|e| toml_error(text, None, e))?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let field = field_of(e.path());
                toml_error(text, field, e.into_inner())
            })
        }
    }
}

/// Flow collections (`[`, `{`) a YAML document may nest: deeper ones are refused before it is parsed. libyaml's
/// parser (which ours is a translation of) takes time in the square of that depth: 10,000, 20,000 and 40,000
/// unclosed `[` took 0.16, 0.61 and 2.4 s, so a file at the size cap would hold the thread that reloads rules
/// for days. A rule document nests a few levels.
const MAX_YAML_FLOW_DEPTH: usize = 64;

/// Where the document first opens a flow collection deeper than [`MAX_YAML_FLOW_DEPTH`], if it does. Counts
/// every bracket, quoted or not: a document refused for brackets in its text would hold more than 64 of them
/// unclosed.
fn yaml_flow_too_deep(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in text.bytes().enumerate() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_YAML_FLOW_DEPTH {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn toml_error(text: &str, field: Option<String>, e: toml::de::Error) -> ParseError {
    let (line, col) = match e.span() {
        Some(span) => {
            let (l, c) = line_col(text, span.start);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    ParseError::new(Format::Toml, line, col, field, e.message().to_string())
}

/// serde_json appends " at line L column C" to its messages: we report the position separately.
fn strip_json_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// serde_yaml prefixes its messages with the path (`.[0]: `) and appends the position: both are reported
/// separately.
fn strip_yaml_position(s: &str) -> String {
    let s = match s.rfind(" at line ") {
        Some(i) => &s[..i],
        None => s,
    };
    match s.split_once(": ") {
        Some((path, rest)) if path.starts_with('.') || path.starts_with('[') => rest.to_string(),
        _ => s.to_string(),
    }
}

pub(crate) fn to_text<T: Serialize>(value: &T, format: Format) -> Result<String, SerializeError> {
    match format {
        Format::Json => serde_json::to_string_pretty(value).map_err(|e| SerializeError::new(format, e.to_string())),
        Format::Yaml => serde_yaml_ng::to_string(value).map_err(|e| SerializeError::new(format, e.to_string())),
        Format::Toml => toml::to_string_pretty(value).map_err(|e| SerializeError::new(format, e.to_string())),
    }
}

/// Parses one kind's rules: a JSON or YAML list, or TOML `[[rules]]` tables.
///
/// Errors carry the line, column and path of the first problem (syntax, wrong type, unknown field, bad
/// code). The rules are not validated here: the engine validates them when they are loaded.
pub fn parse_rules<R: RuleData>(text: &str, format: Format) -> Result<Vec<R>, ParseError> {
    let wires: Vec<R::Wire> = match format {
        Format::Toml => from_text::<TomlList<R::Wire>>(text, format)?.rules,
        _ => from_text(text, format)?,
    };
    Ok(wires.into_iter().map(R::unwrap).collect())
}

/// Writes one kind's rules in Sentinel's shape (the inverse of [`parse_rules`]).
pub fn rules_to_string<R: RuleData>(rules: &[R], format: Format) -> Result<String, SerializeError> {
    let wires: Vec<R::Wire> = rules.iter().cloned().map(R::wrap).collect();
    match format {
        Format::Toml => to_text(&TomlList { rules: wires }, format),
        _ => to_text(&wires, format),
    }
}

/// Rules of any kinds, as one document holds them. `None` means "this document does not manage that kind".
///
/// New rule kinds add fields, so the set is built with [`RuleSet::new`] and its `with_*` methods (or
/// [`RuleSet::default`]) rather than a struct literal; the fields stay public for reading and changing.
///
/// ```
/// use sentinel_runtime::adaptive::AdaptiveRule;
/// use sentinel_runtime::datasource::RuleSet;
/// use sentinel_runtime::flow::FlowRule;
/// let set = RuleSet::new()
///     .with_flow(vec![FlowRule::new("api").count(5.0)])
///     .with_adaptive(vec![AdaptiveRule::new("db")]);
/// assert_eq!(set.len(), 2);
/// assert!(set.degrade.is_none(), "not managed by this set");
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct RuleSet {
    /// Flow rules.
    pub flow: Option<Vec<FlowRule>>,
    /// Degrade (circuit breaker) rules.
    pub degrade: Option<Vec<DegradeRule>>,
    /// System rules.
    pub system: Option<Vec<SystemRule>>,
    /// Authority rules.
    pub authority: Option<Vec<AuthorityRule>>,
    /// Hot-parameter rules.
    pub param_flow: Option<Vec<ParamFlowRule>>,
    /// Adaptive concurrency rules (`adaptiveRules`; their own shape, see [`crate::adaptive`]).
    pub adaptive: Option<Vec<AdaptiveRule>>,
    /// Gateway flow rules and API definitions (`gwFlowRules`, `gwApiDefinitions`, in Java's gateway JSON;
    /// feature `tower`). Loaded by [`apply_all`](RuleSet::apply_all), not by [`apply`](RuleSet::apply).
    #[cfg(feature = "tower")]
    pub gateway: GatewayDocuments,
}

fn unwrap_all<R: RuleData>(v: Option<Vec<R::Wire>>) -> Option<Vec<R>> {
    v.map(|v| v.into_iter().map(R::unwrap).collect())
}
fn wrap_all<R: RuleData>(v: &Option<Vec<R>>) -> Option<Vec<R::Wire>> {
    v.as_ref().map(|v| v.iter().cloned().map(R::wrap).collect())
}

impl RuleSet {
    /// A set that manages no kind (the same as [`RuleSet::default`]).
    pub fn new() -> RuleSet {
        RuleSet::default()
    }
    /// The set managing flow rules: `rules`.
    pub fn with_flow(mut self, rules: Vec<FlowRule>) -> RuleSet {
        self.flow = Some(rules);
        self
    }
    /// The set managing degrade (circuit breaker) rules: `rules`.
    pub fn with_degrade(mut self, rules: Vec<DegradeRule>) -> RuleSet {
        self.degrade = Some(rules);
        self
    }
    /// The set managing system rules: `rules`.
    pub fn with_system(mut self, rules: Vec<SystemRule>) -> RuleSet {
        self.system = Some(rules);
        self
    }
    /// The set managing authority rules: `rules`.
    pub fn with_authority(mut self, rules: Vec<AuthorityRule>) -> RuleSet {
        self.authority = Some(rules);
        self
    }
    /// The set managing hot-parameter rules: `rules`.
    pub fn with_param_flow(mut self, rules: Vec<ParamFlowRule>) -> RuleSet {
        self.param_flow = Some(rules);
        self
    }
    /// The set managing adaptive concurrency rules: `rules`.
    pub fn with_adaptive(mut self, rules: Vec<AdaptiveRule>) -> RuleSet {
        self.adaptive = Some(rules);
        self
    }

    /// Parses a combined document: `{"flowRules": [...], "degradeRules": [...], ...}`.
    ///
    /// ```
    /// use sentinel_runtime::datasource::{Format, RuleSet};
    /// let set = RuleSet::parse("[[flowRules]]\nresource = \"a\"\ncount = 5\n", Format::Toml).unwrap();
    /// assert_eq!(set.flow.unwrap()[0].count, 5.0);
    /// assert!(set.degrade.is_none());
    /// ```
    pub fn parse(text: &str, format: Format) -> Result<RuleSet, ParseError> {
        let dto: java::RuleSetDto = from_text(text, format)?;
        Ok(RuleSet {
            flow: unwrap_all(dto.flow_rules),
            degrade: unwrap_all(dto.degrade_rules),
            system: unwrap_all(dto.system_rules),
            authority: unwrap_all(dto.authority_rules),
            param_flow: unwrap_all(dto.param_flow_rules),
            adaptive: dto.adaptive_rules,
            #[cfg(feature = "tower")]
            gateway: GatewayDocuments {
                rules: dto.gw_flow_rules.map(|rules| rules.into_iter().map(|r| r.0).collect()),
                api_definitions: dto.gw_api_definitions,
            },
        })
    }

    /// Writes the set as a combined document.
    pub fn to_string(&self, format: Format) -> Result<String, SerializeError> {
        let dto = java::RuleSetDto {
            flow_rules: wrap_all(&self.flow),
            degrade_rules: wrap_all(&self.degrade),
            system_rules: wrap_all(&self.system),
            authority_rules: wrap_all(&self.authority),
            param_flow_rules: wrap_all(&self.param_flow),
            adaptive_rules: self.adaptive.clone(),
            #[cfg(feature = "tower")]
            gw_flow_rules: self.gateway.rules.as_ref().map(|r| r.iter().cloned().map(java::GatewayRuleWire).collect()),
            #[cfg(feature = "tower")]
            gw_api_definitions: self.gateway.api_definitions.clone(),
        };
        to_text(&dto, format)
    }

    /// The kinds the set holds.
    pub fn kinds(&self) -> Vec<RuleKind> {
        ALL_KINDS.into_iter().filter(|k| self.has(*k)).collect()
    }

    /// The number of rules, every kind counted (and the gateway's rules and API definitions).
    pub fn len(&self) -> usize {
        let len = self.flow.as_ref().map_or(0, Vec::len)
            + self.degrade.as_ref().map_or(0, Vec::len)
            + self.system.as_ref().map_or(0, Vec::len)
            + self.authority.as_ref().map_or(0, Vec::len)
            + self.param_flow.as_ref().map_or(0, Vec::len)
            + self.adaptive.as_ref().map_or(0, Vec::len);
        #[cfg(feature = "tower")]
        let len = len + self.gateway.len();
        len
    }

    /// Whether the set holds no rule (it may still manage kinds, with empty lists).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The set with only `kind` (if it holds it), and no gateway list.
    pub(crate) fn only(mut self, kind: RuleKind) -> RuleSet {
        #[cfg(feature = "tower")]
        {
            self.gateway = GatewayDocuments::default();
        }
        for k in ALL_KINDS.into_iter().filter(|k| *k != kind) {
            match k {
                RuleKind::Flow => self.flow = None,
                RuleKind::Degrade => self.degrade = None,
                RuleKind::System => self.system = None,
                RuleKind::Authority => self.authority = None,
                RuleKind::ParamFlow => self.param_flow = None,
                RuleKind::Adaptive => self.adaptive = None,
            }
        }
        self
    }

    pub(crate) fn has(&self, kind: RuleKind) -> bool {
        match kind {
            RuleKind::Flow => self.flow.is_some(),
            RuleKind::Degrade => self.degrade.is_some(),
            RuleKind::System => self.system.is_some(),
            RuleKind::Authority => self.authority.is_some(),
            RuleKind::ParamFlow => self.param_flow.is_some(),
            RuleKind::Adaptive => self.adaptive.is_some(),
        }
    }

    /// Adds the rules of `other` (kinds `other` holds replace this set's).
    pub fn merge(&mut self, other: RuleSet) {
        if other.flow.is_some() {
            self.flow = other.flow;
        }
        if other.degrade.is_some() {
            self.degrade = other.degrade;
        }
        if other.system.is_some() {
            self.system = other.system;
        }
        if other.authority.is_some() {
            self.authority = other.authority;
        }
        if other.param_flow.is_some() {
            self.param_flow = other.param_flow;
        }
        if other.adaptive.is_some() {
            self.adaptive = other.adaptive;
        }
        #[cfg(feature = "tower")]
        self.gateway.merge(other.gateway);
    }

    /// The rules the engine has in force, for the given kinds.
    pub fn snapshot(engine: &Sentinel, kinds: &[RuleKind]) -> RuleSet {
        let mut s = RuleSet::default();
        for k in kinds {
            match k {
                RuleKind::Flow => s.flow = Some(engine.flow_rules()),
                RuleKind::Degrade => s.degrade = Some(engine.degrade_rules()),
                RuleKind::System => s.system = Some(engine.system_rules()),
                RuleKind::Authority => s.authority = Some(engine.authority_rules()),
                RuleKind::ParamFlow => s.param_flow = Some(engine.param_flow_rules()),
                RuleKind::Adaptive => s.adaptive = Some(engine.adaptive_rules()),
            }
        }
        s
    }

    /// Whether `engine` has exactly these rules in force: each kind the set holds (and each gateway list it
    /// holds). A write-back marks what it wrote as in force only then; otherwise the change it makes is
    /// applied when the store reports it.
    pub(crate) fn is_in_force(&self, engine: &Sentinel) -> bool {
        #[allow(unused_mut)]
        let mut in_force = RuleSet::snapshot(engine, &self.kinds());
        #[cfg(feature = "tower")]
        {
            if self.gateway.rules.is_some() {
                in_force.gateway.rules = Some(engine.gateway_rules());
            }
            if self.gateway.api_definitions.is_some() {
                in_force.gateway.api_definitions = Some(engine.api_definitions());
            }
        }
        in_force == *self
    }

    fn load_kind(&self, engine: &Sentinel, kind: RuleKind) -> Result<(), RuleError> {
        match kind {
            RuleKind::Flow => self.flow.clone().map_or(Ok(()), |r| engine.load_flow_rules(r)),
            RuleKind::Degrade => self.degrade.clone().map_or(Ok(()), |r| engine.load_degrade_rules(r)),
            RuleKind::System => self.system.clone().map_or(Ok(()), |r| engine.load_system_rules(r)),
            RuleKind::Authority => self.authority.clone().map_or(Ok(()), |r| engine.load_authority_rules(r)),
            RuleKind::ParamFlow => self.param_flow.clone().map_or(Ok(()), |r| engine.load_param_flow_rules(r)),
            RuleKind::Adaptive => self.adaptive.clone().map_or(Ok(()), |r| engine.load_adaptive_rules(r)),
        }
    }

    /// Loads every rule kind the set holds into the engine, as one change: if any kind is rejected, the
    /// kinds loaded before it are put back and the engine's rules are as they were. The gateway's lists
    /// (feature `tower`) are left alone: [`apply_all`](RuleSet::apply_all) loads them too.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, datasource::{Format, RuleSet}};
    /// let engine = Sentinel::builder().build();
    /// let set = RuleSet::parse(r#"{"flowRules": [{"resource": "a", "count": 1}]}"#, Format::Json).unwrap();
    /// set.apply(&engine).unwrap();
    /// assert_eq!(engine.flow_rules().len(), 1);
    /// ```
    pub fn apply(&self, engine: &Sentinel) -> Result<Vec<RuleKind>, RuleError> {
        let kinds = self.kinds();
        let before = RuleSet::snapshot(engine, &kinds);
        for (i, kind) in kinds.iter().enumerate() {
            if let Err(e) = self.load_kind(engine, *kind) {
                for done in &kinds[..i] {
                    // Reloading the previous set of a kind cannot fail: it was in force.
                    if let Err(rollback) = before.load_kind(engine, *done) {
                        tracing::error!(kind = %done, error = %rollback, "could not restore the previous rules");
                    }
                }
                return Err(e);
            }
        }
        Ok(kinds)
    }

    /// Loads everything the set holds, as one change: the gateway's rules and API definitions (feature
    /// `tower`), then every rule kind. If anything is refused, what was loaded before it is put back and
    /// the engine's rules are as they were. What the data sources call for each document.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, datasource::{ApplyError, Format, RuleSet}};
    /// let engine = Sentinel::builder().build();
    /// let set = RuleSet::parse(r#"{"flowRules": [{"resource": "a", "count": -1}]}"#, Format::Json).unwrap();
    /// assert!(matches!(set.apply_all(&engine), Err(ApplyError::Rules(_))));
    /// assert!(engine.flow_rules().is_empty());
    /// ```
    pub fn apply_all(&self, engine: &Sentinel) -> Result<Vec<RuleKind>, ApplyError> {
        #[cfg(feature = "tower")]
        let before = if self.gateway.is_empty() {
            None
        } else {
            let before = GatewayDocuments::snapshot(engine);
            self.gateway.apply(engine)?;
            Some(before)
        };
        self.apply(engine).map_err(|e| {
            #[cfg(feature = "tower")]
            if let Some(before) = before {
                // The previous lists were in force: they load again.
                if let Err(rollback) = before.apply(engine) {
                    tracing::error!(error = %rollback, "could not restore the previous gateway rules");
                }
            }
            ApplyError::Rules(e)
        })
    }
}

#[cfg(test)]
mod edge_tests;
#[cfg(test)]
mod tests;
