//! What the web layer allocates per request, counted with a counting global allocator (per thread; each
//! request is run to completion on the test's thread): nothing over the router's own in axum mode, and one
//! box in gateway mode (its API groups' entries), whatever rules read the client's address.

use std::net::SocketAddr;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::web::gateway::{
    ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ResourceMode,
};
use sentinel_runtime::web::{PeerAddr, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::{Service, ServiceExt};

#[path = "../sentinel-runtime/tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

fn routes() -> Router {
    Router::new().route("/product/{id}", get(|| async { "product" }))
}

/// Allocations per request through `router`, after a warm-up, from the peer 10.0.0.2 with `forwarded` as
/// its `X-Forwarded-For` (when given). The router's handlers are made into services once, as `axum::serve`
/// does (called as it is, a router applies its route layers anew on every request).
fn allocations_per_request(router: &Router, forwarded: Option<&str>) -> usize {
    let mut router = router.clone().with_state(());
    let peer: SocketAddr = "10.0.0.2:4000".parse().expect("an address");
    let mut one = || {
        let mut b = Request::get("/product/7");
        if let Some(f) = forwarded {
            b = b.header("x-forwarded-for", f);
        }
        let mut req = b.body(Body::empty()).expect("a request");
        req.extensions_mut().insert(PeerAddr(peer));
        let ready = futures::executor::block_on(ServiceExt::<Request<Body>>::ready(&mut router)).expect("ready");
        let response = futures::executor::block_on(ready.call(req)).expect("a response");
        assert_eq!(response.status(), 200);
    };
    for _ in 0..100 {
        one();
    }
    const N: usize = 1_000;
    let before = allocations();
    for _ in 0..N {
        one();
    }
    let per = (allocations() - before) as f64 / N as f64;
    assert_eq!(per.fract(), 0.0, "the same allocations every request: {per}");
    per as usize
}

#[test]
fn the_layer_allocates_nothing_per_request_and_gateway_mode_one_box() {
    let identity = routes().route_layer(tower::layer::util::Identity::new());
    let baseline = allocations_per_request(&identity, None);

    let engine = Sentinel::builder().build().leak();
    engine.load_flow_rules([FlowRule::new("GET:/product/{id}").count(1e12)]).unwrap();
    let plain = routes().route_layer(SentinelLayer::new(engine).axum());
    assert_eq!(allocations_per_request(&plain, None), baseline, "axum mode, one rule");

    // The route and an API group, each with a rule per client IP (the peer's address, written out) and one
    // per header; the path is matched against an Ant pattern.
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
    let gateway = routes().route_layer(SentinelLayer::new(&engine).gateway(TrustedProxies::none()).axum());
    assert_eq!(allocations_per_request(&gateway, None), baseline + 1, "gateway mode: the API groups' box");

    // Behind a trusted proxy, an IPv6 client written out.
    let proxied = routes().route_layer(SentinelLayer::new(&engine).gateway(TrustedProxies::private_networks()).axum());
    let forwarded = allocations_per_request(&proxied, Some("2001:db8::7"));
    let identity_forwarded = allocations_per_request(&identity, Some("2001:db8::7"));
    assert_eq!(forwarded, identity_forwarded + 1, "gateway mode behind a proxy");
}
