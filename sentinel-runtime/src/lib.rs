//! # sentinel-runtime
//!
//! Flow control, circuit breaking and adaptive overload protection for Rust services, in the spirit of
//! Alibaba Sentinel: resources guarded by rules (flow, degrade, system, hot-parameter, authority), a
//! statistics tree over lock-free sliding windows, and a slot chain in Sentinel's order.
//!
//! ```
//! use sentinel_runtime::{Sentinel, flow::FlowRule};
//!
//! let engine = Sentinel::builder().build();
//! engine.load_flow_rules(vec![FlowRule::new("queryOrder").count(10.0)]).unwrap();
//! let query_order = engine.resource("queryOrder");
//! match query_order.enter() {
//!     Ok(_entry) => { /* do the work; the entry exits when dropped */ }
//!     Err(blocked) => eprintln!("{blocked}"),
//! };
//! ```
//!
//! # Guide
//!
//! **Resources and entries.** A resource is a name (and an [`EntryType`]: inbound calls count toward system
//! rules). [`Sentinel::resource`] gives a cheap handle; [`Resource::enter`] runs the checks and returns an
//! [`Entry`] or a [`BlockError`]. The entry exits when dropped, on every path (early return, `?`, panic);
//! [`Entry::trace`] marks the call as failed for statistics and circuit breakers. Annotated functions
//! (`#[sentinel_resource]`) hold their handle in a `static` and do no lookup per call.
//!
//! **Contexts and origins.** A context is a named entrance with a caller origin
//! ([`Sentinel::enter_context`]); nested entries form a call tree below it. Without one, entries use the
//! default context with an empty origin. Flow rules choose the node they read by `limit_app` (a specific
//! origin, `"other"`, `"default"`) and strategy (direct, relate, chain). Origins are bounded
//! ([`Config::max_origins`], [`Config::max_origins_per_resource`]): callers past the caps run as
//! [`UNTRACKED_ORIGIN`], while origins that rules name are always tracked.
//!
//! **Entries across threads and `.await`.** An entry of a borrowed handle ([`Resource::enter`]) is the
//! innermost entry of its thread until it exits (later entries nest under it). An owned entry
//! ([`Resource::entry_owned`]) and any [`EntryBuilder::enter_async`] entry joins the active context but never
//! changes a thread's context: it can move into a future or a response body and exit on any thread.
//! [`Entry::in_scope`] and [`Entry::instrument`] run work with it as the innermost entry (the web layer
//! wraps each request's handler this way). Annotated `async fn`s carry their context in their future.
//!
//! **Rules.** Each kind has a data type with builder methods ([`flow::FlowRule`],
//! [`circuit_breaker::DegradeRule`], [`system::SystemRule`], [`param_flow::ParamFlowRule`],
//! [`authority::AuthorityRule`]) and a `load_*_rules` method that replaces the kind's whole set. An invalid
//! rule rejects the set with [`RuleError`], naming the rule and the field; the rules in force stay. Equal
//! rules keep their state (a rate limiter's last pass, a breaker's state) across reloads.
//!
//! **Reading numbers.** [`Sentinel::cluster_stats`], [`Sentinel::origin_stats`],
//! [`Sentinel::context_stats`], [`Sentinel::entrance_stats`], [`Sentinel::inbound_stats`] and
//! [`Sentinel::tree`] return [`NodeStats`] (pass/block/success/exception per second, response times,
//! concurrency, last-minute totals).
//!
//! **Testing.** Build an isolated engine with a [`clock::ManualClock`] and advance it; nothing sleeps,
//! nothing is shared between tests. [`Sentinel::leak`] and [`Sentinel::scoped`] let such an engine stand in
//! for the global one, so annotated functions can be tested the same way.
//!
//! **Web services.** With feature `axum`, `tonic` or `tower`, `web::SentinelLayer` guards every request of
//! an axum, tonic or hyper 1 service: an inbound resource per route template or gRPC method, the caller's
//! origin and hot parameters from the request, 429 / 503 / 403 (or the gRPC status) with `Retry-After`
//! from the rule that blocked ([`BlockError::retry_after`]).
//! **The Sentinel Dashboard.** With the `transport` feature, `transport::CommandCenter` serves the
//! dashboard's command protocol, sends it heartbeats, keeps 5 minutes of per-second history and serves a
//! live console of its own, on `127.0.0.1:8719`; rules pushed from either are written back to the rules file.
//!
//! **Extending.** [`Sentinel::add_slot`] inserts a check at any order of the chain;
//! [`Sentinel::on_block`] observes every blocked call.
//!
//! **Performance.** Entry and exit take no lock and make no allocation (a hot-parameter value seen for the
//! first time holds the insert bits of two sets of its rule's table for a few dozen instructions; a check of
//! a tracked value takes none). Counters are striped per thread (plain stores to a cache line only that
//! thread writes); rules are read in an RCU section whose only fence on the reader's side is a
//! compiler fence (the writer runs a process-wide `membarrier`); the clock is the CPU's time-stamp counter,
//! read at entry and exit (no ticker thread; Java's cached `TimeUtil` timestamp is
//! [`SentinelBuilder::cached_clock`]); reject-style limits spend tokens leased to the thread from an exact
//! per-bucket budget with plain stores, so they never over-admit and still scale with cores; closed circuit
//! breakers count good calls the same way. An entry with one passing flow rule costs about 700 instructions:
//! 50 ns on a 2-core Intel Xeon guest on the default clock, 38 ns on the cached one, in one run of 2026-12-07
//! (`docs/performance.md` in the repository has the figures, the peers, the method and the machine).
//!
//! # Features
//!
//! The core (resources, rules, statistics, `diagnose`, configuration from the environment) has no optional
//! dependency. The rest is behind cargo features; on docs.rs every optional item shows the feature it needs.
//!
//! | feature | adds |
//! |---|---|
//! | `serde` | rules as data: Sentinel's JSON, YAML and TOML (`datasource`) |
//! | `file-watch` | `datasource::FileDataSource`: rules files watched and written back (implies `serde`) |
//! | `logs` | Sentinel's metric log and block log, and a metric searcher (`log`) |
//! | `prometheus` | `exporter::render`: Prometheus text |
//! | `http-exporter` | `exporter::MetricsServer`: `GET /metrics` over HTTP (implies `prometheus`) |
//! | `transport` | `transport::CommandCenter`: the Sentinel Dashboard's protocol and a live console |
//! | `tower` | `web::SentinelLayer` (inbound) and `outbound::SentinelClientLayer` (outbound) |
//! | `axum`, `tonic` | `tower` plus route templates, peer addresses and status conversions of each framework |
//! | `reqwest` | `outbound::SentinelMiddleware` for reqwest-middleware (implies `tower`) |
//! | `cluster-redis` | `cluster`: cluster flow control and rules on Redis |
//! | `etcd`, `zookeeper` | `datasource::EtcdDataSource`, `datasource::ZookeeperDataSource` |
//! | `anyhow` | `AsBlockError` for `anyhow::Error`: a nested block in an annotated fn's `anyhow::Result` |
//!
//! # Stability
//!
//! These public enums are `#[non_exhaustive]` because Sentinel has more of them or will: match them with a
//! wildcard arm. Rule kinds and codes: [`RuleKind`], [`flow::FlowGrade`], [`flow::FlowStrategy`],
//! [`flow::ControlBehavior`], [`flow::ClusterThresholdType`], [`circuit_breaker::DegradeGrade`]; why a call was
//! blocked: [`BlockError`], [`SystemLimit`]; every error enum ([`RuleError`], [`ContextError`], the data
//! sources', the command center's, the cluster's); and [`config::ClockKind`], [`stat::MetricEvent`], the data
//! sources' `Format` and `Reloaded`. The rule structs are not: build them with `new` and the builder methods,
//! or with a struct literal and `..Default::default()`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(rust_2018_idioms)]
#![warn(missing_debug_implementations)]

