//! The web layer's service driven directly (no network): errors of the wrapped service and of its body,
//! readiness, queueing and prioritized waits on the engine's timer, cancellation while queued, system rules,
//! hot parameters past the inline ones, unguarded requests.
#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::param_flow::ParamFlowRule;
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::web::{extract, ExitOn, SentinelLayer};
use sentinel_runtime::Sentinel;
use tower::{Layer, Service, ServiceExt};

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.set_system_readings(None, None);
    (engine, clock)
}

fn hello(_req: Request<()>) -> impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> {
    ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
}

fn get(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

/// Calls a ready service once and drives the response future to completion (it must not wait).
fn call_now<S: Service<Request<()>>>(svc: &mut S, req: Request<()>) -> Result<S::Response, S::Error> {
    let ready = svc.ready().now_or_never().expect("ready")?;
    ready.call(req).now_or_never().expect("answered without waiting")
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    std::pin::Pin::new(f).poll(&mut Context::from_waker(&waker))
}

#[test]
fn an_error_of_the_wrapped_service_is_traced_and_returned_as_it_is() {
    let (engine, _clock) = engine();
    let failing = tower::service_fn(|_req: Request<()>| {
        ready(Err::<Response<Full<Bytes>>, _>(std::io::Error::other("the database is down")))
    });
    let mut svc = SentinelLayer::new(&engine).layer(failing);
    let err = call_now(&mut svc, get("/orders")).unwrap_err();
    assert_eq!(err.to_string(), "the database is down");
    let s = engine.cluster_stats("GET:/orders").unwrap();
    assert_eq!((s.minute_pass, s.minute_exception, s.threads), (1, 1, 0));
}

#[test]
fn a_body_error_is_traced_when_the_entry_waits_for_the_end_of_the_body() {
    let (engine, _clock) = engine();
    let streaming = tower::service_fn(|_req: Request<()>| {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"part"))),
            Err(std::io::Error::other("connection to the store lost")),
        ];
        ready(Ok::<_, Infallible>(Response::new(StreamBody::new(futures::stream::iter(frames)))))
    });
    let mut svc = SentinelLayer::new(&engine).exit_on(ExitOn::BodyEnd).layer(streaming);
    let res = call_now(&mut svc, get("/export")).unwrap();
    assert_eq!(engine.cluster_stats("GET:/export").unwrap().threads, 1, "the body has not ended");
    let err = futures::executor::block_on(res.into_body().collect()).unwrap_err();
    assert_eq!(err.to_string(), "connection to the store lost");
    let s = engine.cluster_stats("GET:/export").unwrap();
    assert_eq!((s.threads, s.minute_exception), (0, 1));
}

#[test]
fn a_dropped_body_exits_the_entry_without_an_error() {
    let (engine, _clock) = engine();
    let mut svc = SentinelLayer::new(&engine).exit_on(ExitOn::BodyEnd).layer(tower::service_fn(hello));
    let res = call_now(&mut svc, get("/hello")).unwrap();
    assert_eq!(engine.cluster_stats("GET:/hello").unwrap().threads, 1);
    drop(res);
    let s = engine.cluster_stats("GET:/hello").unwrap();
    assert_eq!((s.threads, s.minute_success, s.minute_exception), (0, 1, 0));
}

