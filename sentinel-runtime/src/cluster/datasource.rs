//! Rules from Redis: Java's `RedisDataSource` semantics.
//!
//! Each source is a key holding a rule document (one kind's list in Sentinel's JSON, as Java's data source
//! holds, or a combined [`crate::datasource::RuleSet`] document) and a channel on which updates
//! are announced: the message is the new document. A publisher writes both at once, as Java's documentation
//! says:
//!
//! ```text
//! MULTI
//! SET sentinel:shop:flow-rules '[{"resource": "queryOrder", "count": 100}]'
//! PUBLISH sentinel:shop:flow-rules:changed '[{"resource": "queryOrder", "count": 100}]'
//! EXEC
//! ```
//!
//! The data source reads every key when it starts and whenever it reconnects (so an update published while
//! it was disconnected is not missed), and applies each message at once. A document that does not parse or
//! that the engine rejects is reported (logged, and given to [`RedisDataSource::on_reload`] listeners) and
//! the rules in force stay. Losing the connection is reported too, and the data source reconnects by itself
//! (after 100 ms, then doubling up to a bound).
//!
//! On a Redis Cluster ([`RedisDataSource::cluster_builder`]) each key is read from the shard that owns its
//! slot, and the data source subscribes with classic pub/sub on the first seed node that answers: a
//! `PUBLISH` made on any node reaches the subscribers of every node (the cluster bus forwards it), so the
//! writers keep the `MULTI`/`SET`/`PUBLISH` above unchanged (sharded pub/sub would need every writer,
//! Java's included, to use `SPUBLISH`). Behind Redis Sentinel ([`RedisDataSource::sentinel_builder`]) it
//! reads and subscribes on the master the sentinels name, and looks it up again after each lost
//! connection (a failover).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};

use crate::datasource::entry::{too_large, Holds, MAX_ENTRY_BYTES};

/// How often the subscription connection is checked (a `PING`, answered within the 2 s timeout).
const SUBSCRIPTION_CHECK: Duration = Duration::from_secs(1);

/// Reads a key holding at most `ARGV[1]` bytes: nothing (no key), its length (longer: not read), or its value;
/// a key of another type is refused as `GET` refuses it (WRONGTYPE).
const BOUNDED_GET: &str = r#"
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return false end
if t ~= 'string' then return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value') end
local n = redis.call('STRLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])
"#;
use crate::datasource::{ApplyError, Format, ParseError, RuleSet, SourceStatus, WritableDataSource, WriteBackError};

/// Whether the server refused to run the reading script itself (an ACL user without `EVAL`, scripting
/// renamed away), rather than the read.
fn script_refused(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().to_ascii_lowercase().contains("unknown command")
}
use crate::{RuleError, RuleKind, Sentinel};

use super::connection::{Link, Topology};
use super::error::ClusterError;

/// One key and its channel.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Source {
    /// What the key holds.
    holds: Holds,
    key: String,
    channel: String,
}

/// What happened to one source: a reload's outcome, given to [`RedisDataSource::on_reload`] listeners.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RedisReload {
    /// The document changed and its rules are in force.
    Applied {
        /// The key (or the channel's key) the document came from.
        key: String,
        /// The kinds it holds.
        kinds: Vec<RuleKind>,
    },
    /// The document equals the one applied last.
    Unchanged {
        /// The key.
        key: String,
    },
    /// The key does not exist (yet): nothing to apply.
    Missing {
        /// The key.
        key: String,
    },
    /// The document was not applied; the rules in force stay.
    Rejected(RedisSourceError),
}

/// Why a document from Redis was not applied, or why the data source is not connected.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisSourceError {
    /// Not a rule document (syntax, wrong type, unknown field, bad code).
    #[error("rules from Redis key `{key}`: {error}; the rules in force stay")]
    Parse {
        /// The key of the source.
        key: String,
        /// Where and why.
        #[source]
        error: ParseError,
    },
    /// A rule is invalid (the engine rejected the set).
    #[error("rules from Redis key `{key}`: {error}")]
    Invalid {
        /// The key of the source.
        key: String,
        /// The rule and the field.
        #[source]
        error: RuleError,
    },
    /// A gateway flow rule or API definition is invalid (the engine rejected the document; feature `tower`).
    #[cfg(feature = "tower")]
    #[error("gateway rules from Redis key `{key}`: {error}")]
    InvalidGateway {
        /// The key of the source.
        key: String,
        /// The rule or definition and the field.
        #[source]
        error: crate::web::gateway::GatewayRuleError,
    },
    /// Redis is unreachable (the data source reconnects by itself).
    #[error("Redis data source at {url}: {reason}; reconnecting, the rules in force stay")]
    Unavailable {
        /// The URL (password hidden).
        url: String,
        /// The failure.
        reason: String,
    },
}

