//! The built-in console: a page served at `/` (HTML, CSS and JavaScript written here and embedded in the
//! binary; nothing is loaded from elsewhere), and the two commands it reads besides the dashboard's.
//!
//! - `console/overview`: every resource's last complete second (pass, block, success, exception, average
//!   rt), its concurrency, its breakers with their last transitions, and the global switch;
//! - `console/history?after={ms}`: per-second series of every resource, for the 5-minute charts (only the
//!   seconds after `after` when given, so the page fetches a few numbers a second);
//! - `console/adaptive?after={ms}`: every adaptive limiter now (algorithm, limit and its bounds, calls in
//!   flight and waiting, min RTT, sample RTT, baseline RTT, gradient, partitions) and, per resource and
//!   partition, the limit and the peak in flight of every second of the history up to the current one
//!   (`null` where none was sampled; only the seconds after `after` when given), for the chart of limit
//!   against in-flight; and the adaptive rules whose limiter no call has started yet (`waiting`).
//!
//! Rules are read and written through `getRules` / `setRules` (and the hot-parameter pair), the switch
//! through `setSwitch`, the diagnosis through `diagnose`: the page uses the same commands as everyone.

use serde::Serialize;

use super::adaptive_history::{AdaptiveSeries, SeriesKey};
use super::breakers::Transition;
use super::handler::{version, Center, CommandError, Params, Reply};
use super::history::TOTAL_INBOUND;
use crate::circuit_breaker::{BreakerState, DegradeGrade};

/// The page.
pub(crate) const INDEX_HTML: &str = include_str!("console/index.html");
/// Its stylesheet.
pub(crate) const CONSOLE_CSS: &str = include_str!("console/console.css");
/// Its script.
pub(crate) const CONSOLE_JS: &str = include_str!("console/console.js");
/// Its icon.
pub(crate) const FAVICON_SVG: &str = include_str!("console/favicon.svg");

/// An embedded file: `(path, content type, content)`.
pub(crate) fn asset(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        "" | "index.html" => Some(("text/html; charset=utf-8", INDEX_HTML)),
        "console.css" => Some(("text/css; charset=utf-8", CONSOLE_CSS)),
        "console.js" => Some(("text/javascript; charset=utf-8", CONSOLE_JS)),
        "favicon.svg" | "favicon.ico" => Some(("image/svg+xml", FAVICON_SVG)),
        _ => None,
    }
}

fn state_name(s: BreakerState) -> &'static str {
    match s {
        BreakerState::Closed => "CLOSED",
        BreakerState::Open => "OPEN",
        BreakerState::HalfOpen => "HALF_OPEN",
    }
}

