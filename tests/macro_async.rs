//! Behaviour of `#[sentinel_resource]` on `async fn`s: dispatch with sync and async handlers, the context carried
//! across `.await` (call trees on one thread and across worker threads), cancellation and panics leave no thread
//! counted, queueing awaits a timer instead of blocking the executor, `#[async_trait]` methods, `Send` futures.

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use common::{engine, engine_with_limits, stats, AppError, NestedError};
use futures::FutureExt;
use sentinel_runtime::flow::{ControlBehavior, FlowRule};
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel, DEFAULT_CONTEXT_NAME};

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[sentinel_resource(name = "async.get", block_handler = get_blocked)]
async fn get(id: u64) -> Result<String, AppError> {
    futures::future::ready(()).await;
    Ok(format!("item {id}"))
}

// A sync block handler of an async fn.
fn get_blocked(id: u64, b: BlockError) -> Result<String, AppError> {
    Ok(format!("blocked {id} by {}", b.kind_name()))
}

#[sentinel_resource(name = "async.load", fallback = load_fallback)]
async fn load(id: u64, tag: String) -> Result<String, AppError> {
    if id == 0 {
        return Err(AppError::NotFound(0));
    }
    Ok(format!("{tag}{id}"))
}

// An async fallback.
async fn load_fallback(id: u64, tag: String, e: AppError) -> Result<String, AppError> {
    futures::future::ready(()).await;
    Ok(format!("fallback {tag}{id} {e:?}"))
}

#[sentinel_resource(name = "async.plain", default_fallback = plain_default, exceptions_to_ignore = [AppError::Timeout])]
async fn plain(e: Option<AppError>) -> Result<u8, AppError> {
    match e {
        Some(e) => Err(e),
        None => Ok(1),
    }
}

fn plain_default(e: AppError) -> Result<u8, AppError> {
    Err(AppError::Invalid(format!("default {e:?}")))
}

#[test]
fn async_dispatch_paths_on_futures_executor() {
    let (engine, _clock) = engine_with_limits(&["async.get", "async.load"], 1.0);
    let out = engine.scoped(|| {
        futures::executor::block_on(async {
            (get(1).await, get(2).await, load(5, "t".into()).await, load(6, "t".into()).await)
        })
    });
    assert_eq!(out.0, Ok("item 1".to_string()));
    assert_eq!(out.1, Ok("blocked 2 by FlowException".to_string()));
    assert_eq!(out.2, Ok("t5".to_string()));
    assert_eq!(out.3, Ok("fallback t6 Blocked(\"async.load\")".to_string()));

    let (engine, _clock) = common::engine();
    let out = engine.scoped(|| {
        futures::executor::block_on(async {
            (
                load(0, "z".into()).await,
                plain(None).await,
                plain(Some(AppError::Timeout)).await,
                plain(Some(AppError::NotFound(4))).await,
            )
        })
    });
    assert_eq!(out.0, Ok("fallback z0 NotFound(0)".to_string()));
    assert_eq!(out.1, Ok(1));
    assert_eq!(out.2, Err(AppError::Timeout)); // ignored: untouched
    assert_eq!(out.3, Err(AppError::Invalid("default NotFound(4)".into())));
    assert_eq!(stats(engine, "async.load").minute_exception, 1);
    let p = stats(engine, "async.plain");
    assert_eq!((p.minute_pass, p.minute_exception, p.threads), (3, 1, 0));
}

// ---- the call tree across .await ----------------------------------------------------------------------------------

#[sentinel_resource(name = "async.outer")]
async fn outer() -> Result<u32, AppError> {
    let a = inner_async().await?;
    tokio::task::yield_now().await;
    let b = inner_sync()?;
    futures::future::ready(()).await;
    let c = inner_async().await?;
    Ok(a + b + c)
}

#[sentinel_resource(name = "async.inner_async")]
async fn inner_async() -> Result<u32, AppError> {
    tokio::task::yield_now().await;
    Ok(1)
}

#[sentinel_resource(name = "async.inner_sync")]
fn inner_sync() -> Result<u32, AppError> {
    Ok(10)
}

fn assert_tree(engine: &Sentinel, calls: u64) {
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    let names: Vec<&str> = default.children.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["async.outer"], "{tree:#?}");
    let mut children: Vec<(&str, u64)> =
        default.children[0].children.iter().map(|c| (c.name.as_str(), c.stats.minute_pass)).collect();
    children.sort();
    assert_eq!(children, [("async.inner_async", 2 * calls), ("async.inner_sync", calls)]);
    assert_eq!(stats(engine, "async.outer").threads, 0);
    assert_eq!(stats(engine, "async.inner_async").threads, 0);
}

