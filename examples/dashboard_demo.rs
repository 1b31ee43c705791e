//! A small service with synthetic traffic, its rules in a file, and the command center with the built-in
//! console on 127.0.0.1:8719: open the console in a browser, or point a Sentinel Dashboard at it.
//!
//! Run: `cargo run --example dashboard_demo` (stops on Ctrl-C), or `-- --duration 30` to stop by itself,
//! `-- --dir DIR` to keep its rules and logs in `DIR`.
//!
//! - `GET /api/orders`: about 50 calls a second against a flow limit of 40, so some are blocked;
//! - `GET /api/search`: a hot-parameter limit of 15 calls a second per user, one user is greedy;
//! - `inventory.reserve`: fails in bursts every 40 s; its error-ratio breaker trips, probes after 5 s and
//!   closes when the downstream has recovered;
//! - `report.generate`: slow, at most 2 in flight (a thread-grade flow rule).
//!
//! The rules come from `rules.json` in the demo's directory (printed at start; a copy of
//! `examples/rules/dashboard-demo-rules.json` the first time), and its logs go to `logs/` there. By default the
//! directory is a fresh private one, removed when the demo ends: `sentinel-dashboard-demo` under the temporary
//! directory if this run creates it, else a new name beside it (never one that exists already); `--dir DIR` (or `SENTINEL_DEMO_DIR`) names one
//! to keep: rules pushed from the console or from the dashboard are written back to its `rules.json`, so they
//! are still in force after a restart of the demo with the same `--dir`.
//!
//! With a Sentinel Dashboard (Java 8+, `sentinel-dashboard-1.8.x.jar` from Sentinel's releases):
//!
//! ```sh
//! java -Dserver.port=8080 -jar sentinel-dashboard-1.8.9.jar &
//! SENTINEL_DASHBOARD_SERVER=127.0.0.1:8080 cargo run --example dashboard_demo
//! ```
//!
//! then log in at http://127.0.0.1:8080 (sentinel / sentinel): the app `dashboard-demo` appears within 10 s.

use std::error::Error;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sentinel_runtime::datasource::FileDataSource;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::{Config, Sentinel};

const SAMPLE: &str = include_str!("rules/dashboard-demo-rules.json");

/// What the command line asks for.
struct Args {
    duration: Option<Duration>,
    dir: Option<PathBuf>,
}

fn args() -> Result<Args, Box<dyn Error>> {
    const USAGE: &str = "usage: dashboard_demo [--duration SECS] [--dir DIR]";
    let mut parsed = Args { duration: None, dir: std::env::var_os("SENTINEL_DEMO_DIR").map(PathBuf::from) };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--duration" => {
                let secs = args.next().ok_or(USAGE)?;
                let secs: u64 = secs.parse().map_err(|_| format!("--duration: `{secs}` is not a number of seconds"))?;
                parsed.duration = Some(Duration::from_secs(secs));
            }
            "--dir" => parsed.dir = Some(args.next().ok_or(USAGE)?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unexpected argument `{other}` ({USAGE})").into()),
        }
    }
    Ok(parsed)
}

/// Runs `f` about `per_second` times a second on a thread of its own until `stop`.
fn traffic(stop: &Arc<AtomicBool>, per_second: u32, mut f: impl FnMut(u64) + Send + 'static) {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let gap = Duration::from_secs(1) / per_second;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            f(n);
            n += 1;
            std::thread::sleep(gap);
        }
    });
}

/// A directory builder that makes the directory readable by its owner only (on Unix).
fn private_dir() -> tempfile::Builder<'static, 'static> {
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o700));
    }
    builder
}

fn main() -> Result<(), Box<dyn Error>> {
    let Args { duration, dir } = args()?;
    // A directory the user names (kept), or a fresh private one (removed at the end). Never one found under
    // the shared temporary directory: another user could create it first, with rules or links in it.
    let fresh;
    let dir = match dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            dir
        }
        None => {
            // `sentinel-dashboard-demo` under the temporary directory when this run creates it (exclusively,
            // private to the user), so that it is easy to find; if it exists already, whoever made it, a
            // fresh name beside it.
            fresh = match private_dir().prefix("sentinel-dashboard-demo").rand_bytes(0).tempdir() {
                Ok(d) => d,
                Err(_) => private_dir().prefix("sentinel-dashboard-demo-").tempdir()?,
            };
            fresh.path().to_path_buf()
        }
    };
    let rules = dir.join("rules.json");
    if !rules.exists() {
        std::fs::write(&rules, SAMPLE)?;
    }

    let mut config = Config::default();
    config.app_name = "dashboard-demo".into();
    config.log_dir = dir.join("logs");
    let engine = Sentinel::builder().config(config).build();
    let source = FileDataSource::new(&engine, &rules);
    source.reload_now()?;
    let _watch = source.watch(Duration::from_millis(200))?;
    // The metric log lets the `metric` command answer for seconds older than the 5 minutes kept in memory.
    let _logs = sentinel_runtime::log::Logs::start(&engine)?;
    let center = CommandCenter::from_env(&engine)?.data_source(source).start()?;

    println!("Sentinel console:  {}", center.console_url());
    println!("rules file:        {} (pushed rules are written back here)", rules.display());
    println!("commands:          curl '{}getRules?type=flow'", center.console_url());
    println!("Sentinel Dashboard: java -Dserver.port=8080 -jar sentinel-dashboard-1.8.9.jar, then run this demo");
    println!(
        "                    with SENTINEL_DASHBOARD_SERVER=127.0.0.1:8080 (advertised ip {})",
        center.advertised_ip()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let orders = engine.resource("GET /api/orders");
    traffic(&stop, 50, move |_| {
        if let Ok(e) = orders.enter() {
            std::thread::sleep(Duration::from_millis(2));
            drop(e);
        }
    });
    let search = engine.clone();
    traffic(&stop, 60, move |n| {
        // One user in three calls is the greedy one.
        let user: u64 = if n % 3 == 0 { 42 } else { n % 97 };
        let _ = search.entry("GET /api/search").args(&[&user]).enter();
    });
    let inventory = engine.resource("inventory.reserve");
    let started = Instant::now();
    traffic(&stop, 30, move |_| {
        if let Ok(mut e) = inventory.enter() {
            // The downstream fails for 8 s out of every 40 s.
            if started.elapsed().as_secs() % 40 >= 32 {
                e.set_error();
            }
        }
    });
    let report = engine.resource("report.generate");
    for _ in 0..3 {
        let report = report.clone();
        traffic(&stop, 2, move |_| {
            if let Ok(e) = report.enter() {
                std::thread::sleep(Duration::from_millis(700));
                drop(e);
            }
        });
    }

    match duration {
        Some(d) => std::thread::sleep(d),
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
    stop.store(true, Ordering::Relaxed);
    println!("done after {} s", started.elapsed().as_secs());
    Ok(())
}
