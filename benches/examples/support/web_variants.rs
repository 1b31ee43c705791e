//! The variants of the web layer's benchmarks (`web_bench_server` under wrk, `web_instructions` under
//! callgrind): one hello-world route, `GET /hello`, with one layer each.
//!
//! - `none`: no layer;
//! - `identity`: `route_layer` with tower's `Identity` (what routing through a route layer costs by itself);
//! - `sentinel`: `SentinelLayer` with one flow rule that always passes (checked on every request);
//! - `sentinel-axum`: the same layer in its axum mode (`SentinelLayer::axum`: responses keep axum's body);
//! - `sentinel-guarded`: `sentinel-axum` with a closed error-ratio breaker and a thread-grade flow rule
//!   besides (flow + degrade + thread, none of which ever limits);
//! - `sentinel-cached`: `sentinel` on an engine with `cached_clock()` (a ticker thread refreshes a
//!   millisecond timestamp; what its 1,000 wake-ups a second cost shows against `sentinel`);
//! - `sentinel-off`: `sentinel` with the engine switched off, so every entry passes unchecked: what the
//!   layer does around the engine (naming, the response future, the body), against `identity`;
//!   `sentinel-axum-off`: the same in axum mode;
//! - `governor`: tower-governor's `GovernorLayer`, one global limit that never limits;
//! - `sentinel-per-ip` and `governor-per-ip`: a limit per client address that never limits, as each is
//!   usually deployed: the layer in its axum mode with the client IP as a hot parameter and a param-flow
//!   rule on it (besides the flow rule), and tower-governor's default configuration (its key is the peer's
//!   IP, from `ConnectInfo`);
//! - `sentinel-proxied` and `governor-proxied`: the same per-client limits for a service behind proxies
//!   on private networks, whose client is the address they forward in `X-Forwarded-For`: the client IP with
//!   `TrustedProxies::private_networks()`, and tower-governor's `SmartIpKeyExtractor` (`web_instructions`
//!   sends `X-Forwarded-For: 198.51.100.4` from a private peer for these two; wrk sends none, so under it
//!   both take the peer);
//! - `ratelimit`: tower's `RateLimitLayer` that never limits (not `Clone`: behind a `BufferLayer` with axum's
//!   `HandleErrorLayer`, as axum's docs show; its buffer runs a task, so it needs a running runtime);
//! - `sentinel-headers`: `sentinel-axum` with the RateLimit header fields (a peek of the flow rule's window
//!   and the fields' formatting per request);
//! - `sentinel-gateway` and `sentinel-gateway-headers`: the layer in gateway mode (axum mode), the route and
//!   an API group matching every path (`/**`), a gateway rule per client IP on each that never limits;
//!   and the same with the RateLimit header fields;
//! - `floor`: a layer written by hand that records only what an inbound entry with one flow rule must
//!   (`floor_layer.rs` says what): the floor under `sentinel-axum`.

use std::error::Error;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{BoxError, Router};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, RateLimitHeaders, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::ServiceBuilder;

#[path = "floor_layer.rs"]
mod floor_layer;

/// Every variant's name.
pub const VARIANTS: &[&str] = &[
    "none",
    "identity",
    "sentinel",
    "sentinel-axum",
    "sentinel-guarded",
    "sentinel-cached",
    "sentinel-off",
    "sentinel-axum-off",
    "governor",
    "sentinel-per-ip",
    "governor-per-ip",
    "sentinel-proxied",
    "governor-proxied",
    "ratelimit",
    "sentinel-headers",
    "sentinel-gateway",
    "sentinel-gateway-headers",
    "floor",
];

