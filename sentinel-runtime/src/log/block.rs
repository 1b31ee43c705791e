//! The block log: `sentinel-block.log`, one line per (second, resource, kind, limit app, origin, rule) with
//! the number of blocked permits in that second:
//!
//! ```text
//! 2023-11-14 22:13:20|1|queryOrder,FlowException,default,appA,7|3,0
//! ```
//!
//! The engine's block listener only queues the event on a bounded channel (no I/O, no lock, never blocks;
//! events beyond the queue's capacity are counted as dropped); the writer aggregates and writes whole
//! seconds. When the file passes its size it is renamed to `.1` (older ones shift up to the backup count).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use super::time::format_date_time;
use crate::{BlockError, Sentinel, SystemLimit};

/// The block log's file name (Java's).
pub const BLOCK_LOG_FILE: &str = "sentinel-block.log";

const QUEUE_CAPACITY: usize = 16 * 1024;
const DEFAULT_MAX_SIZE: u64 = 300 * 1024 * 1024;
const DEFAULT_BACKUPS: usize = 3;

struct Record {
    second_ms: u64,
    error: BlockError,
    permits: u32,
}

struct FileState {
    out: Option<File>,
    size: u64,
}

struct Inner {
    path: PathBuf,
    max_size: u64,
    backups: usize,
    tx: SyncSender<Record>,
    rx: Mutex<Receiver<Record>>,
    /// second → line key → permits.
    pending: Mutex<BTreeMap<u64, BTreeMap<String, u64>>>,
    file: Mutex<FileState>,
    dropped: AtomicU64,
    lines_lost: AtomicU64,
    #[cfg(test)]
    room: Mutex<Option<u64>>,
}

/// Writes `sentinel-block.log`. Cheap to clone (shared).
#[derive(Clone)]
pub struct BlockLogWriter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BlockLogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockLogWriter").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

fn limit_type(limit: &SystemLimit) -> &'static str {
    match limit {
        SystemLimit::Qps { .. } => "qps",
        SystemLimit::Thread { .. } => "thread",
        SystemLimit::AvgRt { .. } => "rt",
        SystemLimit::Load { .. } => "load",
        SystemLimit::Cpu { .. } => "cpu",
    }
}

/// `resource,Kind,limitApp,origin,ruleId` as Java's block log writes it. For system blocks the limit-app
/// column holds the limit type (`qps`, `thread`, `rt`, `load`, `cpu`), as Java's `SystemBlockException` does,
/// and for hot-parameter blocks the blocked value, as Java's `ParamFlowException` does.
fn key_of(e: &BlockError) -> String {
    let rule_id = match e {
        BlockError::Flow { rule, .. } => rule.id,
        BlockError::Degrade { rule, .. } => rule.id,
        BlockError::ParamFlow { rule, .. } => rule.id,
        BlockError::Authority { rule, .. } => rule.id,
        _ => None,
    };
    let limit_app = match e {
        BlockError::System { limit, .. } => limit_type(limit),
        // Java's `ParamFlowException` carries the blocked value as its `ruleLimitApp`.
        BlockError::ParamFlow { value, .. } => value,
        other => other.limit_app(),
    };
    format!(
        "{},{},{},{},{}",
        e.resource(),
        e.kind_name(),
        limit_app,
        e.origin(),
        rule_id.map(|i| i.to_string()).unwrap_or_default()
    )
}

impl BlockLogWriter {
    /// A writer appending to `path` (its directory is created), rolled at 300 MiB with 3 backups. The file is
    /// never written through a symbolic link in its place (see [the module](super)).
    pub fn new(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::with_limits(path, DEFAULT_MAX_SIZE, DEFAULT_BACKUPS)
    }

