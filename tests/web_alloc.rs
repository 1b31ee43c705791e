//! What the web layer allocates per request, counted with a counting global allocator (per thread; each
//! request is run to completion on the test's thread): nothing over the router's own in axum mode, and one
//! box in gateway mode (its API groups' entries), whatever rules read the client's address; nothing either
//! outside a router, where the name is the cleaned path; the RateLimit header fields one value each. The
//! outbound guard allocates nothing over the client's own per call, its name included.

use std::net::SocketAddr;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::outbound::SentinelClientLayer;
use sentinel_runtime::web::gateway::{
    ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ResourceMode,
};
use sentinel_runtime::web::{PeerAddr, RateLimitHeaders, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::{Layer, Service, ServiceExt};

#[path = "../sentinel-runtime/tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

fn routes() -> Router {
    Router::new().route("/product/{id}", get(|| async { "product" }))
}

/// Allocations per run of `one` (the same in every run), after a warm-up.
fn allocations_per_run(mut one: impl FnMut()) -> usize {
    for _ in 0..100 {
        one();
    }
    const N: usize = 1_000;
    let before = allocations();
    for _ in 0..N {
        one();
    }
    let counted = allocations() - before;
    assert_eq!(counted % N, 0, "the same allocations every run: {counted} in {N}");
    counted / N
}

/// The status of `svc`'s answer to `req`, the call run to completion on this thread.
fn status<S, R, B>(svc: &mut S, req: R) -> u16
where
    S: Service<R, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
{
    let ready = futures::executor::block_on(ServiceExt::<R>::ready(svc)).expect("ready");
    futures::executor::block_on(ready.call(req)).expect("a response").status().as_u16()
}

/// Allocations per request through `router` from the peer 10.0.0.2 with `forwarded` as its `X-Forwarded-For`
/// (when given). The router's handlers are made into services once, as `axum::serve` does (called as it is,
/// a router applies its route layers anew on every request).
fn allocations_per_request(router: &Router, forwarded: Option<&str>) -> usize {
    let mut router = router.clone().with_state(());
    let peer: SocketAddr = "10.0.0.2:4000".parse().expect("an address");
    allocations_per_run(|| {
        let mut b = Request::get("/product/7");
        if let Some(f) = forwarded {
            b = b.header("x-forwarded-for", f);
        }
        let mut req = b.body(Body::empty()).expect("a request");
        req.extensions_mut().insert(PeerAddr(peer));
        assert_eq!(status(&mut router, req), 200);
    })
}

/// The route and an API group, each with a rule per client IP (the peer's address, written out) and one per
/// header; the path is matched against an Ant pattern.
fn gateway_engine() -> Sentinel {
    let engine = Sentinel::builder().build();
    engine
        .load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))])
        .unwrap();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("GET:/product/{id}").count(1e12).param_item(GatewayParamItem::client_ip()),
            GatewayFlowRule::new("products")
                .resource_mode(ResourceMode::CustomApiName)
                .count(1e12)
                .param_item(GatewayParamItem::client_ip()),
            GatewayFlowRule::new("products")
                .resource_mode(ResourceMode::CustomApiName)
                .count(1e12)
                .param_item(GatewayParamItem::header("x-user")),
        ])
        .unwrap();
    engine
}

/// The routes behind an identity layer: what the router allocates per request on its own.
fn identity() -> Router {
    routes().route_layer(tower::layer::util::Identity::new())
}

/// An engine with one passing flow rule on `resource`.
fn one_rule_engine(resource: &str) -> &'static Sentinel {
    let engine = Sentinel::builder().build().leak();
    engine.load_flow_rules([FlowRule::new(resource).count(1e12)]).unwrap();
    engine
}

#[test]
fn the_layer_allocates_nothing_per_request_and_gateway_mode_one_box() {
    let identity = identity();
    let baseline = allocations_per_request(&identity, None);

    let engine = one_rule_engine("GET:/product/{id}");
    let plain = routes().route_layer(SentinelLayer::new(engine).axum());
    assert_eq!(allocations_per_request(&plain, None), baseline, "axum mode, one rule");

    let engine = gateway_engine();
    let gateway = routes().route_layer(SentinelLayer::new(&engine).gateway(TrustedProxies::none()).axum());
    assert_eq!(allocations_per_request(&gateway, None), baseline + 1, "gateway mode: the API groups' box");

    // Behind a trusted proxy, an IPv6 client written out.
    let proxied = routes().route_layer(SentinelLayer::new(&engine).gateway(TrustedProxies::private_networks()).axum());
    let forwarded = allocations_per_request(&proxied, Some("2001:db8::7"));
    let identity_forwarded = allocations_per_request(&identity, Some("2001:db8::7"));
    assert_eq!(forwarded, identity_forwarded + 1, "gateway mode behind a proxy");
}

