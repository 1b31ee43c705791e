//! [`SentinelLayer`]: builds the layer's configuration ([`config`](super::config)) and hands it to every
//! service it wraps.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::body::Wrapped;
use super::client_ip::TrustedProxies;
use super::config::{ExitOn, LayerConfig, LayerState};
use super::gateway::enter::GatewayMode;
#[cfg(doc)]
use super::outcome::is_error_by_default;
use super::outcome::Outcome;
use super::rate_limit::RateLimitHeaders;
use super::request::RequestView;
use super::service::SentinelService;
use crate::{BlockError, Sentinel};

/// A context name for requests, the one Java's Spring Web MVC adapter enters (`sentinel_spring_web_context`,
/// `AbstractSentinelInterceptor`): with [`SentinelLayer::context_name`]`(WEB_CONTEXT_NAME)`, chain rules that
/// name it limit a resource only when it is called from a request, and chain rules written for Java's web
/// context apply as they are.
pub const WEB_CONTEXT_NAME: &str = "sentinel_spring_web_context";

/// A tower [`Layer`] that guards every request with a Sentinel entry: an inbound resource named after the
/// request's route, with the caller's origin and hot parameters taken from the request.
///
/// Blocked requests get a response, never an error (axum services are infallible): HTTP 429 with
/// `Retry-After` for flow, hot-parameter and system rules, 503 with `Retry-After` for an open circuit
/// breaker, 403 for an authority rule; for gRPC calls `RESOURCE_EXHAUSTED`, `UNAVAILABLE` or
/// `PERMISSION_DENIED`, with `grpc-retry-pushback-ms` when the rule knows when a retry can pass. HTTP 5xx,
/// gRPC statuses other than `OK` and errors of the service count as errors for statistics and circuit
/// breakers ([`trace_if`](Self::trace_if) replaces that predicate). A request whose future is dropped
/// (the client went away, an outer timeout) exits its entry without an error.
///
/// ```
/// use sentinel_runtime::{Sentinel, web::{extract, SentinelLayer, TrustedProxies}};
/// use http::HeaderName;
/// use std::time::Duration;
///
/// let engine = Sentinel::builder().build();
/// let layer = SentinelLayer::new(&engine)
///     .origin(extract::header(HeaderName::from_static("x-caller")))
///     .param(extract::client_ip(TrustedProxies::none())) // `param_idx: 0` of hot-parameter rules
///     .timeout(Duration::from_secs(2));
/// # let _ = layer;
/// ```
///
/// `M` is how responses carry their bodies ([`BodyMode`](super::BodyMode)): by default in a
/// [`ResponseBody`](super::ResponseBody), which fits every stack; an axum application saves a box per
/// response with [`axum`](Self::axum).
#[must_use = "a layer does nothing until it wraps a service"]
pub struct SentinelLayer<M = Wrapped> {
    state: Arc<LayerState>,
    mode: PhantomData<fn() -> M>,
}

impl<M> Clone for SentinelLayer<M> {
    fn clone(&self) -> Self {
        SentinelLayer { state: self.state.clone(), mode: PhantomData }
    }
}

impl SentinelLayer {
    /// A layer that enters resources of `engine`.
    ///
    /// A request's entry outlives the layer if it must (it moves into the response future and body): on an
    /// engine that can be dropped it holds the engine's state with a counter of its worker thread's own (no
    /// reference count that every worker writes), so requests on one route scale across workers whatever the
    /// engine; on the global engine ([`SentinelLayer::global`]) and leaked ones ([`Sentinel::leak`]) it holds
    /// nothing.
    pub fn new(engine: &Sentinel) -> Self {
        SentinelLayer { state: Arc::new(LayerState::new(LayerConfig::new(engine))), mode: PhantomData }
    }

    /// A layer on the process-wide engine ([`Sentinel::global`]).
    pub fn global() -> Self {
        Self::new(Sentinel::global())
    }

