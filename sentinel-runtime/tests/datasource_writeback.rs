//! The command center's write-back through [`WritableDataSource`]: a store of the user's own (a map), and
//! Redis (`SET` + `PUBLISH` in one `MULTI`, which a running Redis data source of another engine applies).
#![cfg(feature = "transport")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sentinel_runtime::datasource::{Format, RuleSet, SourceStatus, WritableDataSource, WriteBackError};
use sentinel_runtime::transport::{CommandCenter, WRITE_DATA_SOURCE_FAILED};
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::{get, post_form};

/// A user's own store: rules per kind in a map; `fail` makes every write fail (a store that is down).
#[derive(Default)]
struct MapStore {
    map: Mutex<HashMap<String, String>>,
    fail: std::sync::atomic::AtomicBool,
}

impl WritableDataSource for MapStore {
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(WriteBackError::Store { target: "map".into(), reason: "the store is down".into() });
        }
        let mut map = self.map.lock().unwrap();
        for kind in set.kinds() {
            let text = set
                .kind_to_string(kind, Format::Json)
                .map_err(|error| WriteBackError::Serialize { target: kind.to_string(), error })?;
            map.insert(kind.to_string(), text);
        }
        Ok(())
    }
    fn status(&self) -> SourceStatus {
        SourceStatus::new("map", "memory")
    }
}

fn push(center: &CommandCenter, command: &str, kind: &str, data: &str) -> (u16, String) {
    let r = post_form(center.local_addr(), &format!("/{command}"), &[("type", kind), ("data", data)], &[]);
    (r.status, r.body.trim().to_string())
}

