//! The outbound guard around real clients: a generated tonic client over a guarded `Channel` (unary and
//! server-streaming calls, error statuses in the headers and in the trailers, blocks as `Status` values the
//! caller can match), and hyper-util's client through the tower layer.

mod web_support;

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::outbound::{ClientError, SentinelClientLayer};
use sentinel_runtime::web::ExitOn;
use sentinel_runtime::BlockError;
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status};
use tower::ServiceBuilder;
use web_support::{bounded, engine_at, serve, stats, until};

mod shop {
    tonic::include_proto!("shop");
}

use shop::orders_client::OrdersClient;
use shop::orders_server::{Orders, OrdersServer};
use shop::{Order, OrderRequest};

type History = Pin<Box<dyn Stream<Item = Result<Order, Status>> + Send>>;

/// The downstream: counts calls; `Get` answers by mode, `History` streams `count` orders, then ends with
/// `UNAVAILABLE` when the mode says so.
#[derive(Clone, Default)]
struct Inventory {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Orders for Inventory {
    async fn get(&self, req: Request<OrderRequest>) -> Result<Response<Order>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        match req.mode.as_str() {
            "unavailable" => Err(Status::unavailable("inventory is down")),
            "missing" => Err(Status::not_found("no such order")),
            "corrupt" => Err(Status::data_loss("the order's record is corrupt")),
            _ => Ok(Response::new(Order { id: req.id, status: "in stock".into() })),
        }
    }

    type HistoryStream = History;

    async fn history(&self, req: Request<OrderRequest>) -> Result<Response<History>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let req = req.into_inner();
        let mut items: Vec<Result<Order, Status>> =
            (0..req.count).map(|i| Ok(Order { id: u64::from(i), status: "event".into() })).collect();
        if req.mode == "unavailable" {
            items.push(Err(Status::unavailable("inventory went down mid-stream")));
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

async fn inventory() -> (Inventory, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = Inventory::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(OrdersServer::new(svc.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (svc, format!("http://{addr}"))
}

fn req(id: u64, mode: &str, count: u32) -> OrderRequest {
    OrderRequest { id, mode: mode.into(), count }
}

const GET: &str = "/shop.Orders/Get";
const HISTORY: &str = "/shop.Orders/History";

macro_rules! guarded_client {
    ($layer:expr, $url:expr) => {{
        let channel = tonic::transport::Channel::from_shared($url).unwrap().connect().await.unwrap();
        OrdersClient::new(ServiceBuilder::new().map_err(Status::from).layer($layer).service(channel))
    }};
}

#[tokio::test]
async fn unavailable_from_the_server_trips_an_error_count_breaker_and_blocked_calls_are_matchable_statuses() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_degrade_rules([DegradeRule::new(GET, DegradeGrade::ErrorCount)
                .count(2.0)
                .min_request_amount(1)
                .stat_interval_ms(10_000)
                .time_window_sec(10)])
            .unwrap();
        let (inventory, url) = inventory().await;
        let mut client = guarded_client!(SentinelClientLayer::new(&engine), url);
        assert_eq!(client.get(req(1, "", 0)).await.unwrap().into_inner().status, "in stock");
        // A client's own mistake is not the downstream's failure.
        assert_eq!(client.get(req(1, "missing", 0)).await.unwrap_err().code(), Code::NotFound);
        for _ in 0..3 {
            assert_eq!(client.get(req(1, "unavailable", 0)).await.unwrap_err().code(), Code::Unavailable);
        }
        assert_eq!(inventory.calls.load(Ordering::SeqCst), 5);
        let blocked = client.get(req(1, "", 0)).await.unwrap_err();
        assert_eq!(blocked.code(), Code::Unavailable);
        assert!(blocked.message().contains("circuit breaker"), "{blocked:?}");
        assert!(blocked.metadata().get("grpc-retry-pushback-ms").is_some(), "{blocked:?}");
        assert_eq!(inventory.calls.load(Ordering::SeqCst), 5, "the blocked call was not sent");
        assert_eq!(stats(&engine, GET).minute_exception, 3);
    })
    .await;
}

#[tokio::test]
async fn server_streaming_calls_hold_their_entry_until_the_trailers_and_a_status_there_counts() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new(HISTORY).count(2.0)]).unwrap();
        let (_inventory, url) = inventory().await;
        let mut client = guarded_client!(SentinelClientLayer::new(&engine), url);
        let mut stream = client.history(req(0, "unavailable", 2)).await.unwrap().into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().id, 0);
        assert_eq!(stats(&engine, HISTORY).threads, 1, "in flight while it streams");
        assert_eq!(stream.message().await.unwrap().unwrap().id, 1);
        assert_eq!(stream.message().await.unwrap_err().code(), Code::Unavailable);
        until("the entry exits at the trailers", || stats(&engine, HISTORY).threads == 0).await;
        assert_eq!(stats(&engine, HISTORY).minute_exception, 1);
        let fine = client.history(req(0, "", 1)).await.unwrap().into_inner();
        drop(fine);
        until("a dropped stream exits its entry", || stats(&engine, HISTORY).threads == 0).await;
        assert_eq!(stats(&engine, HISTORY).minute_exception, 1, "dropping the stream is not an error");
        let blocked = client.history(req(0, "", 1)).await.unwrap_err();
        assert_eq!(blocked.code(), Code::ResourceExhausted, "{blocked:?}");
    })
    .await;
}

