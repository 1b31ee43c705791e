//! Adaptive concurrency rules through the public API: `#[sentinel_resource]` on an `async fn` under a real
//! tokio runtime (its block handler gets the adaptive block), and the web layer in a real axum server
//! answering 503 with `Retry-After` once the limit is reached, and marking a service's own 503 as a drop; with
//! `maxWaitMs`, both wait for a place on the engine clock's timer instead (never blocking a worker).

mod web_support;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use sentinel_runtime::adaptive::{AdaptiveBlockReason, AdaptiveRule, AlgorithmKind};
use sentinel_runtime::web::SentinelLayer;
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};
use tokio::sync::Semaphore;
use web_support::{bounded, client, engine_at, serve, until};

#[derive(Debug, PartialEq)]
enum Answer {
    Done(u32),
    Refused { limit: u32, inflight: u32, message: String },
}

#[sentinel_resource(name = "adaptive.fetch", block_handler = fetch_blocked)]
async fn fetch(id: u32, gate: Arc<Semaphore>) -> Result<Answer, std::convert::Infallible> {
    pass_gate(&gate).await;
    Ok(Answer::Done(id))
}

/// Waits for one of the gate's permits (and keeps it).
async fn pass_gate(gate: &Semaphore) {
    if let Ok(p) = gate.acquire().await {
        p.forget();
    }
}

fn fetch_blocked(_: u32, _: Arc<Semaphore>, b: BlockError) -> Result<Answer, std::convert::Infallible> {
    match &b {
        BlockError::Adaptive { block, .. } => {
            assert_eq!(block.reason, AdaptiveBlockReason::AtLimit);
            Ok(Answer::Refused { limit: block.limit, inflight: block.inflight, message: b.to_string() })
        }
        other => panic!("an adaptive block, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_async_fn_over_its_adaptive_limit_gets_the_block_in_its_handler() {
    bounded(async {
        let (engine, _clock) = engine_at(0);
        let engine: &'static Sentinel = engine.leak();
        engine
            .load_adaptive_rules([AdaptiveRule::new("adaptive.fetch")
                .algorithm(AlgorithmKind::Gradient2)
                .limits(1, 2, 10)])
            .unwrap();
        let gate = Arc::new(Semaphore::new(0));
        // Two calls hold the limit's two places across an await, on the runtime's workers.
        let running: Vec<_> = (0..2)
            .map(|i| {
                let gate = gate.clone();
                tokio::spawn(engine.scoped_future(fetch(i, gate)))
            })
            .collect();
        until("two calls in flight", || engine.adaptive_status().first().is_some_and(|s| s.inflight == 2)).await;
        let third = engine.scoped_future(fetch(3, gate.clone())).await.unwrap();
        match third {
            Answer::Refused { limit, inflight, message } => {
                assert_eq!((limit, inflight), (2, 2));
                assert!(message.contains("adaptive limit 2 reached (2 in flight"), "{message}");
            }
            other => panic!("the third call is refused, got {other:?}"),
        }
        gate.add_permits(3);
        for r in running {
            assert!(matches!(r.await.unwrap(), Ok(Answer::Done(_))));
        }
        assert_eq!(engine.adaptive_status()[0].inflight, 0, "both places came back");
        assert_eq!(engine.scoped_future(fetch(4, gate.clone())).await.unwrap(), Answer::Done(4));
    })
    .await
}

/// A handler that answers once `release` gives it a permit.
fn slow_handler(release: Arc<Semaphore>) -> axum::routing::MethodRouter {
    get(move || {
        let r = release.clone();
        async move {
            pass_gate(&r).await;
            "done"
        }
    })
}

#[tokio::test]
async fn at_its_adaptive_limit_the_web_layer_answers_503_with_retry_after_and_a_503_from_the_service_is_a_drop() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let mut rule = AdaptiveRule::new("GET:/slow").algorithm(AlgorithmKind::Aimd).limits(1, 1, 10);
        rule.window.min_samples = 1;
        engine
            .load_adaptive_rules([
                rule,
                AdaptiveRule::new("GET:/busy").algorithm(AlgorithmKind::Aimd).limits(1, 10, 10),
            ])
            .unwrap();
        let release = Arc::new(Semaphore::new(0));
        let app = Router::new()
            .route("/slow", slow_handler(release.clone()))
            .route("/busy", get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "overloaded") }))
            .route_layer(SentinelLayer::new(&engine));
        let addr = serve(app).await;

        let first = tokio::spawn(client().get(format!("http://{addr}/slow")).send());
        until("the first request holds the only place", || {
            engine.adaptive_status().iter().any(|s| s.resource == "GET:/slow" && s.inflight == 1)
        })
        .await;
        let r = client().get(format!("http://{addr}/slow")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
        assert!(r.text().await.unwrap().contains("adaptive concurrency limit"));
        release.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);

        // The service's own 503 is an overload: AIMD backs off from 10 to 9 at once.
        clock.advance_millis(5);
        let r = client().get(format!("http://{addr}/busy")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let busy = engine.adaptive_status().into_iter().find(|s| s.resource == "GET:/busy").unwrap();
        assert_eq!(busy.limit, 9, "{busy:?}");
    })
    .await
}

