//! What a call costs, every case of the cost table in `docs/performance.md`, with the peers beside them in
//! the same run: criterion's time per call (the instruction counts of the same cases come from
//! `scripts/callgrind-web`, the `part-*` and web variants of `benches/examples/web_instructions.rs`).
//!
//! `RUST_BACKTRACE= cargo bench -p sentinel-benches --bench cost`
//!
//! - `entry_exit`: one entry and its exit through a resource handle (`Resource::enter`), with one passing
//!   flow rule, one that blocks, a passing rule and a closed error-ratio breaker, the same and a thread-grade
//!   rule, a passing rule and an adaptive concurrency limit, a hot-parameter rule with one value and with
//!   10^6 values in turn, the passing rule on the cached
//!   clock, and the two readings of the precise clock a call takes; beside a model of the least an engine
//!   must do for the passing call (`support/engine_floor.rs`), governor's `check()` and a call through
//!   failsafe's closed circuit breaker;
//! - `macro`: an annotated sync fn and the same async fn (polled once, no executor), one passing rule;
//! - `web`: one `GET /hello` through an axum `Router` with `route_layer(Identity)`, `SentinelLayer::axum()`
//!   with one passing rule, the same with flow + error-ratio breaker + thread-grade rule, tower-governor's
//!   layer with one global limit; each figure includes the router's own work (subtract `identity`);
//! - `two_threads`: entry + exit of one resource from two threads at once (aggregate time per call), a call
//!   that passes and one that is blocked, next to governor's `check()` on one shared limiter.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::FutureExt;
use http::Request;
use sentinel_runtime::adaptive::AdaptiveRule;
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::{Clock, SystemClock};
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::SentinelLayer;
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};
use tower::{Service, ServiceExt};

#[path = "support/engine_floor.rs"]
mod engine_floor;
#[path = "support/parallel.rs"]
mod parallel;
use parallel::parallel;

/// A limit no benchmark reaches.
const NEVER: f64 = 1e15;

/// A closed error-ratio breaker on `resource` (no call fails, so it never opens).
fn breaker(resource: &str) -> DegradeRule {
    DegradeRule::new(resource, DegradeGrade::ErrorRatio).count(0.5).min_request_amount(5).time_window_sec(10)
}

/// A leaked engine with the rules of every `entry_exit` case, each on its own resource.
fn engine() -> &'static Sentinel {
    let engine = Sentinel::builder().build().leak();
    engine
        .load_flow_rules([
            FlowRule::new("pass").count(NEVER),
            FlowRule::new("block").count(0.0),
            FlowRule::new("breaker").count(NEVER),
            FlowRule::new("thread").count(NEVER),
            FlowRule::new("thread").grade(FlowGrade::Thread).count(1e9),
            FlowRule::new("adaptive").count(NEVER),
        ])
        .expect("valid flow rules");
    engine.load_degrade_rules([breaker("breaker"), breaker("thread")]).expect("valid degrade rules");
    engine.load_param_flow_rules([ParamFlowRule::new("param", 0).count(NEVER)]).expect("valid param rules");
    // A limit no benchmark reaches (one call in flight at a time).
    engine
        .load_adaptive_rules([AdaptiveRule::new("adaptive").limits(1_000, 1_000, 1_000)])
        .expect("valid adaptive rule");
    engine
}

fn entry_exit(c: &mut Criterion) {
    let engine = engine();
    let mut g = c.benchmark_group("entry_exit");
    g.throughput(Throughput::Elements(1));
    for (case, resource, blocks) in [
        ("one rule passes", "pass", false),
        ("one rule blocks", "block", true),
        ("+ closed error-ratio breaker", "breaker", false),
        ("+ thread-grade rule", "thread", false),
        ("one rule + adaptive limit", "adaptive", false),
    ] {
        let r = engine.resource(resource);
        g.bench_function(BenchmarkId::new("sentinel-rs", case), |b| {
            b.iter(|| assert_eq!(black_box(r.enter()).is_err(), blocks))
        });
    }
    let r = engine.resource("param");
    for (case, values) in [("hot parameter, 1 value", 1u64), ("hot parameter, 10^6 values", 1_000_000)] {
        let mut next = 0u64;
        g.bench_function(BenchmarkId::new("sentinel-rs", case), |b| {
            b.iter(|| {
                next = (next + 1) % values;
                assert!(black_box(r.entry().args(&[&next]).enter()).is_ok())
            })
        });
    }
    // The same passing call on the cached clock (Java's `TimeUtil` design: a millisecond a ticker thread
    // refreshes), and the two readings of the precise default clock a call takes on its own: what of a
    // call's time is the clock's.
    let cached = Sentinel::builder().cached_clock().build().leak();
    cached.load_flow_rules([FlowRule::new("pass").count(NEVER)]).expect("valid flow rule");
    let r = cached.resource("pass");
    g.bench_function(BenchmarkId::new("sentinel-rs", "one rule passes, cached clock"), |b| {
        b.iter(|| assert!(black_box(r.enter()).is_ok()))
    });
    let clock = SystemClock::precise();
    g.bench_function(BenchmarkId::new("clock", "two precise readings"), |b| {
        b.iter(|| {
            let start = black_box(&clock).now_nanos();
            black_box(black_box(&clock).now_nanos().wrapping_sub(start))
        })
    });
    // The least an engine must do for the passing call (`support/engine_floor.rs`): its records, a read
    // section, the exact admission, the thread's context and an entry.
    let model = engine_floor::FloorEngine::leaked(u64::MAX);
    g.bench_function(BenchmarkId::new("model", "one rule passes"), |b| {
        b.iter(|| assert!(black_box(model.enter()).is_some()))
    });
    let limiter = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX));
    g.bench_function(BenchmarkId::new("governor", "check()"), |b| {
        b.iter(|| assert!(black_box(limiter.check()).is_ok()))
    });
    let fs = failsafe::Config::new().build();
    g.bench_function(BenchmarkId::new("failsafe", "closed call"), |b| {
        b.iter(|| assert!(black_box(failsafe::CircuitBreaker::call(&fs, || Ok::<u64, ()>(black_box(1)))).is_ok()))
    });
    g.finish();
}

