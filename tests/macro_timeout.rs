//! `#[sentinel_resource(timeout_ms = ..)]` on `async fn`s: the body's future is dropped when the time is up,
//! the call counts as an exception whose response time is the limit (so slow-call breakers see it), and the
//! `Timeout` goes to the fallback or comes back as `Err`. Time comes from a manual clock: nothing waits.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use common::{engine, stats};
use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel, Timeout};

#[derive(Debug)]
enum CallError {
    TimedOut(Timeout),
    Blocked(BlockError),
}

impl From<Timeout> for CallError {
    fn from(t: Timeout) -> Self {
        CallError::TimedOut(t)
    }
}

impl From<BlockError> for CallError {
    fn from(b: BlockError) -> Self {
        CallError::Blocked(b)
    }
}

/// Waits `ms` on the clock of the engine in use (a manual clock in these tests).
async fn work(ms: u64) {
    Sentinel::current().sleep(Duration::from_millis(ms)).await;
}

#[sentinel_resource(name = "timeout.fetch", timeout_ms = 200)]
async fn fetch(work_ms: u64) -> Result<u64, CallError> {
    work(work_ms).await;
    Ok(work_ms)
}

#[sentinel_resource(name = "timeout.queued", timeout_ms = 200)]
async fn queued(work_ms: u64) -> Result<u64, CallError> {
    work(work_ms).await;
    Ok(work_ms)
}

const LOOKUP_LIMIT_MS: u64 = 100;

#[sentinel_resource(name = "timeout.lookup", timeout_ms = LOOKUP_LIMIT_MS, fallback = lookup_fallback)]
async fn lookup(id: u64, work_ms: u64) -> Result<String, CallError> {
    work(work_ms).await;
    Ok(format!("fresh {id}"))
}

fn lookup_fallback(id: u64, _work_ms: u64, e: CallError) -> Result<String, CallError> {
    match e {
        CallError::TimedOut(t) => Ok(format!("cached {id} after {} ms", t.limit.as_millis())),
        other => Err(other),
    }
}

#[sentinel_resource(name = "timeout.inner")]
async fn inner(work_ms: u64) -> Result<(), CallError> {
    work(work_ms).await;
    Ok(())
}

#[sentinel_resource(name = "timeout.outer", timeout_ms = 50)]
async fn outer(work_ms: u64) -> Result<(), CallError> {
    inner(work_ms).await
}

#[sentinel_resource(name = "timeout.untimed")]
async fn untimed(work_ms: u64) -> Result<u64, CallError> {
    work(work_ms).await;
    Ok(work_ms)
}

struct Client;

impl Client {
    #[sentinel_resource(name = "timeout.method", timeout_ms = 30, default_fallback = Self::gave_up)]
    async fn call(&self, work_ms: u64) -> Result<&'static str, CallError> {
        work(work_ms).await;
        Ok("answer")
    }

    fn gave_up(e: CallError) -> Result<&'static str, CallError> {
        match e {
            CallError::TimedOut(_) => Ok("gave up"),
            other => Err(other),
        }
    }
}

/// Polls `fut` once with a waker that does nothing (the manual clock's advance makes timers ready).
fn poll<F: Future + ?Sized>(fut: &mut Pin<Box<F>>) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    fut.as_mut().poll(&mut Context::from_waker(&waker))
}

#[test]
fn a_body_that_finishes_in_time_returns_its_value() {
    let (engine, clock) = engine();
    let mut call = Box::pin(engine.scoped_future(fetch(150)));
    assert!(poll(&mut call).is_pending());
    assert_eq!(clock.pending_timers(), 2, "the body's work and the limit");
    clock.advance_millis(150);
    assert!(matches!(poll(&mut call), Poll::Ready(Ok(150))));
    assert_eq!(clock.pending_timers(), 0, "the limit's timer is gone with the call");
    let s = stats(engine, "timeout.fetch");
    assert_eq!((s.minute_success, s.minute_exception, s.threads), (1, 0, 0));
}