#[sentinel_resource(name = "adaptive.queued", block_handler = queued_blocked)]
async fn queued(id: u32, gate: Arc<Semaphore>) -> Result<Answer, std::convert::Infallible> {
    pass_gate(&gate).await;
    Ok(Answer::Done(id))
}

fn queued_blocked(_: u32, _: Arc<Semaphore>, b: BlockError) -> Result<Answer, std::convert::Infallible> {
    match &b {
        BlockError::Adaptive { block, .. } => {
            assert_eq!(block.reason, AdaptiveBlockReason::WaitTimedOut, "refused only once its wait ran out");
            Ok(Answer::Refused { limit: block.limit, inflight: block.inflight, message: b.to_string() })
        }
        other => panic!("an adaptive block, got {other}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_annotated_async_fn_over_its_limit_waits_up_to_max_wait_for_a_place_without_blocking_the_runtime() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        let engine: &'static Sentinel = engine.leak();
        engine.load_adaptive_rules([AdaptiveRule::new("adaptive.queued").limits(1, 1, 1).max_wait_ms(500)]).unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let status = || engine.adaptive_status()[0].clone();
        let first = tokio::spawn(engine.scoped_future(queued(1, gate.clone())));
        until("the first call holds the only place", || {
            engine.adaptive_status().first().is_some_and(|s| s.inflight == 1)
        })
        .await;
        // On a one-thread runtime: the second call waits, and the first still runs to completion.
        let second = tokio::spawn(engine.scoped_future(queued(2, gate.clone())));
        until("the second call waits", || status().waiting == 1).await;
        gate.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap(), Answer::Done(1));
        until("the second call took the freed place", || status().waiting == 0 && status().inflight == 1).await;
        gate.add_permits(1);
        assert_eq!(second.await.unwrap().unwrap(), Answer::Done(2), "admitted, not refused");
        assert_eq!((status().inflight, status().waiting), (0, 0));

        // Nobody frees the place: the wait runs out on the engine's clock, and the block handler gets it.
        let holder = tokio::spawn(engine.scoped_future(queued(3, gate.clone())));
        until("a call holds the place", || status().inflight == 1).await;
        let late = tokio::spawn(engine.scoped_future(queued(4, gate.clone())));
        until("the late call waits", || status().waiting == 1).await;
        clock.advance_millis(500);
        match late.await.unwrap().unwrap() {
            Answer::Refused { limit, inflight, message } => {
                assert_eq!((limit, inflight), (1, 1));
                assert!(message.contains("adaptive"), "{message}");
            }
            other => panic!("refused after max_wait_ms, got {other:?}"),
        }
        gate.add_permits(1);
        assert_eq!(holder.await.unwrap().unwrap(), Answer::Done(3));
        assert_eq!((status().inflight, status().waiting), (0, 0), "no place leaked");
    })
    .await
}

#[tokio::test]
async fn at_its_adaptive_limit_with_max_wait_the_web_layer_holds_the_request_until_a_place_frees_or_the_wait_ends() {
    bounded(async {
        let (engine, clock) = engine_at(0);
        engine
            .load_adaptive_rules([AdaptiveRule::new("GET:/slow")
                .algorithm(AlgorithmKind::Aimd)
                .limits(1, 1, 1)
                .max_wait_ms(300)])
            .unwrap();
        let release = Arc::new(Semaphore::new(0));
        let app = Router::new().route("/slow", slow_handler(release.clone())).route_layer(SentinelLayer::new(&engine));
        let addr = serve(app).await;
        // (in flight, waiting); the limiter is built by the first request.
        let status = || engine.adaptive_status().first().map_or((0, 0), |s| (s.inflight, s.waiting));

        let first = tokio::spawn(client().get(format!("http://{addr}/slow")).send());
        until("the first request holds the only place", || status().0 == 1).await;
        let second = tokio::spawn(client().get(format!("http://{addr}/slow")).send());
        until("the second request waits for a place", || status().1 == 1).await;
        release.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK, "it waited instead of a 503");

        let holder = tokio::spawn(client().get(format!("http://{addr}/slow")).send());
        until("a request holds the place", || status().0 == 1).await;
        let late = tokio::spawn(client().get(format!("http://{addr}/slow")).send());
        until("the late request waits", || status().1 == 1).await;
        clock.advance_millis(300);
        let r = late.await.unwrap().unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "refused once its wait ran out");
        assert!(r.headers().contains_key("retry-after"));
        release.add_permits(1);
        assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
        until("every place came back", || status() == (0, 0)).await;
    })
    .await
}
