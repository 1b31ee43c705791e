//! The guard's configuration, shared by the tower layer and the reqwest middleware, and one call's guard:
//! its entry, the downstream it calls, and how its answer is judged.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};

use super::naming::{NameBuf, NameCache, Naming, Target, TargetRef};
use super::request::CallView;
use super::signal::{grpc_code_of_http, grpc_pushback, is_downstream_error, is_drop, millis, retry_after, wall_now};
use crate::stat::stripe::{Spread, SpreadRef};
use crate::web::{ExitOn, GrpcCode, Outcome};
use crate::{BlockError, Entry, EntryType, Sentinel};

/// Decides whether an outcome counts as an error.
pub(crate) type OutcomeFn = Arc<dyn Fn(Outcome) -> bool + Send + Sync>;
/// Builds the response of a blocked call.
pub(crate) type FallbackFn = Arc<dyn Fn(&BlockError, &CallView<'_>) -> Response<Bytes> + Send + Sync>;

/// The default cap on a downstream's back-off.
pub const DEFAULT_MAX_PUSHBACK: Duration = Duration::from_secs(60);

/// A guard's configuration.
#[derive(Clone)]
pub(crate) struct GuardConfig {
    pub(crate) engine: Sentinel,
    pub(crate) naming: Naming,
    pub(crate) trace_if: Option<OutcomeFn>,
    pub(crate) fallback: Option<FallbackFn>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) exit_on: ExitOn,
    /// `None`: the downstream's back-off signals are ignored.
    pub(crate) max_pushback: Option<Duration>,
}

impl GuardConfig {
    pub(crate) fn new(engine: &Sentinel) -> Self {
        GuardConfig {
            engine: engine.clone(),
            naming: Naming::default(),
            trace_if: None,
            fallback: None,
            timeout: None,
            exit_on: ExitOn::Response,
            max_pushback: Some(DEFAULT_MAX_PUSHBACK),
        }
    }
}

/// What every call of one guard shares: the configuration and the downstreams named so far.
pub(crate) struct GuardState {
    pub(crate) config: GuardConfig,
    pub(crate) names: NameCache,
}

/// A guard, as its layers, services and middleware share it: the state, and a reference to it per statistics
/// stripe for the calls of the thread that owns the stripe ([`Spread`]). A call must keep the state alive (its
/// future may outlive every service), and a count on one shared `Arc` is a word that every thread calling
/// through the guard writes at each call's start and end: two threads through one guard cost as much per call
/// in aggregate as one.
pub(crate) struct Guard(Spread<GuardState>);

/// A call's reference to its guard's state.
type StateRef = SpreadRef<GuardState>;

/// What the checks decided for a call.
pub(crate) enum Admission {
    /// No resource guards the call.
    Unguarded,
    /// The call may go out now.
    Pass(Call),
    /// The call may go out after this wait (a queueing rule).
    Wait(Call, Duration),
    /// The call waits for a place (an adaptive rule's `maxWaitMs`) or a cluster lease, on a timer, and is
    /// decided again: see [`Queued::admitted`].
    Queued(Queued),
    /// The call must not go out.
    Blocked(BlockError),
}

/// A call waiting to be decided again (see [`Admission::Queued`]).
pub(crate) struct Queued {
    waiting: crate::entry::QueuedEntry<'static>,
    target: TargetRef,
    state: Arc<StateRef>,
    grpc: bool,
}

/// The decision of a queued call: awaited without blocking the thread; dropping it gives back whatever its
/// wait got.
pub(crate) type Admitted = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Call, BlockError>> + Send>>;

impl Queued {
    /// Awaits the wait and the decision made after it; an admitted call also waits out a queueing rule's
    /// delay, if its decision asks for one.
    pub(crate) fn admitted(self) -> Admitted {
        Box::pin(async move {
            let entry = self.waiting.await?;
            let delay = entry.waits().then(|| entry.waited());
            let mut call = Call::new(entry, self.target, self.state, self.grpc);
            if let Some(d) = delay {
                call.engine().sleep(d).await;
            }
            call.at_turn();
            Ok(call)
        })
    }
}

impl Guard {
    /// A guard with this configuration and no names yet.
    pub(crate) fn new(config: GuardConfig) -> Guard {
        Guard(Spread::new(GuardState { config, names: NameCache::default() }))
    }

    /// The guard's state.
    pub(crate) fn state(&self) -> &Arc<GuardState> {
        self.0.get()
    }