/// A service that is not ready until told.
#[derive(Clone)]
struct Gate(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Service<Request<()>> for Gate {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
    fn call(&mut self, _req: Request<()>) -> Self::Future {
        ready(Ok(Response::new(Full::new(Bytes::new()))))
    }
}

#[test]
fn readiness_is_the_wrapped_services_so_backpressure_passes_through() {
    let (engine, _clock) = engine();
    let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut svc = SentinelLayer::new(&engine).layer(Gate(open.clone()));
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(svc.poll_ready(&mut cx).is_pending());
    open.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(svc.poll_ready(&mut cx).is_ready());
}

/// A rate limiter on `GET:/hello`: a request every 500 ms, each queued up to 2 s.
fn space_hello(engine: &Sentinel) {
    let rule = FlowRule::new("GET:/hello").count(2.0).control_behavior(ControlBehavior::RateLimiter);
    engine.load_flow_rules([rule.max_queueing_time_ms(2_000)]).unwrap();
}

/// Java's statistic slot records a call after the flow slot's sleep: a queued request's pass falls in the
/// second of its turn, and it is in flight only from then.
#[test]
fn a_queued_request_waits_on_the_engine_timer_and_a_dropped_one_exits_without_an_error() {
    let (engine, clock) = engine();
    space_hello(&engine);
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/hello")).unwrap().status(), StatusCode::OK);

    // The next pass is 500 ms away: the future waits on a timer of the engine's clock.
    let mut queued = svc.ready().now_or_never().unwrap().unwrap().call(get("/hello"));
    assert!(poll_once(&mut queued).is_pending());
    assert_eq!(clock.pending_timers(), 1);
    let s = engine.cluster_stats("GET:/hello").unwrap();
    // Recorded at its turn, as Java records a call after the flow slot's sleep: not in flight yet.
    assert_eq!((s.threads, s.minute_pass), (0, 1), "admitted, and waits for its turn");
    clock.advance_millis(499);
    assert!(poll_once(&mut queued).is_pending());
    clock.advance_millis(1);
    match poll_once(&mut queued) {
        Poll::Ready(Ok(res)) => assert_eq!(res.status(), StatusCode::OK),
        other => panic!("the queued request should have run: {:?}", other.map(|r| r.map(|r| r.status()))),
    }
    // The window at T0 + 1000 holds [T0 + 500, T0 + 1500): the queued request's pass (at its turn, T0 + 500),
    // not the first one's (at T0).
    clock.advance_millis(500);
    let s = engine.cluster_stats("GET:/hello").unwrap();
    assert_eq!((s.pass_qps, s.success_qps, s.threads, s.minute_pass), (1.0, 1.0, 0, 2), "{s:?}");

    // One more passes at once; the next queues (500 ms more), and the client goes away while it waits.
    assert_eq!(call_now(&mut svc, get("/hello")).unwrap().status(), StatusCode::OK);
    let mut dropped = svc.ready().now_or_never().unwrap().unwrap().call(get("/hello"));
    assert!(poll_once(&mut dropped).is_pending());
    drop(dropped);
    assert_eq!(clock.pending_timers(), 0, "its timer is gone");
    // Its pass at the moment it was given up on, with its completion: balanced, nothing left in flight.
    let s = engine.cluster_stats("GET:/hello").unwrap();
    assert_eq!((s.threads, s.minute_pass, s.minute_success, s.minute_exception), (0, 4, 4, 0));
}

#[test]
fn a_prioritized_request_over_the_limit_waits_for_the_next_window_instead_of_being_blocked() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/hello").count(1.0)]).unwrap();
    let layer = SentinelLayer::new(&engine).prioritized(|req| req.header("x-priority") == Some("high"));
    let mut svc = layer.layer(tower::service_fn(hello));
    let high = || Request::get("/hello").header("x-priority", "high").body(()).unwrap();
    clock.advance_millis(100);
    assert_eq!(call_now(&mut svc, get("/hello")).unwrap().status(), StatusCode::OK); // in [T0, T0+500)
    clock.advance_millis(500); // T0+600: the pass is still in the window
    assert_eq!(call_now(&mut svc, get("/hello")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    let mut waiting = svc.ready().now_or_never().unwrap().unwrap().call(high());
    assert!(poll_once(&mut waiting).is_pending(), "it borrows the next bucket and waits 400 ms for it");
    assert_eq!(clock.pending_timers(), 1);
    clock.advance_millis(399);
    assert!(poll_once(&mut waiting).is_pending());
    clock.advance_millis(1);
    assert!(matches!(poll_once(&mut waiting), Poll::Ready(Ok(ref r)) if r.status() == StatusCode::OK));
}

#[test]
fn requests_are_inbound_so_system_rules_apply() {
    let (engine, _clock) = engine();
    engine.load_system_rules([SystemRule { qps: Some(1.0), ..Default::default() }]).unwrap();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/a")).unwrap().status(), StatusCode::OK);
    let res = call_now(&mut svc, get("/b")).unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // The system check reads the pass qps, whose window no longer holds a bucket exactly one second old: room
    // comes 1000 ms later (`Retry-After` rounds up to whole seconds).
    assert_eq!(res.headers()["retry-after"], "1");
    let body = futures::executor::block_on(res.into_body().collect()).unwrap().to_bytes();
    assert_eq!(body, "Too Many Requests: blocked by Sentinel system protection\n");
}

#[test]
fn hot_parameters_past_the_inline_ones_reach_their_indexes() {
    let (engine, _clock) = engine();
    engine.load_param_flow_rules([ParamFlowRule::new("GET:/p", 9).count(1.0)]).unwrap();
    let mut layer = SentinelLayer::new(&engine);
    for i in 0..10 {
        let name = HeaderName::try_from(format!("p{i}")).unwrap();
        layer = layer.param(extract::header(name));
    }
    let mut svc = layer.layer(tower::service_fn(hello));
    let req = |v: &str| Request::get("/p").header("p9", v).header("p0", "same").body(()).unwrap();
    assert_eq!(call_now(&mut svc, req("x")).unwrap().status(), StatusCode::OK);
    assert_eq!(call_now(&mut svc, req("x")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call_now(&mut svc, req("y")).unwrap().status(), StatusCode::OK);
}

#[test]
fn a_namer_that_returns_none_leaves_the_request_unguarded() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/health").count(0.0)]).unwrap();
    let layer = SentinelLayer::new(&engine).path_cleaner(|p| (p != "/health").then_some(p.into()));
    let mut svc = layer.layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/health")).unwrap().status(), StatusCode::OK);
    assert!(engine.resource_names().is_empty());
}

#[test]
fn clones_of_a_service_share_the_layer_and_keep_working_after_a_queued_call() {
    let (engine, clock) = engine();
    engine
        .load_flow_rules([FlowRule::new("GET:/hello")
            .count(10.0)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_time_ms(1_000)])
        .unwrap();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    let mut other = svc.clone();
    assert_eq!(call_now(&mut other, get("/hello")).unwrap().status(), StatusCode::OK);
    let mut queued = pin!(svc.ready().now_or_never().unwrap().unwrap().call(get("/hello")));
    let waker = futures::task::noop_waker();
    assert!(queued.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
    // The queued call took the ready service; the one left in its place serves the next call.
    clock.advance_millis(200);
    assert_eq!(call_now(&mut svc, get("/hello")).unwrap().status(), StatusCode::OK);
    assert!(matches!(queued.as_mut().poll(&mut Context::from_waker(&waker)), Poll::Ready(Ok(_))));
    assert_eq!(engine.resource_names(), vec!["GET:/hello".to_string()]);
}

/// `SentinelLayer::axum`: responses keep axum's `Body` (the service's passes through; the layer's own and
/// the ones it watches are axum bodies too), and behave as in the default mode: a pass, a block with its
/// answer, an error traced at the end of a watched body.
#[cfg(feature = "axum")]
#[test]
fn the_axum_body_mode_keeps_axum_bodies_and_answers_as_the_default_mode() {
    use axum::body::Body;
    /// The layered service's responses have axum's body, not a wrapper around it.
    fn call_axum<S>(svc: &mut S, path: &str) -> Response<Body>
    where
        S: Service<Request<()>, Response = Response<Body>, Error = Infallible>,
    {
        call_now(svc, get(path)).unwrap()
    }
    fn text(res: Response<Body>) -> Result<String, axum::Error> {
        let bytes = futures::executor::block_on(res.into_body().collect())?.to_bytes();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/hello").count(1.0)]).unwrap();
    let service = tower::service_fn(|req: Request<()>| {
        let body = match req.uri().path() {
            "/export" => Body::from_stream(futures::stream::iter([
                Ok(Bytes::from_static(b"part")),
                Err(std::io::Error::other("connection to the store lost")),
            ])),
            _ => Body::from("hello"),
        };
        ready(Ok::<_, Infallible>(Response::new(body)))
    });
    let mut svc = SentinelLayer::new(&engine).axum().layer(service);
    assert_eq!(text(call_axum(&mut svc, "/hello")).unwrap(), "hello");
    let blocked = call_axum(&mut svc, "/hello");
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(blocked.headers().contains_key(http::header::RETRY_AFTER));
    assert!(text(blocked).unwrap().contains("flow rule"));
    let s = engine.cluster_stats("GET:/hello").unwrap();
    assert_eq!((s.minute_pass, s.minute_block, s.minute_success, s.threads), (1, 1, 1, 0));

    let mut watching = SentinelLayer::new(&engine).exit_on(ExitOn::BodyEnd).axum().layer(service);
    let res = call_axum(&mut watching, "/export");
    assert_eq!(engine.cluster_stats("GET:/export").unwrap().threads, 1, "the body has not ended");
    assert!(text(res).unwrap_err().to_string().contains("connection to the store lost"));
    let s = engine.cluster_stats("GET:/export").unwrap();
    assert_eq!((s.threads, s.minute_exception), (0, 1));
}

fn with_method(method: &str, path: &str) -> Request<()> {
    Request::builder().method(http::Method::from_bytes(method.as_bytes()).unwrap()).uri(path).body(()).unwrap()
}

#[test]
fn a_head_request_counts_as_the_get_it_runs() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/report").count(2.0)]).unwrap();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    let statuses: Vec<StatusCode> = ["GET", "HEAD", "HEAD", "GET"]
        .into_iter()
        .map(|m| call_now(&mut svc, with_method(m, "/report")).unwrap().status())
        .collect();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS]
    );
    assert!(!engine.resource_names().iter().any(|n| n.starts_with("HEAD:")), "{:?}", engine.resource_names());
}

#[test]
fn extension_and_uncommon_methods_share_one_resource_and_make_no_names() {
    let (engine, _clock) = engine();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    for i in 0..500 {
        call_now(&mut svc, with_method(&format!("X{i}"), "/products/1")).unwrap();
    }
    for m in ["OPTIONS", "TRACE", "CONNECT", "PROPFIND"] {
        call_now(&mut svc, with_method(m, "/products/1")).unwrap();
    }
    let names = engine.resource_names();
    assert_eq!(names, [sentinel_runtime::web::OTHER_METHODS_RESOURCE], "{names:?}");
    assert_eq!(engine.cluster_stats(sentinel_runtime::web::OTHER_METHODS_RESOURCE).unwrap().pass_qps, 504.0);
}

#[test]
fn a_rule_on_an_extension_method_of_a_route_names_its_own_resource_even_when_loaded_later() {
    let (engine, _clock) = engine();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, with_method("PURGE", "/cache")).unwrap().status(), StatusCode::OK);
    engine.load_flow_rules([FlowRule::new("PURGE:/cache").count(0.0)]).unwrap();
    assert_eq!(call_now(&mut svc, with_method("PURGE", "/cache")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call_now(&mut svc, with_method("PURGE", "/other")).unwrap().status(), StatusCode::OK);
    // A rule on the bucket limits every method in it.
    engine.load_flow_rules([FlowRule::new(sentinel_runtime::web::OTHER_METHODS_RESOURCE).count(0.0)]).unwrap();
    assert_eq!(call_now(&mut svc, with_method("X9", "/x")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn a_route_first_used_after_the_engine_cap_is_reached_keeps_its_rules() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock).max_resources(3).build();
    engine.set_system_readings(None, None);
    engine
        .load_flow_rules([
            FlowRule::new("GET:/admin").count(0.0),
            FlowRule::new("GET:/admin/.*").regex(true).count(0.0),
        ])
        .unwrap();
    // A generous layer bound: the engine's cap is what the flood reaches.
    let mut svc = SentinelLayer::new(&engine).max_resources(100).layer(tower::service_fn(hello));
    for w in ["a", "b", "c", "d", "e", "f"] {
        assert_eq!(call_now(&mut svc, get(&format!("/{w}"))).unwrap().status(), StatusCode::OK);
    }
    assert!(engine.caps().resource_cap_reached());
    assert_eq!(call_now(&mut svc, get("/admin")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call_now(&mut svc, get("/admin/users")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS, "regex");
    // A rule loaded after a name went to the engine's overflow applies at its next request.
    engine.load_flow_rules([FlowRule::new("GET:/admin").count(0.0), FlowRule::new("GET:/e").count(0.0)]).unwrap();
    assert_eq!(call_now(&mut svc, get("/e")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn past_the_layer_bound_ruled_names_keep_their_rules_and_the_rest_count_towards_system_rules() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/late/.*").regex(true).count(0.0)]).unwrap();
    let mut svc = SentinelLayer::new(&engine).max_resources(2).layer(tower::service_fn(hello));
    for w in ["a", "b", "c", "d"] {
        call_now(&mut svc, get(&format!("/{w}"))).unwrap();
    }
    assert_eq!(call_now(&mut svc, get("/late/word")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    engine.load_system_rules([SystemRule { qps: Some(1.0), ..SystemRule::default() }]).unwrap();
    let overflow = engine.cluster_stats(sentinel_runtime::web::OVERFLOW_RESOURCE).unwrap();
    assert_eq!(overflow.pass_qps, 2.0, "/c and /d");
    assert_eq!(call_now(&mut svc, get("/z")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS, "inbound qps is over 1");
}

#[test]
fn a_grpc_content_type_sent_to_an_http_route_does_not_escape_the_routes_rule() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("POST:/orders/{id}/cancel").count(0.0)]).unwrap();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    let plain = Request::post("/orders/7/cancel").body(()).unwrap();
    assert_eq!(call_now(&mut svc, plain).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    // The same call to the same handler, with a header the client chooses.
    let disguised = Request::post("/orders/7/cancel").header("content-type", "application/grpc").body(()).unwrap();
    let res = call_now(&mut svc, disguised).unwrap();
    let blocked = res.status() == StatusCode::TOO_MANY_REQUESTS || res.headers().get("grpc-status").is_some();
    assert!(blocked, "the rule on the route is escaped: resources {:?}", engine.resource_names());
}

/// Behind axum's router, a routed request is named by its route whatever its content type, even when its path
/// has the shape of a gRPC method's (`/orders/cancel`).
#[cfg(feature = "axum")]
#[test]
fn a_routed_request_is_named_by_its_route_whatever_its_content_type() {
    use axum::body::Body;
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("POST:/orders/{op}").count(0.0)]).unwrap();
    let mut app = axum::Router::new()
        .route("/orders/{op}", axum::routing::post(|| async { "done" }))
        .route_layer(SentinelLayer::new(&engine).axum());
    for content_type in ["application/json", "application/grpc", "application/grpc+proto"] {
        let req = Request::post("/orders/cancel").header("content-type", content_type).body(Body::empty()).unwrap();
        let ready = ServiceExt::<Request<Body>>::ready(&mut app).now_or_never().expect("ready").unwrap();
        let res = ready.call(req).now_or_never().expect("answered without waiting").unwrap();
        let blocked = res.status() == StatusCode::TOO_MANY_REQUESTS || res.headers().get("grpc-status").is_some();
        assert!(blocked, "{content_type}: the route's rule is escaped: resources {:?}", engine.resource_names());
    }
    assert_eq!(engine.cluster_stats("POST:/orders/{op}").unwrap().minute_block, 3);
    assert!(!engine.resource_names().iter().any(|n| n == "/orders/cancel"));
}

/// A gRPC service mounted in a router as tonic's `Routes` mount it (`/{service}/{*rest}`): each method is its
/// own resource; an HTTP catch-all route (another wildcard) names its calls by the route whatever their type.
#[cfg(feature = "axum")]
#[test]
fn a_grpc_service_mounted_in_a_router_names_each_method() {
    use axum::body::Body;
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("/shop.Orders/Cancel").count(0.0)]).unwrap();
    let grpc = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let mut app = axum::Router::new()
        .route_service("/shop.Orders/{*rest}", grpc)
        .route("/files/{*path}", axum::routing::post(|| async { "done" }))
        .route_layer(SentinelLayer::new(&engine).axum());
    let mut call = |path: &str| {
        let req = Request::post(path).header("content-type", "application/grpc").body(Body::empty()).unwrap();
        let ready = ServiceExt::<Request<Body>>::ready(&mut app).now_or_never().expect("ready").unwrap();
        let res = ready.call(req).now_or_never().expect("answered without waiting").unwrap();
        res.headers().get("grpc-status").is_some_and(|s| s != "0") || res.status() == StatusCode::TOO_MANY_REQUESTS
    };
    assert!(call("/shop.Orders/Cancel"), "the method's rule applies");
    assert!(!call("/shop.Orders/Get"), "another method passes");
    assert!(!call("/files/shop/Get"));
    let names = engine.resource_names();
    assert!(names.iter().any(|n| n == "/shop.Orders/Get"), "{names:?}");
    assert!(names.iter().any(|n| n == "POST:/files/{*path}"), "{names:?}");
    assert!(!names.iter().any(|n| n == "/files/shop/Get"), "{names:?}");
}

#[test]
fn a_hot_value_with_its_own_threshold_is_told_the_same_quota_when_passed_and_when_blocked() {
    use sentinel_runtime::param_flow::ParamItemValue;
    use sentinel_runtime::web::RateLimitHeaders;
    let (engine, _clock) = engine();
    engine
        .load_param_flow_rules([ParamFlowRule::new("GET:/search", 0)
            .count(1.0)
            .item(ParamItemValue::Str("vip".into()), 3.0)])
        .unwrap();
    let layer = SentinelLayer::new(&engine).param(extract::query("user")).rate_limit_headers(RateLimitHeaders::new());
    let mut svc = layer.layer(tower::service_fn(hello));
    let policy = |res: &Response<_>| res.headers().get("ratelimit-policy").map(|v| v.to_str().unwrap().to_owned());
    let mut seen = Vec::new();
    for _ in 0..4 {
        let res = call_now(&mut svc, get("/search?user=vip")).unwrap();
        seen.push((res.status(), policy(&res)));
    }
    let passed = Some(r##""GET:/search#0";q=3;w=1"##.to_owned());
    assert_eq!(
        seen[..3],
        [(StatusCode::OK, passed.clone()), (StatusCode::OK, passed.clone()), (StatusCode::OK, passed.clone())]
    );
    assert_eq!(seen[3], (StatusCode::TOO_MANY_REQUESTS, passed), "the policy the value ran out of");
}

/// A word no cleaner folds into `{id}` (letters past `f`, so never hexadecimal).
fn word(mut i: usize) -> String {
    let mut w = String::from("w");
    loop {
        w.push((b'g' + (i % 20) as u8) as char);
        i /= 20;
        if i == 0 {
            return w;
        }
    }
}

#[test]
fn paths_a_regex_rule_matches_do_not_make_resources_without_bound() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock).max_resources(10).build();
    engine.set_system_readings(None, None);
    engine.load_flow_rules([FlowRule::new("GET:/search/.*").regex(true).count(1_000_000.0)]).unwrap();
    let mut svc = SentinelLayer::new(&engine).max_resources(10).layer(tower::service_fn(hello));
    for i in 0..2_000 {
        assert_eq!(call_now(&mut svc, get(&format!("/search/{}", word(i)))).unwrap().status(), StatusCode::OK);
    }
    let made = engine.resource_names().len();
    assert!(made <= 100, "{made} resources from 2000 client-chosen words, with caps of 10");
}

/// Paths that many regex rules match, in every combination (a dozen patterns make 4,096): past the layer's and
/// the engine's caps, the resources that names matching the same patterns share are bounded too, and every
/// request is still checked by the rules.
#[test]
fn paths_that_many_regex_rules_match_in_every_combination_do_not_make_resources_without_bound() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock).max_resources(10).build();
    engine.set_system_readings(None, None);
    let letters: Vec<char> = ('a'..='l').collect();
    let rules = letters.iter().map(|c| FlowRule::new(format!("GET:/search/.*{c}.*")).regex(true).count(1e6));
    engine.load_flow_rules(rules).unwrap();
    let mut svc = SentinelLayer::new(&engine).max_resources(10).layer(tower::service_fn(hello));
    for mask in 1u32..(1 << letters.len()) {
        let chosen: String = letters.iter().enumerate().filter(|(i, _)| mask & 1 << i != 0).map(|(_, c)| *c).collect();
        assert_eq!(call_now(&mut svc, get(&format!("/search/{chosen}"))).unwrap().status(), StatusCode::OK);
    }
    let made = engine.resource_names().len();
    assert!(made <= 10 + 10 + 1, "{made} resources from 4,095 combinations of patterns, with caps of 10");
    let shared = engine.cluster_stats(sentinel_runtime::RESOURCE_PATTERNS_OVERFLOW).expect("the shared resource");
    assert!(shared.pass_qps > 3_000.0, "the rules checked the requests past the bounds: {shared:?}");
}