    /// A writer rolled when the file passes `max_size` bytes, keeping `backups` older files (`.1` newest).
    pub fn with_limits(path: impl AsRef<Path>, max_size: u64, backups: usize) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)?;
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE_CAPACITY);
        Ok(BlockLogWriter {
            inner: Arc::new(Inner {
                path,
                max_size: max_size.max(1),
                backups,
                tx,
                rx: Mutex::new(rx),
                pending: Mutex::new(BTreeMap::new()),
                file: Mutex::new(FileState { out: None, size: 0 }),
                dropped: AtomicU64::new(0),
                lines_lost: AtomicU64::new(0),
                #[cfg(test)]
                room: Mutex::new(None),
            }),
        })
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Registers the engine's block listener: each blocked call is queued (cheap; no I/O on the caller).
    pub fn attach(&self, engine: &Sentinel) {
        let inner = Arc::downgrade(&self.inner);
        engine.on_block(move |err, now_ms, permits| {
            let Some(inner) = inner.upgrade() else { return };
            let record = Record { second_ms: now_ms - now_ms % 1000, error: err.clone(), permits };
            if let Err(TrySendError::Full(_)) = inner.tx.try_send(record) {
                inner.dropped.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    /// Block events dropped because the queue was full (the writer fell behind).
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Lines that could not be written (a full disk): each failed write is left out whole.
    pub fn lines_lost(&self) -> u64 {
        self.inner.lines_lost.load(Ordering::Relaxed)
    }

    /// Aggregates the queued events and writes every whole second before `now_ms`. Returns the lines written.
    ///
    /// # Errors
    /// The write failed: its lines are left out (none of them torn) and counted in
    /// [`lines_lost`](Self::lines_lost).
    pub fn flush_once(&self, now_ms: u64) -> io::Result<usize> {
        let boundary = now_ms - now_ms % 1000;
        let mut pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        {
            let rx = self.inner.rx.lock().unwrap_or_else(|e| e.into_inner());
            while let Ok(r) = rx.try_recv() {
                *pending.entry(r.second_ms).or_default().entry(key_of(&r.error)).or_default() += u64::from(r.permits);
            }
        }
        let later = pending.split_off(&boundary);
        let ready = std::mem::replace(&mut *pending, later);
        drop(pending);
        let mut text = String::new();
        let mut lines = 0;
        for (second, keys) in ready {
            let time = format_date_time(second);
            for (key, count) in keys {
                text.push_str(&format!("{time}|1|{key}|{count},0\n"));
                lines += 1;
            }
        }
        if lines > 0
            && let Err(e) = self.write(text.as_bytes())
        {
            self.inner.lines_lost.fetch_add(lines as u64, Ordering::Relaxed);
            return Err(io::Error::new(e.kind(), format!("block log: {lines} lines not written ({e})")));
        }
        Ok(lines)
    }

    /// Appends `bytes` (whole lines). On a failure (a full disk) the file is cut back to its length before,
    /// so that it never ends in a torn line; if even that fails, the file is reopened (at its real length)
    /// before the next write.
    fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let mut f = self.inner.file.lock().unwrap_or_else(|e| e.into_inner());
        if f.out.is_none() {
            let file = super::open_append(&self.inner.path)?;
            f.size = file.metadata()?.len();
            f.out = Some(file);
        }
        let size = f.size;
        if let Some(out) = f.out.as_mut()
            && let Err(e) = self.append(out, bytes)
        {
            if out.set_len(size).is_err() {
                f.out = None;
            }
            return Err(e);
        }
        f.size += bytes.len() as u64;
        if f.size >= self.inner.max_size {
            f.out = None;
            f.size = 0;
            self.roll()?;
        }
        Ok(())
    }

    fn append(&self, out: &mut File, bytes: &[u8]) -> io::Result<()> {
        #[cfg(test)]
        if let Some(room) = self.inner.room.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            // Test hook: the disk has room for `room` more bytes, then fails like a full disk.
            let fits = (*room as usize).min(bytes.len());
            out.write_all(&bytes[..fits])?;
            *room -= fits as u64;
            if fits < bytes.len() {
                return Err(io::Error::other("no space left on device (test)"));
            }
            return Ok(());
        }
        out.write_all(bytes)
    }

    fn roll(&self) -> io::Result<()> {
        let numbered = |n: usize| {
            let mut s = self.inner.path.as_os_str().to_os_string();
            s.push(format!(".{n}"));
            PathBuf::from(s)
        };
        if self.inner.backups == 0 {
            return fs::remove_file(&self.inner.path);
        }
        let _ = fs::remove_file(numbered(self.inner.backups));
        for n in (1..self.inner.backups).rev() {
            let from = numbered(n);
            if from.exists() {
                fs::rename(&from, numbered(n + 1))?;
            }
        }
        fs::rename(&self.inner.path, numbered(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::flow::FlowRule;

    const T0: u64 = 1_700_000_000_000;

    #[test]
    fn blocks_are_aggregated_per_second_in_sentinel_format() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        engine
            .load_flow_rules(vec![
                FlowRule::new("api").count(1.0).id(7),
                FlowRule::new("api").count(0.0).limit_app("appA"),
            ])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let log = BlockLogWriter::new(dir.path().join(BLOCK_LOG_FILE)).unwrap();
        log.attach(&engine);
        let api = engine.resource("api");
        for _ in 0..4 {
            drop(api.enter());
        }
        {
            let _ctx = engine.enter_context("web", "appA").unwrap();
            assert!(api.enter().is_err());
            assert!(api.entry().acquire(2).enter().is_err());
        }
        assert_eq!(log.flush_once(clock.now_millis()).unwrap(), 0, "the current second is still open");
        clock.advance_millis(1000);
        drop(api.enter());
        drop(api.enter());
        assert_eq!(log.flush_once(clock.now_millis()).unwrap(), 2);
        let text = fs::read_to_string(log.path()).unwrap();
        assert_eq!(
            text,
            "2023-11-14 22:13:20|1|api,FlowException,appA,appA,|3,0\n\
             2023-11-14 22:13:20|1|api,FlowException,default,,7|3,0\n"
        );
        clock.advance_millis(1000);
        assert_eq!(log.flush_once(clock.now_millis()).unwrap(), 1);
        assert!(fs::read_to_string(log.path())
            .unwrap()
            .ends_with("2023-11-14 22:13:21|1|api,FlowException,default,,7|1,0\n"));
        assert_eq!(log.dropped(), 0);
    }

    #[test]
    fn the_file_rolls_by_size() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        engine.load_flow_rules(vec![FlowRule::new("api").count(0.0)]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let log = BlockLogWriter::with_limits(dir.path().join(BLOCK_LOG_FILE), 10, 2).unwrap();
        log.attach(&engine);
        for _ in 0..4 {
            drop(engine.enter("api"));
            clock.advance_millis(1000);
            log.flush_once(clock.now_millis()).unwrap();
        }
        assert!(dir.path().join("sentinel-block.log.1").exists());
        assert!(dir.path().join("sentinel-block.log.2").exists());
        assert!(!dir.path().join("sentinel-block.log.3").exists());
    }

    #[test]
    fn a_block_log_write_cut_by_a_full_disk_leaves_no_torn_line() {
        for room in [0, 10, 50, 70] {
            let clock = ManualClock::at_millis(T0);
            let engine = Sentinel::builder().manual_clock(clock.clone()).build();
            engine.load_flow_rules(vec![FlowRule::new("api").count(0.0), FlowRule::new("db").count(0.0)]).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let log = BlockLogWriter::new(dir.path().join(BLOCK_LOG_FILE)).unwrap();
            log.attach(&engine);
            let mut failed = 0;
            for s in 0..6 {
                drop(engine.enter("api"));
                drop(engine.enter("db"));
                clock.advance_millis(1000);
                *log.inner.room.lock().unwrap() = (s == 2).then_some(room);
                if log.flush_once(clock.now_millis()).is_err() {
                    failed += 1;
                }
            }
            assert_eq!((failed, log.lines_lost()), (1, 2), "room {room}");
            let text = fs::read_to_string(log.path()).unwrap();
            assert_eq!(text.lines().count(), 10, "room {room}:\n{text}");
            assert!(text.lines().all(|l| l.ends_with("|1,0") && l.starts_with("2023-11-14 22:13:")), "{text}");
            assert!(!text.contains("22:13:22"), "the failed second is left out whole");
        }
    }

    #[cfg(unix)]
    #[test]
    fn the_block_log_is_never_written_through_a_planted_link() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        engine.load_flow_rules(vec![FlowRule::new("api").count(0.0)]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        fs::write(&victim, "precious\n").unwrap();
        let path = dir.path().join(BLOCK_LOG_FILE);
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let log = BlockLogWriter::new(&path).unwrap();
        log.attach(&engine);
        drop(engine.enter("api"));
        clock.advance_millis(1000);
        let e = log.flush_once(clock.now_millis()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        // A FIFO (or anything not a regular file) is refused too, without blocking on its open.
        let fifo = dir.path().join("fifo.log");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let log = BlockLogWriter::new(&fifo).unwrap();
        log.attach(&engine);
        drop(engine.enter("api"));
        clock.advance_millis(1000);
        assert!(log.flush_once(clock.now_millis()).is_err(), "a FIFO with no reader: refused at once");
    }
}
