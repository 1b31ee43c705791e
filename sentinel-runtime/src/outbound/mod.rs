//! Outbound guards (feature `tower`; `reqwest` for reqwest-middleware): protect the calls a service makes
//! to its downstreams, as Java Sentinel's client adapters (OkHttp, Feign, the gRPC client) do.
//!
//! ```text
//! call ─▶ guard ─ name it (ResourceName extension, closure, gRPC method, route template, METHOD:host/path)
//!               ─ the downstream asked to back off and the time has not passed ─▶ blocked, not sent
//!               ─ enter an outbound resource ── blocked ─▶ ClientError::Blocked / Error::Middleware / fallback
//!               ─ wait out a queueing decision on a timer (never blocking a worker)
//!               ─ send it; time limit ─▶ dropped, Timeout (an error and a slow call)
//!               ─ transport error, 5xx, 429, failing gRPC status ─▶ traced; Retry-After heard
//!               ─ exit at the answer's head, or at the body's end (gRPC: always, the status is in the trailers)
//! ```
//!
//! Entries are outbound ([`EntryType::Out`](crate::EntryType)): system rules do not apply to them, as in
//! Java; flow rules (QPS or thread grade), circuit breakers and adaptive limits on the downstream's resource
//! do. A call carries no hot-parameter values (as with Java's client adapters), so hot-parameter rules on it
//! find none and pass it. A call made inside a guarded request joins its context.
//!
//! # reqwest
//!
//! ```
//! # #[cfg(feature = "reqwest")] {
//! use sentinel_runtime::{Sentinel, outbound::SentinelMiddleware};
//! let engine = Sentinel::builder().build();
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(SentinelMiddleware::new(&engine).route_templates(["inventory.svc/items/{id}"]).unwrap())
//!     .build();
//! # let _ = client; }
//! ```
//!
//! A blocked call returns `reqwest_middleware::Error::Middleware` holding the [`BlockError`](crate::BlockError):
//! `err.downcast_ref::<BlockError>()` in the `Middleware` arm; a time limit, a [`Timeout`](crate::Timeout).
//!
//! # tonic and hyper
//!
//! Wrap the client with `ServiceBuilder` before the generated client, as tonic's own examples do; with
//! feature `tonic`, `.map_err(tonic::Status::from)` makes a blocked call a `Status` the caller can match
//! (`RESOURCE_EXHAUSTED`, `UNAVAILABLE` for an open breaker, with `grpc-retry-pushback-ms`):
//!
//! ```ignore
//! let channel = ServiceBuilder::new()
//!     .map_err(tonic::Status::from)
//!     .layer(SentinelClientLayer::new(&engine))
//!     .service(Channel::from_static("http://inventory:50051").connect_lazy());
//! let client = InventoryClient::new(channel);
//! ```
//!
//! hyper-util's `Client` (and any `Service<http::Request<B>>` that answers `http::Response`) takes the layer
//! the same way; its answers carry a [`ClientBody`].
//!
//! # Behaviour
//!
//! - **Names**: see [`OutboundGuard::route_templates`] and [`ResourceName`]; identifiers in paths never make resources
//!   ([`clean_path`](crate::web::clean_path)), and the number of names is bounded
//!   ([`OutboundGuard::max_resources`]), past which names a rule targets still get their own.
//! - **Errors** ([`is_downstream_error`], [`OutboundGuard::trace_if`]): transport errors, the time limit,
//!   HTTP 5xx and 429, gRPC `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `INTERNAL`, `UNKNOWN`,
//!   `DATA_LOSS` (in the headers or the trailers; an answer without a `grpc-status` is `UNKNOWN`, a non-200
//!   HTTP status the gRPC status clients map it to, 400 `INTERNAL`, 503 `UNAVAILABLE`). A dropped future or
//!   body (the caller gave up) exits without an error. For adaptive rules, a transport error counts as a drop
//!   (as gRPC's `UNAVAILABLE`, which is what tonic's callers see of it), and so do gRPC `UNAVAILABLE`,
//!   `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED` and the HTTP answers gRPC maps to `UNAVAILABLE` (429, 502, 503,
//!   504); a call dropped before its answer gives no sample.
//! - **Listening to the downstream**: a 429 or 503 with `Retry-After` (seconds or an HTTP-date), or a gRPC
//!   answer with `grpc-retry-pushback-ms`, holds back further calls to that resource until then (capped,
//!   [`OutboundGuard::max_pushback`], 60 s by default), measured on the engine's clock: the caller gets
//!   [`BlockError::Pushback`](crate::BlockError::Pushback) at once instead of adding load. Such a block is
//!   decided before the entry, so it does not appear in the resource's block counts.

mod body;
mod error;
mod future;
mod guard;
mod layer;
mod naming;
mod request;
#[cfg(feature = "reqwest")]
mod reqwest;
mod service;
mod signal;

pub use body::ClientBody;
pub use error::ClientError;
pub use future::ResponseFuture;
pub use guard::DEFAULT_MAX_PUSHBACK;
#[cfg(feature = "reqwest")]
pub use layer::SentinelMiddleware;
pub use layer::{client, OutboundGuard, SentinelClientLayer};
pub use naming::{InvalidTemplate, OUTBOUND_OVERFLOW_RESOURCE};
pub use request::{CallView, ResourceName};
pub use service::SentinelClientService;
pub use signal::is_downstream_error;