/// Java's `UrlCleaner` and `getResourceName`: an empty name means the request is not guarded.
#[test]

fn an_empty_cleaned_path_leaves_the_request_unguarded() {
    // Java's `UrlCleaner`: a URL cleaned to "" is not guarded (no `GET:` resource shared by every excluded URL).
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:").count(0.0)]).unwrap();
    let layer = SentinelLayer::new(&engine).path_cleaner(|p| Some(if p == "/health" { "".into() } else { p.into() }));
    let mut svc = layer.layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/health")).unwrap().status(), StatusCode::OK);
    assert!(engine.resource_names().is_empty(), "{:?}", engine.resource_names());
}

#[test]

fn an_empty_resource_name_leaves_the_request_unguarded() {
    let (engine, _clock) = engine();
    let layer = SentinelLayer::new(&engine)
        .resource_name(|req| Some(if req.path() == "/health" { "".into() } else { req.path().into() }));
    let mut svc = layer.layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/health")).unwrap().status(), StatusCode::OK);
    assert!(engine.resource_names().is_empty(), "{:?}", engine.resource_names());
    call_now(&mut svc, get("/orders")).unwrap();
    assert_eq!(engine.resource_names(), vec!["/orders".to_string()]);
}

/// Java's servlet filter names a request by its decoded path with `.` and `..` segments resolved
/// (`FilterUtil.filterTarget`): a client cannot move a request out of its route's resource by spelling its
/// path another way.
#[test]
fn a_path_spelled_with_escapes_or_dot_segments_is_named_as_the_path_it_means() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/users/{id}").count(1.0)]).unwrap();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/users/12")).unwrap().status(), StatusCode::OK);
    for spelling in ["/users/%31%32", "/users/7/../12", "/users/./12", "/%75sers/12", "/admin/../users/12"] {
        assert_eq!(call_now(&mut svc, get(spelling)).unwrap().status(), StatusCode::TOO_MANY_REQUESTS, "{spelling}");
    }
    assert_eq!(engine.resource_names(), vec!["GET:/users/{id}".to_string()]);
}

