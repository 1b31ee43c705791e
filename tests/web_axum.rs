//! The web layer in a real axum server, called by a real HTTP client over loopback: names by route
//! template, answers for every kind of block with `Retry-After` from the rule, origins and hot parameters
//! from the request, errors traced, entries exited on disconnect and at the end of a streamed body, queueing
//! on a timer, time limits, and no context shared between concurrent requests.

mod web_support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderName, StatusCode};
use axum::routing::get;
use axum::Router;
use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::web::{extract, ExitOn, SentinelLayer, TrustedProxies, WEB_CONTEXT_NAME};
use sentinel_runtime::{Sentinel, DEFAULT_CONTEXT_NAME};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use web_support::{bounded, client, engine_at, serve, stats, until};

fn caller() -> HeaderName {
    HeaderName::from_static("x-caller")
}

async fn hello() -> &'static str {
    "hello"
}

/// A router with a few routes, the layer on the matched ones.
fn app(layer: SentinelLayer) -> Router {
    Router::new()
        .route("/hello", get(hello))
        .route("/users/{id}", get(|Path(id): Path<u64>| async move { format!("user {id}") }))
        .route("/fail", get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }))
        .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no such thing") }))
        .route_layer(layer)
}

async fn get_status(url: String) -> (StatusCode, Option<String>, String) {
    let r = client().get(url).send().await.expect("request");
    let status = r.status();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.text().await.unwrap())
}

#[tokio::test]
async fn a_request_within_its_limit_passes_and_counts_on_its_route_resource() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("GET:/hello").count(10.0)]).unwrap();
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        let (status, retry, body) = get_status(format!("http://{addr}/hello")).await;
        assert_eq!((status, retry, body.as_str()), (StatusCode::OK, None, "hello"));
        let s = stats(&engine, "GET:/hello");
        assert_eq!((s.minute_pass, s.minute_success, s.minute_exception, s.threads), (1, 1, 0, 0));
        // Inbound: the global inbound node counts it (system rules apply), in the default context.
        assert_eq!(engine.inbound_stats().minute_pass, 1);
        assert_eq!(engine.tree().iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), [DEFAULT_CONTEXT_NAME]);
    })
    .await
}

#[tokio::test]
async fn over_a_flow_limit_the_layer_answers_429_with_retry_after_from_the_rule() {
    bounded(async {
        let (engine, _clock) = engine_at(100);
        engine
            .load_flow_rules([
                FlowRule::new("GET:/hello").count(1.0),
                // One pass per 10 s, queueing at most 500 ms: the next pass is 9.5 s beyond the queueing limit.
                FlowRule::new("GET:/users/{id}")
                    .count(0.1)
                    .control_behavior(ControlBehavior::RateLimiter)
                    .max_queueing_time_ms(500),
            ])
            .unwrap();
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        assert_eq!(get_status(format!("http://{addr}/hello")).await.0, StatusCode::OK);
        let (status, retry, body) = get_status(format!("http://{addr}/hello")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry.as_deref(), Some("1"), "the window has room again in 900 ms");
        assert!(body.contains("flow rule"), "{body}");
        assert_eq!(stats(&engine, "GET:/hello").minute_block, 1);

        assert_eq!(get_status(format!("http://{addr}/users/1")).await.0, StatusCode::OK);
        let (status, retry, _) = get_status(format!("http://{addr}/users/2")).await;
        assert_eq!((status, retry.as_deref()), (StatusCode::TOO_MANY_REQUESTS, Some("10")));
    })
    .await
}

#[tokio::test]
async fn server_errors_are_traced_and_an_open_breaker_answers_503_with_its_retry_time() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        engine
            .load_degrade_rules([DegradeRule::new("GET:/fail", DegradeGrade::ErrorCount)
                .count(2.0)
                .min_request_amount(1)
                .time_window_sec(30)])
            .unwrap();
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        for _ in 0..3 {
            assert_eq!(get_status(format!("http://{addr}/fail")).await.0, StatusCode::INTERNAL_SERVER_ERROR);
        }
        let s = stats(&engine, "GET:/fail");
        assert_eq!((s.minute_pass, s.minute_exception), (3, 3), "every 5xx counts as an error");
        let (status, retry, body) = get_status(format!("http://{addr}/fail")).await;
        assert_eq!((status, retry.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("30")));
        assert!(body.contains("circuit breaker"), "{body}");
        clock.advance_millis(12_000);
        assert_eq!(get_status(format!("http://{addr}/fail")).await.1.as_deref(), Some("18"));
    })
    .await
}

