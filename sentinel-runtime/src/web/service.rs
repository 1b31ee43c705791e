//! [`SentinelService`]: enters the request's resource, then calls the wrapped service.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::body::{BodyMode, Wrapped};
use super::config::{LayerConfig, LayerState};
use super::extract::ValueFn;
use super::future::{Guard, ResponseFuture};
use super::gateway::enter::enter_all as gateway_enter;
use super::naming::RouteMemo;
use super::rate_limit;
use super::refused::{blocked_response, Queued, Refused};
use super::request::RequestView;
use super::scope::{Extras, RequestEntry};
use crate::param_flow::HotParam;
use crate::stat::stripe::{Spread, SpreadRef};
use crate::{Entry, EntryType, Resource};

/// The service made by [`SentinelLayer`](super::SentinelLayer): each request enters an inbound resource
/// before the wrapped service sees it. Cheap to clone (the configuration is shared). `M`: the layer's
/// [`BodyMode`].
pub struct SentinelService<S, M = Wrapped> {
    inner: S,
    state: Handle,
    mode: PhantomData<fn() -> M>,
}

/// What the clones of one service share: the layer's state, and the routes this service saw.
struct ServiceState {
    layer: Arc<LayerState>,
    memo: RouteMemo,
}

/// How a service keeps what its clones share. A server clones the service it was given for each request (axum's
/// routes do) or connection, on every worker thread: the service the layer made holds the state with a
/// reference per statistics stripe for its clones ([`Spread`]), so that each worker counts on its own, and a
/// clone holds one such reference (a clone of a clone, the same one).
enum Handle {
    Made(Box<Spread<ServiceState>>),
    Cloned(Arc<SpreadRef<ServiceState>>),
}

impl Handle {
    #[inline(always)]
    fn get(&self) -> &ServiceState {
        match self {
            Handle::Made(spread) => spread.get(),
            Handle::Cloned(state) => state,
        }
    }
}

impl Clone for Handle {
    #[inline]
    fn clone(&self) -> Self {
        match self {
            Handle::Made(spread) => Handle::Cloned(spread.share()),
            Handle::Cloned(state) => Handle::Cloned(state.clone()),
        }
    }
}

