//! One limit across several processes: cluster flow control on Redis.
//!
//! Run: `cargo run --example cluster_redis -- [--workers N] [--duration SECS] [--limit PER_SECOND]`
//! against the Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`; `redis-server --port 6379` starts
//! one), or a Redis Cluster (`REDIS_CLUSTER_NODES`: seed URLs separated by commas, any of its nodes), or the
//! master behind Redis Sentinel (`REDIS_SENTINELS`: the sentinels' URLs separated by commas, and
//! `REDIS_MASTER_NAME`, default `mymaster`).
//!
//! The example starts N worker processes (itself, with `--worker`), each hammering the resource
//! `queryOrder` under one global cluster rule of `--limit` calls per second. Each second it prints what
//! each worker admitted and the total against the limit: the total stays at the limit however many
//! workers there are, each one's share following its traffic. Stop Redis (or `kill -STOP` it) while it
//! runs to see the workers fall back to `limit ÷ workers` each, and resume when Redis is back.

use std::collections::BTreeMap;
use std::error::Error;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sentinel_runtime::cluster::{RedisCluster, RedisClusterBuilder};
use sentinel_runtime::flow::{ClusterConfig, ClusterRuleMode, ClusterThresholdType, FlowRule};
use sentinel_runtime::Sentinel;

const RESOURCE: &str = "queryOrder";

struct Args {
    worker: Option<usize>,
    workers: usize,
    duration: u64,
    limit: f64,
}

fn args() -> Result<Args, String> {
    let mut a = Args { worker: None, workers: 3, duration: 10, limit: 1000.0 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match flag.as_str() {
            "--worker" => a.worker = Some(value("--worker")?.parse().map_err(|e| format!("--worker: {e}"))?),
            "--workers" => a.workers = value("--workers")?.parse().map_err(|e| format!("--workers: {e}"))?,
            "--duration" => a.duration = value("--duration")?.parse().map_err(|e| format!("--duration: {e}"))?,
            "--limit" => a.limit = value("--limit")?.parse().map_err(|e| format!("--limit: {e}"))?,
            other => return Err(format!("unknown argument `{other}` (--workers N, --duration SECS, --limit N)")),
        }
    }
    if a.workers == 0 || a.duration == 0 || a.limit.is_nan() || a.limit <= 0.0 {
        return Err("--workers, --duration and --limit must be > 0".into());
    }
    Ok(a)
}

fn url() -> String {
    let list = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(nodes) = list("REDIS_CLUSTER_NODES") {
        return format!("the Redis Cluster {nodes}");
    }
    if let Some(sentinels) = list("REDIS_SENTINELS") {
        return format!("the master {} behind the sentinels {sentinels}", master_name());
    }
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

fn master_name() -> String {
    std::env::var("REDIS_MASTER_NAME").unwrap_or_else(|_| "mymaster".to_string())
}

/// The client for the deployment the environment names.
fn builder() -> RedisClusterBuilder {
    let split = |v: String| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect::<Vec<_>>();
    if let Ok(nodes) = std::env::var("REDIS_CLUSTER_NODES") {
        return RedisCluster::cluster_builder(split(nodes));
    }
    if let Ok(sentinels) = std::env::var("REDIS_SENTINELS") {
        return RedisCluster::sentinel_builder(split(sentinels), master_name());
    }
    RedisCluster::builder(url())
}

fn wall_second() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cluster_redis: {e}");
            std::process::exit(2);
        }
    };
    let result = match a.worker {
        Some(id) => worker(id, &a),
        None => parent(&a),
    };
    if let Err(e) = result {
        eprintln!("cluster_redis: {e}");
        std::process::exit(1);
    }
}

