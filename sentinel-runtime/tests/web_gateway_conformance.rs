//! Gateway flow control through the web layer's gateway mode (no network, manual clock), against Java
//! Sentinel 1.8.9's `sentinel-api-gateway-adapter-common`: rules on a route id and on an API group, several
//! parameters on one resource, intervals of minutes, hours and days, burst, queueing, rules with and without
//! a parameter item.
#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::future::{ready, Future};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowGrade};
use sentinel_runtime::web::gateway::{
    ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ParamMatchStrategy, ResourceMode,
};
use sentinel_runtime::web::{PeerAddr, SentinelLayer, TrustedProxies};
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

/// A gateway whose routes are named as Spring Cloud Gateway route ids: `/product/**` is `product_route`,
/// everything else `other_route`.
fn gateway(
    engine: &Sentinel,
) -> impl Service<Request<()>, Response = Response<impl http_body::Body + use<>>, Error = Infallible, Future: Unpin>
       + Clone
       + use<> {
    SentinelLayer::new(engine)
        .resource_name(|req| {
            Some(if req.path().starts_with("/product") { "product_route".into() } else { "other_route".into() })
        })
        .gateway(TrustedProxies::none())
        .layer(tower::service_fn(hello))
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    std::pin::Pin::new(f).poll(&mut Context::from_waker(&waker))
}

/// Sends `req` and returns the status at once; `0` when the request waits (queued).
fn send<S, B>(svc: &mut S, req: Request<()>) -> u16
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    S::Future: Unpin,
{
    let ready = svc.ready().now_or_never().expect("ready").unwrap();
    let mut f = ready.call(req);
    match poll_once(&mut f) {
        Poll::Ready(r) => r.unwrap().status().as_u16(),
        Poll::Pending => 0,
    }
}

fn get(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

fn from(ip: &str, path: &str) -> Request<()> {
    let mut req = get(path);
    req.extensions_mut().insert(PeerAddr(format!("{ip}:4000").parse().unwrap()));
    req
}

fn header(path: &str, name: &str, value: &str) -> Request<()> {
    Request::get(path).header(name, value).body(()).unwrap()
}

fn statuses<S, B>(svc: &mut S, n: usize, req: impl Fn() -> Request<()>) -> Vec<u16>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    S::Future: Unpin,
{
    (0..n).map(|_| send(svc, req())).collect()
}

#[test]
fn a_route_rule_without_a_parameter_item_limits_the_route_as_a_whole() {
    let (engine, clock) = engine();
    engine.load_gateway_rules([GatewayFlowRule::new("product_route").count(3.0)]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 4, || get("/product/1")), [200, 200, 200, 429]);
    assert_eq!(send(&mut gw, get("/other")), 200, "another route");
    clock.advance_millis(1000);
    assert_eq!(send(&mut gw, get("/product/2")), 429, "not strictly more than 1 s");
    clock.advance_millis(1);
    assert_eq!(statuses(&mut gw, 4, || get("/product/3")), [200, 200, 200, 429]);
}

#[test]
fn an_interval_of_minutes_refills_only_after_strictly_more_than_the_interval_in_proportion() {
    let (engine, clock) = engine();
    engine.load_gateway_rules([GatewayFlowRule::new("product_route").count(4.0).interval_sec(120)]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 5, || get("/product/1")), [200, 200, 200, 200, 429]);
    clock.advance_millis(60_000);
    assert_eq!(send(&mut gw, get("/product/1")), 429);
    clock.advance_millis(60_000);
    assert_eq!(send(&mut gw, get("/product/1")), 429, "exactly the interval: no refill");
    clock.advance_millis(1);
    assert_eq!(statuses(&mut gw, 5, || get("/product/1")), [200, 200, 200, 200, 429]);
    // Half an interval after the refill, a quarter of the bucket is spent: strictly more than the interval
    // after the last refill, `elapsed * count / interval` tokens come back (Java's `toAddCount`).
    clock.advance_millis(180_000);
    assert_eq!(statuses(&mut gw, 5, || get("/product/1")), [200, 200, 200, 200, 429], "capped at count");
}

