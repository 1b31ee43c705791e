//! Sliding-window statistics (SPEC §3), read through a bare `StatNode` and through entries.

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::stat::{MetricEvent, StatNode};
use sentinel_runtime::{EntryType, Sentinel};

/// A second boundary well after the epoch.
const T0: u64 = 1_700_000_000_000;

#[test]
fn a_bucket_leaves_the_window_one_interval_after_it_starts() {
    let node = StatNode::new();
    node.on_pass(T0, 3);
    assert_eq!(node.pass_qps(T0 + 999), 3.0);
    // Java moves the window to now before it reads: the bucket one interval old shares the current one's slot
    // and is reset.
    assert_eq!(node.pass_qps(T0 + 1000), 0.0, "exactly one interval old no longer counts");
    assert_eq!(node.pass_qps(T0 + 1001), 0.0);
}

#[test]
fn window_sums_both_half_second_buckets() {
    let node = StatNode::new();
    node.on_pass(T0 + 100, 2);
    node.on_pass(T0 + 600, 5);
    assert_eq!(node.pass_qps(T0 + 999), 7.0);
    // At T0+1100 the first bucket's slot is reused for [T0+1000, T0+1500): only the second remains.
    node.on_block(T0 + 1100, 1);
    assert_eq!(node.pass_qps(T0 + 1100), 5.0);
    assert_eq!(node.block_qps(T0 + 1100), 1.0);
    assert_eq!(node.total_qps(T0 + 1100), 6.0);
}

#[test]
fn completion_feeds_rt_success_exception_and_threads() {
    let node = StatNode::new();
    node.on_pass(T0, 1);
    node.on_pass(T0, 1);
    assert_eq!(node.cur_threads(), 2);
    node.on_complete(T0 + 10, 30_000, 1, false);
    node.on_complete(T0 + 20, 10_000, 1, true);
    assert_eq!(node.cur_threads(), 0);
    assert_eq!(node.success_qps(T0 + 20), 2.0);
    assert_eq!(node.exception_qps(T0 + 20), 1.0);
    assert_eq!(node.avg_rt_ms(T0 + 20), 20.0);
    assert_eq!(node.min_rt_ms(T0 + 20), 10.0);
}

#[test]
fn min_rt_is_5000_when_empty_and_at_least_1() {
    let node = StatNode::new();
    assert_eq!(node.min_rt_ms(T0), 5000.0);
    assert_eq!(node.avg_rt_ms(T0), 0.0, "no completion: average 0");
    node.on_pass(T0, 1);
    node.on_complete(T0, 200, 1, false); // 0.2 ms
    assert_eq!(node.min_rt_ms(T0), 1.0);
}

#[test]
fn max_success_qps_scales_the_best_bucket() {
    let node = StatNode::new();
    assert_eq!(node.max_success_qps(T0), 2.0, "max(1, 0) * 2 samples / 1 s");
    for _ in 0..4 {
        node.on_pass(T0, 1);
        node.on_complete(T0 + 1, 1000, 1, false);
    }
    node.on_pass(T0 + 600, 1);
    node.on_complete(T0 + 600, 1000, 1, false);
    assert_eq!(node.max_success_qps(T0 + 700), 8.0);
}

#[test]
fn previous_second_comes_from_the_minute_window() {
    let node = StatNode::new();
    node.on_pass(T0 + 10, 4);
    node.on_pass(T0 + 700, 6);
    node.on_block(T0 + 800, 2);
    // Still in the same second: nothing "previous".
    assert_eq!(node.previous_pass_qps(T0 + 900), 0.0);
    // Next second, before any write folded anything.
    assert_eq!(node.previous_pass_qps(T0 + 1200), 10.0);
    assert_eq!(node.previous_block_qps(T0 + 1200), 2.0);
    // Writes in the next second fold the old buckets into the minute window: same answer.
    node.on_pass(T0 + 1300, 1);
    node.on_pass(T0 + 1800, 1);
    assert_eq!(node.previous_pass_qps(T0 + 1900), 10.0);
}

#[test]
fn minute_totals_survive_many_bucket_rollovers() {
    let node = StatNode::new();
    for s in 0..30u64 {
        node.on_pass(T0 + s * 1000 + 100, 2);
        node.on_block(T0 + s * 1000 + 600, 1);
    }
    let now = T0 + 29_900;
    let t = node.minute_totals(now);
    assert_eq!(t.get(MetricEvent::Pass), 60);
    assert_eq!(t.get(MetricEvent::Block), 30);
    let secs = node.seconds(now);
    assert_eq!(secs.len(), 30);
    assert!(secs.iter().all(|(_, b)| b.get(MetricEvent::Pass) == 2 && b.get(MetricEvent::Block) == 1));
    // Seconds older than a minute drop out.
    let later = T0 + 29_000 + 59_999;
    assert_eq!(node.minute_totals(later).get(MetricEvent::Pass), 2, "only the last second is within the minute");
    assert_eq!(node.minute_totals(later + 1).get(MetricEvent::Pass), 0, "a second exactly a minute old is gone");
}