#[test]
fn nested_sync_and_async_resources_form_the_call_tree_on_tokio_multi_thread() {
    let (engine, _clock) = engine();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let results = rt.block_on(async {
        // Several tasks at once, each moved between workers at its yields.
        let tasks: Vec<_> = (0..8).map(|_| tokio::spawn(engine.scoped_future(assert_send(outer())))).collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    assert!(results.iter().all(|r| *r == Ok(12)), "{results:?}");
    assert_tree(engine, 8);
    assert_eq!(stats(engine, "async.outer").minute_pass, 8);
}

#[test]
fn nested_sync_and_async_resources_form_the_call_tree_on_futures_executor() {
    let (engine, _clock) = engine();
    // tokio's yield_now needs no runtime to be polled; it only wakes the task again.
    let out = futures::executor::block_on(engine.scoped_future(outer()));
    assert_eq!(out, Ok(12));
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    assert_eq!(default.children[0].name, "async.outer");
    assert_eq!(default.children[0].children.len(), 2);
}

// ---- a nested call's block that escapes the body ------------------------------------------------------------------

#[sentinel_resource(name = "async.nested_inner")]
async fn nested_inner_async() -> Result<u32, NestedError> {
    tokio::task::yield_now().await;
    Ok(1)
}

#[sentinel_resource(name = "async.nested_inner_sync")]
fn nested_inner_sync() -> Result<u32, NestedError> {
    Ok(10)
}

// An async block handler that receives the arguments again (cloned for the fallback), in the outer call's entry.
#[sentinel_resource(name = "async.nested_outer", block_handler = nested_outer_blocked, fallback = nested_outer_failed)]
async fn nested_outer(label: String) -> Result<String, NestedError> {
    let a = nested_inner_async().await?;
    let b = nested_inner_sync()?;
    Ok(format!("{label}{}", a + b))
}

async fn nested_outer_blocked(label: String, b: BlockError) -> Result<String, NestedError> {
    tokio::task::yield_now().await;
    Ok(format!("{label} blocked by {}", b.resource()))
}

fn nested_outer_failed(_label: String, e: NestedError) -> Result<String, NestedError> {
    Err(e)
}

// With a time limit, and no handler: the block is returned as it is.
#[sentinel_resource(name = "async.nested_outer_timed", timeout_ms = 1000)]
async fn nested_outer_timed() -> Result<u32, NestedError> {
    nested_inner_async().await
}

// Without a fallback: the shared references are still at hand after the body.
#[sentinel_resource(name = "async.nested_outer_refs", block_handler = nested_refs_blocked)]
async fn nested_outer_refs(label: &str) -> Result<String, NestedError> {
    let a = nested_inner_async().await?;
    Ok(format!("{label}{a}"))
}

fn nested_refs_blocked(label: &str, b: BlockError) -> Result<String, NestedError> {
    Ok(format!("{label} blocked by {}", b.resource()))
}

#[test]
fn a_nested_block_that_escapes_an_async_body_is_a_block_of_the_outer_call_as_in_java() {
    let (engine, _clock) = engine_with_limits(&["async.nested_inner"], 0.0);
    let out = futures::executor::block_on(engine.scoped_future(nested_outer_refs("y")));
    assert_eq!(out, Ok("y blocked by async.nested_inner".to_string()));
    let s = stats(engine, "async.nested_outer_refs");
    assert_eq!((s.minute_pass, s.minute_exception), (1, 0));
    for blocked in ["async.nested_inner", "async.nested_inner_sync"] {
        let (engine, _clock) = engine_with_limits(&[blocked], 0.0);
        let out = futures::executor::block_on(engine.scoped_future(nested_outer("x".into())));
        assert_eq!(out, Ok(format!("x blocked by {blocked}")));
        let s = stats(engine, "async.nested_outer");
        assert_eq!((s.minute_pass, s.minute_block, s.minute_exception, s.minute_success), (1, 0, 0, 1), "{blocked}");
    }
    let (engine, _clock) = engine_with_limits(&["async.nested_inner"], 0.0);
    let out = futures::executor::block_on(engine.scoped_future(nested_outer_timed()));
    assert!(matches!(&out, Err(NestedError::Blocked(b)) if b.resource() == "async.nested_inner"), "{out:?}");
    let s = stats(engine, "async.nested_outer_timed");
    assert_eq!((s.minute_pass, s.minute_exception), (1, 0));
}

// ---- cancellation and panics ----------------------------------------------------------------------------------------

#[sentinel_resource(name = "async.never")]
async fn never_finishes(gate: futures::channel::oneshot::Receiver<()>) -> Result<(), AppError> {
    gate.await.map_err(|_| AppError::Timeout)?;
    inner_async().await?;
    Ok(())
}

#[test]
fn cancellation_exits_the_entry_without_an_error() {
    let (engine, _clock) = engine();
    let (_tx, rx) = futures::channel::oneshot::channel::<()>();
    let mut fut = Box::pin(engine.scoped_future(never_finishes(rx)));
    assert!((&mut fut).now_or_never().is_none()); // entered, now waiting
    assert_eq!(stats(engine, "async.never").threads, 1);
    drop(fut); // cancelled
    let s = stats(engine, "async.never");
    assert_eq!((s.threads, s.minute_pass, s.minute_exception, s.minute_success), (0, 1, 0, 1));
    // Dropping restored this thread's context.
    assert_eq!(engine.current_context(), None);
}

#[sentinel_resource(name = "async.given_up")]
async fn given_up(gate: futures::channel::oneshot::Receiver<()>) -> Result<(), AppError> {
    gate.await.map_err(|_| AppError::Timeout)
}

/// A call given up on (its future dropped) measured no round trip: an adaptive limit takes no sample of it.
#[test]
fn cancellation_gives_no_rtt_sample_to_an_adaptive_limit() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("async.given_up").algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    let mut gates = Vec::new();
    for _ in 0..5 {
        let mut calls: Vec<_> = (0..6)
            .map(|_| {
                let (tx, rx) = futures::channel::oneshot::channel::<()>();
                gates.push(tx);
                Box::pin(engine.scoped_future(given_up(rx)))
            })
            .collect();
        for c in &mut calls {
            assert!(c.as_mut().now_or_never().is_none());
        }
        clock.advance_millis(1_000);
        drop(calls);
    }
    let s = &engine.adaptive_status()[0];
    assert_eq!((s.inflight, s.limit, s.sample_rtt), (0, 10, std::time::Duration::ZERO), "{s:?}");
}

#[sentinel_resource(name = "async.waits")]
async fn signals_then_waits(
    started: futures::channel::oneshot::Sender<()>,
    gate: futures::channel::oneshot::Receiver<()>,
) -> Result<(), AppError> {
    let _ = started.send(());
    gate.await.map_err(|_| AppError::Timeout)
}

#[test]
fn cancellation_on_tokio_multi_thread_by_abort() {
    let (engine, _clock) = engine();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let (started_tx, started_rx) = futures::channel::oneshot::channel::<()>();
    let (gate_tx, gate_rx) = futures::channel::oneshot::channel::<()>();
    rt.block_on(async {
        let task = tokio::spawn(engine.scoped_future(signals_then_waits(started_tx, gate_rx)));
        started_rx.await.unwrap();
        assert_eq!(stats(engine, "async.waits").threads, 1);
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    });
    drop(gate_tx);
    let s = stats(engine, "async.waits");
    assert_eq!((s.threads, s.minute_pass, s.minute_exception), (0, 1, 0));
}

#[sentinel_resource(name = "async.panics")]
async fn panics_after_await() -> Result<(), AppError> {
    tokio::task::yield_now().await;
    panic!("async boom");
}

#[test]
fn panic_in_async_exits_the_entry_and_counts_an_exception() {
    let (engine, _clock) = engine();
    let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
        futures::executor::block_on(engine.scoped_future(panics_after_await()))
    }));
    assert!(caught.is_err());
    let s = stats(engine, "async.panics");
    assert_eq!((s.threads, s.minute_pass, s.minute_exception), (0, 1, 1));
}