#[tokio::test]
async fn client_errors_are_not_traced_by_default_and_a_custom_predicate_can_trace_them() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        assert_eq!(get_status(format!("http://{addr}/missing")).await.0, StatusCode::NOT_FOUND);
        assert_eq!(stats(&engine, "GET:/missing").minute_exception, 0);

        let (engine, _clock) = engine_at(0);
        let strict = SentinelLayer::new(&engine).trace_if(|o| match o {
            sentinel_runtime::web::Outcome::Http(s) => s.is_client_error() || s.is_server_error(),
            _ => false,
        });
        let addr = serve(app(strict)).await;
        get_status(format!("http://{addr}/missing")).await;
        assert_eq!(stats(&engine, "GET:/missing").minute_exception, 1);
    })
    .await
}

#[tokio::test]
async fn an_authority_rule_on_the_caller_header_answers_403() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_authority_rules([AuthorityRule::new("GET:/hello", "partner", AuthorityStrategy::White)]).unwrap();
        let addr = serve(app(SentinelLayer::new(&engine).origin(extract::header(caller())))).await;
        let url = format!("http://{addr}/hello");
        let ok = client().get(&url).header("x-caller", "partner").send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let denied = client().get(&url).header("x-caller", "stranger").send().await.unwrap();
        assert_eq!(denied.status(), StatusCode::FORBIDDEN);
        assert!(denied.headers().get("retry-after").is_none(), "an authority block has no retry time");
        assert!(denied.text().await.unwrap().contains("authority rule"));
        assert_eq!(engine.origin_stats("GET:/hello", "stranger").unwrap().minute_block, 1);
    })
    .await
}

#[tokio::test]
async fn a_hot_parameter_rule_by_header_limits_each_value_on_its_own() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_param_flow_rules([ParamFlowRule::new("GET:/hello", 0).count(1.0)]).unwrap();
        let layer = SentinelLayer::new(&engine).param(extract::header(HeaderName::from_static("x-user")));
        let addr = serve(app(layer)).await;
        let call = |user: &'static str| {
            let url = format!("http://{addr}/hello");
            async move { client().get(url).header("x-user", user).send().await.unwrap().status() }
        };
        assert_eq!(call("ann").await, StatusCode::OK);
        assert_eq!(call("ann").await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(call("bob").await, StatusCode::OK, "another value has its own bucket");
        // A request without the header has no value: it always passes.
        assert_eq!(get_status(format!("http://{addr}/hello")).await.0, StatusCode::OK);
        assert_eq!(get_status(format!("http://{addr}/hello")).await.0, StatusCode::OK);
    })
    .await
}

#[tokio::test]
async fn a_hot_parameter_rule_by_client_ip_limits_each_client_behind_a_trusted_proxy() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_param_flow_rules([ParamFlowRule::new("GET:/hello", 0).count(2.0)]).unwrap();
        // The test client connects from 127.0.0.1: as a trusted proxy, its X-Forwarded-For names the client.
        let proxies = TrustedProxies::new(["127.0.0.1"]).unwrap();
        let addr = serve(app(SentinelLayer::new(&engine).param(extract::client_ip(proxies)))).await;
        let call = |xff: &'static str| {
            let url = format!("http://{addr}/hello");
            async move { client().get(url).header("x-forwarded-for", xff).send().await.unwrap().status() }
        };
        for _ in 0..2 {
            assert_eq!(call("203.0.113.1").await, StatusCode::OK);
        }
        assert_eq!(call("203.0.113.1").await, StatusCode::TOO_MANY_REQUESTS);
        // A spoofed left-most entry does not help: the proxy appended the real address on the right.
        assert_eq!(call("198.51.100.9, 203.0.113.1").await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(call("203.0.113.2").await, StatusCode::OK);

        // Without trusted proxies the client is the peer (127.0.0.1 here), whatever it forwards.
        let (engine, _clock) = engine_at(0);
        engine.load_param_flow_rules([ParamFlowRule::new("GET:/hello", 0).count(1.0)]).unwrap();
        let addr = serve(app(SentinelLayer::new(&engine).param(extract::peer_ip()))).await;
        let url = format!("http://{addr}/hello");
        assert_eq!(client().get(&url).header("x-forwarded-for", "1.1.1.1").send().await.unwrap().status(), 200);
        assert_eq!(client().get(&url).header("x-forwarded-for", "2.2.2.2").send().await.unwrap().status(), 429);
    })
    .await
}

