//! [`OutboundGuard`]: the configuration, shared by every client it wraps; a tower [`Layer`] for tower
//! clients, and (feature `reqwest`) reqwest-middleware's `Middleware`.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::guard::{Guard, GuardConfig};
use super::naming::{InvalidTemplate, Template};
use super::request::CallView;
use super::service::SentinelClientService;
use crate::web::{ExitOn, Outcome};
use crate::{BlockError, Sentinel};

/// Which client an [`OutboundGuard`] plugs into (a type-level marker).
pub mod client {
    /// A tower client (a tonic `Channel`, hyper-util's client, any `Service<http::Request<B>>`).
    #[derive(Debug)]
    pub enum Tower {}
    /// reqwest through reqwest-middleware (feature `reqwest`).
    #[derive(Debug)]
    pub enum Reqwest {}
}

/// The outbound guard as a tower layer: `ServiceBuilder::new().layer(SentinelClientLayer::new(&engine))`.
pub type SentinelClientLayer = OutboundGuard<client::Tower>;

/// The outbound guard as reqwest-middleware middleware (feature `reqwest`):
/// `ClientBuilder::new(reqwest::Client::new()).with(SentinelMiddleware::new(&engine))`.
#[cfg(feature = "reqwest")]
pub type SentinelMiddleware = OutboundGuard<client::Reqwest>;

/// Guards the calls a service makes: each call enters an outbound resource
/// ([`EntryType::Out`](crate::EntryType): system rules do not apply) named after the downstream and route,
/// so flow rules, circuit breakers and adaptive limits protect the caller from a slow or failing
/// downstream (a call carries no hot-parameter values). See the [module docs](super) for what counts as an error, how calls are named and how the
/// downstream's back-off signals are heard. Cheap to clone (the configuration is shared).
#[must_use = "a guard does nothing until it wraps a client"]
pub struct OutboundGuard<K> {
    pub(crate) state: Arc<Guard>,
    client: PhantomData<fn() -> K>,
}

impl<K> Clone for OutboundGuard<K> {
    fn clone(&self) -> Self {
        OutboundGuard { state: self.state.clone(), client: PhantomData }
    }
}

impl OutboundGuard<client::Tower> {
    /// A tower layer that guards calls with resources of `engine`.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, outbound::SentinelClientLayer};
    /// use std::time::Duration;
    /// let layer = SentinelClientLayer::new(&Sentinel::builder().build()).timeout(Duration::from_secs(2));
    /// # let _ = layer;
    /// ```
    pub fn new(engine: &Sentinel) -> Self {
        Self::with_config(GuardConfig::new(engine))
    }
}

#[cfg(feature = "reqwest")]
impl OutboundGuard<client::Reqwest> {
    /// reqwest-middleware middleware that guards calls with resources of `engine`.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, outbound::SentinelMiddleware};
    /// let engine = Sentinel::builder().build();
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    ///     .with(SentinelMiddleware::new(&engine))
    ///     .build();
    /// # let _ = client;
    /// ```
    pub fn new(engine: &Sentinel) -> Self {
        Self::with_config(GuardConfig::new(engine))
    }
}

impl<K> OutboundGuard<K> {
    fn with_config(config: GuardConfig) -> Self {
        OutboundGuard { state: Arc::new(Guard::new(config)), client: PhantomData }
    }

    fn update(self, f: impl FnOnce(&mut GuardConfig)) -> Self {
        let mut config = self.state.state().config.clone();
        f(&mut config);
        // A new configuration starts with no names (the old ones may not hold any more).
        Self::with_config(config)
    }

