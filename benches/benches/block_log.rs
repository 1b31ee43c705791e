//! Cost of a blocked call with and without the block log's listener attached (the listener only queues the
//! event; the writer's aggregation and I/O run outside the timed loop, as they do on the background thread).
//!
//! Run: `cargo bench -p sentinel-benches --bench block_log -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::log::BlockLogWriter;
use sentinel_runtime::Sentinel;

const BATCH: u64 = 4096;

fn blocked_calls(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("a private temporary directory");
    let dir = tmp.path();
    let mut g = c.benchmark_group("blocked_call");
    g.throughput(Throughput::Elements(1));
    for attach in [false, true] {
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([FlowRule::new("api").count(0.0)]).expect("valid rule");
        let log = BlockLogWriter::new(dir.join(format!("block-{attach}.log"))).expect("log file");
        if attach {
            log.attach(&engine);
        }
        let api = engine.resource("api");
        let name = if attach { "with block log listener" } else { "no listener" };
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BATCH);
                    let start = Instant::now();
                    for _ in 0..n {
                        black_box(api.enter().is_err());
                    }
                    timed += start.elapsed();
                    left -= n;
                    // The background thread's work, untimed: drain the queue and write whole seconds.
                    let _ = log.flush_once(engine.now_millis());
                }
                timed
            })
        });
        assert_eq!(log.dropped(), 0, "the queue never overflowed");
    }
    g.finish();
    drop(tmp);
}

criterion_group!(benches, blocked_calls);
criterion_main!(benches);