#[test]
fn intervals_of_hours_and_days() {
    let (engine, clock) = engine();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("product_route").count(2.0).interval_sec(3_600),
            GatewayFlowRule::new("other_route").count(1.0).interval_sec(86_400),
        ])
        .unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 3, || get("/product/1")), [200, 200, 429]);
    assert_eq!(statuses(&mut gw, 2, || get("/x")), [200, 429]);
    clock.advance_millis(3_600_000);
    assert_eq!(send(&mut gw, get("/product/1")), 429);
    clock.advance_millis(1);
    assert_eq!(statuses(&mut gw, 3, || get("/product/1")), [200, 200, 429]);
    assert_eq!(send(&mut gw, get("/x")), 429);
    clock.advance_millis(86_400_000 - 3_600_000);
    assert_eq!(send(&mut gw, get("/x")), 200, "a day and a millisecond after the first");
    assert_eq!(send(&mut gw, get("/x")), 429);
}

#[test]
fn burst_adds_to_the_first_bucket_and_refills_come_at_the_count_rate() {
    let (engine, clock) = engine();
    engine.load_gateway_rules([GatewayFlowRule::new("product_route").count(2.0).burst(3)]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 6, || get("/product/1")), [200, 200, 200, 200, 200, 429]);
    clock.advance_millis(1_001);
    assert_eq!(statuses(&mut gw, 3, || get("/product/1")), [200, 200, 429], "1001 * 2 / 1000 = 2 tokens");
    clock.advance_millis(1_999);
    assert_eq!(statuses(&mut gw, 4, || get("/product/1")), [200, 200, 200, 429], "1999 * 2 / 1000 = 3 tokens");
}

#[test]
fn a_fractional_count_is_read_as_its_integer_part() {
    let (engine, _clock) = engine();
    engine.load_gateway_rules([GatewayFlowRule::new("product_route").count(2.9)]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 3, || get("/product/1")), [200, 200, 429]);
}

#[test]
fn the_rate_limiter_spaces_calls_by_the_interval_over_the_count_and_queues_strictly_less_than_the_timeout() {
    let (engine, clock) = engine();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("product_route").count(4.0).control_behavior(ControlBehavior::RateLimiter),
            GatewayFlowRule::new("other_route")
                .count(2.0)
                .interval_sec(60)
                .burst(10)
                .control_behavior(ControlBehavior::RateLimiter),
        ])
        .unwrap();
    let mut gw = gateway(&engine);
    // 250 ms apart: the second waits 250 ms, the third would wait 500 ms, not less than 500.
    assert_eq!(statuses(&mut gw, 3, || get("/product/1")), [200, 0, 429]);
    // 30 s apart (burst is not read by the rate limiter).
    assert_eq!(statuses(&mut gw, 2, || get("/x")), [200, 429]);
    clock.advance_millis(29_500);
    assert_eq!(send(&mut gw, get("/x")), 429, "a wait of 500 ms");
    clock.advance_millis(1);
    assert_eq!(send(&mut gw, get("/x")), 0, "a wait of 499 ms");
    clock.advance_millis(60_000);
    assert_eq!(send(&mut gw, get("/x")), 200);
}