// ---- queueing awaits a timer ---------------------------------------------------------------------------------------

#[sentinel_resource(name = "async.queued")]
async fn queued(step: &'static str, log: Arc<Mutex<Vec<&'static str>>>) -> Result<(), AppError> {
    log.lock().unwrap().push(step);
    Ok(())
}

/// A rate limiter of 5 per second spaces calls 200 ms apart: the second call queues. While it waits, a second
/// task on the same (single) executor thread must make progress. The assertion is about order only.
async fn queueing_scenario(log: Arc<Mutex<Vec<&'static str>>>, gate_tx: futures::channel::oneshot::Sender<()>) {
    queued("first", log.clone()).await.unwrap();
    let _ = gate_tx.send(());
    queued("second (queued)", log.clone()).await.unwrap();
}

async fn other_task(log: Arc<Mutex<Vec<&'static str>>>, gate_rx: futures::channel::oneshot::Receiver<()>) {
    let _ = gate_rx.await;
    log.lock().unwrap().push("other task");
}

fn queueing_engine() -> &'static Sentinel {
    // A real clock: queueing only waits on one.
    let engine = Sentinel::builder().build().leak();
    engine
        .load_flow_rules(vec![FlowRule::new("async.queued")
            .count(5.0)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_time_ms(5_000)])
        .unwrap();
    engine
}

