//! The commands' handlers: the ones the Sentinel Dashboard calls, in its formats, and the ones people use
//! with curl. The table that names them is in [`transport`](super).
//!
//! Formats follow Java's `sentinel-transport-common` handlers where the dashboard parses them (metric lines,
//! NodeVo JSON, fastjson rule JSON, the exact `success` replies); the differences are listed in the module
//! docs of [`transport`](super).

use serde::Serialize;

use super::handler::{Center, CommandError, Params, Reply};
use super::history::LineRecord;
use super::write_back::Stored;
use crate::adaptive::AdaptiveRule;
use crate::authority::AuthorityRule;
use crate::circuit_breaker::DegradeRule;
use crate::datasource::{parse_rules, rules_to_string, Format, RuleData, RuleSet};
use crate::flow::FlowRule;
use crate::param_flow::ParamFlowRule;
use crate::system::SystemRule;
use crate::{NodeStats, RuleKind, Sentinel};

/// The reply to a write whose rules took effect but could not be written back to the data source.
pub const WRITE_DATA_SOURCE_FAILED: &str = "partial success (write data source failed)";

// ---------------------------------------------------------------------------------------------------------
// metric

pub(crate) fn metric(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let Some(start) = p.number::<u64>("startTime", "a time in ms since the epoch")? else {
        return Ok(Reply::text("")); // as Java: no start, no lines
    };
    let end = p.number::<u64>("endTime", "a time in ms since the epoch")?;
    let max_lines = p.number::<usize>("maxLines", "a number of lines")?.unwrap_or(6000).min(MAX_METRIC_LINES);
    let identity = p.get("identity");
    c.history.sample(&c.engine);
    let covered = c.history.covered_from_ms();
    let mut lines = Vec::new();
    if start < covered {
        // As Java: `maxLines` bounds an answer without an end; one with an end is bounded all the same here.
        let limit = if end.is_some() { MAX_METRIC_LINES } else { max_lines };
        let (older, cut) = older_lines(c, start, end.unwrap_or(u64::MAX).min(covered - 1), identity, limit)?;
        lines = older;
        if cut {
            // The answer stops where the log search stopped, so that it has no gap: ask again from there.
            system_lines(c, identity, &mut lines);
            return Ok(Reply::text(thin_lines(&lines)));
        }
    }
    lines.extend(c.history.lines(start.max(covered), end.unwrap_or(u64::MAX), identity));
    if end.is_none() {
        // As Java's `MetricsReader`: every line of the last second begun, so that asking again from the next
        // second loses none.
        let mut keep = max_lines.min(lines.len());
        while keep > 0 && keep < lines.len() && lines[keep].totals.start_ms == lines[keep - 1].totals.start_ms {
            keep += 1;
        }
        lines.truncate(keep);
    }
    system_lines(c, identity, &mut lines);
    Ok(Reply::text(thin_lines(&lines)))
}

/// The name of the system load line of a `metric` answer (Java's `Constants.SYSTEM_LOAD_RESOURCE_NAME`).
const SYSTEM_LOAD_LINE: &str = "__system_load__";
/// The name of the cpu usage line of a `metric` answer (Java's `Constants.CPU_USAGE_RESOURCE_NAME`).
const CPU_USAGE_LINE: &str = "__cpu_usage__";

/// Java's `SendMetricCommandHandler.addCpuUsageAndLoad`: an answer for every resource (no `identity`) ends with
/// the system load and the cpu usage, when known and above 0, times 10,000 and truncated, as the pass count
/// of the current second (the dashboard leaves both out of its charts).
fn system_lines(c: &Center, identity: Option<&str>, lines: &mut Vec<LineRecord>) {
    if identity.is_some() {
        return;
    }
    let now = c.engine.now_millis();
    let readings = c.engine.system_readings();
    for (name, value) in [(SYSTEM_LOAD_LINE, readings.load), (CPU_USAGE_LINE, readings.cpu)] {
        let Some(value) = value.filter(|v| *v > 0.0 && v.is_finite()) else { continue };
        lines.push(LineRecord {
            resource: std::sync::Arc::from(name),
            totals: crate::SecondTotals {
                start_ms: now - now % 1000,
                // Java's `(long) (value * 10000)`: truncated, saturating.
                pass: (value * 10_000.0) as u64,
                ..Default::default()
            },
            concurrency: 0,
        });
    }
}

