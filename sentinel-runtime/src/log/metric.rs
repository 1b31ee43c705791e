//! The metric log: one line per resource per second, with a binary index, rolled by size and count.
//!
//! Files, as Java's `MetricWriter` names them: `{app}-metrics.log.{yyyy-MM-dd}`, then `.1`, `.2`, ... when a
//! file reaches its size or the process restarts; each with `{file}.idx`, a sequence of big-endian `i64`
//! pairs `(second since the epoch, byte offset of that second's first line)`. Dots in the app name become
//! `-`. When a new file would exceed the file count, the oldest files (and their indexes) are deleted.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

use super::time::{format_date, format_date_time};
use crate::{SecondTotals, Sentinel};

const INDEX_SUFFIX: &str = ".idx";

/// The name Java's metric log gives the global inbound node (all `In` entries).
pub const TOTAL_INBOUND: &str = "__total_inbound_traffic__";

/// One line of the metric log: a resource's totals over one second.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricLine {
    /// Start of the second, ms since the epoch.
    pub timestamp_ms: u64,
    /// The resource (a `|` in the name is written as `_`, as Java does).
    pub resource: String,
    /// Passed calls.
    pub pass: u64,
    /// Blocked calls.
    pub block: u64,
    /// Completed calls.
    pub success: u64,
    /// Completed calls with a traced error.
    pub exception: u64,
    /// Average response time of the completed calls, ms.
    pub rt_ms: u64,
    /// Prioritized calls that borrowed a later window.
    pub occupied_pass: u64,
    /// Calls in flight when the line was written.
    pub concurrency: u64,
    /// Java's resource classification (0: common).
    pub classification: i32,
}

impl MetricLine {
    /// The line of a resource's second, with the concurrency read when the line is made.
    pub fn of_second(resource: &str, t: &SecondTotals, concurrency: u64) -> Self {
        MetricLine {
            timestamp_ms: t.start_ms,
            resource: resource.to_string(),
            pass: t.pass,
            block: t.block,
            success: t.success,
            exception: t.exception,
            rt_ms: t.rt_ms,
            occupied_pass: t.occupied_pass,
            concurrency,
            classification: 0,
        }
    }
}

impl fmt::Display for MetricLine {
    /// Java's `MetricNode.toFatString` (without the newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
            self.timestamp_ms,
            format_date_time(self.timestamp_ms),
            self.resource.replace('|', "_"),
            self.pass,
            self.block,
            self.success,
            self.exception,
            self.rt_ms,
            self.occupied_pass,
            self.concurrency,
            self.classification
        )
    }
}

/// A line that is not in the metric log format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a metric log line: {0:?}")]
pub struct BadMetricLine(pub String);

impl FromStr for MetricLine {
    type Err = BadMetricLine;
    fn from_str(line: &str) -> Result<Self, BadMetricLine> {
        let bad = || BadMetricLine(line.to_string());
        let parts: Vec<&str> = line.trim_end_matches(['\r', '\n']).split('|').collect();
        if parts.len() < 8 {
            return Err(bad());
        }
        let n = |i: usize| -> Result<u64, BadMetricLine> {
            parts.get(i).map_or(Ok(0), |s| s.trim().parse::<u64>().map_err(|_| bad()))
        };
        Ok(MetricLine {
            timestamp_ms: n(0)?,
            resource: parts[2].to_string(),
            pass: n(3)?,
            block: n(4)?,
            success: n(5)?,
            exception: n(6)?,
            rt_ms: n(7)?,
            occupied_pass: n(8)?,
            concurrency: n(9)?,
            classification: parts.get(10).map_or(Ok(0), |s| s.trim().parse::<i32>().map_err(|_| bad()))?,
        })
    }
}

/// The base name of an app's metric files: `{app}-metrics.log`, dots in the app name replaced by `-`.
pub fn metric_file_base_name(app_name: &str) -> String {
    format!("{}-metrics.log", app_name.replace('.', "-"))
}

/// `(date, number)` of a metric file name `{base}.{yyyy-MM-dd}[.{n}]`, if it is one.
fn parse_file_name(name: &str, base: &str) -> Option<(String, u64)> {
    let rest = name.strip_prefix(base)?.strip_prefix('.')?;
    let (date, n) = match rest.split_once('.') {
        Some((d, n)) => (d, n.parse::<u64>().ok()?),
        None => (rest, 0),
    };
    let b = date.as_bytes();
    let is_date = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() });
    is_date.then(|| (date.to_string(), n))
}