pub mod adaptive;
pub mod authority;
mod chain;
pub mod circuit_breaker;
pub mod clock;
#[cfg(feature = "cluster-redis")]
pub mod cluster;
pub mod config;
pub mod context;
#[cfg(feature = "serde")]
pub mod datasource;
// fastjson's leniency made strict JSON: read by the rule documents and the gateway's JSON alike.
mod debug_impls;
pub mod diagnose;
mod engine;
mod entry;
mod error;
#[cfg(feature = "prometheus")]
pub mod exporter;
pub mod flow;
#[cfg(feature = "serde")]
mod lenient_json;
/// Gateway flow control, at its former path: see [`web::gateway`].
#[cfg(feature = "tower")]
#[doc(hidden)]
pub use web::gateway;
#[cfg(any(feature = "transport", feature = "http-exporter"))]
mod http_server;
mod inspect;
#[cfg(feature = "logs")]
pub mod log;
mod macro_support;
mod names;
mod node;
mod observe;
#[cfg(feature = "tower")]
pub mod outbound;
pub mod param_flow;
pub mod pattern;
mod rcu;
pub mod registry;
mod resource;
mod rules;
pub mod slot;
pub mod stat;
pub mod system;
#[cfg(feature = "transport")]
pub mod transport;
mod wait;
#[cfg(feature = "tower")]
pub mod web;

pub use config::Caps;
pub use config::{
    Config, CONTEXT_OVERFLOW, DEFAULT_MAX_CONTEXTS, DEFAULT_MAX_ORIGINS, DEFAULT_MAX_ORIGINS_PER_RESOURCE,
    DEFAULT_MAX_RESOURCES, RESOURCE_OVERFLOW, RESOURCE_PATTERNS_OVERFLOW,
};
pub use context::{ContextError, ContextGuard};
pub use diagnose::Diagnosis;
pub use engine::{AlreadyInitialized, Sentinel, SentinelBuilder, WeakSentinel};
pub use entry::{Entry, EntryBuilder, Instrumented};
pub use error::{AsBlockError, BlockError, RuleError, RuleKind, SystemLimit, Timeout};
pub use inspect::{NodeStats, SecondTotals, TreeNode};
pub use resource::{EntryType, Resource};
pub use sentinel_macros::sentinel_resource;

