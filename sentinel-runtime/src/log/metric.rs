//! The metric log: one line per resource per second, with a binary index, rolled by size and count.
//!
//! Files, as Java's `MetricWriter` names them: `{app}-metrics.log.{yyyy-MM-dd}`, then `.1`, `.2`, ... when a
//! file reaches its size, the process restarts, or the file or its index is removed; each with `{file}.idx`,
//! a sequence of big-endian `i64` pairs `(second since the epoch, byte offset of that second's first line)`.
//! Dots in the app name become `-`. When a new file would exceed the file count, the oldest files (and their
//! indexes) are deleted.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
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
    /// The resource (`|`, `\n` and `\r` in the name are written as `_`, see
    /// [`metric_line_name`](crate::stat::metric_line_name)).
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
            crate::stat::metric_line_name(&self.resource),
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
        if !(8..=11).contains(&parts.len()) {
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
    /// The metric file's path (its index is beside it).
    path: PathBuf,
    out: File,
    index: File,
    /// Bytes of whole seconds in `out`: where the next second starts.
    size: u64,
    /// Bytes of whole entries in `index`.
    index_len: u64,
}

impl OpenFile {
    /// Whether the file and its index are still in the directory (a name, whatever it now is).
    fn still_there(&self) -> bool {
        fs::symlink_metadata(&self.path).is_ok() && fs::symlink_metadata(index_path(&self.path)).is_ok()
    }
}

#[derive(Default)]
struct WriterState {
    file: Option<OpenFile>,
    /// The last second written (its start, ms).
    last_second: Option<u64>,
}

/// Writes an engine's metric log. [`Logs::start`](super::Logs::start) runs it in the background; tests call
/// [`flush_once`](MetricLogWriter::flush_once).
///
/// A second is written whole or not at all: when a write fails (a full disk), the file and its index are cut
/// back to the end of the last whole second and the second is tried again at the next flush (seconds the
/// engine no longer keeps by then are missing from the log). If the cut itself fails, the next second starts
/// a new file, and the torn end is never indexed.
pub struct MetricLogWriter {
    engine: Sentinel,
    dir: PathBuf,
    base: String,
    file_size: u64,
    file_count: usize,
    state: Mutex<WriterState>,
    #[cfg(test)]
    fail_after: Mutex<Option<(u64, io::ErrorKind)>>,
}

impl fmt::Debug for MetricLogWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricLogWriter").field("dir", &self.dir).field("base", &self.base).finish_non_exhaustive()
    }
}