#[inline(never)]
#[sentinel_resource(name = "cost.sync")]
fn annotated(x: u64) -> Result<u64, BlockError> {
    Ok(black_box(x) + 1)
}

#[inline(never)]
#[sentinel_resource(name = "cost.async")]
async fn annotated_async(x: u64) -> Result<u64, BlockError> {
    Ok(black_box(x) + 1)
}

/// Polls `fut` once, with a no-op waker: an annotated async fn whose body does not wait completes at once.
fn poll_once<F: Future>(fut: F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    pin!(fut).poll(&mut cx)
}

fn macros(c: &mut Criterion) {
    Sentinel::global()
        .load_flow_rules([FlowRule::new("cost.sync").count(NEVER), FlowRule::new("cost.async").count(NEVER)])
        .expect("valid flow rules");
    let mut g = c.benchmark_group("macro");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sync fn", |b| b.iter(|| assert!(black_box(annotated(black_box(7))).is_ok())));
    g.bench_function("async fn, polled once", |b| {
        b.iter(|| assert!(matches!(black_box(poll_once(annotated_async(black_box(7)))), Poll::Ready(Ok(_)))))
    });
    g.finish();
}

/// `GET /hello` through `router`, as a server calls it (ready, call, the response future completed).
fn one_request(router: &mut axum::Router) {
    let req = Request::get("/hello").body(Body::empty()).expect("a request");
    let ready = ServiceExt::<Request<Body>>::ready(router).now_or_never().expect("ready at once").expect("ready");
    let res = ready.call(req).now_or_never().expect("answered at once").expect("a response");
    assert!(black_box(res).status().is_success());
}

fn web(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _in = rt.enter();
    let routes = || axum::Router::new().route("/hello", axum::routing::get(|| async { "hello" }));
    let one_rule = Sentinel::builder().build().leak();
    one_rule.load_flow_rules([FlowRule::new("GET:/hello").count(NEVER)]).expect("valid flow rules");
    let guarded = Sentinel::builder().build().leak();
    guarded
        .load_flow_rules([
            FlowRule::new("GET:/hello").count(NEVER),
            FlowRule::new("GET:/hello").grade(FlowGrade::Thread).count(1e9),
        ])
        .expect("valid flow rules");
    guarded.load_degrade_rules([breaker("GET:/hello")]).expect("valid degrade rules");
    let mut never = tower_governor::governor::GovernorConfigBuilder::default();
    never.per_nanosecond(1).burst_size(u32::MAX);
    let global = never.key_extractor(tower_governor::key_extractor::GlobalKeyExtractor).finish().expect("a config");
    let routers = [
        ("route_layer(Identity)", routes().route_layer(tower::layer::util::Identity::new())),
        ("SentinelLayer::axum(), one rule", routes().route_layer(SentinelLayer::new(one_rule).axum())),
        ("SentinelLayer::axum(), flow + breaker + thread", routes().route_layer(SentinelLayer::new(guarded).axum())),
        ("tower-governor, global limit", routes().route_layer(tower_governor::GovernorLayer::new(global))),
    ];
    let mut g = c.benchmark_group("web");
    g.throughput(Throughput::Elements(1));
    for (case, router) in routers {
        let mut router = router.with_state(());
        g.bench_function(case, |b| b.iter(|| one_request(&mut router)));
    }
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let engine = engine();
    let mut g = c.benchmark_group("two_threads");
    g.throughput(Throughput::Elements(1));
    for threads in [1, 2] {
        g.bench_function(BenchmarkId::new("sentinel-rs, one rule passes", format!("{threads} threads")), |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, || {
                    let r = engine.resource("pass");
                    move || assert!(black_box(r.enter()).is_ok())
                })
            })
        });
        g.bench_function(BenchmarkId::new("sentinel-rs, one rule blocks", format!("{threads} threads")), |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, || {
                    let r = engine.resource("block");
                    move || assert!(black_box(r.enter()).is_err())
                })
            })
        });
        let limiter = Arc::new(governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX)));
        g.bench_function(BenchmarkId::new("governor check()", format!("{threads} threads")), |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, || {
                    let limiter = limiter.clone();
                    move || assert!(black_box(limiter.check()).is_ok())
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, entry_exit, macros, web, two_threads);
criterion_main!(benches);