fn answering(
    status: StatusCode,
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    tower::service_fn(move |_req: Request<()>| {
        let mut res = Response::new(Full::new(Bytes::new()));
        *res.status_mut() = status;
        ready(Ok::<_, Infallible>(res))
    })
}

/// What counts as an error is the layer's predicate (default: 5xx): a 429 the handler answers is no
/// exception for statistics and circuit breakers, nor is a 503 the predicate does not count.
#[test]
fn an_overload_answer_counts_as_an_error_only_when_the_predicate_says_so() {
    let (engine, _clock) = engine();
    let mut svc = SentinelLayer::new(&engine).layer(answering(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(call_now(&mut svc, get("/a")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    let s = engine.cluster_stats("GET:/a").unwrap();
    assert_eq!((s.minute_success, s.minute_exception), (1, 0), "a 429 is not a 5xx");
    let mut svc = SentinelLayer::new(&engine).trace_if(|_| false).layer(answering(StatusCode::SERVICE_UNAVAILABLE));
    call_now(&mut svc, get("/b")).unwrap();
    let s = engine.cluster_stats("GET:/b").unwrap();
    assert_eq!((s.minute_success, s.minute_exception), (1, 0), "the predicate counts nothing");
}

/// Java's Spring Web MVC adapter enters `sentinel_spring_web_context` (`AbstractSentinelInterceptor`): a chain
/// rule written for it (shared rules, a dashboard's) limits the requests of a layer in the web context.
#[test]
fn a_chain_rule_on_javas_web_context_limits_requests_in_the_web_context() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/orders").count(0.0).chain("sentinel_spring_web_context")]).unwrap();
    let layer = SentinelLayer::new(&engine).context_name(sentinel_runtime::web::WEB_CONTEXT_NAME);
    let mut svc = layer.layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/orders")).unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

/// An adaptive rule's `max_wait_ms`: at the limit a request waits for a place on the engine's timer, whatever
/// the layer takes from requests (hot parameters, an origin).
#[test]
fn at_an_adaptive_limit_a_request_waits_for_a_place_with_hot_parameters_too() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    for with_param in [false, true] {
        let (engine, _clock) = engine();
        engine
            .load_adaptive_rules([AdaptiveRule::new("GET:/slow")
                .algorithm(AlgorithmKind::Aimd)
                .limits(1, 1, 1)
                .max_wait_ms(300)])
            .unwrap();
        let mut layer = SentinelLayer::new(&engine).exit_on(ExitOn::BodyEnd);
        if with_param {
            layer = layer.param(extract::header(HeaderName::from_static("x-user")));
        }
        let mut svc = layer.layer(tower::service_fn(hello));
        let holder = call_now(&mut svc, get("/slow")).unwrap();
        assert_eq!(holder.status(), StatusCode::OK);
        let mut second = svc.ready().now_or_never().unwrap().unwrap().call(get("/slow"));
        let polled = poll_once(&mut second).map(|r| r.map(|r| r.status()));
        assert!(polled.is_pending(), "with_param {with_param}: {polled:?}");
        drop(holder);
        let polled = poll_once(&mut second).map(|r| r.map(|r| r.status()));
        assert!(matches!(polled, Poll::Ready(Ok(StatusCode::OK))), "with_param {with_param}: {polled:?}");
    }
}

#[test]
fn a_request_that_waited_for_a_place_is_told_its_hot_parameter_policy_as_any_other() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    use sentinel_runtime::web::RateLimitHeaders;
    let (engine, _clock) = engine();
    engine
        .load_adaptive_rules([AdaptiveRule::new("GET:/slow")
            .algorithm(AlgorithmKind::Aimd)
            .limits(1, 1, 1)
            .max_wait_ms(300)])
        .unwrap();
    engine.load_param_flow_rules([ParamFlowRule::new("GET:/slow", 0).count(5.0)]).unwrap();
    let layer = SentinelLayer::new(&engine)
        .exit_on(ExitOn::BodyEnd)
        .param(extract::header(HeaderName::from_static("x-user")))
        .rate_limit_headers(RateLimitHeaders::new());
    let mut svc = layer.layer(tower::service_fn(hello));
    let req = || Request::get("/slow").header("x-user", "ann").body(()).unwrap();
    let fields = |res: &Response<_>| {
        ["ratelimit-policy", "ratelimit"].map(|h| res.headers().get(h).map(|v| v.to_str().unwrap().to_owned()))
    };
    let holder = call_now(&mut svc, req()).unwrap();
    // The bucket refills strictly after its second (Java's `>`): in 1.001 s, told as 2.
    assert_eq!(fields(&holder), [Some(r##""GET:/slow#0";q=5;w=1"##.into()), Some(r##""GET:/slow#0";r=4;t=2"##.into())]);
    let mut second = svc.ready().now_or_never().unwrap().unwrap().call(req());
    assert!(poll_once(&mut second).is_pending(), "at the adaptive limit: waits for a place");
    drop(holder);
    let Poll::Ready(Ok(waited)) = poll_once(&mut second) else { panic!("admitted once the place is free") };
    assert_eq!(
        fields(&waited),
        [Some(r##""GET:/slow#0";q=5;w=1"##.into()), Some(r##""GET:/slow#0";r=3;t=2"##.into())],
        "the value's bucket, as for a request that did not wait"
    );
}

#[test]
fn two_qps_rules_on_one_resource_are_told_as_the_one_that_binds_not_as_two_policies_of_one_name() {
    use sentinel_runtime::web::RateLimitHeaders;
    // Both rules count the resource's one window: the smaller quota always runs out first. Two items named
    // alike would leave a client unable to tell which `r` belongs to which `q` (the draft: each service limit
    // item identifies its policy by name).
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:/a").count(10.0), FlowRule::new("GET:/a").count(3.0)]).unwrap();
    let mut svc =
        SentinelLayer::new(&engine).rate_limit_headers(RateLimitHeaders::new()).layer(tower::service_fn(hello));
    let fields = |res: &Response<_>| {
        ["ratelimit-policy", "ratelimit"].map(|h| res.headers().get(h).map(|v| v.to_str().unwrap().to_owned()))
    };
    let passed = call_now(&mut svc, get("/a")).unwrap();
    assert_eq!(fields(&passed), [Some(r#""GET:/a";q=3;w=1"#.into()), Some(r#""GET:/a";r=2;t=1"#.into())]);
    // Two rules on one hot parameter: one policy, the one with the least remaining.
    engine
        .load_param_flow_rules([ParamFlowRule::new("GET:/b", 0).count(5.0), ParamFlowRule::new("GET:/b", 0).count(2.0)])
        .unwrap();
    let layer = SentinelLayer::new(&engine).param(extract::query("user")).rate_limit_headers(RateLimitHeaders::new());
    let mut svc = layer.layer(tower::service_fn(hello));
    let passed = call_now(&mut svc, get("/b?user=ann")).unwrap();
    assert_eq!(fields(&passed), [Some(r##""GET:/b#0";q=2;w=1"##.into()), Some(r##""GET:/b#0";r=1;t=2"##.into())]);
}

#[test]
fn a_client_that_waits_the_retry_after_it_was_told_is_not_blocked_again() {
    use sentinel_runtime::web::RateLimitHeaders;
    // A hot value's rate limiter: one call per 2 s, queueing strictly less than 1 s; the second call at once
    // is blocked until the wait drops under 1 s: 1 s and 1 ns from now.
    let (engine, clock) = engine();
    engine
        .load_param_flow_rules([ParamFlowRule::new("GET:/pay", 0)
            .count(1.0)
            .duration_in_sec(2)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_time_ms(1_000)])
        .unwrap();
    let layer = SentinelLayer::new(&engine).param(extract::query("user")).rate_limit_headers(RateLimitHeaders::new());
    let mut svc = layer.layer(tower::service_fn(hello));
    assert_eq!(call_now(&mut svc, get("/pay?user=ann")).unwrap().status(), StatusCode::OK);
    let blocked = call_now(&mut svc, get("/pay?user=ann")).unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    let header = |name: &str| blocked.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
    let retry_after: u64 = header("retry-after").unwrap().parse().unwrap();
    assert_eq!(header("ratelimit"), Some(r##""GET:/pay#0";r=0;t=2"##.into()));
    assert!(retry_after >= 2, "Retry-After {retry_after} is earlier than the RateLimit field's t=2");
    clock.advance_millis(retry_after * 1_000);
    let mut retried = svc.ready().now_or_never().unwrap().unwrap().call(get("/pay?user=ann"));
    let status = poll_once(&mut retried).map(|r| r.map(|r| r.status()));
    assert!(!matches!(status, Poll::Ready(Ok(StatusCode::TOO_MANY_REQUESTS))), "retried after Retry-After: {status:?}");
}

/// A request whose client went away (its future dropped before the service answered) measured no round
/// trip: an adaptive limit takes no sample of it (as Envoy's filter, which cancels the sample on destroy).
#[test]
fn requests_whose_clients_went_away_give_no_rtt_sample_to_the_adaptive_limit() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("GET:/slow").algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(|_req: Request<()>| {
        std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
    }));
    for _ in 0..5 {
        let mut calls: Vec<_> =
            (0..6).map(|_| svc.ready().now_or_never().unwrap().unwrap().call(get("/slow"))).collect();
        for c in &mut calls {
            assert!(poll_once(c).is_pending());
        }
        clock.advance_millis(1_000);
        drop(calls);
    }
    let s = &engine.adaptive_status()[0];
    assert_eq!((s.inflight, s.limit, s.sample_rtt), (0, 10, std::time::Duration::ZERO), "{s:?}");
}

#[test]
fn a_block_returned_by_the_wrapped_service_is_not_an_error_of_the_inbound_resource() {
    use sentinel_runtime::outbound::{ClientError, SentinelClientLayer};
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("stock").count(0.0)]).unwrap();
    let block = engine.resource("stock").enter().unwrap_err();
    // A service that returns a block as its error, bare or in an io::Error.
    let bare = block.clone();
    let mut svc = SentinelLayer::new(&engine)
        .layer(tower::service_fn(move |_req: Request<()>| ready(Err::<Response<Full<Bytes>>, _>(bare.clone()))));
    assert!(call_now(&mut svc, get("/bare")).is_err());
    let held = block.clone();
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(move |_req: Request<()>| {
        ready(Err::<Response<Full<Bytes>>, _>(std::io::Error::other(held.clone())))
    }));
    assert!(call_now(&mut svc, get("/held")).is_err());
    // A proxy: the inbound layer over a guarded client, whose downstream is blocked.
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(0.0)]).unwrap();
    let client = SentinelClientLayer::new(&engine).layer(tower::service_fn(|_req: Request<()>| {
        ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }));
    let mut proxy = SentinelLayer::new(&engine).layer(client);
    let err = call_now(&mut proxy, Request::get("http://stock.svc/items/1").body(()).unwrap()).unwrap_err();
    assert!(matches!(err, ClientError::Blocked(_)), "{err:?}");
    for name in ["GET:/bare", "GET:/held", "GET:/items/{id}"] {
        let s = engine.cluster_stats(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!((s.minute_pass, s.minute_exception, s.threads), (1, 0, 0), "{name}: a block is no failure");
    }
    // A failure still is one.
    let mut svc = SentinelLayer::new(&engine).layer(tower::service_fn(|_req: Request<()>| {
        ready(Err::<Response<Full<Bytes>>, _>(std::io::Error::other("the database is down")))
    }));
    assert!(call_now(&mut svc, get("/down")).is_err());
    assert_eq!(engine.cluster_stats("GET:/down").unwrap().minute_exception, 1);
}

/// A gRPC call whose response body ends without a `grpc-status` (no trailers, or trailers without one) broke
/// the protocol: tonic's client reports `UNKNOWN` ("protocol error: missing grpc-status trailer", tonic 0.14
/// `status.rs`, `infer_grpc_status`), and the outbound guard judges such an answer so. The web layer counts it
/// as the error its client sees.
#[test]
fn a_grpc_response_that_ends_without_a_status_is_an_error() {
    let (engine, _clock) = engine();
    let endings: [Option<http::HeaderMap>; 2] = [None, Some(http::HeaderMap::new())];
    for (i, trailers) in endings.into_iter().enumerate() {
        let svc = tower::service_fn(move |_req: Request<()>| {
            let mut frames: Vec<Result<Frame<Bytes>, Infallible>> =
                vec![Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0")))];
            if let Some(t) = trailers.clone() {
                frames.push(Ok(Frame::trailers(t)));
            }
            let res = Response::builder()
                .header("content-type", "application/grpc")
                .body(StreamBody::new(futures::stream::iter(frames)))
                .unwrap();
            ready(Ok::<_, Infallible>(res))
        });
        let mut svc = SentinelLayer::new(&engine).layer(svc);
        let path = format!("/shop.Orders/Get{i}");
        let req = Request::post(path.as_str()).header("content-type", "application/grpc").body(()).unwrap();
        let res = call_now(&mut svc, req).unwrap();
        futures::executor::block_on(res.into_body().collect()).unwrap();
        let s = engine.cluster_stats(&path).unwrap();
        assert_eq!((s.threads, s.minute_exception), (0, 1), "#{i}: UNKNOWN is an error by default");
    }
}