    /// Names the call, checks the downstream's back-off, and enters its outbound resource.
    pub(crate) fn admit(&self, view: &CallView<'_>) -> Admission {
        let state = self.state();
        let config = &state.config;
        let grpc = view.is_grpc();
        let mut buf = NameBuf::new();
        let Some((name, counted)) = config.naming.name(view, grpc, &mut buf) else { return Admission::Unguarded };
        let at = state.names.target(&config.naming, &config.engine, &name, counted);
        // SAFETY: `self` keeps the state, and its cache, alive for this function; a call or a queued call made
        // here keeps a reference to the state beside the target (`Call::target`).
        let target = unsafe { at.get() };
        if config.max_pushback.is_some()
            && config.engine.is_enabled()
            && let Some(left) = target.held(&config.engine)
        {
            return Admission::Blocked(BlockError::Pushback {
                resource: Arc::from(target.resource.name()),
                origin: Arc::from(""),
                retry_after: Duration::from_millis(left),
            });
        }
        match target.resource.entry_owned().entry_type(EntryType::Out).decide_or_queue() {
            Err(queue) => Admission::Queued(Queued { waiting: queue.start(), target: at, state: self.share(), grpc }),
            Ok(Err(blocked)) => Admission::Blocked(blocked),
            Ok(Ok(entry)) => {
                let wait = entry.waits().then(|| entry.waited());
                let call = Call::new(entry, at, self.share(), grpc);
                match wait {
                    Some(d) => Admission::Wait(call, d),
                    None => Admission::Pass(call),
                }
            }
        }
    }

    /// A reference to the state for a call of this thread.
    #[inline]
    fn share(&self) -> Arc<StateRef> {
        self.0.share()
    }

    /// The fallback's response for a blocked call, when the guard has a fallback.
    pub(crate) fn fallback(&self, blocked: &BlockError, view: &CallView<'_>) -> Option<Response<Bytes>> {
        self.state().fallback(blocked, view)
    }
}

impl GuardState {
    /// The fallback's response for a blocked call, when the guard has a fallback.
    pub(crate) fn fallback(&self, blocked: &BlockError, view: &CallView<'_>) -> Option<Response<Bytes>> {
        self.config.fallback.as_ref().map(|f| f(blocked, view))
    }
}

/// One call that went out: dropping it exits its entry (without an error unless one was marked), so a call
/// whose future the caller drops counts as neither an error nor a success of the downstream's.
pub(crate) struct Call {
    entry: Entry<'static>,
    /// Valid while `state` is: read through [`Call::target`].
    target: TargetRef,
    state: Arc<StateRef>,
    pub(crate) grpc: bool,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call").field("entry", &self.entry).field("grpc", &self.grpc).finish()
    }
}

impl Call {
    /// A call admitted by `entry`: until its answer (or its failure) comes, an exit is a call its caller gave
    /// up on, which an adaptive limit does not sample.
    fn new(mut entry: Entry<'static>, target: TargetRef, state: Arc<StateRef>, grpc: bool) -> Self {
        entry.awaits_answer();
        Call { entry, target, state, grpc }
    }

    fn config(&self) -> &GuardConfig {
        &self.state.config
    }

    fn target(&self) -> &Target {
        // SAFETY: `self.state` keeps the guard's state alive, and with it the name cache the target came from.
        unsafe { self.target.get() }
    }

    /// The call's queueing wait is over: its entry records its pass at its turn ([`Entry::at_turn`]).
    pub(crate) fn at_turn(&mut self) {
        self.entry.at_turn();
    }

    /// The time limit's timer, when the guard has one.
    pub(crate) fn timer(&self) -> Option<Box<crate::clock::Sleep>> {
        let c = self.config();
        c.timeout.map(|d| Box::new(c.engine.sleep(d)))
    }

    /// The guard's time limit.
    pub(crate) fn limit(&self) -> Option<Duration> {
        self.config().timeout
    }

    /// The engine.
    pub(crate) fn engine(&self) -> &Sentinel {
        &self.config().engine
    }

    /// A transport error (the downstream could not be reached, or dropped the connection): an error, and a
    /// drop for adaptive rules, as gRPC's `UNAVAILABLE` (what tonic's callers see of it); its time is no
    /// round trip of an answer.
    pub(crate) fn failed(&mut self) {
        self.entry.answered();
        self.entry.set_overload();
    }

    /// The time limit ran out: an error and a slow call whose response time is the limit.
    pub(crate) fn timed_out(&mut self, limit: Duration) -> crate::Timeout {
        self.entry.set_timed_out(limit);
        self.entry.timeout_error(limit)
    }