#[test]
fn a_clock_that_goes_backwards_neither_panics_nor_loses_counts() {
    let node = StatNode::new();
    node.on_pass(T0 + 2_000, 1);
    node.on_pass(T0 + 100, 1); // 1.9 s in the past
    node.on_complete(T0 + 50, 1_000, 1, false);
    node.on_complete(T0 + 2_001, 1_000, 1, false);
    assert_eq!(node.cur_threads(), 0);
    let t = node.minute_totals(T0 + 2_100);
    assert_eq!(t.get(MetricEvent::Pass), 2);
    assert_eq!(t.get(MetricEvent::Success), 2);
    // Reading at a time before every bucket is fine as well.
    let _ = node.pass_qps(0);
    let _ = node.previous_pass_qps(0);
}

#[test]
fn entries_record_on_default_cluster_origin_and_inbound_nodes() {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let api = engine.resource_typed("api", EntryType::In);
    {
        let _ctx = engine.enter_context("web", "appA").unwrap();
        let e = api.enter().unwrap();
        assert_eq!(engine.cluster_stats("api").unwrap().threads, 1);
        clock.advance_millis(25);
        drop(e);
    }
    let _plain = api.enter().unwrap();
    let cluster = engine.cluster_stats("api").unwrap();
    assert_eq!(cluster.pass_qps, 2.0);
    assert_eq!(cluster.threads, 1);
    assert_eq!(cluster.success_qps, 1.0);
    assert_eq!(cluster.avg_rt_ms, 25.0);
    let origin = engine.origin_stats("api", "appA").unwrap();
    assert_eq!(origin.pass_qps, 1.0);
    assert_eq!(origin.threads, 0);
    assert_eq!(engine.context_stats("api", "web").unwrap().pass_qps, 1.0);
    assert_eq!(engine.context_stats("api", sentinel_runtime::DEFAULT_CONTEXT_NAME).unwrap().pass_qps, 1.0);
    assert_eq!(engine.entrance_stats("web").unwrap().pass_qps, 1.0);
    assert_eq!(engine.inbound_stats().pass_qps, 2.0);
}

#[test]
fn disabled_engine_passes_everything_and_records_nothing() {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock).build();
    engine.load_flow_rules([sentinel_runtime::flow::FlowRule::new("x").count(0.0)]).unwrap();
    engine.set_enabled(false);
    let x = engine.resource("x");
    let e = x.enter().unwrap();
    assert!(!e.is_checked());
    drop(e);
    assert_eq!(engine.cluster_stats("x").unwrap().pass_qps, 0.0);
    engine.set_enabled(true);
    assert!(x.enter().is_err());
}

#[test]
fn a_bucket_exactly_one_interval_old_is_gone_as_in_java() {
    // Java reads a window after moving it to now (`LeapArray.currentWindow`): the bucket exactly one
    // interval old shares its slot with the current one and is reset before the sum, so it never counts.
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine
        .load_system_rules(vec![sentinel_runtime::system::SystemRule { qps: Some(3.0), ..Default::default() }])
        .unwrap();
    let api = engine.resource_typed("api", EntryType::In);
    for _ in 0..3 {
        drop(api.enter().unwrap());
    }
    assert!(api.enter().is_err(), "the fourth call in the second is over the inbound qps");
    clock.set_millis(T0 + 1000);
    let s = engine.cluster_stats("api").unwrap();
    assert_eq!((s.pass_qps, s.block_qps, s.success_qps, s.total_qps), (0.0, 0.0, 0.0, 0.0), "{s:?}");
    assert_eq!(engine.inbound_stats().pass_qps, 0.0);
    assert!(api.enter().is_ok(), "Java: the window of T0+1000 holds no pass, the call passes the system qps");
    // The per-minute window likewise: a second exactly a minute old is gone.
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    drop(engine.enter("b").unwrap());
    clock.set_millis(T0 + 60_000);
    let s = engine.cluster_stats("b").unwrap();
    assert_eq!((s.minute_pass, s.minute_success), (0, 0), "{s:?}");
}

/// Java's `EntranceNode.avgRt` weights each child's average rt by its pass qps (`Σ avgRt·passQps / ΣpassQps`):
/// what the `tree` command, `jsonTree` and the machine root show for an entrance.
#[test]
fn an_entrance_weights_its_childrens_rt_by_their_pass_qps() {
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let _ctx = engine.enter_context("web", "").unwrap();
    let a = engine.resource("a");
    let b = engine.resource("b");
    let e = a.enter().unwrap();
    clock.advance_millis(10);
    drop(e);
    // `b` passed and is still running: no completion yet, an average rt of 0.
    let running = b.enter().unwrap();
    let entrance = engine.entrance_stats("web").unwrap();
    assert_eq!(entrance.pass_qps, 2.0);
    assert_eq!(entrance.avg_rt_ms, 5.0, "(10 × 1 + 0 × 1) / 2");
    let tree = engine.tree();
    let web = tree.iter().find(|t| t.name == "web").unwrap();
    assert_eq!(web.stats.avg_rt_ms, 5.0);
    drop(running);
}