#[test]
fn queueing_does_not_block_a_single_threaded_futures_executor() {
    let engine = queueing_engine();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = futures::channel::oneshot::channel();
    let mut pool = futures::executor::LocalPool::new();
    use futures::task::LocalSpawnExt;
    pool.spawner().spawn_local(engine.scoped_future(queueing_scenario(log.clone(), tx))).unwrap();
    pool.spawner().spawn_local(other_task(log.clone(), rx)).unwrap();
    pool.run();
    assert_eq!(*log.lock().unwrap(), ["first", "other task", "second (queued)"]);
    assert_eq!(stats(engine, "async.queued").minute_pass, 2);
}

#[test]
fn queueing_does_not_block_a_tokio_worker() {
    let engine = queueing_engine();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = futures::channel::oneshot::channel();
    // One worker: if the queued call blocked its thread, the other task could not run until it finished.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    rt.block_on(async {
        let a = tokio::spawn(engine.scoped_future(queueing_scenario(log.clone(), tx)));
        let b = tokio::spawn(other_task(log.clone(), rx));
        a.await.unwrap();
        b.await.unwrap();
    });
    assert_eq!(*log.lock().unwrap(), ["first", "other task", "second (queued)"]);
}

// ---- async_trait, methods, Send ----------------------------------------------------------------------------------

#[async_trait::async_trait]
trait Store {
    async fn fetch(&self, key: u64) -> Result<String, AppError>;
    async fn count(&self) -> usize;
}

struct MemStore {
    prefix: String,
}

#[async_trait::async_trait]
impl Store for MemStore {
    #[sentinel_resource(name = "async.trait.fetch", fallback = Self::fetch_fallback)]
    async fn fetch(&self, key: u64) -> Result<String, AppError> {
        inner_async().await?;
        if key == 0 {
            return Err(AppError::NotFound(0));
        }
        Ok(format!("{}{key}", self.prefix))
    }

    #[sentinel_resource(name = "async.trait.count", block_handler = Self::count_blocked)]
    async fn count(&self) -> usize {
        self.prefix.len()
    }
}

impl MemStore {
    fn fetch_fallback(&self, key: u64, e: AppError) -> Result<String, AppError> {
        Ok(format!("{}fallback{key} {e:?}", self.prefix))
    }
    async fn count_blocked(&self, _b: BlockError) -> usize {
        0
    }
}

#[test]
fn async_trait_methods_are_resources() {
    let (engine, _clock) = engine_with_limits(&["async.trait.count"], 1.0);
    let store: Arc<dyn Store + Send + Sync> = Arc::new(MemStore { prefix: "k".into() });
    let out = futures::executor::block_on(engine.scoped_future(async {
        (store.fetch(1).await, store.fetch(0).await, store.count().await, store.count().await)
    }));
    assert_eq!(out.0, Ok("k1".to_string()));
    assert_eq!(out.1, Ok("kfallback0 NotFound(0)".to_string()));
    assert_eq!((out.2, out.3), (1, 0));
    let s = stats(engine, "async.trait.fetch");
    assert_eq!((s.minute_pass, s.minute_exception, s.threads), (2, 1, 0));
    // The nested resource is below the trait method in the tree.
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    let fetch = default.children.iter().find(|c| c.name == "async.trait.fetch").unwrap();
    assert_eq!(fetch.children[0].name, "async.inner_async");
}

struct Counter {
    n: u64,
}

impl Counter {
    #[sentinel_resource(name = "async.counter.add", default_fallback = Self::add_default)]
    async fn add(&mut self, by: u64) -> Result<u64, AppError> {
        tokio::task::yield_now().await;
        self.n += by;
        Ok(self.n)
    }

    fn add_default(e: AppError) -> Result<u64, AppError> {
        Err(e)
    }
}

#[test]
fn async_methods_with_mut_self_and_send_futures() {
    let (engine, _clock) = engine();
    let mut c = Counter { n: 0 };
    let out = futures::executor::block_on(engine.scoped_future(async {
        let a = assert_send(c.add(2)).await;
        let b = assert_send(c.add(3)).await;
        (a, b)
    }));
    assert_eq!(out, (Ok(2), Ok(5)));
    drop(assert_send(get(1)));
    drop(assert_send(load(1, String::new())));
    let (_tx, rx) = futures::channel::oneshot::channel::<()>();
    drop(assert_send(never_finishes(rx)));
}