impl<S, M> SentinelService<S, M> {
    pub(crate) fn new(inner: S, layer: Arc<LayerState>) -> Self {
        let state = Handle::Made(Box::new(Spread::new(ServiceState { layer, memo: RouteMemo::default() })));
        SentinelService { inner, state, mode: PhantomData }
    }
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, M> Clone for SentinelService<S, M> {
    fn clone(&self) -> Self {
        SentinelService { inner: self.inner.clone(), state: self.state.clone(), mode: PhantomData }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for SentinelService<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelService").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, M, ReqBody, ResBody> Service<Request<ReqBody>> for SentinelService<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: 'static,
    ResBody: Body<Data = Bytes>,
    M: BodyMode<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, M>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let state = self.state.get();
        let config = &state.layer.config;
        let view = RequestView::new(&req);
        let grpc = view.is_grpc();
        let mut extras = Extras::default();
        // Matched at once (no intermediate decision to move the entry through).
        match enter(state, &view, grpc, &mut extras) {
            None => ResponseFuture::unguarded(self.inner.call(req)),
            Some(Err(Refused::Blocked(blocked))) => {
                ResponseFuture::blocked(Box::new(blocked_response(config, &blocked, &view, grpc)))
            }
            Some(Err(Refused::Queued(queued))) => {
                // As for a queueing wait: the ready service is taken, a clone left in its place.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::queued(queued.into_admission(state.layer.clone(), grpc), grpc, ready, req)
            }
            Some(Ok(entry)) if !entry.waits() && !extras.waits() => {
                ResponseFuture::calling(&mut self.inner, req, entry, extras, grpc, config)
            }
            Some(Ok(entry)) => {
                // The call runs after the wait: take the service that is ready and leave a clone in its place
                // (a clone of a ready service may not be ready itself).
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let mut entry = RequestEntry::with(entry, extras);
                let sleep = config.engine.sleep(entry.wait());
                ResponseFuture::waiting(sleep, ready, req, Guard::new(entry, grpc, config))
            }
        }
    }
}

/// Names the request's resource and runs its checks: `None` when no resource guards the request. The route's
/// entry comes back alone (128 bytes, moved in registers); what only some layers have (API groups' entries,
/// RateLimit header fields) goes to `extras`.
#[inline(always)]
fn enter(
    state: &ServiceState,
    view: &RequestView<'_>,
    grpc: bool,
    extras: &mut Extras,
) -> Option<Result<Entry<'static>, Refused>> {
    let layer = &*state.layer;
    let config = &layer.config;
    let memo = Some(&state.memo);
    if layer.plain {
        // No per-request option: the resource's owned inbound entry, as below without the options (inlined, so
        // the entry is written where the caller keeps it rather than copied out of a call).
        return layer.cache.with_resource(
            &config.naming,
            &config.engine,
            view,
            grpc,
            memo,
            #[inline(always)]
            |resource| {
                let decided = resource.entry_owned().entry_type(EntryType::In).decide_or_queue();
                match decided {
                    Err(queue) => Err(queued(resource, queue.start())),
                    Ok(entry) => entry.map_err(Refused::Blocked),
                }
            },
        );
    }
    layer.cache.with_resource(&config.naming, &config.engine, view, grpc, memo, |resource| {
        let origin = config.origin.as_ref().and_then(|f| f(view));
        let prioritized = config.prioritized.as_ref().is_some_and(|f| f(view));
        let headers = config.rate_limit.filter(|h| h.applies(grpc));
        let fields = RefCell::new(headers.map(|h| h.passed_fields()));
        let passed = |resource: &Resource, args: &[&dyn HotParam]| {
            if let Some(fields) = &mut *fields.borrow_mut() {
                rate_limit::passed(resource, args, config.engine.shared.now_ms(), fields);
            }
        };
        let enter_one = |resource: &Resource, args: &[&dyn HotParam]| {
            let entry = entry_builder(resource, args, config, origin.as_deref(), prioritized).decide();
            if entry.is_ok() {
                passed(resource, args);
            }
            entry
        };
        let entered = match &config.gateway {
            // One resource: a check may ask the call to wait (an adaptive rule's `maxWaitMs`, a cluster
            // lease); it is decided again after the wait, with the hot-parameter values taken again, owned.
            None => with_params(&config.params, view, |args| {
                let builder = entry_builder(resource, args, config, origin.as_deref(), prioritized);
                match builder.decide_or_queue_with_args() {
                    Err(queue) => {
                        let owned: Vec<Option<String>> =
                            config.params.iter().map(|p| p(view).map(Cow::into_owned)).collect();
                        // The values again for the RateLimit fields of the decision after the wait.
                        let kept = if headers.is_some() { owned.clone() } else { Vec::new() };
                        let waiting = queue.start_with_args(owned);
                        Err(Refused::Queued(Queued { waiting, resource: resource.clone(), args: kept }))
                    }
                    Ok(entry) => {
                        if entry.is_ok() {
                            passed(resource, args);
                        }
                        entry.map_err(Refused::Blocked)
                    }
                }
            }),
            Some(mode) => gateway_enter(mode, &config.engine, resource, view, enter_one)
                .map(|(route, apis)| {
                    extras.set_apis(apis);
                    route
                })
                .map_err(Refused::Blocked),
        };
        if let (Ok(_), Some(fields)) = (&entered, fields.into_inner()) {
            extras.set_headers(fields.finish());
        }
        entered
    })
}

/// A request that a check asked to wait for `resource`, its wait under way.
fn queued(resource: &Resource, waiting: crate::entry::QueuedEntry<'static>) -> Refused {
    Refused::Queued(Queued { waiting, resource: resource.clone(), args: Vec::new() })
}

/// The entry of one of the request's resources, with the layer's context, the request's origin and priority.
#[inline(always)]
fn entry_builder<'b>(
    resource: &Resource,
    args: &'b [&'b dyn HotParam],
    config: &'b LayerConfig,
    origin: Option<&'b str>,
    prioritized: bool,
) -> crate::EntryBuilder<'static, 'b> {
    let builder = resource.entry_owned().entry_type(EntryType::In).args(args).prioritized(prioritized);
    let builder = match config.context.as_deref() {
        Some(name) => builder.context(name),
        None => builder,
    };
    match origin {
        Some(o) => builder.origin(o),
        None => builder,
    }
}

/// Hot parameters kept on the stack up to this many.
const INLINE_PARAMS: usize = 8;

/// Runs `f` with the request's hot-parameter values, in the order the layer's extractors were added. Inlined
/// for none and one (no copy of the entry `f` returns); more take [`with_many_params`].
#[inline(always)]
fn with_params<R>(params: &[ValueFn], view: &RequestView<'_>, f: impl FnOnce(&[&dyn HotParam]) -> R) -> R {
    match params {
        [] => f(&[]),
        // The common case, without filling (and dropping) the inline array.
        [one] => f(&[&one(view) as &dyn HotParam]),
        _ => with_many_params(params, view, f),
    }
}

