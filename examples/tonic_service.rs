//! A tonic gRPC service guarded by the Sentinel web layer (the service of `tests/proto/shop.proto`, its
//! client and server generated at build time by `protox`, no system `protoc`).
//!
//! Run: `cargo run --example tonic_service` (serves on 127.0.0.1:50051, `--addr` to change), with
//! `--duration SECS` to stop by itself; it calls itself a few times and prints the statuses it gets.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::web::SentinelLayer;
use sentinel_runtime::Sentinel;
use tonic::{Request, Response, Status};

mod shop {
    tonic::include_proto!("shop");
}
use shop::orders_server::{Orders, OrdersServer};
use shop::{Order, OrderRequest};

struct Shop;

#[tonic::async_trait]
impl Orders for Shop {
    async fn get(&self, req: Request<OrderRequest>) -> Result<Response<Order>, Status> {
        Ok(Response::new(Order { id: req.into_inner().id, status: "shipped".into() }))
    }

    type HistoryStream = tokio_stream::Iter<std::vec::IntoIter<Result<Order, Status>>>;

    async fn history(&self, req: Request<OrderRequest>) -> Result<Response<Self::HistoryStream>, Status> {
        let r = req.into_inner();
        let events = (0..r.count).map(|i| Ok(Order { id: r.id, status: format!("event {i}") })).collect::<Vec<_>>();
        Ok(Response::new(tokio_stream::iter(events)))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut addr: SocketAddr = ([127, 0, 0, 1], 50051).into();
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

    // A call's resource is its method path.
    let engine = Sentinel::global();
    engine.load_flow_rules([FlowRule::new("/shop.Orders/Get").count(2.0)])?;

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let server = tonic::transport::Server::builder()
        .layer(SentinelLayer::new(engine))
        .add_service(OrdersServer::new(Shop))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    println!("gRPC shop on {addr}; /shop.Orders/Get allows 2 calls per second");

    let mut client = shop::orders_client::OrdersClient::connect(format!("http://{addr}")).await?;
    for i in 1..=3 {
        match client.get(OrderRequest { id: i, ..Default::default() }).await {
            Ok(r) => println!("  Get #{i} -> OK ({})", r.into_inner().status),
            Err(s) => println!(
                "  Get #{i} -> {:?}: {} (grpc-retry-pushback-ms: {})",
                s.code(),
                s.message(),
                s.metadata().get("grpc-retry-pushback-ms").and_then(|v| v.to_str().ok()).unwrap_or("-")
            ),
        }
    }
    let mut history = client.history(OrderRequest { id: 1, count: 3, ..Default::default() }).await?.into_inner();
    while let Some(event) = history.message().await? {
        println!("  History -> {}", event.status);
    }
    let stats = engine.cluster_stats("/shop.Orders/Get").ok_or("no stats")?;
    println!("/shop.Orders/Get: {} passed, {} blocked", stats.minute_pass, stats.minute_block);

    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => {
            println!("serving until interrupted (try grpcurl, or --duration SECS)");
            server.await??;
        }
    }
    Ok(())
}