    /// The same layer for an axum application (feature `axum`): its responses keep axum's
    /// [`Body`](axum::body::Body) instead of a [`ResponseBody`](super::ResponseBody), which axum's router
    /// would box once more on every response ([`AxumBody`](super::AxumBody)). Behaviour is otherwise the
    /// same. Only for services whose responses have axum's body (routes of a `Router`, with `layer` or
    /// `route_layer`).
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use sentinel_runtime::{Sentinel, web::SentinelLayer};
    ///
    /// let app: Router = Router::new()
    ///     .route("/users/{id}", get(|| async { "a user" }))
    ///     .route_layer(SentinelLayer::new(Sentinel::global()).axum());
    /// # let _ = app;
    /// ```
    #[cfg(feature = "axum")]
    pub fn axum(self) -> SentinelLayer<super::AxumBody> {
        SentinelLayer { state: self.state, mode: PhantomData }
    }
}

impl<M> SentinelLayer<M> {
    fn update(self, f: impl FnOnce(&mut LayerConfig)) -> Self {
        let mut config = match Arc::try_unwrap(self.state) {
            Ok(state) => state.config,
            Err(state) => state.config.clone(),
        };
        f(&mut config);
        config.settle();
        // A new configuration starts with no resources named (the old names may not hold any more).
        SentinelLayer { state: Arc::new(LayerState::new(config)), mode: PhantomData }
    }