#[test]
fn a_body_that_runs_out_of_time_is_dropped_and_returns_the_timeout() {
    let (engine, clock) = engine();
    let mut call = Box::pin(engine.scoped_future(fetch(10_000)));
    assert!(poll(&mut call).is_pending());
    clock.advance_millis(199);
    assert!(poll(&mut call).is_pending(), "not yet: 1 ms is left");
    clock.advance_millis(1);
    match poll(&mut call) {
        Poll::Ready(Err(CallError::TimedOut(t))) => {
            assert_eq!(&*t.resource, "timeout.fetch");
            assert_eq!(t.limit, Duration::from_millis(200));
            assert!(t.to_string().contains("timed out after 200 ms"), "{t}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(clock.pending_timers(), 0, "the body's own timer was dropped with it");
    let s = stats(engine, "timeout.fetch");
    assert_eq!((s.minute_success, s.minute_exception, s.threads), (1, 1, 0), "an exception, nothing in flight");
    assert!((s.avg_rt_ms - 200.0).abs() < 1e-9, "its response time is the limit: {}", s.avg_rt_ms);
}

#[test]
fn a_timed_out_call_goes_to_the_fallback_with_the_arguments() {
    let (engine, clock) = engine();
    let mut fast = Box::pin(engine.scoped_future(lookup(7, 10)));
    assert!(poll(&mut fast).is_pending());
    clock.advance_millis(10);
    assert_eq!(
        match poll(&mut fast) {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => panic!("pending"),
        },
        "fresh 7"
    );

    let mut slow = Box::pin(engine.scoped_future(lookup(8, 5_000)));
    assert!(poll(&mut slow).is_pending());
    clock.advance_millis(LOOKUP_LIMIT_MS);
    let out = match poll(&mut slow) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("still pending after the limit"),
    };
    assert_eq!(out, "cached 8 after 100 ms");
    assert_eq!(stats(engine, "timeout.lookup").minute_exception, 1, "the timeout is traced before the fallback");
}

#[test]
fn a_method_with_a_time_limit_and_a_default_fallback() {
    let (engine, clock) = engine();
    let client = Client;
    let mut call = Box::pin(engine.scoped_future(client.call(1_000)));
    assert!(poll(&mut call).is_pending());
    clock.advance_millis(30);
    assert!(matches!(poll(&mut call), Poll::Ready(Ok("gave up"))));
}

#[test]
fn a_slow_call_breaker_trips_on_timeouts() {
    let (engine, clock) = engine();
    // Slower than 100 ms is slow; open when more than half of at least 3 calls in a second are slow.
    engine
        .load_degrade_rules([DegradeRule::new("timeout.fetch", DegradeGrade::SlowRequestRatio)
            .count(100.0)
            .slow_ratio_threshold(0.5)
            .min_request_amount(3)
            .time_window_sec(10)])
        .unwrap();
    for _ in 0..3 {
        let mut call = Box::pin(engine.scoped_future(fetch(10_000)));
        assert!(poll(&mut call).is_pending());
        clock.advance_millis(200);
        assert!(matches!(poll(&mut call), Poll::Ready(Err(CallError::TimedOut(_)))));
    }
    assert_eq!(engine.circuit_breakers("timeout.fetch")[0].state, BreakerState::Open);
    let mut blocked = Box::pin(engine.scoped_future(fetch(1)));
    assert!(matches!(poll(&mut blocked), Poll::Ready(Err(CallError::Blocked(BlockError::Degrade { .. })))));
}

#[test]
fn a_timeout_leaves_nothing_in_flight_below_it() {
    let (engine, clock) = engine();
    let mut call = Box::pin(engine.scoped_future(outer(10_000)));
    assert!(poll(&mut call).is_pending());
    assert_eq!(stats(engine, "timeout.inner").threads, 1, "the nested call is in flight");
    clock.advance_millis(50);
    assert!(matches!(poll(&mut call), Poll::Ready(Err(CallError::TimedOut(_)))));
    for name in ["timeout.outer", "timeout.inner"] {
        assert_eq!(stats(engine, name).threads, 0, "{name} is still counted in flight");
    }
    let inner = stats(engine, "timeout.inner");
    assert_eq!((inner.minute_success, inner.minute_exception), (1, 0), "the cancelled nested call is not an error");
    assert_eq!(clock.pending_timers(), 0);
    let tree = engine.tree();
    assert!(format!("{tree:?}").contains("timeout.inner"), "the nested call was a child of the outer one");
}

#[test]
fn dropping_the_call_before_the_limit_cancels_its_timer_and_is_not_an_error() {
    let (engine, clock) = engine();
    let mut call = Box::pin(engine.scoped_future(fetch(10_000)));
    assert!(poll(&mut call).is_pending());
    drop(call);
    assert_eq!(clock.pending_timers(), 0);
    let s = stats(engine, "timeout.fetch");
    assert_eq!((s.threads, s.minute_exception), (0, 0));
}

#[test]
fn a_function_without_a_limit_starts_no_timer() {
    let (engine, clock) = engine();
    let mut call = Box::pin(engine.scoped_future(untimed(10_000)));
    assert!(poll(&mut call).is_pending());
    assert_eq!(clock.pending_timers(), 1, "only the body's own work waits");
    clock.advance_millis(10_000);
    assert!(matches!(poll(&mut call), Poll::Ready(Ok(10_000))));
}

#[test]
fn the_limit_works_on_tokio_with_a_manual_clock() {
    let (engine, clock) = engine();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let out = rt.block_on(async {
        let task = tokio::spawn(engine.scoped_future(fetch(10_000)));
        // The task registers its two timers on its first poll, whenever a worker gets to it (a loaded
        // machine may take long: the bound only turns a hang into a failure).
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while clock.pending_timers() < 2 && std::time::Instant::now() < give_up {
            tokio::task::yield_now().await;
        }
        assert_eq!(clock.pending_timers(), 2);
        clock.advance_millis(200);
        task.await.unwrap()
    });
    assert!(matches!(out, Err(CallError::TimedOut(_))), "{out:?}");
}

#[sentinel_resource(name = "timeout.never", timeout_ms = 5)]
async fn never_finishes() -> Result<(), CallError> {
    std::future::pending::<()>().await;
    Ok(())
}

/// On the system clock the limit is a real, runtime-agnostic timer. The body never finishes, so the outcome
/// does not depend on the machine's speed.
#[test]
fn on_the_system_clock_the_limit_is_a_real_timer_on_any_executor() {
    let engine = Sentinel::builder().build().leak();
    let on_futures = futures::executor::block_on(engine.scoped_future(never_finishes()));
    assert!(matches!(on_futures, Err(CallError::TimedOut(_))));
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let on_tokio = rt.block_on(engine.scoped_future(never_finishes()));
    assert!(matches!(on_tokio, Err(CallError::TimedOut(_))));
    assert_eq!(stats(engine, "timeout.never").minute_exception, 2);
}

/// Polls a call of `fetch`-like work that never ends until its limit, advancing the clock: it must still be
/// pending 1 ms before `limit_ms` and time out at it.
fn times_out_at<F: Future<Output = Result<u64, CallError>> + ?Sized>(
    clock: &sentinel_runtime::clock::ManualClock,
    call: &mut Pin<Box<F>>,
    limit_ms: u64,
) {
    assert!(poll(call).is_pending());
    clock.advance_millis(limit_ms - 1);
    assert!(poll(call).is_pending(), "not yet: 1 ms is left");
    clock.advance_millis(1);
    assert!(matches!(poll(call), Poll::Ready(Err(CallError::TimedOut(_)))), "the limit is up");
}

#[test]
fn with_the_engine_switched_off_the_limit_still_counts_from_the_call() {
    // An unchecked entry has no decision time: the limit counts from the call (the clock is far from zero).
    let (engine, clock) = engine();
    engine.set_enabled(false);
    let mut call = Box::pin(engine.scoped_future(fetch(150)));
    assert!(poll(&mut call).is_pending());
    clock.advance_millis(150);
    assert!(matches!(poll(&mut call), Poll::Ready(Ok(150))));
    times_out_at(&clock, &mut Box::pin(engine.scoped_future(fetch(10_000))), 200);
}

#[test]
fn a_call_given_a_queueing_wait_has_its_whole_limit_for_its_body() {
    let (engine, clock) = engine();
    engine
        .load_flow_rules([FlowRule::new("timeout.queued")
            .count(5.0)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_time_ms(1_000)])
        .unwrap();
    // The first call passes at once; the second is given a wait (200 ms at 5 a second), which nothing sleeps on
    // a manual clock: its body starts now, and its limit counts from there, not from the end of the wait.
    times_out_at(&clock, &mut Box::pin(engine.scoped_future(queued(10_000))), 200);
    let mut second = Box::pin(engine.scoped_future(queued(10_000)));
    times_out_at(&clock, &mut second, 200);
}
