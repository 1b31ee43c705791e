//! The etcd data source against a real `etcd` (started by the test on its own ports, in its own directory):
//! rules loaded at start, changes applied through the watch, bad documents and deleted keys reported with the
//! rules in force kept, no update missed or applied twice across a server restart, write-back from the
//! command center with a transaction on the key's revision.
#![cfg(all(feature = "etcd", feature = "transport"))]

#[path = "support/remote_source.rs"]
mod remote_source;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use remote_source::{counts, flow, push, race, wait_until, WAIT};
use sentinel_runtime::datasource::{EtcdDataSource, EtcdReload, EtcdSourceError, RuleSet, WritableDataSource};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::{RuleKind, Sentinel};
use sentinel_testkit::etcd::EtcdServer;

const KEY: &str = "/sentinel/shop/flow-rules";

/// A runtime and a plain etcd client: "another client" of the store.
struct Other {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl Other {
    fn connect(url: &str) -> Other {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = rt.block_on(Client::connect([url], None)).expect("connect to etcd");
        Other { rt, client }
    }
    fn put(&mut self, key: &str, value: &str) -> i64 {
        let r = self.rt.block_on(self.client.put(key, value, None)).expect("put");
        r.header().unwrap().revision()
    }
    fn delete(&mut self, key: &str) {
        self.rt.block_on(self.client.delete(key, None)).expect("delete");
    }
    fn get(&mut self, key: &str) -> Option<String> {
        let r = self.rt.block_on(self.client.get(key, None)).expect("get");
        r.kvs().first().map(|kv| kv.value_str().unwrap().to_string())
    }
}

fn source(engine: &Sentinel, url: &str) -> EtcdDataSource {
    EtcdDataSource::builder(url).rules(RuleKind::Flow, KEY).retry_max(Duration::from_millis(200)).start(engine).unwrap()
}

#[test]
fn etcd_rules_present_at_start_load_and_a_change_by_another_client_is_in_force_within_a_second() {
    let Some(etcd) = EtcdServer::start("etcd_rules_present_at_start_load") else { return };
    let mut other = Other::connect(&etcd.url());
    other.put(KEY, &flow("api", 3.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &etcd.url());
    assert!(source.wait_for(1, WAIT), "the initial read");
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)]);

    // The change arrives through the watch (no polling); how fast depends on the machine, so the test waits for
    // the event instead of timing it.
    other.put(KEY, &flow("api", 7.0));
    assert!(source.wait_for(2, WAIT), "the watch delivers the change");
    assert_eq!(counts(&engine), [("api".to_string(), 7.0)]);
    let status = source.status();
    assert_eq!((status.kind.as_str(), status.connected, status.last_error), ("etcd", true, None));
    assert!(status.last_load_ms.is_some());
}

#[test]
fn etcd_bad_document_and_deleted_key_are_reported_and_the_rules_in_force_stay() {
    let Some(etcd) = EtcdServer::start("etcd_bad_document_and_deleted_key") else { return };
    let mut other = Other::connect(&etcd.url());
    other.put(KEY, &flow("api", 3.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &etcd.url());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    source.on_reload(move |r| log.lock().unwrap().push(r.clone()));
    assert!(source.wait_for(1, WAIT));

    other.put(KEY, "[{\"resource\": \"api\", \"count\": ");
    assert!(source.wait_for(2, WAIT));
    assert!(matches!(source.last_error(), Some(EtcdSourceError::Parse { .. })), "{:?}", source.last_error());
    other.put(KEY, r#"[{"resource": "api", "count": -1}]"#);
    assert!(source.wait_for(3, WAIT));
    assert!(matches!(source.last_error(), Some(EtcdSourceError::Invalid { .. })), "{:?}", source.last_error());
    other.delete(KEY);
    assert!(source.wait_for(4, WAIT));
    assert!(matches!(source.last_error(), Some(EtcdSourceError::Deleted { .. })), "{:?}", source.last_error());
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)], "the rules in force stay through all three");
    assert!(source.status().last_error.unwrap().contains("deleted"));
    let rejected = seen.lock().unwrap().iter().filter(|r| matches!(r, EtcdReload::Rejected(_))).count();
    assert_eq!(rejected, 3, "each was reported to the listeners");

    other.put(KEY, &flow("api", 4.0));
    assert!(source.wait_for(5, WAIT));
    assert_eq!(counts(&engine), [("api".to_string(), 4.0)]);
    assert!(source.last_error().is_none(), "a good document clears the error");
}

