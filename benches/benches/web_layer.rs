//! One request through a ready service, with and without the Sentinel web layer (`--features axum`).
//!
//! `RUST_BACKTRACE= cargo bench -p sentinel-benches --bench web_layer`
//!
//! Each iteration builds a request, waits for the service to be ready, calls it and drives the response
//! future to completion (every service here answers at once, so one poll does it): what a server does per
//! request minus the network. Variants, in the same run:
//! - `service_fn`: a bare tower `service_fn` ("/hello", named by its cleaned path), alone, behind the
//!   `SentinelLayer` with one passing flow rule, and behind tower's `RateLimit` configured not to limit;
//! - `axum_router`: an axum `Router` with a `/users/{id}` route, alone, behind `route_layer(SentinelLayer)`
//!   with one passing flow rule (named by `MatchedPath`), and with an origin header and a client-IP hot
//!   parameter as well (with a hot-parameter rule that passes), and behind tower-governor's layer with one
//!   global limit that never limits, and with its default configuration (a limit per peer IP);
//! - `axum_router_2_threads`: routers called from two threads at once: bare, the axum-mode layer on an engine
//!   that can drop (whose requests' entries take a hold on their thread's stripe) and on a leaked one (none), with a client-IP hot
//!   parameter, and tower-governor's layer with a global limit and with its per-peer-IP default.

use std::convert::Infallible;
use std::future::ready;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use futures::FutureExt;
use http::{HeaderName, Request, Response};
use http_body_util::Full;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, PeerAddr, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::{Layer, Service, ServiceExt};

#[path = "support/parallel.rs"]
mod parallel;
use parallel::parallel;

/// Builds a request, calls the service once it is ready and completes the response future.
fn one_call<S, B>(svc: &mut S, make: &impl Fn() -> Request<B>)
where
    S: Service<Request<B>>,
    S::Error: std::fmt::Debug,
{
    let ready = svc.ready().now_or_never().expect("ready at once").expect("no error");
    let res = ready.call(make()).now_or_never().expect("answered at once").expect("no error");
    black_box(res);
}

fn engine() -> Sentinel {
    let engine = Sentinel::builder().build();
    // Far above anything a bench reaches: the rule is checked on every call and always passes.
    engine
        .load_flow_rules([FlowRule::new("GET:/hello").count(1e12), FlowRule::new("GET:/users/{id}").count(1e12)])
        .expect("valid rules");
    engine
}

/// The peer of every axum request, as `into_make_service_with_connect_info` records it (tower-governor's
/// default key and the client-IP parameter read it).
const PEER: ([u8; 4], u16) = ([10, 0, 0, 7], 40000);

/// The routes of the axum benches: one route with a path parameter.
fn user_routes() -> axum::Router {
    axum::Router::new().route("/users/{id}", axum::routing::get(|| async { "a user" }))
}

/// `GET /users/42` from [`PEER`] (through `ConnectInfo`).
fn user_request() -> Request<Body> {
    let mut req = Request::get("/users/42").body(Body::empty()).expect("a valid request");
    req.extensions_mut().insert(axum::extract::ConnectInfo(std::net::SocketAddr::from(PEER)));
    req
}

/// [`user_routes`] behind tower-governor's layer with a limit that never limits: one global limit, and its
/// default configuration, a limit per peer IP.
fn governed_routes() -> [axum::Router; 2] {
    let mut never = tower_governor::governor::GovernorConfigBuilder::default();
    never.per_nanosecond(1).burst_size(u32::MAX);
    let per_ip = never.finish().expect("a valid governor configuration");
    let global = never.key_extractor(tower_governor::key_extractor::GlobalKeyExtractor).finish();
    let global = global.expect("a valid governor configuration");
    [
        user_routes().route_layer(tower_governor::GovernorLayer::new(global)),
        user_routes().route_layer(tower_governor::GovernorLayer::new(per_ip)),
    ]
}

fn service_fn(c: &mut Criterion) {
    let mut g = c.benchmark_group("service_fn");
    g.throughput(Throughput::Elements(1));
    let hello = tower::service_fn(|_req: Request<()>| {
        ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello")))))
    });
    let make = || Request::get("/hello").body(()).expect("a valid request");

    let mut bare = hello;
    g.bench_function("bare", |b| b.iter(|| one_call(&mut bare, &make)));

    let engine = engine();
    let mut guarded = SentinelLayer::new(&engine).layer(hello);
    g.bench_function("sentinel_one_passing_rule", |b| b.iter(|| one_call(&mut guarded, &make)));

    // tower's limiter keeps a tokio timer: it is made (and polled) inside a runtime.
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let _in_runtime = rt.enter();
    let mut limited = tower::limit::RateLimitLayer::new(u64::MAX, Duration::from_secs(1)).layer(hello);
    g.bench_function("tower_rate_limit_not_limiting", |b| b.iter(|| one_call(&mut limited, &make)));
    g.finish();
}

