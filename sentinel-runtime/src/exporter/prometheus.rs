//! The Prometheus text: monotonic counters accumulated from the engine's per-second buckets, a response-time
//! histogram and blocks by kind recorded by the core once the exporter is attached ([`crate::observe`]), and
//! gauges read at render time.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::circuit_breaker::{BreakerState, DegradeGrade};
use crate::engine::keep::SharedHandle;
use crate::observe::{ObservedSnapshot, BLOCK_KIND_NAMES};
use crate::stat::MetricEvent;
use crate::Sentinel;

/// The default upper bounds of the response-time histogram, in seconds: 1 ms to 10 s, dense where calls to
/// caches and databases (1–50 ms) and to remote services (50 ms–2.5 s) usually fall.
pub const DEFAULT_BUCKETS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0];

/// How often a background thread folds complete seconds into the counters, so that scrapes further apart
/// than the engine's one-minute history lose nothing.
const ACCUMULATE_EVERY: Duration = Duration::from_secs(15);

/// Settings of the exporter: [`attach`] it with them, or let the first [`render`] attach the defaults.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ExporterConfig {
    /// Upper bounds of the response-time histogram's buckets, in seconds, increasing (`+Inf` is implied).
    pub buckets: Vec<f64>,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        ExporterConfig { buckets: DEFAULT_BUCKETS.to_vec() }
    }
}

impl ExporterConfig {
    /// Sets the histogram's bucket bounds (seconds, increasing).
    pub fn buckets(mut self, bounds: impl Into<Vec<f64>>) -> Self {
        self.buckets = bounds.into();
        self
    }
}

/// Why [`attach`] refused a configuration. The exporter in force (if any) stays as it was.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ExporterError {
    /// No bucket bound was given.
    #[error("the response-time histogram needs at least one bucket bound (seconds, e.g. [0.01, 0.1, 1.0])")]
    NoBuckets,
    /// A bound is not a finite number of at least a microsecond.
    #[error(
        "histogram bucket bound #{index} ({value}) must be a finite number of seconds >= 0.000001; `+Inf` is implied"
    )]
    BadBucket {
        /// The bound's position.
        index: usize,
        /// The bound.
        value: f64,
    },
    /// A bound does not increase on the previous one (at microsecond resolution).
    #[error("histogram bucket bounds must increase: #{index} ({value} s) is not above the bound before it")]
    UnorderedBuckets {
        /// The bound's position.
        index: usize,
        /// The bound.
        value: f64,
    },
    /// The engine's exporter was already attached (or rendered) with other buckets.
    #[error(
        "the exporter of this engine already records with buckets {in_force:?}: attach it once, at start-up, \
         before the first render"
    )]
    AlreadyAttached {
        /// The bounds in force, in seconds.
        in_force: Vec<f64>,
    },
}

/// Starts the exporter on `engine`: from now on every resource records a response-time histogram with
/// `config`'s buckets, and blocked calls by rule kind (the counters of passes, successes and exceptions come
/// from the engine's per-second history and need nothing recorded). Call it at start-up, so the histogram
/// covers every call; otherwise the first [`render`] attaches the defaults. Attaching again with the same
/// configuration is a no-op.
///
/// ```
/// use sentinel_runtime::{Sentinel, exporter::{self, ExporterConfig}};
/// let engine = Sentinel::builder().build();
/// exporter::attach(&engine, ExporterConfig::default().buckets([0.005, 0.05, 0.5])).unwrap();
/// drop(engine.enter("checkout").unwrap());
/// assert!(exporter::render(&engine).contains("le=\"0.005\""));
/// assert!(exporter::attach(&engine, ExporterConfig::default()).is_err()); // other buckets
/// ```
pub fn attach(engine: &Sentinel, config: ExporterConfig) -> Result<(), ExporterError> {
    let micros = bounds_micros(&config.buckets)?;
    let state = state_with(engine, micros.clone(), &config.buckets);
    if *state.bounds_micros != *micros {
        return Err(ExporterError::AlreadyAttached { in_force: state.bounds_seconds.to_vec() });
    }
    Ok(())
}

