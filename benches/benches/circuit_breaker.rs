//! A closed circuit breaker's cost on entry + exit, next to peers measured in the same run.
//!
//! Run with `cargo bench -p sentinel-benches --bench circuit_breaker` (leave `RUST_BACKTRACE` unset:
//! sentinel-core captures a backtrace per error when it is set).
//!
//! Every case runs twice: `closed_breaker` measures wall time (criterion's default), `closed_breaker_cpu`
//! the benchmark thread's CPU time, which time spent descheduled on a busy machine does not inflate.

use std::hint::black_box;

use criterion::measurement::Measurement;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

/// A flow rule that always passes and a closed error-count breaker that never trips.
fn engine(with_breaker: bool) -> Sentinel {
    let engine = Sentinel::builder().build();
    engine.load_flow_rules(vec![FlowRule::new("res").count(1e12)]).expect("valid flow rule");
    if with_breaker {
        let rule = DegradeRule::new("res", DegradeGrade::ErrorCount).count(1e9).time_window_sec(10);
        engine.load_degrade_rules(vec![rule]).expect("valid degrade rule");
    }
    engine
}

fn wall(c: &mut Criterion) {
    closed_breaker(c, "closed_breaker");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    closed_breaker(c, "closed_breaker_cpu");
}

fn closed_breaker<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));

    let flow_only = engine(false);
    let res = flow_only.resource("res");
    g.bench_function("sentinel-rs/flow_rule_only", |b| {
        b.iter(|| {
            let e = res.enter();
            black_box(&e);
        })
    });

    let with_breaker = engine(true);
    let res = with_breaker.resource("res");
    g.bench_function("sentinel-rs/flow_rule+error_count_breaker", |b| {
        b.iter(|| {
            let e = res.enter();
            black_box(&e);
        })
    });

    let slow = Sentinel::builder().build();
    slow.load_flow_rules(vec![FlowRule::new("res").count(1e12)]).expect("valid flow rule");
    let rule = DegradeRule::new("res", DegradeGrade::SlowRequestRatio).count(1e6).time_window_sec(10);
    slow.load_degrade_rules(vec![rule]).expect("valid degrade rule");
    let res = slow.resource("res");
    g.bench_function("sentinel-rs/flow_rule+slow_ratio_breaker", |b| {
        b.iter(|| {
            let e = res.enter();
            black_box(&e);
        })
    });

    // Intervals with bad calls: one call in 100 fails, under an error-ratio breaker that never trips (ratio
    // 0.5, min 1,000,000 calls). Completions after an interval's first error take the deciding path.
    let errors = Sentinel::builder().build();
    errors.load_flow_rules(vec![FlowRule::new("res").count(1e12)]).expect("valid flow rule");
    let rule = DegradeRule::new("res", DegradeGrade::ErrorRatio).count(0.5).min_request_amount(1_000_000);
    errors.load_degrade_rules(vec![rule.time_window_sec(10)]).expect("valid degrade rule");
    let res = errors.resource("res");
    let mut n = 0u32;
    g.bench_function("sentinel-rs/flow_rule+error_ratio_breaker_1pct_errors", |b| {
        b.iter(|| {
            let e = res.enter();
            n = n.wrapping_add(1);
            if let Ok(mut e) = e {
                if n.is_multiple_of(100) {
                    e.set_error();
                }
                black_box(&e);
            }
        })
    });

    let fs = failsafe::Config::new().build();
    g.bench_function("failsafe/closed_call", |b| {
        b.iter(|| {
            let r = failsafe::CircuitBreaker::call(&fs, || Ok::<u32, ()>(black_box(1)));
            black_box(r.is_ok());
        })
    });

    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| sentinel_core::init_default().expect("sentinel-core init"));
    let rule = sentinel_core::circuitbreaker::Rule {
        resource: "res".into(),
        strategy: sentinel_core::circuitbreaker::BreakerStrategy::ErrorCount,
        retry_timeout_ms: 10_000,
        min_request_amount: 10,
        stat_interval_ms: 1_000,
        threshold: 1e9,
        ..Default::default()
    };
    sentinel_core::circuitbreaker::load_rules(vec![std::sync::Arc::new(rule)]);
    g.bench_function("sentinel-core-0.1.3/closed_error_count", |b| {
        b.iter(|| {
            let e = sentinel_core::api::EntryBuilder::new("res".into()).build();
            if let Ok(e) = &e {
                e.exit();
            }
            black_box(e.is_ok());
        })
    });
    g.finish();
}

criterion_group!(benches, wall);
criterion_group! {
    name = benches_cpu;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(benches, benches_cpu);
