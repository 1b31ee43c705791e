//! The layer's configuration: written by [`SentinelLayer`](super::SentinelLayer)'s builder, read by its
//! services, their response futures and the bodies that hold a request's entry. Every other file of the
//! layer imports this one; it imports none of them but the leaves (naming, extraction, outcomes).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use super::extract::ValueFn;
use super::gateway::enter::GatewayMode;
use super::naming::{Naming, ResourceCache};
use super::outcome::{is_error_by_default, Outcome};
use super::rate_limit::RateLimitHeaders;
use super::request::RequestView;
use crate::stat::stripe::{Spread, SpreadRef};
use crate::{BlockError, Sentinel};

/// Decides whether a request is prioritized.
pub(crate) type PriorityFn = Arc<dyn Fn(&RequestView<'_>) -> bool + Send + Sync>;

/// Builds the response for a blocked request.
pub(crate) type BlockFn = Arc<dyn Fn(&BlockError, &RequestView<'_>) -> Response<Bytes> + Send + Sync>;

/// Decides whether an outcome counts as an error.
pub(crate) type OutcomeFn = Arc<dyn Fn(Outcome) -> bool + Send + Sync>;

/// Whether `outcome` counts as an error: the layer's predicate, or [`is_error_by_default`].
#[inline]
pub(crate) fn is_error(trace_if: Option<&OutcomeFn>, outcome: Outcome) -> bool {
    match trace_if {
        Some(f) => f(outcome),
        None => is_error_by_default(outcome),
    }
}

/// When a request's entry exits (for HTTP; a gRPC call always holds it until its body ends, because its
/// status comes in the trailers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitOn {
    /// When the service's response (its head) is ready: the response time and the concurrency count cover
    /// the handler, not the transfer of the body.
    #[default]
    Response,
    /// When the response body ends (its last frame, trailers or an error) or is dropped: for streaming
    /// responses whose work happens while the body streams (server-sent events, large downloads).
    BodyEnd,
}

/// The parts of the configuration a request's guard keeps until the response (or its body) ends.
pub(crate) struct Judging {
    pub(crate) trace_if: Option<OutcomeFn>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) engine: Sentinel,
}

/// A request's reference to its layer's [`Judging`], counted on its thread's stripe ([`Spread`]).
pub(crate) type JudgingRef = Arc<SpreadRef<Judging>>;

/// What every service of one layer shares: the configuration and the resources named so far.
pub(crate) struct LayerState {
    pub(crate) config: LayerConfig,
    pub(crate) cache: ResourceCache,
    /// The layer has none of the per-request options (origin, hot parameters, priority, context, gateway
    /// mode, RateLimit header fields): a request's entry is one owned inbound entry of its resource.
    pub(crate) plain: bool,
}

impl LayerState {
    /// A layer's state with no resources named yet (every change of the configuration makes a new one).
    pub(crate) fn new(config: LayerConfig) -> Self {
        let plain = config.origin.is_none()
            && config.params.is_empty()
            && config.prioritized.is_none()
            && config.context.is_none()
            && config.gateway.is_none()
            && config.rate_limit.is_none();
        LayerState { config, cache: ResourceCache::default(), plain }
    }
}

/// A layer's configuration.
#[derive(Clone)]
pub(crate) struct LayerConfig {
    pub(crate) engine: Sentinel,
    pub(crate) naming: Naming,
    pub(crate) origin: Option<ValueFn>,
    pub(crate) params: Vec<ValueFn>,
    pub(crate) prioritized: Option<PriorityFn>,
    pub(crate) on_blocked: Option<BlockFn>,
    /// `None`: [`is_error_by_default`].
    pub(crate) trace_if: Option<OutcomeFn>,
    pub(crate) timeout: Option<Duration>,
    /// What a request's guard needs beyond the defaults (a custom predicate, a time limit): shared, and
    /// `None` when the layer uses neither, so a request takes no reference count for it. A request that
    /// does takes it on its thread's stripe ([`Spread`]), not on one count every worker writes.
    pub(crate) judging: Option<Arc<Spread<Judging>>>,
    pub(crate) exit_on: ExitOn,
    /// `None`: the engine's default context (no lookup per request).
    pub(crate) context: Option<Arc<str>>,
    /// Gateway mode: the route's and the API groups' resources, with the gateway rules' arguments.
    pub(crate) gateway: Option<GatewayMode>,
    /// The RateLimit header fields, when asked for.
    pub(crate) rate_limit: Option<RateLimitHeaders>,
}

impl LayerConfig {
    /// The defaults, on `engine`.
    pub(crate) fn new(engine: &Sentinel) -> Self {
        LayerConfig {
            engine: engine.clone(),
            naming: Naming::default(),
            origin: None,
            params: Vec::new(),
            prioritized: None,
            on_blocked: None,
            trace_if: None,
            timeout: None,
            judging: None,
            exit_on: ExitOn::Response,
            context: None,
            gateway: None,
            rate_limit: None,
        }
    }

    /// Derives [`judging`](Self::judging) from the predicate and the time limit, after either changed.
    pub(crate) fn settle(&mut self) {
        self.judging = (self.trace_if.is_some() || self.timeout.is_some()).then(|| {
            let judging =
                Judging { trace_if: self.trace_if.clone(), timeout: self.timeout, engine: self.engine.clone() };
            Arc::new(Spread::new(judging))
        });
    }
}
