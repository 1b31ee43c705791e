//! The ZooKeeper data source against a real ZooKeeper (Debian's `zookeeperd` jar, started by the test on its
//! own port, in its own directory): rules loaded at start, changes applied through the watch, bad documents
//! and deleted nodes reported with the rules in force kept, updates made while the server was down applied
//! after it is back, write-back from the command center with a version check, digest auth.
#![cfg(all(feature = "zookeeper", feature = "transport"))]

#[path = "support/remote_source.rs"]
mod remote_source;

use std::sync::Arc;
use std::time::Duration;

use remote_source::{counts, flow, push, race, wait_until, WAIT};
use sentinel_runtime::datasource::{ZookeeperDataSource, ZookeeperSourceError};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::{RuleKind, Sentinel};
use sentinel_testkit::zookeeper::ZookeeperServer;
use zookeeper_client as zk;

/// Java's `/{groupId}/{dataId}`.
const GROUP: &str = "SENTINEL_GROUP";
const DATA_ID: &str = "shop-flow-rules";
const PATH: &str = "/SENTINEL_GROUP/shop-flow-rules";

/// A runtime and a plain ZooKeeper client: "another client" of the store.
struct Other {
    rt: tokio::runtime::Runtime,
    client: zk::Client,
}

impl Other {
    fn connect(server: &ZookeeperServer) -> Other {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = rt.block_on(zk::Client::connect(&server.connect_string())).expect("connect to ZooKeeper");
        Other { rt, client }
    }
    fn set(&self, path: &str, value: &str) {
        self.rt.block_on(async {
            match self.client.set_data(path, value.as_bytes(), None).await {
                Ok(_) => {}
                Err(zk::Error::NoNode) => {
                    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    let (parent, _) = path.rsplit_once('/').unwrap();
                    match self.client.mkdir(parent, &options).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => panic!("mkdir {parent}: {e}"),
                    }
                    self.client.create(path, value.as_bytes(), &options).await.expect("create");
                }
                Err(e) => panic!("set {path}: {e}"),
            }
        })
    }
    fn delete(&self, path: &str) {
        self.rt.block_on(self.client.delete(path, None)).expect("delete");
    }
    fn get(&self, path: &str) -> String {
        let (data, _) = self.rt.block_on(self.client.get_data(path)).expect("get");
        String::from_utf8(data).unwrap()
    }
}

fn source(engine: &Sentinel, server: &ZookeeperServer) -> ZookeeperDataSource {
    ZookeeperDataSource::builder(server.connect_string())
        .rules_at(RuleKind::Flow, GROUP, DATA_ID)
        .retry_max(Duration::from_millis(200))
        .session_timeout(Duration::from_secs(2))
        .start(engine)
        .unwrap()
}

#[test]
fn zookeeper_rules_at_group_and_data_id_load_and_a_change_is_in_force_within_a_second() {
    let Some(server) = ZookeeperServer::start("zookeeper_rules_at_group_and_data_id_load") else { return };
    let other = Other::connect(&server);
    other.set(PATH, &flow("api", 3.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &server);
    assert!(source.wait_for(1, WAIT), "the initial read");
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)]);

    // The change arrives through the watch (no polling); how fast depends on the machine, so the test waits for
    // the event instead of timing it.
    other.set(PATH, &flow("api", 7.0));
    assert!(source.wait_for(2, WAIT), "the watch delivers the change");
    assert_eq!(counts(&engine), [("api".to_string(), 7.0)]);
    let status = sentinel_runtime::datasource::WritableDataSource::status(&source);
    assert_eq!((status.kind.as_str(), status.connected, status.last_error), ("zookeeper", true, None));
    assert!(status.target.contains(PATH), "{}", status.target);
}