fn thin_lines(lines: &[LineRecord]) -> String {
    let mut out = String::with_capacity(lines.len() * 64);
    for l in lines {
        l.write_thin(&mut out);
    }
    out
}

/// Lines one `metric` answer holds at most.
const MAX_METRIC_LINES: usize = 12_000;
/// Bytes of log lines one `metric` answer holds at most (2 MiB: 12,000 lines of names up to ~100 bytes).
#[cfg(feature = "logs")]
const MAX_METRIC_LOG_BYTES: usize = 2 << 20;
/// Seconds of log one `metric` answer reads at most (an hour), from the first second found.
#[cfg(feature = "logs")]
const MAX_METRIC_LOG_SECONDS: u64 = 3600;
/// Metric log searches at once, process-wide: with [`MAX_METRIC_LOG_BYTES`], at most 8 MiB of log lines are
/// held for `metric` answers at any time; a request beyond them is refused (asked again, it is answered).
#[cfg(feature = "logs")]
const METRIC_LOG_SEARCHES: usize = 4;
#[cfg(feature = "logs")]
static METRIC_LOG_SEARCHES_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of the [`METRIC_LOG_SEARCHES`] places, given back when dropped.
#[cfg(feature = "logs")]
struct SearchPlace;

#[cfg(feature = "logs")]
impl SearchPlace {
    fn take() -> Option<SearchPlace> {
        use std::sync::atomic::Ordering;
        METRIC_LOG_SEARCHES_RUNNING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < METRIC_LOG_SEARCHES).then_some(n + 1))
            .ok()
            .map(|_| SearchPlace)
    }
}