type Listener = dyn Fn(&RedisReload) + Send + Sync;

struct Inner {
    engine: Sentinel,
    /// Where Redis runs, for messages (passwords hidden).
    target: String,
    link: tokio::sync::Mutex<Link>,
    sources: Vec<Source>,
    retry_max: Duration,
    /// The text applied last, per source.
    applied: Mutex<Vec<Option<String>>>,
    last_error: Mutex<Option<RedisSourceError>>,
    listeners: Mutex<Vec<Arc<Listener>>>,
    connected: AtomicBool,
    /// When a document was last applied (ms since the Unix epoch; 0: never).
    last_load_ms: std::sync::atomic::AtomicU64,
    stop: AtomicBool,
    stop_notify: tokio::sync::Notify,
    /// Bumped after every applied or rejected document (for [`RedisDataSource::wait_for`]).
    events: Mutex<u64>,
    events_changed: std::sync::Condvar,
    /// Tests: stops a session after each read of a key, before the barrier after it (`"after read"`).
    #[cfg(test)]
    gate: crate::datasource::gate::Gate,
}

/// Rules read from Redis keys and reloaded when a change is announced on their channels.
///
/// ```no_run
/// use sentinel_runtime::{RuleKind, Sentinel, cluster::RedisDataSource};
/// let engine = Sentinel::builder().app_name("shop").build();
/// let source = RedisDataSource::builder("redis://127.0.0.1:6379")
///     .rules(RuleKind::Flow, "sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed")
///     .rules(RuleKind::Degrade, "sentinel:shop:degrade-rules", "sentinel:shop:degrade-rules:changed")
///     .start(&engine)?;
/// source.on_reload(|r| println!("{r:?}"));
/// # Ok::<(), sentinel_runtime::cluster::ClusterError>(())
/// ```
#[must_use = "dropping the data source stops it"]
pub struct RedisDataSource {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for RedisDataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDataSource")
            .field("redis", &self.inner.target)
            .field("sources", &self.inner.sources)
            .finish_non_exhaustive()
    }
}

/// The sources of a [`RedisDataSource`] before it starts.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisDataSourceBuilder {
    topology: Topology,
    sources: Vec<Source>,
    retry_max: Duration,
}

impl RedisDataSource {
    /// A data source on the Redis at `url`; add its keys with [`RedisDataSourceBuilder::rules`] or
    /// [`RedisDataSourceBuilder::rule_set`].
    pub fn builder(url: impl Into<String>) -> RedisDataSourceBuilder {
        Self::with_topology(Topology::Standalone { url: url.into() })
    }

    /// A data source on a Redis Cluster reached through its seed `nodes` (`redis://host:port` each).
    pub fn cluster_builder<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> RedisDataSourceBuilder {
        Self::with_topology(Topology::cluster(nodes))
    }

    /// A data source on the master that the `sentinels` (`redis://[user:password@]host:port` each, with
    /// the sentinels' own credentials, if any) monitor as `master_name`; the master's credentials, if it
    /// needs them: [`RedisDataSourceBuilder::master_password`] and [`RedisDataSourceBuilder::master_username`].
    ///
    /// ```no_run
    /// use sentinel_runtime::{RuleKind, Sentinel, cluster::RedisDataSource};
    /// let engine = Sentinel::builder().app_name("shop").build();
    /// let source = RedisDataSource::sentinel_builder(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "mymaster")
    ///     .master_password("secret")
    ///     .rules(RuleKind::Flow, "sentinel:shop:flow-rules", "sentinel:shop:flow-rules:changed")
    ///     .start(&engine)?;
    /// # Ok::<(), sentinel_runtime::cluster::ClusterError>(())
    /// ```
    pub fn sentinel_builder<S: Into<String>>(
        sentinels: impl IntoIterator<Item = S>,
        master_name: impl Into<String>,
    ) -> RedisDataSourceBuilder {
        Self::with_topology(Topology::sentinel(sentinels, master_name))
    }

    /// A data source on the Redis deployment `topology`.
    pub fn with_topology(topology: Topology) -> RedisDataSourceBuilder {
        RedisDataSourceBuilder { topology, sources: Vec::new(), retry_max: Duration::from_secs(2) }
    }