#[test]
fn a_thread_grade_rule_limits_requests_in_flight() {
    let (engine, _clock) = engine();
    engine.load_gateway_rules([GatewayFlowRule::new("product_route").grade(FlowGrade::Thread).count(1.0)]).unwrap();
    let slow =
        tower::service_fn(|_req: Request<()>| futures::future::pending::<Result<Response<Full<Bytes>>, Infallible>>());
    let mut gw = SentinelLayer::new(&engine)
        .resource_name(|_| Some("product_route".into()))
        .gateway(TrustedProxies::none())
        .layer(slow);
    let mut first = gw.ready().now_or_never().unwrap().unwrap().call(get("/product/1"));
    assert!(poll_once(&mut first).is_pending());
    let mut second = gw.ready().now_or_never().unwrap().unwrap().call(get("/product/1"));
    match poll_once(&mut second) {
        Poll::Ready(r) => assert_eq!(r.unwrap().status(), 429),
        Poll::Pending => panic!("the second should be blocked"),
    }
    drop(first);
    let mut third = gw.ready().now_or_never().unwrap().unwrap().call(get("/product/1"));
    assert!(poll_once(&mut third).is_pending(), "the first one exited");
}

#[test]
fn several_parameter_rules_and_a_whole_route_rule_on_one_route_each_read_their_own_value() {
    let (engine, _clock) = engine();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("product_route").count(2.0).param_item(GatewayParamItem::header("x-tenant")),
            GatewayFlowRule::new("product_route").count(3.0).param_item(GatewayParamItem::url_param("user")),
            GatewayFlowRule::new("product_route").count(5.0),
            GatewayFlowRule::new("product_route").count(4.0).param_item(GatewayParamItem::client_ip()),
        ])
        .unwrap();
    let mut gw = gateway(&engine);
    let req = |tenant: &str, user: &str, ip: &str| {
        let mut r = Request::get(format!("/product/1?user={user}")).header("x-tenant", tenant).body(()).unwrap();
        r.extensions_mut().insert(PeerAddr(format!("{ip}:1").parse().unwrap()));
        r
    };
    assert_eq!(send(&mut gw, req("a", "u1", "10.0.0.1")), 200);
    assert_eq!(send(&mut gw, req("a", "u2", "10.0.0.2")), 200);
    assert_eq!(send(&mut gw, req("a", "u3", "10.0.0.3")), 429, "tenant a: 2");
    assert_eq!(send(&mut gw, req("b", "u1", "10.0.0.4")), 200);
    assert_eq!(send(&mut gw, req("c", "u1", "10.0.0.5")), 200);
    assert_eq!(send(&mut gw, req("d", "u1", "10.0.0.6")), 429, "user u1: 3");
    assert_eq!(send(&mut gw, req("e", "u9", "10.0.0.1")), 200, "the route: the fifth");
    assert_eq!(send(&mut gw, req("f", "u8", "10.0.0.7")), 429, "the route: 5");
    assert_eq!(send(&mut gw, req("a", "u7", "10.0.0.8")), 429);
}

#[test]
fn api_group_rules_limit_the_group_and_per_value_and_a_path_in_two_groups_enters_both() {
    let (engine, _clock) = engine();
    engine
        .load_api_definitions([
            ApiDefinition::new("all_products").item(ApiPredicateItem::prefix("/product/**")),
            ApiDefinition::new("product_one").item(ApiPredicateItem::exact("/product/1")),
        ])
        .unwrap();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("all_products").resource_mode(ResourceMode::CustomApiName).count(3.0),
            GatewayFlowRule::new("product_one")
                .resource_mode(ResourceMode::CustomApiName)
                .count(1.0)
                .param_item(GatewayParamItem::header("x-user")),
        ])
        .unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(send(&mut gw, header("/product/1", "x-user", "ann")), 200);
    assert_eq!(send(&mut gw, header("/product/1", "x-user", "ann")), 429, "product_one per user: 1");
    assert_eq!(send(&mut gw, header("/product/1", "x-user", "bob")), 200);
    assert_eq!(send(&mut gw, get("/product/1")), 429, "all_products: 3 spent (ann's blocked call included)");
}

