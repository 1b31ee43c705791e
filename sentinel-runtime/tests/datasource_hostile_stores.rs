//! Rule stores with hostile contents or behaviour (review): a Redis key that holds no text, an etcd delete
//! hidden by a compaction while the source was cut off.
#![cfg(all(feature = "etcd", feature = "cluster-redis"))]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sentinel_runtime::cluster::{RedisDataSource, RedisSourceError};
use sentinel_runtime::datasource::{EtcdDataSource, EtcdSourceError, RuleSet, WritableDataSource};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{RuleKind, Sentinel};
use sentinel_testkit::etcd::EtcdServer;
use sentinel_testkit::redis::RedisServer;

const WAIT: Duration = Duration::from_secs(10);

fn counts(engine: &Sentinel) -> Vec<(String, f64)> {
    engine.flow_rules().into_iter().map(|r| (r.resource, r.count)).collect()
}

/// A key of a Redis source that holds something other than text (bytes that are not UTF-8, or a list) or
/// more than a source reads (16 MiB) is reported as that key's bad document; the other keys load, and the source follows its channels.
fn redis_key_holding_no_text(test: &str, store: impl FnOnce(&mut redis::Connection)) {
    let Some(redis) = RedisServer::start(test) else { return };
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    store(&mut conn);
    redis::cmd("SET")
        .arg("degrade")
        .arg(r#"[{"resource": "db", "count": 5, "timeWindow": 10}]"#)
        .query::<()>(&mut conn)
        .unwrap();
    let engine = Sentinel::builder().build();
    engine.load_flow_rules(vec![FlowRule::new("api").count(3.0)]).unwrap();
    let source = RedisDataSource::builder(redis.url())
        .rules(RuleKind::Degrade, "degrade", "degrade:changed")
        .rules(RuleKind::Flow, "flow", "flow:changed")
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(2, WAIT), "both keys are handled; last error: {:?}", source.last_error());
    assert!(
        matches!(source.last_error(), Some(RedisSourceError::Parse { ref key, .. }) if key == "flow"),
        "{:?}",
        source.last_error()
    );
    assert_eq!(engine.degrade_rules().len(), 1, "the other key loads");
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)], "the rules in force stay");
    let doc = r#"[{"resource": "api", "count": 7}]"#;
    redis::cmd("PUBLISH").arg("flow:changed").arg(doc).query::<()>(&mut conn).unwrap();
    assert!(source.wait_for(3, WAIT), "the source follows its channel");
    assert_eq!(counts(&engine), [("api".to_string(), 7.0)]);
}

#[test]
fn redis_a_key_holding_bytes_that_are_not_utf8_is_that_keys_parse_error_and_the_other_keys_load() {
    redis_key_holding_no_text("redis_a_key_holding_bytes_that_are_not_utf8", |conn| {
        redis::cmd("SET").arg("flow").arg(&b"[\xff\xfe]"[..]).query::<()>(conn).unwrap();
    });
}

#[test]
fn redis_a_key_holding_a_list_is_that_keys_parse_error_and_the_other_keys_load() {
    redis_key_holding_no_text("redis_a_key_holding_a_list", |conn| {
        redis::cmd("RPUSH").arg("flow").arg("[]").query::<()>(conn).unwrap();
    });
}

#[test]
fn redis_a_key_holding_more_than_16_mib_is_that_keys_parse_error_and_the_other_keys_load() {
    redis_key_holding_no_text("redis_a_key_holding_more_than_16_mib", |conn| {
        let doc = format!(r#"[{{"resource": "api", "count": 9}}{}]"#, " ".repeat(16 << 20));
        redis::cmd("SET").arg("flow").arg(doc).query::<()>(conn).unwrap();
    });
}

/// A message over 16 MiB, or a document of more than 100,000 rules, on a Redis source's channel is refused
/// (the rules in force stay); the source goes on following its channel.
#[test]
fn redis_a_message_too_large_or_with_too_many_rules_is_refused_and_the_source_goes_on() {
    let Some(redis) = RedisServer::start("redis_a_message_too_large") else { return };
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let engine = Sentinel::builder().build();
    engine.load_flow_rules(vec![FlowRule::new("api").count(3.0)]).unwrap();
    let source = RedisDataSource::builder(redis.url())
        .rules(RuleKind::Flow, "flow", "flow:changed")
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, WAIT), "the missing key is handled");
    let publish = |conn: &mut redis::Connection, doc: String| {
        redis::cmd("PUBLISH").arg("flow:changed").arg(doc).query::<()>(conn).unwrap();
    };
    let large = format!(r#"[{{"resource": "api", "count": 9}}{}]"#, " ".repeat(16 << 20));
    publish(&mut conn, large);
    assert!(source.wait_for(2, WAIT));
    let error = source.last_error().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("more than the 16777216"), "{error}");
    let many: Vec<String> = (0..100_001).map(|i| format!(r#"{{"resource": "r{i}", "count": 1}}"#)).collect();
    publish(&mut conn, format!("[{}]", many.join(",")));
    assert!(source.wait_for(3, WAIT));
    let error = source.last_error().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("100001 rules, more than the 100000"), "{error}");
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)], "the rules in force stay");
    publish(&mut conn, r#"[{"resource": "api", "count": 7}]"#.to_string());
    assert!(source.wait_for(4, WAIT), "the source follows its channel");
    assert_eq!(counts(&engine), [("api".to_string(), 7.0)]);
}