    /// Calls `f` after every reload (a document applied, unchanged, missing or rejected, or the connection
    /// lost).
    pub fn on_reload(&self, f: impl Fn(&RedisReload) + Send + Sync + 'static) {
        self.inner.listeners.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(f));
    }

    /// The last failure, until a document is applied again.
    pub fn last_error(&self) -> Option<RedisSourceError> {
        self.inner.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the data source is subscribed (connected) now.
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Acquire)
    }

    /// Waits (at most `timeout`) until `n` documents in all were applied or rejected since the start;
    /// returns whether that happened. For tests and start-up checks.
    pub fn wait_for(&self, n: u64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut events = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        while *events < n {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            events =
                self.inner.events_changed.wait_timeout(events, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Stops the data source (as dropping it does).
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(t) = self.thread.take() {
            self.inner.stop.store(true, Ordering::Release);
            self.inner.stop_notify.notify_one();
            let _ = t.join();
        }
    }
}

impl Drop for RedisDataSource {
    fn drop(&mut self) {
        self.stop_now();
    }
}

impl RedisDataSourceBuilder {
    /// One kind's rules (a JSON list, as Java's data source holds) in `key`, updates announced on `channel`.
    pub fn rules(mut self, kind: RuleKind, key: impl Into<String>, channel: impl Into<String>) -> Self {
        self.sources.push(Source { holds: Holds::Kind(kind), key: key.into(), channel: channel.into() });
        self
    }

    /// A combined document (`{"flowRules": [...], "degradeRules": [...]}`, with the gateway's `gwFlowRules`
    /// and `gwApiDefinitions`) in `key`, updates on `channel`.
    pub fn rule_set(mut self, key: impl Into<String>, channel: impl Into<String>) -> Self {
        self.sources.push(Source { holds: Holds::Combined, key: key.into(), channel: channel.into() });
        self
    }

    /// The gateway's flow rules (a JSON list, Java's `gw-flow-rules` document) in `key`, updates on
    /// `channel` (feature `tower`).
    #[cfg(feature = "tower")]
    pub fn gateway_rules(mut self, key: impl Into<String>, channel: impl Into<String>) -> Self {
        self.sources.push(Source { holds: Holds::GatewayRules, key: key.into(), channel: channel.into() });
        self
    }

    /// The gateway's API definitions (a JSON list, Java's `gw-api-definitions` document) in `key`, updates
    /// on `channel` (feature `tower`).
    #[cfg(feature = "tower")]
    pub fn api_definitions(mut self, key: impl Into<String>, channel: impl Into<String>) -> Self {
        self.sources.push(Source { holds: Holds::ApiDefinitions, key: key.into(), channel: channel.into() });
        self
    }

    /// Behind Sentinel: the master's user (ACLs), as
    /// [`RedisClusterBuilder::master_username`](crate::cluster::RedisClusterBuilder::master_username) takes
    /// it. Ignored for other deployments (their credentials go in their URLs).
    pub fn master_username(mut self, user: impl Into<String>) -> Self {
        if let Topology::Sentinel { master_username, .. } = &mut self.topology {
            *master_username = Some(user.into());
        }
        self
    }

    /// Behind Sentinel: the master's password (and its replicas', which the sentinels may promote; the
    /// sentinels' own go in their URLs). Ignored for other deployments (their credentials go in their URLs).
    pub fn master_password(mut self, password: impl Into<String>) -> Self {
        if let Topology::Sentinel { master_password, .. } = &mut self.topology {
            *master_password = Some(password.into());
        }
        self
    }

    /// The longest pause between reconnection attempts (default 2 s).
    pub fn retry_max(mut self, d: Duration) -> Self {
        self.retry_max = d;
        self
    }

    /// Starts the data source on its own thread: reads every key, subscribes to the channels. A Redis that
    /// is down is not an error (it is reported and retried); bad settings are.
    pub fn start(self, engine: &Sentinel) -> Result<RedisDataSource, ClusterError> {
        if self.sources.is_empty() {
            return Err(ClusterError::Source {
                reason: "no key: add one with `rules`, `rule_set`, `gateway_rules` or `api_definitions`".into(),
            });
        }
        for s in &self.sources {
            if s.key.trim().is_empty() || s.channel.trim().is_empty() {
                return Err(ClusterError::Source { reason: format!("blank key or channel in {s:?}") });
            }
        }
        if self.retry_max.is_zero() {
            return Err(ClusterError::Option { field: "retry_max", reason: "must be > 0".into() });
        }
        let link = self.topology.link()?;
        let inner = Arc::new(Inner {
            engine: engine.clone(),
            target: self.topology.describe(),
            link: tokio::sync::Mutex::new(link),
            applied: Mutex::new(vec![None; self.sources.len()]),
            sources: self.sources,
            retry_max: self.retry_max,
            last_error: Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
            connected: AtomicBool::new(false),
            last_load_ms: std::sync::atomic::AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_notify: tokio::sync::Notify::new(),
            events: Mutex::new(0),
            events_changed: std::sync::Condvar::new(),
            #[cfg(test)]
            gate: Default::default(),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| ClusterError::Thread { what: "Redis data source", source })?;
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name("sentinel-redis-rules".into())
            .spawn(move || rt.block_on(run.run()))
            .map_err(|source| ClusterError::Thread { what: "Redis data source", source })?;
        Ok(RedisDataSource { inner, thread: Some(thread) })
    }
}

impl Inner {
    /// A plain client for the server that holds `key`, from any thread (a runtime of its own on a thread
    /// of its own: the caller may be on an async runtime).
    fn client_for_key(&self, key: &str) -> Result<(redis::Client, bool), String> {
        let timeout = Duration::from_secs(2);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("cannot start a runtime: {e}"))?;
                    rt.block_on(async {
                        let mut link = self.link.lock().await;
                        // A quarter of the bound per seed node: one that hangs leaves time to ask others.
                        tokio::time::timeout(timeout, link.client_for_key(key, timeout / 4))
                            .await
                            .map_err(|_| "no answer within 2 s".to_string())?
                            .map_err(|e| e.to_string())
                    })
                })
                .join()
                .unwrap_or_else(|_| Err("the lookup thread panicked".to_string()))
        })
    }

    async fn run(self: Arc<Self>) {
        let mut pause = Duration::from_millis(100).min(self.retry_max);
        while !self.stop.load(Ordering::Acquire) {
            match self.session(&mut pause).await {
                Ok(()) => break,
                Err(reason) => {
                    let was = self.connected.swap(false, Ordering::AcqRel);
                    let e = RedisSourceError::Unavailable { url: self.target.clone(), reason };
                    if was {
                        tracing::warn!(error = %e, "Redis data source lost its connection");
                    } else {
                        tracing::debug!(error = %e, "Redis data source: not connected");
                    }
                    self.report(RedisReload::Rejected(e), false);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = self.stop_notify.notified() => break,
                    }
                    pause = (pause * 2).min(self.retry_max);
                }
            }
        }
    }

    /// One connection: subscribe, read every key, then apply messages until the connection drops (`Err`) or
    /// the data source stops (`Ok`).
    async fn session(&self, pause: &mut Duration) -> Result<(), String> {
        let timeout = Duration::from_secs(2);
        let mut link = self.link.lock().await;
        let subscribers = tokio::time::timeout(timeout, link.subscribers())
            .await
            .map_err(|_| "no answer within 2 s".to_string())?
            .map_err(|e| e.to_string())?;
        // The first server that takes the subscriptions (a cluster's seed node that hangs is passed over).
        let mut pubsub = None;
        let mut failure = "no server to subscribe on".to_string();
        for client in subscribers {
            match self.subscribe_on(&client, timeout).await {
                Ok(p) => {
                    pubsub = Some(p);
                    break;
                }
                Err(e) => failure = e,
            }
        }
        let pubsub = pubsub.ok_or(failure)?;
        if !self.connected.swap(true, Ordering::AcqRel) {
            tracing::info!(redis = %self.target, "Redis data source connected");
        }
        // After subscribing, so that no update falls between the read and the subscription. Each key is
        // read from the server that holds it (on a cluster, the shard that owns its slot). Each node gets
        // half the bound, so that one that hangs leaves time to ask another.
        let mut conn = tokio::time::timeout(timeout * 2, link.connect(timeout / 2, self.retry_max))
            .await
            .map_err(|_| "no answer within 4 s".to_string())?
            .map_err(|e| e.to_string())?;
        drop(link);
        let (mut sink, mut messages) = pubsub.split();
        // Each key is read between two barriers on the subscription connection: a `PING`, whose reply
        // comes after every message the server pushed to us before it ran the `PING` (one server runs
        // commands one at a time and writes a `PUBLISH` to its subscribers' buffers as it runs it; the
        // client hands us the messages in the order they came, before the reply). A message before the
        // first reply was published before the read ran: its document is the read's or an older one, so it
        // is dropped (applied after the read, it would bring an older document back). A message after the
        // second reply was published after the read ran: it is applied, in order, after the read. A message
        // between the two replies may be either: the key is read again (a few times at most; then the last
        // such message is taken, which a writer that sets and publishes in one transaction makes the
        // newest). Messages of a key already read are applied as they come. (On a Redis Cluster a message
        // reaches the node we subscribe on over the cluster bus, later than its shard ran it: there the
        // barriers narrow the window without closing it.)
        let mut read = vec![false; self.sources.len()];
        for (i, s) in self.sources.iter().enumerate() {
            let mut tries = 0;
            let outcome = loop {
                let before = barrier(&mut sink, &mut messages, timeout).await?;
                self.deliver(before, &read);
                let value = self.read_key(i, &mut conn, timeout).await?;
                #[cfg(test)]
                self.gate.stop("after read").await;
                let window = barrier(&mut sink, &mut messages, timeout).await?;
                let mine = window.iter().rev().find(|m| m.0 == s.channel).map(|m| m.1.clone());
                // To the sources read already (this one is not: `read[i]` is still false).
                self.deliver(window, &read);
                tries += 1;
                match mine {
                    None => break value,
                    Some(payload) if tries >= 3 => break Read::Message(payload),
                    Some(_) => {}
                }
            };
            match outcome {
                Read::Text(text) => self.apply(i, &text),
                Read::Message(payload) => self.apply_payload(i, &payload),
                Read::Bad(e) => self.reject(i, e),
                Read::Missing => {
                    tracing::info!(key = %s.key, "Redis data source: the key holds no rules yet");
                    self.report(RedisReload::Missing { key: s.key.clone() }, true);
                }
            }
            read[i] = true;
        }
        drop(conn);
        *pause = Duration::from_millis(100).min(self.retry_max);
        // The subscription is checked with a `PING` every second: a server that hangs, or a connection cut
        // off without a reset, sends nothing and closes nothing; behind Sentinel the master may have been
        // replaced meanwhile (the next session asks the sentinels again).
        let mut check = tokio::time::interval(SUBSCRIPTION_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        check.tick().await;
        loop {
            tokio::select! {
                _ = check.tick() => match tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await {
                    // Any reply says the connection works (a user not allowed `PING` gets `NOPERM`).
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if e.code().is_some() => {}
                    Ok(Err(e)) => return Err(format!("the subscription's check failed: {e}")),
                    Err(_) => return Err("the subscription's check: no answer within 2 s".to_string()),
                },
                m = messages.next() => match m {
                    Some(msg) => {
                        let all = vec![true; self.sources.len()];
                        self.deliver(vec![(msg.get_channel_name().to_string(), msg.get_payload_bytes().to_vec())], &all);
                    }
                    None => return Err("the subscription connection closed".to_string()),
                },
                _ = self.stop_notify.notified() => return Ok(()),
            }
        }
    }

    /// Applies each message to the sources of its channel that were read already (`read[i]`); the others
    /// drop it (their read comes after it).
    fn deliver(&self, msgs: Vec<(String, Vec<u8>)>, read: &[bool]) {
        for (channel, payload) in msgs {
            for (i, _) in self.sources.iter().enumerate().filter(|(i, s)| read[*i] && s.channel == channel) {
                self.apply_payload(i, &payload);
            }
        }
    }

    /// Applies a message's document (or rejects it: too large, not text).
    fn apply_payload(&self, i: usize, payload: &[u8]) {
        match payload.len() {
            n if n > MAX_ENTRY_BYTES => self.reject(i, too_large(n)),
            _ => match std::str::from_utf8(payload) {
                Ok(t) => self.apply(i, t),
                Err(e) => self.reject(
                    i,
                    ParseError::new(Format::Json, None, None, None, format!("the message is not text: {e}")),
                ),
            },
        }
    }

    /// Reads source `i`'s key: one atomic read (nothing, the value's length when it is too large: nothing
    /// more is read, or the value). A value of another type (a list) is that key's bad document, not a lost
    /// connection (which would stop every key being read).
    async fn read_key(&self, i: usize, conn: &mut super::connection::Conn, timeout: Duration) -> Result<Read, String> {
        let s = &self.sources[i];
        let read: Result<redis::Value, redis::RedisError> = tokio::time::timeout(
            timeout,
            redis::cmd("EVAL").arg(BOUNDED_GET).arg(1).arg(&s.key).arg(MAX_ENTRY_BYTES).query_async(conn),
        )
        .await
        .map_err(|_| format!("reading {}: no answer within 2 s", s.key))?;
        // A user allowed only what Java's source needs (`GET` the key, `SUBSCRIBE`), or a server without
        // scripts: a plain `GET`, its size bounded once read (as an entry's always is).
        let read = match read {
            Err(e) if script_refused(&e) => {
                tracing::debug!(key = %s.key, error = %e, "Redis data source: reading with GET (no script)");
                tokio::time::timeout(timeout, redis::cmd("GET").arg(&s.key).query_async(conn))
                    .await
                    .map_err(|_| format!("reading {}: no answer within 2 s", s.key))?
            }
            other => other,
        };
        let bytes = match read {
            Ok(redis::Value::Nil) => return Ok(Read::Missing),
            Ok(redis::Value::BulkString(bytes)) => bytes,
            Ok(redis::Value::Int(len)) => return Ok(Read::Bad(too_large(usize::try_from(len).unwrap_or(usize::MAX)))),
            Ok(other) => return Err(format!("reading {}: an answer of another shape ({other:?})", s.key)),
            Err(e) if e.code() == Some("WRONGTYPE") => {
                let why = format!("the key holds no text ({e})");
                return Ok(Read::Bad(ParseError::new(Format::Json, None, None, None, why)));
            }
            Err(e) => return Err(e.to_string()),
        };
        if bytes.len() > MAX_ENTRY_BYTES {
            return Ok(Read::Bad(too_large(bytes.len())));
        }
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Read::Text(text)),
            Err(e) => Ok(Read::Bad(ParseError::new(Format::Json, None, None, None, format!("not UTF-8: {e}")))),
        }
    }

    /// A subscription to every source's channel on `client`'s server, each step bounded by `timeout`.
    async fn subscribe_on(&self, client: &redis::Client, timeout: Duration) -> Result<redis::aio::PubSub, String> {
        let mut pubsub = match tokio::time::timeout(timeout, client.get_async_pubsub()).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("no answer within 2 s".to_string()),
        };
        for s in &self.sources {
            tokio::time::timeout(timeout, pubsub.subscribe(&s.channel))
                .await
                .map_err(|_| "SUBSCRIBE: no answer within 2 s".to_string())?
                .map_err(|e| e.to_string())?;
        }
        Ok(pubsub)
    }

    fn apply(&self, i: usize, text: &str) {
        let s = &self.sources[i];
        {
            let applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
            if applied[i].as_deref() == Some(text) {
                drop(applied);
                self.report(RedisReload::Unchanged { key: s.key.clone() }, true);
                return;
            }
        }
        let set = match s.holds.parse(text, Format::Json) {
            Ok(set) => set,
            Err(error) => return self.reject(i, error),
        };
        match set.apply_all(&self.engine) {
            Ok(kinds) => {
                self.applied.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(text.to_string());
                *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.last_load_ms.store(crate::datasource::now_ms(), Ordering::Release);
                tracing::info!(key = %s.key, ?kinds, "Redis data source: rules applied");
                self.report(RedisReload::Applied { key: s.key.clone(), kinds }, true);
            }
            Err(error) => {
                let key = s.key.clone();
                let e = match error {
                    ApplyError::Rules(error) => RedisSourceError::Invalid { key, error },
                    #[cfg(feature = "tower")]
                    ApplyError::Gateway(error) => RedisSourceError::InvalidGateway { key, error },
                };
                tracing::warn!(error = %e, "Redis data source: rules rejected, the rules in force stay");
                self.report(RedisReload::Rejected(e), true);
            }
        }
    }

    fn reject(&self, i: usize, error: ParseError) {
        let e = RedisSourceError::Parse { key: self.sources[i].key.clone(), error };
        tracing::warn!(error = %e, "Redis data source: malformed rules, the rules in force stay");
        self.report(RedisReload::Rejected(e), true);
    }

    fn report(&self, r: RedisReload, document: bool) {
        if let RedisReload::Rejected(e) = &r {
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.clone());
        }
        let listeners: Vec<Arc<Listener>> = self.listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for l in listeners {
            l(&r);
        }
        if document {
            *self.events.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            self.events_changed.notify_all();
        }
    }
}

