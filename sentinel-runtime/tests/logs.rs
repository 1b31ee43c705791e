//! The block log and the metric log as files, read the way Java's tools read them.
#![cfg(feature = "logs")]

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::log::{BlockLogWriter, BLOCK_LOG_FILE};
use sentinel_runtime::param_flow::{HotParam, ParamFlowRule};
use sentinel_runtime::Sentinel;

const T0: u64 = 1_700_000_000_000; // 2023-11-14 22:13:20 UTC

#[test]
fn a_hot_parameter_block_logs_the_value_in_the_limit_app_column() {
    // Java's `ParamFlowException(resource, param, rule)` passes the value as the exception's `ruleLimitApp`,
    // which `LogSlot` writes in the third key of the block log.
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_param_flow_rules(vec![ParamFlowRule::new("res", 0).count(1.0).id(9)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = BlockLogWriter::new(dir.path().join(BLOCK_LOG_FILE)).unwrap();
    log.attach(&engine);
    let res = engine.resource("res");
    let user: &dyn HotParam = &"u1";
    drop(res.entry().args(&[user]).enter().unwrap());
    assert!(res.entry().args(&[user]).enter().is_err());
    let seven: &dyn HotParam = &7i64;
    drop(res.entry().args(&[seven]).enter().unwrap());
    assert!(res.entry().args(&[seven]).enter().is_err());
    clock.advance_millis(1000);
    log.flush_once(clock.now_millis()).unwrap();
    let text = std::fs::read_to_string(dir.path().join(BLOCK_LOG_FILE)).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "2023-11-14 22:13:20|1|res,ParamFlowException,7,,9|1,0",
            "2023-11-14 22:13:20|1|res,ParamFlowException,u1,,9|1,0"
        ]
    );
}

#[test]
fn a_metric_file_removed_while_it_is_written_is_made_again() {
    // Java's `MetricWriter.write` checks that its file and index still exist before each write, and starts a
    // new file when either is gone (removed by hand, or by a clean-up job).
    use sentinel_runtime::log::{MetricLogWriter, MetricSearcher};
    let clock = ManualClock::at_millis(T0);
    let engine = Sentinel::builder().manual_clock(clock.clone()).app_name("gone").build();
    let dir = tempfile::tempdir().unwrap();
    let writer = MetricLogWriter::new(&engine, dir.path(), 1 << 20, 6).unwrap();
    drop(engine.enter("api").unwrap());
    clock.advance_millis(1000);
    assert_eq!(writer.flush_once(clock.now_millis()).unwrap(), 1);
    let file = dir.path().join("gone-metrics.log.2023-11-14");
    std::fs::remove_file(&file).unwrap();
    drop(engine.enter("api").unwrap());
    clock.advance_millis(1000);
    assert_eq!(writer.flush_once(clock.now_millis()).unwrap(), 1);
    let found = MetricSearcher::new(dir.path(), "gone").find(Some("api"), T0, T0 + 5000).unwrap();
    let seconds: Vec<u64> = found.iter().map(|l| l.timestamp_ms).collect();
    assert_eq!(seconds, [T0 + 1000], "the second written after the removal is in a file");
    // The same when the index alone is removed.
    std::fs::remove_file(dir.path().join("gone-metrics.log.2023-11-14.idx")).unwrap();
    drop(engine.enter("api").unwrap());
    clock.advance_millis(1000);
    writer.flush_once(clock.now_millis()).unwrap();
    let found = MetricSearcher::new(dir.path(), "gone").find(Some("api"), T0, T0 + 5000).unwrap();
    assert_eq!(found.iter().map(|l| l.timestamp_ms).collect::<Vec<_>>(), [T0 + 2000]);
}
