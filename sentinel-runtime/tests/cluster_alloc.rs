//! A cluster rule with a lease in hand is decided on the calling thread without allocating (counted by a
//! per-thread counting allocator; the client's own thread, which talks to a real `redis-server`, does not
//! count).
#![cfg(feature = "cluster-redis")]

use std::time::{Duration, Instant};

use sentinel_runtime::cluster::RedisCluster;
use sentinel_runtime::flow::{ClusterConfig, ClusterRuleMode, ClusterThresholdType, FlowRule};
use sentinel_runtime::Sentinel;
use sentinel_testkit::redis::RedisServer;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

#[test]
fn cluster_entry_with_a_lease_in_hand_allocates_nothing() {
    let Some(redis) = RedisServer::start("cluster_entry_with_a_lease_in_hand_allocates_nothing") else { return };
    let engine = Sentinel::builder().build();
    let rule = FlowRule {
        cluster_mode: true,
        // One bucket of a second: a lease lasts until the second ends.
        cluster_config: Some(ClusterConfig {
            threshold_type: ClusterThresholdType::Global,
            sample_count: 1,
            window_interval_ms: 1000,
            ..ClusterConfig::default()
        }),
        ..FlowRule::new("api").count(1e12)
    };
    engine.load_flow_rules([rule]).unwrap();
    let client = RedisCluster::builder(redis.url()).start(&engine).unwrap();
    client.wait_connected(Duration::from_secs(5)).unwrap();
    let api = engine.resource("api");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut measured = None;
    while Instant::now() < deadline && measured.is_none() {
        for _ in 0..1000 {
            drop(api.enter());
        }
        let st = engine.cluster_status()[0].clone();
        // Measure while the lease serves every call: no call waited for Redis meanwhile (a top-up the client
        // makes on its own thread does not count here).
        if st.mode == ClusterRuleMode::Leasing && st.tokens_in_hand > 50_000 && st.lease_valid_for_ms > 100 {
            let waits = st.waits;
            let before = allocations();
            for _ in 0..20_000 {
                drop(api.enter().unwrap());
            }
            let after = allocations();
            if engine.cluster_status()[0].waits == waits {
                measured = Some(after - before);
            }
        }
    }
    assert_eq!(measured, Some(0), "allocations on 20k cluster entries with the lease in hand");
}