/// What reading a key gave.
enum Read {
    /// The key's text.
    Text(String),
    /// A message's document, taken instead of the read (see [`Inner::session`]).
    Message(Vec<u8>),
    /// No key.
    Missing,
    /// A value that is no document (too large, not text, another type).
    Bad(ParseError),
}

/// A `PING` on the subscription connection, and the messages (channel, payload) that came before its reply:
/// those the server published before it ran the `PING`, and possibly some just after.
async fn barrier(
    sink: &mut redis::aio::PubSubSink,
    messages: &mut redis::aio::PubSubStream,
    timeout: Duration,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    match tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await {
        Ok(Ok(_)) => {}
        // Any reply is in order with the messages (a user not allowed `PING` gets `NOPERM`).
        Ok(Err(e)) if e.code().is_some() => {}
        Ok(Err(e)) => return Err(format!("the subscription's check failed: {e}")),
        Err(_) => return Err("the subscription's check: no answer within 2 s".to_string()),
    }
    // The client queued every message that came before the reply before it handed us the reply.
    let mut out = Vec::new();
    while let Some(m) = messages.next().now_or_never() {
        match m {
            Some(msg) => out.push((msg.get_channel_name().to_string(), msg.get_payload_bytes().to_vec())),
            None => return Err("the subscription connection closed".to_string()),
        }
    }
    Ok(out)
}

