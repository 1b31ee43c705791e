//! Cluster flow control on a real `redis-server` (started by the bench on a free port), in one run:
//!
//! - `cluster_entry`: entry + exit of a cluster rule with a lease in hand, against the same rule local (and
//!   the same cluster rule with no token service, decided locally), wall and thread CPU time;
//! - `cluster_hang_to_fallback`: from Redis frozen (SIGSTOP) to the rule falling back;
//! - printed: Redis round trips per 10,000 admitted calls at 10,000 calls per second.
//!
//! Run: `RUST_BACKTRACE= cargo bench -p sentinel-benches --bench cluster`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::Measurement;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sentinel_runtime::cluster::{ClusterClient, RedisCluster};
use sentinel_runtime::flow::{ClusterConfig, ClusterRuleMode, ClusterThresholdType, FlowRule};
use sentinel_runtime::Sentinel;
use sentinel_testkit::redis::RedisServer;

#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

fn cluster_rule(resource: &str, count: f64, window_ms: u64, samples: u32) -> FlowRule {
    FlowRule {
        cluster_mode: true,
        cluster_config: Some(ClusterConfig {
            threshold_type: ClusterThresholdType::Global,
            sample_count: samples,
            window_interval_ms: window_ms,
            ..ClusterConfig::default()
        }),
        ..FlowRule::new(resource).count(count)
    }
}

fn redis() -> RedisServer {
    RedisServer::start("cluster bench").expect("the cluster bench needs redis-server (scripts/test installs it)")
}

/// An engine with the local rule `local`, the cluster rule `cluster` (a limit no call reaches, windows of
/// one bucket of a second: a lease lasts about a second) and its client, the lease already in hand.
fn engines(url: &str) -> (Sentinel, ClusterClient, Sentinel) {
    let engine = Sentinel::builder().build();
    engine
        .load_flow_rules([FlowRule::new("local").count(1e12), cluster_rule("cluster", 1e12, 1000, 1)])
        .expect("valid rules");
    let client = RedisCluster::builder(url).timeout(Duration::from_millis(50)).start(&engine).expect("a client");
    client.wait_connected(Duration::from_secs(5)).expect("Redis answers");
    let r = engine.resource("cluster");
    for _ in 0..100_000 {
        drop(r.enter());
    }
    // The same cluster rule without a token service (decided locally, as Java does without a client).
    let no_service = Sentinel::builder().build();
    no_service.load_flow_rules([cluster_rule("cluster", 1e12, 1000, 1)]).expect("valid rules");
    (engine, client, no_service)
}

fn entry_in<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let server = redis();
    let (engine, client, no_service) = engines(&server.url());
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    let cases = [
        ("same rule local", engine.resource("local")),
        ("cluster rule, lease in hand", engine.resource("cluster")),
        ("cluster rule, no token service", no_service.resource("cluster")),
    ];
    for (name, r) in cases {
        g.bench_function(BenchmarkId::new("sentinel-rs", name), |b| {
            b.iter(|| {
                let e = r.enter();
                black_box(&e);
            })
        });
    }
    g.finish();
    let st = &engine.cluster_status()[0];
    eprintln!("cluster rule after the bench: {st}");
    drop(client);
}

fn entry(c: &mut Criterion) {
    entry_in(c, "cluster_entry");
}

fn entry_cpu(c: &mut Criterion<ThreadCpuTime>) {
    entry_in(c, "cluster_entry_cpu");
}

/// Redis frozen (SIGSTOP) under a steady caller: how long the longest call waited (a call whose lease ran
/// out waits for Redis at most the timeout, then is decided by the fallback), and how long until the rule
/// is in fallback mode (the lease in hand keeps serving calls meanwhile, so this includes the rest of its
/// bucket). The rule's buckets are 10 ms, so a lease runs out soon after the freeze.
fn hang_to_fallback(c: &mut Criterion) {
    let server = redis();
    let engine = Sentinel::builder().build();
    engine.load_flow_rules([cluster_rule("api", 1e9, 1000, 100)]).expect("valid rules");
    let client =
        RedisCluster::builder(server.url()).retry_max(Duration::from_millis(100)).start(&engine).expect("a client");
    client.wait_connected(Duration::from_secs(5)).expect("Redis answers");
    let api = engine.resource("api");
    let mode = || engine.cluster_status()[0].mode;
    // One freeze: (longest call, time to fallback mode).
    let freeze = || {
        server.resume();
        while mode() != ClusterRuleMode::Leasing {
            drop(api.enter());
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..10_000 {
            drop(api.enter());
        }
        let t = Instant::now();
        server.pause();
        let mut longest = Duration::ZERO;
        while mode() != ClusterRuleMode::Fallback {
            let c = Instant::now();
            drop(api.enter());
            longest = longest.max(c.elapsed());
        }
        (longest, t.elapsed())
    };
    let mut g = c.benchmark_group("cluster_hang_to_fallback");
    g.sample_size(10);
    g.bench_function("longest call after SIGSTOP, timeout 20 ms", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| freeze().0).sum())
    });
    g.bench_function("SIGSTOP to fallback mode, timeout 20 ms", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| freeze().1).sum())
    });
    g.finish();
    server.resume();
    drop(client);
}

/// Redis round trips per 10,000 admitted calls, one caller at 10,000 calls per second for 3 s, on a rule of
/// Java's default window (1 s in 10 buckets) that the calls do not exhaust, and on one they exceed (8,000/s:
/// how much of the limit is admitted too).
fn round_trips(_c: &mut Criterion) {
    let server = redis();
    for (count, what) in [(20_000.0, "limit 20,000/s"), (8_000.0, "limit 8,000/s (exceeded)")] {
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([cluster_rule("api", count, 1000, 10)]).expect("valid rules");
        let client = RedisCluster::builder(server.url()).start(&engine).expect("a client");
        client.wait_connected(Duration::from_secs(5)).expect("Redis answers");
        let api = engine.resource("api");
        // A second to learn the rate.
        pace(&api, Duration::from_secs(1));
        let before = engine.cluster_status()[0].round_trips;
        let (made, admitted) = pace(&api, Duration::from_secs(3));
        let trips = engine.cluster_status()[0].round_trips - before;
        println!(
            "cluster_round_trips/{what}: {trips} Redis round trips for {admitted} admitted calls of {made} made in 3 s \
             = {:.1} per 10,000 admitted calls; admitted {:.0}/s against the limit of {count}/s",
            trips as f64 * 10_000.0 / admitted.max(1) as f64,
            admitted as f64 / 3.0
        );
        drop(client);
    }
}

/// Calls `api` 10,000 times a second (spinning between calls) for `d`; returns the calls made and admitted.
fn pace(api: &sentinel_runtime::Resource, d: Duration) -> (u64, u64) {
    let start = Instant::now();
    let mut n = 0u64;
    let mut admitted = 0u64;
    while start.elapsed() < d {
        let due = start + Duration::from_micros(n * 100);
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        if api.enter().is_ok() {
            admitted += 1;
        }
        n += 1;
    }
    (n, admitted)
}

criterion_group!(benches, entry, hang_to_fallback, round_trips);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = entry_cpu
}
criterion_main!(benches, cpu);
