//! A plain hyper 1 server (no axum) guarded by the Sentinel web layer: a tower service made into a hyper
//! service with hyper-util's `TowerToHyperService`, the peer address passed as a `PeerAddr` extension.
//!
//! Run: `cargo run --example hyper_service` (serves on 127.0.0.1:3001, `--addr` to change), with
//! `--duration SECS` to stop by itself. Without a router there is no route template: a request's resource
//! is its method and path through the cleaner (`/items/42` is `GET:/items/{id}`).

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, PeerAddr, SentinelLayer};
use sentinel_runtime::Sentinel;
use tower::ServiceBuilder;

async fn handler(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from(format!("you asked for {}\n", req.uri().path())))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut addr: SocketAddr = ([127, 0, 0, 1], 3001).into();
    let mut duration = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--addr" => addr = v.parse()?,
            "--duration" => duration = Some(Duration::from_secs_f64(v.parse()?)),
            other => return Err(format!("unknown argument `{other}` (--addr HOST:PORT, --duration SECS)").into()),
        }
    }
    let engine = Sentinel::global();
    // Two requests per second per peer IP on GET:/items/{id}.
    engine.load_param_flow_rules([ParamFlowRule::new("GET:/items/{id}", 0).count(2.0)])?;
    let layer = SentinelLayer::new(engine).param(extract::peer_ip());

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("hyper on http://{addr}; try: for i in 1 2 3; do curl -si http://{addr}/items/$i | head -1; done");
    let serve = async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let service = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    req
                })
                .layer(layer.clone())
                .service_fn(handler);
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    };
    match duration {
        Some(d) => {
            let _ = tokio::time::timeout(d, serve).await;
        }
        None => serve.await,
    }
    Ok(())
}