/// Whether a write failed because the key's slot is served elsewhere now (a cluster resharding): worth
/// looking the key's node up again.
fn redirection(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN" | "EXECABORT")) || e.redirect_node().is_some()
}

impl RedisDataSource {
    /// One try at writing `set`'s part of source `s` on `conn` (`ASKING` before each command when the key's
    /// slot is being imported there: the flag lasts one command, or a whole `MULTI` ... `EXEC`): `false`
    /// when the `WATCH`ed key changed meanwhile.
    fn write_once(
        &self,
        conn: &mut redis::Connection,
        s: &Source,
        set: &RuleSet,
        asking: bool,
    ) -> Result<bool, redis::RedisError> {
        let ask = |conn: &mut redis::Connection| -> redis::RedisResult<()> {
            if asking {
                redis::cmd("ASKING").query::<()>(conn)?;
            }
            Ok(())
        };
        ask(conn)?;
        redis::cmd("WATCH").arg(&s.key).query::<()>(conn)?;
        // A combined document keeps what `set` does not hold, as the key has it now.
        let current: Option<String> = match s.holds {
            Holds::Combined => {
                ask(conn)?;
                redis::cmd("GET").arg(&s.key).query(conn)?
            }
            _ => None,
        };
        let text = s.holds.text(current.as_deref(), set, &self.inner.engine).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::Client,
                "not written",
                format!("key `{}`: {e}; left untouched", s.key),
            ))
        })?;
        ask(conn)?;
        let done: Option<(String, i64)> =
            redis::pipe().atomic().set(&s.key, &text).publish(&s.channel, &text).query(conn)?;
        Ok(done.is_some())
    }
}

