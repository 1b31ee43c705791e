//! Cluster flow control on Redis as teams run it: a real three-master Redis Cluster and a real Redis
//! Sentinel setup (a master, a replica, three sentinels), started per test on free ports.
//!
//! - Cluster: rules whose hash tags land on different shards stay exact whichever seed node a worker is
//!   given first; a shard's master killed makes only its rules fall back, and they lease again once it
//!   returns; a standalone client pointed at the wrong node says what to do.
//! - Sentinel: the master SIGKILLed, the sentinels promote the replica, cluster mode resumes on the new
//!   master; the admitted total per window stays within the documented bound.
//! - The Redis data source on a cluster and through Sentinel: a change is in force within a second.
//!
//! The multi-process tests re-execute this test binary in a worker mode (`topology_worker`, an ignored
//! test that runs only when the parent asks for it through `SENTINEL_TOPOLOGY_WORKER`).
#![cfg(feature = "cluster-redis")]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sentinel_runtime::cluster::{RedisCluster, RedisDataSource};
use sentinel_runtime::flow::{ClusterConfig, ClusterRuleMode, ClusterThresholdType, FlowRule};
use sentinel_runtime::{RuleKind, Sentinel};
use sentinel_testkit::logs::{Logged, OnEvent};
use sentinel_testkit::redis_cluster::{RedisClusterServers, RedisSentinelServers, MASTER_NAME};

#[path = "support/cluster_workers.rs"]
mod cluster_workers;
use cluster_workers::{
    env, env_u64, format_windows, hammer, one_at_a_time, parse_list, parse_windows, result_lines, sleep_until,
    spawn_worker, wall_ms,
};

const WORKER_ENV: &str = "SENTINEL_TOPOLOGY_WORKER";

/// A global cluster rule on `api-<flow_id>` with that `flowId` (its keys: `sentinel:{ns:flow:<id>}:*`).
fn global_rule(flow_id: u64, count: f64, window_ms: u64) -> FlowRule {
    FlowRule {
        cluster_mode: true,
        cluster_config: Some(ClusterConfig {
            flow_id: Some(flow_id),
            threshold_type: ClusterThresholdType::Global,
            sample_count: 2,
            window_interval_ms: window_ms,
            ..ClusterConfig::default()
        }),
        ..FlowRule::new(format!("api-{flow_id}")).count(count)
    }
}

fn window_key(ns: &str, flow_id: u64) -> String {
    format!("sentinel:{{{ns}:flow:{flow_id}}}:w")
}

