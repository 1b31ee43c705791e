//! The web layer in a real tonic server, called by a generated tonic client over loopback: unary and
//! server-streaming calls, every kind of block as its gRPC status with `grpc-retry-pushback-ms`, error
//! statuses traced (in the headers and in the trailers), time limits as `DEADLINE_EXCEEDED`.

mod web_support;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::web::{extract, SentinelLayer};
use sentinel_runtime::Sentinel;
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status};
use web_support::{bounded, engine_at, stats, until};

mod shop {
    tonic::include_proto!("shop");
}

use shop::orders_client::OrdersClient;
use shop::orders_server::{Orders, OrdersServer};
use shop::{Order, OrderRequest};

type History = Pin<Box<dyn Stream<Item = Result<Order, Status>> + Send>>;

/// The test's service: `Get` answers by mode; `History` streams what the test sends it.
#[derive(Default)]
struct Shop {
    history: Mutex<Option<tokio::sync::mpsc::Receiver<Result<Order, Status>>>>,
}

#[tonic::async_trait]
impl Orders for Shop {
    async fn get(&self, req: Request<OrderRequest>) -> Result<Response<Order>, Status> {
        let req = req.into_inner();
        match req.mode.as_str() {
            "fail" => Err(Status::internal("the database is down")),
            "slow" => std::future::pending().await,
            _ => Ok(Response::new(Order { id: req.id, status: "shipped".into() })),
        }
    }

    type HistoryStream = History;

    async fn history(&self, _req: Request<OrderRequest>) -> Result<Response<History>, Status> {
        let rx = self.history.lock().unwrap().take().ok_or_else(|| Status::unavailable("one stream per test"))?;
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

/// Serves `shop` behind `layer` on a fresh loopback port; returns a connected client.
async fn serve(layer: SentinelLayer, shop: Shop) -> OrdersClient<tonic::transport::Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(OrdersServer::new(shop))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    OrdersClient::connect(format!("http://{addr}")).await.expect("connect to the test server")
}

fn get(id: u64, mode: &str) -> OrderRequest {
    OrderRequest { id, mode: mode.into(), count: 0 }
}

fn pushback(s: &Status) -> Option<&str> {
    s.metadata().get("grpc-retry-pushback-ms").map(|v| v.to_str().unwrap())
}

const GET: &str = "/shop.Orders/Get";
const HISTORY: &str = "/shop.Orders/History";

#[tokio::test]
async fn unary_calls_pass_and_past_the_limit_get_resource_exhausted_with_retry_pushback() {
    bounded(async {
        let (engine, _clock) = engine_at(100);
        engine.load_flow_rules([FlowRule::new(GET).count(1.0)]).unwrap();
        let mut client = serve(SentinelLayer::new(&engine), Shop::default()).await;
        let order = client.get(get(7, "")).await.unwrap().into_inner();
        assert_eq!((order.id, order.status.as_str()), (7, "shipped"));
        let err = client.get(get(7, "")).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("flow rule"), "{}", err.message());
        assert_eq!(pushback(&err), Some("900"), "the window has room again in 900 ms");
        let s = stats(&engine, GET);
        assert_eq!((s.minute_pass, s.minute_block, s.minute_exception, s.threads), (1, 1, 0, 0));
    })
    .await
}

#[tokio::test]
async fn error_statuses_are_traced_and_trip_a_breaker_that_answers_unavailable() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine
            .load_degrade_rules([DegradeRule::new(GET, DegradeGrade::ErrorCount)
                .count(1.0)
                .min_request_amount(1)
                .time_window_sec(5)])
            .unwrap();
        let mut client = serve(SentinelLayer::new(&engine), Shop::default()).await;
        for _ in 0..2 {
            assert_eq!(client.get(get(1, "fail")).await.unwrap_err().code(), Code::Internal);
        }
        assert_eq!(stats(&engine, GET).minute_exception, 2);
        let err = client.get(get(1, "")).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(pushback(&err), Some("5000"), "the breaker's retry time");
    })
    .await
}