#[tokio::test]
async fn a_thousand_distinct_ids_are_one_route_resource_and_the_query_is_ignored() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        let http = client();
        for id in 0..1000 {
            let r = http.get(format!("http://{addr}/users/{id}?page={id}")).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        }
        assert_eq!(engine.resource_names(), vec!["GET:/users/{id}".to_string()]);
        assert_eq!(stats(&engine, "GET:/users/{id}").minute_pass, 1000);
    })
    .await
}

#[tokio::test]
async fn a_client_that_disconnects_mid_request_leaves_nothing_in_flight_and_no_error() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (started_tx, mut started) = tokio::sync::mpsc::channel::<()>(1);
        let (dropped_tx, mut dropped) = tokio::sync::mpsc::channel::<()>(1);
        struct OnDrop(tokio::sync::mpsc::Sender<()>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                let _ = self.0.try_send(());
            }
        }
        let handler = move || {
            let (started_tx, dropped_tx) = (started_tx.clone(), dropped_tx.clone());
            async move {
                let _guard = OnDrop(dropped_tx);
                let _ = started_tx.send(()).await;
                std::future::pending::<&'static str>().await
            }
        };
        let app = Router::new().route("/slow", get(handler)).route_layer(SentinelLayer::new(&engine));
        let addr = serve(app).await;
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n").await.unwrap();
        started.recv().await.unwrap();
        assert_eq!(stats(&engine, "GET:/slow").threads, 1, "the request is in flight");
        drop(conn);
        dropped.recv().await.unwrap();
        // The handler's future was dropped; the entry exits right after it, on the same task.
        until("the entry exits", || stats(&engine, "GET:/slow").threads == 0).await;
        let s = stats(&engine, "GET:/slow");
        assert_eq!((s.minute_pass, s.minute_success, s.minute_exception), (1, 1, 0), "a dropped request is no error");
    })
    .await
}

/// A route whose body is fed by the test through a channel.
fn streaming_app(layer: SentinelLayer, chunks: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>) -> Router {
    let chunks = Arc::new(std::sync::Mutex::new(Some(chunks)));
    Router::new()
        .route(
            "/stream",
            get(move || {
                let rx = chunks.lock().unwrap().take().expect("one request");
                async move { Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)) }
            }),
        )
        .route_layer(layer)
}

#[tokio::test]
async fn a_streaming_body_keeps_the_entry_open_until_its_end_when_asked() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let addr = serve(streaming_app(SentinelLayer::new(&engine).exit_on(ExitOn::BodyEnd), rx)).await;
        tx.send(Ok(Bytes::from_static(b"first "))).await.unwrap();
        let mut res = client().get(format!("http://{addr}/stream")).send().await.unwrap();
        assert_eq!(res.chunk().await.unwrap().as_deref(), Some(&b"first "[..]));
        assert_eq!(stats(&engine, "GET:/stream").threads, 1, "the body still streams: the entry is open");
        tx.send(Ok(Bytes::from_static(b"last"))).await.unwrap();
        drop(tx);
        let mut rest = Vec::new();
        while let Some(c) = res.chunk().await.unwrap() {
            rest.extend_from_slice(&c);
        }
        assert_eq!(rest, b"last");
        // The server exits the entry when the body yields its end, before it sends the end to the client.
        assert_eq!(stats(&engine, "GET:/stream").threads, 0);
        assert_eq!(stats(&engine, "GET:/stream").minute_success, 1);
    })
    .await
}