#[test]
fn a_pattern_limits_matching_values_each_on_its_own_and_the_others_are_unlimited() {
    let (engine, _clock) = engine();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("product_route")
                .count(1.0)
                .param_item(GatewayParamItem::header("x-user").pattern("vip", ParamMatchStrategy::Contains)),
            GatewayFlowRule::new("other_route")
                .count(0.0)
                .param_item(GatewayParamItem::client_ip().pattern("10.0.0.9", ParamMatchStrategy::Exact)),
        ])
        .unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 2, || header("/product/1", "x-user", "vip-1")), [200, 429]);
    assert_eq!(statuses(&mut gw, 2, || header("/product/1", "x-user", "a-vip")), [200, 429]);
    assert_eq!(statuses(&mut gw, 5, || header("/product/1", "x-user", "plain")), [200; 5]);
    assert_eq!(statuses(&mut gw, 5, || get("/product/1")), [200; 5], "no header: not limited");
    assert_eq!(send(&mut gw, from("10.0.0.9", "/x")), 429, "count 0 blocks the matching client");
    assert_eq!(statuses(&mut gw, 5, || from("10.0.0.8", "/x")), [200; 5]);
}

/// Java's rate limiter spaces a value's calls by `round(1000 * interval / count)` ms: the values that do not
/// match the pattern share `$NM`, whose count (10,000,000) makes that 0 ms for any interval under 5,000 s,
/// so they all pass at once without waiting. Only matching values are spaced.
#[test]
fn a_rate_limiter_rule_with_a_pattern_lets_the_values_that_do_not_match_through_without_waiting() {
    let (engine, _clock) = engine();
    engine
        .load_gateway_rules([
            GatewayFlowRule::new("product_route")
                .count(1.0)
                .control_behavior(ControlBehavior::RateLimiter)
                .param_item(GatewayParamItem::header("x-user").pattern("vip", ParamMatchStrategy::Exact)),
            GatewayFlowRule::new("other_route")
                .count(10.0)
                .interval_sec(3_600)
                .control_behavior(ControlBehavior::RateLimiter)
                .param_item(GatewayParamItem::client_ip().pattern("10.0.0.9", ParamMatchStrategy::Exact)),
        ])
        .unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 2, || header("/product/1", "x-user", "vip")), [200, 429]);
    assert_eq!(statuses(&mut gw, 50, || header("/product/1", "x-user", "plain")), [200; 50]);
    assert_eq!(statuses(&mut gw, 2, || from("10.0.0.9", "/x")), [200, 429]);
    // An interval of an hour: 360 us apart, the 1,390th would wait 500 ms and be blocked.
    let others = (0..1_500).map(|i| send(&mut gw, from(&format!("10.1.{}.{}", i / 250, i % 250), "/x")));
    assert_eq!(others.filter(|&s| s != 200).count(), 0, "every client but 10.0.0.9 passes at once");
}

/// Spring's query parameters (`AbstractServerHttpRequest.initQueryParams`, which Java's gateway parser
/// reads with `getQueryParams().getFirst`): `?user` without `=` is a parameter with no value (`null`), so
/// a rule on it does not limit the request; `?user=` is the empty value, limited as any other.
#[test]
fn a_url_parameter_without_a_value_is_not_limited_and_an_empty_one_is() {
    let (engine, _clock) = engine();
    engine
        .load_gateway_rules([GatewayFlowRule::new("product_route")
            .count(1.0)
            .param_item(GatewayParamItem::url_param("user"))])
        .unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 3, || get("/product/1?user")), [200; 3]);
    assert_eq!(statuses(&mut gw, 3, || get("/product/1?x=1&user&user=ann")), [200; 3], "the first is no value");
    assert_eq!(statuses(&mut gw, 2, || get("/product/1?user=")), [200, 429]);
    assert_eq!(statuses(&mut gw, 2, || get("/product/1?x&user=bob")), [200, 429]);
}

