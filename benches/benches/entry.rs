//! Entry + exit cost of sentinel-runtime next to its peers, measured in the same run.
//!
//! Run: `RUST_BACKTRACE= cargo bench -p sentinel-benches --bench entry` (sentinel-core is ~3× slower with
//! RUST_BACKTRACE=1 because it captures backtraces in its errors). The one-thread cases run twice: wall time
//! (`entry_exit_1_thread`) and the benchmark thread's CPU time (`entry_exit_1_thread_cpu`), which time spent
//! descheduled on a busy machine does not inflate.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Instant;

use criterion::measurement::Measurement;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sentinel_runtime::clock::{Clock, SystemClock};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{Resource, Sentinel};

#[path = "support/parallel.rs"]
mod parallel;
use parallel::parallel;
#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

fn engine() -> Sentinel {
    engine_on(Sentinel::builder())
}

/// The bench's engine, built from `builder` (the default clock, or the cached one beside it).
fn engine_on(builder: sentinel_runtime::SentinelBuilder) -> Sentinel {
    let engine = builder.build();
    engine
        .load_flow_rules([FlowRule::new("one-rule-pass").count(1e15), FlowRule::new("one-rule-block").count(0.0)])
        .expect("valid rules");
    engine
}

fn clock(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    g.throughput(Throughput::Elements(1));
    let precise = SystemClock::new();
    g.bench_function("sentinel SystemClock::new().now_nanos", |b| b.iter(|| black_box(precise.now_nanos())));
    let cached = SystemClock::cached();
    g.bench_function("sentinel SystemClock::cached().now_nanos", |b| b.iter(|| black_box(cached.now_nanos())));
    g.bench_function("std Instant::now", |b| b.iter(|| black_box(Instant::now())));
    g.finish();
}

fn single_thread(c: &mut Criterion) {
    single_thread_in(c, "entry_exit_1_thread");
}

fn single_thread_cpu(c: &mut Criterion<ThreadCpuTime>) {
    single_thread_in(c, "entry_exit_1_thread_cpu");
}

/// Entry + exit on one thread, next to the peers; `group` names the measurement (wall or CPU time).
fn single_thread_in<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let engine = engine();
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    for name in ["no-rule", "one-rule-pass"] {
        let r = engine.resource(name);
        g.bench_function(BenchmarkId::new("sentinel-rs", name), |b| {
            b.iter(|| {
                let e = r.enter();
                black_box(&e);
            })
        });
    }
    let other = engine_on(Sentinel::builder().cached_clock());
    let r = other.resource("one-rule-pass");
    g.bench_function(BenchmarkId::new("sentinel-rs", "one-rule-pass-cached-clock"), |b| {
        b.iter(|| {
            let e = r.enter();
            black_box(&e);
        })
    });
    let blocked = engine.resource("one-rule-block");
    g.bench_function(BenchmarkId::new("sentinel-rs", "one-rule-block"), |b| {
        b.iter(|| black_box(blocked.enter().is_err()))
    });

    let quota = governor::Quota::per_second(NonZeroU32::MAX);
    let limiter = governor::RateLimiter::direct(quota);
    g.bench_function(BenchmarkId::new("governor", "check-pass"), |b| b.iter(|| black_box(limiter.check().is_ok())));

    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| sentinel_core::init_default().expect("sentinel-core init"));
    sentinel_core::flow::load_rules(vec![Arc::new(sentinel_core::flow::Rule {
        resource: "core-pass".into(),
        threshold: 1e15,
        calculate_strategy: sentinel_core::flow::CalculateStrategy::Direct,
        control_strategy: sentinel_core::flow::ControlStrategy::Reject,
        ..Default::default()
    })]);
    g.bench_function(BenchmarkId::new("sentinel-core-0.1.3", "one-rule-pass"), |b| {
        b.iter(|| {
            if let Ok(e) = sentinel_core::EntryBuilder::new("core-pass".into()).build() {
                e.exit();
            }
        })
    });
    g.finish();
}

/// An exactly named resource's entry with regex rules loaded for other names, next to the same entry without
/// them (same run): a resource's rules are resolved when rules load or the resource is created, so the
/// patterns must cost nothing per call. Also a resource whose only rule comes from a pattern.
fn regex_rules(c: &mut Criterion) {
    regex_rules_in(c, "regex_rules");
}