/// `n` flow ids whose windows sit on `n` different nodes of `cluster`.
fn ids_on_distinct_shards(cluster: &RedisClusterServers, ns: &str, n: usize) -> Vec<(u64, usize)> {
    let mut picked: Vec<(u64, usize)> = Vec::new();
    for id in 1..200u64 {
        let owner = cluster.owner_of(&window_key(ns, id)).expect("every slot has an owner");
        if !picked.iter().any(|(_, o)| *o == owner) {
            picked.push((id, owner));
        }
        if picked.len() == n {
            return picked;
        }
    }
    panic!("no {n} flow ids on distinct shards: {picked:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Worker processes

/// What a worker does, passed in its environment.
struct Plan {
    /// `cluster` or `sentinel`.
    mode: &'static str,
    namespace: String,
    ids: Vec<u64>,
    count: f64,
    window_ms: u64,
    start_at: u64,
    end_at: u64,
}

impl Plan {
    fn spawn(&self, name: &str, addrs: &[String]) -> Child {
        let ids: Vec<String> = self.ids.iter().map(u64::to_string).collect();
        let vars = [
            ("T_MODE", self.mode.to_string()),
            ("T_ADDRS", addrs.join(",")),
            ("T_NS", self.namespace.clone()),
            ("T_IDS", ids.join(",")),
            ("T_COUNT", self.count.to_string()),
            ("T_WINDOW", self.window_ms.to_string()),
            ("T_START", self.start_at.to_string()),
            ("T_END", self.end_at.to_string()),
        ];
        spawn_worker("topology_worker", WORKER_ENV, name, &vars)
    }

    /// Starts one worker per address order in `orders`.
    fn spawn_all(&self, orders: &[Vec<String>]) -> Vec<Child> {
        orders.iter().enumerate().map(|(i, a)| self.spawn(&format!("{}-{i}", self.mode), a)).collect()
    }
}

/// The worker mode: one thread per rule hammers it from `T_START` to `T_END` (wall ms); a sampler notes
/// the windows in which a rule's fallback decided calls. Prints one line per rule: the calls admitted per
/// window (by wall-clock window, which on one machine is Redis's clock too), the windows with fallback
/// decisions, and the rule's mode at the end.
#[test]
#[ignore = "a worker process of the multi-process tests, started by them"]
fn topology_worker() {
    let Ok(name) = std::env::var(WORKER_ENV) else {
        return;
    };
    let addrs: Vec<String> = env("T_ADDRS").split(',').map(str::to_string).collect();
    let ids: Vec<u64> = env("T_IDS").split(',').map(|v| v.parse().expect("T_IDS")).collect();
    let count: f64 = env("T_COUNT").parse().expect("T_COUNT");
    let (window_ms, start_at, end_at) = (env_u64("T_WINDOW"), env_u64("T_START"), env_u64("T_END"));
    let engine = Sentinel::builder().app_name("topology-test").build();
    engine.load_flow_rules(ids.iter().map(|id| global_rule(*id, count, window_ms))).unwrap();
    let builder = match env("T_MODE").as_str() {
        "cluster" => RedisCluster::cluster_builder(addrs),
        _ => RedisCluster::sentinel_builder(addrs, MASTER_NAME),
    };
    let client = builder
        .namespace(env("T_NS"))
        .instance_id(&name)
        .timeout(Duration::from_millis(300))
        .member_ttl(Duration::from_millis(2000))
        .heartbeat_interval(Duration::from_millis(500))
        .retry_max(Duration::from_millis(500))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(10)).unwrap();
    sleep_until(start_at);
    let sampler = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let mut fallback: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            // Windows in which this process was frozen for a fifth of a window or more (an oversubscribed
            // machine deschedules it): calls time out then, whatever the deployment does.
            let mut stalls: BTreeSet<u64> = BTreeSet::new();
            let mut before = wall_ms();
            while wall_ms() < end_at {
                let now = wall_ms();
                if now - before >= window_ms / 5 {
                    stalls.extend(before / window_ms..=now / window_ms);
                }
                before = now;
                let w = now / window_ms;
                for st in engine.cluster_status() {
                    let before = last.insert(st.rule.resource.clone(), st.fallback_decisions).unwrap_or(0);
                    if st.fallback_decisions > before {
                        fallback.entry(st.rule.resource.clone()).or_default().insert(w);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (fallback, stalls)
        })
    };
    let hammers: Vec<_> = ids
        .iter()
        .map(|id| {
            let resource = engine.resource(&format!("api-{id}"));
            // Over the limit: try again soon, without starving Redis of the CPU.
            std::thread::spawn(move || hammer(end_at, window_ms, Duration::from_micros(50), || resource.enter()))
        })
        .collect();
    let results: Vec<cluster_workers::Admitted> = hammers.into_iter().map(|h| h.join().unwrap()).collect();
    let (fallback, stalls) = sampler.join().unwrap();
    let stalls: Vec<String> = stalls.iter().map(u64::to_string).collect();
    let status = engine.cluster_status();
    for (id, admitted) in ids.iter().zip(results) {
        let resource = format!("api-{id}");
        let st = status.iter().find(|s| s.rule.resource == resource).expect("the rule's status");
        let f: Vec<String> =
            fallback.get(&resource).map(|s| s.iter().map(u64::to_string).collect()).unwrap_or_default();
        println!(
            "\nTOPOLOGY_RESULT id={id} ambiguous={} leasing={} fallbacks={} fallback_windows={} stalls={} \
             windows={}",
            admitted.ambiguous,
            st.mode == ClusterRuleMode::Leasing,
            st.fallback_decisions,
            f.join(","),
            stalls.join(","),
            format_windows(&admitted.per_window)
        );
    }
    drop(client);
}

/// One rule's report from one worker.
#[derive(Debug, Default, Clone)]
struct RuleReport {
    windows: BTreeMap<u64, u64>,
    ambiguous: u64,
    leasing: bool,
    fallbacks: u64,
    fallback_windows: BTreeSet<u64>,
    stalls: BTreeSet<u64>,
}

/// A worker's reports, by flow id.
fn reports_of(child: Child) -> BTreeMap<u64, RuleReport> {
    let out = child.wait_with_output().expect("a worker's output");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut reports = BTreeMap::new();
    for (_, fields) in result_lines(&text, "TOPOLOGY_RESULT ") {
        let mut id = 0;
        let mut r = RuleReport::default();
        for field in fields {
            match field {
                ("id", v) => id = v.parse().unwrap(),
                ("ambiguous", v) => r.ambiguous = v.parse().unwrap(),
                ("leasing", v) => r.leasing = v == "true",
                ("fallbacks", v) => r.fallbacks = v.parse().unwrap(),
                ("fallback_windows", v) => r.fallback_windows = parse_list(v),
                ("stalls", v) => r.stalls = parse_list(v),
                ("windows", v) => r.windows = parse_windows(v),
                _ => {}
            }
        }
        reports.insert(id, r);
    }
    assert!(!reports.is_empty(), "a worker printed no result (status {}):\n{text}", out.status);
    reports
}

/// Per flow id: the workers' reports.
fn collect(children: Vec<Child>) -> BTreeMap<u64, Vec<RuleReport>> {
    let mut by_id: BTreeMap<u64, Vec<RuleReport>> = BTreeMap::new();
    for child in children {
        for (id, r) in reports_of(child) {
            by_id.entry(id).or_default().push(r);
        }
    }
    by_id
}

/// The windows in which any instance of a rule fell back.
fn fallback_windows(reports: &[RuleReport]) -> BTreeSet<u64> {
    reports.iter().flat_map(|r| r.fallback_windows.iter().copied()).collect()
}

/// Whether a fallback in window `w` is explained by a worker frozen in it or in the three windows before
/// (its calls timed out; leasing resumes a breaker pause and a probation later).
fn stalled_near(reports: &[RuleReport], w: u64) -> bool {
    reports.iter().any(|r| (w.saturating_sub(3)..=w).any(|s| r.stalls.contains(&s)))
}

/// Checks one rule's admitted totals: at most `per_window` in a window where no instance fell back (in it
/// or the window before), at most `bound` elsewhere.
fn check_windows(id: u64, measured: &[(u64, u64)], fell: &BTreeSet<u64>, per_window: u64, bound: u64) {
    for (w, n) in measured {
        let limit = if fell.contains(w) || fell.contains(&(w - 1)) { bound } else { per_window };
        assert!(*n <= limit, "rule {id}: window {w} admitted {n} > {limit}: {measured:?}; fallback in {fell:?}");
    }
}

/// The first window from `from` on that starts two windows in which no instance fell back.
fn resumed_from(fell: &BTreeSet<u64>, from: u64) -> Option<u64> {
    (from..from + 1000).find(|w| !fell.contains(w) && !fell.contains(&(w + 1)))
}

/// The admitted total per window across workers, over `windows`.
fn totals(reports: &[RuleReport], windows: std::ops::Range<u64>) -> Vec<(u64, u64)> {
    windows.map(|w| (w, reports.iter().map(|r| r.windows.get(&w).copied().unwrap_or(0)).sum())).collect()
}

// ---------------------------------------------------------------------------------------------------------
// Redis Cluster

/// Workers on a cluster hammering the rules `picked` (flow id, node).
fn cluster_plan(ns: &str, picked: &[(u64, usize)], count: f64, window_ms: u64, start_at: u64, end_at: u64) -> Plan {
    let ids = picked.iter().map(|(id, _)| *id).collect();
    Plan { mode: "cluster", namespace: ns.into(), ids, count, window_ms, start_at, end_at }
}

/// The cluster's seed nodes in three orders, each with another node first.
fn seed_orders(cluster: &RedisClusterServers) -> Vec<Vec<String>> {
    let urls = cluster.urls();
    (0..3).map(|i| urls.iter().cycle().skip(i).take(3).cloned().collect()).collect()
}

#[test]
fn rules_on_different_shards_stay_exact_whichever_seed_node_comes_first() {
    let _serial = one_at_a_time();
    let Some(cluster) = RedisClusterServers::start("rules_on_different_shards_stay_exact") else { return };
    let ns = "exact";
    let picked = ids_on_distinct_shards(&cluster, ns, 3);
    let (count, window_ms, windows) = (1000.0, 500u64, 8u64);
    let per_window = (count * window_ms as f64 / 1000.0) as u64;
    let start_at = (wall_ms() / window_ms + 6) * window_ms;
    let end_at = start_at + (windows + 2) * window_ms;
    let plan = cluster_plan(ns, &picked, count, window_ms, start_at, end_at);
    // Each worker is given another node first (none of them owns every rule's slot).
    let orders = seed_orders(&cluster);
    let by_id = collect(plan.spawn_all(&orders[..2]));
    assert_eq!(by_id.len(), 3, "{by_id:?}");
    for (id, reports) in &by_id {
        let measured = totals(reports, start_at / window_ms + 1..end_at / window_ms - 1);
        eprintln!(
            "rule {id} (shard {:?}): admitted per window of {window_ms} ms (limit {per_window}): {measured:?}",
            picked.iter().find(|(i, _)| i == id).map(|(_, o)| o)
        );
        // No call fell back, whichever seed came first (but where the machine froze a worker).
        let fell = fallback_windows(reports);
        assert!(
            fell.iter().all(|w| stalled_near(reports, *w)),
            "rule {id}: calls fell back with every node up: {reports:?}"
        );
        check_windows(*id, &measured, &fell, per_window, per_window + count as u64);
        // Judged from the first window the rule admitted in: workers a loaded machine started late leave the
        // windows before it empty, which says nothing of the rule (one running worker can fill a window).
        let live: Vec<u64> = measured.iter().map(|(_, n)| *n).skip_while(|n| *n == 0).collect();
        let admitted: u64 = live.iter().sum();
        let ambiguous: u64 = reports.iter().map(|r| r.ambiguous).sum();
        assert!(live.len() as u64 >= windows / 2, "rule {id}: admitted in too few windows: {measured:?}");
        assert!(
            admitted + ambiguous >= per_window * live.len() as u64 * 3 / 4,
            "rule {id}: {admitted} admitted over {} windows of {per_window}: {measured:?}",
            live.len()
        );
    }
    // The third order too: any seed first serves.
    let engine = Sentinel::builder().app_name("topology-test").build();
    engine.load_flow_rules(plan.ids.iter().map(|id| global_rule(*id, count, window_ms))).unwrap();
    let client = RedisCluster::cluster_builder(orders[2].clone())
        .namespace(ns)
        .timeout(Duration::from_millis(300))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && engine.cluster_status().iter().any(|s| s.tokens_leased == 0) {
        for id in &plan.ids {
            let _ = engine.resource(&format!("api-{id}")).enter();
        }
    }
    for s in engine.cluster_status() {
        assert!(
            s.tokens_leased > 0 && s.failures == 0 && s.mode == ClusterRuleMode::Leasing,
            "third seed order: {s:?}"
        );
    }
}

#[test]
fn a_shard_down_makes_only_its_rules_fall_back_until_it_returns() {
    let _serial = one_at_a_time();
    let Some(mut cluster) = RedisClusterServers::start("a_shard_down_makes_only_its_rules_fall_back") else {
        return;
    };
    let ns = "shard-down";
    let picked = ids_on_distinct_shards(&cluster, ns, 3);
    let (count, window_ms) = (1000.0, 500u64);
    let per_window = (count * window_ms as f64 / 1000.0) as u64;
    let start_at = (wall_ms() / window_ms + 6) * window_ms;
    let killed_at = start_at + 4 * window_ms;
    let back_at = killed_at + 8 * window_ms;
    let end_at = back_at + 14 * window_ms;
    let plan = cluster_plan(ns, &picked, count, window_ms, start_at, end_at);
    let children = plan.spawn_all(&seed_orders(&cluster)[..2]);
    // The shard of the first rule loses its only master, then gets it back (same id and slots, no data).
    let (down_id, down_node) = picked[0];
    sleep_until(killed_at);
    cluster.kill(down_node);
    sleep_until(back_at);
    assert!(cluster.restart(down_node), "the node rejoined the cluster");
    let by_id = collect(children);
    let first = start_at / window_ms + 1;
    let last = end_at / window_ms - 1;
    // In fallback each instance admits its share (count ÷ 2 live instances per second, so within one window
    // of half a second it may admit all of it): the documented bound is the window's limit plus what the
    // instances admit locally.
    let bound = per_window + count as u64;
    for (id, reports) in &by_id {
        let measured = totals(reports, first..last);
        let fell = fallback_windows(reports);
        eprintln!("rule {id}: per window (limit {per_window}) {measured:?}; fallback in windows {fell:?}");
        check_windows(*id, &measured, &fell, per_window, bound);
        if *id == down_id {
            let outage = killed_at / window_ms..back_at / window_ms;
            assert!(outage.clone().any(|w| fell.contains(&w)), "the rule of the shard that went down fell back");
            let resumed = resumed_from(&fell, back_at / window_ms).expect("leasing again once the shard returned");
            assert!(
                resumed * window_ms <= back_at + 8_000,
                "cluster mode resumed within seconds of the shard's return: at window {resumed}, back at {back_at}"
            );
        } else {
            // Where the machine froze a worker its calls time out, whatever the shard does.
            assert!(
                fell.iter().all(|w| stalled_near(reports, *w)),
                "rule {id}, on a shard that stayed up, fell back: {reports:?}"
            );
        }
    }
}

#[test]
fn a_hung_shard_master_is_left_for_the_replica_the_cluster_promotes() {
    let _serial = one_at_a_time();
    let Some(cluster) = RedisClusterServers::start_with_replicas("a_hung_shard_master", 1) else { return };
    let ns = "hung-shard";
    let id = (1..200u64).find(|id| cluster.owner_of(&window_key(ns, *id)) == Some(0)).expect("a flow id on node 0");
    assert!(cluster.is_master(0), "node 0 is a master");
    let engine = Sentinel::builder().app_name("topology-test").build();
    engine.load_flow_rules([global_rule(id, 1000.0, 1000)]).unwrap();
    let client = RedisCluster::cluster_builder(cluster.urls())
        .namespace(ns)
        .timeout(Duration::from_millis(50))
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    assert!(wait_mode(&engine, id, ClusterRuleMode::Leasing, Duration::from_secs(5)), "leasing at start");
    // Node 0 hangs (its connections stay open, nothing answers): the cluster promotes its replica.
    cluster.pause(0);
    assert!(wait_mode(&engine, id, ClusterRuleMode::Fallback, Duration::from_secs(5)), "falls back while it hangs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && !(3..6).any(|i| cluster.is_master(i)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!((3..6).any(|i| cluster.is_master(i)), "the cluster promoted node 0's replica");
    assert!(
        wait_mode(&engine, id, ClusterRuleMode::Leasing, Duration::from_secs(10)),
        "leasing again on the promoted replica: {:?}",
        engine.cluster_status()
    );
    drop(client);
}

#[test]
fn a_standalone_client_on_the_wrong_cluster_node_says_to_give_the_seed_nodes() {
    let _serial = one_at_a_time();
    let Some(cluster) = RedisClusterServers::start("a_standalone_client_on_the_wrong_cluster_node") else { return };
    let ns = "wrong-node";
    let (id, owner) = ids_on_distinct_shards(&cluster, ns, 1)[0];
    let wrong = cluster.urls()[(owner + 1) % 3].clone();
    let _ = tracing::subscriber::set_global_default(OnEvent(|e: Logged| {
        if e.level == tracing::Level::WARN {
            WARNINGS.lock().unwrap().push(e.fields);
        }
    }));
    let engine = Sentinel::builder().app_name("topology-test").build();
    engine.load_flow_rules([global_rule(id, 100.0, 1000)]).unwrap();
    let _client =
        RedisCluster::builder(wrong).namespace(ns).timeout(Duration::from_millis(300)).start(&engine).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut reason = None;
    while Instant::now() < deadline && !reason.as_deref().is_some_and(|r: &str| r.contains("does not own")) {
        let _ = engine.resource(&format!("api-{id}")).enter();
        reason = engine.cluster_status()[0].reason.clone();
        std::thread::sleep(Duration::from_millis(20));
    }
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("does not own the rule's slot") && reason.contains("seed nodes"), "{reason}");
    let diagnosis = engine.diagnose(&format!("api-{id}")).to_string();
    assert!(diagnosis.contains("seed nodes"), "diagnose says it too: {diagnosis}");
    // The breaker probes again and again (a ping the wrong node answers, then the script's MOVED): the
    // warning is logged once, not at every probe.
    let deadline = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < deadline {
        let _ = engine.resource(&format!("api-{id}")).enter();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(engine.cluster_status()[0].failures >= 3, "it kept probing: {:?}", engine.cluster_status());
    assert_eq!(warnings_containing("does not own the rule's slot"), 1, "logged once per state change");
}

/// Warnings logged in this process (the client logs from its own thread) that contain `needle`.
fn warnings_containing(needle: &str) -> usize {
    WARNINGS.lock().unwrap().iter().filter(|w| w.contains(needle)).count()
}

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

// ---------------------------------------------------------------------------------------------------------
// Redis Sentinel

#[test]
fn after_the_master_is_killed_cluster_mode_resumes_on_the_promoted_replica_within_the_bound() {
    let _serial = one_at_a_time();
    let Some(setup) = RedisSentinelServers::start("after_the_master_is_killed_cluster_mode_resumes") else { return };
    let (count, window_ms) = (1000.0, 500u64);
    let per_window = (count * window_ms as f64 / 1000.0) as u64;
    let start_at = (wall_ms() / window_ms + 6) * window_ms;
    let killed_at = start_at + 4 * window_ms;
    let end_at = killed_at + 24 * window_ms;
    let plan =
        Plan { mode: "sentinel", namespace: "failover".into(), ids: vec![7], count, window_ms, start_at, end_at };
    let urls = setup.sentinel_urls();
    let orders = vec![urls.clone(), urls.iter().rev().cloned().collect()];
    let children = plan.spawn_all(&orders);
    let mut setup = setup;
    sleep_until(killed_at);
    setup.master.kill();
    assert!(setup.wait_failover(Duration::from_secs(20)), "the sentinels promoted the replica");
    let promoted_at = wall_ms();
    let by_id = collect(children);
    let reports = &by_id[&7];
    let measured = totals(reports, start_at / window_ms + 1..end_at / window_ms - 1);
    let fell: BTreeSet<u64> = reports.iter().flat_map(|r| r.fallback_windows.iter().copied()).collect();
    eprintln!(
        "per window (limit {per_window}): {measured:?}; fallback in windows {fell:?}; killed at window {}, promoted \
         at window {}",
        killed_at / window_ms,
        promoted_at / window_ms
    );
    let resumed = resumed_from(&fell, promoted_at / window_ms).expect("leasing again on the new master");
    assert!(
        resumed * window_ms <= promoted_at + 5_000,
        "cluster mode resumed within a few seconds of the promotion ({promoted_at}): at window {resumed}"
    );
    // Once resumed, no more fallback (but where the machine froze a worker).
    assert!(
        fell.iter().filter(|w| **w > resumed).all(|w| stalled_near(reports, *w)),
        "fell back again after resuming: {reports:?}"
    );
    // The bound (README): the window's limit, plus what the instances admit locally while they cannot reach
    // a master (their shares of the count per second: the count in all), or what the old master granted
    // and had not replicated (at most a window's limit).
    check_windows(7, &measured, &fell, per_window, per_window + count as u64);
}

/// Enters `api-<id>` every 10 ms until the rule's mode is `mode`, at most `timeout`: whether it got there.
fn wait_mode(engine: &Sentinel, id: u64, mode: ClusterRuleMode, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let _ = engine.resource(&format!("api-{id}")).enter();
        if engine.cluster_status().first().is_some_and(|s| s.mode == mode) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_hung_master_is_left_for_the_replica_the_sentinels_promote() {
    let _serial = one_at_a_time();
    let Some(setup) = RedisSentinelServers::start("a_hung_master_is_left_for_the_replica") else { return };
    let engine = Sentinel::builder().app_name("topology-test").build();
    engine.load_flow_rules([global_rule(11, 1000.0, 1000)]).unwrap();
    let client = RedisCluster::sentinel_builder(setup.sentinel_urls(), MASTER_NAME)
        .namespace("hung-master")
        .timeout(Duration::from_millis(50))
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    assert!(wait_mode(&engine, 11, ClusterRuleMode::Leasing, Duration::from_secs(5)), "leasing at start");
    // The master hangs (its connections stay open, nothing answers): the sentinels promote the replica.
    setup.master.pause();
    assert!(wait_mode(&engine, 11, ClusterRuleMode::Fallback, Duration::from_secs(5)), "falls back while it hangs");
    assert!(setup.wait_failover(Duration::from_secs(20)), "the sentinels promoted the replica");
    // The client asks the sentinels again (the master stopped answering) and leases from the new master.
    assert!(
        wait_mode(&engine, 11, ClusterRuleMode::Leasing, Duration::from_secs(10)),
        "leasing again on the promoted replica: {:?}",
        engine.cluster_status()
    );
    let mut conn = redis::Client::open(setup.replica.url()).unwrap().get_connection().unwrap();
    let exists: bool = redis::cmd("EXISTS").arg(window_key("hung-master", 11)).query(&mut conn).unwrap();
    assert!(exists, "the window is on the new master");
    drop(client);
}

// ---------------------------------------------------------------------------------------------------------
// Rules from Redis, on a cluster and through Sentinel

fn publish_on(url: &str, key: &str, channel: &str, doc: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).unwrap();
    redis::pipe().atomic().set(key, doc).publish(channel, doc).query::<()>(&mut conn).unwrap();
}

fn flow_rule_doc(count: u32) -> String {
    format!(r#"[{{"resource": "api", "grade": 1, "count": {count}}}]"#)
}

/// A rules key that a node other than the first seed owns.
fn key_off_the_first_seed(cluster: &RedisClusterServers) -> String {
    (0..100)
        .map(|i| format!("sentinel:shop:flow-rules:{i}"))
        .find(|k| cluster.owner_of(k).is_some_and(|o| o != 0))
        .expect("a key on another node")
}

/// The flow-rule channel the cluster tests publish on.
const FLOW_CHANNEL: &str = "sentinel:shop:flow-rules:changed";

/// A key on a node other than the first seed, holding a flow rule of count 10 (published on [`FLOW_CHANNEL`]),
/// and the URL of the node that owns it.
fn rules_off_the_first_seed(cluster: &RedisClusterServers) -> (String, String) {
    let key = key_off_the_first_seed(cluster);
    let owner = cluster.urls()[cluster.owner_of(&key).unwrap()].clone();
    publish_on(&owner, &key, FLOW_CHANNEL, &flow_rule_doc(10));
    (key, owner)
}

#[test]
fn rules_published_on_a_cluster_are_in_force_within_a_second() {
    let _serial = one_at_a_time();
    let Some(cluster) = RedisClusterServers::start("rules_published_on_a_cluster") else { return };
    let urls = cluster.urls();
    // A key owned by a node other than the first seed (where the data source subscribes).
    let (key, owner) = rules_off_the_first_seed(&cluster);
    let (owner, channel) = (owner.as_str(), FLOW_CHANNEL);
    let engine = Sentinel::builder().app_name("shop").build();
    let source =
        RedisDataSource::cluster_builder(urls.clone()).rules(RuleKind::Flow, &key, channel).start(&engine).unwrap();
    assert!(source.wait_for(1, Duration::from_secs(5)), "the key is read from its shard at start");
    assert_eq!(engine.flow_rules()[0].count, 10.0);
    let t = Instant::now();
    publish_on(owner, &key, channel, &flow_rule_doc(20));
    assert!(source.wait_for(2, Duration::from_secs(1)), "in force within a second");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(engine.flow_rules()[0].count, 20.0);
    // Written back through the data source: to the key's shard, announced to every subscriber.
    use sentinel_runtime::datasource::{RuleSet, WritableDataSource};
    let set = RuleSet::new().with_flow(vec![FlowRule::new("api").count(30.0)]);
    source.write_rules(&set).unwrap();
    assert!(source.wait_for(3, Duration::from_secs(1)), "the write is announced");
    assert_eq!(engine.flow_rules()[0].count, 30.0);
}

/// A data source of flow rules at `key`, published on `channel`, found through the sentinels.
fn flow_rules_through_sentinel(
    setup: &RedisSentinelServers,
    engine: &Sentinel,
    key: &str,
    channel: &str,
) -> RedisDataSource {
    RedisDataSource::sentinel_builder(setup.sentinel_urls(), MASTER_NAME)
        .rules(RuleKind::Flow, key, channel)
        .retry_max(Duration::from_millis(200))
        .start(engine)
        .unwrap()
}

#[test]
fn rules_published_through_sentinel_are_in_force_within_a_second_before_and_after_a_failover() {
    let _serial = one_at_a_time();
    let Some(mut setup) = RedisSentinelServers::start("rules_published_through_sentinel") else { return };
    let (key, channel) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");
    let engine = Sentinel::builder().app_name("shop").build();
    let source = flow_rules_through_sentinel(&setup, &engine, key, channel);
    assert!(source.wait_for(1, Duration::from_secs(5)), "the missing key is reported");
    let t = Instant::now();
    publish_on(&setup.master.url(), key, channel, &flow_rule_doc(10));
    assert!(source.wait_for(2, Duration::from_secs(1)), "in force within a second");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(engine.flow_rules()[0].count, 10.0);

    setup.master.kill();
    assert!(setup.wait_failover(Duration::from_secs(20)), "the sentinels promoted the replica");
    // Reconnected to the new master: it reads the key again (one more event).
    assert!(source.wait_for(3, Duration::from_secs(10)), "the data source found the new master");
    assert!(source.is_connected());
    let t = Instant::now();
    publish_on(&setup.replica.url(), key, channel, &flow_rule_doc(20));
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline && engine.flow_rules()[0].count != 20.0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.flow_rules()[0].count, 20.0, "in force within a second after the failover");
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn rules_published_through_sentinel_after_a_failover_from_a_hung_master_are_in_force() {
    let _serial = one_at_a_time();
    let Some(setup) = RedisSentinelServers::start("rules_after_a_failover_from_a_hung_master") else { return };
    let (key, channel) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");
    let engine = Sentinel::builder().app_name("shop").build();
    let source = flow_rules_through_sentinel(&setup, &engine, key, channel);
    assert!(source.wait_for(1, Duration::from_secs(5)), "the missing key is reported");
    publish_on(&setup.master.url(), key, channel, &flow_rule_doc(10));
    assert!(source.wait_for(2, Duration::from_secs(1)), "in force within a second");

    // The master hangs (its connections stay open, nothing answers): the sentinels promote the replica.
    setup.master.pause();
    assert!(setup.wait_failover(Duration::from_secs(20)), "the sentinels promoted the replica");
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && engine.flow_rules()[0].count != 20.0 {
        publish_on(&setup.replica.url(), key, channel, &flow_rule_doc(20));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(engine.flow_rules()[0].count, 20.0, "the data source follows the new master");
}

#[test]
fn rules_from_a_password_protected_master_behind_sentinel_are_read_with_the_builder_s_credentials() {
    let _serial = one_at_a_time();
    // The master and its replica need a password (default user) and know an ACL user too.
    let acl = ["--user", "rules", "on", ">rules-pw", "~*", "&*", "+@all"];
    let Some(setup) = RedisSentinelServers::start_with_password("rules_from_a_password_protected_master", "pw", &acl)
    else {
        return;
    };
    let (key, channel) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");
    let master = format!("redis://:pw@{}", setup.master.addr());
    publish_on(&master, key, channel, &flow_rule_doc(10));
    let start = |engine: &Sentinel, user: Option<&str>, password: Option<&str>| {
        let mut b = RedisDataSource::sentinel_builder(setup.sentinel_urls(), MASTER_NAME)
            .rules(RuleKind::Flow, key, channel)
            .retry_max(Duration::from_millis(200));
        if let Some(u) = user {
            b = b.master_username(u);
        }
        if let Some(p) = password {
            b = b.master_password(p);
        }
        b.start(engine).unwrap()
    };
    // Without the password: refused, reported, nothing applied.
    let engine = Sentinel::builder().app_name("shop").build();
    let source = start(&engine, None, None);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && source.last_error().is_none() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = source.last_error().expect("the refusal is reported");
    assert!(e.to_string().contains("NOAUTH") || e.to_string().to_lowercase().contains("auth"), "{e}");
    assert!(engine.flow_rules().is_empty());
    drop(source);
    // The default user's password, then an ACL user: the key is read, a publication is in force.
    for (user, password, count) in [(None, "pw", 20), (Some("rules"), "rules-pw", 30)] {
        let engine = Sentinel::builder().app_name("shop").build();
        let source = start(&engine, user, Some(password));
        assert!(source.wait_for(1, Duration::from_secs(5)), "the key is read: {:?}", source.last_error());
        assert!(source.is_connected());
        publish_on(&master, key, channel, &flow_rule_doc(count));
        assert!(source.wait_for(2, Duration::from_secs(2)), "a publication is applied");
        assert_eq!(engine.flow_rules()[0].count, f64::from(count), "as {user:?}");
    }
}

/// Starts moving `key`'s slot from its owner to another node and moves `key` itself there: the slot stays the
/// owner's (`MIGRATING` there, `IMPORTING` on the other), so the owner answers `ASK` for the key. Returns the
/// owner's and the other node's indexes.
fn migrate_key_midway(cluster: &RedisClusterServers, key: &str) -> (usize, usize) {
    let urls = cluster.urls();
    let from = cluster.owner_of(key).expect("the key's owner");
    let to = (from + 1) % 3;
    let conn = |i: usize| redis::Client::open(urls[i].as_str()).unwrap().get_connection().unwrap();
    let (mut a, mut b) = (conn(from), conn(to));
    let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut a).unwrap();
    let id = |c: &mut redis::Connection| -> String { redis::cmd("CLUSTER").arg("MYID").query(c).unwrap() };
    let (from_id, to_id) = (id(&mut a), id(&mut b));
    redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("IMPORTING").arg(&from_id).query::<()>(&mut b).unwrap();
    redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("MIGRATING").arg(&to_id).query::<()>(&mut a).unwrap();
    let port = cluster.addrs()[to].port();
    redis::cmd("MIGRATE").arg("127.0.0.1").arg(port).arg(key).arg(0).arg(5000).query::<()>(&mut a).unwrap();
    (from, to)
}

#[test]
fn rules_are_read_and_written_back_on_a_cluster_while_their_key_s_slot_migrates() {
    let _serial = one_at_a_time();
    let Some(cluster) = RedisClusterServers::start("rules_while_their_key_s_slot_migrates") else { return };
    let urls = cluster.urls();
    let channel = "sentinel:shop:flow-rules:changed";
    // One key owned by the first seed (asked first: it answers ASK), one owned by another node (the first seed
    // answers MOVED to the owner, which answers ASK).
    let on_first = (0..100)
        .map(|i| format!("sentinel:shop:flow-rules:{i}"))
        .find(|k| cluster.owner_of(k) == Some(0))
        .expect("a key on the first seed");
    for key in [on_first, key_off_the_first_seed(&cluster)] {
        let owner = cluster.owner_of(&key).unwrap();
        publish_on(&urls[owner], &key, channel, &flow_rule_doc(10));
        let (from, to) = migrate_key_midway(&cluster, &key);
        let mut on_from = redis::Client::open(urls[from].as_str()).unwrap().get_connection().unwrap();
        let refused = redis::cmd("GET").arg(&key).query::<Option<String>>(&mut on_from).unwrap_err();
        assert_eq!(refused.code(), Some("ASK"), "the owner answers ASK for the moved key: {refused}");
        // Read through the cluster client, which follows ASK.
        let engine = Sentinel::builder().app_name("shop").build();
        let source =
            RedisDataSource::cluster_builder(urls.clone()).rules(RuleKind::Flow, &key, channel).start(&engine).unwrap();
        assert!(source.wait_for(1, Duration::from_secs(5)), "the key is read");
        assert_eq!(engine.flow_rules()[0].count, 10.0, "read where the key is now: {:?}", source.last_error());
        // Written back: to the node the key is on now, announced to the subscribers.
        use sentinel_runtime::datasource::{RuleSet, WritableDataSource};
        let set = RuleSet::new().with_flow(vec![FlowRule::new("api").count(30.0)]);
        source.write_rules(&set).expect("written while the slot migrates");
        assert!(source.wait_for(2, Duration::from_secs(2)), "the write is announced");
        assert_eq!(engine.flow_rules()[0].count, 30.0);
        let mut on_to = redis::Client::open(urls[to].as_str()).unwrap().get_connection().unwrap();
        redis::cmd("ASKING").query::<()>(&mut on_to).unwrap();
        let text: String = redis::cmd("GET").arg(&key).query(&mut on_to).unwrap();
        assert!(text.contains("30"), "the key on the node it migrated to holds the write: {text}");
    }
}

#[test]
fn the_first_seed_nodes_credentials_serve_every_node() {
    // The documented form: the credentials of the first seed serve every node (no server is needed: the
    // settings are checked at start, a Redis that is down is no error).
    let engine = Sentinel::builder().app_name("topology-test").build();
    let client = RedisCluster::cluster_builder(["redis://:p%40ss@127.0.0.1:1", "redis://127.0.0.1:2"])
        .timeout(Duration::from_millis(20))
        .start(&engine);
    assert!(client.is_ok(), "{:?}", client.err());
    let client =
        RedisCluster::cluster_builder(["redis://app:pw@127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"])
            .timeout(Duration::from_millis(20))
            .start(&engine);
    assert!(client.is_ok(), "a user and a password: {:?}", client.err());
}

#[test]
fn rules_published_on_a_cluster_whose_first_seed_hangs_are_in_force() {
    let _serial = one_at_a_time();
    let Some(cluster) = RedisClusterServers::start("rules_published_on_a_cluster_whose_first_seed_hangs") else {
        return;
    };
    let urls = cluster.urls();
    // A key owned by a node other than the first seed (the one that hangs).
    let (key, owner) = rules_off_the_first_seed(&cluster);
    let (owner, channel) = (owner.as_str(), FLOW_CHANNEL);
    let engine = Sentinel::builder().app_name("shop").build();
    let source = RedisDataSource::cluster_builder(urls.clone())
        .rules(RuleKind::Flow, &key, channel)
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, Duration::from_secs(5)), "the key is read from its shard at start");
    assert_eq!(engine.flow_rules()[0].count, 10.0);
    // The first seed hangs: the data source subscribes on another node, where a publication still arrives.
    cluster.pause(0);
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && engine.flow_rules()[0].count != 20.0 {
        publish_on(owner, &key, channel, &flow_rule_doc(20));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        engine.flow_rules()[0].count,
        20.0,
        "rules published while the first seed hangs: {:?}",
        source.last_error()
    );
}
