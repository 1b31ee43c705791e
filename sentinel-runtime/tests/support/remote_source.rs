//! What the etcd and ZooKeeper data-source tests share. Include it with
//! `#[path = "support/remote_source.rs"] mod remote_source;`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use sentinel_runtime::datasource::{parse_rules, Format};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::Sentinel;
use sentinel_testkit::http::post_form;

/// The longest a test waits for an event (a server start, a watch delivering a change).
pub const WAIT: Duration = Duration::from_secs(10);

/// One QPS flow rule, as Java's JSON.
pub fn flow(resource: &str, count: f64) -> String {
    format!(r#"[{{"resource": "{resource}", "count": {count:?}, "grade": 1}}]"#)
}

/// The engine's flow rules as (resource, count).
pub fn counts(engine: &Sentinel) -> Vec<(String, f64)> {
    engine.flow_rules().into_iter().map(|r| (r.resource, r.count)).collect()
}

/// The resources of a stored flow-rule document.
pub fn resources(stored: &str) -> Vec<String> {
    parse_rules::<FlowRule>(stored, Format::Json)
        .expect("a flow rule document")
        .into_iter()
        .map(|r| r.resource)
        .collect()
}

/// Waits (at most [`WAIT`]) until `cond` holds, checking every 10 ms; panics with `what` otherwise. (This
/// waits for an event, never for time to pass.)
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "not within {WAIT:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `setRules?type=flow` through the command center, as the dashboard posts it: (status, trimmed body).
pub fn push(center: &CommandCenter, data: &str) -> (u16, String) {
    let r = post_form(center.local_addr(), "/setRules", &[("type", "flow"), ("data", data)], &[]);
    (r.status, r.body.trim().to_string())
}

pub const SET_A: &str = r#"[{"resource": "a1", "count": 1.0}, {"resource": "a2", "count": 2.0}]"#;
pub const SET_B: &str =
    r#"[{"resource": "b1", "count": 3.0}, {"resource": "b2", "count": 4.0}, {"resource": "b3", "count": 5.0}]"#;

/// Two command centers push at once; the store ends with one of the two sets whole and, if one was told
/// `partial success`, the other's. Returns the replies.
///
/// A writer is told `success` only if its set went in: when neither set is in the store, both must have been
/// told (a store error that both writes met, say under a load that delays the store's answers); the store then
/// kept its rules whole, and the two race again, at most three times in all.
pub fn race(
    center_a: &CommandCenter,
    center_b: &CommandCenter,
    mut stored: impl FnMut() -> String,
) -> [(u16, String); 2] {
    let failed = sentinel_runtime::transport::WRITE_DATA_SOURCE_FAILED;
    for _ in 0..3 {
        let (ra, rb) = std::thread::scope(|s| {
            let ha = s.spawn(|| push(center_a, SET_A));
            let hb = s.spawn(|| push(center_b, SET_B));
            (ha.join().unwrap(), hb.join().unwrap())
        });
        let rules = resources(&stored());
        let told = [&ra, &rb].iter().filter(|r| r.1 == failed).count();
        if rules != ["a1", "a2"] && rules != ["b1", "b2", "b3"] {
            assert_eq!(told, 2, "a writer told `success` finds its set in the store: {rules:?} ({ra:?} {rb:?})");
            continue;
        }
        // Either they wrote in turn (the second had seen the first's change) or they raced and one was told.
        assert!(told <= 1, "{ra:?} {rb:?}");
        if told == 1 {
            let winner = if ra.1 == "success" { vec!["a1", "a2"] } else { vec!["b1", "b2", "b3"] };
            assert_eq!(rules, winner, "the store keeps the winner's rules");
        }
        return [ra, rb];
    }
    panic!("three races in a row ended with neither set in the store");
}
