//! The outbound tower layer around a `service_fn` client, polled by hand on a manual clock: queueing waits
//! and time limits are timers on the engine's clock, blocks are typed errors or the fallback's answer, and a
//! request's `ResourceName` extension names its call.
#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::outbound::{ClientError, ResourceName, SentinelClientLayer};
use sentinel_runtime::{BlockError, Sentinel};
use tower::{Layer, Service};

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

/// A client that answers at once and counts its calls.
fn client(
    sent: Arc<AtomicUsize>,
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone {
    tower::service_fn(move |_req: Request<()>| {
        sent.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))))
    })
}

fn poll<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
}

fn get(path: &str) -> Request<()> {
    Request::get(format!("http://stock.svc{path}")).body(()).unwrap()
}

/// A rate limiter on the items route: a call a second, each queued up to 5 s.
fn spaced_items() -> FlowRule {
    let rule = FlowRule::new("GET:stock.svc/items/{id}").count(1.0);
    rule.control_behavior(ControlBehavior::RateLimiter).max_queueing_time_ms(5_000)
}

#[test]
fn a_queued_call_waits_on_the_engines_timer_before_it_is_sent() {
    let (engine, clock) = engine();
    engine.load_flow_rules([spaced_items()]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    assert!(poll(pin!(svc.call(get("/items/1")))).is_ready());
    let mut queued = pin!(svc.call(get("/items/2")));
    assert!(poll(queued.as_mut()).is_pending());
    assert_eq!(sent.load(Ordering::SeqCst), 1, "not sent before its turn");
    let s = engine.cluster_stats("GET:stock.svc/items/{id}").unwrap();
    assert_eq!((s.minute_pass, s.threads), (1, 0), "recorded at its turn, as Java records it after its sleep");
    clock.advance_millis(1_000);
    assert!(matches!(poll(queued.as_mut()), Poll::Ready(Ok(_))));
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    // The window at T0 + 1500 holds [T0 + 1000, T0 + 2000): the queued call's pass (at its turn, T0 + 1000).
    clock.advance_millis(500);
    let s = engine.cluster_stats("GET:stock.svc/items/{id}").unwrap();
    assert_eq!((s.pass_qps, s.minute_pass, s.threads), (1.0, 2, 0), "{s:?}");
}

#[test]
fn a_call_given_up_on_while_it_waits_for_its_turn_is_counted_once_and_leaves_nothing_in_flight() {
    let (engine, clock) = engine();
    // The queued call holds its thread-grade permit while it waits (pending: not in flight yet).
    let one_in_flight = FlowRule::new("GET:stock.svc/items/{id}").grade(sentinel_runtime::flow::FlowGrade::Thread);
    engine.load_flow_rules([spaced_items(), one_in_flight.count(1.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    assert!(poll(pin!(svc.call(get("/items/1")))).is_ready());
    {
        let mut queued = pin!(svc.call(get("/items/2")));
        assert!(poll(queued.as_mut()).is_pending());
    }
    // Its pass and its completion at the moment it was given up on: balanced, and never sent.
    let s = engine.cluster_stats("GET:stock.svc/items/{id}").unwrap();
    assert_eq!((s.minute_pass, s.minute_success, s.threads, sent.load(Ordering::SeqCst)), (2, 2, 0, 1), "{s:?}");
    // Its permit came back: past the slot it had, the next call is sent at once.
    clock.advance_millis(2_000);
    assert!(matches!(poll(pin!(svc.call(get("/items/3")))), Poll::Ready(Ok(_))));
    assert_eq!(sent.load(Ordering::SeqCst), 2);
}

#[test]
fn the_time_limit_drops_a_pending_call_and_counts_a_slow_error() {
    let (engine, clock) = engine();
    let mut svc = SentinelClientLayer::new(&engine).timeout(Duration::from_millis(100)).layer(tower::service_fn(
        |_req: Request<()>| std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>(),
    ));
    let mut call = pin!(svc.call(get("/slow")));
    assert!(poll(call.as_mut()).is_pending());
    clock.advance_millis(100);
    match poll(call.as_mut()) {
        Poll::Ready(Err(ClientError::TimedOut(t))) => assert_eq!(t.limit, Duration::from_millis(100)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let s = engine.cluster_stats("GET:stock.svc/slow").unwrap();
    assert_eq!((s.minute_exception, s.threads), (1, 0));
}

#[test]
fn blocked_calls_are_not_sent_and_get_the_error_or_the_fallbacks_answer() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("named").count(0.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    let mut req = get("/items/1");
    req.extensions_mut().insert(ResourceName::new("named"));
    match poll(pin!(svc.call(req))) {
        Poll::Ready(Err(ClientError::Blocked(BlockError::Flow { resource, .. }))) => assert_eq!(&*resource, "named"),
        other => panic!("expected a block, got {other:?}"),
    }
    let mut svc = SentinelClientLayer::new(&engine)
        .fallback(|b, _| Response::new(Bytes::from(b.kind_name())))
        .layer(client(sent.clone()));
    let mut req = get("/items/1");
    req.extensions_mut().insert(ResourceName::new("named"));
    let Poll::Ready(Ok(answer)) = poll(pin!(svc.call(req))) else { panic!("expected the fallback's answer") };
    let body = futures::executor::block_on(answer.into_body().collect()).unwrap().to_bytes();
    assert_eq!(body, "FlowException");
    assert_eq!(sent.load(Ordering::SeqCst), 0);
}

#[test]
fn distinct_hosts_past_the_bound_share_one_resource_and_a_ruled_one_keeps_its_own_and_its_rule() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:host-99/items").count(0.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).max_resources(3).layer(client(sent.clone()));
    for h in 0..50 {
        let req = Request::get(format!("http://host-{h}/items")).body(()).unwrap();
        assert!(matches!(poll(pin!(svc.call(req))), Poll::Ready(Ok(_))));
    }
    let req = Request::get("http://host-99/items").body(()).unwrap();
    assert!(
        matches!(poll(pin!(svc.call(req))), Poll::Ready(Err(ClientError::Blocked(_)))),
        "the bound never switches a rule off"
    );
    let mut names = engine.resource_names();
    names.sort();
    assert_eq!(
        names,
        ["GET:host-0/items", "GET:host-1/items", "GET:host-2/items", "GET:host-99/items", "sentinel_outbound_overflow"]
    );
    assert_eq!(sent.load(Ordering::SeqCst), 50);
}

#[test]
fn at_an_adaptive_limit_with_max_wait_a_call_waits_for_a_place_then_is_sent_or_refused_when_the_wait_ends() {
    use sentinel_runtime::adaptive::{AdaptiveBlockReason, AdaptiveRule};
    let (engine, clock) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("GET:stock.svc/slow").limits(1, 1, 1).max_wait_ms(200)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    // A downstream that never answers: each call holds its place until the caller drops it.
    let mut svc = SentinelClientLayer::new(&engine).layer(tower::service_fn(move |_req: Request<()>| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
    }));
    let inflight = || engine.adaptive_status().first().map_or((0, 0), |s| (s.inflight, s.waiting));
    let mut first = Box::pin(svc.call(get("/slow")));
    assert!(poll(first.as_mut()).is_pending());
    let mut second = Box::pin(svc.call(get("/slow")));
    assert!(poll(second.as_mut()).is_pending(), "it waits rather than being refused");
    assert_eq!((sent.load(Ordering::SeqCst), inflight()), (1, (1, 1)), "not sent while it waits");
    drop(first);
    assert!(poll(second.as_mut()).is_pending(), "sent, and now waiting for its answer");
    assert_eq!((sent.load(Ordering::SeqCst), inflight()), (2, (1, 0)));

    let mut third = Box::pin(svc.call(get("/slow")));
    assert!(poll(third.as_mut()).is_pending());
    clock.advance_millis(200);
    match poll(third.as_mut()) {
        Poll::Ready(Err(ClientError::Blocked(BlockError::Adaptive { block, .. }))) => {
            assert_eq!(block.reason, AdaptiveBlockReason::WaitTimedOut)
        }
        other => panic!("refused once its wait ran out: {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 2, "a refused call is never sent");
    drop(second);
    assert_eq!(inflight(), (0, 0), "no place leaked");
}

#[test]
fn a_downstream_first_called_after_the_engine_cap_is_reached_gets_a_rule_loaded_later() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).max_resources(1).build();
    let _first = engine.resource("first");
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    // The engine's cap is reached: the call runs on the engine's overflow resource.
    assert!(matches!(poll(pin!(svc.call(get("/late")))), Poll::Ready(Ok(_))));
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/late").count(0.0)]).unwrap();
    assert!(engine.has_rules_for("GET:stock.svc/late"));
    // The engine gives a named resource its own handle past its cap (as `engine.resource` now shows)...
    assert_eq!(engine.resource("GET:stock.svc/late").name(), "GET:stock.svc/late");
    // ...and the guard, which keeps no overflow handle under a name, takes it: the rule applies.
    assert!(
        matches!(poll(pin!(svc.call(get("/late")))), Poll::Ready(Err(ClientError::Blocked(_)))),
        "the engine's bound never switches a rule off"
    );
}

#[test]
fn names_a_regex_rule_matches_past_the_bound_are_not_kept_without_bound() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:search.svc/.*").regex(true).count(1_000_000.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).max_resources(10).layer(client(sent.clone()));
    for i in 0..2_000 {
        // Words from the caller's input (a search term in the path), never folded into `{id}`.
        let term: String = format!("{i:x}").chars().map(|c| (b'g' + c.to_digit(16).unwrap() as u8) as char).collect();
        let req = Request::get(format!("http://search.svc/q/{term}")).body(()).unwrap();
        assert!(matches!(poll(pin!(svc.call(req))), Poll::Ready(Ok(_))));
    }
    let made = engine.resource_names().len();
    assert!(made <= 100, "{made} resources from 2000 names, with a bound of 10");
}

#[test]
fn one_downstream_is_one_resource_whatever_the_case_of_its_host_and_with_or_without_its_default_port() {
    // Host names are case-insensitive and `:80` is `http`'s default: these URLs name one downstream, as
    // reqwest (whose URLs are normalized) and Java's OkHttp adapter (`HttpUrl`) name it.
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(2.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut svc = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    let urls = ["http://stock.svc/items/1", "http://STOCK.svc:80/items/2", "https://Stock.Svc:443/items/3"];
    let blocked: Vec<bool> = urls
        .iter()
        .map(|url| match poll(pin!(svc.call(Request::get(*url).body(()).unwrap()))) {
            Poll::Ready(Ok(_)) => false,
            Poll::Ready(Err(ClientError::Blocked(BlockError::Flow { .. }))) => true,
            other => panic!("{url}: {other:?}"),
        })
        .collect();
    assert_eq!(blocked, [false, false, true], "the rule's count of 2 covers every spelling");
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    assert_eq!(engine.resource_names(), vec!["GET:stock.svc/items/{id}".to_string()]);
    // A port that is not the scheme's default stays in the name.
    let _ = poll(pin!(svc.call(Request::get("https://stock.svc:80/items/4").body(()).unwrap())));
    assert!(engine.resource_names().contains(&"GET:stock.svc:80/items/{id}".to_string()));
}

#[test]
fn a_call_blocked_by_an_inner_tower_guard_is_not_an_error_of_the_outer_guards_resource() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(0.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let inner = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    let mut svc = SentinelClientLayer::new(&engine).resource_name(|_| Some("inventory".into())).layer(inner);
    match poll(pin!(svc.call(get("/items/1")))) {
        Poll::Ready(Err(ClientError::Client(ClientError::Blocked(BlockError::Flow { .. })))) => {}
        other => panic!("expected the inner guard's block, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    assert_eq!(engine.cluster_stats("inventory").unwrap().minute_exception, 0, "a block is no failure");
}

#[test]
fn a_failure_behind_an_inner_tower_guard_is_an_error_of_both_guards_resources() {
    let (engine, _clock) = engine();
    // The inner guard's client cannot reach its downstream.
    let failing = tower::service_fn(|_req: Request<()>| {
        std::future::ready(Err::<Response<Full<Bytes>>, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )))
    });
    let inner = SentinelClientLayer::new(&engine).layer(failing);
    let mut svc = SentinelClientLayer::new(&engine).resource_name(|_| Some("inventory".into())).layer(inner);
    // A block first, so the inner guard's error type is known as one that may be a block; then a failure of
    // the same type, which is not one.
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(0.0)]).unwrap();
    assert!(matches!(
        poll(pin!(svc.call(get("/items/1")))),
        Poll::Ready(Err(ClientError::Client(ClientError::Blocked(_))))
    ));
    engine.load_flow_rules([]).unwrap();
    assert!(matches!(
        poll(pin!(svc.call(get("/items/1")))),
        Poll::Ready(Err(ClientError::Client(ClientError::Client(_))))
    ));
    let (outer, inner) =
        (engine.cluster_stats("inventory").unwrap(), engine.cluster_stats("GET:stock.svc/items/{id}").unwrap());
    assert_eq!((outer.minute_pass, outer.minute_exception), (2, 1), "only the failure");
    assert_eq!((inner.minute_pass, inner.minute_block, inner.minute_exception), (1, 1, 1));
}

#[test]
fn calls_their_callers_gave_up_on_give_no_rtt_sample_to_the_adaptive_limit() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("GET:stock.svc/slow").algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    // A downstream that never answers (overloaded); every caller gives up after 1 s (an outer timeout that
    // drops the call's future, as `tokio::time::timeout` does).
    let mut svc = SentinelClientLayer::new(&engine).layer(tower::service_fn(|_req: Request<()>| {
        std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
    }));
    for _ in 0..5 {
        let mut calls: Vec<_> = (0..6).map(|_| Box::pin(svc.call(get("/slow")))).collect();
        for c in &mut calls {
            assert!(poll(c.as_mut()).is_pending());
        }
        clock.advance_millis(1_000);
        drop(calls);
    }
    let s = &engine.adaptive_status()[0];
    assert_eq!(s.inflight, 0, "every place went back");
    // Netflix's gRPC client interceptor (and Envoy's filter) ignore a cancelled call: no RTT was measured.
    // Taken as 1 s successes, they grow AIMD's limit by one per window while no call completes at all.
    assert_eq!((s.limit, s.sample_rtt), (10, Duration::ZERO), "{s:?}");
}

#[test]
fn a_call_that_could_not_reach_its_downstream_is_a_drop_for_the_adaptive_limit() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, _clock) = engine();
    let mut rule = AdaptiveRule::new(".*").regex(true).algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    // The downstream refuses connections: tonic's channel fails with a transport error, which its caller
    // sees as `UNAVAILABLE` (a drop, as the README says, and as Netflix's gRPC client counts it).
    let mut svc = SentinelClientLayer::new(&engine).layer(tower::service_fn(|_req: Request<()>| {
        std::future::ready(Err::<Response<Full<Bytes>>, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "tcp connect error: connection refused",
        )))
    }));
    let req = Request::post("http://stock.svc/stock.Inventory/Get")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    assert!(matches!(poll(pin!(svc.call(req))), Poll::Ready(Err(ClientError::Client(_)))));
    let s = &engine.adaptive_status()[0];
    assert_eq!((s.inflight, s.limit), (0, 9), "AIMD backs off on a drop: {s:?}");
}