#[tokio::test]
async fn by_default_the_entry_exits_when_the_response_head_is_ready() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let addr = serve(streaming_app(SentinelLayer::new(&engine), rx)).await;
        tx.send(Ok(Bytes::from_static(b"first"))).await.unwrap();
        let mut res = client().get(format!("http://{addr}/stream")).send().await.unwrap();
        res.chunk().await.unwrap();
        assert_eq!(stats(&engine, "GET:/stream").threads, 0);
        drop(tx);
    })
    .await
}

#[tokio::test]
async fn a_queued_request_waits_on_a_timer_while_the_single_worker_serves_others() {
    // A current-thread runtime: one worker thread for the server, the clients and the test. A wait that
    // blocked the thread would stall every request.
    bounded(async {
        let (engine, clock) = engine_at(0);
        engine
            .load_flow_rules([FlowRule::new("GET:/hello")
                .count(1.0)
                .control_behavior(ControlBehavior::RateLimiter)
                .max_queueing_time_ms(5_000)])
            .unwrap();
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        assert_eq!(get_status(format!("http://{addr}/hello")).await.0, StatusCode::OK);
        let queued = tokio::spawn(get_status(format!("http://{addr}/hello")));
        until("the second request waits on the engine's timer", || clock.pending_timers() == 1).await;
        let s = stats(&engine, "GET:/hello");
        // Recorded at its turn, as Java records a call after the flow slot's sleep: not in flight yet.
        assert_eq!((s.threads, s.minute_pass), (0, 1), "it passed its checks and waits for its turn");
        let other = get_status(format!("http://{addr}/users/7")).await;
        assert_eq!((other.0, other.2.as_str()), (StatusCode::OK, "user 7"), "served while the other waits");
        assert!(!queued.is_finished());
        clock.advance_millis(1_000);
        let (status, _, body) = queued.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "hello"));
        assert_eq!(stats(&engine, "GET:/hello").minute_pass, 2);
    })
    .await
}

#[tokio::test]
async fn in_its_axum_mode_the_layer_answers_as_in_the_default_one() {
    bounded(async {
        let (engine, clock) = engine_at(100);
        engine.load_flow_rules([FlowRule::new("GET:/hello").count(1.0)]).unwrap();
        let layer = SentinelLayer::new(&engine).timeout(Duration::from_millis(250)).axum();
        let app = Router::new()
            .route("/hello", get(hello))
            .route("/fail", get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }))
            .route("/slow", get(std::future::pending::<&'static str>))
            .route_layer(layer);
        let addr = serve(app).await;
        assert_eq!(get_status(format!("http://{addr}/hello")).await, (StatusCode::OK, None, "hello".into()));
        let (status, retry, body) = get_status(format!("http://{addr}/hello")).await;
        assert_eq!((status, retry.as_deref()), (StatusCode::TOO_MANY_REQUESTS, Some("1")));
        assert!(body.contains("flow rule"), "{body}");
        assert_eq!(get_status(format!("http://{addr}/fail")).await.0, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(stats(&engine, "GET:/fail").minute_exception, 1, "a 5xx is traced");
        answers_504_past_250_ms(addr, &clock).await;
    })
    .await
}

#[tokio::test]
async fn a_request_past_its_time_limit_gets_504_and_counts_as_an_error_and_a_slow_call() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        engine
            .load_degrade_rules([DegradeRule::new("GET:/slow", DegradeGrade::SlowRequestRatio)
                .count(100.0) // slower than 100 ms is slow
                .slow_ratio_threshold(0.5)
                .min_request_amount(1)
                .time_window_sec(10)])
            .unwrap();
        let layer = SentinelLayer::new(&engine).timeout(Duration::from_millis(250));
        let app = Router::new().route("/slow", get(std::future::pending::<&'static str>)).route_layer(layer);
        let addr = serve(app).await;
        answers_504_past_250_ms(addr, &clock).await;
        let s = stats(&engine, "GET:/slow");
        assert_eq!((s.minute_exception, s.threads), (1, 0));
        assert_eq!(s.avg_rt_ms, 250.0, "its response time is the limit");
        // The slow-ratio breaker saw one slow call in one: it is open.
        assert_eq!(get_status(format!("http://{addr}/slow")).await.0, StatusCode::SERVICE_UNAVAILABLE);
    })
    .await
}