// ---- the entry's context across suspensions, without a wrapper around the call ------------------------------------
//
// An annotated `async fn` decides its entry in its first poll, in the polling thread's context, and runs its work
// (body, queueing wait, fallback) in the entry's context: untouched while the work does not suspend; from its
// first suspension on, carried in the future and installed only while the future is polled. These tests poll by
// hand (no executor, no `scoped_future` wrapper, which would carry a context itself) and move the future between
// threads at the suspension points, so each interleaving happens exactly as written.

/// Polls `fut` once on this thread, with `engine` standing in for the global one during the poll; returns what
/// the poll gave and the context this thread had right after it.
fn poll_once<F: std::future::Future + Unpin>(
    engine: &'static Sentinel,
    fut: &mut F,
) -> (std::task::Poll<F::Output>, Option<(String, String)>) {
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    engine.scoped(|| (std::pin::Pin::new(fut).poll(&mut cx), engine.current_context()))
}

/// [`poll_once`] on a new thread; gives the future back for later polls.
fn poll_elsewhere<F: std::future::Future + Unpin + Send + 'static>(
    engine: &'static Sentinel,
    mut fut: F,
) -> (std::task::Poll<F::Output>, Option<(String, String)>, F)
where
    F::Output: Send,
{
    std::thread::spawn(move || {
        let (polled, context) = poll_once(engine, &mut fut);
        (polled, context, fut)
    })
    .join()
    .unwrap()
}

/// The children of `name` in the engine's default context, with their passes.
fn children_of(engine: &Sentinel, name: &str) -> Vec<(String, u64)> {
    fn find<'t>(nodes: &'t [sentinel_runtime::TreeNode], name: &str) -> Option<&'t sentinel_runtime::TreeNode> {
        nodes.iter().find_map(|n| if n.name == name { Some(n) } else { find(&n.children, name) })
    }
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).expect("the default context");
    let node = find(&default.children, name).unwrap_or_else(|| panic!("no `{name}` in {tree:#?}"));
    let mut children: Vec<(String, u64)> =
        node.children.iter().map(|c| (c.name.clone(), c.stats.minute_pass)).collect();
    children.sort();
    children
}

#[sentinel_resource(name = "async.gated")]
async fn gated(gate: Arc<tokio::sync::Notify>) -> Result<u32, AppError> {
    gate.notified().await;
    inner_sync()
}

#[test]
fn a_body_suspended_with_its_entry_open_leaves_the_thread_clean_and_resumes_under_its_entry_on_another_thread() {
    let (engine, _clock) = engine();
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut fut = Box::pin(assert_send(gated(gate.clone())));
    let (polled, context) = poll_once(engine, &mut fut);
    assert!(polled.is_pending());
    assert_eq!(context, None, "the suspended call's entry is not left installed on the thread");
    assert_eq!(stats(engine, "async.gated").threads, 1, "entered, waiting");
    // A call made on this thread meanwhile is not nested under the suspended one.
    engine.scoped(|| drop(inner_sync()));
    gate.notify_one();
    let (polled, context, _) = poll_elsewhere(engine, fut);
    assert!(matches!(polled, std::task::Poll::Ready(Ok(10))), "{polled:?}");
    assert_eq!(context, None, "the other thread is left as it was");
    // One node per resource and context (Java's `DefaultNode`): the call made meanwhile sits at the top of the
    // default context, the nested one under the suspended call; the node counts both.
    let tree = engine.tree();
    let default = tree.iter().find(|t| t.name == DEFAULT_CONTEXT_NAME).unwrap();
    let mut top: Vec<&str> = default.children.iter().map(|c| c.name.as_str()).collect();
    top.sort();
    assert_eq!(top, ["async.gated", "async.inner_sync"], "{tree:#?}");
    assert_eq!(children_of(engine, "async.gated"), [("async.inner_sync".to_string(), 2)]);
    let s = stats(engine, "async.gated");
    assert_eq!((s.threads, s.minute_pass, s.minute_success, s.minute_exception), (0, 1, 1, 0));
    assert_eq!(engine.current_context(), None);
}

#[sentinel_resource(name = "async.gated_fails", fallback = gated_fallback)]
async fn gated_fails(gate: Arc<tokio::sync::Notify>) -> Result<u32, AppError> {
    gate.notified().await;
    Err(AppError::NotFound(1))
}

async fn gated_fallback(gate: Arc<tokio::sync::Notify>, _e: AppError) -> Result<u32, AppError> {
    // Suspends once more, then calls a resource: still under the failed call's entry.
    gate.notified().await;
    inner_sync().map(|v| v + 100)
}

