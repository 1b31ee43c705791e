//! What `#[sentinel_resource]` costs: an annotated call next to the same plain call and to a manual entry on a
//! cached resource handle, sync and async, on the global engine with no rules (the pass path). Also a method
//! named from `Self` (`module::Type::method`) and an async fn with `timeout_ms` (what the timer costs when it
//! is used; functions without it generate no timer code at all).
//!
//! `cargo bench -p sentinel-benches --bench macro_overhead -- --warm-up-time 1 --measurement-time 3`

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sentinel_runtime::{sentinel_resource, BlockError, Resource, Sentinel};

#[derive(Debug)]
struct BenchError;

impl From<BlockError> for BenchError {
    fn from(_: BlockError) -> Self {
        BenchError
    }
}

impl From<sentinel_runtime::Timeout> for BenchError {
    fn from(_: sentinel_runtime::Timeout) -> Self {
        BenchError
    }
}

struct Service;

impl Service {
    #[inline(never)]
    #[sentinel_resource]
    fn method(&self, x: u64) -> Result<u64, BenchError> {
        Ok(black_box(x) + 1)
    }
}

#[inline(never)]
#[sentinel_resource(name = "bench.annotated_timeout", timeout_ms = 200)]
async fn annotated_timeout(x: u64) -> Result<u64, BenchError> {
    Ok(black_box(x) + 1)
}

/// Pending on its first poll, ready on the second (a body that waits once, like any real downstream call).
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[inline(never)]
async fn plain_yield_async(x: u64) -> Result<u64, BenchError> {
    YieldOnce(false).await;
    Ok(black_box(x) + 1)
}

#[inline(never)]
#[sentinel_resource(name = "bench.annotated_yield")]
async fn annotated_yield(x: u64) -> Result<u64, BenchError> {
    YieldOnce(false).await;
    Ok(black_box(x) + 1)
}

#[inline(never)]
#[sentinel_resource(name = "bench.annotated_timeout_yield", timeout_ms = 200)]
async fn annotated_timeout_yield(x: u64) -> Result<u64, BenchError> {
    YieldOnce(false).await;
    Ok(black_box(x) + 1)
}

/// Polls a future that is pending once, then ready.
#[inline(always)]
fn poll_twice<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
        return v;
    }
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the benchmarked futures wait once"),
    }
}

#[inline(never)]
fn plain(x: u64) -> Result<u64, BenchError> {
    Ok(black_box(x) + 1)
}

fn manual_resource() -> &'static Resource {
    static R: OnceLock<Resource> = OnceLock::new();
    R.get_or_init(|| Sentinel::global().resource("bench.manual"))
}

#[inline(never)]
fn manual(x: u64) -> Result<u64, BenchError> {
    let _entry = manual_resource().enter()?;
    Ok(black_box(x) + 1)
}

#[inline(never)]
#[sentinel_resource(name = "bench.annotated")]
fn annotated(x: u64) -> Result<u64, BenchError> {
    Ok(black_box(x) + 1)
}

#[inline(never)]
async fn plain_async(x: u64) -> Result<u64, BenchError> {
    Ok(black_box(x) + 1)
}

#[inline(never)]
async fn manual_async(x: u64) -> Result<u64, BenchError> {
    let _entry = manual_resource().entry().enter_async().await?;
    Ok(black_box(x) + 1)
}

#[inline(never)]
#[sentinel_resource(name = "bench.annotated_async")]
async fn annotated_async(x: u64) -> Result<u64, BenchError> {
    Ok(black_box(x) + 1)
}

/// Polls a future that completes at once (no executor in the measurement).
#[inline(always)]
fn poll_ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the benchmarked futures never wait"),
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("macro_overhead_sync");
    g.throughput(Throughput::Elements(1));
    g.bench_function("plain_call", |b| b.iter(|| plain(black_box(7))));
    g.bench_function("manual_entry", |b| b.iter(|| manual(black_box(7))));
    g.bench_function("annotated", |b| b.iter(|| annotated(black_box(7))));
    g.bench_function("annotated_method_named_from_self", |b| b.iter(|| Service.method(black_box(7))));
    g.finish();

    let mut g = c.benchmark_group("macro_overhead_async");
    g.throughput(Throughput::Elements(1));
    g.bench_function("plain_call", |b| b.iter(|| poll_ready(plain_async(black_box(7)))));
    g.bench_function("manual_entry", |b| b.iter(|| poll_ready(manual_async(black_box(7)))));
    g.bench_function("annotated", |b| b.iter(|| poll_ready(annotated_async(black_box(7)))));
    g.bench_function("annotated_timeout_ms_200", |b| b.iter(|| poll_ready(annotated_timeout(black_box(7)))));
    g.finish();

    // A body that waits once: the time limit then arms a real timer (and cancels it when the body finishes).
    let mut g = c.benchmark_group("macro_overhead_async_waits_once");
    g.throughput(Throughput::Elements(1));
    g.bench_function("plain_call", |b| b.iter(|| poll_twice(plain_yield_async(black_box(7)))));
    g.bench_function("annotated", |b| b.iter(|| poll_twice(annotated_yield(black_box(7)))));
    g.bench_function("annotated_timeout_ms_200", |b| b.iter(|| poll_twice(annotated_timeout_yield(black_box(7)))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