#[inline(never)]
fn with_many_params<R>(params: &[ValueFn], view: &RequestView<'_>, f: impl FnOnce(&[&dyn HotParam]) -> R) -> R {
    if params.len() <= INLINE_PARAMS {
        let values: [Option<Cow<'_, str>>; INLINE_PARAMS] =
            std::array::from_fn(|i| params.get(i).and_then(|p| p(view)));
        let refs: [&dyn HotParam; INLINE_PARAMS] = std::array::from_fn(|i| &values[i] as &dyn HotParam);
        return f(&refs[..params.len()]);
    }
    let values: Vec<Option<Cow<'_, str>>> = params.iter().map(|p| p(view)).collect();
    let refs: Vec<&dyn HotParam> = values.iter().map(|v| v as &dyn HotParam).collect();
    f(&refs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowRule;
    use crate::stat::stripe::lease;
    use crate::web::SentinelLayer;
    use crate::Sentinel;
    use futures::FutureExt;
    use http_body_util::Full;
    use std::convert::Infallible;
    use tower_layer::Layer;

    type Hello = Response<Full<Bytes>>;

    fn hello(_: Request<()>) -> std::future::Ready<Result<Hello, Infallible>> {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
    }

    fn status<S, B>(svc: &mut S) -> u16
    where
        S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    {
        let req = Request::get("/hello").body(()).unwrap();
        svc.call(req).now_or_never().expect("answered at once").unwrap().status().as_u16()
    }

    /// The state of the service the layer made.
    fn spread<S, M>(svc: &SentinelService<S, M>) -> &Spread<ServiceState> {
        match &svc.state {
            Handle::Made(spread) => spread,
            Handle::Cloned(_) => panic!("the layer makes the service that holds the state"),
        }
    }

    #[test]
    fn clones_of_the_service_the_layer_made_count_on_their_threads_reference() {
        let engine = Sentinel::builder().build();
        let svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
        let clones: Vec<_> = (0..3).map(|_| svc.clone()).collect();
        let again = clones[0].clone();
        let count = spread(&svc).shared_count();
        if lease().exclusive {
            assert_eq!(count, 1, "the shared reference is the made service's alone");
        } else {
            // The made service's, the three clones' and the clone of a clone's.
            assert_eq!(count, 5, "a thread without a stripe counts on the shared reference");
        }
        drop((clones, again));
        assert_eq!(spread(&svc).shared_count(), 1);
    }

    #[test]
    fn clones_serve_and_keep_the_state_after_the_service_the_layer_made_is_gone() {
        // A manual clock: the four requests fall in one second, whatever the machine's speed.
        let engine = Sentinel::builder().manual_clock(crate::clock::ManualClock::at_millis(1_700_000_000_000)).build();
        engine.load_flow_rules([FlowRule::new("GET:/hello").count(1.0)]).unwrap();
        let svc = SentinelLayer::new(&engine).layer(tower::service_fn(hello));
        let state = Arc::downgrade(spread(&svc).get());
        // Clones made on this thread and on others (each thread that owns a stripe counts on its own).
        let mut clones = vec![svc.clone()];
        clones.extend(std::thread::scope(|s| {
            let threads: Vec<_> = (0..3).map(|_| s.spawn(|| svc.clone())).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
        }));
        drop(svc);
        // The first request passes, the rule blocks the others: every clone still reads the layer's rules.
        let mut answers = Vec::new();
        while let Some(mut clone) = clones.pop() {
            assert!(state.upgrade().is_some(), "a clone keeps the state");
            answers.push(status(&mut clone));
        }
        assert!(state.upgrade().is_none(), "the last clone's drop frees it");
        answers.sort_unstable();
        assert_eq!(answers, [200, 429, 429, 429]);
    }

    #[test]
    fn requests_of_a_layer_with_a_time_limit_count_on_their_threads_reference_to_it() {
        let engine = Sentinel::builder().build();
        let mut svc =
            SentinelLayer::new(&engine).timeout(std::time::Duration::from_secs(5)).layer(tower::service_fn(hello));
        // Requests in flight (their futures not polled yet) hold what judging their responses needs.
        let futures: Vec<_> = (0..3).map(|_| svc.call(Request::get("/hello").body(()).unwrap())).collect();
        let judging = spread(&svc).get().layer.config.judging.as_ref().expect("a layer with a time limit");
        let count = judging.shared_count();
        if lease().exclusive {
            assert_eq!(count, 1, "the shared reference is the layer's alone");
        } else {
            assert_eq!(count, 4, "a thread without a stripe counts on the shared reference");
        }
        for f in futures {
            assert_eq!(f.now_or_never().expect("answered at once").unwrap().status(), 200);
        }
        assert_eq!(judging.shared_count(), 1);
    }
}