impl MetricLogWriter {
    /// A writer of `engine`'s metrics into `dir` (created if missing), rolling at `file_size` bytes and
    /// keeping at most `file_count` files (both at least 1).
    ///
    /// New files are created exclusively (never through an existing file or symbolic link of the same
    /// name); the directory itself is trusted: use one only the application's user can write to.
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
            #[cfg(test)]
            fail_after: Mutex::new(None),
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
    ///
    /// # Errors
    /// The first second that could not be written (nothing of it is left in the files; it is tried again at
    /// the next call, and the seconds after it are not written before it).
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
            self.write_second(&mut state, second, &lines).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("metric log: the second {} was not written ({e}); it is tried again", second / 1000),
                )
            })?;
            state.last_second = Some(second);
            written += lines.len();
        }
        Ok(written)
    }

    fn write_second(&self, state: &mut WriterState, second: u64, lines: &[MetricLine]) -> io::Result<()> {
        let date = format_date(second);
        // As Java's `MetricWriter`: a file or index removed meanwhile (by hand, by a clean-up job) starts a new file.
        if state.file.as_ref().is_none_or(|f| f.date != date || !f.still_there()) {
            state.file = None;
            state.file = Some(self.open_next(&date)?);
        }
        let Some(file) = state.file.as_mut() else {
            return Ok(());
        };
        let mut text = String::new();
        for l in lines {
            text.push_str(&l.to_string());
            text.push('\n');
        }
        let mut entry = [0u8; 16];
        entry[..8].copy_from_slice(&((second / 1000) as i64).to_be_bytes());
        entry[8..].copy_from_slice(&(file.size as i64).to_be_bytes());
        let written = self
            .write_at(&mut file.out, file.size, text.as_bytes())
            .and_then(|()| self.write_at(&mut file.index, file.index_len, &entry));
        if let Err(e) = written {
            // Nothing of this second stays: cut both files back to the last whole second.
            let cut = file.out.set_len(file.size).and_then(|()| file.index.set_len(file.index_len));
            if cut.is_err() {
                state.file = None; // the next second starts a new file; the torn end here is never indexed
            }
            return Err(e);
        }
        file.size += text.len() as u64;
        file.index_len += entry.len() as u64;
        if file.size >= self.file_size {
            state.file = None;
        }
        Ok(())
    }

    /// Writes all of `bytes` at `offset` of `f`.
    fn write_at(&self, f: &mut File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        f.seek(SeekFrom::Start(offset))?;
        #[cfg(test)]
        {
            let hook = *self.fail_after.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((budget, kind)) = hook {
                // Test hook: the disk has room for `budget` more bytes, then fails like a full disk.
                let fits = (budget as usize).min(bytes.len());
                f.write_all(&bytes[..fits])?;
                *self.fail_after.lock().unwrap_or_else(|e| e.into_inner()) = Some((budget - fits as u64, kind));
                if fits < bytes.len() {
                    return Err(io::Error::from(kind));
                }
                return Ok(());
            }
        }
        f.write_all(bytes)
    }

    fn open_next(&self, date: &str) -> io::Result<OpenFile> {
        let files = list_files(&self.dir, &self.base)?;
        // Keep `file_count - 1` files, so that with the new one there are `file_count`.
        let excess = (files.len() + 1).saturating_sub(self.file_count);
        for (_, _, p) in files.iter().take(excess) {
            let _ = fs::remove_file(p);
            let _ = fs::remove_file(index_path(p));
        }
        let next = files.iter().filter(|(d, _, _)| d == date).map(|(_, n, _)| n + 1).max().unwrap_or(0);
        // A name taken in the meantime (or by anything that is not ours) is passed over, never opened.
        let mut last_error = None;
        for n in next..next + 16 {
            let name = if n == 0 { format!("{}.{date}", self.base) } else { format!("{}.{date}.{n}", self.base) };
            let path = self.dir.join(name);
            let out = match super::create_new(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            // An index left without its file is stale (removing a link removes the link, not its target).
            let idx = index_path(&path);
            let index = match fs::remove_file(&idx) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => super::create_new(&idx),
            };
            return match index {
                Ok(index) => Ok(OpenFile { date: date.to_string(), path, out, index, size: 0, index_len: 0 }),
                Err(e) => {
                    let _ = fs::remove_file(&path);
                    Err(e)
                }
            };
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("no free metric log file name")))
    }
}

/// Lines a [`MetricSearcher`] returns at most by default.
pub const DEFAULT_MAX_LINES: usize = 100_000;
/// Bytes of lines (as written in the log) a [`MetricSearcher`] holds at most by default: 16 MiB.
pub const DEFAULT_MAX_BYTES: usize = 16 << 20;
/// Seconds of log a [`MetricSearcher`] reads at most by default, from the first second it finds: a day.
pub const DEFAULT_MAX_SECONDS: u64 = 86_400;
/// A line longer than this is skipped (and not held while it is read past).
const MAX_LINE_BYTES: usize = 64 * 1024;

/// Reads an app's metric log: "the metrics of resource X between t1 and t2", as a dashboard asks.
///
/// A search streams the files through their indexes: it seeks to the first second asked for, reads one
/// second's bytes at a time, and stops at the end of the range or at its bounds, whichever comes first: at
/// most [`max_lines`](Self::max_lines) lines (and the rest of their last second) and
/// [`max_bytes`](Self::max_bytes) bytes of lines held (whole seconds), and at
/// most [`max_seconds`](Self::max_seconds) seconds of log read. Memory is what is answered plus a buffer.
///
/// A line is trusted only where the index puts its second: a torn or foreign line (a write cut by a full
/// disk, a line of another second) is skipped and counted, and the search goes on with the next line.
#[derive(Clone, Debug)]
pub struct MetricSearcher {
    dir: PathBuf,
    base: String,
    max_lines: usize,
    max_bytes: usize,
    max_seconds: u64,
}

