//! The outbound guard as reqwest-middleware middleware, calling a real axum downstream on loopback: breakers
//! opened by slow calls (counted at the downstream), thread limits, the downstream's `Retry-After`, names,
//! and system rules that limit inbound requests but not outbound calls. Time is the engine's manual clock.

mod web_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::flow::{ControlBehavior, FlowGrade, FlowRule};
use sentinel_runtime::outbound::{ResourceName, SentinelMiddleware};
use sentinel_runtime::system::SystemRule;
use sentinel_runtime::web::SentinelLayer;
use sentinel_runtime::BlockError;
use tokio::sync::Semaphore;
use web_support::{bounded, engine_at, serve, stats, until};

/// The downstream: counts the requests it receives and those in flight; `/slow/..` waits for the test's
/// permit; `/busy` answers 429 with the test's `Retry-After`.
struct Downstream {
    hits: AtomicUsize,
    in_flight: AtomicUsize,
    gate: Semaphore,
    retry_after: std::sync::Mutex<String>,
}

impl Downstream {
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn slow(State(d): State<Arc<Downstream>>) -> &'static str {
    d.hits.fetch_add(1, Ordering::SeqCst);
    d.in_flight.fetch_add(1, Ordering::SeqCst);
    d.gate.acquire().await.expect("the gate stays open").forget();
    d.in_flight.fetch_sub(1, Ordering::SeqCst);
    "slow"
}

async fn item(State(d): State<Arc<Downstream>>) -> &'static str {
    d.hits.fetch_add(1, Ordering::SeqCst);
    "item"
}

async fn busy(State(d): State<Arc<Downstream>>) -> (StatusCode, HeaderMap, &'static str) {
    d.hits.fetch_add(1, Ordering::SeqCst);
    let mut h = HeaderMap::new();
    h.insert("retry-after", d.retry_after.lock().unwrap().parse().unwrap());
    (StatusCode::TOO_MANY_REQUESTS, h, "busy")
}

async fn downstream() -> (Arc<Downstream>, String) {
    let d = Arc::new(Downstream {
        hits: AtomicUsize::new(0),
        in_flight: AtomicUsize::new(0),
        gate: Semaphore::new(0),
        retry_after: std::sync::Mutex::new("1".into()),
    });
    let app = Router::new()
        .route("/slow/{id}", get(slow))
        .route("/items/{id}", get(item))
        .route("/busy", get(busy))
        .route(
            "/fail",
            get(|State(d): State<Arc<Downstream>>| async move {
                d.hits.fetch_add(1, Ordering::SeqCst);
                StatusCode::INTERNAL_SERVER_ERROR
            }),
        )
        .with_state(d.clone());
    let addr = serve(app).await;
    (d, format!("http://{addr}"))
}

fn guarded(mw: SentinelMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(web_support::client()).with(mw).build()
}

/// The block an `Err` holds (`Error::Middleware` with a `BlockError` inside).
fn block_of(r: &Result<reqwest::Response, reqwest_middleware::Error>) -> Option<&BlockError> {
    match r {
        Err(reqwest_middleware::Error::Middleware(e)) => e.downcast_ref::<BlockError>(),
        _ => None,
    }
}

/// Sends a GET on a task of its own (it may wait at the downstream).
fn spawn_get(
    client: &ClientWithMiddleware,
    url: String,
) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest_middleware::Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.get(url).send().await })
}

fn authority(base: &str) -> &str {
    base.trim_start_matches("http://")
}

