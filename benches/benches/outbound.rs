//! The outbound guard's cost per call (`--features reqwest,axum`).
//!
//! `cargo bench -p sentinel-benches --bench outbound`
//!
//! - `outbound_service_fn`: a tower `service_fn` client that answers at once (200, empty body), bare, behind
//!   `SentinelClientLayer` with a passing flow rule on its resource (`GET:inventory.svc/items/{id}`, the id
//!   folded by the path cleaner), with a closed slow-ratio breaker as well, and behind tower-resilience's
//!   circuit breaker (closed, counting 5xx) as a peer. Each iteration builds a request, calls the ready
//!   service and completes the response future (one poll);
//! - `outbound_service_fn_threads`: the bare client and the guarded one (one passing flow rule) called from one
//!   thread and from two at once, each thread with its own clone of the service (aggregate time per call:
//!   a guard that scales costs about half its one-thread figure on two threads);
//! - `outbound_reqwest_loopback`: a reqwest-middleware client calling an axum server on 127.0.0.1 (one
//!   GET and its body, on a current-thread runtime), without middleware and with `SentinelMiddleware`.

use std::convert::Infallible;
use std::future::ready;

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::outbound::{SentinelClientLayer, SentinelMiddleware};
use sentinel_runtime::Sentinel;
use tower::{Layer, Service, ServiceExt};
use tower_resilience::circuitbreaker::CircuitBreakerLayer;

#[path = "support/parallel.rs"]
mod parallel;
use parallel::parallel;

const RESOURCE: &str = "GET:inventory.svc/items/{id}";

fn call<S>(svc: &mut S, id: u64)
where
    S: Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    let request = Request::get(format!("http://inventory.svc/items/{id}")).body(()).expect("a request");
    let ready = svc.ready().now_or_never().expect("ready at once").expect("no error");
    black_box(ready.call(request).now_or_never().expect("answered at once").expect("no error"));
}

fn engine(breaker: bool) -> Sentinel {
    let engine = Sentinel::builder().build().leak().clone();
    engine.load_flow_rules([FlowRule::new(RESOURCE).count(1e12)]).expect("a valid rule");
    if breaker {
        engine
            .load_degrade_rules([DegradeRule::new(RESOURCE, DegradeGrade::SlowRequestRatio)
                .count(1_000.0)
                .slow_ratio_threshold(0.5)
                .time_window_sec(10)])
            .expect("a valid rule");
    }
    engine
}

fn service_fn_client(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _in_runtime = rt.enter();
    let client =
        tower::service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))));
    let mut g = c.benchmark_group("outbound_service_fn");
    g.throughput(Throughput::Elements(1));
    let mut id = 0u64;
    let mut bare = client;
    g.bench_function("bare", |b| {
        b.iter(|| {
            id += 1;
            call(&mut bare, id)
        })
    });
    let mut guarded = SentinelClientLayer::new(&engine(false)).layer(client);
    g.bench_function("sentinel_flow_rule", |b| {
        b.iter(|| {
            id += 1;
            call(&mut guarded, id)
        })
    });
    let mut guarded = SentinelClientLayer::new(&engine(true)).layer(client);
    g.bench_function("sentinel_flow_rule_and_breaker", |b| {
        b.iter(|| {
            id += 1;
            call(&mut guarded, id)
        })
    });
    let breaker = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .classify_response(|r: &Response<Full<Bytes>>| r.status().is_server_error())
        .build()
        .expect("a valid breaker");
    let mut peer = breaker.layer(client);
    g.bench_function("tower_resilience_breaker", |b| {
        b.iter(|| {
            id += 1;
            call(&mut peer, id)
        })
    });
    g.finish();
}

fn service_fn_threads(c: &mut Criterion) {
    let client =
        tower::service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))));
    let guarded = SentinelClientLayer::new(&engine(false)).layer(client);
    let mut g = c.benchmark_group("outbound_service_fn_threads");
    g.throughput(Throughput::Elements(1));
    for threads in [1, 2] {
        g.bench_function(BenchmarkId::new("bare", format!("{threads} threads")), |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, || {
                    let (mut svc, mut id) = (client, 0u64);
                    move || {
                        id += 1;
                        call(&mut svc, id)
                    }
                })
            })
        });
        g.bench_function(BenchmarkId::new("sentinel_flow_rule", format!("{threads} threads")), |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, || {
                    let (mut svc, mut id) = (guarded.clone(), 0u64);
                    move || {
                        id += 1;
                        call(&mut svc, id)
                    }
                })
            })
        });
    }
    g.finish();
}

fn reqwest_loopback(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("an address");
        let app = axum::Router::new().route("/items/{id}", axum::routing::get(|| async { "42" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    });
    let resource = format!("GET:{addr}/items/{{id}}");
    let engine = Sentinel::builder().build().leak().clone();
    engine.load_flow_rules([FlowRule::new(&resource).count(1e12)]).expect("a valid rule");
    let plain = reqwest::Client::builder().no_proxy().build().expect("a client");
    let bare = reqwest_middleware::ClientBuilder::new(plain.clone()).build();
    let guarded = reqwest_middleware::ClientBuilder::new(plain).with(SentinelMiddleware::new(&engine)).build();
    let mut g = c.benchmark_group("outbound_reqwest_loopback");
    g.throughput(Throughput::Elements(1));
    for (name, client) in [("bare", &bare), ("sentinel_middleware", &guarded)] {
        let mut id = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                id += 1;
                rt.block_on(async {
                    let r = client.get(format!("http://{addr}/items/{id}")).send().await.expect("an answer");
                    black_box(r.bytes().await.expect("a body"))
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, service_fn_client, service_fn_threads, reqwest_loopback);
criterion_main!(benches);
