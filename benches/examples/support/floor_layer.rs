//! The `floor` variant of the web layer's benchmarks: a layer written by hand that does, per request, only
//! what an inbound Sentinel entry with one flow rule must do, through the public statistics API
//! (`StatNode`), with nothing a real layer needs besides (no rules to read, no engine, no names, no
//! configuration):
//!
//! - the route's resource: axum's `MatchedPath` read from the request and its text compared by address with
//!   the route this service remembers (no hashing);
//! - two clock readings (the call's start and end: its response time);
//! - one compare-and-swap standing for the flow rule's exact pass counter;
//! - a pass, then a completion (response time, success or error from the status) on two nodes: the
//!   resource's and the global inbound node (per thread, merged when read: no locked instruction);
//! - the request's context: a thread-local word set while the handler runs (its `call` and each poll), so
//!   that entries the handler makes nest under the request's.
//!
//! What `SentinelLayer` costs over this is what it does besides: rules read in a read section and checked,
//! the context's call tree, origins, the entry its future holds, the layer's options.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use http::{Request, Response};
use sentinel_runtime::clock::{Clock, SystemClock};
use sentinel_runtime::stat::StatNode;
use tower::{Layer, Service};

/// What every request of the layer records into, shared by its services (leaked: no reference count a
/// request).
struct Floor {
    clock: SystemClock,
    resource: StatNode,
    inbound: StatNode,
    /// The flow rule's exact pass counter.
    passed: AtomicU64,
    /// The address of the remembered route's text (0 before the first request).
    route_at: AtomicUsize,
}

thread_local! {
    /// The request whose handler runs on this thread (its start time; 0 for none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f` as the request that started at `start`, then puts the outer one back.
#[inline(always)]
fn as_request<R>(start: u64, f: impl FnOnce() -> R) -> R {
    let outer = CURRENT.with(|c| c.replace(start));
    let r = f();
    CURRENT.with(|c| c.set(outer));
    r
}

/// The layer (see the module's docs).
#[derive(Clone, Copy)]
pub struct FloorLayer {
    floor: &'static Floor,
}

impl FloorLayer {
    /// A layer with fresh statistics.
    pub fn new() -> Self {
        let floor = Floor {
            clock: SystemClock::new(),
            resource: StatNode::new(),
            inbound: StatNode::new(),
            passed: AtomicU64::new(0),
            route_at: AtomicUsize::new(0),
        };
        FloorLayer { floor: Box::leak(Box::new(floor)) }
    }
}

impl<S> Layer<S> for FloorLayer {
    type Service = FloorService<S>;
    fn layer(&self, inner: S) -> FloorService<S> {
        FloorService { inner, floor: self.floor }
    }
}

/// The layer's service.
#[derive(Clone)]
pub struct FloorService<S> {
    inner: S,
    floor: &'static Floor,
}

impl<S, B, ResBody> Service<Request<B>> for FloorService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Future: Unpin,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = FloorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let floor = self.floor;
        let at = req.extensions().get::<MatchedPath>().map_or(0, |r| r.as_str().as_ptr() as usize);
        if floor.route_at.load(Ordering::Relaxed) != at {
            // The first request of the route (a real layer would name its resource here, once).
            floor.route_at.store(at, Ordering::Relaxed);
        }
        let start = floor.clock.now_nanos();
        let ms = start / 1_000_000;
        let p = floor.passed.load(Ordering::Relaxed);
        let admitted = floor.passed.compare_exchange(p, p + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok();
        std::hint::black_box(admitted);
        floor.resource.on_pass(ms, 1);
        floor.inbound.on_pass(ms, 1);
        let future = as_request(start, || self.inner.call(req));
        FloorFuture { future, start, floor }
    }
}

/// The layer's response future: polls the service's as the request, records the completion.
pub struct FloorFuture<F> {
    future: F,
    start: u64,
    floor: &'static Floor,
}

impl<F, ResBody, E> Future for FloorFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let polled = as_request(this.start, || Pin::new(&mut this.future).poll(cx));
        let Poll::Ready(result) = polled else { return Poll::Pending };
        let floor = this.floor;
        let end = floor.clock.now_nanos();
        let rt_micros = end.saturating_sub(this.start) / 1000;
        let error = result.as_ref().map_or(true, |r| r.status().is_server_error());
        floor.resource.on_complete(end / 1_000_000, rt_micros, 1, error);
        floor.inbound.on_complete(end / 1_000_000, rt_micros, 1, error);
        Poll::Ready(result)
    }
}
