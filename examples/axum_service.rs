//! A small shop API in axum, guarded by the Sentinel web layer.
//!
//! Run: `cargo run --example axum_service` (listens on 127.0.0.1:3000 and prints what to `curl`), with
//! `--addr HOST:PORT` to listen elsewhere, `--duration SECS` to stop by itself, `--demo` to send the curl
//! requests itself and print what came back, `--rules PATH` for another rules file.
//!
//! - Routes with path parameters; each route template is one resource (`GET:/products/{id}`).
//! - Rules from `examples/rules/axum-shop.json` (Sentinel's JSON format), hot-reloaded: edit the file while
//!   the example runs and the new limits apply at once (a broken edit is reported; the rules in force stay).
//! - The caller's origin from the `x-caller` header (an authority rule shuts out `blocked-app`). The client
//!   chooses that header, so this black list only stops callers that name themselves: in production take the
//!   origin from the peer address (`extract::peer_ip`) or from an identity your authentication established.
//! - A hot-parameter rule per client IP (`X-Forwarded-For` is believed from loopback, as from a local proxy).
//! - A circuit breaker that opens on server errors (`GET /orders/0` fails), answering 503 with `Retry-After`.
//! - `POST /orders` queues (rate limiter): excess requests wait on a timer instead of failing.

use std::error::Error;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::http::{HeaderName, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use sentinel_runtime::datasource::FileDataSource;
use sentinel_runtime::web::{extract, SentinelLayer, TrustedProxies};
use sentinel_runtime::Sentinel;

const DEFAULT_RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules/axum-shop.json");

struct Args {
    addr: SocketAddr,
    duration: Option<Duration>,
    rules: String,
    demo: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
        duration: None,
        rules: DEFAULT_RULES.to_string(),
        demo: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--addr" => {
                let v = value("--addr")?;
                args.addr =
                    v.parse().map_err(|e| format!("--addr {v}: {e} (expected HOST:PORT, e.g. 127.0.0.1:3000)"))?;
            }
            "--duration" => {
                let v = value("--duration")?;
                let secs: f64 = v.parse().map_err(|e| format!("--duration {v}: {e} (expected seconds)"))?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err(format!("--duration {v}: expected a positive number of seconds"));
                }
                args.duration = Some(Duration::from_secs_f64(secs));
            }
            "--rules" => args.rules = value("--rules")?,
            "--demo" => args.demo = true,
            "-h" | "--help" => {
                println!("usage: axum_service [--addr HOST:PORT] [--duration SECS] [--rules PATH] [--demo]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    Ok(args)
}

const CATALOG: [&str; 4] = ["kettle", "teapot", "mug", "strainer"];

async fn products() -> Json<Vec<String>> {
    Json(CATALOG.iter().enumerate().map(|(i, n)| format!("{i}:{n}")).collect())
}

async fn product(Path(id): Path<u64>) -> Result<String, StatusCode> {
    let name = CATALOG.get(id as usize).ok_or(StatusCode::NOT_FOUND)?;
    Ok(format!("product {id}: {name}\n"))
}

async fn place_order() -> (StatusCode, &'static str) {
    (StatusCode::CREATED, "order placed\n")
}

async fn order(Path(id): Path<u64>) -> (StatusCode, String) {
    if id == 0 {
        // The order database is down for this one: a 5xx, counted as an error by the breaker.
        return (StatusCode::INTERNAL_SERVER_ERROR, "the order database is down\n".into());
    }
    (StatusCode::OK, format!("order {id}: shipped\n"))
}

fn app(engine: &Sentinel) -> Result<Router, Box<dyn Error>> {
    let layer = SentinelLayer::new(engine)
        .origin(extract::header(HeaderName::from_static("x-caller")))
        .param(extract::client_ip(TrustedProxies::new(["127.0.0.1", "::1"])?))
        // Responses keep axum's body (axum would box the layer's once more per response).
        .axum();
    Ok(Router::new()
        .route("/products", get(products))
        .route("/products/{id}", get(product))
        .route("/orders", post(place_order))
        .route("/orders/{id}", get(order))
        .route_layer(layer)
        // Added after the layer: not guarded.
        .route("/health", get(|| async { "ok\n" })))
}

fn print_curls(addr: SocketAddr) {
    let base = format!("http://{addr}");
    println!("try:");
    println!("  curl -i {base}/products/1                      # 200; a route template is one resource");
    println!("  for i in $(seq 5); do curl -s -o /dev/null -w '%{{http_code}} ' {base}/products/1; done; echo");
    println!("                                                    # 200 200 200 429 429: 3 per second per client IP");
    println!("  curl -i -H 'x-forwarded-for: 203.0.113.7' {base}/products/1   # another client: its own budget");
    println!("  curl -i -X POST -H 'x-caller: blocked-app' {base}/orders      # 403: authority rule");
    println!("  for i in $(seq 4); do curl -s -X POST -w ' %{{time_total}}s\\n' {base}/orders; done");
    println!("                                                    # queued: 2 per second, later ones wait");
    println!("  for i in $(seq 4); do curl -s -o /dev/null -w '%{{http_code}} ' {base}/orders/0; done; echo");
    println!(
        "                                                    # 500 500 500 503: the breaker opened (Retry-After: 10)"
    );
    println!(
        "edit {} while this runs: the rules reload.",
        DEFAULT_RULES.rsplit('/').next().unwrap_or("the rules file")
    );
}

/// Sends the printed requests itself and shows what came back.
async fn demo(addr: SocketAddr) -> Result<(), Box<dyn Error>> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let base = format!("http://{addr}");
    let show = |what: &str, r: &reqwest::Response| {
        let retry =
            r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(|v| format!(" (Retry-After: {v})"));
        println!("  {what:<44} -> {}{}", r.status(), retry.unwrap_or_default());
    };
    println!("demo:");
    for i in 1..=5 {
        let r = http.get(format!("{base}/products/1")).send().await?;
        show(&format!("GET /products/1 #{i}"), &r);
    }
    let r = http.get(format!("{base}/products/1")).header("x-forwarded-for", "203.0.113.7").send().await?;
    show("GET /products/1 from 203.0.113.7", &r);
    let r = http.post(format!("{base}/orders")).header("x-caller", "blocked-app").send().await?;
    show("POST /orders as blocked-app", &r);
    // Four at once: one passes, two queue (500 and 1000 ms), the fourth would wait past the 1 s limit.
    let start = Instant::now();
    let orders: Vec<_> = (0..4)
        .map(|_| {
            let send = http.post(format!("{base}/orders")).send();
            async move { (send.await, start.elapsed()) }
        })
        .collect();
    let mut done = futures::future::join_all(orders).await;
    done.sort_by_key(|(_, t)| *t);
    for (r, t) in done {
        show(&format!("POST /orders (answered after {} ms)", t.as_millis()), &r?);
    }
    for i in 1..=4 {
        let r = http.get(format!("{base}/orders/0")).send().await?;
        show(&format!("GET /orders/0 #{i}"), &r);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("axum_service: {e}");
            std::process::exit(2);
        }
    };
    // Kept for the whole process (leaked, like the global engine): the requests' entries then take no
    // reference count, which every worker would otherwise write.
    let engine = Sentinel::builder().app_name("axum-shop").build().leak();
    let rules = FileDataSource::new(engine, &args.rules);
    rules.on_reload(|r| match r {
        Ok(reloaded) => println!("rules: {reloaded:?}"),
        Err(e) => println!("rules: {e} (the rules in force stay)"),
    });
    rules.reload_now()?;
    let _watch = rules.watch(Duration::from_millis(200))?;

    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let addr = listener.local_addr()?;
    println!("axum shop on http://{addr} (rules from {})", args.rules);
    print_curls(addr);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let service = app(engine)?.into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move {
        let stopped = async {
            let _ = stop_rx.await;
        };
        axum::serve(listener, service).with_graceful_shutdown(stopped).await
    });
    if args.demo {
        demo(addr).await?;
    }
    match args.duration {
        Some(d) => tokio::time::sleep(d).await,
        None => futures::future::pending().await,
    }
    let _ = stop_tx.send(());
    server.await??;
    println!("stopped; per route (pass / block / exception in the last minute):");
    let mut names = engine.resource_names();
    names.sort();
    for name in names {
        if let Some(s) = engine.cluster_stats(&name) {
            println!("  {name:<22} {:>4} / {:>4} / {:>4}", s.minute_pass, s.minute_block, s.minute_exception);
        }
    }
    Ok(())
}