#[test]
fn a_users_own_store_receives_pushed_rules_and_a_failing_one_gives_partial_success() {
    let engine = Sentinel::builder().build();
    let store = Arc::new(MapStore::default());
    let center = CommandCenter::builder(&engine).port(0).data_source(store.clone()).start().unwrap();

    assert_eq!(push(&center, "setRules", "flow", r#"[{"resource": "api", "count": 4}]"#), (200, "success".into()));
    let param = r#"[{"resource": "hot", "paramIdx": 0, "count": 5}]"#;
    assert_eq!(push(&center, "setParamFlowRules", "", param), (200, "success".into()));
    {
        let map = store.map.lock().unwrap();
        assert_eq!(map.len(), 2, "{map:?}");
        let flow: Vec<sentinel_runtime::flow::FlowRule> =
            sentinel_runtime::datasource::parse_rules(&map["flow"], Format::Json).unwrap();
        assert_eq!((flow[0].resource.as_str(), flow[0].count), ("api", 4.0));
        assert!(map.values().any(|t| t.contains("\"paramIdx\": 0")), "{map:?}");
    }
    // The console's overview names the store.
    let overview = get(center.local_addr(), "/console/overview", &[]);
    assert_eq!(overview.status, 200, "{}", overview.body);
    assert!(overview.body.contains(r#""dataSource":{"kind":"map","target":"memory""#), "{}", overview.body);

    store.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    let (status, body) = push(&center, "setRules", "flow", r#"[{"resource": "api", "count": 6}]"#);
    assert_eq!((status, body.as_str()), (200, WRITE_DATA_SOURCE_FAILED));
    assert_eq!(engine.flow_rules()[0].count, 6.0, "the rules took effect");
    assert!(store.map.lock().unwrap()["flow"].contains("4.0"), "the store keeps what it had");
}

/// A store that hangs until the test lets it go, then stores as [`MapStore`] does.
struct HangingStore {
    gate: Mutex<()>,
    store: MapStore,
}

impl WritableDataSource for HangingStore {
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        let _open = self.gate.lock().unwrap();
        self.store.write_rules(set)
    }
    fn status(&self) -> SourceStatus {
        SourceStatus::new("hanging", "memory")
    }
}

#[test]
fn pushes_while_the_store_hangs_are_answered_and_the_store_ends_with_the_last_of_each_kind() {
    let engine = Sentinel::builder().build();
    let store = Arc::new(HangingStore { gate: Mutex::new(()), store: MapStore::default() });
    let center = CommandCenter::builder(&engine)
        .port(0)
        .request_timeout(std::time::Duration::from_millis(200))
        .data_source(store.clone())
        .start()
        .unwrap();
    let held = store.gate.lock().unwrap();
    // More pushes than any queue would hold: each is answered (the rules in force), none is lost.
    for count in 1..=8 {
        let flow = format!(r#"[{{"resource": "api", "count": {count}}}]"#);
        assert_eq!(push(&center, "setRules", "flow", &flow), (200, WRITE_DATA_SOURCE_FAILED.into()));
        let degrade = format!(r#"[{{"resource": "api", "grade": 2, "count": {count}, "timeWindow": 10}}]"#);
        assert_eq!(push(&center, "setRules", "degrade", &degrade), (200, WRITE_DATA_SOURCE_FAILED.into()));
        assert_eq!(engine.flow_rules()[0].count, count as f64, "in force at once");
    }
    drop(held);
    // The writes are made in push order: once the next push's is made, those before it are.
    let last = r#"[{"resource": "db", "limitApp": "appA"}]"#;
    assert_eq!(push(&center, "setRules", "authority", last).0, 200);
    let made = std::time::Instant::now();
    while !store.store.map.lock().unwrap().contains_key("authority") {
        assert!(made.elapsed() < std::time::Duration::from_secs(60), "the writes were never made");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let map = store.store.map.lock().unwrap();
    let flow: Vec<sentinel_runtime::flow::FlowRule> =
        sentinel_runtime::datasource::parse_rules(&map["flow"], Format::Json).unwrap();
    assert_eq!(flow[0].count, 8.0, "the store holds the last flow push");
    let degrade: Vec<sentinel_runtime::circuit_breaker::DegradeRule> =
        sentinel_runtime::datasource::parse_rules(&map["degrade"], Format::Json).unwrap();
    assert_eq!(degrade[0].count, 8.0, "the store holds the last degrade push");
}

#[test]
fn adaptive_rules_through_the_command_center_refuse_a_bad_push_and_survive_a_restart_in_the_rules_directory() {
    use sentinel_runtime::datasource::FileDataSource;
    let dir = sentinel_testkit::temp_dir();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, dir.path());
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();

    let rules = r#"[{"resource": "db", "algorithm": "vegas", "minLimit": 2, "initialLimit": 8, "maxLimit": 40,
        "maxWaitMs": 50, "partitions": {"mobile": 0.6, "default": 0.4}}]"#;
    assert_eq!(push(&center, "setRules", "adaptive", rules), (200, "success".into()));
    let in_force = engine.adaptive_rules();
    assert_eq!(in_force.len(), 1);
    assert_eq!((in_force[0].min_limit, in_force[0].max_limit, in_force[0].max_wait_ms), (2, 40, 50));
    let got = get(center.local_addr(), "/getRules?type=adaptive", &[]);
    assert_eq!(got.status, 200, "{}", got.body);
    let listed: Vec<sentinel_runtime::adaptive::AdaptiveRule> =
        sentinel_runtime::datasource::parse_rules(&got.body, Format::Json).unwrap();
    assert_eq!(listed, in_force, "getRules answers the rules in force");
    let file = dir.path().join("adaptive-rules.json");
    let written = std::fs::read_to_string(&file).expect("written back to the rules directory");

    // Bad pushes: a typed error naming the field; the rules in force and the file stay.
    for (bad, field) in [
        (r#"[{"resource": "db", "minLimit": 50, "maxLimit": 10}]"#, "minLimit"),
        (r#"[{"resource": "db", "partitions": {"mobile": 0.8, "web": 0.7}}]"#, "partitions"),
        (r#"[{"resource": "db", "partitions": {"mobile": 0}}]"#, "partitions"),
        (r#"[{"resource": "db", "algorithm": "fastest"}]"#, "algorithm"),
        (r#"[{"resource": "db", "maxLimitt": 10}]"#, "maxLimitt"),
    ] {
        let (status, body) = push(&center, "setRules", "adaptive", bad);
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.to_lowercase().contains(&field.to_lowercase()) || body.contains(&snake(field)), "{bad}: {body}");
        assert_eq!(engine.adaptive_rules(), in_force, "{bad}: the rules in force stay");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), written, "{bad}: the file is untouched");
    }

    // A restart: a new engine loads the directory.
    drop(center);
    let restarted = Sentinel::builder().build();
    FileDataSource::new(&restarted, dir.path()).reload_now().unwrap();
    assert_eq!(restarted.adaptive_rules(), in_force);
}

/// `minLimit` as `min_limit`: the engine's error may name the field either way.
fn snake(field: &str) -> String {
    field.chars().fold(String::new(), |mut s, c| {
        if c.is_ascii_uppercase() {
            s.push('_');
        }
        s.push(c.to_ascii_lowercase());
        s
    })
}

#[cfg(feature = "cluster-redis")]
#[test]
fn redis_write_back_sets_and_publishes_so_another_engines_source_applies_it_and_a_restart_reads_it() {
    use sentinel_runtime::cluster::RedisDataSource;
    use sentinel_runtime::RuleKind;
    use std::time::Duration;
    let Some(redis) = sentinel_testkit::redis::RedisServer::start("redis_write_back_sets_and_publishes") else {
        return;
    };
    let (key, channel) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");
    let start = |engine: &Sentinel| {
        RedisDataSource::builder(redis.url()).rules(RuleKind::Flow, key, channel).start(engine).unwrap()
    };
    let (a, b) = (Sentinel::builder().build(), Sentinel::builder().build());
    let source_a = start(&a);
    let source_b = start(&b);
    assert!(source_a.wait_for(1, Duration::from_secs(10)) && source_b.wait_for(1, Duration::from_secs(10)));
    let center = CommandCenter::builder(&a).port(0).data_source(source_a).start().unwrap();

    assert_eq!(push(&center, "setRules", "flow", r#"[{"resource": "api", "count": 4}]"#), (200, "success".into()));
    assert!(source_b.wait_for(2, Duration::from_secs(10)), "B hears the PUBLISH");
    assert_eq!(b.flow_rules()[0].count, 4.0);

    // A new engine reads the key (the SET).
    let restarted = Sentinel::builder().build();
    let again = start(&restarted);
    assert!(again.wait_for(1, Duration::from_secs(10)));
    assert_eq!(restarted.flow_rules()[0].count, 4.0);

    // Redis down: partial success, the rules in force.
    drop(again);
    drop(source_b);
    let mut redis = redis;
    redis.kill();
    let (status, body) = push(&center, "setRules", "flow", r#"[{"resource": "api", "count": 5}]"#);
    assert_eq!((status, body.as_str()), (200, WRITE_DATA_SOURCE_FAILED));
    assert_eq!(a.flow_rules()[0].count, 5.0);
}

#[cfg(feature = "cluster-redis")]
#[test]
fn adaptive_rules_pushed_with_a_redis_write_back_reach_another_engine_and_a_restart() {
    use sentinel_runtime::cluster::RedisDataSource;
    use sentinel_runtime::RuleKind;
    use std::time::Duration;
    let Some(redis) = sentinel_testkit::redis::RedisServer::start("adaptive_rules_pushed_with_a_redis_write_back")
    else {
        return;
    };
    let (key, channel) = ("sentinel:shop:adaptive-rules", "sentinel:shop:adaptive-rules:changed");
    let start = |engine: &Sentinel| {
        RedisDataSource::builder(redis.url()).rules(RuleKind::Adaptive, key, channel).start(engine).unwrap()
    };
    let (a, b) = (Sentinel::builder().build(), Sentinel::builder().build());
    let source_a = start(&a);
    let source_b = start(&b);
    assert!(source_a.wait_for(1, Duration::from_secs(10)) && source_b.wait_for(1, Duration::from_secs(10)));
    let center = CommandCenter::builder(&a).port(0).data_source(source_a).start().unwrap();

    let rules = r#"[{"resource": "db", "algorithm": "aimd", "minLimit": 1, "initialLimit": 5, "maxLimit": 9}]"#;
    assert_eq!(push(&center, "setRules", "adaptive", rules), (200, "success".into()));
    assert!(source_b.wait_for(2, Duration::from_secs(10)), "B hears the PUBLISH");
    assert_eq!(b.adaptive_rules(), a.adaptive_rules());
    assert_eq!(b.adaptive_rules()[0].max_limit, 9);
    // A bad push changes nothing anywhere.
    let (status, _) = push(&center, "setRules", "adaptive", r#"[{"resource": "db", "minLimit": 9, "maxLimit": 1}]"#);
    assert_eq!(status, 400);
    assert_eq!(a.adaptive_rules()[0].max_limit, 9);

    let restarted = Sentinel::builder().build();
    let again = start(&restarted);
    assert!(again.wait_for(1, Duration::from_secs(10)));
    assert_eq!(restarted.adaptive_rules(), a.adaptive_rules(), "a new engine reads the key");
}

/// A write-back answered `success` is what the next start loads (`WritableDataSource`). A combined Redis key
/// that holds a kind the engine refuses would be refused whole at the next start, the pushed kind with it:
/// the file source replaces such a kind with the rules in force; the Redis write-back must not store a
/// document that does not load.
#[cfg(feature = "cluster-redis")]
#[test]
fn redis_a_write_back_into_a_combined_key_holding_a_refused_kind_is_what_the_next_start_loads() {
    use sentinel_runtime::cluster::RedisDataSource;
    use sentinel_runtime::flow::FlowRule;
    use std::time::Duration;
    let Some(redis) = sentinel_testkit::redis::RedisServer::start("redis_a_write_back_into_a_combined_key") else {
        return;
    };
    let (key, channel) = ("sentinel:shop:rules", "sentinel:shop:rules:changed");
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let refused = r#"{"flowRules": [{"resource": "api", "count": 1}],
        "degradeRules": [{"resource": "db", "grade": 1, "count": 5, "timeWindow": 10}]}"#;
    redis::cmd("SET").arg(key).arg(refused).query::<()>(&mut conn).unwrap();
    let start = |engine: &Sentinel| RedisDataSource::builder(redis.url()).rule_set(key, channel).start(engine).unwrap();
    let engine = Sentinel::builder().build();
    let source = start(&engine);
    assert!(source.wait_for(1, Duration::from_secs(10)));
    assert!(source.last_error().is_some(), "the key is refused");
    // A push: in force, then written back.
    engine.load_flow_rules([FlowRule::new("api").count(4.0)]).unwrap();
    let written = source.write_rules(&RuleSet::snapshot(&engine, &[sentinel_runtime::RuleKind::Flow]));
    if written.is_ok() {
        let restarted = Sentinel::builder().build();
        let again = start(&restarted);
        assert!(again.wait_for(1, Duration::from_secs(10)));
        assert_eq!(restarted.flow_rules(), engine.flow_rules(), "a restart loads the push ({:?})", again.last_error());
        assert_eq!(restarted.degrade_rules(), engine.degrade_rules());
    }
}