#[tokio::test]
async fn resources_entered_by_the_handler_nest_under_the_request_and_inherit_its_origin() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let handler_engine = engine.clone();
        let handler = move || {
            let engine = handler_engine.clone();
            async move {
                tokio::task::yield_now().await;
                let db = engine.resource("db.query");
                let entry = db.enter().expect("no rule");
                entry.origin().to_string()
            }
        };
        // In a named context (as Java's web adapters), which chain rules can name.
        let layer = SentinelLayer::new(&engine).origin(extract::header(caller())).context_name(WEB_CONTEXT_NAME);
        let app = Router::new().route("/nested", get(handler)).route_layer(layer);
        let addr = serve(app).await;
        let body = client().get(format!("http://{addr}/nested")).header("x-caller", "shop").send().await.unwrap();
        assert_eq!(body.text().await.unwrap(), "shop", "the nested entry has the request's origin");
        assert_eq!(engine.origin_stats("db.query", "shop").unwrap().minute_pass, 1);
        let web = engine.tree().into_iter().find(|n| n.name == WEB_CONTEXT_NAME).expect("the web context");
        let request = web.children.iter().find(|n| n.name == "GET:/nested").expect("the request's resource");
        assert_eq!(request.children.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["db.query"]);
    })
    .await
}

#[tokio::test]
async fn a_chain_rule_on_the_named_web_context_limits_only_calls_made_by_requests() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("db.query").count(0.0).chain(WEB_CONTEXT_NAME)]).unwrap();
        let handler_engine = engine.clone();
        let handler = move || {
            let engine = handler_engine.clone();
            async move {
                let db = engine.resource("db.query");
                if db.enter().is_ok() {
                    "passed"
                } else {
                    "blocked"
                }
            }
        };
        let layer = SentinelLayer::new(&engine).context_name(WEB_CONTEXT_NAME);
        let app = Router::new().route("/orders", get(handler)).route_layer(layer);
        let addr = serve(app).await;
        assert_eq!(get_status(format!("http://{addr}/orders")).await.2, "blocked");
        // The same resource called outside a request (a background job) is not limited by the chain rule.
        assert!(engine.resource("db.query").enter().is_ok());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_requests_keep_their_own_origins() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_authority_rules([AuthorityRule::new("GET:/who", "app-0", AuthorityStrategy::Black)]).unwrap();
        let handler_engine = engine.clone();
        let handler = move || {
            let engine = handler_engine.clone();
            async move {
                // Give the scheduler chances to move the request between workers.
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                let inner = engine.resource("who.inner");
                let entry = inner.enter().expect("no rule");
                entry.origin().to_string()
            }
        };
        let app = Router::new()
            .route("/who", get(handler))
            .route_layer(SentinelLayer::new(&engine).origin(extract::header(caller())));
        let addr = serve(app).await;
        let http = client();
        // At most 256 connections at a time keeps the test within a 1024-descriptor limit.
        let permits = Arc::new(tokio::sync::Semaphore::new(256));
        let calls: Vec<_> = (0..1000)
            .map(|i| {
                let (http, permits) = (http.clone(), permits.clone());
                let origin = format!("app-{}", i % 10);
                tokio::spawn(async move {
                    let _p = permits.acquire().await.unwrap();
                    let r = http.get(format!("http://{addr}/who")).header("x-caller", &origin).send().await.unwrap();
                    (origin, r.status(), r.text().await.unwrap())
                })
            })
            .collect();
        let mut blocked = 0;
        for c in calls {
            let (origin, status, body) = c.await.unwrap();
            if origin == "app-0" {
                assert_eq!(status, StatusCode::FORBIDDEN);
                blocked += 1;
            } else {
                assert_eq!(
                    (status, body.as_str()),
                    (StatusCode::OK, origin.as_str()),
                    "a request saw another's origin"
                );
            }
        }
        assert_eq!(blocked, 100);
        assert_eq!(stats(&engine, "GET:/who").threads, 0);
        for i in 1..10 {
            assert_eq!(engine.origin_stats("who.inner", &format!("app-{i}")).unwrap().minute_pass, 100);
        }
        // The worker threads kept no context: an entry made on one of them now runs in the default context.
        let default_ctx = tokio::task::spawn_blocking({
            let engine = engine.clone();
            move || engine.resource("after").entry_owned().enter().unwrap().context_name().to_string()
        });
        assert_eq!(default_ctx.await.unwrap(), sentinel_runtime::DEFAULT_CONTEXT_NAME);
        let on_worker = tokio::spawn({
            let engine = engine.clone();
            async move { engine.resource("after").entry_owned().enter().unwrap().origin().to_string() }
        });
        assert_eq!(on_worker.await.unwrap(), "");
    })
    .await
}