/// A worker: hammers the resource until the end second and prints `second admitted mode` each second.
fn worker(id: usize, a: &Args) -> Result<(), Box<dyn Error>> {
    let engine = Sentinel::builder().app_name("cluster-example").build();
    let rule = FlowRule {
        cluster_mode: true,
        cluster_config: Some(ClusterConfig { threshold_type: ClusterThresholdType::Global, ..Default::default() }),
        ..FlowRule::new(RESOURCE).count(a.limit)
    };
    engine.load_flow_rules([rule])?;
    let cluster = builder().instance_id(format!("example-worker-{id}")).start(&engine)?;
    cluster.wait_connected(Duration::from_secs(3))?;
    let query = engine.resource(RESOURCE);
    let end = wall_second() + a.duration + 1;
    let mut second = wall_second();
    let mut admitted = 0u64;
    let mut straddling = 0u64;
    loop {
        // Counted in the second the call was decided in: read before and after the decision, and counted
        // apart when the two differ (a call that waited across the boundary, or was descheduled there).
        let before = wall_second();
        let passed = query.enter().is_ok();
        let now = wall_second();
        if passed && before != now {
            straddling += 1;
        }
        if now != second {
            let mode = match engine.cluster_status()[0].mode {
                ClusterRuleMode::Leasing => "leasing",
                ClusterRuleMode::Fallback => "fallback",
                _ => "other",
            };
            println!("{second} {admitted} {mode} {straddling}");
            second = now;
            admitted = 0;
            straddling = 0;
            if now >= end {
                return Ok(());
            }
        }
        admitted += (passed && before == now) as u64;
    }
}

/// Starts the workers and prints, each second, what each admitted and the total against the limit.
fn parent(a: &Args) -> Result<(), Box<dyn Error>> {
    println!("{} workers, one global limit of {}/s on `{RESOURCE}`, Redis at {}", a.workers, a.limit, url());
    let exe = std::env::current_exe()?;
    let (tx, rx) = mpsc::channel::<(usize, u64, u64, String, u64)>();
    let mut children = Vec::new();
    for id in 0..a.workers {
        let mut child = Command::new(&exe)
            .args(["--worker", &id.to_string(), "--duration", &a.duration.to_string(), "--limit", &a.limit.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or("no worker output")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let f: Vec<&str> = line.split(' ').collect();
                if let [s, n, mode, straddling] = f[..] {
                    if let (Ok(s), Ok(n), Ok(x)) = (s.parse(), n.parse(), straddling.parse()) {
                        let _ = tx.send((id, s, n, mode.to_string(), x));
                    }
                }
            }
        });
        children.push(child);
    }
    drop(tx);
    let header: Vec<String> = (0..a.workers).map(|i| format!("{:>12}", format!("worker {i}"))).collect();
    println!(
        "{:>12} {} {:>12}  (+ calls decided across a second's boundary)",
        "second",
        header.join(" "),
        "total/limit"
    );
    // Per second, per worker: (admitted, mode, calls decided across the boundary).
    type Row = Vec<Option<(u64, String, u64)>>;
    let mut seconds: BTreeMap<u64, Row> = BTreeMap::new();
    for (id, s, n, mode, x) in rx {
        let row = seconds.entry(s).or_insert_with(|| vec![None; a.workers]);
        row[id] = Some((n, mode, x));
        if row.iter().all(Option::is_some) {
            let cells: Vec<String> = row
                .iter()
                .flatten()
                .map(|(n, mode, _)| {
                    format!("{:>12}", if mode == "leasing" { n.to_string() } else { format!("{n} ({mode})") })
                })
                .collect();
            let total: u64 = row.iter().flatten().map(|(n, _, _)| n).sum();
            let across: u64 = row.iter().flatten().map(|(_, _, x)| x).sum();
            println!("{:>12} {} {:>12}  (+{across})", s % 1000, cells.join(" "), format!("{total}/{}", a.limit));
        }
    }
    let mut failed = 0;
    for mut c in children {
        if !c.wait()?.success() {
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(format!("{failed} worker(s) failed (is Redis running at {}?)", url()).into());
    }
    Ok(())
}