#[test]
fn a_fallback_after_a_suspended_body_runs_under_the_entry_on_whichever_thread_polls() {
    let (engine, _clock) = engine();
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut fut = Box::pin(assert_send(gated_fails(gate.clone())));
    assert!(poll_once(engine, &mut fut).0.is_pending());
    gate.notify_one();
    let (polled, context, fut) = poll_elsewhere(engine, fut);
    assert!(polled.is_pending(), "the fallback waits");
    assert_eq!(context, None);
    let mut fut = fut;
    gate.notify_one();
    let (polled, context) = poll_once(engine, &mut fut);
    assert!(matches!(polled, std::task::Poll::Ready(Ok(110))), "{polled:?}");
    assert_eq!(context, None);
    assert_eq!(children_of(engine, "async.gated_fails"), [("async.inner_sync".to_string(), 1)]);
    let s = stats(engine, "async.gated_fails");
    assert_eq!((s.threads, s.minute_pass, s.minute_exception), (0, 1, 1));
}

#[sentinel_resource(name = "async.gated_outer")]
async fn gated_outer(gate: Arc<tokio::sync::Notify>) -> Result<u32, AppError> {
    gated(gate).await
}

#[test]
fn a_call_dropped_while_a_nested_call_is_suspended_exits_both_and_leaves_every_thread_clean() {
    let (engine, _clock) = engine();
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut fut = Box::pin(assert_send(gated_outer(gate)));
    let (polled, context) = poll_once(engine, &mut fut);
    assert!(polled.is_pending());
    assert_eq!(context, None);
    assert_eq!((stats(engine, "async.gated_outer").threads, stats(engine, "async.gated").threads), (1, 1));
    // Dropped on another thread, with a context of its own active there: the nested entry exits under the outer
    // one, and that thread's context is as it was.
    std::thread::spawn(move || {
        let _ctx = engine.enter_context("elsewhere", "").unwrap();
        drop(fut);
        assert_eq!(engine.current_context(), Some(("elsewhere".to_string(), String::new())));
    })
    .join()
    .unwrap();
    for name in ["async.gated_outer", "async.gated"] {
        let s = stats(engine, name);
        assert_eq!((s.threads, s.minute_pass, s.minute_success, s.minute_exception), (0, 1, 1, 0), "{name}");
    }
    assert_eq!(children_of(engine, "async.gated_outer"), [("async.gated".to_string(), 1)]);
    assert_eq!(engine.current_context(), None);
}

#[sentinel_resource(name = "async.gated_panics")]
async fn gated_panics(gate: Arc<tokio::sync::Notify>) -> Result<u32, AppError> {
    gate.notified().await;
    let _nested = inner_sync();
    panic!("the body panics in its second poll");
}

#[test]
fn a_body_that_panics_in_a_later_poll_leaves_the_polling_thread_clean() {
    let (engine, _clock) = engine();
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut fut = Box::pin(assert_send(gated_panics(gate.clone())));
    assert!(poll_once(engine, &mut fut).0.is_pending());
    gate.notify_one();
    let caught = std::thread::spawn(move || {
        let _ctx = engine.enter_context("elsewhere", "").unwrap();
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| poll_once(engine, &mut fut))).is_err();
        let context = engine.current_context();
        drop(fut);
        (caught, context)
    })
    .join()
    .unwrap();
    assert_eq!(caught, (true, Some(("elsewhere".to_string(), String::new()))));
    let s = stats(engine, "async.gated_panics");
    assert_eq!((s.threads, s.minute_pass, s.minute_exception), (0, 1, 1));
    assert_eq!(stats(engine, "async.inner_sync").threads, 0);
}

#[sentinel_resource(name = "async.waits_for_a_place", block_handler = waited_blocked)]
async fn waits_for_a_place(gate: Arc<tokio::sync::Notify>) -> Result<(Option<(String, String)>, u32), AppError> {
    // What the call's entry sees: its context and origin.
    let seen = Sentinel::current().current_context();
    gate.notified().await;
    Ok((seen, inner_sync()?))
}

fn waited_blocked(
    _gate: Arc<tokio::sync::Notify>,
    _b: BlockError,
) -> Result<(Option<(String, String)>, u32), AppError> {
    Ok((Sentinel::current().current_context(), 0))
}