#[test]
fn a_grpc_call_past_its_deadline_is_a_drop_for_the_adaptive_limit() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new(".*").regex(true).algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    // The downstream ends the call at its 1 s deadline with `DEADLINE_EXCEEDED` (a trailers-only answer).
    let mut svc = SentinelClientLayer::new(&engine).layer(tower::service_fn(|_req: Request<()>| {
        let answer = Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "4")
            .body(Full::new(Bytes::new()))
            .unwrap();
        std::future::ready(Ok::<_, Infallible>(answer))
    }));
    let req = Request::post("http://stock.svc/stock.Inventory/Get")
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "1S")
        .body(())
        .unwrap();
    let mut call = pin!(svc.call(req));
    clock.advance_millis(1_000);
    assert!(matches!(poll(call.as_mut()), Poll::Ready(Ok(_))));
    let s = &engine.adaptive_status()[0];
    // A time limit is a drop (the README; Netflix's gRPC server interceptor counts DEADLINE_EXCEEDED so).
    assert_eq!((s.inflight, s.limit), (0, 9), "AIMD backs off on a drop: {s:?}");
}

/// An error that wraps another, as an application's error type does (`source()` is the wrapped error).
#[derive(Debug)]
struct Wrapped(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the order failed: {}", self.0)
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[test]
fn tracing_an_error_that_is_or_is_caused_by_a_block_does_not_count_it() {
    use std::error::Error;
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("stock").count(0.0)]).unwrap();
    let block = engine.resource("stock").enter().unwrap_err();
    let caller = engine.resource("order");
    let trace = |err: &(dyn Error + 'static)| caller.enter().unwrap().trace(err);
    #[cfg_attr(not(feature = "reqwest"), allow(unused_mut))]
    let mut blocks: Vec<Box<dyn Error + Send + Sync>> = vec![
        Box::new(ClientError::<std::io::Error>::Blocked(block.clone())),
        Box::new(Wrapped(Box::new(block.clone()))),
        Box::new(Wrapped(Box::new(ClientError::<Infallible>::Blocked(block.clone())))),
        Box::new(std::io::Error::other(block.clone())),
        Box::new(Wrapped(Box::new(std::io::Error::other(ClientError::<Infallible>::Blocked(block.clone()))))),
    ];
    #[cfg(feature = "reqwest")]
    {
        blocks.push(Box::new(reqwest_middleware::Error::middleware(block.clone())));
        blocks.push(Box::new(Wrapped(Box::new(reqwest_middleware::Error::middleware(
            ClientError::<Infallible>::Blocked(block.clone()),
        )))));
    }
    for (i, err) in blocks.iter().enumerate() {
        trace(&**err);
        assert_eq!(engine.cluster_stats("order").unwrap().minute_exception, 0, "#{i} is a block: {err}");
    }
    // A failure is still one, wrapped or not.
    trace(&Wrapped(Box::new(std::io::Error::other("connection refused"))));
    trace(&ClientError::<std::io::Error>::Client(std::io::Error::other("connection refused")));
    assert_eq!(engine.cluster_stats("order").unwrap().minute_exception, 2);
}

