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
