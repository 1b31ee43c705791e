//! The link-time registry: descriptors of annotated functions, pre-built resources, and the warning logged when a
//! rule names no known resource.

mod common;

use std::sync::{Arc, Mutex};

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};
use sentinel_testkit::logs::{Logged, OnEvent};

#[sentinel_resource(name = "registry.queryOrder", block_handler = query_blocked)]
fn query_order(id: u64) -> u64 {
    id
}

fn query_blocked(_id: u64, _b: BlockError) -> u64 {
    0
}

#[sentinel_resource(name = "registry.asyncLookup")]
async fn async_lookup() -> Result<(), common::AppError> {
    Ok(())
}

/// A subscriber that records the message of every `WARN` event.
fn warnings(seen: Arc<Mutex<Vec<String>>>) -> OnEvent<impl Fn(Logged) + Send + Sync + 'static> {
    OnEvent(move |e: Logged| {
        if e.level == tracing::Level::WARN {
            seen.lock().unwrap().push(e.message);
        }
    })
}

#[test]
fn loading_a_rule_with_a_typo_warns_with_the_closest_registered_name() {
    let (engine, _clock) = common::engine();
    let seen = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(warnings(seen.clone()), || {
        engine
            .load_flow_rules([
                FlowRule::new("registry.queryOrdr").count(1.0),
                FlowRule::new("registry.queryOrder").count(1.0),
            ])
            .unwrap();
    });
    let seen = seen.lock().unwrap();
    assert_eq!(*seen, ["flow rule for `registry.queryOrdr` matches no resource; did you mean `registry.queryOrder`?"]);
}

#[test]
fn declared_names_stay_quiet() {
    let (engine, _clock) = common::engine();
    Sentinel::declare_resources(["registry.manualOnly"]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(warnings(seen.clone()), || {
        engine.load_flow_rules([FlowRule::new("registry.manualOnly").count(1.0)]).unwrap();
    });
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn registered_resources_can_be_prebuilt_in_an_engine() {
    let (engine, _clock) = common::engine();
    assert!(engine.cluster_stats("registry.queryOrder").is_none());
    let created = engine.prebuild_registered_resources();
    assert!(created >= 2, "{created}");
    assert!(engine.cluster_stats("registry.queryOrder").is_some());
    assert!(engine.resource_names().iter().any(|n| n == "registry.asyncLookup"));
    // The annotated function then uses the pre-built resource.
    assert_eq!(engine.scoped(|| query_order(4)), 4);
    assert_eq!(engine.cluster_stats("registry.queryOrder").unwrap().minute_pass, 1);
    let d = Sentinel::registered_resources().into_iter().find(|d| d.name == "registry.asyncLookup").unwrap();
    assert!(d.is_async && !d.has_block_handler);
    assert_eq!(futures::executor::block_on(engine.scoped_future(async_lookup())), Ok(()));
}