#[test]
fn etcd_watch_resumed_after_a_restart_misses_none_of_100_revisions_and_applies_none_twice() {
    let Some(mut etcd) = EtcdServer::start("etcd_watch_resumed_after_a_restart") else { return };
    let mut other = Other::connect(&etcd.url());
    let first = other.put(KEY, &flow("api", 1.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &etcd.url());
    let applied = Arc::new(Mutex::new(Vec::new()));
    let log = applied.clone();
    source.on_reload(move |r| {
        match r {
            // The initial read may come before this listener: only the later revisions are counted.
            EtcdReload::Applied { revision, .. } if *revision > first => log.lock().unwrap().push(*revision),
            _ => {}
        }
    });
    assert!(source.wait_for(1, WAIT));
    wait_until("the watch is established", || source.is_connected());

    etcd.kill();
    wait_until("the loss is noticed", || !source.is_connected());
    etcd.restart();
    let mut other = Other::connect(&etcd.url());
    let mut revisions = Vec::new();
    for i in 2..=101 {
        revisions.push(other.put(KEY, &flow("api", i as f64)));
    }
    wait_until("the 100 updates are applied", || applied.lock().unwrap().len() == 100);
    assert_eq!(*applied.lock().unwrap(), revisions, "every revision once, in order");
    assert_eq!(counts(&engine), [("api".to_string(), 101.0)]);
}

#[test]
fn etcd_push_through_the_command_center_is_stored_and_a_new_engine_reads_it_back() {
    let Some(etcd) = EtcdServer::start("etcd_push_through_the_command_center") else { return };
    let engine = Sentinel::builder().build();
    let source = source(&engine, &etcd.url());
    assert!(source.wait_for(1, WAIT), "the missing key is reported");
    wait_until("connected", || source.is_connected());
    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    assert_eq!(push(&center, &flow("api", 9.0)), (200, "success".to_string()));
    assert_eq!(counts(&engine), [("api".to_string(), 9.0)]);

    let stored = Other::connect(&etcd.url()).get(KEY).expect("the key is written");
    assert!(stored.contains("\"count\": 9.0"), "{stored}");
    // A restart of the engine: a new one reads it back.
    drop(center);
    let restarted = Sentinel::builder().build();
    let again = self::source(&restarted, &etcd.url());
    assert!(again.wait_for(1, WAIT));
    assert_eq!(counts(&restarted), [("api".to_string(), 9.0)]);
}

#[test]
fn etcd_two_engines_pushing_end_with_one_rule_set_whole_and_the_stale_writer_is_told() {
    let Some(etcd) = EtcdServer::start("etcd_two_engines_pushing") else { return };
    let mut other = Other::connect(&etcd.url());
    other.put(KEY, &flow("api", 1.0));
    let (a, b) = (Sentinel::builder().build(), Sentinel::builder().build());
    let (source_a, source_b) = (source(&a, &etcd.url()), source(&b, &etcd.url()));
    assert!(source_a.wait_for(1, WAIT) && source_b.wait_for(1, WAIT));
    let b_view = Arc::new(source_b);
    let center_a = CommandCenter::builder(&a).port(0).data_source(source_a).start().unwrap();
    let center_b = CommandCenter::builder(&b).port(0).data_source(b_view.clone()).start().unwrap();
    race(&center_a, &center_b, || other.get(KEY).unwrap());

    // A stale writer: another client changes the key and B writes at once; unless its watch showed it the
    // change first, B expects the revision it saw before and is refused.
    let before_watch = b_view.events();
    other.put(KEY, &flow("z", 8.0));
    let stale = b_view.write_rules(&RuleSet::new().with_flow(vec![FlowRule::new("b").count(1.0)]));
    match stale {
        Err(e) => {
            assert!(e.to_string().contains("another writer"), "{e}");
            assert!(other.get(KEY).unwrap().contains("\"z\""), "the store keeps the other writer's rules");
        }
        // The watch was faster than the write: B had seen the change, so its write is a deliberate one.
        Ok(()) => assert!(b_view.events() > before_watch),
    }
}

/// Turns authentication on: `root`, and `sentinel` (password `secret`) allowed to read and write `/sentinel/`.
fn enable_auth(other: &mut Other) {
    other.rt.block_on(async {
        let c = &mut other.client;
        c.user_add("root", "rootpw", None).await.expect("add root");
        c.user_grant_role("root", "root").await.expect("grant root");
        c.user_add("sentinel", "secret", None).await.expect("add user");
        c.role_add("rules").await.expect("add role");
        c.role_grant_permission("rules", etcd_client::Permission::read_write("/sentinel/").with_prefix())
            .await
            .expect("grant");
        c.user_grant_role("sentinel", "rules").await.expect("grant role");
        c.auth_enable().await.expect("enable auth");
    });
}

#[test]
fn etcd_credentials_from_the_url_or_the_builder_are_used_and_missing_ones_are_reported() {
    let Some(etcd) = EtcdServer::start("etcd_credentials_from_the_url_or_the_builder") else { return };
    let mut other = Other::connect(&etcd.url());
    other.put(KEY, &flow("api", 6.0));
    enable_auth(&mut other);

    let engine = Sentinel::builder().build();
    let without = source(&engine, &etcd.url());
    wait_until("refused without credentials", || {
        without.last_error().is_some_and(|e| matches!(e, EtcdSourceError::Unavailable { .. }))
    });
    assert!(engine.flow_rules().is_empty());
    drop(without);

    let in_url = EtcdDataSource::builder(etcd.url().replace("http://", "http://sentinel:secret@"))
        .rules(RuleKind::Flow, KEY)
        .start(&engine)
        .unwrap();
    assert!(in_url.wait_for(1, WAIT));
    assert_eq!(counts(&engine), [("api".to_string(), 6.0)]);
    drop(in_url);

    let restarted = Sentinel::builder().build();
    let by_builder = EtcdDataSource::builder(etcd.url())
        .rules(RuleKind::Flow, KEY)
        .credentials("sentinel", "secret")
        .start(&restarted)
        .unwrap();
    assert!(by_builder.wait_for(1, WAIT));
    assert_eq!(counts(&restarted), [("api".to_string(), 6.0)]);
}

#[test]
fn etcd_adaptive_rules_from_another_client_and_from_the_command_center_are_in_force_and_a_bad_one_is_refused() {
    let Some(etcd) = EtcdServer::start("etcd_adaptive_rules") else { return };
    const ADAPTIVE: &str = "/sentinel/shop/adaptive-rules";
    let mut other = Other::connect(&etcd.url());
    other.put(
        ADAPTIVE,
        r#"[{"resource": "db", "algorithm": "gradient2", "minLimit": 2, "initialLimit": 6, "maxLimit": 30}]"#,
    );
    let start = |engine: &Sentinel| {
        EtcdDataSource::builder(etcd.url())
            .rules(RuleKind::Adaptive, ADAPTIVE)
            .retry_max(Duration::from_millis(200))
            .start(engine)
            .unwrap()
    };
    let engine = Sentinel::builder().build();
    let source = start(&engine);
    assert!(source.wait_for(1, WAIT), "the initial read");
    assert_eq!(engine.adaptive_rules()[0].max_limit, 30);
    wait_until("connected", || source.is_connected());

    // A bad document from another client (shares over 1): reported, the rules in force stay.
    other.put(ADAPTIVE, r#"[{"resource": "db", "partitions": {"a": 0.8, "b": 0.8}}]"#);
    assert!(source.wait_for(2, WAIT), "the watch delivers the change");
    assert_eq!(engine.adaptive_rules()[0].max_limit, 30, "the rules in force stay");
    assert!(source.status().last_error.is_some_and(|e| e.contains("partitions")), "{:?}", source.status());

    let center = CommandCenter::builder(&engine).port(0).data_source(source).start().unwrap();
    let data = r#"[{"resource": "db", "algorithm": "aimd", "minLimit": 1, "initialLimit": 4, "maxLimit": 12}]"#;
    let r = sentinel_testkit::http::post_form(
        center.local_addr(),
        "/setRules",
        &[("type", "adaptive"), ("data", data)],
        &[],
    );
    assert_eq!((r.status, r.body.trim()), (200, "success"));
    let stored = other.get(ADAPTIVE).expect("written back");
    assert!(stored.contains("\"maxLimit\": 12"), "{stored}");
    drop(center);
    let restarted = Sentinel::builder().build();
    let again = start(&restarted);
    assert!(again.wait_for(1, WAIT));
    assert_eq!(restarted.adaptive_rules(), engine.adaptive_rules(), "a new engine reads it back");
}

/// etcd's simple auth tokens end (after `--auth-token-ttl`, 5 minutes by default, and at once when the user's
/// password is set, even to the same one); Java's jetcd authenticates again when its token is refused. A
/// source connected for longer than a token lives must still write pushes back.
#[test]
fn etcd_a_write_back_after_the_auth_token_ended_authenticates_again() {
    let Some(etcd) = EtcdServer::start("etcd_a_write_back_after_the_auth_token_ended") else { return };
    let mut other = Other::connect(&etcd.url());
    other.put(KEY, &flow("api", 6.0));
    enable_auth(&mut other);
    let engine = Sentinel::builder().build();
    let source = EtcdDataSource::builder(etcd.url())
        .rules(RuleKind::Flow, KEY)
        .credentials("sentinel", "secret")
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, WAIT));
    wait_until("connected", || source.is_connected());
    assert!(source.write_rules(&RuleSet::new().with_flow(vec![FlowRule::new("api").count(7.0)])).is_ok());
    // The token this source holds ends: the password is set again (to the same one).
    other.rt.block_on(async {
        let options = etcd_client::ConnectOptions::new().with_user("root", "rootpw");
        let mut root = Client::connect([etcd.url()], Some(options)).await.expect("connect as root");
        root.user_change_password("sentinel", "secret").await.expect("set the password");
    });
    let written = source.write_rules(&RuleSet::new().with_flow(vec![FlowRule::new("api").count(8.0)]));
    assert!(written.is_ok(), "{written:?}");
}

