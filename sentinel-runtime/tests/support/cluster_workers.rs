//! What the multi-process cluster tests (`cluster_redis`, `cluster_topology`) share: one test at a time, the
//! wall clock, worker processes that re-execute the test binary, the calls a worker admits per window, and
//! the fields of the result line it prints. Include it with
//! `#[path = "support/cluster_workers.rs"] mod cluster_workers;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sentinel_runtime::{BlockError, Entry};

/// The tests of a file that uses this run one at a time: they measure per-window sums in real time, and the
/// multi-process ones keep the machine's cores busy and start several servers and processes each.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wall clock, in ms since the epoch (on one machine, Redis's clock too).
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Waits until the wall clock reaches `at` (ms), 1 ms at a time.
pub fn sleep_until(at: u64) {
    while wall_ms() < at {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A worker's setting, from its environment.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker: {name} is not set"))
}

/// A worker's numeric setting, from its environment.
pub fn env_u64(name: &str) -> u64 {
    env(name).parse().unwrap_or_else(|_| panic!("worker: {name} is not a number"))
}

/// Starts a worker process: this test binary again, running only the ignored test `test`, with `marker` (the
/// variable that test reads to know it is a worker) set to the worker's `name`, and `vars`. Its output is
/// piped for [`result_line`]s.
pub fn spawn_worker(test: &str, marker: &str, name: &str, vars: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(marker, name)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a worker process")
}

/// What one calling thread admitted until its end.
#[derive(Debug, Default)]
pub struct Admitted {
    /// Calls admitted per window (by wall-clock window index).
    pub per_window: BTreeMap<u64, u64>,
    /// Admitted calls whose decision straddled a window boundary (stamped before and after), counted apart.
    pub ambiguous: u64,
    /// Calls refused for another reason than a flow rule.
    pub errors: u64,
}

/// Calls `enter` until the wall clock reaches `end_at` (ms), counting the admitted calls per window of
/// `window_ms`. A refused call is tried again after `pause` (a load far above the limit without starving the
/// machine's other processes, Redis among them, of the CPU).
pub fn hammer<'r>(
    end_at: u64,
    window_ms: u64,
    pause: Duration,
    mut enter: impl FnMut() -> Result<Entry<'r>, BlockError>,
) -> Admitted {
    let mut a = Admitted::default();
    loop {
        let before = wall_ms();
        if before >= end_at {
            return a;
        }
        match enter() {
            Ok(_entry) => {
                let after = wall_ms();
                if before / window_ms == after / window_ms {
                    *a.per_window.entry(before / window_ms).or_default() += 1;
                } else {
                    a.ambiguous += 1;
                }
            }
            Err(e) => {
                if !matches!(e, BlockError::Flow { .. }) {
                    a.errors += 1;
                }
                std::thread::sleep(pause);
            }
        }
    }
}

/// `window:count` pairs, comma-separated, as a worker prints them.
pub fn format_windows(windows: &BTreeMap<u64, u64>) -> String {
    windows.iter().map(|(w, n)| format!("{w}:{n}")).collect::<Vec<_>>().join(",")
}

/// The pairs [`format_windows`] printed.
pub fn parse_windows(v: &str) -> BTreeMap<u64, u64> {
    v.split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (w, n) = pair.split_once(':').expect("window:count");
            (w.parse().expect("a window"), n.parse().expect("a count"))
        })
        .collect()
}

/// A comma-separated list of numbers, as a worker prints it.
pub fn parse_list<C: FromIterator<u64>>(v: &str) -> C {
    v.split(',').filter(|p| !p.is_empty()).map(|p| p.parse().expect("a number")).collect()
}

/// The `name=value` fields of every line of `text` that carries `tag` (a worker's result line), one
/// iterator per line.
pub fn result_lines<'a>(text: &'a str, tag: &'a str) -> impl Iterator<Item = (&'a str, Vec<(&'a str, &'a str)>)> {
    text.lines().filter_map(move |l| l.find(tag).map(|i| &l[i + tag.len()..])).map(|line| {
        let fields = line.split(' ').filter_map(|f| f.split_once('=')).collect();
        (line, fields)
    })
}