/// What a [`MetricSearcher::search`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricSearch {
    /// The lines found, oldest first (in the order of the log within a second).
    pub lines: Vec<MetricLine>,
    /// Whether a bound stopped the search before the end of the range: ask again from the second after the
    /// last line's for the rest.
    pub truncated: bool,
    /// Bytes of log files (indexes included) the search went through.
    pub bytes_read: u64,
    /// Lines skipped because they are torn or not where the index puts them.
    pub skipped_lines: u64,
}

impl MetricSearcher {
    /// A reader of the metric files of `app_name` in `dir`, with the default bounds.
    pub fn new(dir: impl AsRef<Path>, app_name: &str) -> Self {
        MetricSearcher {
            dir: dir.as_ref().to_path_buf(),
            base: metric_file_base_name(app_name),
            max_lines: DEFAULT_MAX_LINES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_seconds: DEFAULT_MAX_SECONDS,
        }
    }

    /// Returns `n` lines (default [`DEFAULT_MAX_LINES`]) and the rest of the last second begun, as Java's
    /// `MetricsReader` does: asking again from the next second loses no line.
    #[must_use]
    pub fn max_lines(mut self, n: usize) -> Self {
        self.max_lines = n;
        self
    }

    /// Holds at most `n` bytes of lines, counted as written in the log (default [`DEFAULT_MAX_BYTES`]).
    #[must_use]
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// Reads at most `n` seconds of log, counted from the first second found (default
    /// [`DEFAULT_MAX_SECONDS`]; at least 1).
    #[must_use]
    pub fn max_seconds(mut self, n: u64) -> Self {
        self.max_seconds = n.max(1);
        self
    }

    /// Lines of the seconds from the one `begin_ms` falls in to the one `end_ms` falls in (as Java's
    /// `MetricSearcher`: `begin_ms / 1000 <= second <= end_ms / 1000`), of `resource` (or of every resource),
    /// oldest first, within the searcher's bounds ([`search`](Self::search) also says whether they cut the
    /// answer short). A resource is matched by its name as the log writes it ([`crate::stat::metric_line_name`]).
    pub fn find(&self, resource: Option<&str>, begin_ms: u64, end_ms: u64) -> io::Result<Vec<MetricLine>> {
        self.search(resource, begin_ms, end_ms).map(|s| s.lines)
    }

    /// Like [`find`](Self::find), with whether the bounds cut the answer short and what was read.
    pub fn search(&self, resource: Option<&str>, begin_ms: u64, end_ms: u64) -> io::Result<MetricSearch> {
        let mut search = Search {
            bounds: self,
            resource: resource.map(|r| crate::stat::metric_line_name(r).into_owned()),
            first: begin_ms / 1000,
            last: end_ms / 1000,
            anchor: None,
            previous: None,
            held_bytes: 0,
            found: MetricSearch::default(),
        };
        if search.first > search.last {
            return Ok(search.found);
        }
        for (_, _, path) in list_files(&self.dir, &self.base)? {
            match search.file(&path) {
                Ok(Reading::More) => {}
                Ok(Reading::Done) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {} // removed by a roll meanwhile
                Err(e) => return Err(e),
            }
        }
        Ok(search.found)
    }
}

/// Whether a search goes on after a file or a second.
enum Reading {
    More,
    Done,
}

/// One search in progress.
struct Search<'a> {
    bounds: &'a MetricSearcher,
    resource: Option<String>,
    /// First and last second asked for.
    first: u64,
    last: u64,
    /// The first second found (the span bound counts from it).
    anchor: Option<u64>,
    /// The last second read: an index entry that does not go forward is passed over.
    previous: Option<u64>,
    held_bytes: usize,
    found: MetricSearch,
}