fn bounds_micros(seconds: &[f64]) -> Result<Arc<[u64]>, ExporterError> {
    if seconds.is_empty() {
        return Err(ExporterError::NoBuckets);
    }
    let mut out: Vec<u64> = Vec::with_capacity(seconds.len());
    for (index, &value) in seconds.iter().enumerate() {
        if !value.is_finite() || value < 1e-6 {
            return Err(ExporterError::BadBucket { index, value });
        }
        let micros = (value * 1e6).round() as u64;
        if out.last().is_some_and(|prev| micros <= *prev) {
            return Err(ExporterError::UnorderedBuckets { index, value });
        }
        out.push(micros);
    }
    Ok(out.into())
}

/// What the exporter keeps with an engine.
struct ExporterState {
    bounds_micros: Arc<[u64]>,
    bounds_seconds: Box<[f64]>,
    counters: Mutex<HashMap<String, Totals>>,
}

/// One resource's counters: every complete second before `through_ms`, summed.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    through_ms: u64,
    pass: u64,
    success: u64,
    exception: u64,
}

impl Totals {
    fn add(&mut self, t: &crate::stat::BucketTotals) {
        self.pass += t.get(MetricEvent::Pass);
        self.success += t.get(MetricEvent::Success);
        self.exception += t.get(MetricEvent::Exception);
    }
}

/// The exporter of `engine`, attached with `micros` (`seconds`) when it has none yet.
fn state_with(engine: &Sentinel, micros: Arc<[u64]>, seconds: &[f64]) -> Arc<ExporterState> {
    let shared = &engine.shared;
    let mut fresh = false;
    let state = shared.observers.extension(|| {
        fresh = true;
        let in_force = shared.observe(micros.clone());
        let bounds_seconds =
            if *in_force == *micros { seconds.into() } else { in_force.iter().map(|m| *m as f64 / 1e6).collect() };
        ExporterState { bounds_micros: in_force, bounds_seconds, counters: Mutex::new(HashMap::new()) }
    });
    if fresh {
        track(Arc::downgrade(&engine.shared), Arc::downgrade(&state));
    }
    state
}

fn state(engine: &Sentinel) -> Arc<ExporterState> {
    static DEFAULT_MICROS: OnceLock<Arc<[u64]>> = OnceLock::new();
    let micros = DEFAULT_MICROS.get_or_init(|| DEFAULT_BUCKETS.iter().map(|s| (s * 1e6).round() as u64).collect());
    state_with(engine, micros.clone(), &DEFAULT_BUCKETS)
}

type Tracked = Vec<(Weak<SharedHandle>, Weak<ExporterState>)>;

/// Hands the exporter to the background thread that folds complete seconds into its counters (one thread
/// for every engine of the process; it forgets an engine once it is dropped).
fn track(engine: Weak<SharedHandle>, state: Weak<ExporterState>) {
    static TRACKED: Mutex<Tracked> = Mutex::new(Vec::new());
    static THREAD: OnceLock<()> = OnceLock::new();
    TRACKED.lock().unwrap_or_else(|e| e.into_inner()).push((engine, state));
    THREAD.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("sentinel-metrics-accumulate".into()).spawn(|| loop {
            std::thread::sleep(ACCUMULATE_EVERY);
            let live: Vec<(Sentinel, Arc<ExporterState>)> = {
                let mut tracked = TRACKED.lock().unwrap_or_else(|e| e.into_inner());
                tracked.retain(|(e, s)| e.strong_count() > 0 && s.strong_count() > 0);
                tracked.iter().filter_map(|(e, s)| Some((Sentinel { shared: e.upgrade()? }, s.upgrade()?))).collect()
            };
            for (engine, state) in live {
                state.accumulate(&engine);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no background accumulation of metrics: counters are updated on render only");
        }
    });
}

