//! Cluster flow control on Redis (feature `cluster-redis`): one limit across every instance of a service,
//! exact, with a local fallback when Redis fails; and rules read from Redis.
//!
//! A flow rule with `cluster_mode` and a [`ClusterConfig`](crate::flow::ClusterConfig) limits the calls of
//! every instance together: with a global threshold, `count` per second for all of them; with an
//! average-local one, `count` per live instance (Java's two threshold types). Start one [`RedisCluster`]
//! client per engine:
//!
//! ```no_run
//! use sentinel_runtime::{Sentinel, cluster::RedisCluster};
//! use sentinel_runtime::flow::{ClusterConfig, ClusterThresholdType, FlowRule};
//!
//! let engine = Sentinel::builder().app_name("shop").build();
//! let _cluster = RedisCluster::builder("redis://127.0.0.1:6379").start(&engine)?;
//! let mut rule = FlowRule::new("queryOrder").count(1000.0);
//! rule.cluster_mode = true;
//! rule.cluster_config = Some(ClusterConfig { threshold_type: ClusterThresholdType::Global, ..Default::default() });
//! engine.load_flow_rules([rule])?;
//! // 1000 calls per second to queryOrder across every instance of `shop`.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Deployments
//!
//! [`RedisCluster::builder`] takes one server's URL, [`RedisCluster::cluster_builder`] a Redis Cluster's seed
//! nodes (each rule's script goes to the shard that owns its hash tag; redirections and topology changes are
//! followed; a shard that fails makes only its own rules fall back), [`RedisCluster::sentinel_builder`] the
//! sentinels and the master's name (the master is found, and found again after a failover). Replies that
//! mean the deployment is not what the client was told (`MOVED`, `CLUSTERDOWN`, `READONLY`, `NOAUTH`) are
//! logged once per change with what to do, and shown as each rule's reason.
//!
//! # How it works
//!
//! - **No network on the common call.** Each instance leases tokens from Redis in batches (one atomic Lua
//!   script call) and spends them on the calling thread with the same lock-free machinery as the local
//!   exact limits. It asks for more before running dry, sized to its own share of the traffic (what it
//!   spends per millisecond), so a steady load costs about one Redis call per window bucket per instance.
//! - **Exact.** Redis keeps the rule's sliding window (`sampleCount` buckets over `windowIntervalMs`, time
//!   from Redis's own clock, `TIME` in the script) and grants no more than keeps every window within the
//!   limit; a lease is spent only within the bucket it was counted in, and tokens left when it ends are
//!   given back. No window admits more than the limit across all instances while Redis answers. A lease
//!   call carries a deadline on Redis's clock (when its caller stops waiting, estimated from an earlier
//!   reply so that it is never late): a call Redis runs after it (Redis hung with the call queued) grants
//!   nothing, so no token goes to a caller that gave up.
//! - **Waiting.** A call that finds its lease empty waits for Redis at most [`ClusterOptions::timeout`]
//!   (20 ms by default): a sync call blocks its thread, an async one (`enter_async`, annotated `async fn`s)
//!   awaits without blocking its executor.
//! - **Live instances.** Each instance renews its membership of each cluster rule (a sorted set scored by
//!   expiry, in the rule's slot) with a heartbeat; the count serves average-local thresholds and the
//!   fallback. An instance that stops counts no more after [`ClusterOptions::member_ttl`].
//! - **Fallback.** Redis down, slower than the timeout, or answering errors: the rule falls back to a local
//!   limit of `count ÷ live instances` (the last count seen) for global thresholds (`count` for average-local
//!   ones), or passes when the rule has no `fallbackToLocalWhenFail`, as in Java. A breaker stops asking a
//!   failing Redis (it probes again after 100 ms, doubling up to [`ClusterOptions::retry_max`]) and cluster
//!   mode resumes by itself when Redis answers again. Callers never see an error from it; the logs say why
//!   (`tracing`), and so do [`Sentinel::cluster_status`] and [`Sentinel::diagnose`].
//! - **Falling back and resuming.** Every call admitted without a leased token (by the fallback, or after its wait
//!   timed out) is counted in the shared window by the next call Redis answers, in the bucket it was admitted in (never
//!   an earlier one). When Redis answers again, a rule keeps its local limit a little longer
//!   ([`ClusterOptions::retry_max`] plus the connection and call timeouts: by then every instance has probed Redis and
//!   counted what its fallback admitted) and then leases again, from what the window has left. When an instance falls
//!   back, its local limit owes its share of what each bucket of the window held at the last reply until that bucket
//!   leaves the window: the fallbacks admit what the window frees, as it frees it. Tokens a lease gives back while
//!   Redis fails are sent again until Redis applies them (once). The bound: a window admits at most the limit, plus
//!   what instances admit locally while they cannot reach Redis (each at most its local limit, `count ÷ live` per
//!   second for global thresholds); coming back adds no second window. A window whose key was lost (a restart,
//!   `FLUSHALL`, a failover to a replica that missed writes) is made afresh with a new generation, and grants an
//!   instance nothing until it has counted there the tokens it was granted in the lost one.
//!
//! # Keys
//!
//! `sentinel:{namespace:identity}:w` (the window, a hash of buckets) and `sentinel:{namespace:identity}:m`
//! (the live instances, a sorted set): one hash tag, so under Redis Cluster a rule's keys share a slot and
//! different rules spread over the cluster. The namespace is the engine's app name unless set; the identity
//! is `flow:<flowId>` when the rule has one, else its resource and a fingerprint (see the README).
//!
//! For the dashboard's cluster pages (the command center): [`Sentinel::has_cluster_service`] (Java's
//! `getClusterMode`: 0 while a client runs, else -1), [`Sentinel::cluster_status`] (each rule's state) and
//! [`ClusterClient::status`] (the client's connection).
//!
//! [`Sentinel::cluster_status`]: crate::Sentinel::cluster_status
//! [`Sentinel::diagnose`]: crate::Sentinel::diagnose
//! [`Sentinel::has_cluster_service`]: crate::Sentinel::has_cluster_service