    fn judge(&mut self, outcome: Outcome) {
        let error = match &self.config().trace_if {
            Some(f) => f(outcome),
            None => is_downstream_error(outcome),
        };
        if error {
            self.entry.set_error();
        }
        if is_drop(outcome) {
            self.entry.set_overload();
        }
    }

    fn listen(&self, asked: Option<Duration>) {
        if let (Some(asked), Some(cap)) = (asked, self.config().max_pushback) {
            let now = self.config().engine.now_millis();
            self.target().hold(now.saturating_add(millis(asked.min(cap))));
        }
    }

    /// Judges the answer's head; `true` when the entry must be held until the body ends (a gRPC call whose
    /// status comes in the trailers, or [`ExitOn::BodyEnd`]).
    pub(crate) fn head(&mut self, status: StatusCode, headers: &HeaderMap) -> bool {
        self.entry.answered();
        if self.grpc {
            if let Some(code) = GrpcCode::from_headers(headers) {
                // A trailers-only answer: the call ended with this status.
                self.judge(Outcome::Grpc(code));
                self.listen(grpc_pushback(headers));
                return false;
            }
            if status != StatusCode::OK {
                // No gRPC status: the client reports the one gRPC maps the HTTP status to.
                self.judge(Outcome::Grpc(grpc_code_of_http(status)));
                self.listen(retry_after(status, headers, wall_now()));
                return false;
            }
            return true;
        }
        self.judge(Outcome::Http(status));
        self.listen(retry_after(status, headers, wall_now()));
        self.config().exit_on == ExitOn::BodyEnd
    }

    /// Judges a gRPC call's trailers ([`GrpcCode::at_end`]: without a `grpc-status`, `UNKNOWN`).
    pub(crate) fn trailers(&mut self, trailers: &HeaderMap) {
        if self.grpc {
            self.judge(Outcome::Grpc(GrpcCode::at_end(Some(trailers))));
            self.listen(grpc_pushback(trailers));
        }
    }

    /// The body ended without trailers: a gRPC call whose status was not in its headers ended without one
    /// ([`GrpcCode::at_end`]: `UNKNOWN`).
    pub(crate) fn ended_without_trailers(&mut self) {
        if self.grpc {
            self.judge(Outcome::Grpc(GrpcCode::at_end(None)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::stripe::lease;
    use http::{HeaderValue, Request};

    fn call(guard: &Guard) -> Call {
        let req = Request::get("http://inventory.svc/items/7").body(()).unwrap();
        match guard.admit(&CallView::new(&req)) {
            Admission::Pass(call) => call,
            _ => panic!("no rule: the call passes"),
        }
    }

    #[test]
    fn calls_of_a_thread_that_owns_a_stripe_count_on_its_stripes_reference_not_the_shared_one() {
        let engine = Sentinel::builder().build();
        let guard = Guard::new(GuardConfig::new(&engine));
        let calls: Vec<Call> = (0..3).map(|_| call(&guard)).collect();
        if lease().exclusive {
            assert_eq!(guard.0.shared_count(), 1, "the shared reference is the guard's alone");
            // The guard's reference and this stripe's copy.
            assert_eq!(Arc::strong_count(guard.state()), 2);
        } else {
            assert_eq!(guard.0.shared_count(), 4);
        }
        drop(calls);
        assert_eq!(guard.0.shared_count(), 1);
    }

    #[test]
    fn calls_keep_the_guards_state_and_their_targets_after_every_handle_is_gone() {
        let engine = Sentinel::builder().build();
        let guard = Guard::new(GuardConfig::new(&engine));
        let state = Arc::downgrade(guard.state());
        // Calls from this thread and from others (each thread that owns a stripe has its own reference).
        let mut calls = vec![call(&guard)];
        calls.extend(std::thread::scope(|s| {
            let threads: Vec<_> = (0..3).map(|_| s.spawn(|| call(&guard))).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
        }));
        drop(guard);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("30"));
        while let Some(mut call) = calls.pop() {
            assert!(state.upgrade().is_some(), "a call in flight keeps the state");
            // Reads the target (the downstream's back-off is recorded on it).
            assert!(!call.head(StatusCode::TOO_MANY_REQUESTS, &headers));
            assert!(call.target().held(&engine).is_some_and(|left| left > 0));
        }
        assert!(state.upgrade().is_none(), "the last call's drop frees the state");
    }
}