#[tokio::test]
async fn an_authority_rule_on_the_caller_metadata_answers_permission_denied() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_authority_rules([AuthorityRule::new(GET, "bad-app", AuthorityStrategy::Black)]).unwrap();
        let layer = SentinelLayer::new(&engine).origin(extract::header(http::HeaderName::from_static("x-caller")));
        let mut client = serve(layer, Shop::default()).await;
        let call = |who: &'static str| {
            let mut r = Request::new(get(1, ""));
            r.metadata_mut().insert("x-caller", who.parse().unwrap());
            r
        };
        assert!(client.get(call("good-app")).await.is_ok());
        let err = client.get(call("bad-app")).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
        assert_eq!(pushback(&err), None);
    })
    .await
}

#[tokio::test]
async fn server_streaming_holds_the_entry_until_the_last_message_and_traces_a_failed_end() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let shop = Shop { history: Mutex::new(Some(rx)) };
        let mut client = serve(SentinelLayer::new(&engine), shop).await;
        tx.send(Ok(Order { id: 1, status: "placed".into() })).await.unwrap();
        let mut stream = client.history(get(1, "")).await.unwrap().into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().status, "placed");
        assert_eq!(stats(&engine, HISTORY).threads, 1, "the call streams: its entry is open");
        tx.send(Ok(Order { id: 1, status: "shipped".into() })).await.unwrap();
        tx.send(Err(Status::data_loss("the history is corrupt"))).await.unwrap();
        drop(tx);
        assert_eq!(stream.message().await.unwrap().unwrap().status, "shipped");
        let end = stream.message().await.unwrap_err();
        assert_eq!(end.code(), Code::DataLoss);
        // The entry exits when the trailers go out, with the status they carry.
        let s = stats(&engine, HISTORY);
        assert_eq!((s.threads, s.minute_success, s.minute_exception), (0, 1, 1));
    })
    .await
}

#[tokio::test]
async fn a_stream_that_ends_well_is_no_error() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut client = serve(SentinelLayer::new(&engine), Shop { history: Mutex::new(Some(rx)) }).await;
        for i in 0..3 {
            tx.send(Ok(Order { id: i, status: "event".into() })).await.unwrap();
        }
        drop(tx);
        let mut stream = client.history(get(1, "")).await.unwrap().into_inner();
        let mut n = 0;
        while stream.message().await.unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 3);
        let s = stats(&engine, HISTORY);
        assert_eq!((s.threads, s.minute_success, s.minute_exception), (0, 1, 0));
    })
    .await
}

#[tokio::test]
async fn a_call_past_its_time_limit_gets_deadline_exceeded() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let mut client = serve(SentinelLayer::new(&engine).timeout(Duration::from_millis(300)), Shop::default()).await;
        let slow = tokio::spawn(async move { client.get(get(1, "slow")).await });
        until("the call's time limit is armed", || clock.pending_timers() == 1).await;
        clock.advance_millis(300);
        let err = slow.await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
        let s = stats(&engine, GET);
        assert_eq!((s.minute_exception, s.threads, s.avg_rt_ms), (1, 0, 300.0));
    })
    .await
}

#[tokio::test]
async fn a_block_error_converts_into_the_matching_tonic_status() {
    // With feature `tonic`, `Status: From<BlockError>`: code guarded by hand (or an annotated function)
    // returning `Result<_, Status>` needs no block handler, and its client sees the status the layer gives.
    let (engine, _clock) = engine_at(100);
    engine.load_flow_rules([FlowRule::new("inventory").count(0.0)]).unwrap();
    let guarded = |engine: &Sentinel| -> Result<u32, Status> {
        let _entry = engine.resource("inventory").entry_owned().enter()?;
        Ok(3)
    };
    let status = guarded(&engine).unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("inventory"), "{}", status.message());

    engine.load_flow_rules([FlowRule::new("inventory").count(1.0)]).unwrap();
    let _first = engine.resource("inventory").entry_owned().enter().unwrap();
    let status: Status = engine.resource("inventory").entry_owned().enter().unwrap_err().into();
    assert_eq!(pushback(&status), Some("900"));
    let timeout: Status =
        sentinel_runtime::Timeout { resource: Arc::from("inventory"), limit: Duration::from_secs(1) }.into();
    assert_eq!(timeout.code(), Code::DeadlineExceeded);
}