#[test]
fn zookeeper_bad_document_and_deleted_node_are_reported_and_the_rules_in_force_stay() {
    let Some(server) = ZookeeperServer::start("zookeeper_bad_document_and_deleted_node") else { return };
    let other = Other::connect(&server);
    other.set(PATH, &flow("api", 3.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &server);
    assert!(source.wait_for(1, WAIT));

    other.set(PATH, "[{\"resource\": \"api\", \"count\": ");
    assert!(source.wait_for(2, WAIT));
    assert!(matches!(source.last_error(), Some(ZookeeperSourceError::Parse { .. })), "{:?}", source.last_error());
    other.set(PATH, r#"[{"resource": "api", "count": -1}]"#);
    assert!(source.wait_for(3, WAIT));
    assert!(matches!(source.last_error(), Some(ZookeeperSourceError::Invalid { .. })), "{:?}", source.last_error());
    other.delete(PATH);
    assert!(source.wait_for(4, WAIT));
    assert!(matches!(source.last_error(), Some(ZookeeperSourceError::Deleted { .. })), "{:?}", source.last_error());
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)], "the rules in force stay through all three");

    other.set(PATH, &flow("api", 4.0));
    wait_until("a recreated node is applied", || counts(&engine) == [("api".to_string(), 4.0)]);
    assert!(source.last_error().is_none(), "a good document clears the error");
}

#[test]
fn zookeeper_clear_on_delete_clears_a_deleted_nodes_rules_as_java_does_and_a_node_missing_at_start_changes_nothing() {
    let Some(server) = ZookeeperServer::start("zookeeper_clear_on_delete") else { return };
    let other = Other::connect(&server);
    let engine = Sentinel::builder().build();
    engine.load_flow_rules([FlowRule::new("local").count(1.0)]).unwrap();
    let source = ZookeeperDataSource::builder(server.connect_string())
        .rules_at(RuleKind::Flow, GROUP, DATA_ID)
        .clear_on_delete(true)
        .retry_max(Duration::from_millis(200))
        .session_timeout(Duration::from_secs(2))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, WAIT), "the initial read finds no node");
    assert_eq!(counts(&engine), [("local".to_string(), 1.0)], "a node missing at start changes nothing");

    other.set(PATH, &flow("api", 3.0));
    wait_until("the created node is applied", || counts(&engine) == [("api".to_string(), 3.0)]);
    other.delete(PATH);
    wait_until("the delete clears the kind's rules", || engine.flow_rules().is_empty());
    assert!(matches!(source.last_error(), Some(ZookeeperSourceError::Deleted { .. })), "{:?}", source.last_error());
}