fn regex_rules_cpu(c: &mut Criterion<ThreadCpuTime>) {
    regex_rules_in(c, "regex_rules_cpu");
}

fn regex_rules_in<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
    use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
    let plain = engine();
    let with_patterns = engine();
    let flow = (0..100).map(|i| FlowRule::new(format!("other-{i}/.*")).regex(true).count(1.0));
    let flow: Vec<FlowRule> = with_patterns
        .flow_rules()
        .into_iter()
        .chain(flow)
        .chain([FlowRule::new("matched/.*").regex(true).count(1e15)])
        .collect();
    with_patterns.load_flow_rules(flow).expect("valid rules");
    with_patterns
        .load_authority_rules(
            (0..100).map(|i| AuthorityRule::new(format!("other-{i}/.*"), "a,b", AuthorityStrategy::Black).regex(true)),
        )
        .expect("valid rules");
    with_patterns
        .load_degrade_rules((0..100).map(|i| {
            DegradeRule::new(format!("other-{i}/.*"), DegradeGrade::ErrorCount)
                .count(5.0)
                .time_window_sec(1)
                .regex(true)
        }))
        .expect("valid rules");
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    for (label, engine, name) in [
        ("exact one-rule-pass, no patterns", &plain, "one-rule-pass"),
        ("exact one-rule-pass, 300 patterns for other names", &with_patterns, "one-rule-pass"),
        ("no rule, 300 patterns for other names", &with_patterns, "no-rule"),
        ("rule from a pattern", &with_patterns, "matched/x"),
    ] {
        let r = engine.resource(name);
        g.bench_function(label, |b| {
            b.iter(|| {
                let e = r.enter();
                black_box(&e);
            })
        });
    }
    g.finish();
}

/// What the Prometheus exporter costs a call: entry + exit of a resource with one passing rule on an engine
/// without the exporter and on one with it attached (each completed call goes into a histogram; counters cost
/// nothing, they come from the windows).
fn exporter(c: &mut Criterion) {
    exporter_in(c, "exporter");
}

fn exporter_cpu(c: &mut Criterion<ThreadCpuTime>) {
    exporter_in(c, "exporter_cpu");
}

fn exporter_in<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    let without = engine();
    let with = engine();
    sentinel_runtime::exporter::attach(&with, Default::default()).expect("default buckets");
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    for (label, engine) in [("one-rule-pass, no exporter", &without), ("one-rule-pass, exporter attached", &with)] {
        let r = engine.resource("one-rule-pass");
        g.bench_function(label, |b| {
            b.iter(|| {
                let e = r.enter();
                black_box(&e);
            })
        });
    }
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let engine = engine();
    let leaked = engine_on(Sentinel::builder()).leak();
    let mut g = c.benchmark_group("entry_exit_aggregate");
    g.throughput(Throughput::Elements(1));
    // Owned entries are what the web layer makes per request: on an engine that can drop each takes a hold
    // on the engine's state (a counter of its thread's stripe: `engine::keep`), on a leaked one (immortal)
    // none.
    let cases = [
        ("no-rule", engine.resource("no-rule"), false),
        ("one-rule-pass", engine.resource("one-rule-pass"), false),
        ("owned", engine.resource("one-rule-pass"), true),
        ("owned-leaked", leaked.resource("one-rule-pass"), true),
    ];
    for threads in [1usize, 2] {
        for (label, r, owned) in &cases {
            let worker = || {
                let (r, owned): (Resource, bool) = (r.clone(), *owned);
                move || {
                    let e = if owned { r.entry_owned().enter() } else { r.enter() };
                    black_box(&e);
                }
            };
            g.bench_function(BenchmarkId::new(format!("sentinel-rs {label}"), format!("{threads} threads")), |b| {
                b.iter_custom(|iters| parallel(threads, iters, worker))
            });
        }
        let limiter = Arc::new(governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX)));
        let worker = || {
            let limiter = limiter.clone();
            move || {
                black_box(limiter.check().is_ok());
            }
        };
        g.bench_function(BenchmarkId::new("governor check-pass", format!("{threads} threads")), |b| {
            b.iter_custom(|iters| parallel(threads, iters, worker))
        });
    }
    g.finish();
}

criterion_group!(benches, clock, single_thread, two_threads, regex_rules, exporter);
criterion_group! {
    name = benches_cpu;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = single_thread_cpu, regex_rules_cpu, exporter_cpu
}
criterion_main!(benches, benches_cpu);