pub use names::{DEFAULT_CONTEXT_NAME, LIMIT_APP_DEFAULT, LIMIT_APP_OTHER, UNTRACKED_ORIGIN};

#[doc(hidden)]
pub mod __private {
    //! Support for code generated by `#[sentinel_resource]`. Not a public API.
    use std::sync::OnceLock;

    pub use crate::context::CarriedContext;
    pub use crate::macro_support::*;
    pub use crate::param_flow::HotParam;
    pub use crate::registry::ResourceDescriptor;
    use crate::{EntryType, Resource, Sentinel};
    pub use inventory;

    /// One annotated function's cached resource handle (a `static` in the generated code).
    pub struct ResourceSite {
        name: &'static str,
        entry_type: EntryType,
        global: OnceLock<Resource>,
        /// For a method whose impl block carries no attribute: `module::function`, completed with the type's
        /// name from `Self` at the first call (a `static` cannot name `Self`).
        method: Option<(&'static str, &'static str)>,
        method_name: OnceLock<Box<str>>,
        descriptor: OnceLock<ResourceDescriptor>,
    }

    impl ResourceSite {
        /// A site for the resource `name`.
        pub const fn new(name: &'static str, entry_type: EntryType) -> Self {
            ResourceSite {
                name,
                entry_type,
                global: OnceLock::new(),
                method: None,
                method_name: OnceLock::new(),
                descriptor: OnceLock::new(),
            }
        }

        /// A site for the method `function` of a type of module `module`, named `module::Type::function` from
        /// `Self` at the first call (see [`ResourceSite::method_resource`]).
        pub const fn method(module: &'static str, function: &'static str, entry_type: EntryType) -> Self {
            ResourceSite {
                name: "",
                entry_type,
                global: OnceLock::new(),
                method: Some((module, function)),
                method_name: OnceLock::new(),
                descriptor: OnceLock::new(),
            }
        }

        /// The resource in the engine this thread uses: no lookup once cached.
        #[inline]
        pub fn resource(&'static self) -> &'static Resource {
            let Some(engine) = Sentinel::overriding(crate::context::current().override_engine) else {
                if let Some(r) = self.global.get() {
                    return r;
                }
                return self.init_global(self.name);
            };
            engine.site_resource(self as *const Self as usize, self.name, self.entry_type)
        }

        /// The resource of a method site: `self_type` is `core::any::type_name::<Self>`, read once.
        #[inline]
        pub fn method_resource(&'static self, self_type: fn() -> &'static str) -> &'static Resource {
            let Some(engine) = Sentinel::overriding(crate::context::current().override_engine) else {
                if let Some(r) = self.global.get() {
                    return r;
                }
                return self.init_global(self.method_name(self_type));
            };
            engine.site_resource(self as *const Self as usize, self.method_name(self_type), self.entry_type)
        }

        fn method_name(&'static self, self_type: fn() -> &'static str) -> &'static str {
            self.method_name.get_or_init(|| {
                let (module, function) = self.method.unwrap_or(("", ""));
                crate::registry::method_resource_name(module, self_type(), function).into_boxed_str()
            })
        }

        /// The registry's descriptor of a method site: `base` with the name found at the first call, once
        /// there was one.
        pub fn resolved_descriptor(&'static self, base: &ResourceDescriptor) -> Option<&'static ResourceDescriptor> {
            let name: &'static str = self.method_name.get()?;
            Some(self.descriptor.get_or_init(|| ResourceDescriptor { name, resolve: None, ..*base }))
        }

        #[cold]
        fn init_global(&'static self, name: &str) -> &'static Resource {
            self.global.get_or_init(|| Sentinel::global().site_resource_typed(name, self.entry_type))
        }
    }
}

/// The README's examples, compiled and run as doctests so that they cannot drift from the API. They use the
/// integrations, so they are checked with every feature on (`cargo test -p sentinel-runtime --all-features --doc`).
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "reqwest",
    feature = "transport",
    feature = "file-watch",
    feature = "logs",
    feature = "prometheus",
    feature = "cluster-redis"
))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The complete programs of the user guide's pages, compiled (and run, but for servers) like the README's.
#[cfg(all(doctest, feature = "transport", feature = "file-watch", feature = "cluster-redis", feature = "etcd"))]
#[doc = include_str!("../../docs/macro.md")]
#[doc = include_str!("../../docs/cluster.md")]
#[doc = include_str!("../../docs/dashboard.md")]
#[doc = include_str!("../../docs/datasources.md")]
pub struct GuideDoctests;