mod breaker;
mod config;
mod connection;
mod datasource;
mod error;
mod keys;
mod lease;
mod script;
mod status;
mod worker;

pub use config::ClusterOptions;
pub use connection::Topology;
pub use datasource::{RedisDataSource, RedisDataSourceBuilder, RedisReload, RedisSourceError};
pub use error::ClusterError;
pub use status::ClusterClientStatus;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::flow::token_service::TokenService;
use crate::Sentinel;

/// Cluster flow control on Redis: [`RedisCluster::builder`] sets it up, [`RedisClusterBuilder::start`] runs
/// it for an engine.
#[derive(Debug)]
pub struct RedisCluster;

impl RedisCluster {
    /// A client for the Redis at `url` (`redis://[user:password@]host:port[/db]`), with the defaults of
    /// [`ClusterOptions`].
    pub fn builder(url: impl Into<String>) -> RedisClusterBuilder {
        RedisClusterBuilder { opts: ClusterOptions::new(url) }
    }

    /// A client for a Redis Cluster, reached through its seed `nodes` (`redis://[user:password@]host:port`
    /// each; any of the cluster's nodes will do, several in case one is down). Each rule's script goes to
    /// the shard that owns the rule's hash tag; `MOVED`/`ASK` redirections and topology changes are
    /// followed; a shard that fails makes only its own rules fall back.
    ///
    /// ```no_run
    /// # use sentinel_runtime::{Sentinel, cluster::RedisCluster};
    /// # let engine = Sentinel::builder().app_name("shop").build();
    /// let _cluster = RedisCluster::cluster_builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]).start(&engine)?;
    /// # Ok::<(), sentinel_runtime::cluster::ClusterError>(())
    /// ```
    pub fn cluster_builder<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> RedisClusterBuilder {
        RedisClusterBuilder { opts: ClusterOptions::cluster(nodes) }
    }

    /// A client for the master that Redis Sentinel monitors as `master_name`, found through the
    /// `sentinels` (`redis://[user:password@]host:port` each). When the master fails and the sentinels
    /// promote a replica, the client finds the new master by itself (see the README for what a failover
    /// costs the limit).
    ///
    /// ```no_run
    /// # use sentinel_runtime::{Sentinel, cluster::RedisCluster};
    /// # let engine = Sentinel::builder().app_name("shop").build();
    /// let _cluster = RedisCluster::sentinel_builder(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .master_password("secret")
    /// .start(&engine)?;
    /// # Ok::<(), sentinel_runtime::cluster::ClusterError>(())
    /// ```
    pub fn sentinel_builder<S: Into<String>>(
        sentinels: impl IntoIterator<Item = S>,
        master_name: impl Into<String>,
    ) -> RedisClusterBuilder {
        RedisClusterBuilder { opts: ClusterOptions::sentinel(sentinels, master_name) }
    }
}

/// Settings of a cluster client before it starts.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisClusterBuilder {
    opts: ClusterOptions,
}