#[tokio::test]
async fn hyper_util_client_calls_go_through_the_layer_with_body_end_exits_and_typed_blocks() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let hits = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route(
                "/items/{id}",
                get({
                    let hits = hits.clone();
                    move || async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        "item"
                    }
                }),
            )
            .route("/down", get(|| async { (http::StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")], "down") }));
        let addr = serve(app).await;
        let resource = format!("GET:{addr}/items/{{id}}");
        engine.load_flow_rules([FlowRule::new(&resource).count(3.0)]).unwrap();
        let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<Empty<Bytes>>();
        let mut svc =
            ServiceBuilder::new().layer(SentinelClientLayer::new(&engine).exit_on(ExitOn::BodyEnd)).service(hyper);
        let get = |path: String| http::Request::get(format!("http://{addr}{path}")).body(Empty::new()).unwrap();
        use tower::{Service, ServiceExt};
        let response = svc.ready().await.unwrap().call(get("/items/1".into())).await.unwrap();
        assert_eq!(stats(&engine, &resource).threads, 1, "held until the body ends");
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "item");
        assert_eq!(stats(&engine, &resource).threads, 0);
        for id in 2..=3 {
            svc.ready().await.unwrap().call(get(format!("/items/{id}"))).await.unwrap();
        }
        match svc.ready().await.unwrap().call(get("/items/4".into())).await {
            Err(ClientError::Blocked(BlockError::Flow { .. })) => {}
            other => panic!("expected a flow block, got {other:?}"),
        }
        assert_eq!(hits.load(Ordering::SeqCst), 3);
        // 503 with Retry-After: 1 holds `/down` back for a second of the engine's clock; it counts as an error.
        let down = format!("GET:{addr}/down");
        assert_eq!(svc.ready().await.unwrap().call(get("/down".into())).await.unwrap().status(), 503);
        match svc.ready().await.unwrap().call(get("/down".into())).await {
            Err(ClientError::Blocked(b @ BlockError::Pushback { .. })) => {
                assert_eq!(b.retry_after(), Some(Duration::from_secs(1)))
            }
            other => panic!("expected a pushback block, got {other:?}"),
        }
        clock.advance_millis(1_000);
        assert_eq!(svc.ready().await.unwrap().call(get("/down".into())).await.unwrap().status(), 503);
        until("both 503s were traced", || stats(&engine, &down).minute_exception == 2).await;
    })
    .await;
}

/// A downstream that breaks the gRPC protocol: `Get` answers HTTP 200 and ends its stream without a
/// `grpc-status` (tonic reports `UNKNOWN`, as gRPC clients do), `History` answers HTTP 400 (tonic reports
/// `INTERNAL`, gRPC's mapping of 400).
async fn broken_inventory() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    const GRPC: [(http::HeaderName, &str); 1] = [(http::header::CONTENT_TYPE, "application/grpc")];
    let router = Router::new()
        .route(GET, axum::routing::post(|| async { (GRPC, "") }))
        .route(HISTORY, axum::routing::post(|| async { (http::StatusCode::BAD_REQUEST, GRPC, "") }));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::from(router))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

#[tokio::test]
async fn a_grpc_answer_the_client_sees_fail_without_a_grpc_status_counts_as_an_error() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let url = broken_inventory().await;
        let mut client = guarded_client!(SentinelClientLayer::new(&engine), url);
        // Java's client interceptor traces every status but OK at `onClose`; these are ones our predicate
        // counts too (UNKNOWN, INTERNAL).
        assert_eq!(client.get(req(1, "", 0)).await.unwrap_err().code(), Code::Unknown);
        until("the call's entry exits", || stats(&engine, GET).threads == 0).await;
        assert_eq!(stats(&engine, GET).minute_exception, 1, "an answer without grpc-status is an error");
        // tonic reports a stream's status as its messages are read.
        let mut history = client.history(req(1, "", 0)).await.unwrap().into_inner();
        assert_eq!(history.message().await.unwrap_err().code(), Code::Internal);
        until("the call's entry exits", || stats(&engine, HISTORY).threads == 0).await;
        assert_eq!(stats(&engine, HISTORY).minute_exception, 1, "HTTP 400 is INTERNAL to a gRPC client");
    })
    .await;
}

#[tokio::test]
async fn data_loss_from_the_downstream_counts_as_its_failure() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (_inventory, url) = inventory().await;
        let mut client = guarded_client!(SentinelClientLayer::new(&engine), url);
        assert_eq!(client.get(req(1, "corrupt", 0)).await.unwrap_err().code(), Code::DataLoss);
        until("the call's entry exits", || stats(&engine, GET).threads == 0).await;
        assert_eq!(stats(&engine, GET).minute_exception, 1, "unrecoverable data loss is the downstream's failure");
    })
    .await;
}