#[test]
fn a_call_that_waits_for_a_place_is_decided_again_in_the_context_it_was_called_in_on_whichever_thread_polls() {
    use sentinel_runtime::adaptive::AdaptiveRule;
    let (engine, clock) = engine();
    engine
        .load_adaptive_rules([AdaptiveRule::new("async.waits_for_a_place").limits(1, 1, 1).max_wait_ms(500)])
        .unwrap();
    let gate = Arc::new(tokio::sync::Notify::new());
    // The only place.
    let holder = engine.resource("async.waits_for_a_place").entry_owned().enter().unwrap();
    // Called in a context with an origin; the place is taken, so the call waits (suspended, no entry yet).
    let fut = {
        let _ctx = engine.enter_context("checkout", "app-a").unwrap();
        let mut fut = Box::pin(assert_send(waits_for_a_place(gate.clone())));
        let (polled, context) = poll_once(engine, &mut fut);
        assert!(polled.is_pending());
        assert_eq!(context, Some(("checkout".to_string(), "app-a".to_string())), "the caller's context is as it was");
        fut
    };
    assert_eq!(engine.current_context(), None);
    // The place frees: the waiting call gets it. Resumed on another thread with no context, it is decided again
    // in the context it was called in.
    drop(holder);
    let (polled, context, fut) = poll_elsewhere(engine, fut);
    assert!(polled.is_pending(), "admitted, the body waits at its gate");
    assert_eq!(context, None, "the other thread is left without a context");
    gate.notify_one();
    let mut fut = fut;
    let (polled, _) = poll_once(engine, &mut fut);
    let std::task::Poll::Ready(Ok((seen, nested))) = polled else { panic!("{polled:?}") };
    assert_eq!(seen, Some(("checkout".to_string(), "app-a".to_string())));
    assert_eq!(nested, 10);
    let entrance = engine.tree().into_iter().find(|t| t.name == "checkout").expect("the caller's context");
    assert_eq!(entrance.children[0].name, "async.waits_for_a_place");
    assert_eq!(entrance.children[0].children[0].name, "async.inner_sync");

    // A call that waits and is refused when its wait runs out: its block handler runs in the caller's context.
    let holder = engine.resource("async.waits_for_a_place").entry_owned().enter().unwrap();
    let fut = {
        let _ctx = engine.enter_context("checkout", "app-a").unwrap();
        let mut fut = Box::pin(assert_send(waits_for_a_place(gate.clone())));
        assert!(poll_once(engine, &mut fut).0.is_pending());
        fut
    };
    clock.advance_millis(500);
    let (polled, context, _) = poll_elsewhere(engine, fut);
    let std::task::Poll::Ready(Ok((seen, 0))) = polled else { panic!("{polled:?}") };
    assert_eq!(seen, Some(("checkout".to_string(), "app-a".to_string())), "the handler's context");
    assert_eq!(context, None);
    drop(holder);
}

#[sentinel_resource(name = "async.gated_fails_sync_fallback", fallback = sync_fallback)]
async fn gated_fails_sync_fallback(gate: Arc<tokio::sync::Notify>) -> Result<u32, AppError> {
    gate.notified().await;
    Err(AppError::NotFound(2))
}

// A sync fallback: called (not only awaited) in the entry's context.
fn sync_fallback(_gate: Arc<tokio::sync::Notify>, _e: AppError) -> Result<u32, AppError> {
    inner_sync().map(|v| v + 200)
}

#[test]
fn a_sync_fallback_after_a_suspended_body_is_called_under_the_entry_on_another_thread() {
    let (engine, _clock) = engine();
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut fut = Box::pin(assert_send(gated_fails_sync_fallback(gate.clone())));
    assert!(poll_once(engine, &mut fut).0.is_pending());
    gate.notify_one();
    let (polled, context, _) = poll_elsewhere(engine, fut);
    assert!(matches!(polled, std::task::Poll::Ready(Ok(210))), "{polled:?}");
    assert_eq!(context, None);
    assert_eq!(children_of(engine, "async.gated_fails_sync_fallback"), [("async.inner_sync".to_string(), 1)]);
}

// ---- the size of the call's future -------------------------------------------------------------------------------

async fn sized_plain(id: u64) -> Result<u64, AppError> {
    futures::future::ready(()).await;
    Ok(id)
}

#[sentinel_resource(name = "async.sized", block_handler = sized_blocked)]
async fn sized(id: u64) -> Result<u64, AppError> {
    futures::future::ready(()).await;
    Ok(id)
}

fn sized_blocked(_id: u64, _b: BlockError) -> Result<u64, AppError> {
    Ok(0)
}

async fn sized_large_plain(id: u64) -> Result<u64, AppError> {
    let buf = [id as u8; 1000];
    futures::future::ready(()).await;
    Ok(id + u64::from(buf[id as usize % 1000]))
}