#[test]
fn zookeeper_updates_made_while_the_server_was_down_are_applied_after_it_is_back() {
    let Some(mut server) = ZookeeperServer::start("zookeeper_updates_made_while_the_server_was_down") else {
        return;
    };
    Other::connect(&server).set(PATH, &flow("api", 1.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &server);
    assert!(source.wait_for(1, WAIT));
    wait_until("connected", || source.is_connected());

    server.kill();
    wait_until("the loss is noticed", || !source.is_connected());
    server.restart();
    // Written by another client as soon as the server is back, before the source has necessarily reconnected.
    Other::connect(&server).set(PATH, &flow("api", 42.0));
    wait_until("the update is applied after reconnecting", || counts(&engine) == [("api".to_string(), 42.0)]);
    wait_until("connected again", || source.is_connected());
}

#[test]
fn zookeeper_push_through_the_command_center_is_stored_and_a_new_engine_reads_it_back() {
    let Some(server) = ZookeeperServer::start("zookeeper_push_through_the_command_center") else { return };
    let engine = Sentinel::builder().build();
    let source = source(&engine, &server);
    assert!(source.wait_for(1, WAIT), "the missing node is reported");
    wait_until("connected", || source.is_connected());
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    assert_eq!(push(&center, &flow("api", 9.0)), (200, "success".to_string()), "the node and its parent are created");
    assert_eq!(push(&center, &flow("api", 10.0)), (200, "success".to_string()), "then updated at its version");
    assert!(Other::connect(&server).get(PATH).contains("\"count\": 10.0"));

    drop(center);
    let restarted = Sentinel::builder().build();
    let again = self::source(&restarted, &server);
    assert!(again.wait_for(1, WAIT));
    assert_eq!(counts(&restarted), [("api".to_string(), 10.0)]);
}

#[test]
fn zookeeper_two_engines_pushing_end_with_one_rule_set_whole() {
    let Some(server) = ZookeeperServer::start("zookeeper_two_engines_pushing") else { return };
    let other = Other::connect(&server);
    other.set(PATH, &flow("api", 1.0));
    let (a, b) = (Sentinel::builder().build(), Sentinel::builder().build());
    let (source_a, source_b) = (source(&a, &server), source(&b, &server));
    assert!(source_a.wait_for(1, WAIT) && source_b.wait_for(1, WAIT));
    wait_until("connected", || source_a.is_connected() && source_b.is_connected());
    let center_a = CommandCenter::builder(&a).port(0).data_source(source_a).start().unwrap();
    let center_b = CommandCenter::builder(&b).port(0).data_source(Arc::new(source_b)).start().unwrap();
    race(&center_a, &center_b, || other.get(PATH));
}

#[test]
fn zookeeper_digest_credentials_reach_a_node_only_they_may_read() {
    let Some(server) = ZookeeperServer::start("zookeeper_digest_credentials") else { return };
    // A node readable and writable only by `sentinel:secret` (ACL digest = base64(sha1("sentinel:secret"))).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let owner = zk::Client::connector()
            .with_auth("digest", b"sentinel:secret")
            .connect(&server.connect_string())
            .await
            .expect("connect with digest auth");
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        owner.mkdir("/secure", &open).await.expect("mkdir");
        let creator_only = zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all());
        owner.create("/secure/flow", flow("api", 6.0).as_bytes(), &creator_only).await.expect("create");
    });
    let engine = Sentinel::builder().build();
    let without = ZookeeperDataSource::builder(server.connect_string())
        .rules(RuleKind::Flow, "/secure/flow")
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    wait_until("refused without credentials", || {
        without.last_error().is_some_and(|e| matches!(e, ZookeeperSourceError::Unavailable { .. }))
    });
    assert!(engine.flow_rules().is_empty());
    drop(without);
    let with = ZookeeperDataSource::builder(format!("zk://sentinel:secret@{}", server.connect_string()))
        .rules(RuleKind::Flow, "/secure/flow")
        .start(&engine)
        .unwrap();
    assert!(with.wait_for(1, WAIT));
    assert_eq!(counts(&engine), [("api".to_string(), 6.0)]);
}

/// A push's write-back that lands after the watch applied another writer's change: the node then holds the
/// push (written at the version the watch had shown), and the engine must end with it too, as a Java app
/// ends with what its data source last reads.
#[test]
fn zookeeper_a_write_back_landing_after_the_watch_applied_another_change_is_what_the_engine_ends_with() {
    use sentinel_runtime::datasource::{RuleSet, WritableDataSource};
    let Some(server) = ZookeeperServer::start("zookeeper_a_write_back_landing_after_the_watch") else { return };
    let other = Other::connect(&server);
    other.set(PATH, &flow("api", 1.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &server);
    assert!(source.wait_for(1, WAIT));
    wait_until("connected", || source.is_connected());
    engine.load_flow_rules([sentinel_runtime::flow::FlowRule::new("api").count(5.0)]).unwrap();
    let push = RuleSet::snapshot(&engine, &[RuleKind::Flow]);
    other.set(PATH, &flow("api", 7.0));
    wait_until("the other change is applied", || counts(&engine) == [("api".to_string(), 7.0)]);
    source.write_rules(&push).unwrap();
    assert!(other.get(PATH).contains("5.0"), "the node holds the push");
    wait_until("the engine runs what the node holds", || counts(&engine) == [("api".to_string(), 5.0)]);
}