/// Java's gateway matches API definitions against the request's path as the client sent it
/// (`exchange.getRequest().getPath()`). Under an axum router nested at `/api`, the layer on the nested
/// routes names the route `GET:/api/product/{id}` (the full template), so its API groups are the full
/// paths too: `/api/product/**`, not the path with the nesting prefix taken off.
#[cfg(feature = "axum")]
#[tokio::test]
async fn api_groups_under_a_nested_router_match_the_path_the_client_sent() {
    use axum::routing::get as route_get;
    use axum::Router;
    let (engine, _clock) = engine();
    engine
        .load_api_definitions([
            ApiDefinition::new("products").item(ApiPredicateItem::prefix("/api/product/**")),
            ApiDefinition::new("stripped").item(ApiPredicateItem::exact("/product/1")),
        ])
        .unwrap();
    engine
        .load_gateway_rules([GatewayFlowRule::new("products").resource_mode(ResourceMode::CustomApiName).count(1.0)])
        .unwrap();
    let layer = SentinelLayer::new(&engine).gateway(TrustedProxies::none()).axum();
    let app: Router = Router::new()
        .nest("/api", Router::new().route("/product/{id}", route_get(|| async { "p" })).route_layer(layer));
    let call = |uri: &'static str| {
        let app = app.clone();
        async move { app.oneshot(Request::get(uri).body(axum::body::Body::empty()).unwrap()).await.unwrap().status() }
    };
    assert_eq!(call("/api/product/1").await, 200);
    assert_eq!(call("/api/product/2").await, 429, "the group's rule");
    let names = engine.resource_names();
    assert!(names.contains(&"GET:/api/product/{id}".to_string()), "{names:?}");
    assert!(!names.contains(&"stripped".to_string()), "{names:?}");
}

/// A rate-limiter rule (Java's `passThrottleLocalCheck`) spaces a value's calls `interval / count` apart and
/// never reads `burst`: the quota a blocked client is told is `count` per interval, not `count + burst`.
#[test]
fn a_request_blocked_by_a_rate_limiter_rule_is_told_its_count_per_interval_without_the_burst() {
    let (engine, _clock) = engine();
    engine
        .load_gateway_rules([GatewayFlowRule::new("product_route")
            .count(2.0)
            .interval_sec(60)
            .burst(10)
            .control_behavior(ControlBehavior::RateLimiter)])
        .unwrap();
    let mut gw = SentinelLayer::new(&engine)
        .resource_name(|_| Some("product_route".into()))
        .gateway(TrustedProxies::none())
        .rate_limit_headers(sentinel_runtime::web::RateLimitHeaders::new().legacy(true))
        .layer(tower::service_fn(hello));
    let mut call =
        || gw.ready().now_or_never().unwrap().unwrap().call(get("/product/1")).now_or_never().unwrap().unwrap();
    assert_eq!(call().status(), 200);
    let blocked = call();
    assert_eq!(blocked.status(), 429);
    assert_eq!(blocked.headers()["ratelimit-policy"], "\"product_route#0\";q=2;w=60");
    assert_eq!(blocked.headers()["ratelimit"], "\"product_route#0\";r=0;t=30");
    assert_eq!(blocked.headers()["x-ratelimit-limit"], "2");
}

