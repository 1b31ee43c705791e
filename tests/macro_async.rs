//! Behaviour of `#[sentinel_resource]` on `async fn`s: dispatch with sync and async handlers, the context carried
//! across `.await` (call trees on one thread and across worker threads), cancellation and panics leave no thread
//! counted, queueing awaits a timer instead of blocking the executor, `#[async_trait]` methods, `Send` futures.

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use common::{engine, engine_with_limits, stats, AppError};
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
