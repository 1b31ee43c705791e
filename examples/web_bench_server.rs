//! The hello-world axum service of the web layer's load benchmark (`scripts/bench-web` drives it with wrk).
//!
//! `cargo run --release --example web_bench_server -- --variant VARIANT [--addr 127.0.0.1:8080] [--workers 1]`
//!
//! Variants, one layer each on `GET /hello`:
//! - `none`: no layer;
//! - `identity`: `route_layer` with tower's `Identity` (what routing through a route layer costs by itself);
//! - `sentinel`: `SentinelLayer` with one flow rule that always passes (checked on every request);
//! - `sentinel-axum`: the same layer in its axum mode (`SentinelLayer::axum`: responses keep axum's body);
//! - `governor`: tower-governor's `GovernorLayer`, one global limit that never limits;
//! - `ratelimit`: tower's `RateLimitLayer` that never limits (not `Clone`: behind a `BufferLayer` with axum's
//!   `HandleErrorLayer`, as axum's docs show);
//! - `sentinel-per-ip` and `governor-per-ip`: a limit per client address that never limits, as each is
//!   usually deployed: the layer in its axum mode with the client IP as a hot parameter and a param-flow
//!   rule on it (besides the flow rule), and tower-governor's default configuration (its key is the peer's
//!   IP, from `ConnectInfo`).
//!
//! Two more split the layer's cost (`VARIANTS=... scripts/bench-web`):
//! - `sentinel-cached`: `sentinel` on an engine with `cached_clock()` (a ticker thread refreshes a millisecond
//!   timestamp; what its 1,000 wake-ups a second cost shows against `sentinel`);
//! - `sentinel-off`: `sentinel` with the engine switched off, so every entry passes unchecked: what the layer
//!   does around the engine (naming, the response future, the body), against `identity`.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{BoxError, Router};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::ServiceBuilder;

async fn hello() -> &'static str {
    "hello"
}

/// `SentinelLayer` over `routes` with one flow rule that always passes; `cached`: the engine reads a ticker
/// thread's cached time instead of the CPU's clock; `enabled: false`: the engine is switched off (every
/// entry passes unchecked), which leaves what the layer itself does per request.
fn sentinel(routes: Router, cached: bool, enabled: bool, axum: bool) -> Result<Router, Box<dyn Error>> {
    let engine = if cached { Sentinel::builder().cached_clock().build().leak() } else { Sentinel::global() };
    engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
    engine.set_enabled(enabled);
    let layer = SentinelLayer::new(engine);
    Ok(if axum { routes.route_layer(layer.axum()) } else { routes.route_layer(layer) })
}

/// `SentinelLayer` (axum mode) with the flow rule and a per-client-IP param-flow rule, neither of which limits.
fn sentinel_per_ip(routes: Router) -> Result<Router, Box<dyn Error>> {
    let engine = Sentinel::global();
    engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
    engine.load_param_flow_rules([ParamFlowRule::new("GET:/hello", 0).count(1e12)])?;
    let layer = SentinelLayer::new(engine).param(extract::client_ip(TrustedProxies::none()));
    Ok(routes.route_layer(layer.axum()))
}

fn app(variant: &str) -> Result<Router, Box<dyn Error>> {
    let routes = Router::new().route("/hello", get(hello));
    Ok(match variant {
        "none" => routes,
        "sentinel" => sentinel(routes, false, true, false)?,
        "sentinel-axum" => sentinel(routes, false, true, true)?,
        "sentinel-cached" => sentinel(routes, true, true, false)?,
        "sentinel-off" => sentinel(routes, false, false, false)?,
        "identity" => routes.route_layer(tower::layer::util::Identity::new()),
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .ok_or("governor config")?;
            routes.route_layer(tower_governor::GovernorLayer::new(config))
        }
        "sentinel-per-ip" => sentinel_per_ip(routes)?,
        "governor-per-ip" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .ok_or("governor config")?;
            routes.route_layer(tower_governor::GovernorLayer::new(config))
        }
        "ratelimit" => routes.route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: BoxError| async { StatusCode::TOO_MANY_REQUESTS }))
                .buffer(1024)
                .rate_limit(u64::MAX, Duration::from_secs(1)),
        ),
        other => {
            return Err(format!(
                "unknown variant `{other}`: none, identity, sentinel, sentinel-axum, governor, ratelimit, \
                 sentinel-cached, sentinel-off, sentinel-per-ip or governor-per-ip"
            )
            .into())
        }
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut variant = String::from("none");
    let mut addr: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let mut workers = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--variant" => variant = v,
            "--addr" => addr = v.parse()?,
            "--workers" => workers = v.parse()?,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?;
    rt.block_on(async move {
        // Built inside the runtime: tower's limiter keeps a tokio timer.
        let app = app(&variant)?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!("{variant} on http://{}", listener.local_addr()?);
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
        Ok(())
    })
}
