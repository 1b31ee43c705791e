//! The gateway's flow rules and API definitions in every store, beside the other kinds: a combined rules
//! file (`gwFlowRules`, `gwApiDefinitions`), Redis, etcd and ZooKeeper (a key or node per list, or a combined
//! document), each against a real server started by the test. In each: the lists load at start, a push by
//! another client is applied, a bad document changes nothing (the gateway's lists and the other kinds stay,
//! the error names the document and the field), and what the dashboard's `gateway/updateRules` and
//! `gateway/updateApiDefinitions` push is written back so that a restarted engine loads it; a store that is
//! down answers `partial success` and loses nothing.
#![cfg(all(feature = "transport", feature = "tower"))]

#[path = "support/remote_source.rs"]
mod remote_source;

use remote_source::{counts, flow};
use sentinel_runtime::transport::{CommandCenter, WRITE_DATA_SOURCE_FAILED};
use sentinel_runtime::web::gateway::ApiDefinition;
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::post_form;

/// Gateway flow rules in Java's JSON: one rule on the API `orders` of `count`.
fn gw_rules(count: u32) -> String {
    format!(r#"[{{"resource": "orders", "resourceMode": 1, "count": {count}, "intervalSec": 1}}]"#)
}

/// API definitions in Java's JSON: `orders` by an Ant-style prefix, and `pattern` as a second path.
fn gw_apis(pattern: &str) -> String {
    format!(
        r#"[{{"apiName": "orders", "predicateItems": [{{"pattern": "/orders/**", "matchStrategy": 1}}, {{"pattern": "{pattern}", "matchStrategy": 0}}]}}]"#
    )
}

/// The engine's gateway flow rules as (resource, count).
fn gateway(engine: &Sentinel) -> Vec<(String, f64)> {
    engine.gateway_rules().into_iter().map(|r| (r.resource, r.count)).collect()
}

/// The paths of the engine's API definitions.
fn api_paths(engine: &Sentinel) -> Vec<String> {
    engine
        .api_definitions()
        .iter()
        .flat_map(|d: &ApiDefinition| d.predicate_items.iter().map(|i| i.pattern.clone()))
        .collect()
}

/// A dashboard push of a gateway command (`gateway/updateRules`, `gateway/updateApiDefinitions`).
fn push(center: &CommandCenter, command: &str, data: &str) -> (u16, String) {
    let r = post_form(center.local_addr(), &format!("/gateway/{command}"), &[("data", data)], &[]);
    (r.status, r.body.trim().to_string())
}

/// The lists in force are `gw` (the count of the rule on `orders`) and `paths`, the flow rule `api` is 3.
fn assert_in_force(engine: &Sentinel, gw: f64, paths: &[&str]) {
    assert_eq!(gateway(engine), [("orders".to_string(), gw)], "the gateway rules");
    assert_eq!(api_paths(engine), paths, "the API definitions");
    assert_eq!(counts(engine), [("api".to_string(), 3.0)], "the other kinds");
}

/// The dashboard's two pushes through a command center writing back to `source` are answered `success`,
/// and a restarted engine (`restart` starts a source on it and waits for its first reads) loads them with
/// the other kinds kept. Returns the command center.
fn pushes_survive_a_restart<R>(
    engine: &Sentinel,
    source: impl sentinel_runtime::datasource::WritableDataSource,
    restart: impl FnOnce(&Sentinel) -> R,
) -> CommandCenter {
    let center = CommandCenter::builder(engine).port(0).data_source(source).start().unwrap();
    assert_eq!(push(&center, "updateRules", &gw_rules(9)), success());
    assert_eq!(push(&center, "updateApiDefinitions", &gw_apis("/pay")), success());
    let restarted = Sentinel::builder().build();
    let again = restart(&restarted);
    assert_in_force(&restarted, 9.0, &["/orders/**", "/pay"]);
    drop(again);
    center
}

/// [`pushes_survive_a_restart`] (`restart` starts a source on the `server`), then with the server down
/// (`kill`) a push is answered `partial success` and is in force all the same.
fn pushes_survive_a_restart_and_the_store_going_down<S, R>(
    engine: &Sentinel,
    source: impl sentinel_runtime::datasource::WritableDataSource,
    server: &mut S,
    restart: impl FnOnce(&Sentinel, &S) -> R,
    kill: impl FnOnce(&mut S),
) {
    let center = pushes_survive_a_restart(engine, source, |restarted| restart(restarted, server));
    kill(server);
    assert_eq!(push(&center, "updateRules", &gw_rules(2)), partial());
    assert_eq!(gateway(engine), [("orders".to_string(), 2.0)]);
}

fn success() -> (u16, String) {
    (200, "success".to_string())
}

fn partial() -> (u16, String) {
    (200, WRITE_DATA_SOURCE_FAILED.to_string())
}

mod file {
    use super::*;
    use sentinel_runtime::datasource::{FileDataSource, GatewayDocumentError, SourceError};
    use sentinel_runtime::web::gateway::GatewayRuleError;

    fn document(gw_count: u32) -> String {
        format!(
            r#"{{"flowRules": {}, "gwFlowRules": {}, "gwApiDefinitions": {}}}"#,
            flow("api", 3.0),
            gw_rules(gw_count),
            gw_apis("/checkout")
        )
    }

    #[test]
    fn a_combined_rules_file_holds_the_gateway_lists_beside_the_other_kinds_and_takes_their_write_back() {
        let dir = sentinel_testkit::temp_dir();
        let path = dir.path().join("rules.json");
        std::fs::write(&path, document(5)).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &path);
        source.reload_now().unwrap();
        assert_in_force(&engine, 5.0, &["/orders/**", "/checkout"]);

        // A restart: a new engine loads the file.
        let _center = pushes_survive_a_restart(&engine, source, |restarted| {
            FileDataSource::new(restarted, &path).reload_now().unwrap()
        });
        let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(stored["gwFlowRules"][0]["count"], 9.0, "{stored}");
        assert_eq!(stored["gwApiDefinitions"][0]["predicateItems"][1]["pattern"], "/pay", "{stored}");
        assert_eq!(stored["flowRules"][0]["count"], 3.0, "the other kinds are kept: {stored}");
    }

    #[test]
    fn a_bad_gateway_list_in_a_combined_file_changes_nothing_and_names_the_field() {
        let dir = sentinel_testkit::temp_dir();
        let path = dir.path().join("rules.json");
        std::fs::write(&path, document(5)).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &path);
        source.reload_now().unwrap();

        // Not Java's JSON: an unknown parse strategy.
        let malformed = document(9).replace(r#""intervalSec": 1"#, r#""paramItem": {"parseStrategy": 9}"#);
        std::fs::write(&path, malformed.replace(r#""count": 3.0"#, r#""count": 30.0"#)).unwrap();
        match source.reload_now() {
            Err(SourceError::Parse { error, .. }) => {
                assert_eq!(error.field.as_deref(), Some("gwFlowRules[0].paramItem.parseStrategy"), "{error}")
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        // Valid JSON, an invalid rule: a negative count.
        std::fs::write(&path, document(5).replace(r#""count": 5"#, r#""count": -1"#).replace("3.0", "30.0")).unwrap();
        match source.reload_now() {
            Err(SourceError::Gateway { error: GatewayDocumentError::Invalid(e), path: at }) => {
                assert_eq!(at, path);
                assert!(matches!(&e, GatewayRuleError::InvalidRule { field: "count", index: 0, .. }), "{e}");
            }
            other => panic!("expected an invalid gateway rule, got {other:?}"),
        }
        assert_in_force(&engine, 5.0, &["/orders/**", "/checkout"]);
    }

    #[test]
    fn javas_gateway_rules_file_alone_loads_takes_the_dashboards_rules_and_refuses_to_hold_api_definitions() {
        let dir = sentinel_testkit::temp_dir();
        let path = dir.path().join("gw-flow-rules.json");
        std::fs::write(&path, gw_rules(3)).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &path);
        source.reload_now().unwrap();
        assert_eq!(gateway(&engine), [("orders".to_string(), 3.0)]);

        std::fs::write(&path, r#"[{"resource": "orders", "cout": 3}]"#).unwrap();
        match source.reload_now() {
            Err(SourceError::Gateway { error: GatewayDocumentError::Parse(e), .. }) => {
                assert!(e.message.contains("cout"), "{e}")
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        assert_eq!(gateway(&engine), [("orders".to_string(), 3.0)], "the rules in force stay");
        std::fs::write(&path, gw_rules(3)).unwrap();

        let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
        assert_eq!(push(&center, "updateRules", &gw_rules(6)), success());
        assert_eq!(push(&center, "updateApiDefinitions", &gw_apis("/pay")), partial(), "the file holds rules only");
        assert_eq!(api_paths(&engine), ["/orders/**", "/pay"], "in force all the same");
        let restarted = Sentinel::builder().build();
        FileDataSource::new(&restarted, &path).reload_now().unwrap();
        assert_eq!(gateway(&restarted), [("orders".to_string(), 6.0)]);
        assert!(restarted.api_definitions().is_empty());
    }

    #[test]
    fn a_single_kind_file_cannot_hold_a_gateway_push_which_stays_in_force() {
        let dir = sentinel_testkit::temp_dir();
        let path = dir.path().join("flow-rules.json");
        std::fs::write(&path, flow("api", 3.0)).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &path);
        source.reload_now().unwrap();
        let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
        assert_eq!(push(&center, "updateRules", &gw_rules(4)), partial());
        assert_eq!(gateway(&engine), [("orders".to_string(), 4.0)], "in force, though not stored");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), flow("api", 3.0), "the file is as it was");
    }
}

#[cfg(feature = "cluster-redis")]
mod redis_store {
    use super::*;
    use remote_source::WAIT;
    use sentinel_runtime::cluster::{RedisDataSource, RedisSourceError};
    use sentinel_runtime::RuleKind;
    use sentinel_testkit::redis::RedisServer;

    const RULES: (&str, &str) = ("sentinel:shop:gw-flow-rules", "sentinel:shop:gw-flow-rules:changed");
    const APIS: (&str, &str) = ("sentinel:shop:gw-api-definitions", "sentinel:shop:gw-api-definitions:changed");
    const FLOW: (&str, &str) = ("sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed");

    fn start(engine: &Sentinel, redis: &RedisServer) -> RedisDataSource {
        RedisDataSource::builder(redis.url())
            .rules(RuleKind::Flow, FLOW.0, FLOW.1)
            .gateway_rules(RULES.0, RULES.1)
            .api_definitions(APIS.0, APIS.1)
            .retry_max(std::time::Duration::from_millis(200))
            .start(engine)
            .unwrap()
    }

    /// What a publisher does (Java's documented `MULTI`/`SET`/`PUBLISH`).
    fn publish(redis: &RedisServer, (key, channel): (&str, &str), text: &str) {
        let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
        let _: () =
            redis::pipe().atomic().set(key, text).ignore().publish(channel, text).ignore().query(&mut conn).unwrap();
    }

    fn stored(redis: &RedisServer, key: &str) -> String {
        let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
        redis::cmd("GET").arg(key).query(&mut conn).unwrap()
    }

    #[test]
    fn redis_gateway_keys_load_take_pushes_refuse_bad_documents_and_store_the_dashboards_writes() {
        let Some(redis) = RedisServer::start("redis_gateway_keys_load_take_pushes") else { return };
        publish(&redis, FLOW, &flow("api", 3.0));
        publish(&redis, RULES, &gw_rules(5));
        publish(&redis, APIS, &gw_apis("/checkout"));
        let engine = Sentinel::builder().build();
        let source = start(&engine, &redis);
        assert!(source.wait_for(3, WAIT), "the three keys are read");
        assert_in_force(&engine, 5.0, &["/orders/**", "/checkout"]);

        // A push by another client.
        publish(&redis, RULES, &gw_rules(7));
        assert!(source.wait_for(4, WAIT));
        assert_eq!(gateway(&engine), [("orders".to_string(), 7.0)]);

        // A malformed document, then an invalid rule: nothing changes, the errors name key and field.
        publish(&redis, RULES, r#"[{"resource": "orders", "paramItem": {"parseStrategy": 9}}]"#);
        assert!(source.wait_for(5, WAIT));
        match source.last_error() {
            Some(RedisSourceError::Parse { key, error }) => {
                assert_eq!((key.as_str(), error.field.as_deref()), (RULES.0, Some("[0].paramItem.parseStrategy")))
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        publish(&redis, APIS, r#"[{"apiName": "orders", "predicateItems": [{"pattern": "(", "matchStrategy": 2}]}]"#);
        assert!(source.wait_for(6, WAIT));
        match source.last_error() {
            Some(RedisSourceError::InvalidGateway { key, error }) => {
                assert_eq!(key, APIS.0);
                assert_eq!(error.field(), "predicate_items.pattern", "{error}");
            }
            other => panic!("expected an invalid API definition, got {other:?}"),
        }
        assert_in_force(&engine, 7.0, &["/orders/**", "/checkout"]);

        // The dashboard's pushes are written back (SET + PUBLISH) and a restarted engine reads them.
        let mut redis = redis;
        let restart = |restarted: &Sentinel, redis: &RedisServer| {
            assert!(stored(redis, RULES.0).contains(r#""count":9.0"#), "{}", stored(redis, RULES.0));
            let again = start(restarted, redis);
            assert!(again.wait_for(3, WAIT));
            again
        };
        pushes_survive_a_restart_and_the_store_going_down(&engine, source, &mut redis, restart, |r| r.kill());
    }

    #[test]
    fn redis_combined_document_carries_the_gateway_lists_and_keeps_the_other_kinds_on_write_back() {
        let Some(redis) = RedisServer::start("redis_combined_document_carries_the_gateway_lists") else { return };
        let key = ("sentinel:shop:rules", "sentinel:shop:rules:changed");
        let doc = format!(r#"{{"flowRules": {}, "gwFlowRules": {}}}"#, flow("api", 3.0), gw_rules(5));
        publish(&redis, key, &doc);
        let start =
            |engine: &Sentinel| RedisDataSource::builder(redis.url()).rule_set(key.0, key.1).start(engine).unwrap();
        let engine = Sentinel::builder().build();
        let source = start(&engine);
        assert!(source.wait_for(1, WAIT));
        assert_eq!(gateway(&engine), [("orders".to_string(), 5.0)]);
        let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
        assert_eq!(push(&center, "updateRules", &gw_rules(6)), success());
        let restarted = Sentinel::builder().build();
        let again = start(&restarted);
        assert!(again.wait_for(1, WAIT));
        assert_eq!(gateway(&restarted), [("orders".to_string(), 6.0)]);
        assert_eq!(counts(&restarted), [("api".to_string(), 3.0)], "the flow rules kept: {}", stored(&redis, key.0));
    }
}

#[cfg(feature = "etcd")]
mod etcd_store {
    use super::*;
    use remote_source::{wait_until, WAIT};
    use sentinel_runtime::datasource::{EtcdDataSource, EtcdSourceError};
    use sentinel_testkit::etcd::EtcdServer;

    const KEY: &str = "/sentinel/shop/rules";

    fn put(rt: &tokio::runtime::Runtime, client: &mut etcd_client::Client, value: &str) {
        rt.block_on(client.put(KEY, value, None)).expect("put");
    }

    fn start(engine: &Sentinel, etcd: &EtcdServer) -> EtcdDataSource {
        EtcdDataSource::builder(etcd.url())
            .rule_set(KEY)
            .retry_max(std::time::Duration::from_millis(200))
            .start(engine)
            .unwrap()
    }

    #[test]
    fn etcd_combined_key_holds_the_gateway_lists_takes_pushes_refuses_bad_ones_and_stores_the_dashboards_writes() {
        let Some(mut etcd) = EtcdServer::start("etcd_combined_key_holds_the_gateway_lists") else { return };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut client = rt.block_on(etcd_client::Client::connect([etcd.url()], None)).expect("connect");
        let doc = |gw: u32| {
            format!(
                r#"{{"flowRules": {}, "gwFlowRules": {}, "gwApiDefinitions": {}}}"#,
                flow("api", 3.0),
                gw_rules(gw),
                gw_apis("/checkout")
            )
        };
        put(&rt, &mut client, &doc(5));
        let engine = Sentinel::builder().build();
        let source = start(&engine, &etcd);
        assert!(source.wait_for(1, WAIT));
        assert_eq!(gateway(&engine), [("orders".to_string(), 5.0)]);
        assert_eq!(api_paths(&engine), ["/orders/**", "/checkout"]);

        put(&rt, &mut client, &doc(7));
        assert!(source.wait_for(2, WAIT), "the watch delivers the change");
        assert_eq!(gateway(&engine), [("orders".to_string(), 7.0)]);

        // An invalid gateway rule beside a changed flow rule: the document is refused whole.
        put(&rt, &mut client, &doc(7).replace(r#""count": 7"#, r#""count": -1"#).replace("3.0", "30.0"));
        assert!(source.wait_for(3, WAIT));
        match source.last_error() {
            Some(EtcdSourceError::InvalidGateway { key, error, .. }) => {
                assert_eq!((key.as_str(), error.field()), (KEY, "count"), "{error}")
            }
            other => panic!("expected an invalid gateway rule, got {other:?}"),
        }
        put(&rt, &mut client, &doc(7).replace("gwFlowRules", "gwFlowRule"));
        assert!(source.wait_for(4, WAIT));
        assert!(matches!(source.last_error(), Some(EtcdSourceError::Parse { .. })), "{:?}", source.last_error());
        assert_in_force(&engine, 7.0, &["/orders/**", "/checkout"]);

        wait_until("connected", || source.is_connected());
        let restart = |restarted: &Sentinel, etcd: &EtcdServer| {
            let again = start(restarted, etcd);
            assert!(again.wait_for(1, WAIT));
            again
        };
        pushes_survive_a_restart_and_the_store_going_down(&engine, source, &mut etcd, restart, |e| e.kill());
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper_store {
    use super::*;
    use remote_source::{wait_until, WAIT};
    use sentinel_runtime::datasource::{ZookeeperDataSource, ZookeeperSourceError};
    use sentinel_runtime::RuleKind;
    use sentinel_testkit::zookeeper::ZookeeperServer;
    use zookeeper_client as zk;

    const FLOW: &str = "/SENTINEL_GROUP/shop-flow-rules";
    const RULES: &str = "/SENTINEL_GROUP/shop-gw-flow-rules";
    const APIS: &str = "/SENTINEL_GROUP/shop-gw-api-definitions";

    fn start(engine: &Sentinel, server: &ZookeeperServer) -> ZookeeperDataSource {
        ZookeeperDataSource::builder(server.connect_string())
            .rules(RuleKind::Flow, FLOW)
            .gateway_rules(RULES)
            // Java's `/{groupId}/{dataId}`.
            .api_definitions_at("SENTINEL_GROUP", "shop-gw-api-definitions")
            .retry_max(std::time::Duration::from_millis(200))
            .session_timeout(std::time::Duration::from_secs(2))
            .start(engine)
            .unwrap()
    }

    fn set(rt: &tokio::runtime::Runtime, client: &zk::Client, path: &str, value: &str) {
        rt.block_on(async {
            match client.set_data(path, value.as_bytes(), None).await {
                Ok(_) => {}
                Err(zk::Error::NoNode) => {
                    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    match client.mkdir("/SENTINEL_GROUP", &options).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => panic!("mkdir: {e}"),
                    }
                    client.create(path, value.as_bytes(), &options).await.expect("create");
                }
                Err(e) => panic!("set {path}: {e}"),
            }
        })
    }

    #[test]
    fn zookeeper_gateway_nodes_load_take_pushes_refuse_bad_documents_and_store_the_dashboards_writes() {
        let Some(mut server) = ZookeeperServer::start("zookeeper_gateway_nodes_load") else { return };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = rt.block_on(zk::Client::connect(&server.connect_string())).expect("connect to ZooKeeper");
        set(&rt, &client, FLOW, &flow("api", 3.0));
        set(&rt, &client, RULES, &gw_rules(5));
        let engine = Sentinel::builder().build();
        let source = start(&engine, &server);
        assert!(source.wait_for(3, WAIT), "two nodes read, one missing");
        assert_eq!(gateway(&engine), [("orders".to_string(), 5.0)]);
        assert!(engine.api_definitions().is_empty(), "the missing node changes nothing");

        set(&rt, &client, APIS, &gw_apis("/checkout"));
        assert!(source.wait_for(4, WAIT), "the watch delivers the new node");
        assert_eq!(api_paths(&engine), ["/orders/**", "/checkout"]);

        set(&rt, &client, RULES, r#"[{"resource": "orders", "count": 1, "paramItem": {"parseStrategy": 2}}]"#);
        assert!(source.wait_for(5, WAIT));
        match source.last_error() {
            Some(ZookeeperSourceError::InvalidGateway { path, error }) => {
                assert_eq!((path.as_str(), error.field()), (RULES, "param_item.field_name"), "{error}")
            }
            other => panic!("expected an invalid gateway rule, got {other:?}"),
        }
        set(&rt, &client, APIS, "[{\"apiName\": ");
        assert!(source.wait_for(6, WAIT));
        assert!(matches!(source.last_error(), Some(ZookeeperSourceError::Parse { .. })), "{:?}", source.last_error());
        assert_in_force(&engine, 5.0, &["/orders/**", "/checkout"]);

        // The write-back replaces the refused documents (at the versions the source saw).
        wait_until("connected", || source.is_connected());
        let restart = |restarted: &Sentinel, server: &ZookeeperServer| {
            let again = start(restarted, server);
            assert!(again.wait_for(3, WAIT));
            again
        };
        pushes_survive_a_restart_and_the_store_going_down(&engine, source, &mut server, restart, |s| s.kill());
    }
}