/// A push's write-back that lands after the watch applied another writer's change: the store then holds the
/// push (the write expected the revision the watch had shown, so it is a deliberate one), and the engine must
/// end with it too, as a Java app ends with what its data source last reads; it must not take the write for
/// what is in force while it runs the other writer's rules.
#[test]
fn etcd_a_write_back_landing_after_the_watch_applied_another_change_is_what_the_engine_ends_with() {
    let Some(etcd) = EtcdServer::start("etcd_a_write_back_landing_after_the_watch") else { return };
    let mut other = Other::connect(&etcd.url());
    other.put(KEY, &flow("api", 1.0));
    let engine = Sentinel::builder().build();
    let source = source(&engine, &etcd.url());
    assert!(source.wait_for(1, WAIT));
    wait_until("connected", || source.is_connected());
    // The push: in force, its snapshot taken for the write-back...
    engine.load_flow_rules([FlowRule::new("api").count(5.0)]).unwrap();
    let push = RuleSet::snapshot(&engine, &[RuleKind::Flow]);
    // ... another writer's change is applied by the watch before the write-back runs...
    other.put(KEY, &flow("api", 7.0));
    wait_until("the other change is applied", || counts(&engine) == [("api".to_string(), 7.0)]);
    // ... then the write-back.
    source.write_rules(&push).unwrap();
    assert!(other.get(KEY).unwrap().contains("5.0"), "the key holds the push");
    wait_until("the engine runs what the key holds", || counts(&engine) == [("api".to_string(), 5.0)]);
}