impl WritableDataSource for RedisDataSource {
    /// Writes each kind of `set` to its key and announces it on the key's channel, `SET` and `PUBLISH` in one
    /// `MULTI` (what Java's Redis data source expects of every writer). A combined document keeps the kinds
    /// `set` does not hold; the key is `WATCH`ed while it is read and written, and the write retried on the
    /// fresh document if another writer changed it in between.
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        let target = self.inner.target.clone();
        let store = |reason: String| WriteBackError::Store { target: target.clone(), reason };
        let writes = crate::datasource::entry::entries_for(self.inner.sources.iter().map(|s| s.holds), set, &target)?;
        let timeout = Some(Duration::from_secs(2));
        for s in writes.into_iter().map(|i| &self.inner.sources[i]) {
            let mut written = false;
            let mut redirected = None;
            for _ in 0..5 {
                // The server that holds the key (the master; on a cluster, the node that holds its slot, or the
                // one it is migrating to), so that `WATCH` and the transaction run where the key lives. A
                // redirection met on the way (the slot moved meanwhile) looks it up again.
                let (client, asking) = self.inner.client_for_key(&s.key).map_err(store)?;
                let mut conn =
                    client.get_connection_with_timeout(Duration::from_secs(2)).map_err(|e| store(e.to_string()))?;
                conn.set_read_timeout(timeout).map_err(|e| store(e.to_string()))?;
                conn.set_write_timeout(timeout).map_err(|e| store(e.to_string()))?;
                match self.write_once(&mut conn, s, set, asking) {
                    Ok(true) => {
                        written = true;
                        break;
                    }
                    Ok(false) => {}
                    Err(e) if redirection(&e) => redirected = Some(e),
                    Err(e) => return Err(store(e.to_string())),
                }
            }
            if !written {
                if let Some(e) = redirected {
                    return Err(store(format!("the key's slot kept moving while it was written (5 tries): {e}")));
                }
                return Err(WriteBackError::Conflict {
                    target: s.key.clone(),
                    detail: "the key kept changing while it was written (5 tries)".into(),
                });
            }
        }
        tracing::info!(url = %target, parts = ?Holds::parts_of(set), "rules written back to Redis");
        Ok(())
    }

    /// Writes the gateway's lists `docs` manages to their keys (one holding that list, or a combined
    /// document) and announces them, as [`write_rules`](WritableDataSource::write_rules) does.
    #[cfg(feature = "tower")]
    fn write_gateway(&self, docs: &crate::datasource::GatewayDocuments) -> Result<(), WriteBackError> {
        self.write_rules(&RuleSet { gateway: docs.clone(), ..RuleSet::default() })
    }

    fn status(&self) -> SourceStatus {
        let keys: Vec<&str> = self.inner.sources.iter().map(|s| s.key.as_str()).collect();
        let at = self.inner.last_load_ms.load(Ordering::Acquire);
        SourceStatus {
            connected: self.is_connected(),
            last_load_ms: (at != 0).then_some(at),
            last_error: self.last_error().map(|e| e.to_string()),
            ..SourceStatus::new("redis", format!("{} {}", self.inner.target, keys.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RuleKind;

    const KEY: &str = "sentinel:shop:flow-rules";
    const CHANNEL: &str = "sentinel:shop:flow-rules:changed";

    fn doc(count: u32) -> String {
        format!(r#"[{{"resource": "api", "grade": 1, "count": {count}}}]"#)
    }

    /// Sets `KEY` to `doc` and announces it, in one transaction (as documented for writers).
    fn publish(url: &str, doc: &str) {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::pipe().atomic().set(KEY, doc).publish(CHANNEL, doc).query::<()>(&mut conn).unwrap();
    }

    /// A data source on `KEY` (holding document 1), then a new session (the server drops the subscription)
    /// stopped after each of its reads of the key, where `publish_at(reads before)` may publish a document:
    /// returns the engine's count once that session has read the key, the reads the session made, and the
    /// counts applied meanwhile.
    fn session_with_updates_after_reads(
        test: &str,
        publish_at: fn(u32) -> Option<u32>,
    ) -> Option<(f64, u32, Vec<f64>)> {
        let redis = sentinel_testkit::redis::RedisServer::start(test)?;
        let url = redis.url();
        publish(&url, &doc(1));
        let engine = Sentinel::builder().app_name("shop").build();
        let source = RedisDataSource::builder(url.as_str())
            .rules(RuleKind::Flow, KEY, CHANNEL)
            .retry_max(Duration::from_millis(100))
            .start(&engine)
            .unwrap();
        assert!(source.wait_for(1, Duration::from_secs(5)), "the key is read at start");
        assert_eq!(engine.flow_rules()[0].count, 1.0);
        let applied = Arc::new(Mutex::new(Vec::new()));
        let (a, e) = (applied.clone(), engine.clone());
        source.on_reload(move |r| {
            if let RedisReload::Applied { .. } = r {
                a.lock().unwrap().push(e.flow_rules()[0].count);
            }
        });
        let gate = &source.inner.gate;
        let (tell, stopped) = std::sync::mpsc::channel();
        *gate.stopped.lock().unwrap() = Some(tell);
        gate.armed.lock().unwrap().push("after read");
        let before = *source.inner.events.lock().unwrap();
        let mut conn = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query::<i64>(&mut conn).unwrap();
        // Each read stops; the next is armed before the one stopped goes on, until the session has read the
        // key (an event: applied or unchanged).
        let (mut reads, deadline) = (0, std::time::Instant::now() + Duration::from_secs(10));
        while !source.wait_for(before + 1, Duration::ZERO) {
            assert!(std::time::Instant::now() < deadline, "the new session read the key");
            if stopped.recv_timeout(Duration::from_millis(10)).is_ok() {
                if let Some(count) = publish_at(reads) {
                    publish(&url, &doc(count));
                }
                reads += 1;
                gate.armed.lock().unwrap().push("after read");
                gate.go.notify_one();
            }
        }
        let count = engine.flow_rules()[0].count;
        let applied = applied.lock().unwrap().clone();
        Some((count, reads, applied))
    }

    #[test]
    fn an_update_published_between_a_read_and_the_barrier_after_it_makes_the_key_read_again() {
        // Document 2 lands after the read that found 1, before the barrier: the message may be older or newer
        // than the read, so the key is read again, and 2 is applied (not 1, and not lost).
        let Some((count, reads, applied)) =
            session_with_updates_after_reads("read_again_after_a_message_in_the_window", |t| (t == 0).then_some(2))
        else {
            return;
        };
        assert_eq!(reads, 2, "read again once");
        assert_eq!(count, 2.0);
        assert_eq!(applied, vec![2.0], "the newer document only");
    }

    #[test]
    fn updates_after_every_read_end_with_the_last_announced_document_after_three_reads() {
        // A writer that updates the key after each of the session's reads: after three reads the last message
        // (the newest document, set and announced in one transaction) is taken.
        let Some((count, reads, applied)) = session_with_updates_after_reads("read_again_three_times", |t| Some(t + 2))
        else {
            return;
        };
        assert_eq!(reads, 3, "three reads at most");
        assert_eq!(count, 4.0, "the last announced document: {applied:?}");
        assert_eq!(applied, vec![4.0], "nothing older applied before it");
    }
}
