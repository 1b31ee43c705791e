//! Cluster flow control on a real `redis-server` (started per test on a free port): exact per-window sums
//! across processes, average-local thresholds following the live instances, the fallback when Redis hangs,
//! dies or answers errors, async callers, and rules from Redis.
//!
//! The multi-process tests re-execute this test binary in a worker mode (`cluster_worker`, an ignored test
//! that runs only when the parent asks for it through `SENTINEL_CLUSTER_WORKER`).
#![cfg(feature = "cluster-redis")]

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sentinel_runtime::cluster::{ClusterClient, RedisCluster, RedisDataSource};
use sentinel_runtime::flow::{
    ClusterConfig, ClusterRuleMode, ClusterThresholdType, FallbackInstances, FlowRule, ASSUMED_INSTANCES,
};
use sentinel_runtime::{RuleKind, Sentinel};
use sentinel_testkit::logs::{Logged, OnEvent};
use sentinel_testkit::redis::RedisServer;
use sentinel_testkit::relay::Relay;

#[path = "support/cluster_workers.rs"]
mod cluster_workers;
use cluster_workers::{
    env, env_u64, format_windows, hammer, one_at_a_time, parse_list, parse_windows, result_lines, sleep_until,
    spawn_worker, wall_ms,
};

const WORKER_ENV: &str = "SENTINEL_CLUSTER_WORKER";

fn cluster_rule(resource: &str, count: f64, threshold: ClusterThresholdType, window_ms: u64, samples: u32) -> FlowRule {
    FlowRule {
        cluster_mode: true,
        cluster_config: Some(ClusterConfig {
            threshold_type: threshold,
            sample_count: samples,
            window_interval_ms: window_ms,
            ..ClusterConfig::default()
        }),
        ..FlowRule::new(resource).count(count)
    }
}

/// Waits (polling the status, at most `within`) until `cond` holds for the engine's first cluster rule.
fn wait_until(
    engine: &Sentinel,
    within: Duration,
    cond: impl Fn(&sentinel_runtime::flow::ClusterRuleStatus) -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if engine.cluster_status().first().is_some_and(&cond) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

// ---------------------------------------------------------------------------------------------------------
// Worker processes

/// What a worker does, passed in its environment.
struct WorkerPlan {
    url: String,
    namespace: String,
    count: f64,
    global: bool,
    window_ms: u64,
    samples: u32,
    start_at: u64,
    end_at: u64,
    member_ttl_ms: u64,
}

impl WorkerPlan {
    fn spawn(&self, name: &str) -> Child {
        let vars = [
            ("W_URL", self.url.clone()),
            ("W_NS", self.namespace.clone()),
            ("W_COUNT", self.count.to_string()),
            ("W_GLOBAL", if self.global { "1" } else { "0" }.to_string()),
            ("W_WINDOW", self.window_ms.to_string()),
            ("W_SAMPLES", self.samples.to_string()),
            ("W_START", self.start_at.to_string()),
            ("W_END", self.end_at.to_string()),
            ("W_TTL", self.member_ttl_ms.to_string()),
        ];
        spawn_worker("cluster_worker", WORKER_ENV, name, &vars)
    }
}

/// The worker mode: hammers one cluster rule from `W_START` to `W_END` (wall ms) and prints the calls it
/// admitted per window (by wall-clock window, which on one machine is Redis's clock too). A call whose
/// decision straddles a window boundary (stamped before and after) is counted apart as ambiguous.
#[test]
#[ignore = "a worker process of the multi-process tests, started by them"]
fn cluster_worker() {
    let Ok(name) = std::env::var(WORKER_ENV) else {
        return;
    };
    let plan = WorkerPlan {
        url: env("W_URL"),
        namespace: env("W_NS"),
        count: env("W_COUNT").parse().expect("W_COUNT"),
        global: std::env::var("W_GLOBAL").is_ok_and(|v| v == "1"),
        window_ms: env_u64("W_WINDOW"),
        samples: env_u64("W_SAMPLES") as u32,
        start_at: env_u64("W_START"),
        end_at: env_u64("W_END"),
        member_ttl_ms: env_u64("W_TTL"),
    };
    let engine = Sentinel::builder().app_name("cluster-test").build();
    let threshold = if plan.global { ClusterThresholdType::Global } else { ClusterThresholdType::AvgLocal };
    engine.load_flow_rules([cluster_rule("api", plan.count, threshold, plan.window_ms, plan.samples)]).unwrap();
    let client = RedisCluster::builder(&plan.url)
        .namespace(&plan.namespace)
        .instance_id(&name)
        .timeout(Duration::from_millis(500))
        .member_ttl(Duration::from_millis(plan.member_ttl_ms))
        .heartbeat_interval(Duration::from_millis(plan.member_ttl_ms / 4))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(10)).unwrap();
    let api = engine.resource("api");
    sleep_until(plan.start_at);
    let stalls = stall_probe(plan.end_at, plan.window_ms);
    let admitted = hammer(plan.end_at, plan.window_ms, Duration::from_micros(20), || api.enter());
    let (ambiguous, errors) = (admitted.ambiguous, admitted.errors);
    let status = engine.cluster_status();
    let st = &status[0];
    let stalled: Vec<String> = stalls.join().unwrap_or_default().iter().map(u64::to_string).collect();
    println!(
        "\nCLUSTER_WORKER_RESULT ambiguous={ambiguous} errors={errors} round_trips={} waits={} timeouts={} \
         local={} failures={} stalls={} windows={}",
        st.round_trips,
        st.waits,
        st.wait_timeouts,
        st.fallback_decisions,
        st.failures,
        stalled.join(","),
        format_windows(&admitted.per_window)
    );
    drop(client);
}

/// Windows (by wall-clock window index) in which this process was frozen for a fifth of a window or more: a
/// thread that only sleeps 1 ms at a time saw a longer gap. On a machine whose CPUs are oversubscribed a
/// process (or all of them) can be descheduled for that long; such a window cannot admit its count, whatever
/// the limiter does. Runs until `end_at` (wall ms).
fn stall_probe(end_at: u64, window_ms: u64) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut stalled = std::collections::BTreeSet::new();
        let mut last = wall_ms();
        while last < end_at {
            std::thread::sleep(Duration::from_millis(1));
            let now = wall_ms();
            if now - last >= window_ms / 5 {
                stalled.extend(last / window_ms..=now / window_ms);
            }
            last = now;
        }
        stalled.into_iter().collect()
    })
}

/// The same from the outside, for Redis: a PING every 2 ms from the test process until `end_at`; windows in
/// which one took a fifth of a window or more (Redis, or this process, was descheduled).
fn redis_stall_probe(url: String, end_at: u64, window_ms: u64) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut stalled = std::collections::BTreeSet::new();
        let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        else {
            return Vec::new();
        };
        while wall_ms() < end_at {
            let before = wall_ms();
            let _ = redis::cmd("PING").query::<String>(&mut conn);
            let after = wall_ms();
            if after - before >= window_ms / 5 {
                stalled.extend(before / window_ms..=after / window_ms);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        stalled.into_iter().collect()
    })
}

/// The windows any probe saw stalled.
fn stalled_windows(redis: std::thread::JoinHandle<Vec<u64>>, reports: &[Report]) -> std::collections::BTreeSet<u64> {
    let mut stalled: std::collections::BTreeSet<u64> = redis.join().unwrap_or_default().into_iter().collect();
    stalled.extend(reports.iter().flat_map(|r| r.stalls.iter().copied()));
    stalled
}

/// A worker's report: admitted calls per window, and its ambiguous and erroneous calls.
#[derive(Debug, Default)]
struct Report {
    windows: BTreeMap<u64, u64>,
    ambiguous: u64,
    errors: u64,
    stalls: Vec<u64>,
    /// The worker's line, for failure messages.
    line: String,
}

fn report_of(child: Child) -> Report {
    let out = child.wait_with_output().expect("a worker's output");
    let text = String::from_utf8_lossy(&out.stdout);
    let (line, fields) = result_lines(&text, "CLUSTER_WORKER_RESULT ")
        .next()
        .unwrap_or_else(|| panic!("a worker printed no result (status {}):\n{text}", out.status));
    let mut r = Report { line: line.chars().take(300).collect(), ..Report::default() };
    for field in fields {
        match field {
            ("ambiguous", v) => r.ambiguous = v.parse().unwrap(),
            ("errors", v) => r.errors = v.parse().unwrap(),
            ("stalls", v) => r.stalls = parse_list(v),
            ("windows", v) => r.windows = parse_windows(v),
            _ => {}
        }
    }
    r
}

