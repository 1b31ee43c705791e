//! The web layer's cost in instructions, the one figure that does not move between runs on a shared machine
//! (`scripts/callgrind-web` runs it under valgrind's callgrind and prints instructions per request).
//!
//! `cargo run --release --example web_instructions -- VARIANT [REQUESTS]`
//!
//! Sends `REQUESTS` (default 10,000) `GET /hello` requests through an axum `Router` on the calling thread:
//! each builds the request, waits for the router to be ready, calls it and completes the response future,
//! as a server does per request minus the network and hyper. Callgrind counts only `measured`, which runs
//! after a warm-up of the same length. The variants are those of `web_bench_server`: no layer, an identity
//! route layer, `SentinelLayer` with one passing flow rule (in both body modes, on the cached clock,
//! switched off), tower-governor with one global limit, and a limit per client IP (the layer with a
//! client-IP hot parameter, and tower-governor's default configuration).

use std::error::Error;
use std::hint::black_box;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use futures::FutureExt;
use http::Request;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;
use tower::{Service, ServiceExt};

/// The client of every request.
const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7)), 40000);

fn app(variant: &str) -> Result<Router, Box<dyn Error>> {
    let routes = Router::new().route("/hello", get(|| async { "hello" }));
    let sentinel = |routes: Router, engine: Sentinel, enabled: bool, axum: bool| -> Result<Router, Box<dyn Error>> {
        engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
        engine.set_enabled(enabled);
        let layer = SentinelLayer::new(&engine);
        Ok(if axum { routes.route_layer(layer.axum()) } else { routes.route_layer(layer) })
    };
    Ok(match variant {
        "none" => routes,
        "identity" => routes.route_layer(tower::layer::util::Identity::new()),
        "sentinel" => sentinel(routes, Sentinel::builder().build(), true, false)?,
        "sentinel-axum" => sentinel(routes, Sentinel::builder().build(), true, true)?,
        "sentinel-cached" => sentinel(routes, Sentinel::builder().cached_clock().build(), true, false)?,
        "sentinel-off" => sentinel(routes, Sentinel::builder().build(), false, false)?,
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .ok_or("governor config")?;
            routes.route_layer(tower_governor::GovernorLayer::new(config))
        }
        "sentinel-per-ip" => {
            let engine = Sentinel::builder().build();
            engine.load_flow_rules([FlowRule::new("GET:/hello").count(1e12)])?;
            engine.load_param_flow_rules([ParamFlowRule::new("GET:/hello", 0).count(1e12)])?;
            let layer = SentinelLayer::new(&engine).param(extract::client_ip(TrustedProxies::none()));
            routes.route_layer(layer.axum())
        }
        "governor-per-ip" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .ok_or("governor config")?;
            routes.route_layer(tower_governor::GovernorLayer::new(config))
        }
        other => return Err(format!("unknown variant `{other}`").into()),
    })
}

/// The measured run (callgrind's `--toggle-collect` names it): the same loop as the warm-up.
#[inline(never)]
fn measured(router: &mut Router, n: usize) -> Result<(), Box<dyn Error>> {
    requests(router, n)
}

fn requests(router: &mut Router, n: usize) -> Result<(), Box<dyn Error>> {
    for _ in 0..n {
        let mut req = Request::get("/hello").body(Body::empty())?;
        // What `into_make_service_with_connect_info` adds to every request (the per-IP variants read it).
        req.extensions_mut().insert(ConnectInfo(PEER));
        let ready = ServiceExt::<Request<Body>>::ready(router).now_or_never().ok_or("not ready at once")??;
        let res = ready.call(req).now_or_never().ok_or("not answered at once")??;
        if !res.status().is_success() {
            return Err(format!("answered {}", res.status()).into());
        }
        black_box(res);
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let variant = args.next().ok_or("usage: web_instructions VARIANT [REQUESTS]")?;
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10_000);
    // tower-governor and axum need no reactor for a ready router; a runtime context keeps timers valid.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _in = rt.enter();
    let mut router = app(&variant)?.with_state(());
    requests(&mut router, n)?;
    measured(&mut router, n)?;
    println!("{variant}: {n} requests");
    Ok(())
}