    /// Names each request's resource with `f` instead of the default (`METHOD:/route/{template}` for a request
    /// axum routed, the method path of a gRPC call to a `/pkg.Service/Method` path, or the cleaned path);
    /// `None` (or an empty name, as Java's `UrlCleaner` returns to exclude a URL) lets the request through
    /// unguarded (health checks, say).
    /// The names count against [`max_resources`](Self::max_resources).
    ///
    /// ```
    /// # use sentinel_runtime::{Sentinel, web::SentinelLayer};
    /// let layer = SentinelLayer::new(&Sentinel::builder().build())
    ///     .resource_name(|req| (req.path() != "/health").then(|| format!("api:{}", req.method()).into()));
    /// # let _ = layer;
    /// ```
    pub fn resource_name<F>(self, f: F) -> Self
    where
        F: for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        self.update(|c| c.naming.namer = Some(Arc::new(f)))
    }

    /// Cleans the path of a request that has no route template (no axum `MatchedPath`, not a gRPC call to a
    /// `/pkg.Service/Method` path) before it becomes the resource name; `None` or an empty path lets the
    /// request through unguarded. The cleaner gets the path the request means: percent-escapes of unreserved
    /// characters decoded and `.` / `..` segments resolved (`/users/%31/../2` is `/users/2`). The default is [`clean_path`](super::clean_path), which folds identifiers into `{id}`.
    pub fn path_cleaner<F>(self, f: F) -> Self
    where
        F: for<'a> Fn(&'a str) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        self.update(|c| c.naming.cleaner = Some(Arc::new(f)))
    }

    /// Whether HTTP resource names start with the method (`GET:/users/{id}`; default true). gRPC names never
    /// do. Only `GET`, `POST`, `PUT`, `DELETE` and `PATCH` prefix names; `HEAD` is named `GET` (the handler it
    /// runs), and other methods share [`OTHER_METHODS_RESOURCE`](super::OTHER_METHODS_RESOURCE) unless a rule
    /// names `METHOD:/route` exactly, so a client's method tokens never make resources.
    pub fn method_prefix(self, on: bool) -> Self {
        self.update(|c| c.naming.method_prefix = on)
    }

    /// How many distinct request-derived names (cleaned paths, gRPC paths, custom names) get their own
    /// resource (default [`DEFAULT_MAX_RESOURCES`](super::DEFAULT_MAX_RESOURCES)); past it, a name gets its
    /// own only when a rule names it, and the others share [`OVERFLOW_RESOURCE`](super::OVERFLOW_RESOURCE).
    /// Route templates are not counted: the router bounds them (five method names per template at most).
    /// The cache behind this bound holds about 100 bytes plus the name per entry, besides the engine's
    /// resource; names past it are not cached.
    pub fn max_resources(self, n: usize) -> Self {
        self.update(|c| c.naming.max_resources = n)
    }

    /// Takes the caller's origin (for `limit_app` of flow rules and for authority rules) from the request;
    /// see [`extract`](super::extract) for ready-made ones (a header, the peer or client IP).
    pub fn origin<F>(self, f: F) -> Self
    where
        F: for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        self.update(|c| c.origin = Some(Arc::new(f)))
    }

    /// Adds a hot parameter taken from the request: the first call gives `param_idx: 0` of the resource's
    /// hot-parameter rules, the next `1`, and so on. `None` is an absent value, which always passes. See
    /// [`extract`](super::extract) for ready-made ones (client IP, header, query parameter, cookie, host:
    /// the strategies of Sentinel's gateway parameter items).
    pub fn param<F>(self, f: F) -> Self
    where
        F: for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        self.update(|c| c.params.push(Arc::new(f)))
    }

    /// Marks the requests `f` picks as prioritized: over a QPS limit such a request may borrow from the next
    /// window and wait for it (Sentinel's prioritized occupy, less than 500 ms) instead of being blocked. The
    /// wait is a timer: the worker serves other requests meanwhile.
    pub fn prioritized<F>(self, f: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.update(|c| c.prioritized = Some(Arc::new(f)))
    }

    /// Builds the response for a blocked request instead of the default
    /// ([`block::default_response`](super::block::default_response)).
    pub fn on_blocked<F>(self, f: F) -> Self
    where
        F: Fn(&BlockError, &RequestView<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.update(|c| c.on_blocked = Some(Arc::new(f)))
    }

    /// Decides which outcomes count as errors for statistics and circuit breakers (default:
    /// [`is_error_by_default`], HTTP 5xx and gRPC statuses other than `OK`). An `Err` from the service always
    /// counts.
    pub fn trace_if<F>(self, f: F) -> Self
    where
        F: Fn(Outcome) -> bool + Send + Sync + 'static,
    {
        self.update(|c| c.trace_if = Some(Arc::new(f)))
    }

    /// A time limit for the service's response (from the moment it is called, after any queueing wait):
    /// past it the service's future is dropped, the call counts as an error and as a slow call whose
    /// response time is the limit, and the client gets 504 (`DEADLINE_EXCEEDED` for gRPC). The timer runs on
    /// the engine's clock ([`Sentinel::sleep`]), so a manual clock drives it in tests.
    pub fn timeout(self, limit: Duration) -> Self {
        self.update(|c| c.timeout = Some(limit))
    }

    /// When an HTTP request's entry exits (default [`ExitOn::Response`]).
    pub fn exit_on(self, exit_on: ExitOn) -> Self {
        self.update(|c| c.exit_on = exit_on)
    }

    /// Gateway mode (Java's API-gateway adapters; see [`gateway`](super::gateway)): each request enters its
    /// route's resource and then the resource of every API group ([`Sentinel::load_api_definitions`]) its
    /// path belongs to, each with the arguments its gateway flow rules ([`Sentinel::load_gateway_rules`])
    /// read from the request: client IP (through `proxies`), host, a header, a URL parameter, a cookie.
    /// These replace the hot parameters of [`param`](Self::param) in this mode. A route's id in gateway
    /// rules is the resource name the layer gives it (`GET:/orders/{id}`, or `/orders/{id}` with
    /// [`method_prefix`](Self::method_prefix)`(false)`, or the name of [`resource_name`](Self::resource_name)).
    ///
    /// Per request this costs a lookup of the route's arguments, one match of the path against the API
    /// definitions, and an entry per API group; the parameter values are borrowed from the request where
    /// they can be (a client IP is written out as text).
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, web::{SentinelLayer, TrustedProxies}};
    /// use sentinel_runtime::web::gateway::{ApiDefinition, ApiPredicateItem, GatewayFlowRule, GatewayParamItem, ResourceMode};
    /// let engine = Sentinel::builder().build();
    /// engine.load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))]).unwrap();
    /// engine
    ///     .load_gateway_rules([GatewayFlowRule::new("products")
    ///         .resource_mode(ResourceMode::CustomApiName)
    ///         .count(10.0)
    ///         .param_item(GatewayParamItem::client_ip())])
    ///     .unwrap();
    /// let layer = SentinelLayer::new(&engine).gateway(TrustedProxies::none());
    /// # let _ = layer;
    /// ```
    pub fn gateway(self, proxies: TrustedProxies) -> Self {
        self.update(|c| c.gateway = Some(GatewayMode::new(&c.engine, proxies)))
    }

    /// Writes the RateLimit header fields of the IETF httpapi draft on the responses of limited resources
    /// (see [`RateLimitHeaders`] for the older `x-ratelimit-*` names and gRPC): `RateLimit-Policy` with
    /// each policy's quota and window, and `RateLimit` with what remains and the seconds until more is
    /// available. A policy is a QPS flow rule for every caller on the request's resource (named after the
    /// resource; window 1 s) or a hot-parameter token bucket the request's value went through, a gateway
    /// rule's included (named `resource#param_idx`; the quota is `count + burst`, the window the rule's).
    /// A name is told once: of several policies of one name (two QPS rules on the resource, two rules on one
    /// hot parameter) the one closest to running out. Each is read from the rule's window or bucket after the
    /// request was admitted, without taking from it: the values are exact at that instant, and a rule of
    /// count 3 still admits exactly 3 calls. A blocked request gets the policy it ran out of, with nothing
    /// remaining, beside `Retry-After`.
    ///
    /// Off by default; on, a request pays a read of each rule's window and the fields' formatting.
    pub fn rate_limit_headers(self, headers: RateLimitHeaders) -> Self {
        self.update(|c| c.rate_limit = Some(headers))
    }

    /// The context requests enter. By default they enter the engine's default context
    /// ([`DEFAULT_CONTEXT_NAME`](crate::DEFAULT_CONTEXT_NAME)), which costs nothing per request; a named context
    /// (for instance [`WEB_CONTEXT_NAME`], as Java's web adapters do) lets chain rules tell requests from other
    /// callers of a resource, for a lookup and a second node to record on per request. An empty name, or the
    /// default context's, keeps the default.
    pub fn context_name(self, name: impl Into<String>) -> Self {
        let name: Option<Arc<str>> = crate::context::named_context(&name.into()).map(Arc::from);
        self.update(|c| c.context = name)
    }
}

impl<S, M> Layer<S> for SentinelLayer<M> {
    type Service = SentinelService<S, M>;

    fn layer(&self, inner: S) -> SentinelService<S, M> {
        SentinelService::new(inner, self.state.clone())
    }
}

impl<M> fmt::Debug for SentinelLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.state.config;
        f.debug_struct("SentinelLayer")
            .field("engine", &c.engine)
            .field("custom_names", &c.naming.namer.is_some())
            .field("method_prefix", &c.naming.method_prefix)
            .field("max_resources", &c.naming.max_resources)
            .field("origin", &c.origin.is_some())
            .field("params", &c.params.len())
            .field("prioritized", &c.prioritized.is_some())
            .field("timeout", &c.timeout)
            .field("exit_on", &c.exit_on)
            .field("context", &c.context.as_deref().unwrap_or(crate::DEFAULT_CONTEXT_NAME))
            .field("gateway", &c.gateway.is_some())
            .field("rate_limit_headers", &c.rate_limit)
            .finish_non_exhaustive()
    }
}