fn sums(reports: &[Report]) -> BTreeMap<u64, u64> {
    let mut total: BTreeMap<u64, u64> = BTreeMap::new();
    for r in reports {
        for (w, n) in &r.windows {
            *total.entry(*w).or_default() += n;
        }
    }
    total
}

#[test]
fn several_processes_hammering_one_global_rule_admit_the_count_per_window_and_no_more() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("several_processes_hammering_one_global_rule") else { return };
    // 2500/s over windows of 200 ms (two buckets of 100 ms): 500 calls per window for all processes.
    let (count, window_ms, windows) = (2500.0, 200u64, 20u64);
    let per_window = (count * window_ms as f64 / 1000.0) as u64;
    let start_at = (wall_ms() / window_ms + 8) * window_ms;
    let end_at = start_at + (windows + 2) * window_ms;
    let plan = WorkerPlan {
        url: redis.url(),
        namespace: "exact".into(),
        count,
        global: true,
        window_ms,
        samples: 2,
        start_at,
        end_at,
        member_ttl_ms: 2000,
    };
    let children: Vec<Child> = (0..3).map(|i| plan.spawn(&format!("worker-{i}"))).collect();
    let redis_stalls = redis_stall_probe(redis.url(), end_at, window_ms);
    let reports: Vec<Report> = children.into_iter().map(report_of).collect();
    let total = sums(&reports);
    // The first window warms the leases up; the last may be cut short.
    let measured: Vec<(u64, u64)> =
        (start_at / window_ms + 1..end_at / window_ms - 1).map(|w| (w, total.get(&w).copied().unwrap_or(0))).collect();
    assert_eq!(measured.len() as u64, windows);
    let ambiguous: u64 = reports.iter().map(|r| r.ambiguous).sum();
    let stalled = stalled_windows(redis_stalls, &reports);
    eprintln!(
        "admitted per window of {window_ms} ms (limit {per_window}): {measured:?}; ambiguous {ambiguous}; windows in \
         which the machine stalled: {stalled:?}"
    );
    assert!(reports.iter().all(|r| r.errors == 0), "no caller got an error: {reports:?}");
    let mut checked = 0;
    for (w, n) in &measured {
        assert!(*n <= per_window, "window {w} admitted {n} > {per_window} across processes: {measured:?}");
        if stalled.contains(w) {
            // A frozen process (or Redis) cannot admit in time: not a sign of under-admission.
            continue;
        }
        checked += 1;
        assert!(
            *n + ambiguous >= per_window * 95 / 100,
            "window {w} admitted {n} < 95% of {per_window} across processes: {measured:?}\n{:#?}",
            reports.iter().map(|r| &r.line).collect::<Vec<_>>()
        );
    }
    assert!(checked >= windows * 3 / 4, "the machine stalled in too many windows to judge: {stalled:?}");
    // A call that waited for the next bucket's lease starts before the boundary and passes after it: at
    // most one per process (one calling thread each) per boundary.
    assert!(ambiguous <= 3 * (windows + 2), "calls stamped across a window boundary: {ambiguous}");
    // Every process got a share (none starved for the whole run).
    assert!(reports.iter().all(|r| r.windows.values().sum::<u64>() > 0), "{reports:?}");
}

#[test]
fn average_local_total_follows_the_live_instances_when_one_stops_heartbeating() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("average_local_total_follows_the_live_instances") else { return };
    // 1000/s per instance over windows of 200 ms: 200 per instance per window.
    let (count, window_ms) = (1000.0, 200u64);
    let per_instance = (count * window_ms as f64 / 1000.0) as u64;
    let ttl_ms = 800;
    let start_at = (wall_ms() / window_ms + 8) * window_ms;
    let killed_at = start_at + 8 * window_ms;
    let end_at = killed_at + ttl_ms + 10 * window_ms;
    let plan = WorkerPlan {
        url: redis.url(),
        namespace: "avg".into(),
        count,
        global: false,
        window_ms,
        samples: 2,
        start_at,
        end_at,
        member_ttl_ms: ttl_ms,
    };
    let mut children: Vec<Child> = (0..3).map(|i| plan.spawn(&format!("avg-{i}"))).collect();
    let redis_stalls = redis_stall_probe(redis.url(), end_at, window_ms);
    let leaving = children.remove(2);
    sleep_until(killed_at);
    // A crash: no goodbye, the membership expires with its TTL.
    let mut leaving = leaving;
    let _ = leaving.kill();
    let _ = leaving.wait();
    let reports: Vec<Report> = children.into_iter().map(report_of).collect();
    let total = sums(&reports);
    assert!(reports.iter().all(|r| r.errors == 0), "no caller got an error");
    let ambiguous: u64 = reports.iter().map(|r| r.ambiguous).sum();
    // Before the crash the two survivors share three instances' allowance (the third hammers too, but its
    // calls are not in these reports): together at most 3 × 200.
    for w in start_at / window_ms + 1..killed_at / window_ms {
        let n = total.get(&w).copied().unwrap_or(0);
        assert!(n <= 3 * per_instance, "window {w}: {n} > {}", 3 * per_instance);
    }
    // After the membership expired (and a window to settle): two instances, 2 × 200 per window.
    let after: Vec<(u64, u64)> = ((killed_at + ttl_ms) / window_ms + 2..end_at / window_ms - 1)
        .map(|w| (w, total.get(&w).copied().unwrap_or(0)))
        .collect();
    assert!(after.len() >= 6, "{after:?}");
    let stalled = stalled_windows(redis_stalls, &reports);
    let mut checked = 0;
    for (w, n) in &after {
        assert!(
            *n <= 2 * per_instance,
            "window {w} admitted {n} > {} for two live instances: {after:?}",
            2 * per_instance
        );
        if stalled.contains(w) {
            continue;
        }
        checked += 1;
        assert!(
            *n + ambiguous >= 2 * per_instance * 95 / 100,
            "window {w} admitted {n} < 95% of {} for two live instances: {after:?}",
            2 * per_instance
        );
    }
    assert!(checked >= after.len() * 3 / 4, "the machine stalled in too many windows to judge: {stalled:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Faults, in one process

/// Log lines, captured process-wide (the client logs from its own thread).
fn captured_logs() -> &'static Mutex<Vec<String>> {
    static LOGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let logs = LOGS.get_or_init(|| Mutex::new(Vec::new()));
    INSTALLED.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(OnEvent(|e: Logged| {
            if e.level <= tracing::Level::INFO {
                logs.lock().unwrap().push(format!("{} {}", e.level, e.fields));
            }
        }));
    });
    logs
}

fn logged(needle: &str) -> bool {
    captured_logs().lock().unwrap().iter().any(|l| l.contains(needle))
}

/// An engine with one global cluster rule on `api` and its client.
fn instance(url: &str, ns: &str, count: f64, timeout: Duration) -> (Sentinel, ClusterClient) {
    instance_with(url, ns, cluster_rule("api", count, ClusterThresholdType::Global, 1000, 2), timeout)
}

#[test]
fn hung_redis_makes_calls_fall_back_within_the_timeout_to_their_share_of_the_count() {
    let _serial = one_at_a_time();
    captured_logs();
    let Some(redis) = RedisServer::start("hung_redis_makes_calls_fall_back") else { return };
    let timeout = Duration::from_millis(20);
    let (engine, _client) = instance(&redis.url(), "hang", 200.0, timeout);
    // A second instance, so that the count is shared by two.
    let (_other, _other_client) = instance(&redis.url(), "hang", 200.0, timeout);
    let api = engine.resource("api");
    assert!(
        wait_until(&engine, Duration::from_secs(5), |s| s.live_instances == Some(2)),
        "{:?}",
        engine.cluster_status()
    );
    redis.pause();
    let mut latencies = Vec::new();
    let mut errors = 0;
    let stop_at = Instant::now() + Duration::from_millis(600);
    while Instant::now() < stop_at {
        let t = Instant::now();
        match api.enter() {
            Ok(_) | Err(sentinel_runtime::BlockError::Flow { .. }) => {}
            Err(_) => errors += 1,
        }
        latencies.push(t.elapsed());
    }
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let max = *latencies.last().unwrap();
    let status = engine.cluster_status()[0].clone();
    redis.resume();
    assert_eq!(errors, 0);
    assert!(p99 <= timeout + Duration::from_millis(5), "p99 {p99:?} (max {max:?}) over the timeout");
    assert_eq!(status.mode, ClusterRuleMode::Fallback, "{status}");
    assert_eq!(status.local_limit, 100.0, "count ÷ 2 live instances");
    assert!(status.reason.as_deref().is_some_and(|r| r.contains("did not answer within 20 ms")), "{status}");
    assert!(logged("falls back to local limits"), "a log line says why");
    // Resumed: cluster mode comes back by itself.
    assert!(
        wait_until(&engine, Duration::from_secs(5), |s| s.mode == ClusterRuleMode::Leasing),
        "{}",
        engine.cluster_status()[0]
    );
}

