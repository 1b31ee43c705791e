//! The dashboard's cluster pages against a running cluster client: the command center (a real HTTP server on
//! 127.0.0.1) answers `getClusterMode` and `cluster/client/fetchConfig` for the client on a real
//! `redis-server`, as the Sentinel Dashboard reads them.
#![cfg(all(feature = "cluster-redis", feature = "transport"))]

use std::time::Duration;

use sentinel_runtime::cluster::RedisCluster;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::{get, post_form};
use sentinel_testkit::redis::RedisServer;

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[test]
fn dashboard_sees_a_cluster_client_while_redis_cluster_runs_and_not_started_after() {
    let Some(redis) = RedisServer::start("dashboard_sees_a_cluster_client") else { return };
    let engine = Sentinel::builder().app_name("shop").build();
    let center = CommandCenter::builder(&engine).port(0).start().expect("start the command center");
    let addr = center.local_addr();
    assert_eq!(json(&get(addr, "/getClusterMode", &[]).body)["mode"], -1, "not started yet");

    let client = RedisCluster::builder(redis.url()).timeout(Duration::from_millis(30)).start(&engine).unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    let mode = json(&get(addr, "/getClusterMode", &[]).body);
    assert_eq!(mode["mode"], 0, "a token client: {mode}");
    assert_eq!((mode["clientAvailable"].as_bool(), mode["serverAvailable"].as_bool()), (Some(true), Some(false)));
    assert!(mode["lastModified"].as_i64().is_some_and(|t| t > 0), "{mode}");
    let config = json(&get(addr, "/cluster/client/fetchConfig", &[]).body);
    assert_eq!(config["serverHost"], "127.0.0.1");
    assert_eq!(config["serverPort"], redis.addr().port());
    assert_eq!(config["requestTimeout"], 30);
    assert_eq!(config["clientState"], 2, "started: Redis answers");
    assert_eq!(post_form(addr, "/setClusterMode", &[("mode", "0")], &[]).body, "success", "already a client");
    assert_eq!(get(addr, "/setClusterMode?mode=0", &[]).status, 405, "a write, by POST only");
    let server = post_form(addr, "/setClusterMode", &[("mode", "1")], &[]);
    assert_eq!(server.status, 400);
    assert!(server.body.contains("no token server"), "{}", server.body);

    drop(client);
    assert_eq!(json(&get(addr, "/getClusterMode", &[]).body)["mode"], -1, "stopped: not started again");
}

#[test]
fn behind_sentinel_fetch_config_names_the_master_and_the_new_one_after_a_failover() {
    use sentinel_runtime::flow::{ClusterConfig, ClusterThresholdType, FlowRule};
    use sentinel_testkit::redis_cluster::{RedisSentinelServers, MASTER_NAME};
    let Some(mut setup) = RedisSentinelServers::start("fetch_config_names_the_master") else { return };
    let engine = Sentinel::builder().app_name("shop").build();
    engine
        .load_flow_rules([FlowRule::new("api").count(1000.0).cluster(ClusterConfig::new(ClusterThresholdType::Global))])
        .unwrap();
    let center = CommandCenter::builder(&engine).port(0).start().expect("start the command center");
    let addr = center.local_addr();
    let client = RedisCluster::sentinel_builder(setup.sentinel_urls(), MASTER_NAME)
        .timeout(Duration::from_millis(50))
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    let config = json(&get(addr, "/cluster/client/fetchConfig", &[]).body);
    assert_eq!(config["serverHost"], "127.0.0.1");
    assert_eq!(config["serverPort"], setup.master.addr().port(), "the master keeps the limits: {config}");
    assert_eq!(config["clientState"], 2);

    setup.master.kill();
    assert!(setup.wait_failover(Duration::from_secs(20)), "the sentinels promoted the replica");
    let replica = setup.replica.addr().port();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut config = serde_json::Value::Null;
    while std::time::Instant::now() < deadline {
        let _ = engine.resource("api").enter();
        config = json(&get(addr, "/cluster/client/fetchConfig", &[]).body);
        if config["serverPort"] == replica && config["clientState"] == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(config["serverPort"], replica, "the new master: {config}");
    assert_eq!(config["clientState"], 2, "{config}");
}