    /// Names each call's resource with `f` instead of the default (`METHOD:host/path`, a route template, the
    /// gRPC method path); `None` lets the call through unguarded. A [`ResourceName`](super::ResourceName)
    /// extension on a request still wins. The names count against [`max_resources`](Self::max_resources).
    pub fn resource_name<F>(self, f: F) -> Self
    where
        F: for<'a, 'b> Fn(&'b CallView<'a>) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        self.update(|c| c.naming.namer = Some(Arc::new(f)))
    }

    /// Adds route templates: a call whose host and path match `host/items/{id}` (or `/items/{id}`, any host)
    /// is named `METHOD:host/items/{id}`. The first template that matches wins; `{name}` matches one
    /// non-empty path segment. Templates that name their host do not count against
    /// [`max_resources`](Self::max_resources).
    ///
    /// ```
    /// # use sentinel_runtime::{Sentinel, outbound::SentinelClientLayer};
    /// let layer = SentinelClientLayer::new(&Sentinel::builder().build())
    ///     .route_templates(["inventory.svc/items/{id}", "inventory.svc/items/{id}/stock"])?;
    /// # let _ = layer;
    /// # Ok::<(), sentinel_runtime::outbound::InvalidTemplate>(())
    /// ```
    pub fn route_templates<I>(self, templates: I) -> Result<Self, InvalidTemplate>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let parsed = templates.into_iter().map(|t| Template::parse(t.as_ref())).collect::<Result<Vec<_>, _>>()?;
        Ok(self.update(|c| c.naming.templates.extend(parsed)))
    }

    /// Cleans the path of a call no template matches before it becomes part of the name; `None` lets the call
    /// through unguarded. The default is [`clean_path`](crate::web::clean_path) (identifiers become `{id}`).
    pub fn path_cleaner<F>(self, f: F) -> Self
    where
        F: for<'a> Fn(&'a str) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        self.update(|c| c.naming.cleaner = Some(Arc::new(f)))
    }

    /// Whether HTTP names start with the method (`GET:host/path`; default true). gRPC names never do.
    pub fn method_prefix(self, on: bool) -> Self {
        self.update(|c| c.naming.method_prefix = on)
    }

    /// How many distinct counted names get their own resource (default
    /// [`DEFAULT_MAX_RESOURCES`](crate::web::DEFAULT_MAX_RESOURCES)); past it, a name gets its own only when
    /// a rule names it, and the others share [`OUTBOUND_OVERFLOW_RESOURCE`](super::OUTBOUND_OVERFLOW_RESOURCE).
    pub fn max_resources(self, n: usize) -> Self {
        self.update(|c| c.naming.max_resources = n)
    }

    /// Decides which answers count as errors (default [`is_downstream_error`](super::is_downstream_error):
    /// HTTP 5xx and 429, gRPC `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `INTERNAL`,
    /// `UNKNOWN`, `DATA_LOSS`). Transport errors and time limits always count.
    pub fn trace_if<F>(self, f: F) -> Self
    where
        F: Fn(Outcome) -> bool + Send + Sync + 'static,
    {
        self.update(|c| c.trace_if = Some(Arc::new(f)))
    }

    /// Answers a blocked call with `f`'s response instead of an error (a cached or default answer).
    pub fn fallback<F>(self, f: F) -> Self
    where
        F: Fn(&BlockError, &CallView<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.update(|c| c.fallback = Some(Arc::new(f)))
    }

    /// A time limit per call (after any queueing wait), as the macro's `timeout_ms`: past it the call's
    /// future is dropped, the call counts as an error and as a slow call whose response time is the limit,
    /// and the caller gets [`Timeout`](crate::Timeout). The timer runs on the engine's clock.
    ///
    /// The limit runs until the answer's head (the client's future), as tonic's `Endpoint::timeout` and
    /// tower's `Timeout` do; it does not bound the body (a stream, a slow download). reqwest's own `timeout`
    /// covers the body too, and a gRPC deadline (`grpc-timeout`) bounds the whole call at the server. With
    /// [`ExitOn::BodyEnd`] (and always for gRPC) the body's transfer still counts in the call's response
    /// time, for slow-call breakers and adaptive rules.
    pub fn timeout(self, limit: Duration) -> Self {
        self.update(|c| c.timeout = Some(limit))
    }

    /// When a call's entry exits: when the answer's head arrives (default), or when its body ends
    /// ([`ExitOn::BodyEnd`]: the transfer counts in the response time and the concurrency). gRPC calls always
    /// hold it until the trailers, where their status is.
    pub fn exit_on(self, exit_on: ExitOn) -> Self {
        self.update(|c| c.exit_on = exit_on)
    }

    /// Caps the back-off a downstream can ask for (`Retry-After` on a 429 or 503, gRPC's
    /// `grpc-retry-pushback-ms`; default [`DEFAULT_MAX_PUSHBACK`](super::DEFAULT_MAX_PUSHBACK), 60 s).
    pub fn max_pushback(self, cap: Duration) -> Self {
        self.update(|c| c.max_pushback = Some(cap))
    }

    /// Ignores the downstream's back-off signals.
    pub fn ignore_pushback(self) -> Self {
        self.update(|c| c.max_pushback = None)
    }
}

impl<S> Layer<S> for OutboundGuard<client::Tower> {
    type Service = SentinelClientService<S>;

    fn layer(&self, inner: S) -> SentinelClientService<S> {
        SentinelClientService::new(inner, self.state.clone())
    }
}

impl<K> fmt::Debug for OutboundGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.state.state().config;
        f.debug_struct("OutboundGuard")
            .field("engine", &c.engine)
            .field("custom_names", &c.naming.namer.is_some())
            .field("route_templates", &c.naming.templates.len())
            .field("max_resources", &c.naming.max_resources)
            .field("timeout", &c.timeout)
            .field("exit_on", &c.exit_on)
            .field("max_pushback", &c.max_pushback)
            .field("fallback", &c.fallback.is_some())
            .finish_non_exhaustive()
    }
}
