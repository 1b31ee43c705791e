//! The web middleware (feature `tower`): a tower [`Layer`](tower_layer::Layer) that guards every request of
//! an axum, tonic or hyper 1 service with a Sentinel entry.
//!
//! ```text
//! request ─▶ SentinelService ─ name the resource (route template, gRPC method, cleaned path)
//!                             ─ origin and hot parameters from the request
//!                             ─ enter an inbound resource ── blocked ─▶ 429 / 503 / 403 (gRPC status)
//!                             ─ wait out a queueing decision on a timer (never blocking a worker)
//!                             ─ call the service as the request's context (nested resources are its children)
//!                             ─ time limit ─▶ 504 / DEADLINE_EXCEEDED
//!                             ─ 5xx, gRPC non-OK, Err ─▶ traced; exit at the response or the body's end
//! ```
//!
//! # axum
//!
//! Add it with `route_layer` (unmatched paths stay 404 and are not counted) or `layer`; with feature `axum`
//! the resource is `METHOD:/route/{template}` from axum's `MatchedPath`, so `/users/1` and `/users/2` are one
//! resource, `GET:/users/{id}` (whatever content type the client sends: `application/grpc` does not rename a
//! routed request), and the peer address comes from `ConnectInfo`. [`SentinelLayer::axum`] keeps
//! axum's `Body` in the responses, which saves the box axum's router would otherwise put around the layer's
//! body on every response.
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use axum::{routing::get, Router};
//! use http::HeaderName;
//! use sentinel_runtime::{Sentinel, flow::FlowRule, web::{extract, SentinelLayer}};
//!
//! let engine = Sentinel::global();
//! engine.load_flow_rules([FlowRule::new("GET:/users/{id}").count(100.0)]).unwrap();
//! let app: Router = Router::new()
//!     .route("/users/{id}", get(|| async { "a user" }))
//!     .route_layer(SentinelLayer::new(engine).origin(extract::header(HeaderName::from_static("x-caller"))).axum());
//! # let _ = app; }
//! ```
//!
//! # tonic
//!
//! `Server::builder().layer(SentinelLayer::new(engine))`: a call's resource is its method path
//! (`/shop.Orders/Get`), a blocked call gets `RESOURCE_EXHAUSTED`, `UNAVAILABLE` or `PERMISSION_DENIED` with
//! `grpc-retry-pushback-ms`, and the entry lives until the call's last message (its status is in the
//! trailers), so server-streaming calls count as in flight while they stream. With feature `tonic` the peer
//! address comes from `TcpConnectInfo`, and `BlockError` and `Timeout` convert into `tonic::Status`, so an
//! annotated function returning `Result<_, Status>` needs no handlers.
//!
//! # hyper
//!
//! hyper 1 calls `Service::call(&self)`: wrap the layered service with hyper-util's `TowerToHyperService`
//! (it clones the service per request). Insert a [`PeerAddr`] in the request's extensions for the
//! peer-address extractors (the examples in the repository's README show the accept loop).
//!
//! # Behaviour
//!
//! - **Names.** See [`SentinelLayer::resource_name`], [`clean_path`], and [`SentinelLayer::max_resources`]:
//!   the default never makes one resource per distinct URL (the query string is never part of a name), nor
//!   one per method token (`HEAD` is named `GET`; methods other than `GET`, `POST`, `PUT`, `DELETE`, `PATCH`
//!   share [`OTHER_METHODS_RESOURCE`]). Past the engine's cap on resources a route no rule names shares the
//!   engine's overflow resource, and a route a rule names keeps its own: no bound switches a rule off.
//! - **Entries** are inbound ([`EntryType::In`](crate::EntryType), so system rules apply), in the default
//!   context (or the one [`SentinelLayer::context_name`] names, such as [`WEB_CONTEXT_NAME`]), with the
//!   origin and hot parameters the layer's closures take from the request.
//!   A queueing rule's wait (rate limiter, prioritized occupy) is a timer on the engine's clock: the worker
//!   serves other requests meanwhile.
//! - **Errors.** An `Err` from the service, an HTTP 5xx and a gRPC status other than `OK` (in the response
//!   headers or in the trailers) count as errors ([`SentinelLayer::trace_if`]), but an `Err` that is a block of
//!   a call the service made (a proxy's guarded client, see [`BlockError::find_in`](crate::BlockError::find_in))
//!   is not. A dropped response future or body (client gone) exits the entry without an error.
//! - **Blocked calls** get [`block::default_response`] or [`SentinelLayer::on_blocked`]'s response; with
//!   `Retry-After` / `grpc-retry-pushback-ms` from [`BlockError::retry_after`](crate::BlockError::retry_after).
//! - **Cost** when the layer is not used: none (nothing in the core knows about it). Per request: a route
//!   lookup by borrowed key, the entry, and no allocation beyond the extractors that must build a value
//!   (an IP address as text). Without [`SentinelLayer::axum`], axum's router boxes the layer's response body
//!   (one allocation), as it boxes every response body that is not its own `Body`.
//! - **The clock.** The engine's default clock reads the CPU's time-stamp counter at entry and at exit (no
//!   thread). [`SentinelBuilder::cached_clock`](crate::SentinelBuilder::cached_clock) (Java's millisecond
//!   ticker) saves 6–13 ns per entry on one thread, but its 1,000 wake-ups a second cost CPU all the time
//!   (2–3 % of a core in a KVM guest, idle or loaded) and preempt the worker of a server on one CPU;
//!   in that VM it pays off only past 1.5–2.7 million entries a second (the README's figures).

mod block_response;
mod body;
mod client_ip;
mod config;
pub mod extract;
mod future;
pub mod gateway;
mod layer;
mod naming;
mod outcome;
mod rate_limit;
mod refused;
mod request;
mod scope;
mod service;
#[cfg(feature = "tonic")]
mod tonic;
pub(crate) mod watched;

/// Responses for blocked calls: the defaults, for use in a custom [`SentinelLayer::on_blocked`].
pub mod block {
    pub use super::block_response::{
        default_response, grpc_code, grpc_response, http_response, http_status, GRPC_RETRY_PUSHBACK_MS,
    };
}

#[cfg(feature = "axum")]
pub use body::AxumBody;
pub use body::{BodyMode, ResponseBody, Wrapped};
pub use client_ip::{InvalidProxy, TrustedProxies};
pub use config::ExitOn;
pub use future::ResponseFuture;
pub use layer::{SentinelLayer, WEB_CONTEXT_NAME};
pub use naming::{clean_path, DEFAULT_MAX_RESOURCES, OTHER_METHODS_RESOURCE, OVERFLOW_RESOURCE};
pub(crate) use naming::{clean_segments, reserve, ID_SEGMENT};
pub use outcome::{is_error_by_default, is_overload, GrpcCode, Outcome};
pub use rate_limit::RateLimitHeaders;
pub use request::{PeerAddr, RequestView};
pub use service::SentinelService;