#[test]
fn fallback_local_limit_admits_exactly_the_instance_share_per_second() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("fallback_local_limit_admits_exactly_the_instance_share") else { return };
    let (engine, _client) = instance(&redis.url(), "share", 300.0, Duration::from_millis(20));
    let (_b, _cb) = instance(&redis.url(), "share", 300.0, Duration::from_millis(20));
    let (_c, _cc) = instance(&redis.url(), "share", 300.0, Duration::from_millis(20));
    assert!(wait_until(&engine, Duration::from_secs(5), |s| s.live_instances == Some(3)));
    let mut redis = redis;
    redis.kill();
    let api = engine.resource("api");
    // Until the failure is noticed the calls wait at most the timeout; then they are decided locally.
    while engine.cluster_status()[0].mode != ClusterRuleMode::Fallback {
        let _ = api.enter();
    }
    // A whole second of the local limiter (its window is aligned on the engine's clock).
    let next_second = (engine.now_millis() / 1000 + 1) * 1000;
    while engine.now_millis() < next_second {
        std::hint::spin_loop();
    }
    let mut passed = 0;
    loop {
        let ok = api.enter().is_ok();
        // Read after the call: the limiter read the clock before, so the call was in this second.
        if engine.now_millis() >= next_second + 1000 {
            break;
        }
        passed += ok as u32;
    }
    assert_eq!(passed, 100, "300 ÷ 3 live instances in one second");
    redis.restart();
    assert!(
        wait_until(&engine, Duration::from_secs(5), |s| s.mode == ClusterRuleMode::Leasing),
        "cluster mode resumes after Redis restarts: {}",
        engine.cluster_status()[0]
    );
    let leased = engine.cluster_status()[0].tokens_leased;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && engine.cluster_status()[0].tokens_leased == leased {
        let _ = api.enter();
    }
    assert!(engine.cluster_status()[0].tokens_leased > leased, "tokens come from Redis again");
}

#[test]
fn wrong_password_falls_back_with_a_log_line_that_names_the_credentials() {
    let _serial = one_at_a_time();
    captured_logs();
    let Some(redis) = RedisServer::start_with("wrong_password_falls_back", &["--requirepass", "right"]) else {
        return;
    };
    let url = format!("redis://:wrong@{}", redis.addr());
    let engine = Sentinel::builder().app_name("auth").build();
    engine.load_flow_rules([cluster_rule("api", 5.0, ClusterThresholdType::Global, 1000, 2)]).unwrap();
    let client = RedisCluster::builder(&url).expected_instances(1).start(&engine).unwrap();
    let err = client.wait_connected(Duration::from_millis(500)).unwrap_err();
    assert!(err.to_string().contains("credentials"), "{err}");
    assert!(!err.to_string().contains("wrong"), "the password is not shown: {err}");
    let api = engine.resource("api");
    assert!(wait_until(&engine, Duration::from_secs(2), |s| s.mode == ClusterRuleMode::Fallback));
    let passed = (0..20).filter(|_| api.enter().is_ok()).count();
    assert_eq!(passed, 5, "the local fallback, count ÷ 1 expected instance (none seen)");
    assert!(logged("credentials"), "{:?}", captured_logs().lock().unwrap());
}

#[test]
fn script_error_falls_back_and_recovers_once_the_key_is_fixed() {
    let _serial = one_at_a_time();
    captured_logs();
    let Some(redis) = RedisServer::start("script_error_falls_back") else { return };
    let (engine, client) = instance(&redis.url(), "wrongtype", 50.0, Duration::from_millis(50));
    assert!(wait_until(&engine, Duration::from_secs(5), |s| s.key.is_some()), "the client names the rule's key");
    let key = engine.cluster_status()[0].key.clone().unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut conn = rt.block_on(redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection()).unwrap();
    // Someone overwrote the window with a string: the script fails with WRONGTYPE.
    rt.block_on(redis::cmd("SET").arg(&key).arg("oops").query_async::<()>(&mut conn)).unwrap();
    let api = engine.resource("api");
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && engine.cluster_status()[0].mode != ClusterRuleMode::Fallback {
        let _ = api.enter();
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = engine.cluster_status()[0].clone();
    assert_eq!(st.mode, ClusterRuleMode::Fallback, "{st}");
    assert!(st.reason.as_deref().is_some_and(|r| r.contains("WRONGTYPE")), "{st}");
    assert!(logged("WRONGTYPE"), "a log line with Redis's error");
    assert!(client.status().last_error.is_some());
    rt.block_on(redis::cmd("DEL").arg(&key).query_async::<()>(&mut conn)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && engine.cluster_status()[0].mode != ClusterRuleMode::Leasing {
        let _ = api.enter();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.cluster_status()[0].mode, ClusterRuleMode::Leasing, "recovered by itself");
}

// ---------------------------------------------------------------------------------------------------------
// Async callers

#[sentinel_runtime::sentinel_resource(name = "async-api")]
async fn guarded_call() -> Result<(), sentinel_runtime::BlockError> {
    Ok(())
}

#[test]
fn async_callers_await_an_empty_lease_without_blocking_their_executor() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("async_callers_await_an_empty_lease") else { return };
    let engine = Sentinel::builder().app_name("async").build().leak();
    engine.load_flow_rules([cluster_rule("async-api", 1000.0, ClusterThresholdType::Global, 1000, 2)]).unwrap();
    let _client = RedisCluster::builder(redis.url()).timeout(Duration::from_millis(200)).start(engine).unwrap();
    _client.wait_connected(Duration::from_secs(5)).unwrap();
    redis.pause();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ticks = Arc::new(Mutex::new(Vec::new()));
    let (waited, ticks_during) = engine.scoped(|| {
        rt.block_on(async {
            let t = ticks.clone();
            let ticker = tokio::spawn(async move {
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    t.lock().unwrap().push(Instant::now());
                }
            });
            let start = Instant::now();
            // Three annotated calls and one manual entry, all waiting for the (hung) Redis at once.
            let manual = engine.resource("async-api");
            let (a, b, c, d) =
                tokio::join!(guarded_call(), guarded_call(), guarded_call(), manual.entry().enter_async());
            let end = Instant::now();
            ticker.abort();
            assert!(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok(), "decided by the fallback, not an error");
            let during = ticks.lock().unwrap().iter().filter(|t| **t > start && **t < end).count();
            (end - start, during)
        })
    });
    redis.resume();
    assert!(waited >= Duration::from_millis(150), "the calls did wait for Redis: {waited:?}");
    assert!(waited < Duration::from_millis(600), "they waited together, not one after the other: {waited:?}");
    assert!(ticks_during >= 10, "the executor kept running other tasks while they waited: {ticks_during} ticks");
}

// ---------------------------------------------------------------------------------------------------------
// Rules from Redis