/// Java checks the gateway's rules in `GatewayFlowSlot` (order -4000), before the hot-parameter rules of
/// `ParamFlowSlot` (-3000), and a check that blocks stops the chain: a request the gateway blocks never
/// reaches (nor spends from) the user's own hot-parameter rules of the resource.
#[test]
fn the_gateways_rules_are_checked_before_the_users_hot_parameter_rules_of_the_resource() {
    use sentinel_runtime::param_flow::ParamFlowRule;
    let (engine, clock) = engine();
    engine.load_gateway_rules([GatewayFlowRule::new("product_route").count(1.0)]).unwrap();
    // The user's rule reads the gateway's argument 0 (the constant `$D`): 5 per 10 s.
    engine.load_param_flow_rules([ParamFlowRule::new("product_route", 0).count(5.0).duration_in_sec(10)]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(statuses(&mut gw, 5, || get("/product/1")), [200, 429, 429, 429, 429]);
    clock.advance_millis(1_001);
    // The gateway's bucket refilled; the user's rule spent 1 of its 5 (Java), so this one passes.
    assert_eq!(send(&mut gw, get("/product/1")), 200);
}

/// Java does not give back the tokens earlier gateway rules took when a later rule blocks the request (the
/// wave's facts list this among Java's behaviours not to copy), and docs/concepts.md says what earlier checks
/// took, a token included, is given back when a later one blocks (the flow slot does give its reservations
/// back). A client the route's rule blocked, or a flow rule after the gateway's, keeps its own budget.
#[test]
fn tokens_an_earlier_gateway_rule_took_are_given_back_when_a_later_check_blocks() {
    use sentinel_runtime::flow::FlowRule;
    let (engine, clock) = engine();
    engine
        .load_gateway_rules([
            // Per client: 1 per 10 s; the route as a whole: 1 per second.
            GatewayFlowRule::new("product_route").count(1.0).interval_sec(10).param_item(GatewayParamItem::client_ip()),
            GatewayFlowRule::new("product_route").count(1.0),
            GatewayFlowRule::new("other_route").count(1.0).interval_sec(10).param_item(GatewayParamItem::client_ip()),
        ])
        .unwrap();
    engine.load_flow_rules([FlowRule::new("other_route").count(1.0)]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(send(&mut gw, from("10.0.0.1", "/product/1")), 200);
    assert_eq!(send(&mut gw, from("10.0.0.2", "/product/1")), 429, "the route's rule");
    assert_eq!(send(&mut gw, from("10.0.0.1", "/x")), 200);
    assert_eq!(send(&mut gw, from("10.0.0.2", "/x")), 429, "the flow rule");
    clock.advance_millis(1_001);
    assert_eq!(send(&mut gw, from("10.0.0.2", "/product/1")), 200, "10.0.0.2 was blocked: it spent nothing");
    assert_eq!(send(&mut gw, from("10.0.0.2", "/x")), 200, "the same after a flow rule blocked it");
}

/// A request that waited for its API group's rate limiter before the service was called: the route's
/// adaptive limit measures the service's time, not that wait.
#[test]
fn a_wait_asked_by_an_api_group_is_not_the_routes_round_trip() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind, WindowConfig};
    let (engine, clock) = engine();
    engine
        .load_api_definitions([ApiDefinition::new("all_products").item(ApiPredicateItem::prefix("/product/**"))])
        .unwrap();
    engine
        .load_gateway_rules([GatewayFlowRule::new("all_products")
            .resource_mode(ResourceMode::CustomApiName)
            .count(4.0)
            .control_behavior(ControlBehavior::RateLimiter)])
        .unwrap();
    let mut rule = AdaptiveRule::new("product_route").algorithm(AlgorithmKind::Gradient2).limits(1, 10, 20);
    rule.window = WindowConfig { window_ms: 1, min_samples: 1, max_window_ms: 1, ignore_rtt_under_us: 0 };
    engine.load_adaptive_rules([rule]).unwrap();
    let mut gw = gateway(&engine);
    assert_eq!(send(&mut gw, get("/product/1")), 200);
    // The next one waits 250 ms for the API group's rate limiter, then the service answers at once.
    let ready = gw.ready().now_or_never().expect("ready").unwrap();
    let mut queued = ready.call(get("/product/2"));
    assert!(poll_once(&mut queued).is_pending());
    clock.advance_millis(250);
    match poll_once(&mut queued) {
        Poll::Ready(Ok(r)) => assert_eq!(r.status(), 200),
        _ => panic!("answered after its wait"),
    }
    drop(queued);
    let sample = engine.adaptive_status()[0].sample_rtt;
    assert!(
        sample < std::time::Duration::from_millis(1),
        "two requests the service answered at once averaged {sample:?}: the API group's 250 ms wait counted"
    );
}
