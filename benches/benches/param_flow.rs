//! Hot-parameter check per call: sentinel-rs against sentinel-core 0.1.3's hotspot rule, in the same run.
//!
//! Each iteration is one whole call (entry with the hot-parameter value, then exit) on a rule whose
//! threshold is never reached, cycling over 1, 10^3 or 10^6 distinct values. Before the timed part the
//! bench prints allocations per call and the bytes each tracked value costs (a counting allocator).
//!
//! Run: `RUST_BACKTRACE= cargo bench -p sentinel-benches --bench param_flow -- --warm-up-time 1 --measurement-time 3`
//! (sentinel-core captures a backtrace per error when `RUST_BACKTRACE` is set, which would skew it.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::{EntryType, Resource, Sentinel};

struct Counting;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Allocations made by this thread (sentinel-core's background threads allocate too).
    static THREAD_ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn thread_allocs() -> usize {
    THREAD_ALLOCS.with(|c| c.get())
}

fn count_alloc() {
    let _ = THREAD_ALLOCS.try_with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count_alloc();
        LIVE_BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count_alloc();
        LIVE_BYTES.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const CASES: [(&str, u64); 3] = [("1", 1), ("1e3", 1_000), ("1e6", 1_000_000)];

/// Spreads consecutive indexes over the key space.
#[inline]
fn value(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn ours(duration_in_sec: u64) -> Resource {
    let engine = Sentinel::builder().build();
    engine
        .load_param_flow_rules(vec![ParamFlowRule::new("bench", 0).count(1e15).duration_in_sec(duration_in_sec)])
        .expect("valid rule");
    engine.resource_typed("bench", EntryType::In)
}

#[inline]
fn ours_call(res: &Resource, v: u64) -> bool {
    res.entry().args(&[&v]).enter().is_ok()
}

static CORE_INIT: std::sync::Once = std::sync::Once::new();

fn core_rule(resource: &str, duration_in_sec: u64) {
    CORE_INIT.call_once(|| sentinel_core::init_default().expect("sentinel-core init"));
    use sentinel_core::hotspot;
    hotspot::load_rules_of_resource(
        &resource.to_string(),
        vec![Arc::new(hotspot::Rule {
            resource: resource.into(),
            metric_type: hotspot::MetricType::QPS,
            control_strategy: hotspot::ControlStrategy::Reject,
            param_index: 0,
            threshold: 1_000_000_000_000,
            duration_in_sec,
            ..Default::default()
        })],
    )
    .expect("sentinel-core rule");
}

#[inline]
fn core_call(resource: &str, v: u64) -> bool {
    use sentinel_core::{base, EntryBuilder};
    let entry = EntryBuilder::new(resource.to_string())
        .with_traffic_type(base::TrafficType::Inbound)
        .with_args(Some(vec![v.to_string()]))
        .build();
    match entry {
        Ok(e) => {
            e.exit();
            true
        }
        Err(_) => false,
    }
}

/// Allocations per call and bytes per tracked value, printed once before the timed benches.
fn memory_report() {
    // Allocations per call on a value already tracked.
    let res = ours(1);
    let core_res = "mem-core-allocs";
    core_rule(core_res, 1);
    for i in 0..1000 {
        ours_call(&res, value(i % 10));
        core_call(core_res, value(i % 10));
    }
    let n = 100_000u64;
    let a0 = thread_allocs();
    for i in 0..n {
        black_box(ours_call(&res, value(i % 10)));
    }
    let a1 = thread_allocs();
    for i in 0..n {
        black_box(core_call(core_res, value(i % 10)));
    }
    let a2 = thread_allocs();
    let plain = Sentinel::builder().build().resource_typed("plain", EntryType::In);
    for i in 0..1000 {
        ours_call(&plain, i);
    }
    let a3 = thread_allocs();
    for i in 0..n {
        black_box(ours_call(&plain, value(i % 10)));
    }
    let a4 = thread_allocs();
    println!(
        "allocations per call (tracked value): sentinel-rs {:.3} (same call without a rule: {:.3}), sentinel-core {:.2}",
        (a1 - a0) as f64 / n as f64,
        (a4 - a3) as f64 / n as f64,
        (a2 - a1) as f64 / n as f64
    );

    // Bytes per tracked value: fill a rule's map to its cap with distinct values; live-byte growth / values.
    let engine = Sentinel::builder().build();
    engine.load_param_flow_rules(vec![ParamFlowRule::new("mem", 0).count(1e15).duration_in_sec(50)]).unwrap();
    let res = engine.resource("mem");
    ours_call(&res, u64::MAX); // create the resource's nodes first
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for i in 0..200_000u64 {
        ours_call(&res, value(i));
    }
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    let (tracked, cap) = engine.param_flow_tracked("mem")[0];
    println!(
        "sentinel-rs: {tracked} values tracked (cap {cap}), {:.1} bytes per value",
        (after - before) as f64 / tracked as f64
    );

    // sentinel-core: duration 5 -> its cap min(20000, 4000 * 5) = 20000 values.
    let core_res = "mem-core";
    core_rule(core_res, 5);
    core_call(core_res, u64::MAX);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    for i in 0..20_000u64 {
        core_call(core_res, value(i));
    }
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    println!("sentinel-core: 20000 values tracked, {:.1} bytes per value", (after - before) as f64 / 20_000.0);
}

fn hot_param(c: &mut Criterion) {
    memory_report();
    let mut g = c.benchmark_group("hot_param_check");
    g.throughput(Throughput::Elements(1));
    for (label, distinct) in CASES {
        let res = ours(1);
        let mut i = 0u64;
        g.bench_function(BenchmarkId::new("sentinel-rs", label), |b| {
            b.iter(|| {
                i += 1;
                if i == distinct {
                    i = 0;
                }
                black_box(ours_call(&res, value(i)))
            })
        });
        let name = format!("core-{label}");
        core_rule(&name, 1);
        let mut i = 0u64;
        g.bench_function(BenchmarkId::new("sentinel-core", label), |b| {
            b.iter(|| {
                i += 1;
                if i == distinct {
                    i = 0;
                }
                black_box(core_call(&name, value(i)))
            })
        });
    }
    // Context: the same call with no hot-parameter rule.
    let engine = Sentinel::builder().build();
    let plain = engine.resource_typed("plain", EntryType::In);
    g.bench_function(BenchmarkId::new("sentinel-rs", "no-rule"), |b| {
        b.iter(|| black_box(plain.entry().args(&[&7u64]).enter().is_ok()))
    });
    g.finish();
}

criterion_group!(benches, hot_param);
criterion_main!(benches);