#[tokio::test]
async fn a_slow_ratio_breaker_opens_on_slow_calls_sends_nothing_while_open_probes_once_and_closes() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let (d, base) = downstream().await;
        let resource = format!("GET:{}/slow/{{id}}", authority(&base));
        engine
            .load_degrade_rules([DegradeRule::new(&resource, DegradeGrade::SlowRequestRatio)
                .count(100.0)
                .slow_ratio_threshold(0.5)
                .min_request_amount(2)
                .stat_interval_ms(10_000)
                .time_window_sec(5)])
            .unwrap();
        let client = guarded(SentinelMiddleware::new(&engine));
        // Two calls that take 200 ms of the engine's clock each.
        for i in 1..=2 {
            let call = spawn_get(&client, format!("{base}/slow/{i}"));
            until("the downstream has the call", || d.hits() == i).await;
            clock.advance_millis(200);
            d.gate.add_permits(1);
            assert_eq!(call.await.unwrap().unwrap().status(), 200);
        }
        // Open: the calls fail fast and none reaches the downstream.
        for i in 0..5 {
            let r = client.get(format!("{base}/slow/{i}")).send().await;
            assert!(matches!(block_of(&r), Some(BlockError::Degrade { .. })), "{r:?}");
        }
        assert_eq!(d.hits(), 2, "nothing was sent while the breaker was open");
        // Half-open: one probe goes out; while it is out, the others are blocked.
        clock.advance_millis(5_000);
        let probe = spawn_get(&client, format!("{base}/slow/9"));
        until("the probe reaches the downstream", || d.hits() == 3).await;
        let r = client.get(format!("{base}/slow/10")).send().await;
        assert!(matches!(block_of(&r), Some(BlockError::Degrade { .. })), "{r:?}");
        assert_eq!(d.hits(), 3);
        // The downstream recovered: the probe is fast, the breaker closes.
        d.gate.add_permits(1);
        assert_eq!(probe.await.unwrap().unwrap().status(), 200);
        d.gate.add_permits(3);
        for i in 0..3 {
            assert_eq!(client.get(format!("{base}/slow/{i}")).send().await.unwrap().status(), 200);
        }
        assert_eq!(d.hits(), 6);
    })
    .await;
}

#[tokio::test]
async fn a_thread_grade_rule_caps_the_calls_in_flight_at_the_downstream() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (d, base) = downstream().await;
        let resource = format!("GET:{}/slow/{{id}}", authority(&base));
        engine.load_flow_rules([FlowRule::new(&resource).grade(FlowGrade::Thread).count(2.0)]).unwrap();
        let client = guarded(SentinelMiddleware::new(&engine));
        let calls: Vec<_> = (0..6).map(|i| spawn_get(&client, format!("{base}/slow/{i}"))).collect();
        until("two calls are in flight at the downstream", || d.in_flight.load(Ordering::SeqCst) == 2).await;
        until("the others were blocked", || calls.iter().filter(|c| c.is_finished()).count() == 4).await;
        assert_eq!(d.hits(), 2);
        d.gate.add_permits(2);
        let mut blocked = 0;
        for c in calls {
            match c.await.unwrap() {
                Ok(r) => assert_eq!(r.status(), 200),
                r => {
                    assert!(matches!(block_of(&r), Some(BlockError::Flow { .. })), "{r:?}");
                    blocked += 1;
                }
            }
        }
        assert_eq!(blocked, 4);
        assert_eq!(stats(&engine, &resource).threads, 0, "every entry exited");
    })
    .await;
}

#[tokio::test]
async fn retry_after_holds_calls_back_locally_until_the_time_given_and_a_hostile_value_is_capped() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let (d, base) = downstream().await;
        let client = guarded(SentinelMiddleware::new(&engine).max_pushback(Duration::from_secs(30)));
        *d.retry_after.lock().unwrap() = "2".into();
        let r = client.get(format!("{base}/busy")).send().await.unwrap();
        assert_eq!(r.status(), 429);
        let r = client.get(format!("{base}/busy")).send().await;
        match block_of(&r) {
            Some(b @ BlockError::Pushback { .. }) => assert_eq!(b.retry_after(), Some(Duration::from_secs(2))),
            other => panic!("expected a pushback block, got {other:?} ({r:?})"),
        }
        clock.advance_millis(1_999);
        assert!(block_of(&client.get(format!("{base}/busy")).send().await).is_some());
        assert_eq!(d.hits(), 1, "nothing was sent within the 2 s");
        clock.advance_millis(1);
        *d.retry_after.lock().unwrap() = "999999999".into();
        assert_eq!(client.get(format!("{base}/busy")).send().await.unwrap().status(), 429);
        assert_eq!(d.hits(), 2);
        let r = client.get(format!("{base}/busy")).send().await;
        assert_eq!(block_of(&r).and_then(BlockError::retry_after), Some(Duration::from_secs(30)), "capped");
        clock.advance_millis(30_000);
        assert_eq!(client.get(format!("{base}/busy")).send().await.unwrap().status(), 429);
        assert_eq!(d.hits(), 3);
        // Another downstream resource is not held back.
        assert_eq!(client.get(format!("{base}/items/1")).send().await.unwrap().status(), 200);
    })
    .await;
}