#[tokio::test]
async fn custom_names_and_blocked_responses_replace_the_defaults() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("api").count(0.0)]).unwrap();
        let layer = SentinelLayer::new(&engine)
            .resource_name(|req| (req.path() != "/hello").then(|| "api".into()))
            .on_blocked(|err, req| {
                let body = format!("{{\"blocked\":\"{}\",\"path\":\"{}\"}}", err.kind_name(), req.path());
                let mut res = http::Response::new(Bytes::from(body));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res
            });
        let addr = serve(app(layer)).await;
        let (status, _, body) = get_status(format!("http://{addr}/users/3")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, r#"{"blocked":"FlowException","path":"/users/3"}"#);
        // `None` from the namer: unguarded.
        assert_eq!(get_status(format!("http://{addr}/hello")).await.0, StatusCode::OK);
        assert_eq!(engine.resource_names(), vec!["api".to_string()]);
    })
    .await
}

#[tokio::test]
async fn with_router_layer_unmatched_paths_are_cleaned_and_bounded() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let app = Router::new().route("/hello", get(hello)).layer(SentinelLayer::new(&engine).max_resources(2));
        let addr = serve(app).await;
        for path in ["/nope/1", "/nope/2", "/other", "/third", "/fourth"] {
            assert_eq!(get_status(format!("http://{addr}{path}")).await.0, StatusCode::NOT_FOUND);
        }
        assert_eq!(get_status(format!("http://{addr}/hello")).await.0, StatusCode::OK);
        let mut names = engine.resource_names();
        names.sort();
        assert_eq!(names, ["GET:/hello", "GET:/nope/{id}", "GET:/other", sentinel_runtime::web::OVERFLOW_RESOURCE]);
        assert_eq!(stats(&engine, sentinel_runtime::web::OVERFLOW_RESOURCE).minute_pass, 2);
    })
    .await
}

/// Compile-time check: the layered router is a valid axum service for `serve` with connect info, and its
/// futures are `Send`.
#[allow(dead_code)]
fn the_layered_router_serves_with_connect_info(engine: &Sentinel) {
    let app = app(SentinelLayer::new(engine));
    let _ = app.into_make_service_with_connect_info::<SocketAddr>();
}

#[tokio::test]
async fn raw_http_client_sees_the_exact_blocked_response() {
    // A hand-written HTTP/1.1 exchange: the status line, `Retry-After` and the body, byte for byte.
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("GET:/hello").count(0.0)]).unwrap();
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /hello HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).await.unwrap();
        assert!(raw.starts_with("HTTP/1.1 429 Too Many Requests\r\n"), "{raw}");
        assert!(!raw.to_ascii_lowercase().contains("retry-after"), "a zero limit never admits: no retry time");
        assert!(raw.ends_with("\r\n\r\nToo Many Requests: blocked by a Sentinel flow rule\n"), "{raw}");
    })
    .await
}

/// `GET /slow` on `addr` (a handler that never answers, under a layer with a 250 ms time limit) is answered
/// 504 once `clock` passes the limit.
async fn answers_504_past_250_ms(addr: SocketAddr, clock: &sentinel_runtime::clock::ManualClock) {
    let slow = tokio::spawn(get_status(format!("http://{addr}/slow")));
    until("the request's time limit is armed", || clock.pending_timers() == 1).await;
    clock.advance_millis(250);
    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(body.contains("time limit"), "{body}");
}

async fn send(method: &str, url: &str) -> StatusCode {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    client().request(m, url).send().await.expect("request").status()
}

