//! Adaptive concurrency rules through the public API: `#[sentinel_resource]` on an `async fn` under a real
//! tokio runtime (its block handler gets the adaptive block), and the web layer in a real axum server
//! answering 503 with `Retry-After` once the limit is reached, and marking a service's own 503 as a drop.

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
    if let Ok(p) = gate.acquire().await {
        p.forget();
    }
    Ok(Answer::Done(id))
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
        let r = release.clone();
        let app = Router::new()
            .route(
                "/slow",
                get(move || {
                    let r = r.clone();
                    async move {
                        if let Ok(p) = r.acquire().await {
                            p.forget();
                        }
                        "done"
                    }
                }),
            )
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