fn grade_name(g: DegradeGrade) -> &'static str {
    match g {
        DegradeGrade::SlowRequestRatio => "slow ratio",
        DegradeGrade::ErrorRatio => "error ratio",
        DegradeGrade::ErrorCount => "error count",
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TransitionVo {
    at: u64,
    resource: String,
    grade: &'static str,
    from: &'static str,
    to: &'static str,
    snapshot: Option<f64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BreakerVo {
    grade: &'static str,
    count: f64,
    state: &'static str,
    retry_at: Option<u64>,
    interval_total: u64,
    interval_bad: u64,
    is_default: bool,
    last: Option<TransitionVo>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceVo {
    name: String,
    pass: u64,
    block: u64,
    success: u64,
    exception: u64,
    rt: u64,
    concurrency: u64,
    minute_pass: u64,
    minute_block: u64,
    breakers: Vec<BreakerVo>,
}

/// The write-back store, as the rules page shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SourceStatusVo {
    kind: String,
    target: String,
    connected: bool,
    last_load: Option<u64>,
    last_error: Option<String>,
}

impl From<crate::datasource::SourceStatus> for SourceStatusVo {
    fn from(s: crate::datasource::SourceStatus) -> Self {
        SourceStatusVo {
            kind: s.kind,
            target: s.target,
            connected: s.connected,
            last_load: s.last_load_ms,
            last_error: s.last_error,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Overview {
    app: String,
    version: String,
    enabled: bool,
    now: u64,
    /// End of the last complete second (ms): the numbers are of the second before it.
    second: u64,
    history_seconds: usize,
    /// The store pushed rules are written back to, if any: which, last load, last error.
    data_source: Option<SourceStatusVo>,
    resources: Vec<ResourceVo>,
    transitions: Vec<TransitionVo>,
    /// Where the engine stands against its caps on names ([`Sentinel::caps`](crate::Sentinel::caps)).
    caps: CapsVo,
    /// Whether the application is a gateway (gateway rules or API definitions in force, or a web layer in
    /// gateway mode); `null` when the gateway commands are not built in (feature `tower`).
    gateway: Option<bool>,
}

/// Whether the engine serves as a gateway, when gateway flow control is built in.
#[cfg(feature = "tower")]
fn gateway_in_use(engine: &crate::Sentinel) -> Option<bool> {
    Some(engine.uses_gateway())
}

/// Gateway flow control is not built in.
#[cfg(not(feature = "tower"))]
fn gateway_in_use(_: &crate::Sentinel) -> Option<bool> {
    None
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CapsVo {
    resources: usize,
    max_resources: usize,
    /// Handles on new names given the overflow resource (the cap was reached).
    resources_overflowed: u64,
    overflow_resource: &'static str,
    /// Names only regex rules match, against a cap of their own of the same size.
    matched_resources: usize,
    /// Past that cap, the resources names matching the same patterns share, against a bound of the same size.
    shared_by_patterns: usize,
    /// What names share past that bound.
    patterns_overflow_resource: &'static str,
    contexts: usize,
    max_contexts: usize,
    contexts_overflowed: u64,
}

pub(crate) fn overview(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    let boundary = c.history.sample(&c.engine);
    let transitions = c.transitions.newest_first();
    let vo = |t: &Transition| TransitionVo {
        at: t.at_ms,
        resource: t.rule.resource.clone(),
        grade: grade_name(t.rule.grade),
        from: state_name(t.from),
        to: state_name(t.to),
        snapshot: t.snapshot.filter(|v| v.is_finite()),
    };
    let mut names = c.engine.resource_names();
    names.sort();
    let resources = names
        .into_iter()
        .filter(|n| n != TOTAL_INBOUND)
        .map(|name| {
            let last = c.history.last_second(&name, boundary);
            let stats = c.engine.cluster_stats(&name).unwrap_or_default();
            let breakers = c
                .engine
                .circuit_breakers(&name)
                .into_iter()
                .map(|b| BreakerVo {
                    grade: grade_name(b.rule.grade),
                    count: b.rule.count,
                    state: state_name(b.state),
                    retry_at: b.retry_at_ms,
                    interval_total: b.interval_total,
                    interval_bad: b.interval_bad,
                    is_default: b.is_default,
                    // A default (`"*"`) rule's breakers share one rule, and observers are not told whose
                    // breaker moved: no last transition is shown for them (the list shows them under `*`).
                    last: if b.is_default { None } else { transitions.iter().find(|t| *t.rule == *b.rule).map(vo) },
                })
                .collect();
            let t = last.map(|l| l.totals).unwrap_or_default();
            ResourceVo {
                name,
                pass: t.pass,
                block: t.block,
                success: t.success,
                exception: t.exception,
                rt: t.rt_ms,
                concurrency: stats.threads,
                minute_pass: stats.minute_pass,
                minute_block: stats.minute_block,
                breakers,
            }
        })
        .collect();
    Reply::json(&Overview {
        app: c.machine.app.clone(),
        version: version(),
        enabled: c.engine.is_enabled(),
        now: c.engine.now_millis(),
        second: boundary,
        history_seconds: c.history.seconds(),
        data_source: c.source.as_ref().map(|s| s.status().into()),
        resources,
        transitions: transitions.iter().take(30).map(vo).collect(),
        caps: {
            let caps = c.engine.caps();
            CapsVo {
                resources: caps.resources,
                max_resources: caps.max_resources,
                resources_overflowed: caps.resources_overflowed,
                overflow_resource: crate::RESOURCE_OVERFLOW,
                matched_resources: caps.matched_resources,
                shared_by_patterns: caps.shared_by_patterns,
                patterns_overflow_resource: crate::RESOURCE_PATTERNS_OVERFLOW,
                contexts: caps.contexts,
                max_contexts: caps.max_contexts,
                contexts_overflowed: caps.contexts_overflowed,
            }
        },
        gateway: gateway_in_use(&c.engine),
    })
}

#[derive(Serialize)]
struct SeriesVo<'a> {
    name: &'a str,
    pass: &'a [u64],
    block: &'a [u64],
    success: &'a [u64],
    exception: &'a [u64],
    rt: &'a [u64],
}

#[derive(Serialize)]
struct HistoryVo<'a> {
    /// Start of the first second (ms).
    start: u64,
    /// Seconds in each series.
    count: usize,
    series: Vec<SeriesVo<'a>>,
}

pub(crate) fn history(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let after = match p.get("after") {
        None => None,
        Some(a) => Some(a.trim().parse::<u64>().map_err(|_| CommandError("`after` must be a time in ms".into()))?),
    };
    let boundary = c.history.sample(&c.engine);
    let (start, count, series) = c.history.series(after, boundary);
    let series = series
        .iter()
        .filter(|(n, _)| &**n != TOTAL_INBOUND)
        .map(|(n, s)| SeriesVo {
            name: n,
            pass: &s.pass,
            block: &s.block,
            success: &s.success,
            exception: &s.exception,
            rt: &s.rt_ms,
        })
        .collect();
    Reply::json(&HistoryVo { start, count, series })
}

/// Milliseconds of a duration, to the microsecond.
fn ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdaptivePartitionVo {
    origin: String,
    share: f64,
    /// Calls in flight guaranteed to it under contention: its limit in the series.
    guarantee: u32,
    inflight: u32,
    /// Per second: its guarantee and peak in flight.
    series: AdaptiveSeriesVo,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdaptiveSeriesVo {
    limit: Vec<Option<u32>>,
    inflight: Vec<Option<u32>>,
}

impl From<Option<AdaptiveSeries>> for AdaptiveSeriesVo {
    fn from(s: Option<AdaptiveSeries>) -> Self {
        let s = s.unwrap_or_default();
        AdaptiveSeriesVo { limit: s.limit, inflight: s.inflight }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdaptiveVo {
    resource: String,
    algorithm: &'static str,
    limit: u32,
    min_limit: u32,
    max_limit: u32,
    inflight: u32,
    waiting: usize,
    min_rtt_ms: f64,
    sample_rtt_ms: f64,
    baseline_rtt_ms: f64,
    gradient: f64,
    probing: bool,
    /// Per second: the limit last seen and the peak in flight.
    series: AdaptiveSeriesVo,
    partitions: Vec<AdaptivePartitionVo>,
}

/// An adaptive rule in force whose limiter no call has started yet.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdaptiveWaitingVo {
    /// The resource, or the pattern of a regex rule.
    resource: String,
    regex: bool,
    /// The rule's algorithm; none: chosen by the first call's direction.
    algorithm: Option<&'static str>,
    initial_limit: u32,
    min_limit: u32,
    max_limit: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdaptiveAnswer {
    now: u64,
    /// Seconds the history keeps per series (the length of a full answer's series).
    seconds: usize,
    /// Start (ms) of the first second of every series; the last is the second in progress.
    start: u64,
    /// Seconds in every series.
    count: usize,
    resources: Vec<AdaptiveVo>,
    /// Rules in force whose limiter starts at their resource's first call.
    waiting: Vec<AdaptiveWaitingVo>,
}

pub(crate) fn adaptive(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let after = p.number::<u64>("after", "a time in ms")?;
    let now = c.engine.now_millis();
    let status = c.engine.adaptive_status();
    // The state just read is the last point of each series.
    c.history.adaptive.record(now, &status);
    let (start, count, mut series) = c.history.adaptive.series(now, after);
    let resources = status
        .into_iter()
        .map(|s| {
            let resource: std::sync::Arc<str> = s.resource.as_str().into();
            let mut take = |partition: Option<&str>| {
                AdaptiveSeriesVo::from(
                    series.remove(&SeriesKey { resource: resource.clone(), partition: partition.map(Into::into) }),
                )
            };
            AdaptiveVo {
                series: take(None),
                partitions: s
                    .partitions
                    .iter()
                    .map(|p| AdaptivePartitionVo {
                        origin: p.origin.clone(),
                        share: p.share,
                        guarantee: p.guarantee,
                        inflight: p.inflight,
                        series: take(Some(&p.origin)),
                    })
                    .collect(),
                algorithm: s.algorithm.as_str(),
                limit: s.limit,
                min_limit: s.min_limit,
                max_limit: s.max_limit,
                inflight: s.inflight,
                waiting: s.waiting,
                min_rtt_ms: ms(s.min_rtt),
                sample_rtt_ms: ms(s.sample_rtt),
                baseline_rtt_ms: ms(s.baseline_rtt),
                gradient: if s.gradient.is_finite() { s.gradient } else { 1.0 },
                probing: s.probing,
                resource: s.resource,
            }
        })
        .collect();
    let waiting = c
        .engine
        .adaptive_rules_waiting()
        .into_iter()
        .map(|r| AdaptiveWaitingVo {
            algorithm: r.algorithm.map(|a| a.as_str()),
            initial_limit: r.initial_limit,
            min_limit: r.min_limit,
            max_limit: r.max_limit,
            regex: r.regex,
            resource: r.resource,
        })
        .collect();
    Reply::json(&AdaptiveAnswer { now, seconds: c.history.adaptive.seconds(), start, count, resources, waiting })
}