/// Allocations per outbound call through `client` to `url` (building the request included).
fn allocations_per_call<S, B>(client: &mut S, url: &str) -> usize
where
    S: Service<Request<()>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
{
    allocations_per_run(|| assert_eq!(status(client, Request::get(url).body(()).expect("a request")), 200))
}

#[test]
fn the_outbound_guard_allocates_nothing_per_call_over_the_client() {
    let bare = || {
        tower::service_fn(|_req: Request<()>| {
            std::future::ready(Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty())))
        })
    };
    let engine = one_rule_engine("GET:inventory.svc/items/{id}");
    let mut guarded = SentinelClientLayer::new(engine).layer(bare());
    for url in
        ["http://inventory.svc/items/42", "http://inventory.svc:8080/items/0f8fad5b-d9cb-469f-a165-70867728950e/stock"]
    {
        let baseline = allocations_per_call(&mut bare(), url);
        assert_eq!(allocations_per_call(&mut guarded, url), baseline, "{url}");
    }
}

#[test]
fn outside_a_router_the_layer_allocates_nothing_per_request_for_a_path_it_cleans() {
    // A hyper server's service (no axum route): the resource is `METHOD:` and the path with identifiers
    // folded, `GET:/product/{id}/reviews/{id}`.
    let bare = || {
        tower::service_fn(|_req: Request<Body>| {
            std::future::ready(Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty())))
        })
    };
    let engine = one_rule_engine("GET:/product/{id}/reviews/{id}");
    let mut service = SentinelLayer::new(engine).layer(bare());
    let path = "/product/7/reviews/0f8fad5b-d9cb-469f-a165-70867728950e";
    let request = || Request::get(path).body(Body::empty()).expect("a request");
    let mut plain = bare();
    let baseline = allocations_per_run(|| assert_eq!(status(&mut plain, request()), 200));
    let layered = allocations_per_run(|| assert_eq!(status(&mut service, request()), 200));
    assert_eq!(layered, baseline);
    assert_eq!(
        engine.resource_names().iter().filter(|n| n.contains("{id}")).count(),
        1,
        "{:?}",
        engine.resource_names()
    );
}

#[test]
fn rate_limit_headers_allocate_one_value_per_field() {
    // Over the plain layer: the request's extras' box (as gateway mode's), and each field's value once (a
    // header value owns its bytes); the lists are serialized into buffers the thread keeps. The older
    // fields add their three values and the growth of the response's header map past its first table.
    let baseline = allocations_per_request(&identity(), None);
    let engine = one_rule_engine("GET:/product/{id}");
    let layer = |h: RateLimitHeaders| routes().route_layer(SentinelLayer::new(engine).rate_limit_headers(h).axum());
    let fields = allocations_per_request(&layer(RateLimitHeaders::new()), None);
    assert_eq!(fields, baseline + 1 + 2, "RateLimit and RateLimit-Policy");
    let legacy = allocations_per_request(&layer(RateLimitHeaders::new().legacy(true)), None);
    assert_eq!(legacy, fields + 3 + 2, "and x-ratelimit-limit, -remaining, -reset");

    // Gateway mode (whose box the fields share): policies of hot parameters, named `resource#index` as
    // the request's checks pass.
    let engine = gateway_engine();
    let gateway = |h: Option<RateLimitHeaders>| {
        let layer = SentinelLayer::new(&engine).gateway(TrustedProxies::none());
        routes().route_layer(match h {
            Some(h) => layer.rate_limit_headers(h).axum(),
            None => layer.axum(),
        })
    };
    let plain = allocations_per_request(&gateway(None), None);
    assert_eq!(allocations_per_request(&gateway(Some(RateLimitHeaders::new())), None), plain + 2);
}