impl ExporterState {
    /// Folds every complete second not counted yet into the counters, and returns each resource's counters
    /// with the current (incomplete) second added: a counter read now is never above one read later, since
    /// the current second only grows until it is folded in.
    fn accumulate(&self, engine: &Sentinel) -> HashMap<String, Totals> {
        let now_ms = engine.now_millis();
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = HashMap::new();
        for name in engine.resource_names() {
            let t = counters.entry(name.clone()).or_default();
            let mut current = *t;
            for (second, totals) in engine.resource_seconds(&name) {
                if second < t.through_ms {
                    continue; // counted already (or the clock went back)
                }
                if second + 1000 <= now_ms {
                    t.add(&totals);
                    t.through_ms = second + 1000;
                    current.add(&totals);
                } else {
                    current.add(&totals);
                }
            }
            out.insert(name, current);
        }
        out
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One resource's numbers, read once per render.
struct Row {
    labels: String,
    totals: Totals,
    concurrency: u64,
    observed: ObservedSnapshot,
}

/// The engine's metrics in the Prometheus text format (version 0.0.4), resources sorted by name. Attaches
/// the exporter with the default configuration on first use (see [`attach`]).
///
/// Families (every series is labelled with `app` and `resource`; no label comes from a caller, so the series
/// are bounded by the resource cap):
/// - `sentinel_pass_total`, `sentinel_success_total` (completed calls), `sentinel_exception_total`
///   (completed with a traced error): counters;
/// - `sentinel_block_total{kind}`: blocked calls by the kind of rule that blocked them (`flow`, `degrade`,
///   `system`, `param_flow`, `authority`, `adaptive`, `custom`), counted from the attach;
/// - `sentinel_response_time_seconds`: histogram of completed calls' response times, from the attach;
/// - `sentinel_concurrency`: calls in flight (gauge);
/// - `sentinel_circuit_breaker_state{rule, grade}`: 0 closed, 1 open, 2 half-open (gauge); `rule` is the
///   rule's position in [`Sentinel::degrade_rules`];
/// - with cluster-mode flow rules, `sentinel_cluster_mode{rule}` (0 no token service, 1 leasing, 2 local
///   fallback, 3 passing: gauge) and the counters `sentinel_cluster_tokens_leased_total`,
///   `sentinel_cluster_round_trips_total`, `sentinel_cluster_failures_total` and
///   `sentinel_cluster_local_decisions_total`, and `sentinel_cluster_fallback_instances{rule, source}` (what
///   the local fallback divides a global count by; `source` is `seen`, `configured` or `assumed`: gauge);
///   `rule` is the rule's position in [`Sentinel::flow_rules`];
/// - with adaptive rules, per resource and partition (`partition` is empty for the whole limiter, else the
///   partition's origin): `sentinel_adaptive_limit` (the limit in force; a partition's guarantee),
///   `sentinel_adaptive_inflight`, and per resource `sentinel_adaptive_min_rtt_seconds`,
///   `sentinel_adaptive_sample_rtt_seconds`, `sentinel_adaptive_baseline_rtt_seconds`,
///   `sentinel_adaptive_gradient` and `sentinel_adaptive_waiting` (gauges).
pub fn render(engine: &Sentinel) -> String {
    let state = state(engine);
    let counters = state.accumulate(engine);
    let app = escape(&engine.config().app_name);
    let mut names = engine.resource_names();
    names.sort();
    let rows: Vec<Row> = names
        .iter()
        .map(|name| Row {
            labels: format!("app=\"{app}\",resource=\"{}\"", escape(name)),
            totals: counters.get(name).copied().unwrap_or_default(),
            concurrency: engine.cluster_stats(name).map_or(0, |s| s.threads),
            observed: engine
                .shared
                .find_resource(name)
                .and_then(|r| r.observed.get().map(|o| o.snapshot()))
                .unwrap_or_default(),
        })
        .collect();

    let mut out = String::with_capacity(256 + rows.len() * (40 * (8 + state.bounds_seconds.len())));
    let counter = |out: &mut String, name: &str, help: &str, value: fn(&Totals) -> u64| {
        family(out, name, "counter", help);
        for r in &rows {
            let _ = writeln!(out, "{name}{{{}}} {}", r.labels, value(&r.totals));
        }
    };
    counter(&mut out, "sentinel_pass_total", "Calls that passed every check.", |t| t.pass);
    counter(&mut out, "sentinel_success_total", "Calls that completed (with or without an error).", |t| t.success);
    counter(&mut out, "sentinel_exception_total", "Completed calls with a traced error (or a timeout).", |t| {
        t.exception
    });

    family(&mut out, "sentinel_block_total", "counter", "Calls blocked, by the kind of rule that blocked them.");
    for r in &rows {
        for (kind, n) in BLOCK_KIND_NAMES.iter().zip(r.observed.blocks) {
            let _ = writeln!(out, "sentinel_block_total{{{},kind=\"{kind}\"}} {n}", r.labels);
        }
    }

    let h = "sentinel_response_time_seconds";
    family(&mut out, h, "histogram", "Response time of completed calls.");
    for r in &rows {
        let cumulative = &r.observed.cumulative;
        let count = |i: usize| cumulative.get(i).copied().unwrap_or(0);
        for (i, le) in state.bounds_seconds.iter().enumerate() {
            let _ = writeln!(out, "{h}_bucket{{{},le=\"{le}\"}} {}", r.labels, count(i));
        }
        let total = count(state.bounds_seconds.len());
        let _ = writeln!(out, "{h}_bucket{{{},le=\"+Inf\"}} {total}", r.labels);
        let _ = writeln!(out, "{h}_sum{{{}}} {}", r.labels, r.observed.sum_micros as f64 / 1e6);
        let _ = writeln!(out, "{h}_count{{{}}} {total}", r.labels);
    }

    family(&mut out, "sentinel_concurrency", "gauge", "Calls in flight.");
    for r in &rows {
        let _ = writeln!(out, "sentinel_concurrency{{{}}} {}", r.labels, r.concurrency);
    }

    render_breakers(engine, &app, &names, &mut out);
    render_cluster(engine, &app, &mut out);
    render_adaptive(engine, &app, &mut out);
    out
}

/// Adaptive limiters (only when there are): the limit against the calls in flight, per partition, and what
/// each measured ([`Sentinel::adaptive_status`]).
fn render_adaptive(engine: &Sentinel, app: &str, out: &mut String) {
    let states = engine.adaptive_status();
    if states.is_empty() {
        return;
    }
    let labels = |s: &crate::adaptive::AdaptiveStatus, partition: &str| {
        format!("app=\"{app}\",resource=\"{}\",partition=\"{}\"", escape(&s.resource), escape(partition))
    };
    family(
        out,
        "sentinel_adaptive_limit",
        "gauge",
        "Adaptive concurrency limit in force (a partition: its guarantee).",
    );
    for s in &states {
        let _ = writeln!(out, "sentinel_adaptive_limit{{{}}} {}", labels(s, ""), s.limit);
        for p in &s.partitions {
            let _ = writeln!(out, "sentinel_adaptive_limit{{{}}} {}", labels(s, &p.origin), p.guarantee);
        }
    }
    family(out, "sentinel_adaptive_inflight", "gauge", "Calls in flight under an adaptive limit.");
    for s in &states {
        let _ = writeln!(out, "sentinel_adaptive_inflight{{{}}} {}", labels(s, ""), s.inflight);
        for p in &s.partitions {
            let _ = writeln!(out, "sentinel_adaptive_inflight{{{}}} {}", labels(s, &p.origin), p.inflight);
        }
    }
    type Gauge = (&'static str, &'static str, fn(&crate::adaptive::AdaptiveStatus) -> f64);
    let gauges: [Gauge; 5] = [
        ("sentinel_adaptive_min_rtt_seconds", "Lowest RTT of the last closed window.", |s| s.min_rtt.as_secs_f64()),
        ("sentinel_adaptive_sample_rtt_seconds", "Average RTT of the last closed window.", |s| {
            s.sample_rtt.as_secs_f64()
        }),
        ("sentinel_adaptive_baseline_rtt_seconds", "The RTT the algorithm compares against.", |s| {
            s.baseline_rtt.as_secs_f64()
        }),
        ("sentinel_adaptive_gradient", "Gradient2's last gradient (1 for the other algorithms).", |s| s.gradient),
        ("sentinel_adaptive_waiting", "Calls waiting for a place under an adaptive limit.", |s| s.waiting as f64),
    ];
    for (name, help, value) in gauges {
        family(out, name, "gauge", help);
        for s in &states {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(s, ""), value(s));
        }
    }
}

/// Cluster-mode flow rules (only when there are): how each is decided, and its counters
/// ([`Sentinel::cluster_status`]).
fn render_cluster(engine: &Sentinel, app: &str, out: &mut String) {
    use crate::flow::ClusterRuleMode;
    let states = engine.cluster_status();
    if states.is_empty() {
        return;
    }
    let rules = engine.flow_rules();
    let labels: Vec<String> = states
        .iter()
        .map(|s| {
            let index = rules.iter().position(|r| *r == s.rule).map(|i| i.to_string()).unwrap_or_default();
            format!("app=\"{app}\",resource=\"{}\",rule=\"{index}\"", escape(&s.rule.resource))
        })
        .collect();
    family(
        out,
        "sentinel_cluster_mode",
        "gauge",
        "How a cluster flow rule is decided: 0 no token service, 1 leasing, 2 local fallback, 3 passing.",
    );
    for (s, l) in states.iter().zip(&labels) {
        let mode = match s.mode {
            ClusterRuleMode::Leasing => 1,
            ClusterRuleMode::Fallback => 2,
            ClusterRuleMode::Passing => 3,
            _ => 0,
        };
        let _ = writeln!(out, "sentinel_cluster_mode{{{l}}} {mode}");
    }
    family(
        out,
        "sentinel_cluster_fallback_instances",
        "gauge",
        "Instances the local fallback divides a global cluster count by; source: seen, configured or assumed.",
    );
    for (s, l) in states.iter().zip(&labels) {
        if let Some(n) = s.fallback_instances {
            let _ = writeln!(out, "sentinel_cluster_fallback_instances{{{l},source=\"{}\"}} {}", n.source(), n.count());
        }
    }
    type Counter = (&'static str, &'static str, fn(&crate::flow::ClusterRuleStatus) -> u64);
    let counters: [Counter; 4] = [
        ("sentinel_cluster_tokens_leased_total", "Tokens leased from the shared limit.", |s| s.tokens_leased),
        ("sentinel_cluster_round_trips_total", "Calls to the token service.", |s| s.round_trips),
        ("sentinel_cluster_failures_total", "Failed calls to the token service.", |s| s.failures),
        ("sentinel_cluster_local_decisions_total", "Calls decided by the local fallback.", |s| s.fallback_decisions),
    ];
    for (name, help, value) in counters {
        family(out, name, "counter", help);
        for (s, l) in states.iter().zip(&labels) {
            let _ = writeln!(out, "{name}{{{l}}} {}", value(s));
        }
    }
}

fn render_breakers(engine: &Sentinel, app: &str, names: &[String], out: &mut String) {
    let rules = engine.degrade_rules();
    family(out, "sentinel_circuit_breaker_state", "gauge", "Circuit breaker state: 0 closed, 1 open, 2 half-open.");
    for name in names {
        for b in engine.circuit_breakers(name) {
            let index = rules.iter().position(|r| *r == *b.rule).map(|i| i.to_string()).unwrap_or_default();
            let grade = match b.rule.grade {
                DegradeGrade::SlowRequestRatio => "slow_request_ratio",
                DegradeGrade::ErrorRatio => "error_ratio",
                DegradeGrade::ErrorCount => "error_count",
            };
            let state = match b.state {
                BreakerState::Closed => 0,
                BreakerState::Open => 1,
                BreakerState::HalfOpen => 2,
            };
            let _ = writeln!(
                out,
                "sentinel_circuit_breaker_state{{app=\"{app}\",resource=\"{}\",rule=\"{index}\",grade=\"{grade}\"}} {state}",
                escape(name)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_rules_show_how_they_are_decided() {
        let engine = Sentinel::builder().app_name("shop").build();
        assert!(!render(&engine).contains("sentinel_cluster_mode"), "no cluster rule, no cluster family");
        let rule = crate::flow::FlowRule {
            cluster_mode: true,
            cluster_config: Some(crate::flow::ClusterConfig::default()),
            ..crate::flow::FlowRule::new("api").count(5.0)
        };
        engine.load_flow_rules([crate::flow::FlowRule::new("db").count(1.0), rule]).unwrap();
        let text = render(&engine);
        assert!(text.contains("sentinel_cluster_mode{app=\"shop\",resource=\"api\",rule=\"1\"} 0"), "{text}");
        assert!(text.contains("sentinel_cluster_local_decisions_total{app=\"shop\",resource=\"api\",rule=\"1\"} 0"));
    }

    #[test]
    fn bucket_bounds_are_validated() {
        assert_eq!(bounds_micros(&[]), Err(ExporterError::NoBuckets));
        assert!(matches!(bounds_micros(&[0.1, f64::NAN]), Err(ExporterError::BadBucket { index: 1, .. })));
        assert!(matches!(bounds_micros(&[0.1, f64::INFINITY]), Err(ExporterError::BadBucket { index: 1, .. })));
        assert!(matches!(bounds_micros(&[-1.0]), Err(ExporterError::BadBucket { index: 0, .. })));
        assert!(matches!(bounds_micros(&[0.1, 0.1]), Err(ExporterError::UnorderedBuckets { index: 1, .. })));
        assert!(matches!(bounds_micros(&[0.001, 0.0010000001]), Err(ExporterError::UnorderedBuckets { index: 1, .. })));
        assert_eq!(&*bounds_micros(&[0.001, 0.25, 2.0]).unwrap(), &[1_000, 250_000, 2_000_000]);
    }
}