impl RedisClusterBuilder {
    /// From settings made by hand.
    pub fn from_options(opts: ClusterOptions) -> Self {
        RedisClusterBuilder { opts }
    }
    /// The key namespace (default: the engine's app name).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.opts.namespace = Some(ns.into());
        self
    }
    /// How long a call with an empty lease waits for Redis, and the bound on each Redis call (default 20 ms).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.opts.timeout = d;
        self
    }
    /// How often memberships are renewed (default 1 s).
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.opts.heartbeat_interval = d;
        self
    }
    /// How long a membership lasts without renewal (default 3 s).
    pub fn member_ttl(mut self, d: Duration) -> Self {
        self.opts.member_ttl = d;
        self
    }
    /// The longest pause between attempts to reach a failing Redis (default 1 s).
    pub fn retry_max(mut self, d: Duration) -> Self {
        self.opts.retry_max = d;
        self
    }
    /// How many instances are expected to share each global cluster rule (see
    /// [`ClusterOptions::expected_instances`]): what the fallback divides the count by while Redis fails
    /// and no live instances were seen.
    pub fn expected_instances(mut self, n: u32) -> Self {
        self.opts.expected_instances = Some(n);
        self
    }
    /// This instance's member name (default `host:pid:random`).
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.opts.instance_id = Some(id.into());
        self
    }
    /// Behind Sentinel: the master's user (ACLs). Ignored for other deployments.
    pub fn master_username(mut self, user: impl Into<String>) -> Self {
        if let Topology::Sentinel { master_username, .. } = &mut self.opts.topology {
            *master_username = Some(user.into());
        }
        self
    }
    /// Behind Sentinel: the master's password (the sentinels' own go in their URLs). Ignored for other
    /// deployments.
    pub fn master_password(mut self, password: impl Into<String>) -> Self {
        if let Topology::Sentinel { master_password, .. } = &mut self.opts.topology {
            *master_password = Some(password.into());
        }
        self
    }
    /// The settings.
    pub fn options(&self) -> &ClusterOptions {
        &self.opts
    }

    /// Starts the client for `engine` and registers it as the engine's token service: cluster rules in
    /// force, and those loaded later, lease from Redis. Fails only on bad settings (a URL that does not
    /// parse, contradicting durations); a Redis that is down is not an error: rules fall back to local
    /// limits until it answers (see [`ClusterClient::wait_connected`]). Dropping the returned client stops it
    /// (it leaves the member sets, gives unspent tokens back, and the rules are decided locally again).
    pub fn start(self, engine: &Sentinel) -> Result<ClusterClient, ClusterError> {
        let opts = self.opts;
        opts.validate()?;
        let link = opts.topology.link()?;
        let namespace = opts.namespace.clone().unwrap_or_else(|| engine.config().app_name.clone());
        let member = opts.instance_id.clone().unwrap_or_else(worker::default_instance_id);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sentinel-cluster-io")
            .enable_all()
            .build()
            .map_err(|source| ClusterError::Thread { what: "cluster I/O", source })?;
        let client = Arc::new(worker::ClientState {
            stop: std::sync::atomic::AtomicBool::new(false),
            status: Mutex::new(ClusterClientStatus {
                url: opts.topology.describe(),
                namespace: namespace.clone(),
                instance_id: member.clone(),
                connected: false,
                stopped: false,
                last_error: None,
                rules: 0,
            }),
            status_changed: Condvar::new(),
        });
        let service = Arc::new(worker::Service::new(opts.timeout, &opts.topology, client.clone(), engine.now_millis()));
        let w = worker::Worker::new(engine.clone(), service.clone(), client.clone(), opts, namespace, member, rt, link);
        let thread = std::thread::Builder::new()
            .name("sentinel-cluster".into())
            .spawn(move || w.run())
            .map_err(|source| ClusterError::Thread { what: "cluster", source })?;
        // Set before the service is registered: attaching a lease unparks this thread.
        let _ = service.thread.set(thread.thread().clone());
        let svc: Arc<dyn TokenService> = service.clone();
        if let Err(e) = engine.set_cluster_service(Some(svc)) {
            // Rebuilding the rules in force cannot fail for rules that were valid; stop the thread anyway.
            client.stop.store(true, Ordering::Release);
            thread.thread().unpark();
            let _ = thread.join();
            return Err(ClusterError::Option { field: "rules", reason: e.to_string() });
        }
        Ok(ClusterClient { client, thread: Some(thread) })
    }
}

/// A running cluster client. Dropping it stops it.
#[must_use = "dropping the client stops cluster flow control at once"]
pub struct ClusterClient {
    client: Arc<worker::ClientState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient").field("status", &self.status()).finish()
    }
}

impl ClusterClient {
    /// The client's state.
    pub fn status(&self) -> ClusterClientStatus {
        self.client.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until Redis answered (at most `timeout`): `Err` with the last failure if it did not. Rules fall
    /// back to local limits meanwhile; this is for a service that wants to know at start.
    pub fn wait_connected(&self, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.client.status.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if s.connected {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline || s.stopped {
                let reason = s.last_error.clone().unwrap_or_else(|| "no answer yet".to_string());
                return Err(ClusterError::Unavailable { reason });
            }
            s = self.client.status_changed.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Stops the client (as dropping it does) and waits for it to leave.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(t) = self.thread.take() {
            self.client.stop.store(true, Ordering::Release);
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for ClusterClient {
    fn drop(&mut self) {
        self.stop_now();
    }
}
