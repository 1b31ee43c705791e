//! An axum API gateway in front of two small backends, with Sentinel's gateway flow control: API groups,
//! gateway rules per client IP and per header read from Java's rule files, the RateLimit header fields on
//! every response, and the command center with its console (the Sentinel Dashboard shows its gateway pages
//! for this application).
//!
//! Run: `cargo run --example gateway` (stops on Ctrl-C), or `-- --duration 30` to stop by itself. It prints
//! the `curl` lines that show each rule.
//!
//! - backends: `products` (`/product/{id}`) and `orders` (`/order/{id}`), each on its own loopback port;
//! - the gateway forwards `GET /product/{id}` and `GET /order/{id}` to them;
//! - API groups (`gw-api-definitions.json`): `product_api` (`/product/**`), `order_api` (a regex);
//! - gateway rules (`gw-flow-rules.json`): `product_api` 5 requests a second per client IP, `order_api` 2 a
//!   second per `X-Tenant` header value, and the route `/order/{id}` 20 a second as a whole.
//!
//! The rule files sit in a fresh private directory (printed at start); rules pushed from the console or the
//! dashboard are written back to them.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use sentinel_runtime::datasource::FileDataSource;
use sentinel_runtime::transport::CommandCenter;
use sentinel_runtime::web::{RateLimitHeaders, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;

const API_DEFINITIONS: &str = r#"[
  {"apiName": "product_api", "predicateItems": [{"pattern": "/product/**", "matchStrategy": 1}]},
  {"apiName": "order_api", "predicateItems": [{"pattern": "/order/[0-9]+", "matchStrategy": 2}]}
]"#;

const GATEWAY_RULES: &str = r#"[
  {"resource": "product_api", "resourceMode": 1, "count": 5, "paramItem": {"parseStrategy": 0}},
  {"resource": "order_api", "resourceMode": 1, "count": 2, "paramItem": {"parseStrategy": 2, "fieldName": "X-Tenant"}},
  {"resource": "/order/{id}", "resourceMode": 0, "count": 20}
]"#;

/// Serves `app` on a fresh loopback port, with the peer address for the client-IP rules.
async fn serve(app: Router) -> Result<SocketAddr, Box<dyn Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
    });
    Ok(addr)
}

/// The backends and the client the gateway forwards with.
#[derive(Clone)]
struct Upstreams {
    products: SocketAddr,
    orders: SocketAddr,
    client: reqwest::Client,
}

async fn forward(up: &Upstreams, backend: SocketAddr, path: String) -> (StatusCode, String) {
    match up.client.get(format!("http://{backend}{path}")).send().await {
        Ok(r) => {
            let status = StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, r.text().await.unwrap_or_default())
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("upstream: {e}\n")),
    }
}

fn args() -> Result<Option<Duration>, Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (None, _) => Ok(None),
        (Some("--duration"), Some(secs)) => Ok(Some(Duration::from_secs(secs.parse()?))),
        _ => Err("usage: gateway [--duration SECONDS]".into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let duration = args()?;
    let products = serve(Router::new().route(
        "/product/{id}",
        get(|Path(id): Path<u32>| async move { format!("product {id} from the products backend\n") }),
    ))
    .await?;
    let orders = serve(Router::new().route(
        "/order/{id}",
        get(|Path(id): Path<u32>| async move { format!("order {id} from the orders backend\n") }),
    ))
    .await?;

    // The rules, as Java's gateway files in a rules directory.
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("gw-api-definitions.json"), API_DEFINITIONS)?;
    std::fs::write(dir.path().join("gw-flow-rules.json"), GATEWAY_RULES)?;
    let engine = Sentinel::builder().app_name("sentinel-gateway-example").build();
    let source = FileDataSource::new(&engine, dir.path());
    source.reload_now()?;

    let upstreams = Upstreams { products, orders, client: reqwest::Client::builder().no_proxy().build()? };
    let layer = SentinelLayer::new(&engine)
        .method_prefix(false)
        .gateway(TrustedProxies::none())
        .rate_limit_headers(RateLimitHeaders::new().legacy(true));
    let gateway = Router::new()
        .route(
            "/product/{id}",
            get(|State(up): State<Upstreams>, Path(id): Path<u32>| async move {
                forward(&up, up.products, format!("/product/{id}")).await
            }),
        )
        .route(
            "/order/{id}",
            get(|State(up): State<Upstreams>, Path(id): Path<u32>| async move {
                forward(&up, up.orders, format!("/order/{id}")).await
            }),
        )
        .route_layer(layer.axum())
        .with_state(upstreams);
    let addr = serve(gateway).await?;

    let center = CommandCenter::builder(&engine).port(0).data_source(source).start()?;
    println!("rules in {}", dir.path().display());
    println!("console: http://{}/", center.local_addr());
    println!("gateway: http://{addr} (products on {products}, orders on {orders})\n");
    println!("# product_api, 5 a second per client IP: the 6th request within a second gets 429");
    println!(
        "for i in $(seq 6); do curl -si http://{addr}/product/$i | grep -iE '^(HTTP|ratelimit|retry-after)'; done"
    );
    println!("# order_api, 2 a second per X-Tenant: acme runs out, globex has its own budget");
    println!("for t in acme acme acme globex; do curl -si -H \"X-Tenant: $t\" http://{addr}/order/1 | head -1; done");
    println!("# the rules as the dashboard reads them");
    println!("curl -s http://{}/gateway/getRules; echo", center.local_addr());
    println!("curl -s http://{}/gateway/getApiDefinitions; echo", center.local_addr());

    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending::<()>().await, // until Ctrl-C ends the process
    }
    Ok(())
}