impl Search<'_> {
    /// Reads what `path` holds of the range.
    fn file(&mut self, path: &Path) -> io::Result<Reading> {
        let mut index = File::open(index_path(path))?;
        let entries = index.metadata()?.len() / 16;
        if entries == 0 || self.entry_at(&mut index, entries - 1)?.0 < self.first {
            return Ok(Reading::More);
        }
        // The first entry at or after the first second (the index is in time order).
        let (mut lo, mut hi) = (0, entries - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.entry_at(&mut index, mid)?.0 < self.first {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        index.seek(SeekFrom::Start(lo * 16))?;
        let mut index = BufReader::with_capacity(16 * 256, index);
        let mut data = BufReader::new(File::open(path)?);
        let mut position = 0;
        let mut entry = self.next_entry(&mut index)?;
        while let Some((second, offset)) = entry {
            let next = self.next_entry(&mut index)?;
            if second > self.last {
                return Ok(Reading::Done);
            }
            if self.previous.is_some_and(|p| second <= p) || second < self.first {
                entry = next;
                continue;
            }
            let anchor = *self.anchor.get_or_insert(second);
            if second - anchor >= self.bounds.max_seconds {
                self.found.truncated = true;
                return Ok(Reading::Done);
            }
            self.previous = Some(second);
            // This second's bytes: up to the next entry's offset (to the end for the last one).
            let end = next.map(|(_, o)| o).filter(|o| *o > offset).unwrap_or(u64::MAX);
            if position != offset {
                data.seek(SeekFrom::Start(offset))?;
                position = offset;
            }
            if let Reading::Done = self.second(&mut data, &mut position, end, second)? {
                return Ok(Reading::Done);
            }
            entry = next;
        }
        Ok(Reading::More)
    }

    /// Reads the lines of `second`, from `position` to `end`.
    fn second(&mut self, data: &mut BufReader<File>, position: &mut u64, end: u64, second: u64) -> io::Result<Reading> {
        let mut line = Vec::new();
        while *position < end {
            let (consumed, whole) = read_line(data, end - *position, &mut line)?;
            if consumed == 0 {
                break; // end of the file
            }
            *position += consumed;
            self.found.bytes_read += consumed;
            let parsed = std::str::from_utf8(&line).ok().and_then(|l| l.parse::<MetricLine>().ok());
            let Some(m) = parsed.filter(|m| whole && m.timestamp_ms == second * 1000) else {
                self.found.skipped_lines += 1;
                continue;
            };
            if self.resource.as_ref().is_some_and(|r| *r != m.resource) {
                continue;
            }
            // Past `max_lines`, the lines of the second begun still come (Java's `MetricsReader`), so that
            // asking again from the next second loses none. Past `max_bytes`, a second begun is left out
            // whole, unless it is all there is.
            let begun = self.found.lines.last().is_some_and(|l| l.timestamp_ms == m.timestamp_ms);
            if self.held_bytes + line.len() > self.bounds.max_bytes {
                if self.found.lines.iter().any(|l| l.timestamp_ms != m.timestamp_ms) {
                    while self.found.lines.last().is_some_and(|l| l.timestamp_ms == m.timestamp_ms) {
                        self.found.lines.pop();
                    }
                }
                self.found.truncated = true;
                return Ok(Reading::Done);
            }
            if self.found.lines.len() >= self.bounds.max_lines && !begun {
                self.found.truncated = true;
                return Ok(Reading::Done);
            }
            self.held_bytes += line.len();
            self.found.lines.push(m);
        }
        Ok(Reading::More)
    }

    /// The index entry number `n`: (second, offset).
    fn entry_at(&mut self, index: &mut File, n: u64) -> io::Result<(u64, u64)> {
        index.seek(SeekFrom::Start(n * 16))?;
        Ok(self.next_entry(index)?.unwrap_or((u64::MAX, 0)))
    }

    /// The next whole index entry, if any (negative values read as 0).
    fn next_entry(&mut self, index: &mut impl Read) -> io::Result<Option<(u64, u64)>> {
        let mut entry = [0u8; 16];
        match index.read_exact(&mut entry) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        self.found.bytes_read += 16;
        let value = |b: &[u8]| i64::from_be_bytes(b.try_into().unwrap_or_default()).max(0) as u64;
        Ok(Some((value(&entry[..8]), value(&entry[8..]))))
    }
}

/// Reads one line, without going more than `limit` bytes on, into `line` (emptied first). Returns the bytes
/// gone through and whether the line is whole: it ends with a newline and is at most [`MAX_LINE_BYTES`] long
/// (a longer one is gone through without being held).
fn read_line(data: &mut impl BufRead, limit: u64, line: &mut Vec<u8>) -> io::Result<(u64, bool)> {
    line.clear();
    let (mut consumed, mut fits) = (0u64, true);
    loop {
        let available = data.fill_buf()?;
        let room = (limit - consumed).min(available.len() as u64) as usize;
        if room == 0 {
            return Ok((consumed, false));
        }
        let (take, done) = match available[..room].iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (room, false),
        };
        if fits && line.len() + take <= MAX_LINE_BYTES {
            line.extend_from_slice(&available[..take]);
        } else {
            fits = false;
            line.clear();
        }
        data.consume(take);
        consumed += take as u64;
        if done {
            return Ok((consumed, fits));
        }
    }
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
    fn an_adaptive_resource_writes_its_calls_in_flight_in_the_concurrency_column_and_its_blocks() {
        let (engine, clock, dir) = setup("app");
        engine.load_adaptive_rules([crate::adaptive::AdaptiveRule::new("db").limits(1, 3, 3)]).unwrap();
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        let db = engine.resource("db");
        let held: Vec<_> = (0..3).map(|_| db.entry_owned().enter().unwrap()).collect();
        assert!(matches!(db.enter(), Err(crate::BlockError::Adaptive { .. })), "at its limit of 3");
        clock.advance_millis(1000);
        w.flush_once(clock.now_millis()).unwrap();
        drop(held);
        clock.advance_millis(1000);
        drop(db.enter().unwrap());
        clock.advance_millis(1000);
        w.flush_once(clock.now_millis()).unwrap();
        let text = fs::read_to_string(dir.path().join("app-metrics.log.2023-11-14")).unwrap();
        let lines: Vec<MetricLine> =
            text.lines().map(|l| l.parse().unwrap()).filter(|l: &MetricLine| l.resource == "db").collect();
        // The second with three calls in flight and one refused, the second they completed in, and the last.
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!((lines[0].pass, lines[0].block, lines[0].concurrency), (3, 1, 3), "{text}");
        assert_eq!((lines[1].success, lines[1].rt_ms), (3, 1000), "{text}");
        assert_eq!((lines[2].pass, lines[2].block, lines[2].concurrency), (1, 0, 0), "{text}");
        assert_eq!(engine.adaptive_status()[0].inflight, 0);
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

    /// Writes `seconds` seconds of `resources` lines each from `first_second` into `{base}.{date}{suffix}`
    /// and its index, as the writer does; returns the file's size.
    fn synthetic_log(dir: &Path, name: &str, first_second: u64, seconds: u64, resources: usize) -> u64 {
        let path = dir.join(name);
        let (mut text, mut index) = (String::new(), Vec::new());
        for s in first_second..first_second + seconds {
            index.extend_from_slice(&(s as i64).to_be_bytes());
            index.extend_from_slice(&(text.len() as i64).to_be_bytes());
            for r in 0..resources {
                let line = MetricLine {
                    timestamp_ms: s * 1000,
                    resource: format!("service.resource.{r}"),
                    pass: r as u64,
                    ..MetricLine::default()
                };
                text.push_str(&format!("{line}\n"));
            }
        }
        fs::write(&path, &text).unwrap();
        fs::write(index_path(&path), index).unwrap();
        text.len() as u64
    }

    /// Three files of 2 MiB or more each (24,000 seconds of 20 resources).
    fn large_log(dir: &Path) -> u64 {
        let s0 = T0 / 1000;
        (0..3u64).map(|i| synthetic_log(dir, &format!("app-metrics.log.2023-11-14.{i}"), s0 + i * 8000, 8000, 20)).sum()
    }

    #[test]
    fn a_search_with_a_line_limit_reads_only_what_it_answers_of_many_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let total = large_log(dir.path());
        assert!(total > 6 << 20, "{total}");
        for (max_lines, from) in [(1, 0), (1, T0 + 12_000_000), (100, 0), (100, T0 + 23_990_000)] {
            let found =
                MetricSearcher::new(dir.path(), "app").max_lines(max_lines).search(None, from, u64::MAX).unwrap();
            // 20 lines a second: the lines asked for and the rest of their last second.
            assert_eq!(found.lines.len(), max_lines.div_ceil(20) * 20);
            assert!(found.truncated);
            // The line limit, a block of the reader's buffer, and a binary search of three indexes.
            assert!(found.bytes_read < 16 * 1024, "{max_lines} lines from {from}: read {} bytes", found.bytes_read);
            assert!(found.lines[0].timestamp_ms >= from.max(T0));
        }
    }

    #[test]
    fn a_search_for_a_rare_resource_stops_at_the_span_bound() {
        let dir = tempfile::tempdir().unwrap();
        large_log(dir.path());
        let searcher = MetricSearcher::new(dir.path(), "app").max_seconds(60);
        let found = searcher.search(Some("not.there"), 0, u64::MAX).unwrap();
        assert!(found.lines.is_empty());
        assert!(found.truncated, "the span bound cut the search short");
        let per_second = 20 * 70; // bytes of one second: 20 lines of about 60 bytes
        assert!(found.bytes_read < 61 * per_second + 4096, "read {} bytes for 60 seconds", found.bytes_read);
        // A range inside the span is answered whole.
        let one = searcher.search(Some("service.resource.7"), T0 + 100_000, T0 + 109_000).unwrap();
        assert_eq!(one.lines.len(), 10);
        assert!(!one.truncated);
    }

    #[test]
    fn a_search_holds_at_most_its_byte_bound_of_lines() {
        let dir = tempfile::tempdir().unwrap();
        large_log(dir.path());
        let found = MetricSearcher::new(dir.path(), "app").max_bytes(10_000).search(None, 0, u64::MAX).unwrap();
        let held: usize = found.lines.iter().map(|l| l.to_string().len() + 1).sum();
        assert!(held <= 10_000 && held > 9_000, "{held}");
        assert!(found.truncated);
        assert!(found.bytes_read < 32 * 1024, "{}", found.bytes_read);
    }

    /// Writes `seconds` seconds of traffic on `api` and `db`, one flush per second, with the disk failing
    /// (after `room` bytes) on the flush of the second numbered `fail_at`.
    fn run_with_a_full_disk(room: u64, fail_at: u64, seconds: u64) -> (tempfile::TempDir, MetricLogWriter, u64) {
        let (engine, clock, dir) = setup("app");
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        let mut failures = 0;
        for s in 0..seconds {
            drop(engine.enter("api").unwrap());
            drop(engine.enter("db").unwrap());
            clock.advance_millis(1000);
            if (fail_at..fail_at + 3).contains(&s) {
                *w.fail_after.lock().unwrap() = Some((if s == fail_at { room } else { 0 }, io::ErrorKind::StorageFull));
            } else {
                *w.fail_after.lock().unwrap() = None;
            }
            if let Err(e) = w.flush_once(clock.now_millis()) {
                assert_eq!(e.kind(), io::ErrorKind::StorageFull);
                assert!(e.to_string().contains("tried again"), "{e}");
                failures += 1;
            }
        }
        (dir, w, failures)
    }

    /// Checks the file and index byte by byte: every index offset at a line start, one entry per second in
    /// order, each (second, resource) once; returns the seconds found by the searcher.
    fn assert_consistent(dir: &Path) -> Vec<u64> {
        let file = dir.join("app-metrics.log.2023-11-14");
        let text = fs::read_to_string(&file).unwrap();
        let index = fs::read(index_path(&file)).unwrap();
        assert_eq!(index.len() % 16, 0, "whole entries only");
        let entries: Vec<(i64, usize)> = index
            .chunks_exact(16)
            .map(|e| {
                (
                    i64::from_be_bytes(e[..8].try_into().unwrap()),
                    i64::from_be_bytes(e[8..].try_into().unwrap()) as usize,
                )
            })
            .collect();
        for pair in entries.windows(2) {
            assert!(pair[0].0 < pair[1].0 && pair[0].1 < pair[1].1, "{entries:?}");
        }
        for (second, offset) in &entries {
            assert!(offset == &0 || text.as_bytes()[offset - 1] == b'\n', "offset {offset} inside a line");
            assert!(text[*offset..].starts_with(&format!("{}|", second * 1000)));
        }
        let mut keys: Vec<(u64, String)> =
            text.lines().map(|l| l.parse::<MetricLine>().unwrap()).map(|l| (l.timestamp_ms, l.resource)).collect();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "no line twice");
        let found = MetricSearcher::new(dir, "app").search(None, T0, u64::MAX).unwrap();
        assert_eq!(found.skipped_lines, 0);
        let mut seconds: Vec<u64> = found.lines.iter().map(|l| (l.timestamp_ms - T0) / 1000).collect();
        assert_eq!(found.lines.len(), n, "the searcher finds every line written");
        seconds.dedup();
        seconds
    }

    #[test]
    fn a_write_cut_by_a_full_disk_leaves_file_and_index_consistent_and_every_second_is_found() {
        // Each second is two lines of 55 bytes and an index entry of 16: the disk fills with no room at all,
        // inside the first line, between the lines, inside the second, after the text (no index entry) and
        // inside the index entry.
        for room in [0, 30, 55, 80, 110, 118] {
            let (dir, _w, failures) = run_with_a_full_disk(room, 4, 12);
            assert_eq!(failures, 3, "room {room}");
            let seconds = assert_consistent(dir.path());
            // The seconds of the failed flushes are written once there is room again (the engine still has them).
            assert_eq!(seconds, (0..12).collect::<Vec<_>>(), "room {room}");
        }
    }

    #[test]
    fn a_torn_line_in_the_middle_is_skipped_and_reading_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let s0 = T0 / 1000;
        let line = |s: u64, r: &str| {
            MetricLine { timestamp_ms: s * 1000, resource: r.into(), pass: 1, ..MetricLine::default() }.to_string()
        };
        // Second 2's first line was cut inside its timestamp (then the rest of the second written after it),
        // second 4's last line inside a field; both indexed where their seconds start, as a writer cut short
        // by a full disk left them.
        let tears = [(2, 5), (2, 14), (2, 30)];
        for (second, cut) in tears {
            let (mut text, mut index) = (String::new(), Vec::new());
            for s in 0..8 {
                index.extend_from_slice(&((s0 + s) as i64).to_be_bytes());
                index.extend_from_slice(&(text.len() as i64).to_be_bytes());
                if s == second {
                    text.push_str(&line(s0 + s, "a")[..cut]);
                }
                text.push_str(&format!("{}\n{}\n", line(s0 + s, "a"), line(s0 + s, "b")));
                if s == 4 {
                    text.push_str(&line(s0 + s, "c")[..cut]);
                }
            }
            let path = dir.path().join("app-metrics.log.2023-11-14");
            fs::write(&path, text).unwrap();
            fs::write(index_path(&path), index).unwrap();
            let found = MetricSearcher::new(dir.path(), "app").search(None, 0, u64::MAX).unwrap();
            let got: Vec<(u64, String)> =
                found.lines.iter().map(|l| ((l.timestamp_ms / 1000) - s0, l.resource.clone())).collect();
            let b_lines = got.iter().filter(|(_, r)| r == "b").count();
            assert_eq!(b_lines, 8, "cut at {cut}: {got:?}");
            assert_eq!(found.skipped_lines, 2, "cut at {cut}: the torn line in second 2 and second 4's torn end");
            assert!(got.iter().all(|(s, _)| *s < 8), "no second from a torn timestamp: {got:?}");
        }
    }

    #[test]
    fn repeated_index_entries_and_shifted_offsets_neither_duplicate_nor_hide_seconds() {
        // What a writer before the fix left after a full disk: the failed second's entry repeated with later
        // offsets, its lines written again, and the next offsets pointing inside lines.
        let dir = tempfile::tempdir().unwrap();
        let s0 = T0 / 1000;
        let (mut text, mut index) = (String::new(), Vec::new());
        let mut entry = |s: u64, o: usize| {
            index.extend_from_slice(&(s as i64).to_be_bytes());
            index.extend_from_slice(&(o as i64).to_be_bytes());
        };
        for s in 0..10u64 {
            let line = MetricLine { timestamp_ms: (s0 + s) * 1000, resource: "api".into(), ..MetricLine::default() };
            entry(s0 + s, text.len() + if s > 5 { 7 } else { 0 });
            if s == 3 {
                entry(s0 + s, text.len());
                text.push_str(&format!("{line}\n"));
            }
            text.push_str(&format!("{line}\n"));
        }
        let path = dir.path().join("app-metrics.log.2023-11-14");
        fs::write(&path, text).unwrap();
        fs::write(index_path(&path), index).unwrap();
        let found = MetricSearcher::new(dir.path(), "app").find(Some("api"), 0, u64::MAX).unwrap();
        let seconds: Vec<u64> = found.iter().map(|l| l.timestamp_ms / 1000 - s0).collect();
        // Second 3 twice in its own bytes (written twice); seconds 6..9 start inside a line: their lines are
        // found from the next line start on, which is the next second's (so each is skipped, not misread).
        assert!(seconds.windows(2).all(|w| w[0] <= w[1]), "{seconds:?}");
        assert_eq!(&seconds[..6], &[0, 1, 2, 3, 3, 4], "{seconds:?}");
        assert!(seconds.iter().all(|s| *s < 10));
    }

    #[test]
    fn a_newline_in_a_resource_name_cannot_forge_a_metric_line() {
        let (engine, clock, dir) = setup("app");
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        let forged = "x\n1700000000000|2023-11-14 22:13:20|admin|999|0|999|0|1|0|0|0";
        let names = [forged, "y\r\nz", "p|q", "plain"];
        for name in names {
            drop(engine.enter(name).unwrap());
        }
        clock.advance_millis(1000);
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 4);
        let text = fs::read_to_string(dir.path().join("app-metrics.log.2023-11-14")).unwrap();
        assert_eq!(text.lines().count(), 4, "one line per resource:\n{text}");
        let lines: Vec<MetricLine> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert!(lines.iter().all(|l| l.pass == 1 && l.resource != "admin"), "{lines:?}");
        let shown: Vec<&str> = lines.iter().map(|l| l.resource.as_str()).collect();
        assert!(shown.contains(&"x_1700000000000_2023-11-14 22:13:20_admin_999_0_999_0_1_0_0_0"), "{shown:?}");
        assert!(shown.contains(&"y__z") && shown.contains(&"p_q"));
        // Searched by the name the application uses, or by the name the log shows.
        let searcher = MetricSearcher::new(dir.path(), "app");
        for name in [forged, "x_1700000000000_2023-11-14 22:13:20_admin_999_0_999_0_1_0_0_0"] {
            assert_eq!(searcher.find(Some(name), T0, T0).unwrap().len(), 1);
        }
        assert!(searcher.find(Some("admin"), 0, u64::MAX).unwrap().is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn a_planted_link_in_place_of_a_metric_file_is_passed_over() {
        let (engine, clock, dir) = setup("app");
        let victim = dir.path().join("victim.txt");
        fs::write(&victim, "precious\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("app-metrics.log.2023-11-14")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("app-metrics.log.2023-11-14.1.idx")).unwrap();
        let w = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
        drop(engine.enter("api").unwrap());
        clock.advance_millis(1000);
        assert_eq!(w.flush_once(clock.now_millis()).unwrap(), 1);
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n", "neither truncated nor written");
        assert_eq!(MetricSearcher::new(dir.path(), "app").find(Some("api"), T0, T0).unwrap().len(), 1);
    }
}