/// The metric files of `base` in `dir`, oldest first.
fn list_files(dir: &Path, base: &str) -> io::Result<Vec<(String, u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(INDEX_SUFFIX) {
            continue;
        }
        if let Some((date, n)) = parse_file_name(name, base) {
            out.push((date, n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn index_path(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_os_string();
    s.push(INDEX_SUFFIX);
    PathBuf::from(s)
}

struct OpenFile {
    date: String,
    out: BufWriter<File>,
    index: BufWriter<File>,
    size: u64,
}

#[derive(Default)]
struct WriterState {
    file: Option<OpenFile>,
    /// The last second written (its start, ms).
    last_second: Option<u64>,
}

/// Writes an engine's metric log. [`Logs::start`](super::Logs::start) runs it in the background; tests call
/// [`flush_once`](MetricLogWriter::flush_once).
pub struct MetricLogWriter {
    engine: Sentinel,
    dir: PathBuf,
    base: String,
    file_size: u64,
    file_count: usize,
    state: Mutex<WriterState>,
}

impl fmt::Debug for MetricLogWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricLogWriter").field("dir", &self.dir).field("base", &self.base).finish_non_exhaustive()
    }
}

impl MetricLogWriter {
    /// A writer of `engine`'s metrics into `dir` (created if missing), rolling at `file_size` bytes and
    /// keeping at most `file_count` files (both at least 1).
    pub fn new(engine: &Sentinel, dir: impl AsRef<Path>, file_size: u64, file_count: usize) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir)?;
        Ok(MetricLogWriter {
            engine: engine.clone(),
            base: metric_file_base_name(&engine.config().app_name),
            dir,
            file_size: file_size.max(1),
            file_count: file_count.max(1),
            state: Mutex::new(WriterState::default()),
        })
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The base name of the files (`{app}-metrics.log`).
    pub fn base_name(&self) -> &str {
        &self.base
    }

    /// Writes every whole second before `now_ms` not written yet (seconds with no event are left out, as in
    /// Java). Returns the number of lines written. `now_ms` should be the engine clock's time.
    pub fn flush_once(&self, now_ms: u64) -> io::Result<usize> {
        let boundary = now_ms - now_ms % 1000;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let after = state.last_second;
        let mut by_second: BTreeMap<u64, Vec<MetricLine>> = BTreeMap::new();
        let mut add = |name: &str, concurrency: u64, seconds: Vec<SecondTotals>| {
            for t in seconds {
                if t.start_ms >= boundary || after.is_some_and(|a| t.start_ms <= a) {
                    continue;
                }
                by_second.entry(t.start_ms).or_default().push(MetricLine::of_second(name, &t, concurrency));
            }
        };
        for name in self.engine.resource_names() {
            let concurrency = self.engine.cluster_stats(&name).map(|s| s.threads).unwrap_or(0);
            add(&name, concurrency, self.engine.resource_complete_seconds(&name));
        }
        // Java also writes the global inbound node under this name (the dashboard's "total" line).
        let inbound = &self.engine.shared.inbound;
        add(TOTAL_INBOUND, inbound.cur_threads(), self.engine.inbound_complete_seconds());
        let mut written = 0;
        for (second, lines) in by_second {
            self.write_second(&mut state, second, &lines)?;
            state.last_second = Some(second);
            written += lines.len();
        }
        Ok(written)
    }

    fn write_second(&self, state: &mut WriterState, second: u64, lines: &[MetricLine]) -> io::Result<()> {
        let date = format_date(second);
        if state.file.as_ref().is_none_or(|f| f.date != date) {
            state.file = None;
            state.file = Some(self.open_next(&date)?);
        }
        let Some(file) = state.file.as_mut() else {
            return Ok(());
        };
        file.index.write_all(&((second / 1000) as i64).to_be_bytes())?;
        file.index.write_all(&(file.size as i64).to_be_bytes())?;
        let mut text = String::new();
        for l in lines {
            text.push_str(&l.to_string());
            text.push('\n');
        }
        file.out.write_all(text.as_bytes())?;
        file.size += text.len() as u64;
        file.out.flush()?;
        file.index.flush()?;
        if file.size >= self.file_size {
            state.file = None;
        }
        Ok(())
    }

    fn open_next(&self, date: &str) -> io::Result<OpenFile> {
        let files = list_files(&self.dir, &self.base)?;
        // Keep `file_count - 1` files, so that with the new one there are `file_count`.
        let excess = (files.len() + 1).saturating_sub(self.file_count);
        for (_, _, p) in files.iter().take(excess) {
            let _ = fs::remove_file(p);
            let _ = fs::remove_file(index_path(p));
        }
        let same_day: Vec<u64> = files.iter().filter(|(d, _, _)| d == date).map(|(_, n, _)| *n).collect();
        let name = match same_day.iter().max() {
            None => format!("{}.{date}", self.base),
            Some(n) => format!("{}.{date}.{}", self.base, n + 1),
        };
        let path = self.dir.join(name);
        let out = OpenOptions::new().create(true).truncate(true).write(true).open(&path)?;
        let index = OpenOptions::new().create(true).truncate(true).write(true).open(index_path(&path))?;
        Ok(OpenFile { date: date.to_string(), out: BufWriter::new(out), index: BufWriter::new(index), size: 0 })
    }
}

/// Reads an app's metric log: "the metrics of resource X between t1 and t2", as a dashboard asks.
#[derive(Clone, Debug)]
pub struct MetricSearcher {
    dir: PathBuf,
    base: String,
}

impl MetricSearcher {
    /// A reader of the metric files of `app_name` in `dir`.
    pub fn new(dir: impl AsRef<Path>, app_name: &str) -> Self {
        MetricSearcher { dir: dir.as_ref().to_path_buf(), base: metric_file_base_name(app_name) }
    }

    /// Lines with `begin_ms <= timestamp <= end_ms`, of `resource` (or of every resource), oldest first.
    /// Each file's index is used to start reading at the first second at or after `begin_ms`.
    pub fn find(&self, resource: Option<&str>, begin_ms: u64, end_ms: u64) -> io::Result<Vec<MetricLine>> {
        let mut out = Vec::new();
        for (_, _, path) in list_files(&self.dir, &self.base)? {
            let Some(offset) = first_offset_at_or_after(&index_path(&path), begin_ms / 1000)? else {
                continue;
            };
            let mut file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            file.seek(SeekFrom::Start(offset))?;
            for line in BufReader::new(file).lines() {
                let Ok(m) = line?.parse::<MetricLine>() else {
                    continue;
                };
                if m.timestamp_ms > end_ms {
                    break;
                }
                if m.timestamp_ms >= begin_ms && resource.is_none_or(|r| r == m.resource) {
                    out.push(m);
                }
            }
        }
        Ok(out)
    }
}

/// The offset of the first indexed second `>= second`; `None` when the file has none.
fn first_offset_at_or_after(index: &Path, second: u64) -> io::Result<Option<u64>> {
    let mut bytes = Vec::new();
    match File::open(index) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    for entry in bytes.chunks_exact(16) {
        let mut s = [0u8; 8];
        let mut o = [0u8; 8];
        s.copy_from_slice(&entry[..8]);
        o.copy_from_slice(&entry[8..]);
        let (s, o) = (i64::from_be_bytes(s), i64::from_be_bytes(o));
        if s >= second as i64 {
            return Ok(Some(o.max(0) as u64));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::flow::FlowRule;

    const T0: u64 = 1_700_000_000_000; // 2023-11-14 22:13:20 UTC

    fn setup(app: &str) -> (Sentinel, ManualClock, tempfile::TempDir) {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).app_name(app).build();
        (engine, clock, tempfile::tempdir().unwrap())
    }

    #[test]
    fn line_format_matches_sentinel() {
        let l = MetricLine {
            timestamp_ms: T0,
            resource: "a|b".into(),
            pass: 3,
            block: 1,
            success: 3,
            exception: 1,
            rt_ms: 12,
            occupied_pass: 0,
            concurrency: 2,
            classification: 0,
        };
        let s = l.to_string();
        assert_eq!(s, "1700000000000|2023-11-14 22:13:20|a_b|3|1|3|1|12|0|2|0");
        let back: MetricLine = s.parse().unwrap();
        assert_eq!(back, MetricLine { resource: "a_b".into(), ..l });
        assert!("nonsense".parse::<MetricLine>().is_err());
    }

    #[test]
    fn one_line_per_resource_per_second_with_index() {
        let (engine, clock, dir) = setup("com.shop.orders");
        engine.load_flow_rules(vec![FlowRule::new("api").count(2.0)]).unwrap();
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        let api = engine.resource("api");
        let other = engine.resource("other");
        for _ in 0..3 {
            let e = api.enter();
            clock.advance_millis(5);
            drop(e);
        }
        drop(other.enter().unwrap());
        clock.advance_millis(1000);
        for _ in 0..2 {
            drop(api.enter());
        }
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 2, "only the whole second before now");
        clock.advance_millis(1000);
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 1);
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 0, "nothing written twice");

        let file = dir.path().join("com-shop-orders-metrics.log.2023-11-14");
        let text = fs::read_to_string(&file).unwrap();
        let lines: Vec<MetricLine> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(lines.len(), 3);
        let first = lines.iter().find(|l| l.resource == "api" && l.timestamp_ms == T0).unwrap();
        assert_eq!((first.pass, first.block, first.success, first.rt_ms), (2, 1, 2, 5));
        assert!(text.starts_with("1700000000000|2023-11-14 22:13:20|"));
        let second = lines.iter().find(|l| l.timestamp_ms == T0 + 1000).unwrap();
        assert_eq!((second.resource.as_str(), second.pass), ("api", 2));

        let idx = fs::read(index_path(&file)).unwrap();
        assert_eq!(idx.len(), 32, "one entry per second");
        assert_eq!(i64::from_be_bytes(idx[0..8].try_into().unwrap()), (T0 / 1000) as i64);
        assert_eq!(i64::from_be_bytes(idx[8..16].try_into().unwrap()), 0);
        assert_eq!(i64::from_be_bytes(idx[16..24].try_into().unwrap()), (T0 / 1000 + 1) as i64);
        let offset = i64::from_be_bytes(idx[24..32].try_into().unwrap()) as usize;
        assert!(text[offset..].starts_with(&(T0 + 1000).to_string()));
    }

    #[test]
    fn searcher_answers_a_resource_between_two_times() {
        let (engine, clock, dir) = setup("app");
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        let api = engine.resource("api");
        let db = engine.resource("db");
        for s in 0..10u64 {
            for _ in 0..=s {
                drop(api.enter().unwrap());
            }
            drop(db.enter().unwrap());
            clock.advance_millis(1000);
            w.flush_once(clock.now_millis()).unwrap();
        }
        let found = MetricSearcher::new(dir.path(), "app").find(Some("api"), T0 + 3000, T0 + 5000).unwrap();
        let got: Vec<(u64, u64)> = found.iter().map(|l| (l.timestamp_ms, l.pass)).collect();
        assert_eq!(got, vec![(T0 + 3000, 4), (T0 + 4000, 5), (T0 + 5000, 6)]);
        let all = MetricSearcher::new(dir.path(), "app").find(None, T0, T0 + 60_000).unwrap();
        assert_eq!(all.len(), 20);
        assert!(MetricSearcher::new(dir.path(), "nope").find(None, 0, u64::MAX).unwrap().is_empty());
    }

    #[test]
    fn files_roll_by_size_and_the_oldest_are_removed() {
        let (engine, clock, dir) = setup("app");
        // Every line is ~60 bytes: a 100-byte file holds two seconds.
        let w = MetricLogWriter::new(&engine, dir.path(), 100, 3).unwrap();
        let api = engine.resource("api");
        for _ in 0..12 {
            drop(api.enter().unwrap());
            clock.advance_millis(1000);
            w.flush_once(clock.now_millis()).unwrap();
        }
        let names: Vec<String> = list_files(dir.path(), "app-metrics.log")
            .unwrap()
            .into_iter()
            .map(|(_, _, p)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["app-metrics.log.2023-11-14.3", "app-metrics.log.2023-11-14.4", "app-metrics.log.2023-11-14.5"]
        );
        for n in &names {
            assert!(dir.path().join(format!("{n}.idx")).exists());
        }
        assert!(!dir.path().join("app-metrics.log.2023-11-14.idx").exists(), "removed with its file");
        // The newest seconds are still found.
        let found = MetricSearcher::new(dir.path(), "app").find(Some("api"), T0 + 11_000, T0 + 11_000).unwrap();
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn inbound_traffic_gets_the_java_total_line() {
        let (engine, clock, dir) = setup("app");
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        let web = engine.resource_typed("web", crate::EntryType::In);
        drop(web.enter().unwrap());
        drop(web.enter().unwrap());
        drop(engine.enter("outbound").unwrap());
        clock.advance_millis(1000);
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 3);
        let total = MetricSearcher::new(dir.path(), "app").find(Some(TOTAL_INBOUND), T0, T0).unwrap();
        assert_eq!(total.len(), 1);
        assert_eq!((total[0].pass, total[0].success), (2, 2), "only In entries count");
    }

    #[test]
    fn a_new_day_starts_a_new_file() {
        let day_end = 1_700_006_399_000; // 2023-11-14 23:59:59
        let clock = ManualClock::at_millis(day_end);
        let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("app").build();
        let dir = tempfile::tempdir().unwrap();
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        drop(engine.enter("api").unwrap());
        clock.advance_millis(1000);
        drop(engine.enter("api").unwrap());
        clock.advance_millis(1000);
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 2);
        assert!(dir.path().join("app-metrics.log.2023-11-14").exists());
        assert!(dir.path().join("app-metrics.log.2023-11-15").exists());
    }

    #[test]
    fn file_names_are_matched_like_java() {
        assert_eq!(parse_file_name("a-metrics.log.2024-01-02", "a-metrics.log"), Some(("2024-01-02".into(), 0)));
        assert_eq!(parse_file_name("a-metrics.log.2024-01-02.7", "a-metrics.log"), Some(("2024-01-02".into(), 7)));
        assert_eq!(parse_file_name("a-metrics.log.2024-1-02", "a-metrics.log"), None);
        assert_eq!(parse_file_name("b-metrics.log.2024-01-02", "a-metrics.log"), None);
        assert_eq!(metric_file_base_name("com.x.y"), "com-x-y-metrics.log");
    }
}