#[tokio::test]
async fn head_requests_run_the_get_handler_and_count_under_the_get_rule() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_flow_rules([FlowRule::new("GET:/users/{id}").count(2.0)]).unwrap();
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        let url = format!("http://{addr}/users/7");
        let mut codes = Vec::new();
        for m in ["HEAD", "HEAD", "HEAD", "GET"] {
            codes.push(send(m, &url).await);
        }
        assert_eq!(
            codes,
            [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS]
        );
        assert!(engine.resource_names().iter().all(|n| !n.starts_with("HEAD:")));
    })
    .await;
}

#[tokio::test]
async fn methods_a_route_answers_with_its_fallback_make_no_new_resources_past_the_standard_ones() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let addr = serve(app(SentinelLayer::new(&engine))).await;
        for i in 0..300 {
            assert_eq!(send(&format!("X{i}"), &format!("http://{addr}/users/1")).await, StatusCode::METHOD_NOT_ALLOWED);
        }
        for m in ["OPTIONS", "TRACE"] {
            send(m, &format!("http://{addr}/hello")).await;
        }
        assert_eq!(engine.resource_names(), [sentinel_runtime::web::OTHER_METHODS_RESOURCE]);
    })
    .await;
}

#[tokio::test]
async fn an_authority_rule_holds_for_a_route_first_used_after_the_engine_cap_is_reached() {
    bounded(async {
        let clock = sentinel_runtime::clock::ManualClock::at_millis(1_700_000_000_000);
        let engine = Sentinel::builder().manual_clock(clock).max_resources(2).build();
        engine.set_system_readings(None, None);
        engine
            .load_authority_rules([AuthorityRule::new("GET:/hello", "blocked-app", AuthorityStrategy::Black)])
            .unwrap();
        let layer = SentinelLayer::new(&engine).origin(extract::header(caller()));
        let addr = serve(app(layer)).await;
        for id in ["/fail", "/missing", "/users/1"] {
            send("GET", &format!("http://{addr}{id}")).await;
        }
        assert!(engine.caps().resource_cap_reached());
        let r = client().get(format!("http://{addr}/hello")).header("x-caller", "blocked-app").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    })
    .await;
}

#[tokio::test]
async fn each_method_of_a_route_and_each_route_of_a_nested_router_counts_on_its_own_resource() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        // One route for five methods, and the same routes under a nested router, whose route text axum builds
        // for each request (its state given, so that each of its routes keeps one service).
        let items = Router::new()
            .route("/items/{id}", get(hello).post(hello).put(hello).delete(hello).patch(hello))
            .route("/tags/{tag}", get(hello))
            .route_layer(SentinelLayer::new(&engine));
        let nested = items.clone().with_state(());
        let addr = serve(Router::new().nest_service("/api", nested).merge(items)).await;
        let sends = [("GET", 3), ("POST", 1), ("PUT", 4), ("DELETE", 2), ("PATCH", 5)];
        for round in 0..2 {
            for (method, n) in sends {
                for _ in 0..n {
                    for prefix in ["", "/api"] {
                        let url = format!("http://{addr}{prefix}/items/{round}");
                        assert_eq!(send(method, &url).await, StatusCode::OK, "{method} {url}");
                    }
                }
            }
            assert_eq!(send("GET", &format!("http://{addr}/tags/{round}")).await, StatusCode::OK);
        }
        let mut names = engine.resource_names();
        names.sort();
        let mut want: Vec<String> = sends.iter().map(|(m, _)| format!("{m}:/items/{{id}}")).collect();
        want.extend(sends.iter().map(|(m, _)| format!("{m}:/api/items/{{id}}")));
        want.push("GET:/tags/{tag}".into());
        want.sort();
        assert_eq!(names, want);
        for (method, n) in sends {
            for prefix in ["", "/api"] {
                let name = format!("{method}:{prefix}/items/{{id}}");
                assert_eq!(stats(&engine, &name).pass_qps, 2.0 * n as f64, "{name}");
            }
        }
        assert_eq!(stats(&engine, "GET:/tags/{tag}").pass_qps, 2.0);
    })
    .await;
}