/// The router of `variant` (built inside a tokio runtime: tower's limiter keeps a tokio timer).
pub fn app(variant: &str) -> Result<Router, Box<dyn Error>> {
    let routes = Router::new().route("/hello", get(|| async { "hello" }));
    Ok(match variant {
        "none" => routes,
        "identity" => routes.route_layer(tower::layer::util::Identity::new()),
        "sentinel" => sentinel(routes, false, true, false)?,
        "sentinel-axum" => sentinel(routes, false, true, true)?,
        "sentinel-guarded" => guarded(routes)?,
        "sentinel-cached" => sentinel(routes, true, true, false)?,
        "sentinel-off" => sentinel(routes, false, false, false)?,
        "sentinel-axum-off" => sentinel(routes, false, false, true)?,
        "sentinel-per-ip" => per_client(routes, TrustedProxies::none())?,
        "sentinel-headers" => {
            let engine = Sentinel::builder().build().leak();
            engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
            let layer = SentinelLayer::new(engine).rate_limit_headers(RateLimitHeaders::new());
            routes.route_layer(layer.axum())
        }
        "sentinel-gateway" => gateway(routes, false)?,
        "sentinel-gateway-headers" => gateway(routes, true)?,
        "sentinel-proxied" => per_client(routes, TrustedProxies::private_networks())?,
        "governor" | "governor-per-ip" | "governor-proxied" => {
            // A limit that never limits: one global one, tower-governor's default (per peer IP), or per client
            // IP as proxies forward it.
            let mut never = tower_governor::governor::GovernorConfigBuilder::default();
            never.per_nanosecond(1).burst_size(u32::MAX);
            use tower_governor::key_extractor::{GlobalKeyExtractor, SmartIpKeyExtractor};
            match variant {
                "governor" => {
                    let global = never.key_extractor(GlobalKeyExtractor).finish();
                    routes.route_layer(tower_governor::GovernorLayer::new(global.ok_or("governor config")?))
                }
                "governor-proxied" => {
                    let smart = never.key_extractor(SmartIpKeyExtractor).finish();
                    routes.route_layer(tower_governor::GovernorLayer::new(smart.ok_or("governor config")?))
                }
                _ => routes.route_layer(tower_governor::GovernorLayer::new(never.finish().ok_or("governor config")?)),
            }
        }
        "floor" => routes.route_layer(floor_layer::FloorLayer::new()),
        "ratelimit" => routes.route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: BoxError| async { StatusCode::TOO_MANY_REQUESTS }))
                .buffer(1024)
                .rate_limit(u64::MAX, Duration::from_secs(1)),
        ),
        other => return Err(format!("unknown variant `{other}`: one of {}", VARIANTS.join(", ")).into()),
    })
}

/// The layer in its axum mode with the client IP (behind `trusted` proxies) as a hot parameter, a param-flow
/// rule on it and a flow rule, none of which ever limits.
fn per_client(routes: Router, trusted: TrustedProxies) -> Result<Router, Box<dyn Error>> {
    let engine = Sentinel::builder().build().leak();
    engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
    engine.load_param_flow_rules([ParamFlowRule::new("GET:/hello", 0).count(1e12)])?;
    let layer = SentinelLayer::new(engine).param(extract::client_ip(trusted));
    Ok(routes.route_layer(layer.axum()))
}

/// The layer in gateway mode, in its axum mode: the route `GET:/hello` and an API group `greetings`
/// (`/**`) it belongs to, a gateway rule per client IP on each, none of which ever limits; `headers`:
/// the RateLimit header fields as well.
fn gateway(routes: Router, headers: bool) -> Result<Router, Box<dyn Error>> {
    use sentinel_runtime::web::gateway::{
        ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ResourceMode,
    };
    let engine = Sentinel::builder().build().leak();
    engine.load_api_definitions([ApiDefinition::new("greetings").item(ApiPredicateItem::prefix("/**"))])?;
    engine.load_gateway_rules([
        GatewayFlowRule::new("GET:/hello").count(1e12).param_item(GatewayParamItem::client_ip()),
        GatewayFlowRule::new("greetings")
            .resource_mode(ResourceMode::CustomApiName)
            .count(1e12)
            .param_item(GatewayParamItem::client_ip()),
    ])?;
    let layer = SentinelLayer::new(engine).gateway(TrustedProxies::none());
    let layer = if headers { layer.rate_limit_headers(RateLimitHeaders::new()) } else { layer };
    Ok(routes.route_layer(layer.axum()))
}

/// The layer in its axum mode with a flow rule, a thread-grade flow rule and a closed error-ratio breaker,
/// none of which ever limits.
fn guarded(routes: Router) -> Result<Router, Box<dyn Error>> {
    let engine = Sentinel::builder().build().leak();
    engine.load_flow_rules([
        FlowRule::new("GET:/hello").count(1e12),
        FlowRule::new("GET:/hello").grade(FlowGrade::Thread).count(1e9),
    ])?;
    engine.load_degrade_rules([DegradeRule::new("GET:/hello", DegradeGrade::ErrorRatio)
        .count(0.5)
        .min_request_amount(5)
        .time_window_sec(10)])?;
    Ok(routes.route_layer(SentinelLayer::new(engine).axum()))
}

/// `SentinelLayer` over `routes` with one flow rule that always passes; `cached`: the engine reads a ticker
/// thread's cached time instead of the CPU's clock; `enabled: false`: the engine is switched off (every
/// entry passes unchecked), which leaves what the layer itself does per request.
fn sentinel(routes: Router, cached: bool, enabled: bool, axum: bool) -> Result<Router, Box<dyn Error>> {
    let builder = if cached { Sentinel::builder().cached_clock() } else { Sentinel::builder() };
    let engine = builder.build().leak();
    engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
    engine.set_enabled(enabled);
    let layer = SentinelLayer::new(engine);
    Ok(if axum { routes.route_layer(layer.axum()) } else { routes.route_layer(layer) })
}