/// A TCP gate in front of a server: open, it relays; closed, it cuts every relayed connection and refuses
/// new ones (accepted, then closed at once).
struct Gate {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Gate {
    fn start(target: SocketAddr) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (o, c) = (open.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !o.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else { continue };
                let mut kept = c.lock().unwrap();
                kept.push(client.try_clone().unwrap());
                kept.push(server.try_clone().unwrap());
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Gate { addr, open, conns }
    }
    fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "not within {WAIT:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The key is deleted and the history compacted while the source is cut off: when it is back, it finds the
/// key gone, reports the delete (and clears with `clear_on_delete`), and a write-back, which nobody else is
/// racing, creates the key instead of failing as a conflict with a revision the key no longer has.
fn etcd_delete_hidden_by_a_compaction(test: &str, clear_on_delete: bool) {
    const KEY: &str = "/sentinel/shop/flow-rules";
    let Some(etcd) = EtcdServer::start(test) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut other = rt.block_on(etcd_client::Client::connect([etcd.url()], None)).unwrap();
    rt.block_on(other.put(KEY, r#"[{"resource": "api", "count": 3}]"#, None)).unwrap();
    let gate = Gate::start(etcd.addr());
    let engine = Sentinel::builder().build();
    let source = EtcdDataSource::builder(format!("http://{}", gate.addr))
        .rules(RuleKind::Flow, KEY)
        .clear_on_delete(clear_on_delete)
        .retry_max(Duration::from_millis(100))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, WAIT));
    wait_until("the watch is established", || source.is_connected());
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)]);

    gate.close();
    wait_until("the loss is noticed", || !source.is_connected());
    rt.block_on(other.delete(KEY, None)).unwrap();
    let rev = rt.block_on(other.put("/elsewhere", "x", None)).unwrap().header().unwrap().revision();
    rt.block_on(other.compact(rev, None)).unwrap();
    gate.open();
    assert!(source.wait_for(2, WAIT), "the key is read again after the compaction");
    wait_until("connected again", || source.is_connected());

    assert!(
        matches!(source.last_error(), Some(EtcdSourceError::Deleted { .. })),
        "the delete is reported: {:?}",
        source.last_error()
    );
    if clear_on_delete {
        assert!(engine.flow_rules().is_empty(), "clear_on_delete clears: {:?}", counts(&engine));
    } else {
        assert_eq!(counts(&engine), [("api".to_string(), 3.0)], "the rules in force stay");
    }
    let pushed = RuleSet::new().with_flow(vec![FlowRule::new("api").count(9.0)]);
    source.write_rules(&pushed).expect("a write-back nobody races succeeds");
    let stored = rt.block_on(other.get(KEY, None)).unwrap();
    assert!(stored.kvs().first().is_some_and(|kv| kv.value_str().unwrap().contains("9.0")), "{stored:?}");
}

#[test]
fn etcd_a_delete_hidden_by_a_compaction_is_reported_and_a_write_back_then_creates_the_key() {
    etcd_delete_hidden_by_a_compaction("etcd_a_delete_hidden_by_a_compaction", false);
}

#[test]
fn etcd_a_delete_hidden_by_a_compaction_clears_with_clear_on_delete() {
    etcd_delete_hidden_by_a_compaction("etcd_a_delete_hidden_by_a_compaction_clears", true);
}

/// A Redis user allowed what Java's `RedisDataSource` does (`GET` the key, `SUBSCRIBE` to the channel) and no
/// more, as a read-only configuration user is: its rules load, as Java's do.
#[test]
fn redis_a_user_allowed_get_and_subscribe_only_loads_its_rules() {
    let Some(redis) = RedisServer::start("redis_a_user_allowed_get_and_subscribe_only") else { return };
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let key = "sentinel:shop:flow-rules";
    redis::cmd("SET").arg(key).arg(r#"[{"resource": "api", "count": 3}]"#).query::<()>(&mut conn).unwrap();
    redis::cmd("ACL")
        .arg(&["SETUSER", "reader", "on", ">pw", "~sentinel:*", "&sentinel:*", "+get", "+subscribe", "+ping"][..])
        .query::<()>(&mut conn)
        .unwrap();
    let url = redis.url().replace("redis://", "redis://reader:pw@");
    let engine = Sentinel::builder().build();
    let source = RedisDataSource::builder(url)
        .rules(RuleKind::Flow, key, "sentinel:shop:flow-rules:changed")
        .retry_max(Duration::from_millis(200))
        .start(&engine)
        .unwrap();
    assert!(source.wait_for(1, Duration::from_secs(10)), "no document handled: {:?}", source.last_error());
    assert_eq!(counts(&engine), [("api".to_string(), 3.0)], "{:?}", source.last_error());
}