#[tokio::test]
async fn a_thousand_ids_in_paths_make_one_resource_and_a_request_extension_names_one_call() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (_d, base) = downstream().await;
        let client = guarded(SentinelMiddleware::new(&engine));
        for id in 0..1000 {
            client.get(format!("{base}/items/{id}?v={id}")).send().await.unwrap();
        }
        let resource = format!("GET:{}/items/{{id}}", authority(&base));
        assert_eq!(stats(&engine, &resource).minute_pass, 1000);
        assert_eq!(engine.resource_names(), vec![resource.clone()]);
        client
            .get(format!("{base}/items/7"))
            .with_extension(ResourceName::new("inventory:special"))
            .send()
            .await
            .unwrap();
        let mut names = engine.resource_names();
        names.sort();
        assert_eq!(names, vec![resource, "inventory:special".to_string()]);
    })
    .await;
}

#[tokio::test]
async fn system_rules_limit_inbound_requests_and_not_outbound_calls_of_the_same_engine() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        engine.load_system_rules([SystemRule { qps: Some(1.0), ..SystemRule::default() }]).unwrap();
        let (d, base) = downstream().await;
        let client = guarded(SentinelMiddleware::new(&engine));
        for i in 0..5 {
            assert_eq!(client.get(format!("{base}/items/{i}")).send().await.unwrap().status(), 200);
        }
        assert_eq!(d.hits(), 5, "outbound calls pass system rules");
        let app: Router =
            Router::new().route("/orders", get(|| async { "ok" })).route_layer(SentinelLayer::new(&engine).axum());
        let order = serve(app).await;
        let plain = web_support::client();
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(plain.get(format!("http://{order}/orders")).send().await.unwrap().status().as_u16());
        }
        assert_eq!(statuses, [200, 429, 429], "inbound requests are limited by the same engine's system rule");
    })
    .await;
}

#[tokio::test]
async fn the_time_limit_drops_the_call_and_counts_an_error_and_a_dropped_call_counts_none() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let (d, base) = downstream().await;
        let resource = format!("GET:{}/slow/{{id}}", authority(&base));
        let client = guarded(SentinelMiddleware::new(&engine).timeout(Duration::from_millis(100)));
        let call = spawn_get(&client, format!("{base}/slow/1"));
        until("the downstream has the call", || d.hits() == 1).await;
        until("the time limit's timer is set", || clock.pending_timers() > 0).await;
        clock.advance_millis(100);
        match call.await.unwrap() {
            Err(reqwest_middleware::Error::Middleware(e)) => {
                let t = e.downcast_ref::<sentinel_runtime::Timeout>().expect("a Timeout");
                assert_eq!(t.limit, Duration::from_millis(100));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        let s = stats(&engine, &resource);
        assert_eq!((s.minute_exception, s.threads), (1, 0));
        assert!(s.avg_rt_ms >= 100.0, "a timed-out call is a slow call: {s:?}");
        // A caller that gives up: the entry exits without an error.
        let call = spawn_get(&client, format!("{base}/slow/2"));
        until("the downstream has the call", || d.hits() == 2).await;
        assert_eq!(stats(&engine, &resource).threads, 1);
        call.abort();
        until("the dropped call exits", || stats(&engine, &resource).threads == 0).await;
        assert_eq!(stats(&engine, &resource).minute_exception, 1);
        d.gate.add_permits(2);
    })
    .await;
}

#[tokio::test]
async fn a_rate_limiter_queues_the_call_on_a_timer_and_sends_it_when_the_wait_is_over() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let (d, base) = downstream().await;
        let resource = format!("GET:{}/items/{{id}}", authority(&base));
        engine
            .load_flow_rules([FlowRule::new(&resource)
                .count(1.0)
                .control_behavior(ControlBehavior::RateLimiter)
                .max_queueing_time_ms(5_000)])
            .unwrap();
        let client = guarded(SentinelMiddleware::new(&engine));
        assert_eq!(client.get(format!("{base}/items/1")).send().await.unwrap().status(), 200);
        let queued = spawn_get(&client, format!("{base}/items/2"));
        until("the queued call waits on the engine's timer", || clock.pending_timers() > 0).await;
        assert_eq!(d.hits(), 1, "not sent before its turn");
        clock.advance_millis(1_000);
        assert_eq!(queued.await.unwrap().unwrap().status(), 200);
        assert_eq!(d.hits(), 2);
    })
    .await;
}

