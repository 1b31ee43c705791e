//! Logs in Sentinel's formats (feature `logs`): the per-second metric log with its index, and the block log.
//!
//! Both are written by a background thread, never on the calling thread: the metric log reads the
//! per-second totals the statistics already keep; the block log's listener only queues the event (a bounded
//! channel, no I/O, no lock). Each writer also has a `flush_once(now_ms)` entry point, so tests drive them
//! deterministically with a [`ManualClock`](crate::clock::ManualClock).
//!
//! Files are opened without following a symbolic link in their place: a new metric file is created
//! exclusively (an existing file or link of its name is passed over), and the block log, which is appended
//! to, is refused when its name is a link (on Unix) or not a regular file. The log directory itself, and the
//! directories above it, are trusted: keep them writable by the application's user only (the default,
//! `$HOME/logs/csp`, is).
//!
//! A full disk loses seconds, never the files' consistency: a write that fails is cut back to the last whole
//! second (metric log) or to the last whole line (block log), and readers skip a torn line and go on.
//!
//! Times in the logs are formatted in UTC (Java formats them in the JVM's zone); the first column of the
//! metric log is the epoch timestamp, which is what readers use.
//!
//! ```
//! use sentinel_runtime::{Sentinel, clock::ManualClock, log::{MetricLogWriter, MetricSearcher}};
//! let tmp = tempfile::tempdir().unwrap();
//! let dir = tmp.path();
//! let clock = ManualClock::at_millis(1_700_000_000_000);
//! let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("demo").build();
//! let writer = MetricLogWriter::new(&engine, dir, 1 << 20, 6).unwrap();
//! drop(engine.enter("api").unwrap());
//! clock.advance_millis(1000);
//! writer.flush_once(clock.now_millis()).unwrap();
//! let lines = MetricSearcher::new(dir, "demo").find(Some("api"), 1_700_000_000_000, 1_700_000_001_000).unwrap();
//! assert_eq!(lines[0].pass, 1);
//! ```

mod block;
mod metric;
mod time;

pub use block::{BlockLogWriter, BLOCK_LOG_FILE};
pub use metric::{
    metric_file_base_name, MetricLine, MetricLogWriter, MetricSearch, MetricSearcher, DEFAULT_MAX_BYTES,
    DEFAULT_MAX_LINES, DEFAULT_MAX_SECONDS, TOTAL_INBOUND,
};

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Sentinel;

/// Creates `path` for writing; fails with `AlreadyExists` if anything (a file, a symbolic link) has its name.
fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path)
}

/// Opens `path` for appending, creating it if missing: refused if it is a symbolic link (on Unix) or not a
/// regular file.
fn open_append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| {
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ELOOP) {
            return io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a symbolic link: a log file is never written through one", path.display()),
            );
        }
        e
    })?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    Ok(file)
}

/// The metric and block logs of an engine, written by a background thread until dropped.
#[must_use = "dropping the logs stops writing them"]
pub struct Logs {
    metric: Arc<MetricLogWriter>,
    block: BlockLogWriter,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Logs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logs").field("metric", &self.metric).field("block", &self.block).finish_non_exhaustive()
    }
}

impl Logs {
    /// Starts both logs for `engine`, in the engine's [`Config::log_dir`](crate::Config::log_dir), flushed
    /// every [`Config::metric_flush_interval_ms`](crate::Config::metric_flush_interval_ms).
    pub fn start(engine: &Sentinel) -> io::Result<Logs> {
        let c = engine.config();
        let metric =
            Arc::new(MetricLogWriter::new(engine, &c.log_dir, c.metric_log_file_size, c.metric_log_file_count)?);
        let block = BlockLogWriter::new(c.log_dir.join(BLOCK_LOG_FILE))?;
        block.attach(engine);
        let interval = Duration::from_millis(c.metric_flush_interval_ms.max(1));
        let (stop, stopped) = mpsc::channel::<()>();
        let (m, b, e) = (metric.clone(), block.clone(), engine.clone());
        let thread = std::thread::Builder::new().name("sentinel-logs".into()).spawn(move || {
            // Runs until `Logs` is dropped (the stop sender is dropped, or sends).
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                let now = e.now_millis();
                // Whole seconds once they have settled (on a real clock, a quarter of a second after they end).
                if let Err(err) = m.flush_once(e.settled_millis()) {
                    tracing::warn!(error = %err, "metric log write failed");
                }
                if let Err(err) = b.flush_once(now) {
                    tracing::warn!(error = %err, "block log write failed");
                }
            }
        })?;
        Ok(Logs { metric, block, stop: Some(stop), thread: Some(thread) })
    }

    /// The metric log writer.
    pub fn metric(&self) -> &MetricLogWriter {
        &self.metric
    }

    /// The block log writer.
    pub fn block(&self) -> &BlockLogWriter {
        &self.block
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::flow::FlowRule;
    use crate::Config;

    #[test]
    fn the_background_thread_writes_both_logs() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at_millis(1_700_000_000_000);
        let config = Config {
            app_name: "bg".into(),
            log_dir: dir.path().to_path_buf(),
            metric_flush_interval_ms: 5,
            ..Config::default()
        };
        let engine = Sentinel::builder().config(config).manual_clock(clock.clone()).build();
        engine.load_flow_rules(vec![FlowRule::new("api").count(1.0)]).unwrap();
        let logs = Logs::start(&engine).unwrap();
        drop(engine.enter("api"));
        drop(engine.enter("api"));
        clock.advance_millis(1000);
        let metric = dir.path().join("bg-metrics.log.2023-11-14");
        let block = dir.path().join(BLOCK_LOG_FILE);
        // Wait for the condition (both files written), with a generous deadline; no timing is asserted.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let done = || {
            std::fs::read_to_string(&metric).is_ok_and(|t| t.contains("|api|1|1|"))
                && std::fs::read_to_string(&block).is_ok_and(|t| t.contains("api,FlowException"))
        };
        while !done() {
            assert!(std::time::Instant::now() < deadline, "logs not written within 30 s");
            std::thread::sleep(Duration::from_millis(2)); // poll interval, not a wait for time to pass
        }
        drop(logs);
    }
}