#[test]
fn published_rules_are_in_force_within_a_second_and_a_malformed_document_changes_nothing() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("published_rules_are_in_force_within_a_second") else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut conn = rt.block_on(redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection()).unwrap();
    let (key, channel) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");
    let publish = |conn: &mut redis::aio::MultiplexedConnection, doc: &str| {
        // Java's documented way: the key and the message in one transaction.
        rt.block_on(redis::pipe().atomic().set(key, doc).publish(channel, doc).query_async::<()>(conn)).unwrap();
    };
    publish(&mut conn, r#"[{"resource": "api", "grade": 1, "count": 10}]"#);
    let engine = Sentinel::builder().app_name("shop").build();
    let source = RedisDataSource::builder(redis.url()).rules(RuleKind::Flow, key, channel).start(&engine).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    source.on_reload(move |r| s.lock().unwrap().push(format!("{r:?}")));
    assert!(source.wait_for(1, Duration::from_secs(5)), "the key is read at start");
    assert_eq!(engine.flow_rules()[0].count, 10.0);

    let t = Instant::now();
    publish(&mut conn, r#"[{"resource": "api", "grade": 1, "count": 20}]"#);
    assert!(source.wait_for(2, Duration::from_secs(1)), "in force within a second");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(engine.flow_rules()[0].count, 20.0);

    publish(&mut conn, r#"[{"resource": "api", "grade": 1, "count": "lots"}]"#);
    assert!(source.wait_for(3, Duration::from_secs(1)));
    assert_eq!(engine.flow_rules()[0].count, 20.0, "a malformed document changes nothing");
    let e = source.last_error().expect("the bad document is reported");
    assert!(e.to_string().contains("[0].count") && e.to_string().contains(key), "{e}");
    publish(&mut conn, r#"[{"resource": "api", "grade": 1, "count": -5}]"#);
    assert!(source.wait_for(4, Duration::from_secs(1)));
    assert_eq!(engine.flow_rules()[0].count, 20.0, "an invalid rule changes nothing either");
    assert!(seen.lock().unwrap().iter().filter(|r| r.contains("Rejected")).count() >= 2);
}

#[test]
fn redis_data_source_reconnects_by_itself_and_reads_what_it_missed() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("redis_data_source_reconnects_by_itself") else { return };
    let (key, channel) = ("rules", "rules:changed");
    let engine = Sentinel::builder().build();
    let source = RedisDataSource::builder(redis.url())
        .rule_set(key, channel)
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, Duration::from_secs(5)), "the missing key is reported");
    assert!(source.is_connected());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut conn = rt.block_on(redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection()).unwrap();
    // Written without an announcement while the data source is connected: read once it reconnects.
    rt.block_on(
        redis::cmd("SET")
            .arg(key)
            .arg(r#"{"flowRules": [{"resource": "db", "count": 3}]}"#)
            .query_async::<()>(&mut conn),
    )
    .unwrap();
    assert!(engine.flow_rules().is_empty(), "nothing was announced");
    // The server drops the subscription (as a failover or a network cut would).
    rt.block_on(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query_async::<i64>(&mut conn)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && engine.flow_rules().is_empty() {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(engine.flow_rules().len(), 1, "reconnected and read the key");
    // A server restart: the data source subscribes again by itself and takes announcements again.
    let mut redis = redis;
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let doc = r#"{"flowRules": [{"resource": "db", "count": 4}]}"#;
    while Instant::now() < deadline && engine.flow_rules()[0].count != 4.0 {
        if let Ok(mut c) = rt.block_on(redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection()) {
            let _ = rt.block_on(redis::cmd("PUBLISH").arg(channel).arg(doc).query_async::<i64>(&mut c));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(engine.flow_rules()[0].count, 4.0, "announcements after the restart are applied");
    assert!(source.is_connected());
}

#[test]
fn an_update_published_between_the_subscription_and_the_read_never_brings_an_older_document_back() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("an_update_published_between_the_subscription_and_the_read") else {
        return;
    };
    // Two sources, read in turn: the first key is missing (its report runs the listener on the data source's
    // thread, after the subscription and before the second key is read). The listener publishes two
    // documents of the second key then, so that they land between the subscription and the read.
    let (first, first_channel) = ("sentinel:shop:degrade-rules", "sentinel:shop:degrade-rules:changed");
    let (key, channel) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");
    let doc = |count: u32| format!(r#"[{{"resource": "api", "grade": 1, "count": {count}}}]"#);
    let publish = {
        let url = redis.url();
        move |doc: &str| {
            let mut conn = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
            redis::pipe().atomic().set(key, doc).publish(channel, doc).query::<()>(&mut conn).unwrap();
        }
    };
    publish(&doc(1));
    let engine = Sentinel::builder().app_name("shop").build();
    let source = RedisDataSource::builder(redis.url())
        .rules(RuleKind::Degrade, first, first_channel)
        .rules(RuleKind::Flow, key, channel)
        .retry_max(Duration::from_millis(100))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(2, Duration::from_secs(5)), "both keys are read at start");
    assert_eq!(engine.flow_rules()[0].count, 1.0);
    // Armed now: on the next session's report of the first key, publish 2 then 3 (each SET and PUBLISH in
    // one transaction, as documented).
    // `published` is set once both are: the test's own document comes after them (set with the listener's
    // `armed` alone, it could land between them and leave 3 in the key, as it did under load).
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let published = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let counts = Arc::new(Mutex::new(Vec::new()));
    let (a, d, c, e, p) = (armed.clone(), published.clone(), counts.clone(), engine.clone(), publish.clone());
    source.on_reload(move |r| match r {
        sentinel_runtime::cluster::RedisReload::Missing { key: k }
            if k == first && a.swap(false, std::sync::atomic::Ordering::AcqRel) =>
        {
            p(&doc(2));
            p(&doc(3));
            d.store(true, std::sync::atomic::Ordering::Release);
        }
        sentinel_runtime::cluster::RedisReload::Applied { key: k, .. } if k == key => {
            c.lock().unwrap().push(e.flow_rules()[0].count);
        }
        _ => {}
    });
    // The server drops the subscription: the data source subscribes again and reads both keys again.
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query::<i64>(&mut conn).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && (!published.load(std::sync::atomic::Ordering::Acquire) || !source.is_connected())
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(published.load(std::sync::atomic::Ordering::Acquire), "the data source read the keys again");
    // Everything published is delivered by now: a barrier of our own, one more document, seen applied.
    publish(&doc(4));
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && engine.flow_rules()[0].count != 4.0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(engine.flow_rules()[0].count, 4.0);
    let counts = counts.lock().unwrap().clone();
    assert!(
        counts.windows(2).all(|w| w[0] < w[1]),
        "the rules in force only ever move to a newer document, never back: {counts:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------
// Resuming after a fault: what the fallback admitted, abandoned lease calls, leases arriving again

/// An engine with the cluster rule `rule` (on `api`) and its client (Redis answering).
fn instance_with(url: &str, ns: &str, rule: FlowRule, timeout: Duration) -> (Sentinel, ClusterClient) {
    instance_beating(url, ns, rule, timeout, Duration::from_millis(200))
}

/// [`instance_with`], renewing its membership every `beat`.
fn instance_beating(
    url: &str,
    ns: &str,
    rule: FlowRule,
    timeout: Duration,
    beat: Duration,
) -> (Sentinel, ClusterClient) {
    let engine = Sentinel::builder().app_name("resume").build();
    engine.load_flow_rules([rule]).unwrap();
    let client = RedisCluster::builder(url)
        .namespace(ns)
        .timeout(timeout)
        .retry_max(Duration::from_millis(200))
        .heartbeat_interval(beat)
        .member_ttl(beat * 7 + Duration::from_millis(100))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    assert!(wait_until(&engine, Duration::from_secs(5), |s| s.key.is_some()), "the client names the rule's key");
    (engine, client)
}

/// The tokens Redis counts in the rule's window now (the sum of its buckets, the fields named by a bucket's
/// index: `g` is the window's generation, `s:<member>` the last give-back applied per member, `c:<member>`
/// what its last call counted).
fn window_total(url: &str, key: &str) -> u64 {
    let mut conn = redis::Client::open(url).unwrap().get_connection_with_timeout(Duration::from_secs(2)).unwrap();
    let fields: BTreeMap<String, String> = redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
    fields.iter().filter(|(k, _)| k.parse::<i64>().is_ok()).map(|(_, v)| v.parse::<i64>().unwrap().max(0) as u64).sum()
}

/// Calls `api` until `stop` says so (given the calls admitted so far) or `within` passes; returns the calls
/// admitted. Pauses 1 ms after a block (a caller that retries, not a spinning one).
fn call_until(
    engine: &Sentinel,
    within: Duration,
    mut stop: impl FnMut(&sentinel_runtime::flow::ClusterRuleStatus, u64) -> bool,
) -> u64 {
    let api = engine.resource("api");
    let deadline = Instant::now() + within;
    let mut admitted = 0;
    while Instant::now() < deadline && !stop(&engine.cluster_status()[0], admitted) {
        match api.enter() {
            Ok(_entry) => admitted += 1,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    admitted
}

#[test]
fn calls_the_fallback_admitted_are_counted_in_the_shared_window_when_redis_answers_again() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("calls_the_fallback_admitted_are_counted") else { return };
    // 10/s over a minute (6 s buckets): 600 calls per window; the test lasts a few seconds, so every call it
    // makes is in one window. The local fallback allows 10/s on this (lone) instance.
    let rule = cluster_rule("api", 10.0, ClusterThresholdType::Global, 60_000, 10);
    let (engine, _client) = instance_with(&redis.url(), "fallback-counted", rule, Duration::from_millis(50));
    let key = engine.cluster_status()[0].key.clone().unwrap();
    // Redis hangs before any token was leased: the calls are decided by the local limit. About two and a
    // half seconds of a caller retrying every millisecond.
    redis.pause();
    let local = call_until(&engine, Duration::from_secs(10), |s, _| s.fallback_decisions >= 2500);
    let fallen = engine.cluster_status()[0].clone();
    redis.resume();
    assert_eq!(fallen.mode, ClusterRuleMode::Fallback, "{fallen}");
    assert!(local > 0, "the fallback admitted calls: {fallen}");
    assert!(
        wait_until(&engine, Duration::from_secs(5), |s| s.mode == ClusterRuleMode::Leasing),
        "cluster mode resumes: {}",
        engine.cluster_status()[0]
    );
    // Demand far above what is left: the window admits what it has room for, no more.
    let after = call_until(&engine, Duration::from_secs(4), |s, _| s.exhausted_for_ms > 0 && s.tokens_in_hand == 0);
    let st = engine.cluster_status()[0].clone();
    let total = local + after;
    assert!(total <= 600, "{local} admitted locally + {after} after Redis came back > 600 per window: {st}");
    assert!(st.local_admissions_reported > 0, "the fallback's admissions were reported: {st}");
    assert!(window_total(&redis.url(), &key) >= total, "Redis counts every admitted call: {st}");
    assert!(total >= 600 - 10, "the window's room is used once the fallback's calls are counted: {total}; {st}");
}

#[test]
fn lease_calls_abandoned_while_redis_hangs_grant_nothing_when_it_resumes() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("lease_calls_abandoned_while_redis_hangs") else { return };
    // One bucket of an hour: no lease ends (and gives tokens back) while the test runs, so what Redis counts
    // is exactly what the client was granted, minus what it gave back, plus what its fallback admitted.
    // 900 calls per hour: the first lease (half the window) is soon spent, and the lease call after it hangs.
    let rule = cluster_rule("api", 0.25, ClusterThresholdType::Global, 3_600_000, 1);
    // No renewal while the test runs: only a lease call can find Redis hung (and be abandoned).
    let (engine, _client) =
        instance_beating(&redis.url(), "abandoned", rule, Duration::from_millis(200), Duration::from_secs(60));
    let key = engine.cluster_status()[0].key.clone().unwrap();
    call_until(&engine, Duration::from_secs(5), |_, n| n >= 50);
    redis.pause();
    // Calls drain the lease in hand, ask for more, and give up on that lease call after the timeout.
    call_until(&engine, Duration::from_secs(10), |s, _| s.mode == ClusterRuleMode::Fallback);
    let hung = engine.cluster_status()[0].clone();
    redis.resume();
    assert_eq!(hung.mode, ClusterRuleMode::Fallback, "{hung}");
    // (The caller that waited for it is decided locally when its own wait times out or when the client
    // reports the failure, whichever comes first.)
    assert!(hung.waits > 0 && hung.failures > 0, "a lease call was abandoned: {hung}");
    assert!(wait_until(&engine, Duration::from_secs(5), |s| s.mode == ClusterRuleMode::Leasing));
    // Redis ran the abandoned call when it resumed (before anything sent later on the connection). What it
    // counts must be what the client knows of, once the fallback's admissions are reported.
    let (counted, known, st) = window_and_client_agree(&engine, &redis.url(), &key);
    assert_eq!(counted, known, "tokens counted in Redis that no caller was granted: {st}");
}

#[test]
fn a_lease_call_redis_ran_whose_reply_came_after_the_timeout_is_taken_out_of_the_window() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("a_lease_call_whose_reply_came_late") else { return };
    // The client reaches Redis through a relay that can hold Redis's replies back: the lease call runs at
    // once, and its reply comes after the caller gave up on it.
    let relay = Relay::start(redis.addr());
    // 900 calls per two hours, in buckets of an hour: a lease call asks for at most what the limit admits
    // until its bucket ends (a quarter more), 5/8 of the window, so the window keeps room for the lease call
    // whose reply is held, whatever the client leased before (with one bucket, a top-up whose reply came
    // before the hold could take the whole window, leaving that call nothing to grant, as it did under load).
    let rule = cluster_rule("api", 0.125, ClusterThresholdType::Global, 7_200_000, 2);
    // A timeout far above a loaded machine's delay between sending a call and Redis running it (a call run
    // after it would grant nothing, and this test would show nothing).
    let url = format!("redis://{}", relay.addr());
    let (engine, _client) =
        instance_beating(&url, "late-reply", rule, Duration::from_millis(1000), Duration::from_secs(60));
    let key = engine.cluster_status()[0].key.clone().unwrap();
    call_until(&engine, Duration::from_secs(5), |_, n| n >= 50);
    relay.hold_replies();
    // Calls drain the lease in hand and ask for more: Redis grants it, the reply is held, the caller gives up.
    call_until(&engine, Duration::from_secs(10), |s, _| s.mode == ClusterRuleMode::Fallback);
    let hung = engine.cluster_status()[0].clone();
    let known = hung.tokens_leased - hung.tokens_returned + hung.local_admissions_reported;
    let counted = window_total(&redis.url(), &key);
    assert!(counted > known, "Redis counts the grant whose reply is held: {counted} counted, {known} known: {hung}");
    relay.release_replies();
    // (Leasing resumes 2.2 s after the first probe Redis answers: retry_max and two call timeouts.)
    assert!(wait_until(&engine, Duration::from_secs(10), |s| s.mode == ClusterRuleMode::Leasing));
    // The reply came after the caller gave up (the client dropped it): the next call took the grant out.
    let (counted, known, st) = window_and_client_agree(&engine, &redis.url(), &key);
    assert_eq!(counted, known, "tokens counted in Redis that no caller was granted: {st}");
}

/// Waits (at most 3 s) until Redis counts in the rule's window what the client kept (tokens granted, less
/// those given back, plus what its fallback admitted); returns both counts and the last status.
fn window_and_client_agree(
    engine: &Sentinel,
    url: &str,
    key: &str,
) -> (u64, u64, sentinel_runtime::flow::ClusterRuleStatus) {
    let known = |s: &sentinel_runtime::flow::ClusterRuleStatus| {
        s.tokens_leased - s.tokens_returned + s.local_admissions_reported
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let (mut counted, mut st) = (0, engine.cluster_status()[0].clone());
    while Instant::now() < deadline {
        st = engine.cluster_status()[0].clone();
        counted = window_total(url, key);
        if counted == known(&st) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (counted, known(&st), st)
}

#[test]
fn after_a_hang_leasing_resumes_and_calls_get_tokens_without_waiting_out_the_timeout() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("after_a_hang_leasing_resumes") else { return };
    // 1000/s over 30 s (3 s buckets): far more room than the test uses. A hang longer than a bucket ends
    // the lease in force, so leasing must start again from nothing in the middle of a bucket.
    let rule = cluster_rule("api", 1000.0, ClusterThresholdType::Global, 30_000, 10);
    // A timeout far above a loaded machine's round trip: a call that waits it out shows a lease that never
    // came, not a slow machine.
    let timeout = Duration::from_millis(1000);
    let (engine, _client) = instance_with(&redis.url(), "resumes", rule, timeout);
    assert_eq!(call_until(&engine, Duration::from_secs(5), |_, n| n >= 200), 200);
    let leased_before_the_hang = engine.cluster_status()[0].tokens_leased;
    redis.pause();
    let hang_ends = Instant::now() + Duration::from_millis(3200);
    call_until(&engine, Duration::from_secs(10), |_, _| Instant::now() >= hang_ends);
    redis.resume();
    assert!(wait_until(&engine, Duration::from_secs(5), |s| s.mode == ClusterRuleMode::Leasing));
    let before = engine.cluster_status()[0].clone();
    let api = engine.resource("api");
    let passed = (0..500).filter(|_| api.enter().is_ok()).count();
    let st = engine.cluster_status()[0].clone();
    assert_eq!(passed, 500, "the window has room for every call: {st}");
    assert_eq!(st.wait_timeouts, before.wait_timeouts, "no call waited out the timeout for a lease: {st}");
    assert_eq!(st.fallback_decisions, before.fallback_decisions, "no call was decided locally: {st}");
    // (Leased after the hang: a lease ends with its bucket, shorter than the hang. The first may come before
    // the calls above, when a call asked for one just before the hang.)
    assert!(st.tokens_leased > leased_before_the_hang, "tokens came from Redis: {st}");
}

// ---------------------------------------------------------------------------------------------------------
// A fallback that never multiplies the limit: instances that never reached Redis

/// A Redis URL nothing answers on (a port bound and released at once).
fn unreachable_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("redis://127.0.0.1:{port}")
}

/// An engine on a manual clock with a global cluster rule of `count` per second on `api` (its cluster
/// config may name the expected instances), and a client for `url` started with `expected` instances.
fn cold_instance(
    url: &str,
    count: f64,
    rule_expected: Option<u32>,
    expected: Option<u32>,
) -> (Sentinel, sentinel_runtime::clock::ManualClock, ClusterClient) {
    let clock = sentinel_runtime::clock::ManualClock::at_millis(1_000_000);
    let engine = Sentinel::builder().app_name("cold").manual_clock(clock.clone()).build();
    let mut rule = cluster_rule("api", count, ClusterThresholdType::Global, 1000, 10);
    if let Some(c) = rule.cluster_config.as_mut() {
        c.expected_instances = rule_expected;
    }
    engine.load_flow_rules([rule]).unwrap();
    let mut builder = RedisCluster::builder(url).timeout(Duration::from_millis(20));
    if let Some(n) = expected {
        builder = builder.expected_instances(n);
    }
    let client = builder.start(&engine).unwrap();
    (engine, clock, client)
}

/// Calls `api` `calls` times at the engine's (manual) current time: the calls admitted.
fn admitted_now(engine: &Sentinel, calls: u32) -> u32 {
    let api = engine.resource("api");
    (0..calls).map(|_| api.enter().is_ok() as u32).sum()
}

#[test]
fn instances_that_never_reached_redis_admit_the_configured_total_between_them_not_the_count_each() {
    let url = unreachable_url();
    let a = cold_instance(&url, 100.0, None, Some(2));
    let b = cold_instance(&url, 100.0, None, Some(2));
    for (engine, _, _) in [&a, &b] {
        assert!(
            wait_until(engine, Duration::from_secs(10), |s| s.mode == ClusterRuleMode::Fallback),
            "{}",
            engine.cluster_status()[0]
        );
        let st = engine.cluster_status()[0].clone();
        assert_eq!(st.fallback_instances, Some(FallbackInstances::Configured(2)), "{st}");
        assert_eq!(st.local_limit, 50.0, "{st}");
    }
    // Three windows, each instance called far more than the limit: 100 between them per second, never 200.
    for second in 0..3 {
        let total = admitted_now(&a.0, 300) + admitted_now(&b.0, 300);
        assert_eq!(total, 100, "second {second}: the configured total, not the count per instance");
        a.1.advance(Duration::from_secs(1));
        b.1.advance(Duration::from_secs(1));
    }
    // Which count is in force is visible: diagnose and the metrics name it.
    let d = a.0.diagnose("api");
    assert!(
        d.flow.iter().any(|f| f.problems.iter().any(|p| p.contains("2 expected instances configured"))),
        "{:?}",
        d.flow
    );
    #[cfg(feature = "prometheus")]
    {
        let text = sentinel_runtime::exporter::render(&a.0);
        assert!(
            text.contains(
                "sentinel_cluster_fallback_instances{app=\"cold\",resource=\"api\",rule=\"0\",source=\"configured\"} 2"
            ),
            "{text}"
        );
    }
}

#[test]
fn with_no_instance_count_seen_or_configured_the_fallback_takes_a_conservative_share_and_says_so() {
    let url = unreachable_url();
    // The rule's own expected count wins over the client's.
    let (ruled, _, _c1) = cold_instance(&url, 90.0, Some(3), Some(2));
    let (bare, _, _c2) = cold_instance(&url, 100.0, None, None);
    for engine in [&ruled, &bare] {
        assert!(wait_until(engine, Duration::from_secs(10), |s| s.mode == ClusterRuleMode::Fallback));
    }
    let st = ruled.cluster_status()[0].clone();
    assert_eq!(st.fallback_instances, Some(FallbackInstances::Configured(3)), "{st}");
    assert_eq!(admitted_now(&ruled, 200), 30, "90 ÷ 3: {st}");
    let st = bare.cluster_status()[0].clone();
    assert_eq!(st.fallback_instances, Some(FallbackInstances::Assumed(ASSUMED_INSTANCES)), "{st}");
    assert_eq!(admitted_now(&bare, 200) as u64, 100 / ASSUMED_INSTANCES, "{st}");
    let d = bare.diagnose("api");
    assert!(
        d.flow.iter().any(|f| f.problems.iter().any(|p| p.contains("set `expected_instances`"))),
        "diagnose says how to fix it: {:?}",
        d.flow
    );
}

// ---------------------------------------------------------------------------------------------------------
// Give-backs that fail while Redis refuses the script

#[test]
fn tokens_given_back_while_the_script_fails_are_counted_once_when_redis_answers_again() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("tokens_given_back_while_the_script_fails") else { return };
    // 1000/s over 30 s (3 s buckets): the first lease is far larger than the few calls made, and it ends
    // (giving its unspent tokens back) at its bucket's end, within 3 s.
    let rule = cluster_rule("api", 1000.0, ClusterThresholdType::Global, 30_000, 10);
    let (engine, _client) = instance_with(&redis.url(), "give-back", rule, Duration::from_millis(200));
    let window = engine.cluster_status()[0].key.clone().unwrap();
    let members = format!("{}:m", window.strip_suffix(":w").unwrap());
    assert_eq!(call_until(&engine, Duration::from_secs(5), |_, n| n >= 20), 20);
    let leased = engine.cluster_status()[0].clone();
    assert!(leased.tokens_leased > 20, "a lease larger than what was spent: {leased}");
    // The membership key is overwritten: every script call fails (WRONGTYPE) before it touches the window,
    // while the window keeps what it counted.
    let mut conn =
        redis::Client::open(redis.url()).unwrap().get_connection_with_timeout(Duration::from_secs(2)).unwrap();
    redis::cmd("SET").arg(&members).arg("oops").query::<()>(&mut conn).unwrap();
    // The lease ends with its tokens unspent; calls that carry them fail (the client keeps probing).
    assert!(
        wait_until(&engine, Duration::from_secs(6), |s| s.mode == ClusterRuleMode::Fallback && s.tokens_returned > 0),
        "{}",
        engine.cluster_status()[0]
    );
    let given = engine.cluster_status()[0].clone();
    assert!(
        wait_until(&engine, Duration::from_secs(5), |s| s.failures >= given.failures + 2),
        "calls carrying the give-back failed: {}",
        engine.cluster_status()[0]
    );
    redis::cmd("DEL").arg(&members).query::<()>(&mut conn).unwrap();
    assert!(wait_until(&engine, Duration::from_secs(5), |s| s.mode == ClusterRuleMode::Leasing));
    // What Redis counts is what the client kept: granted, less what it gave back (once), plus what its
    // fallback admitted.
    let (counted, known, st) = window_and_client_agree(&engine, &redis.url(), &window);
    assert!(st.tokens_returned >= given.tokens_returned, "{st}");
    assert_eq!(counted, known, "Redis counts tokens the client gave back: {st}");
}

#[test]
fn a_rule_whose_count_changes_keeps_its_window_key() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("a_rule_whose_count_changes_keeps_its_window_key") else { return };
    let rule = cluster_rule("api", 10.0, ClusterThresholdType::Global, 60_000, 10);
    let (engine, _client) = instance_with(&redis.url(), "changed-rule-key", rule.clone(), Duration::from_millis(50));
    let key = engine.cluster_status()[0].key.clone().unwrap();
    // Redis hangs: the worker is parked until a lease is attached, and adopts it at once, while the rule set is
    // still being installed (the list in force still holds the old rule, with the same fingerprint).
    redis.pause();
    call_until(&engine, Duration::from_secs(10), |s, _| s.fallback_decisions >= 300);
    engine.load_flow_rules([FlowRule { count: 11.0, ..rule }]).unwrap();
    redis.resume();
    assert!(
        wait_until(&engine, Duration::from_secs(5), |s| s.rule.count == 11.0 && s.key.is_some()),
        "{}",
        engine.cluster_status()[0]
    );
    assert_eq!(engine.cluster_status()[0].key.as_deref(), Some(key.as_str()), "the same window");
}

#[test]
fn calls_a_changed_rule_admitted_locally_before_its_change_are_counted_when_redis_answers_again() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("calls_a_changed_rule_admitted_locally") else { return };
    // 10/s over a minute (6 s buckets): every call of the test is in one window; the rule's key keeps its window
    // when its count changes.
    let rule = cluster_rule("api", 10.0, ClusterThresholdType::Global, 60_000, 10);
    let (engine, _client) =
        instance_with(&redis.url(), "changed-rule-counted", rule.clone(), Duration::from_millis(50));
    let key = engine.cluster_status()[0].key.clone().unwrap();
    redis.pause();
    let local = call_until(&engine, Duration::from_secs(10), |s, _| s.fallback_decisions >= 300);
    assert!(local > 0, "the fallback admitted calls: {}", engine.cluster_status()[0]);
    // While Redis hangs, the rule changes (its count): a new lease for the same window.
    engine.load_flow_rules([FlowRule { count: 11.0, ..rule }]).unwrap();
    redis.resume();
    // A new lease reads as leasing before the worker adopts it: its key says it was.
    let leasing = |s: &sentinel_runtime::flow::ClusterRuleStatus| {
        s.mode == ClusterRuleMode::Leasing && s.rule.count == 11.0 && s.key.is_some() && s.round_trips > 0
    };
    assert!(
        wait_until(&engine, Duration::from_secs(5), leasing),
        "cluster mode resumes: {}",
        engine.cluster_status()[0]
    );
    assert_eq!(engine.cluster_status()[0].key.as_deref(), Some(key.as_str()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while window_total(&redis.url(), &key) < local && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(window_total(&redis.url(), &key) >= local, "Redis counts the {local} calls admitted before the change");
}

// ---------------------------------------------------------------------------------------------------------
// Java's token-server semantics (review)

/// A cluster rule on `resource` of 10 calls per hour (one bucket) under `flow_id`, global, without local
/// fallback: a call the shared limit did not decide passes, so every call over the limit that passes shows.
fn hourly_rule(resource: &str, flow_id: Option<u64>) -> FlowRule {
    FlowRule {
        cluster_mode: true,
        cluster_config: Some(ClusterConfig {
            flow_id,
            threshold_type: ClusterThresholdType::Global,
            fallback_to_local_when_fail: false,
            sample_count: 1,
            window_interval_ms: 3_600_000,
            ..ClusterConfig::default()
        }),
        ..FlowRule::new(resource).count(10.0 / 3600.0)
    }
}

/// An engine with `rules` and its client, every rule keyed in Redis.
fn instance_of(url: &str, ns: &str, rules: Vec<FlowRule>, timeout: Duration) -> (Sentinel, ClusterClient) {
    let engine = Sentinel::builder().app_name("review").build();
    let n = rules.len();
    engine.load_flow_rules(rules).unwrap();
    let client = RedisCluster::builder(url).namespace(ns).timeout(timeout).start(&engine).unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let st = engine.cluster_status();
        if st.len() == n && st.iter().all(|s| s.key.is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (engine, client)
}

#[test]
fn two_rules_with_one_flow_id_share_one_limit_as_on_java_s_token_server() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("two_rules_with_one_flow_id") else { return };
    // Java's token server keeps one counter per flowId: two rules that name flowId 7 (here on two resources of
    // one instance) draw on one limit of 10 per window between them.
    let rules = vec![hourly_rule("a", Some(7)), hourly_rule("b", Some(7))];
    let (engine, _client) = instance_of(&redis.url(), "same-flow-id", rules, Duration::from_millis(300));
    let (a, b) = (engine.resource("a"), engine.resource("b"));
    let mut admitted = [0u32; 2];
    for i in 0..40 {
        let (r, k) = if i % 2 == 0 { (&a, 0) } else { (&b, 1) };
        if r.enter().is_ok() {
            admitted[k] += 1;
        }
    }
    let st: Vec<String> = engine.cluster_status().iter().map(|s| s.to_string()).collect();
    assert_eq!(admitted[0] + admitted[1], 10, "{admitted:?}: {st:#?}");
    assert!(engine.cluster_status().iter().all(|s| s.fallback_decisions == 0), "{st:#?}");
}

#[test]
fn a_call_acquiring_more_than_the_window_admits_is_blocked_not_passed_after_the_timeout() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("a_call_acquiring_more_than_the_window") else { return };
    // Java's token server: `threshold - qps - acquire < 0` is BLOCKED, whatever the acquire count.
    let (engine, _client) =
        instance_of(&redis.url(), "acquire-over", vec![hourly_rule("api", None)], Duration::from_millis(300));
    let api = engine.resource("api");
    let over = api.entry().acquire(11).enter();
    let st = engine.cluster_status()[0].clone();
    assert!(over.is_err(), "11 tokens of a window of 10 passed: {st}");
    drop(over);
    // 8 of the 10 spent: a call for 3 is blocked too (2 left), one for 2 passes.
    assert!(api.entry().acquire(8).enter().is_ok(), "{}", engine.cluster_status()[0]);
    let three = api.entry().acquire(3).enter();
    assert!(three.is_err(), "3 tokens with 2 left passed: {}", engine.cluster_status()[0]);
    drop(three);
    assert!(api.entry().acquire(2).enter().is_ok(), "{}", engine.cluster_status()[0]);
    assert!(api.enter().is_err(), "{}", engine.cluster_status()[0]);
}

#[test]
fn a_cluster_rule_of_count_zero_blocks_every_call_of_either_threshold_type() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("a_cluster_rule_of_count_zero") else { return };
    // Java's token server: a threshold of 0 leaves `0 - qps - acquire < 0`: BLOCKED.
    for (i, global) in [true, false].into_iter().enumerate() {
        let mut rule = hourly_rule("api", None);
        rule.count = 0.0;
        if let Some(c) = rule.cluster_config.as_mut() {
            c.threshold_type = if global { ClusterThresholdType::Global } else { ClusterThresholdType::AvgLocal };
        }
        let (engine, _client) =
            instance_of(&redis.url(), &format!("count-zero-{i}"), vec![rule], Duration::from_millis(300));
        let api = engine.resource("api");
        for _ in 0..3 {
            let r = api.enter();
            assert!(r.is_err(), "global {global}: a call passed a limit of 0: {}", engine.cluster_status()[0]);
        }
        let zero = api.entry().acquire(0).enter();
        assert!(zero.is_ok(), "acquire 0 passes (0 - 0 - 0 >= 0)");
    }
}

#[test]
fn average_local_lets_one_busy_instance_take_count_times_the_connected_instances() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("average_local_lets_one_busy_instance") else { return };
    // Java's token server: threshold = count × connected clients, shared by whoever asks (one busy client
    // may take all of it).
    let avg = || {
        let mut rule = hourly_rule("api", Some(9));
        if let Some(c) = rule.cluster_config.as_mut() {
            c.threshold_type = ClusterThresholdType::AvgLocal;
        }
        rule
    };
    let (a, _ca) = instance_of(&redis.url(), "avg-busy", vec![avg()], Duration::from_millis(300));
    let (b, _cb) = instance_of(&redis.url(), "avg-busy", vec![avg()], Duration::from_millis(300));
    let both = |e: &Sentinel| e.cluster_status()[0].live_instances == Some(2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(both(&a) && both(&b)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(both(&a) && both(&b), "{} / {}", a.cluster_status()[0], b.cluster_status()[0]);
    let api = a.resource("api");
    let admitted = (0..30).filter(|_| api.enter().is_ok()).count();
    assert_eq!(admitted, 20, "{}", a.cluster_status()[0]);
    let api_b = b.resource("api");
    let admitted_b = (0..5).filter(|_| api_b.enter().is_ok()).count();
    assert_eq!(admitted_b, 0, "{}", b.cluster_status()[0]);
}

#[test]
fn a_prioritized_call_decided_by_the_local_fallback_borrows_the_next_window_as_without_a_client() {
    // Java decides every failure kind (no client started, the token server failing or unreachable) by
    // `fallbackToLocalOrPass`: the rule's local check with the call's priority, so a prioritized QPS call over
    // the local limit borrows the next window (DefaultController's occupy) and passes after the wait.
    let prioritized_borrows = |engine: &Sentinel, clock: &sentinel_runtime::clock::ManualClock, what: &str| {
        let p = engine.resource("api");
        clock.advance_millis(100);
        assert_eq!(admitted_now(engine, 2), 2, "{what}");
        clock.advance_millis(500);
        assert!(p.enter().is_err(), "{what}: a normal call is blocked");
        let e = p.entry().prioritized(true).enter();
        let st = engine.cluster_status().first().map(|s| s.to_string()).unwrap_or_default();
        let e = e.unwrap_or_else(|err| panic!("{what}: a prioritized call was blocked: {err}; {st}"));
        assert!(e.is_occupied(), "{what}");
        assert_eq!(e.waited(), Duration::from_millis(400), "{what}");
    };
    // No client started: the rule's own local check.
    let clock = sentinel_runtime::clock::ManualClock::at_millis(1_000_000);
    let engine = Sentinel::builder().app_name("cold").manual_clock(clock.clone()).build();
    engine.load_flow_rules([cluster_rule("api", 2.0, ClusterThresholdType::AvgLocal, 1000, 10)]).unwrap();
    prioritized_borrows(&engine, &clock, "no client");
    // A client that cannot reach Redis: the fallback, with a local limit of the whole count (average local).
    let url = unreachable_url();
    let clock = sentinel_runtime::clock::ManualClock::at_millis(1_000_000);
    let engine = Sentinel::builder().app_name("cold").manual_clock(clock.clone()).build();
    engine.load_flow_rules([cluster_rule("api", 2.0, ClusterThresholdType::AvgLocal, 1000, 10)]).unwrap();
    let _client = RedisCluster::builder(&url).timeout(Duration::from_millis(20)).start(&engine).unwrap();
    assert!(wait_until(&engine, Duration::from_secs(10), |s| s.mode == ClusterRuleMode::Fallback));
    assert_eq!(engine.cluster_status()[0].local_limit, 2.0);
    prioritized_borrows(&engine, &clock, "redis unreachable");
    // A client that stopped (dropped): the whole count locally, as with none.
    let clock = sentinel_runtime::clock::ManualClock::at_millis(1_000_000);
    let engine = Sentinel::builder().app_name("cold").manual_clock(clock.clone()).build();
    engine.load_flow_rules([cluster_rule("api", 2.0, ClusterThresholdType::Global, 1000, 10)]).unwrap();
    let client = RedisCluster::builder(&url).timeout(Duration::from_millis(20)).start(&engine).unwrap();
    assert!(wait_until(&engine, Duration::from_secs(10), |s| s.mode == ClusterRuleMode::Fallback));
    drop(client);
    assert!(wait_until(&engine, Duration::from_secs(10), |s| s.mode != ClusterRuleMode::Fallback));
    prioritized_borrows(&engine, &clock, "client stopped");
}

#[test]
fn a_call_acquiring_most_of_the_window_is_decided_by_the_shared_window_not_the_fallback() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("a_call_acquiring_most_of_the_window") else { return };
    // Java's token server decides `acquireCount` against the window in one request: 900,000 of 1,000,000 pass (however many tokens a
    // lease of ours holds at first: Redis cannot run the calls of a token at a time within the timeout).
    let mut rule = hourly_rule("api", None);
    rule.count = 1_000_000.0 / 3600.0;
    if let Some(c) = rule.cluster_config.as_mut() {
        // Decided locally, the call would meet a limit of 1,000,000 per hour (278 per second): blocked.
        c.fallback_to_local_when_fail = true;
    }
    let (engine, _client) = instance_of(&redis.url(), "acquire-most", vec![rule], Duration::from_millis(100));
    let api = engine.resource("api");
    let big = api.entry().acquire(900_000).enter();
    let st = engine.cluster_status()[0].clone();
    assert!(big.is_ok(), "900,000 of a window of 1,000,000 blocked: {st}");
    assert_eq!(st.fallback_decisions, 0, "{st}");
    drop(big);
    assert!(api.entry().acquire(100_001).enter().is_err(), "{}", engine.cluster_status()[0]);
    assert!(api.entry().acquire(100_000).enter().is_ok(), "{}", engine.cluster_status()[0]);
}

#[test]
fn removing_one_of_two_rules_with_one_flow_id_keeps_the_window_the_other_counts_in() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("removing_one_of_two_rules_with_one_flow_id") else { return };
    // Java's token server keeps flowId 7's counter while a rule names it.
    let rules = vec![hourly_rule("a", Some(7)), hourly_rule("b", Some(7))];
    let (engine, _client) = instance_of(&redis.url(), "same-flow-id-removed", rules, Duration::from_millis(300));
    let (a, b) = (engine.resource("a"), engine.resource("b"));
    // Enough calls on each rule to spend whatever its lease took of the window: how the 10 tokens split
    // between the two leases depends on when each asked (a lease call that measured a rate takes all the
    // window has left, and the other rule's calls are blocked on the used-up window while this one holds
    // tokens), so 12 calls could find 4 of them in the lease of the rule they did not call (6 admitted, as
    // in a loaded CI run).
    let admitted = (0..40).filter(|i| if i % 2 == 0 { a.enter().is_ok() } else { b.enter().is_ok() }).count();
    assert_eq!(admitted, 10, "{:?}", engine.cluster_status());
    engine.load_flow_rules([hourly_rule("a", Some(7))]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine.cluster_status().first().is_none_or(|s| s.key.is_none()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    let more = (0..5).filter(|_| a.enter().is_ok()).count();
    assert_eq!(more, 0, "{}", engine.cluster_status()[0]);
    assert_eq!(engine.cluster_status()[0].live_instances, Some(1), "{}", engine.cluster_status()[0]);
}

#[test]
fn tokens_an_idle_instance_leased_do_not_keep_a_busy_one_under_the_global_count() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("tokens_an_idle_instance_leased") else { return };
    // Java's token server admits whoever asks while the window has room: with one call from A, B's calls
    // pass until the window of 100 holds 100.
    let rule = || {
        let mut rule = hourly_rule("api", Some(11));
        rule.count = 100.0 / 3600.0;
        rule
    };
    let beat = Duration::from_millis(100);
    let (a, _ca) = instance_beating(&redis.url(), "idle-lease", rule(), Duration::from_millis(300), beat);
    let (b, _cb) = instance_beating(&redis.url(), "idle-lease", rule(), Duration::from_millis(300), beat);
    let both = |e: &Sentinel| e.cluster_status()[0].live_instances == Some(2);
    assert!(wait_until(&a, Duration::from_secs(5), |_| both(&a) && both(&b)));
    assert!(a.resource("api").enter().is_ok());
    // A goes idle; B keeps calling (a caller retrying every millisecond) for up to five seconds.
    let admitted = call_until(&b, Duration::from_secs(5), |_, n| n >= 99);
    assert_eq!(admitted, 99, "A: {}; B: {}", a.cluster_status()[0], b.cluster_status()[0]);
}

#[test]
fn two_rules_with_one_flow_id_each_give_back_what_they_leave_unspent() {
    let _serial = one_at_a_time();
    let Some(redis) = RedisServer::start("two_rules_with_one_flow_id_give_back") else { return };
    // Two rules of one instance name flowId 7: one window in Redis, one member, two leases. Each gives back
    // the tokens it left unspent for a renewal interval; the window must count only what was spent, whichever
    // rule gave back first.
    let engine = Sentinel::builder().app_name("review").build();
    engine.load_flow_rules([hourly_rule("a", Some(7)), hourly_rule("b", Some(7))]).unwrap();
    let beat = Duration::from_millis(100);
    let client = RedisCluster::builder(redis.url())
        .namespace("same-flow-id-give-back")
        .timeout(Duration::from_millis(1000))
        .heartbeat_interval(beat)
        .member_ttl(beat * 7 + Duration::from_millis(100))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    let status = |resource: &str| {
        engine
            .cluster_status()
            .into_iter()
            .find(|s| s.rule.resource == resource)
            .expect("a cluster rule on the resource")
    };
    let key = |resource: &str| status(resource).key;
    let deadline = Instant::now() + Duration::from_secs(5);
    while (key("a").is_none() || key("b").is_none()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let key = key("a").expect("the rule's key");
    // One call on `b`, then on `a`, then on `b` again, each waiting until its rule gave back what it left.
    let mut spent = 0;
    for resource in ["b", "a", "b"] {
        let returned = status(resource).tokens_returned;
        assert!(engine.resource(resource).enter().is_ok(), "{}", status(resource));
        spent += 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        while status(resource).tokens_returned == returned && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let st = status(resource);
        assert!(st.tokens_returned > returned, "{resource} gave its unspent tokens back: {st}");
    }
    // Redis counts what was spent once the give-backs are applied (each rule renews every 100 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut counted = window_total(&redis.url(), &key);
    while counted != spent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        counted = window_total(&redis.url(), &key);
    }
    assert_eq!(counted, spent, "the window counts the 3 calls admitted: {} / {}", status("a"), status("b"));
}