/// A block of a call to `stock` (a rule that admits nothing).
fn stock_block() -> BlockError {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("stock").count(0.0)]).unwrap();
    engine.resource("stock").enter().unwrap_err()
}

#[test]
fn a_blocked_client_errors_source_is_its_block() {
    use std::error::Error;
    let err = ClientError::<Infallible>::Blocked(stock_block());
    assert!(err.source().and_then(|s| s.downcast_ref::<BlockError>()).is_some());
}

/// A printer of an error's chain (`{:#}` of an `anyhow::Error`, a log line of each cause) shows the block's
/// reason once: the error's own message names the call's resource, its source says why it was blocked.
#[test]
fn a_blocked_client_errors_chain_states_the_block_once() {
    use std::error::Error;
    let block = stock_block();
    let reason = block.to_string();
    let err = ClientError::<Infallible>::Blocked(block);
    let mut chain = vec![err.to_string()];
    let mut cause = err.source();
    while let Some(c) = cause {
        chain.push(c.to_string());
        cause = c.source();
    }
    let printed = chain.join(": ");
    assert_eq!(printed.matches(reason.as_str()).count(), 1, "{printed}");
    assert!(chain[0].contains("`stock`"), "the error names its resource: {}", chain[0]);
}

#[test]
fn a_call_blocked_by_an_inner_tower_guard_behind_a_buffer_is_not_an_error_of_the_outer_guards_resource() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(0.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    let client = tower::service_fn(move |_req: Request<()>| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))))
    });
    let inner = SentinelClientLayer::new(&engine).layer(client);
    // The buffer's worker is a future polled here by hand: no runtime, no thread.
    let (buffered, worker) = tower::buffer::Buffer::pair(inner, 4);
    let mut worker = Box::pin(worker);
    let mut svc = SentinelClientLayer::new(&engine).resource_name(|_| Some("inventory".into())).layer(buffered);
    assert!(matches!(poll(pin!(std::future::poll_fn(|cx| svc.poll_ready(cx)))), Poll::Ready(Ok(()))));
    let mut call = pin!(svc.call(get("/items/1")));
    let mut answer = Poll::Pending;
    for _ in 0..8 {
        let _ = poll(worker.as_mut());
        answer = poll(call.as_mut());
        if answer.is_ready() {
            break;
        }
    }
    match answer {
        Poll::Ready(Err(ClientError::Client(boxed))) => {
            let inner = boxed.downcast_ref::<ClientError<Infallible>>();
            assert!(matches!(inner, Some(ClientError::Blocked(BlockError::Flow { .. }))), "{boxed:?}");
        }
        other => panic!("expected the inner guard's block, boxed by the buffer, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    assert_eq!(engine.cluster_stats("inventory").unwrap().minute_exception, 0, "a block is no failure");
    assert_eq!(engine.cluster_stats("inventory").unwrap().minute_pass, 1);
}

#[test]
fn a_call_blocked_two_guards_down_is_not_an_error_of_the_outer_guards() {
    let (engine, _clock) = engine();
    let sent = Arc::new(AtomicUsize::new(0));
    let inner = SentinelClientLayer::new(&engine).layer(client(sent.clone()));
    let middle = SentinelClientLayer::new(&engine).resource_name(|_| Some("inventory".into())).layer(inner);
    let mut svc = SentinelClientLayer::new(&engine).resource_name(|_| Some("warehouse".into())).layer(middle);
    // The middle guard blocks once (its error type is then known as one that may be a block), then the inner.
    engine.load_flow_rules([FlowRule::new("inventory").count(0.0)]).unwrap();
    assert!(matches!(
        poll(pin!(svc.call(get("/items/1")))),
        Poll::Ready(Err(ClientError::Client(ClientError::Blocked(_))))
    ));
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(0.0)]).unwrap();
    match poll(pin!(svc.call(get("/items/1")))) {
        Poll::Ready(Err(ClientError::Client(ClientError::Client(ClientError::Blocked(BlockError::Flow {
            ..
        }))))) => {}
        other => panic!("expected the inner guard's block, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    let (outer, middle) = (engine.cluster_stats("warehouse").unwrap(), engine.cluster_stats("inventory").unwrap());
    assert_eq!((outer.minute_pass, outer.minute_exception), (2, 0), "a block is no failure");
    assert_eq!((middle.minute_pass, middle.minute_block, middle.minute_exception), (1, 1, 0));
}

/// A plain HTTP answer whose gRPC counterpart is `UNAVAILABLE` (gRPC's HTTP-to-gRPC mapping, which the
/// guard applies to a gRPC call's non-200 answer: 429, 502, 503, 504) is a drop for the adaptive limit, as
/// `UNAVAILABLE` is for Netflix's gRPC client interceptor (`onDropped`) and for a gRPC call through this guard:
/// a 504 from a gateway is the downstream running past the gateway's time limit, a 502 the gateway failing to
/// reach it (a transport error of the gateway's, which is a drop here too).
#[test]
fn an_http_answer_that_grpc_maps_to_unavailable_is_a_drop_for_the_adaptive_limit() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    for status in [429u16, 502, 503, 504] {
        let (engine, _clock) = engine();
        let mut rule = AdaptiveRule::new(".*").regex(true).algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
        rule.window.min_samples = 1;
        engine.load_adaptive_rules([rule]).unwrap();
        let mut svc = SentinelClientLayer::new(&engine).layer(tower::service_fn(move |_req: Request<()>| {
            let mut answer = Response::new(Full::new(Bytes::new()));
            *answer.status_mut() = http::StatusCode::from_u16(status).unwrap();
            std::future::ready(Ok::<_, Infallible>(answer))
        }));
        assert!(matches!(poll(pin!(svc.call(get("/items/1")))), Poll::Ready(Ok(_))));
        let s = &engine.adaptive_status()[0];
        assert_eq!((s.inflight, s.limit), (0, 9), "{status}: AIMD backs off on a drop: {s:?}");
    }
}