#[tokio::test]
async fn server_errors_are_traced_and_blocked_calls_get_the_fallback_answer() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (d, base) = downstream().await;
        let resource = format!("GET:{}/fail", authority(&base));
        engine
            .load_degrade_rules([DegradeRule::new(&resource, DegradeGrade::ErrorRatio)
                .count(0.5)
                .min_request_amount(3)
                .stat_interval_ms(10_000)
                .time_window_sec(10)])
            .unwrap();
        let client =
            guarded(SentinelMiddleware::new(&engine).fallback(|b, call| {
                http::Response::new(format!("cached ({}, {})", b.kind_name(), call.path()).into())
            }));
        for _ in 0..3 {
            assert_eq!(client.get(format!("{base}/fail")).send().await.unwrap().status(), 500);
        }
        assert_eq!(stats(&engine, &resource).minute_exception, 3);
        let r = client.get(format!("{base}/fail")).send().await.unwrap();
        assert_eq!(r.url().path(), "/fail", "the answer keeps the URL called");
        assert_eq!(r.text().await.unwrap(), "cached (DegradeException, /fail)");
        assert_eq!(d.hits(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_call_blocked_by_an_inner_guard_is_not_an_error_of_the_outer_guards_resource() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (d, base) = downstream().await;
        // The outer guard counts every call to the downstream as one resource; the inner one limits a route.
        let route = format!("GET:{}/items/{{id}}", authority(&base));
        engine.load_flow_rules([FlowRule::new(&route).count(1.0)]).unwrap();
        let client = ClientBuilder::new(web_support::client())
            .with(SentinelMiddleware::new(&engine).resource_name(|_| Some("inventory".into())))
            .with(SentinelMiddleware::new(&engine))
            .build();
        assert_eq!(client.get(format!("{base}/items/1")).send().await.unwrap().status(), 200);
        let r = client.get(format!("{base}/items/2")).send().await;
        assert!(matches!(block_of(&r), Some(BlockError::Flow { .. })), "{r:?}");
        assert_eq!(d.hits(), 1, "the blocked call was not sent");
        // Java's `Tracer` never traces a `BlockException`; SPEC: tracing a `BlockError` does nothing.
        assert_eq!(stats(&engine, "inventory").minute_exception, 0, "a block is not the downstream's failure");
    })
    .await;
}

#[tokio::test]
async fn a_call_made_while_serving_a_request_carries_the_requests_origin() {
    use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
    use sentinel_runtime::web::extract;
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let (d, base) = downstream().await;
        let items = format!("GET:{}/items/{{id}}", authority(&base));
        engine.load_authority_rules([AuthorityRule::new(&items, "appA", AuthorityStrategy::Black)]).unwrap();
        let client = guarded(SentinelMiddleware::new(&engine));
        let url = format!("{base}/items/1");
        let app: Router = Router::new()
            .route(
                "/front",
                get(move || {
                    let (client, url) = (client.clone(), url.clone());
                    async move {
                        match client.get(url).send().await {
                            Ok(r) => r.status().as_u16().to_string(),
                            Err(e) => match e {
                                reqwest_middleware::Error::Middleware(m)
                                    if m.downcast_ref::<BlockError>().is_some() =>
                                {
                                    "blocked".to_string()
                                }
                                other => format!("error {other}"),
                            },
                        }
                    }
                }),
            )
            .route_layer(
                SentinelLayer::new(&engine)
                    .origin(extract::header(axum::http::HeaderName::from_static("x-caller")))
                    .axum(),
            );
        let front = serve(app).await;
        let plain = web_support::client();
        let call = |caller: &'static str| {
            let plain = plain.clone();
            let url = format!("http://{front}/front");
            async move { plain.get(url).header("x-caller", caller).send().await.unwrap().text().await.unwrap() }
        };
        assert_eq!(call("appB").await, "200");
        assert_eq!(call("appA").await, "blocked", "the black list applies to the request's origin");
        assert_eq!(d.hits(), 1);
    })
    .await;
}