#[cfg(feature = "logs")]
impl Drop for SearchPlace {
    fn drop(&mut self) {
        METRIC_LOG_SEARCHES_RUNNING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Seconds older than the in-memory history, from the metric log (feature `logs`): at most `limit` lines,
/// and whether a bound cut them short.
#[cfg(feature = "logs")]
fn older_lines(
    c: &Center,
    from: u64,
    to: u64,
    identity: Option<&str>,
    limit: usize,
) -> Result<(Vec<LineRecord>, bool), CommandError> {
    let config = c.engine.config();
    if !config.log_dir.is_dir() {
        return Ok((Vec::new(), false));
    }
    let Some(_place) = SearchPlace::take() else {
        return Err(CommandError(format!(
            "busy: {METRIC_LOG_SEARCHES} metric log searches are running; ask again in a moment"
        )));
    };
    let searcher = crate::log::MetricSearcher::new(&config.log_dir, &config.app_name)
        .max_lines(limit)
        .max_bytes(MAX_METRIC_LOG_BYTES)
        .max_seconds(MAX_METRIC_LOG_SECONDS);
    match searcher.search(identity, from, to) {
        Ok(found) => {
            let lines = found
                .lines
                .into_iter()
                .map(|m| LineRecord {
                    resource: std::sync::Arc::from(m.resource.as_str()),
                    totals: crate::SecondTotals {
                        start_ms: m.timestamp_ms,
                        pass: m.pass,
                        block: m.block,
                        success: m.success,
                        exception: m.exception,
                        rt_ms: m.rt_ms,
                        occupied_pass: m.occupied_pass,
                    },
                    concurrency: m.concurrency,
                })
                .collect();
            Ok((lines, found.truncated))
        }
        Err(e) => {
            tracing::warn!(error = %e, dir = %config.log_dir.display(), "could not read the metric log");
            Ok((Vec::new(), false))
        }
    }
}

#[cfg(not(feature = "logs"))]
fn older_lines(_: &Center, _: u64, _: u64, _: Option<&str>, _: usize) -> Result<(Vec<LineRecord>, bool), CommandError> {
    Ok((Vec::new(), false))
}

// ---------------------------------------------------------------------------------------------------------
// Nodes

/// Java's `NodeVo` (fastjson: camelCase, nulls left out).
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeVo {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_id: Option<String>,
    resource: String,
    thread_num: u64,
    pass_qps: u64,
    block_qps: u64,
    total_qps: u64,
    average_rt: u64,
    success_qps: u64,
    exception_qps: u64,
    one_minute_pass: u64,
    one_minute_block: u64,
    one_minute_exception: u64,
    one_minute_total: u64,
    timestamp: u64,
}

impl NodeVo {
    fn of(resource: &str, s: &NodeStats, now_ms: u64) -> Self {
        NodeVo {
            id: None,
            parent_id: None,
            resource: resource.to_string(),
            thread_num: s.threads,
            // Java truncates the rates to integers.
            pass_qps: s.pass_qps as u64,
            block_qps: s.block_qps as u64,
            total_qps: s.total_qps as u64,
            average_rt: s.avg_rt_ms as u64,
            success_qps: s.success_qps as u64,
            exception_qps: s.exception_qps as u64,
            one_minute_pass: s.minute_pass,
            one_minute_block: s.minute_block,
            one_minute_exception: s.minute_exception,
            one_minute_total: s.minute_pass + s.minute_block,
            timestamp: now_ms,
        }
    }
}

pub(crate) fn json_tree(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    fn visit(node: &crate::TreeNode, parent: &str, now: u64, out: &mut Vec<NodeVo>) {
        let id = uuid::Uuid::new_v4().to_string();
        out.push(NodeVo {
            id: Some(id.clone()),
            parent_id: Some(parent.to_string()),
            ..NodeVo::of(&node.name, &node.stats, now)
        });
        for child in &node.children {
            visit(child, &id, now, out);
        }
    }
    let now = c.engine.now_millis();
    let tree = c.engine.tree();
    let root_id = uuid::Uuid::new_v4().to_string();
    let root_stats = NodeStats::sum(&tree.iter().map(|t| t.stats.clone()).collect::<Vec<_>>());
    let mut out = vec![NodeVo { id: Some(root_id.clone()), ..NodeVo::of("machine-root", &root_stats, now) }];
    for entrance in &tree {
        visit(entrance, &root_id, now, &mut out);
    }
    Reply::json(&out)
}

pub(crate) fn cluster_node(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let not_zero = p.get("type").is_some_and(|t| t.eq_ignore_ascii_case("notZero"));
    let now = c.engine.now_millis();
    let mut names = c.engine.entered_resource_names();
    names.sort();
    let list: Vec<NodeVo> = names
        .iter()
        .filter_map(|n| c.engine.cluster_stats(n).map(|s| NodeVo::of(n, &s, now)))
        .filter(|vo| !not_zero || vo.one_minute_total > 0)
        .collect();
    Reply::json(&list)
}

/// `clusterNodeById?id=`: one resource's cluster node as a NodeVo (no id, no parent), or `{}` (Java's
/// `FetchClusterNodeByIdCommandHandler`).
pub(crate) fn cluster_node_by_id(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let Some(id) = p.get("id") else {
        return Err(CommandError("Invalid parameter: empty clusterNode name".into()));
    };
    // Java has no cluster node for a resource never entered.
    let entered = c.engine.entered_resource_names().iter().any(|n| n == id);
    match c.engine.cluster_stats(id).filter(|_| entered) {
        Some(s) => Reply::json(&NodeVo::of(id, &s, c.engine.now_millis())),
        None => Ok(Reply::json_text("{}".into())),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Nodes for people: Java's text tables and tree (`cnode`, `origin`, `tree`)

/// A number as Java's `String.valueOf(double)` writes it (`%s` of a double): `2.0`, `0.5`, `1.0E7`.
fn java_double(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if v == 0.0 || (1e-3..1e7).contains(&v.abs()) {
        return format!("{v:?}");
    }
    let s = format!("{v:e}");
    let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
    if mantissa.contains('.') {
        format!("{mantissa}E{exponent}")
    } else {
        format!("{mantissa}.0E{exponent}")
    }
}

/// Most rows of a people's table (Java's).
const TABLE_ROWS: usize = 30;
/// The widest name column of a people's table: longer names wrap onto rows of their own (Java's).
const TABLE_NAME_WIDTH: usize = 79;

/// A table as Java's `String.format("%-4s%-{name+1}s%-10s...")` rows print it: each cell padded to its
/// column's width (never cut), the name (column 1) wrapped at the name width onto rows of empty cells.
struct Table {
    widths: Vec<usize>,
    name_width: usize,
    out: String,
}

impl Table {
    /// A table whose name column fits the longest of `names` (at most [`TABLE_NAME_WIDTH`]), plus one space.
    fn new<'a>(widths: &[usize], names: impl Iterator<Item = &'a str>) -> Table {
        let name_width = names.map(|n| n.chars().count()).max().unwrap_or(0).min(TABLE_NAME_WIDTH);
        let mut widths = widths.to_vec();
        widths.insert(1, name_width + 1);
        Table { widths, name_width, out: String::new() }
    }

    fn cells(&mut self, cells: &[&str]) {
        use std::fmt::Write;
        for (w, c) in self.widths.iter().zip(cells) {
            let _ = write!(self.out, "{c:<w$}");
        }
        self.out.push('\n');
    }

    /// A row: its number, the name (wrapped), then the values.
    fn row(&mut self, idx: &str, name: &str, values: &[String]) {
        let chars: Vec<char> = name.chars().collect();
        let chunks: Vec<String> = if self.name_width == 0 || chars.len() <= self.name_width {
            vec![name.to_string()]
        } else {
            chars.chunks(self.name_width).map(|c| c.iter().collect()).collect()
        };
        let mut first: Vec<&str> = vec![idx, &chunks[0]];
        first.extend(values.iter().map(String::as_str));
        self.cells(&first);
        for chunk in &chunks[1..] {
            let mut more = vec!["", chunk.as_str()];
            more.extend(values.iter().map(|_| ""));
            self.cells(&more);
        }
    }
}

/// `cnode?id=`: the cluster nodes whose name contains `id` (30 at most), one row each (Java's
/// `FetchClusterNodeHumanCommandHandler`, numbered from 1).
pub(crate) fn cnode(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let Some(id) = p.get("id") else {
        return Err(CommandError("Invalid parameter: empty clusterNode name".into()));
    };
    let mut names = c.engine.entered_resource_names();
    names.sort();
    let nodes: Vec<(String, NodeStats)> = names
        .into_iter()
        .filter(|n| n.contains(id))
        .filter_map(|n| c.engine.cluster_stats(&n).map(|s| (n, s)))
        .take(TABLE_ROWS)
        .collect();
    let mut table = Table::new(&[4, 10, 10, 10, 11, 9, 6, 10, 11, 9, 11], nodes.iter().map(|(n, _)| n.as_str()));
    table.cells(&[
        "idx",
        "id",
        "thread",
        "pass",
        "blocked",
        "success",
        "total",
        "aRt",
        "1m-pass",
        "1m-block",
        "1m-all",
        "exception",
    ]);
    for (i, (name, s)) in nodes.iter().enumerate() {
        let values = [
            s.threads.to_string(),
            java_double(s.pass_qps),
            java_double(s.block_qps),
            java_double(s.success_qps),
            java_double(s.total_qps),
            java_double(s.avg_rt_ms),
            s.minute_pass.to_string(),
            s.minute_block.to_string(),
            (s.minute_pass + s.minute_block).to_string(),
            java_double(s.exception_qps),
        ];
        table.row(&(i + 1).to_string(), name, &values);
    }
    Ok(Reply::text(table.out))
}

/// `origin?id=`: the callers of a resource (named exactly, else the first whose name contains `id`), one row
/// per origin (30 at most; Java's `FetchOriginCommandHandler`).
pub(crate) fn origin(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let Some(id) = p.get("id") else {
        return Err(CommandError("Invalid parameter: `id` is required (a resource name)".into()));
    };
    let mut names = c.engine.entered_resource_names();
    names.sort();
    let Some(name) = names.iter().find(|n| *n == id).or_else(|| names.iter().find(|n| n.contains(id))) else {
        return Ok(Reply::text(format!("Not find cNode with id {id}")));
    };
    let mut origins = c.engine.origins_of(name);
    origins.sort_by(|a, b| a.0.cmp(&b.0));
    origins.truncate(TABLE_ROWS);
    let mut table = Table::new(&[4, 10, 10, 11, 9, 6, 10, 11, 9], origins.iter().map(|(o, _)| o.as_str()));
    table.out = format!("id: {name}\n\n");
    table.cells(&[
        "idx",
        "origin",
        "threadNum",
        "passQps",
        "blockQps",
        "totalQps",
        "aRt",
        "1m-pass",
        "1m-block",
        "1m-total",
    ]);
    for (i, (origin, s)) in origins.iter().enumerate() {
        let values = [
            s.threads.to_string(),
            java_double(s.pass_qps),
            java_double(s.block_qps),
            java_double(s.total_qps),
            java_double(s.avg_rt_ms),
            s.minute_pass.to_string(),
            s.minute_block.to_string(),
            (s.minute_pass + s.minute_block).to_string(),
        ];
        table.row(&(i + 1).to_string(), origin, &values);
    }
    Ok(Reply::text(table.out))
}

/// `tree[?id=]`: the call tree as text, from the machine root, or from the entrance named `id` (else every
/// entrance whose name contains it), a dash per level (Java's `FetchTreeCommandHandler`).
pub(crate) fn tree(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    fn line(out: &mut String, level: usize, entrance: bool, name: &str, s: &NodeStats) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "{}{}{name}(t:{} pq:{} bq:{} tq:{} rt:{} prq:{} 1mp:{} 1mb:{} 1mt:{})",
            "-".repeat(level),
            if entrance { "EntranceNode: " } else { "" },
            s.threads,
            java_double(s.pass_qps),
            java_double(s.block_qps),
            java_double(s.total_qps),
            java_double(s.avg_rt_ms),
            java_double(s.success_qps),
            s.minute_pass,
            s.minute_block,
            s.minute_pass + s.minute_block,
        );
    }
    fn visit(out: &mut String, level: usize, entrance: bool, node: &crate::TreeNode) {
        line(out, level, entrance, &node.name, &node.stats);
        for child in &node.children {
            visit(out, level + 1, false, child);
        }
    }
    let entrances = c.engine.tree();
    let mut out = String::new();
    match p.get("id") {
        None => {
            let root = NodeStats::sum(&entrances.iter().map(|t| t.stats.clone()).collect::<Vec<_>>());
            line(&mut out, 0, true, "machine-root", &root);
            for entrance in &entrances {
                visit(&mut out, 1, true, entrance);
            }
        }
        Some(id) => match entrances.iter().find(|e| e.name == id) {
            Some(entrance) => visit(&mut out, 0, true, entrance),
            None => {
                for entrance in entrances.iter().filter(|e| e.name.contains(id)) {
                    visit(&mut out, 0, true, entrance);
                }
            }
        },
    }
    out.push_str(
        "\r\n\r\nt:threadNum  pq:passQps  bq:blockQps  tq:totalQps  rt:averageRt  prq: passRequestQps 1mp:1m-pass \
         1mb:1m-block 1mt:1m-total\r\n",
    );
    Ok(Reply::text(out))
}

// ---------------------------------------------------------------------------------------------------------
// Rules

fn kind_param(p: &Params) -> Result<RuleKind, CommandError> {
    match p.get("type").map(|t| t.trim().to_ascii_lowercase()).as_deref() {
        Some("flow") => Ok(RuleKind::Flow),
        Some("degrade") => Ok(RuleKind::Degrade),
        Some("system") => Ok(RuleKind::System),
        Some("authority") => Ok(RuleKind::Authority),
        Some("adaptive") => Ok(RuleKind::Adaptive),
        Some(other) => Err(CommandError(format!(
            "invalid type `{}`: use flow, degrade, system, authority or adaptive (hot-parameter rules: getParamFlowRules / setParamFlowRules)",
            other.chars().take(40).collect::<String>()
        ))),
        None => Err(CommandError(
            "invalid type: `type` is required (flow, degrade, system, authority or adaptive)".into(),
        )),
    }
}

fn to_json<R: RuleData>(rules: &[R]) -> Result<Reply, CommandError> {
    rules_to_string(rules, Format::Json)
        .map(Reply::json_text)
        .map_err(|e| CommandError(format!("could not encode the rules: {e}")))
}

/// The rules of `kind` in force, in Sentinel's JSON.
pub(crate) fn rules_json(engine: &Sentinel, kind: RuleKind) -> Result<Reply, CommandError> {
    match kind {
        RuleKind::Flow => to_json(&engine.flow_rules()),
        RuleKind::Degrade => to_json(&engine.degrade_rules()),
        RuleKind::System => to_json(&engine.system_rules()),
        RuleKind::Authority => to_json(&engine.authority_rules()),
        RuleKind::ParamFlow => to_json(&engine.param_flow_rules()),
        RuleKind::Adaptive => to_json(&engine.adaptive_rules()),
    }
}

pub(crate) fn get_rules(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    rules_json(&c.engine, kind_param(p)?)
}

pub(crate) fn get_param_rules(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    rules_json(&c.engine, RuleKind::ParamFlow)
}

pub(crate) fn set_rules(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let kind = kind_param(p)?;
    push_rules(c, kind, p)
}

pub(crate) fn set_param_rules(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    push_rules(c, RuleKind::ParamFlow, p)
}

/// Parses `data` (decoded once, unlike Java), loads it (the engine validates it: nothing changes on an
/// error), then writes it back to the data source, if there is one.
fn push_rules(c: &Center, kind: RuleKind, p: &Params) -> Result<Reply, CommandError> {
    let Some(data) = p.0.get("data") else {
        return Err(CommandError(format!("`data` is required: a JSON array of {kind} rules (`[]` removes them all)")));
    };
    let parse_err = |e: crate::datasource::ParseError| CommandError(format!("invalid {kind} rules in `data`: {e}"));
    let mut set = RuleSet::default();
    match kind {
        RuleKind::Flow => set.flow = Some(parse_rules::<FlowRule>(data, Format::Json).map_err(parse_err)?),
        RuleKind::Degrade => set.degrade = Some(parse_rules::<DegradeRule>(data, Format::Json).map_err(parse_err)?),
        RuleKind::System => set.system = Some(parse_rules::<SystemRule>(data, Format::Json).map_err(parse_err)?),
        RuleKind::Authority => {
            set.authority = Some(parse_rules::<AuthorityRule>(data, Format::Json).map_err(parse_err)?)
        }
        RuleKind::ParamFlow => {
            set.param_flow = Some(parse_rules::<ParamFlowRule>(data, Format::Json).map_err(parse_err)?)
        }
        RuleKind::Adaptive => set.adaptive = Some(parse_rules::<AdaptiveRule>(data, Format::Json).map_err(parse_err)?),
    }
    let _serial = c.writes.lock().unwrap_or_else(|e| e.into_inner());
    set.apply(&c.engine).map_err(|e| CommandError(e.to_string()))?;
    tracing::info!(%kind, "rules pushed through the command center are in force");
    // What is written is what is in force (a file source adds every other kind the file holds, as in force),
    // so `success` survives a restart.
    let snapshot = RuleSet::snapshot(&c.engine, &[kind]);
    Ok(written_back(c, Stored::Rules(kind), Box::new(move |source| source.write_rules(&snapshot))))
}

/// Writes what a push put in force back to the data source, if there is one, after the writes of earlier
/// pushes and waiting at most the writer's deadline: `success`, or [`WRITE_DATA_SOURCE_FAILED`] (the rules
/// are in force) when the store could not be written or did not answer in time.
pub(super) fn written_back(c: &Center, stored: Stored, write: super::write_back::Write) -> Reply {
    match c.write_back.as_ref().map(|w| w.write(stored, write)) {
        None | Some(Ok(())) => Reply::text("success"),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the pushed rules are in force but were not written back");
            Reply { write_error: Some(e), ..Reply::text(WRITE_DATA_SOURCE_FAILED) }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// For people

pub(crate) fn basic_info(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    #[derive(Serialize)]
    struct Info<'a> {
        machine: &'a str,
        ip: &'a str,
    }
    Reply::json(&Info { machine: &c.machine.hostname, ip: &c.machine.ip })
}

pub(crate) fn get_switch(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    Ok(Reply::text(format!("Sentinel switch value: {}", c.engine.is_enabled())))
}

pub(crate) fn set_switch(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    // Java reads anything but `true` as false, so a typo turns protection off: here it is an error.
    let value = match p.get("value").map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        Some("true") => true,
        Some("false") => false,
        other => {
            return Err(CommandError(format!(
                "`value` must be true or false, not `{}`; the switch is unchanged",
                other.unwrap_or("").chars().take(40).collect::<String>()
            )))
        }
    };
    c.engine.set_enabled(value);
    tracing::info!(value, "Sentinel switch set through the command center");
    Ok(Reply::text(format!("Sentinel set switch value: {value}")))
}

pub(crate) fn system_status(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    #[derive(Serialize)]
    struct Status {
        rqps: f64,
        qps: f64,
        b: f64,
        r: f64,
        t: u64,
    }
    let s = c.engine.inbound_stats();
    Reply::json(&Status { rqps: s.success_qps, qps: s.pass_qps, b: s.block_qps, r: s.avg_rt_ms, t: s.threads })
}

pub(crate) fn diagnose(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let Some(resource) = p.get("resource") else {
        return Err(CommandError("`resource` is required: the name of the resource to explain".into()));
    };
    Ok(Reply::text(c.engine.diagnose(resource).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_print_as_java_prints_them() {
        for (v, java) in [(0.0, "0.0"), (2.0, "2.0"), (0.5, "0.5"), (10.25, "10.25"), (1e7, "1.0E7"), (1.5e7, "1.5E7")]
        {
            assert_eq!(java_double(v), java, "{v}");
        }
        assert_eq!(java_double(0.0001), "1.0E-4");
    }

    #[test]
    fn a_long_name_wraps_at_the_name_width_onto_rows_of_empty_cells() {
        let long = "x".repeat(100);
        let mut t = Table::new(&[2, 3], [long.as_str()].into_iter());
        t.row("1", &long, &["7".to_string()]);
        let want = format!("{:<2}{:<80}{:<3}\n{:<2}{:<80}{:<3}\n", "1", "x".repeat(79), "7", "", "x".repeat(21), "");
        assert_eq!(t.out, want);
    }
}
