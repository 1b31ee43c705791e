//! The bounded wait (`maxWaitMs`) for async callers, through the engine's entry path on a manual clock: an
//! async caller over the limit awaits a place on the engine clock's timer and never blocks its thread; it is
//! admitted when a place frees in time, refused after the wait, served newest first; a dropped wait leaks no
//! place and gives none back twice. No sleeping: polls by hand, the clock moved by hand.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::*;
use crate::clock::ManualClock;
use crate::{BlockError, Entry, Sentinel};

fn engine_with_wait(limit: u32, max_wait_ms: u64) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    let mut rule = AdaptiveRule::new("db").limits(1, limit, limit).max_wait_ms(max_wait_ms);
    rule.max_waiters = 8;
    engine.load_adaptive_rules([rule]).unwrap();
    (engine, clock)
}

type Decided = Result<Entry<'static>, BlockError>;
type EntryFuture = Pin<Box<dyn Future<Output = Decided> + Send>>;

/// An async entry of `db` (owned, so the future outlives the handle).
fn enter_async(engine: &Sentinel) -> EntryFuture {
    Box::pin(engine.resource("db").entry_owned().enter_async())
}

fn poll(f: &mut EntryFuture) -> Poll<Decided> {
    f.as_mut().poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
}

fn status(engine: &Sentinel) -> (u32, usize) {
    let s = &engine.adaptive_status()[0];
    (s.inflight, s.waiting)
}

#[test]
fn an_async_call_over_the_limit_is_admitted_when_a_place_frees_within_max_wait() {
    let (engine, clock) = engine_with_wait(1, 100);
    let held = engine.enter("db").unwrap();
    let mut waiting = enter_async(&engine);
    assert!(poll(&mut waiting).is_pending(), "it waits instead of being refused");
    assert_eq!(status(&engine), (1, 1));
    assert_eq!(clock.pending_timers(), 1, "on the engine clock's timer");
    clock.advance_millis(60);
    assert!(poll(&mut waiting).is_pending());
    drop(held);
    let entry = match poll(&mut waiting) {
        Poll::Ready(Ok(e)) => e,
        other => panic!("admitted with the freed place: {other:?}"),
    };
    assert_eq!(status(&engine), (1, 0), "it holds exactly the place that freed");
    assert_eq!(clock.pending_timers(), 0, "its timer is gone");
    drop(entry);
    assert_eq!(status(&engine), (0, 0));
}

#[test]
fn an_async_call_whose_wait_runs_out_gets_the_adaptive_block_and_is_counted_as_blocked() {
    let (engine, clock) = engine_with_wait(1, 100);
    let held = engine.enter("db").unwrap();
    let mut waiting = enter_async(&engine);
    assert!(poll(&mut waiting).is_pending());
    clock.advance_millis(99);
    assert!(poll(&mut waiting).is_pending(), "not before max_wait_ms");
    clock.advance_millis(1);
    match poll(&mut waiting) {
        Poll::Ready(Err(BlockError::Adaptive { block, .. })) => {
            assert_eq!(block.reason, AdaptiveBlockReason::WaitTimedOut);
            assert_eq!((block.limit, block.inflight), (1, 1));
        }
        other => panic!("refused after max_wait_ms: {other:?}"),
    }
    assert_eq!(status(&engine), (1, 0));
    assert!(engine.cluster_stats("db").unwrap().block_qps > 0.0, "the refusal is recorded like any block");
    drop(held);
    assert_eq!(status(&engine), (0, 0));
}

#[test]
fn async_waiters_are_served_newest_first() {
    let (engine, _clock) = engine_with_wait(1, 1_000);
    let held = engine.enter("db").unwrap();
    let mut waits: Vec<EntryFuture> = (0..3).map(|_| enter_async(&engine)).collect();
    for w in &mut waits {
        assert!(poll(w).is_pending());
    }
    assert_eq!(status(&engine), (1, 3));
    drop(held);
    assert!(poll(&mut waits[0]).is_pending() && poll(&mut waits[1]).is_pending(), "the older ones still wait");
    let newest = match poll(&mut waits[2]) {
        Poll::Ready(Ok(e)) => e,
        other => panic!("the newest waiter gets the place: {other:?}"),
    };
    drop(newest);
    assert!(poll(&mut waits[0]).is_pending());
    let second = match poll(&mut waits[1]) {
        Poll::Ready(Ok(e)) => e,
        other => panic!("then the next newest: {other:?}"),
    };
    drop(second);
    assert!(matches!(poll(&mut waits[0]), Poll::Ready(Ok(_))), "and the oldest last");
    assert_eq!(status(&engine), (0, 0));
}