#[sentinel_resource(name = "async.sized_large", block_handler = sized_blocked)]
async fn sized_large(id: u64) -> Result<u64, AppError> {
    let buf = [id as u8; 1000];
    futures::future::ready(()).await;
    Ok(id + u64::from(buf[id as usize % 1000]))
}

async fn sized_fallback(id: u64, _e: AppError) -> Result<u64, AppError> {
    futures::future::ready(()).await;
    Ok(id)
}

#[sentinel_resource(name = "async.sized_fallback", block_handler = sized_blocked, fallback = sized_fallback)]
async fn sized_with_fallback(id: u64) -> Result<u64, AppError> {
    futures::future::ready(()).await;
    Ok(id)
}

#[test]
fn an_annotated_async_fns_future_holds_its_work_its_entry_and_the_context_it_may_carry_and_no_more() {
    // Beyond what the plain fn's future holds: the entry, the context the call carries once its work
    // suspends (56 bytes), the work's references and the state's tag. The rare paths (a refusal, a wait) keep
    // no more room than a refusal: a wait's machinery is boxed, and the first decision is not kept.
    let room = std::mem::size_of::<sentinel_runtime::Entry<'static>>() + 128;
    let (plain, annotated) = (std::mem::size_of_val(&sized_plain(1)), std::mem::size_of_val(&sized(1)));
    assert!(annotated <= plain + room, "{annotated} bytes against {plain} for the plain fn");
    let (plain, annotated) = (std::mem::size_of_val(&sized_large_plain(1)), std::mem::size_of_val(&sized_large(1)));
    assert!(annotated <= plain + room, "{annotated} bytes against {plain} for the plain fn");
    // With an async fallback, its future besides (the body's and the fallback's are never both alive).
    let fallback = std::mem::size_of_val(&sized_fallback(1, AppError::Timeout));
    let annotated = std::mem::size_of_val(&sized_with_fallback(1));
    assert!(annotated <= std::mem::size_of_val(&sized_plain(1)) + fallback + room, "{annotated} bytes");

    // And the calls still pass, block (to the handler) and fall back as before.
    let (engine, _clock) = engine_with_limits(&["async.sized", "async.sized_large", "async.sized_fallback"], 1.0);
    engine.scoped(|| {
        futures::executor::block_on(async {
            assert_eq!(sized(7).await.unwrap(), 7);
            assert_eq!(sized(7).await.unwrap(), 0, "the second call in the second is refused");
            assert_eq!(sized_large(3).await.unwrap(), 6);
            assert_eq!(sized_with_fallback(5).await.unwrap(), 5);
        })
    });
}

#[sentinel_resource(name = "async.waits_then_returns")]
async fn waits_then_returns() -> Result<(), AppError> {
    Ok(())
}

#[test]
fn a_call_decided_after_a_wait_and_completed_elsewhere_leaves_the_callers_thread_in_its_own_entries() {
    // The call waits for a place (no entry yet), carrying the context it was called in; it is decided in that
    // carried context on another thread and completes there. Meanwhile the calling thread went deeper into
    // entries of its own in the same context: the call's exit must not unwind them.
    use sentinel_runtime::adaptive::AdaptiveRule;
    let (engine, _clock) = engine();
    engine
        .load_adaptive_rules([AdaptiveRule::new("async.waits_then_returns").limits(1, 1, 1).max_wait_ms(500)])
        .unwrap();
    let holder = engine.resource("async.waits_then_returns").entry_owned().enter().unwrap();
    let (o, x, x2, y) = (engine.resource("o"), engine.resource("x"), engine.resource("x2"), engine.resource("y"));
    let _ctx = engine.enter_context("checkout", "app-a").unwrap();
    let outer = o.enter().unwrap();
    let mut fut = Box::pin(assert_send(waits_then_returns()));
    assert!(poll_once(engine, &mut fut).0.is_pending(), "waits for the place");
    drop(holder);
    let (ex, ex2) = (x.enter().unwrap(), x2.enter().unwrap());
    let (polled, _, _) = poll_elsewhere(engine, fut);
    assert!(matches!(polled, std::task::Poll::Ready(Ok(()))), "{polled:?}");
    let ey = y.enter().unwrap();
    drop((ey, ex2, ex, outer));
    let checkout = engine.tree().into_iter().find(|t| t.name == "checkout").unwrap();
    let o_node = checkout.children.iter().find(|n| n.name == "o").unwrap();
    let x_node = o_node.children.iter().find(|n| n.name == "x").unwrap();
    let x2_node = x_node.children.iter().find(|n| n.name == "x2").unwrap();
    assert_eq!(x2_node.children.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["y"], "{checkout:?}");
}