fn axum_router(c: &mut Criterion) {
    let mut g = c.benchmark_group("axum_router");
    g.throughput(Throughput::Elements(1));
    let make = || {
        let mut req = user_request();
        req.headers_mut().insert("x-caller", http::HeaderValue::from_static("shop"));
        req.extensions_mut().insert(PeerAddr(PEER.into()));
        req
    };

    // `with_state(())` turns the handlers into routes once, as `axum::serve` does (a `Router` called as it
    // is would rebuild its routes, layers included, on every request).
    let mut bare = user_routes().with_state(());
    g.bench_function("bare", |b| b.iter(|| one_call(&mut bare, &make)));

    let engine = engine();
    let mut guarded = user_routes().route_layer(SentinelLayer::new(&engine)).with_state(());
    g.bench_function("sentinel_one_passing_rule", |b| b.iter(|| one_call(&mut guarded, &make)));
    // The axum mode: responses keep axum's body (no second box per response).
    let mut guarded_axum = user_routes().route_layer(SentinelLayer::new(&engine).axum()).with_state(());
    g.bench_function("sentinel_axum_one_passing_rule", |b| b.iter(|| one_call(&mut guarded_axum, &make)));

    engine.load_param_flow_rules([ParamFlowRule::new("GET:/users/{id}", 0).count(1e12)]).expect("a valid rule");
    let layer = SentinelLayer::new(&engine)
        .origin(extract::header(HeaderName::from_static("x-caller")))
        .param(extract::client_ip(TrustedProxies::none()));
    let mut extracting = user_routes().route_layer(layer).with_state(());
    g.bench_function("sentinel_origin_and_client_ip_param", |b| b.iter(|| one_call(&mut extracting, &make)));

    // tower-governor: one global limit (the peer of the load benchmark), and a limit per peer IP (the peer of
    // the client-IP parameter).
    let [global, per_ip] = governed_routes();
    let mut governed = global.with_state(());
    g.bench_function("tower_governor_not_limiting", |b| b.iter(|| one_call(&mut governed, &make)));
    let mut per_ip = per_ip.with_state(());
    g.bench_function("tower_governor_per_peer_ip_not_limiting", |b| b.iter(|| one_call(&mut per_ip, &make)));
    g.finish();
}

/// Routers called from two threads at once, each thread with its own clone (what a multi-thread runtime's
/// workers do): bare, the axum-mode layer on an engine that can drop (each request's entry takes a hold on the
/// engine's state, on its thread's stripe) and on a leaked one (no hold), the latter with a
/// client-IP hot parameter and a param-flow rule on it as well, and tower-governor's layer with one global limit
/// and with its default per-peer-IP limit (never limiting).
fn axum_router_2_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("axum_router_2_threads");
    g.throughput(Throughput::Elements(1));
    let dropping = engine();
    let leaked = engine().leak();
    let per_client = engine().leak();
    per_client.load_param_flow_rules([ParamFlowRule::new("GET:/users/{id}", 0).count(1e12)]).expect("a valid rule");
    let client_ip_layer = SentinelLayer::new(per_client).param(extract::client_ip(TrustedProxies::none())).axum();
    let [global, per_ip] = governed_routes();
    let routers = [
        ("bare", user_routes()),
        ("sentinel_axum_engine_that_can_drop", user_routes().route_layer(SentinelLayer::new(&dropping).axum())),
        ("sentinel_axum_leaked_engine", user_routes().route_layer(SentinelLayer::new(leaked).axum())),
        ("sentinel_axum_client_ip_param", user_routes().route_layer(client_ip_layer)),
        ("tower_governor_not_limiting", global),
        ("tower_governor_per_peer_ip_not_limiting", per_ip),
    ];
    for (label, router) in routers {
        let router = router.with_state(());
        let worker = || {
            let mut router = router.clone();
            move || one_call(&mut router, &user_request)
        };
        g.bench_function(label, |b| b.iter_custom(|iters| parallel(2, iters, worker)));
    }
    g.finish();
}

criterion_group!(benches, service_fn, axum_router, axum_router_2_threads);
criterion_main!(benches);