/// A block converted to a `tonic::Status` keeps the block as the status's `source()` (tonic's
/// `Status::set_source`), so that `BlockError::find_in` finds it behind the status.
#[cfg(feature = "tonic")]
#[test]
fn a_block_converted_to_a_status_is_found_behind_it() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("stock").count(0.0)]).unwrap();
    let block = engine.resource("stock").enter().unwrap_err();
    let direct = tonic::Status::from(block.clone());
    assert_eq!(direct.code(), tonic::Code::ResourceExhausted);
    assert!(matches!(BlockError::find_in(&direct), Some(BlockError::Flow { .. })), "{direct:?}");
    let through = tonic::Status::from(ClientError::<std::io::Error>::Blocked(block));
    assert!(matches!(BlockError::find_in(&through), Some(BlockError::Flow { .. })), "{through:?}");
    // A failure is no block.
    let failed = tonic::Status::from(ClientError::<std::io::Error>::Client(std::io::Error::other("refused")));
    assert!(BlockError::find_in(&failed).is_none());
}

/// Guards stacked with tonic's conversion between them (`map_err(Status::from)` after the inner guard, as
/// docs/outbound.md shows for a tonic channel): the inner guard's block reaches the outer one as a
/// `Status`, and is no failure of the outer guard's resource.
#[cfg(feature = "tonic")]
#[test]
fn a_call_blocked_by_an_inner_guard_behind_a_status_is_not_an_error_of_the_outer_guards_resource() {
    use tower::ServiceBuilder;
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("GET:stock.svc/items/{id}").count(0.0)]).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let inner = ServiceBuilder::new()
        .map_err(tonic::Status::from)
        .layer(SentinelClientLayer::new(&engine))
        .service(client(sent.clone()));
    let mut svc = SentinelClientLayer::new(&engine).resource_name(|_| Some("inventory".into())).layer(inner);
    match poll(pin!(svc.call(get("/items/1")))) {
        Poll::Ready(Err(ClientError::Client(status))) => assert_eq!(status.code(), tonic::Code::ResourceExhausted),
        other => panic!("expected the inner guard's block as a status, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    let outer = engine.cluster_stats("inventory").unwrap();
    assert_eq!((outer.minute_pass, outer.minute_exception), (1, 0), "a block is no failure");
}
