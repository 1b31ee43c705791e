//! The background sampler of the 1-minute load average and cpu usage (Linux `/proc`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the sampler reads `/proc`.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// The latest readings, shared by the engine (read on the hot path) and the sampler thread (written once a
/// second). `NaN` means unavailable: the check that needs it is skipped.
#[derive(Debug)]
pub(crate) struct Readings {
    load: AtomicU64,
    cpu: AtomicU64,
}

impl Default for Readings {
    fn default() -> Self {
        Readings { load: AtomicU64::new(f64::NAN.to_bits()), cpu: AtomicU64::new(f64::NAN.to_bits()) }
    }
}

fn sanitize(v: Option<f64>) -> f64 {
    match v {
        Some(v) if v.is_finite() && v >= 0.0 => v,
        _ => f64::NAN,
    }
}

impl Readings {
    pub(crate) fn set(&self, load: Option<f64>, cpu: Option<f64>) {
        self.load.store(sanitize(load).to_bits(), Ordering::Relaxed);
        self.cpu.store(sanitize(cpu).to_bits(), Ordering::Relaxed);
    }
    fn set_load(&self, load: Option<f64>) {
        self.load.store(sanitize(load).to_bits(), Ordering::Relaxed);
    }
    fn set_cpu(&self, cpu: Option<f64>) {
        self.cpu.store(sanitize(cpu).to_bits(), Ordering::Relaxed);
    }
    /// The 1-minute load average, if available.
    pub(crate) fn load(&self) -> Option<f64> {
        let v = f64::from_bits(self.load.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }
    /// Cpu usage in [0, 1], if available.
    pub(crate) fn cpu(&self) -> Option<f64> {
        let v = f64::from_bits(self.cpu.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }
}

/// Why a `/proc` file could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcError {
    /// The file could not be read.
    #[error("cannot read {file}: {source}")]
    Io {
        file: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The file did not have the expected shape.
    #[error("unexpected contents of {file}: {what}")]
    Malformed { file: &'static str, what: &'static str },
}

const LOADAVG: &str = "/proc/loadavg";
const STAT: &str = "/proc/stat";
const SELF_STAT: &str = "/proc/self/stat";
/// Linux reports process times in `USER_HZ` ticks, 100 per second on every architecture's ABI.
const USER_HZ: f64 = 100.0;

/// The first field of `/proc/loadavg`.
pub(crate) fn parse_loadavg(text: &str) -> Result<f64, ProcError> {
    let first = text.split_whitespace().next().ok_or(ProcError::Malformed { file: LOADAVG, what: "empty" })?;
    let v: f64 = first.parse().map_err(|_| ProcError::Malformed { file: LOADAVG, what: "load is not a number" })?;
    if !v.is_finite() || v < 0.0 {
        return Err(ProcError::Malformed { file: LOADAVG, what: "load out of range" });
    }
    Ok(v)
}

/// Aggregate cpu times from the `cpu ` line of `/proc/stat`: (busy, total) in ticks.
pub(crate) fn parse_stat(text: &str) -> Result<(u64, u64), ProcError> {
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu ") || l.starts_with("cpu\t"))
        .ok_or(ProcError::Malformed { file: STAT, what: "no aggregate `cpu` line" })?;
    let mut fields = [0u64; 8]; // user nice system idle iowait irq softirq steal
    let mut n = 0;
    for (slot, f) in fields.iter_mut().zip(line.split_whitespace().skip(1)) {
        *slot = f.parse().map_err(|_| ProcError::Malformed { file: STAT, what: "cpu time is not a number" })?;
        n += 1;
    }
    if n < 4 {
        return Err(ProcError::Malformed { file: STAT, what: "fewer than 4 cpu times" });
    }
    let total = fields.iter().fold(0u64, |a, b| a.saturating_add(*b));
    let idle = fields[3].saturating_add(fields[4]);
    Ok((total.saturating_sub(idle), total))
}

/// utime + stime (ticks) from `/proc/self/stat`; the command name may hold spaces and parentheses.
pub(crate) fn parse_self_stat(text: &str) -> Result<u64, ProcError> {
    let after = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or(ProcError::Malformed { file: SELF_STAT, what: "no `)` after the command name" })?;
    // Fields after the name start at field 3 (state); utime and stime are fields 14 and 15.
    let mut it = after.split_whitespace().skip(11);
    let mut next = || -> Result<u64, ProcError> {
        it.next()
            .ok_or(ProcError::Malformed { file: SELF_STAT, what: "too few fields" })?
            .parse()
            .map_err(|_| ProcError::Malformed { file: SELF_STAT, what: "cpu time is not a number" })
    };
    let utime = next()?;
    let stime = next()?;
    Ok(utime.saturating_add(stime))
}

fn read(file: &'static str) -> Result<String, ProcError> {
    std::fs::read_to_string(file).map_err(|source| ProcError::Io { file, source })
}

/// Cpu usage from two samples: the busier of the whole system and this process, in [0, 1].
#[derive(Debug, Default)]
pub(crate) struct CpuTracker {
    last_stat: Option<(u64, u64)>,
    last_proc: Option<(u64, Instant)>,
}

impl CpuTracker {
    /// Feeds one sample; returns the usage since the previous one (none on the first, or when unreadable).
    pub(crate) fn update(
        &mut self,
        stat: Option<(u64, u64)>,
        proc_ticks: Option<u64>,
        at: Instant,
        cpus: f64,
    ) -> Option<f64> {
        let system = match (self.last_stat, stat) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => Some(b1.saturating_sub(b0) as f64 / (t1 - t0) as f64),
            _ => None,
        };
        let process = match (self.last_proc, proc_ticks) {
            (Some((p0, at0)), Some(p1)) => {
                let secs = at.saturating_duration_since(at0).as_secs_f64();
                (secs > 0.0 && cpus > 0.0).then(|| p1.saturating_sub(p0) as f64 / USER_HZ / secs / cpus)
            }
            _ => None,
        };
        self.last_stat = stat;
        self.last_proc = proc_ticks.map(|p| (p, at));
        let usage = match (system, process) {
            (Some(s), Some(p)) => Some(s.max(p)),
            (s, p) => s.or(p),
        };
        usage.map(|u| u.clamp(0.0, 1.0))
    }
}

/// Reads `/proc` once into `readings`. Errors leave the reading unavailable (logged at debug level).
fn sample_once(readings: &Readings, cpu: &mut CpuTracker, cpus: f64) {
    let load = read(LOADAVG).and_then(|t| parse_loadavg(&t));
    let stat = read(STAT).and_then(|t| parse_stat(&t));
    let proc_ticks = read(SELF_STAT).and_then(|t| parse_self_stat(&t));
    for e in [load.as_ref().err(), stat.as_ref().err(), proc_ticks.as_ref().err()].into_iter().flatten() {
        tracing::debug!(error = %e, "system sampler: reading unavailable");
    }
    readings.set_load(load.ok());
    readings.set_cpu(cpu.update(stat.ok(), proc_ticks.ok(), Instant::now(), cpus));
}

/// Whether this platform has the `/proc` files the sampler reads.
pub(crate) fn supported() -> bool {
    cfg!(target_os = "linux")
}

/// A running sampler thread. It holds only the readings and its stop flag, never the engine; dropping the
/// sampler stops the thread and waits for it.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling into `readings` once a second; `None` on platforms without `/proc` or when the thread
    /// cannot be spawned.
    pub(crate) fn start(readings: Arc<Readings>) -> Option<Sampler> {
        if !supported() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let cpus = std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0);
        let spawned = std::thread::Builder::new().name("sentinel-system-sampler".into()).spawn(move || {
            let mut cpu = CpuTracker::default();
            while !flag.load(Ordering::Acquire) {
                sample_once(&readings, &mut cpu, cpus);
                let deadline = Instant::now() + SAMPLE_INTERVAL;
                loop {
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::park_timeout(left);
                }
            }
            readings.set(None, None);
        });
        match spawned {
            Ok(handle) => Some(Sampler { stop, handle: Some(handle) }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the system sampler thread: load and cpu checks are off");
                None
            }
        }
    }

    /// Whether the thread is still running.
    pub(crate) fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_loadavg() {
        assert_eq!(parse_loadavg("0.52 0.58 0.59 1/467 12345\n").unwrap(), 0.52);
        assert!(matches!(parse_loadavg(""), Err(ProcError::Malformed { .. })));
        assert!(matches!(parse_loadavg("abc 1 2"), Err(ProcError::Malformed { .. })));
        assert!(matches!(parse_loadavg("-1 1 2"), Err(ProcError::Malformed { .. })));
    }

    #[test]
    fn parses_stat_aggregate_line() {
        let text = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n";
        assert_eq!(parse_stat(text).unwrap(), (150, 1000));
        assert!(matches!(parse_stat("cpu0 1 2 3 4\n"), Err(ProcError::Malformed { .. })));
        assert!(matches!(parse_stat("cpu  1 x 3 4\n"), Err(ProcError::Malformed { .. })));
        assert!(matches!(parse_stat("cpu  1 2\n"), Err(ProcError::Malformed { .. })));
    }

    #[test]
    fn parses_self_stat_with_odd_command_names() {
        let text = "4242 (my (odd) prog) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0\n";
        assert_eq!(parse_self_stat(text).unwrap(), 300);
        assert!(matches!(parse_self_stat("4242 no paren"), Err(ProcError::Malformed { .. })));
        assert!(matches!(parse_self_stat("1 (x) S 1 2"), Err(ProcError::Malformed { .. })));
    }

    #[test]
    fn cpu_usage_is_the_busier_of_system_and_process() {
        let mut t = CpuTracker::default();
        let t0 = Instant::now();
        assert_eq!(t.update(Some((100, 1000)), Some(0), t0, 2.0), None, "first sample has no delta");
        // System: 300 busy of 1000 ticks = 0.3. Process: 100 ticks = 1 s of cpu over 1 s on 2 cpus = 0.5.
        let u = t.update(Some((400, 2000)), Some(100), t0 + Duration::from_secs(1), 2.0).unwrap();
        assert!((u - 0.5).abs() < 1e-9, "{u}");
        // System busier: 900 of 1000 = 0.9.
        let u = t.update(Some((1300, 3000)), Some(100), t0 + Duration::from_secs(2), 2.0).unwrap();
        assert!((u - 0.9).abs() < 1e-9, "{u}");
        // Unreadable files: no reading.
        assert_eq!(t.update(None, None, t0 + Duration::from_secs(3), 2.0), None);
    }

    #[test]
    fn readings_treat_nan_and_negative_as_unavailable() {
        let r = Readings::default();
        assert_eq!((r.load(), r.cpu()), (None, None));
        r.set(Some(1.5), Some(0.25));
        assert_eq!((r.load(), r.cpu()), (Some(1.5), Some(0.25)));
        r.set(Some(f64::NAN), Some(-1.0));
        assert_eq!((r.load(), r.cpu()), (None, None));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machines_proc_files_parse() {
        // Where /proc is readable, its real formats parse (a sandbox without /proc skips this).
        if let Ok(t) = std::fs::read_to_string(LOADAVG) {
            assert!(parse_loadavg(&t).is_ok(), "{t}");
        }
        if let Ok(t) = std::fs::read_to_string(STAT) {
            let (busy, total) = parse_stat(&t).unwrap();
            assert!(busy <= total);
        }
        if let Ok(t) = std::fs::read_to_string(SELF_STAT) {
            assert!(parse_self_stat(&t).is_ok(), "{t}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn sampler_stops_on_drop_and_releases_its_readings() {
        let readings = Arc::new(Readings::default());
        let sampler = Sampler::start(readings.clone()).expect("linux has a sampler");
        assert!(Arc::strong_count(&readings) >= 1);
        drop(sampler); // wakes the thread and joins it: no sleeping in the test
        assert_eq!(Arc::strong_count(&readings), 1, "the thread ended and dropped its handle");
        assert_eq!(readings.cpu(), None, "a stopped sampler leaves no stale reading");
    }
}