#[test]
fn dropping_a_waiting_future_leaks_no_place_and_gives_none_back_twice() {
    let (engine, _clock) = engine_with_wait(2, 1_000);
    let (a, b) = (engine.enter("db").unwrap(), engine.enter("db").unwrap());
    // Dropped while waiting: it leaves the queue.
    let mut gone = enter_async(&engine);
    assert!(poll(&mut gone).is_pending());
    drop(gone);
    assert_eq!(status(&engine), (2, 0));
    // Dropped after a place was granted to it but before it saw it: that place goes back, once.
    let mut granted = enter_async(&engine);
    assert!(poll(&mut granted).is_pending());
    drop(a);
    assert_eq!(status(&engine), (2, 0), "the freed place went to the waiter");
    drop(granted);
    assert_eq!(status(&engine), (1, 0), "and back from it, once: `b` still holds its place");
    let c = engine.enter("db").unwrap();
    assert!(
        engine.resource("db").entry().decide().map(drop).is_err(),
        "two places, both held: nothing was given back twice"
    );
    drop((b, c));
    assert_eq!(status(&engine), (0, 0));
    // Dropped before its first poll: it never waited.
    let held = engine.enter("db").unwrap();
    let held2 = engine.enter("db").unwrap();
    drop(enter_async(&engine));
    drop((held, held2));
    assert_eq!(status(&engine), (0, 0));
}

#[test]
fn a_waiter_is_not_stranded_on_the_limiter_a_changed_rule_replaced() {
    let (engine, clock) = engine_with_wait(1, 100);
    let held = engine.enter("db").unwrap();
    let mut waiting = enter_async(&engine);
    assert!(poll(&mut waiting).is_pending());
    // The rule changes: a new limiter, with room for five and nobody in flight.
    let mut rule = AdaptiveRule::new("db").limits(1, 5, 5).max_wait_ms(100);
    rule.max_waiters = 8;
    engine.load_adaptive_rules([rule]).unwrap();
    // The call in flight ends: its place goes to nobody (its limiter is gone), and so does any grant.
    drop(held);
    clock.advance_millis(50);
    match poll(&mut waiting) {
        Poll::Ready(Ok(e)) => drop(e),
        other => {
            panic!("the resource has had room for 50 ms, yet the waiter still waits on the old limiter: {other:?}")
        }
    }
}

#[test]
fn a_waiter_woken_by_a_changed_rule_waits_on_the_new_limiter_only_what_is_left_of_its_wait() {
    let (engine, clock) = engine_with_wait(1, 100);
    let held = engine.enter("db").unwrap();
    let mut waiting = enter_async(&engine);
    assert!(poll(&mut waiting).is_pending());
    clock.advance_millis(60);
    // The rule changes to one as full: the call in flight under the old rule still holds the one place.
    let mut rule = AdaptiveRule::new("db").limits(1, 1, 1).max_wait_ms(100);
    rule.max_waiters = 4;
    engine.load_adaptive_rules([rule]).unwrap();
    assert!(poll(&mut waiting).is_pending(), "it waits again, on the new limiter");
    assert_eq!(status(&engine), (1, 1));
    clock.advance_millis(39);
    assert!(poll(&mut waiting).is_pending());
    clock.advance_millis(1);
    match poll(&mut waiting) {
        Poll::Ready(Err(BlockError::Adaptive { block, .. })) => {
            assert_eq!(block.reason, AdaptiveBlockReason::WaitTimedOut)
        }
        other => panic!("refused after the 100 ms it was told to wait in all, not 160: {other:?}"),
    }
    assert_eq!(status(&engine), (1, 0));
    drop(held);
    assert_eq!(status(&engine), (0, 0));
}

#[test]
fn a_sync_waiter_is_admitted_at_once_when_its_adaptive_rule_is_removed() {
    let (engine, _clock) = engine_with_wait(1, 1_000);
    let held = engine.enter("db").unwrap();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.enter("db").map(drop).is_ok())
    };
    while engine.adaptive_status()[0].waiting == 0 {
        std::thread::yield_now();
    }
    // On a manual clock nothing ends the wait but a place: the rule's removal must wake it.
    engine.load_adaptive_rules([]).unwrap();
    assert!(waiter.join().unwrap(), "no adaptive rule governs the resource any more");
    drop(held);
}

#[test]
fn a_call_without_max_wait_is_refused_at_once_whether_sync_or_async() {
    let (engine, clock) = engine_with_wait(1, 0);
    let held = engine.enter("db").unwrap();
    let mut refused = enter_async(&engine);
    match poll(&mut refused) {
        Poll::Ready(Err(BlockError::Adaptive { block, .. })) => assert_eq!(block.reason, AdaptiveBlockReason::AtLimit),
        other => panic!("refused at once: {other:?}"),
    }
    assert!(matches!(engine.enter("db"), Err(BlockError::Adaptive { .. })));
    assert_eq!((status(&engine), clock.pending_timers()), ((1, 0), 0));
    drop(held);
}

#[test]
fn a_current_thread_runtime_keeps_serving_other_tasks_while_one_waits() {
    let (engine, clock) = engine_with_wait(1, 1_000);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let held = engine.resource("db").entry_owned().enter().unwrap();
        let waiter = tokio::spawn(enter_async(&engine));
        tokio::task::yield_now().await;
        assert_eq!(status(&engine), (1, 1), "the waiter waits, on the one worker");
        // The only worker thread is free: other tasks run to completion meanwhile.
        let served = tokio::spawn(async { (0..10u32).sum::<u32>() }).await.unwrap();
        assert_eq!(served, 45);
        clock.advance_millis(500);
        let freer = tokio::spawn(async move { drop(held) });
        freer.await.unwrap();
        let entry = waiter.await.unwrap().expect("admitted once the place freed");
        assert_eq!(status(&engine), (1, 0));
        drop(entry);
    });
    assert_eq!(status(&engine), (0, 0));
}
