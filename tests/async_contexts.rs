//! Entries in async code on tokio (issue 10 §3): tasks migrate between workers and interleave on one thread;
//! no task sees another task's context or origin, and every entry exits exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::flow::{FlowGrade, FlowRule};
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// 1000 `evil` requests hold an `enter_async` entry across awaits while 1000 origin-less requests to a
/// black-listed resource run on the same workers: none of those is blocked or sees an origin.
fn tasks_holding_async_entries_leak_no_origin(rt: tokio::runtime::Runtime) {
    let engine = Sentinel::builder().build();
    engine.load_authority_rules([AuthorityRule::new("api", "evil", AuthorityStrategy::Black)]).unwrap();
    let (other, api) = (engine.resource("other"), engine.resource("api"));
    let leaked = Arc::new(AtomicUsize::new(0));
    let blocked = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..2000 {
            let (other, api, leaked, blocked) = (other.clone(), api.clone(), leaked.clone(), blocked.clone());
            tasks.push(tokio::spawn(async move {
                if i % 2 == 0 {
                    let e = other.entry_owned().origin("evil").enter_async().await.unwrap();
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    drop(e);
                } else {
                    tokio::task::yield_now().await;
                    match api.enter() {
                        Ok(e) if !e.origin().is_empty() => {
                            leaked.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            blocked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!((leaked.load(Ordering::Relaxed), blocked.load(Ordering::Relaxed)), (0, 0));
    assert_eq!(engine.cluster_stats("other").unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("other").unwrap().pass_qps, 1000.0);
}

#[test]
fn async_entries_of_1000_migrating_tasks_leak_no_origin_on_a_multi_thread_runtime() {
    tasks_holding_async_entries_leak_no_origin(multi_thread());
}

#[test]
fn async_entries_of_1000_interleaved_tasks_leak_no_origin_on_a_current_thread_runtime() {
    tasks_holding_async_entries_leak_no_origin(current_thread());
}

/// Owned entries entered synchronously inside tasks and held across awaits (the middleware pattern): the
/// worker's context stays clean between polls.
#[test]
fn owned_entries_held_across_awaits_leave_the_workers_clean() {
    let engine = Sentinel::builder().build();
    engine.load_authority_rules([AuthorityRule::new("api", "evil", AuthorityStrategy::Black)]).unwrap();
    let (other, api) = (engine.resource("other"), engine.resource("api"));
    let blocked = Arc::new(AtomicUsize::new(0));
    current_thread().block_on(async {
        let mut tasks = Vec::new();
        for i in 0..1000 {
            let (other, api, blocked) = (other.clone(), api.clone(), blocked.clone());
            tasks.push(tokio::spawn(async move {
                if i % 2 == 0 {
                    let e = other.entry_owned().origin("evil").enter().unwrap();
                    tokio::task::yield_now().await;
                    drop(e);
                } else if api.enter().is_err() {
                    blocked.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(blocked.load(Ordering::Relaxed), 0);
}

/// `instrument` carries the request's entry into its handler across awaits and workers: resources the
/// handler enters see the request's origin, and no other task does.
#[test]
fn instrumented_handlers_see_their_own_requests_origin_on_a_multi_thread_runtime() {
    let engine = Sentinel::builder().build();
    let (route, db) = (engine.resource("GET:/orders/{id}"), engine.resource("db"));
    let wrong = Arc::new(AtomicUsize::new(0));
    multi_thread().block_on(async {
        let mut tasks = Vec::new();
        for i in 0..1000usize {
            let (route, db, wrong) = (route.clone(), db.clone(), wrong.clone());
            tasks.push(tokio::spawn(async move {
                let origin = format!("client-{}", i % 7);
                let request = route.entry_owned().origin(&origin).enter_async().await.unwrap();
                let handler = async {
                    tokio::task::yield_now().await;
                    let e = db.enter().unwrap();
                    let seen = e.origin().to_string();
                    tokio::task::yield_now().await;
                    drop(e);
                    seen
                };
                let (seen, entry) = request.instrument(handler).await;
                if seen != origin {
                    wrong.fetch_add(1, Ordering::Relaxed);
                }
                drop(entry);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(wrong.load(Ordering::Relaxed), 0);
    assert_eq!(engine.cluster_stats("db").unwrap().threads, 0);
    assert_eq!(engine.cluster_stats("GET:/orders/{id}").unwrap().threads, 0);
}

#[sentinel_resource(name = "async_contexts.slow", origin = "appA")]
async fn slow() -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

#[sentinel_resource(name = "async_contexts.panics")]
async fn panics(n: u64) -> Result<(), AppError> {
    tokio::task::yield_now().await;
    if n.is_multiple_of(2) {
        panic!("body panics");
    }
    Ok(())
}

/// The macro's async path: cancelled and panicking bodies on a multi-thread runtime leave nothing in flight
/// and no origin behind.
#[test]
fn annotated_async_fns_cancelled_or_panicking_on_a_multi_thread_runtime_leave_nothing_behind() {
    std::panic::set_hook(Box::new(|_| {}));
    let engine = Sentinel::builder().build().leak();
    engine.load_flow_rules([FlowRule::new("async_contexts.slow").grade(FlowGrade::Thread).count(1000.0)]).unwrap();
    let leaked = Arc::new(AtomicUsize::new(0));
    multi_thread().block_on(async {
        let mut tasks = Vec::new();
        for i in 0..300u64 {
            let leaked = leaked.clone();
            tasks.push(tokio::spawn(engine.scoped_future(async move {
                match i % 3 {
                    0 => {
                        let _ = tokio::time::timeout(Duration::from_millis(1), slow()).await;
                    }
                    1 => {
                        let _ = tokio::spawn(engine.scoped_future(panics(i))).await;
                    }
                    _ => {
                        tokio::task::yield_now().await;
                        let e = engine.enter("async_contexts.check").unwrap();
                        if !e.origin().is_empty() {
                            leaked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let in_flight = |r: &str| engine.cluster_stats(r).map_or(0, |s| s.threads);
    assert_eq!(
        (in_flight("async_contexts.slow"), in_flight("async_contexts.panics"), leaked.load(Ordering::Relaxed)),
        (0, 0, 0)
    );
}
