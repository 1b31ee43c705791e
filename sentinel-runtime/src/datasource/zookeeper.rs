//! Rules from ZooKeeper: Java's `ZookeeperDataSource` semantics (a znode holding Sentinel's JSON, watched),
//! written back with a version check.
//!
//! Each znode holds one kind's list (Java's documents; Java's convention puts it at `/{groupId}/{dataId}`,
//! see [`ZookeeperDataSourceBuilder::rules_at`]) or a combined [`RuleSet`] document. The data source sets a
//! persistent watch on every node, then reads it, so no change falls between the read and the watch. After
//! the connection comes back, and after a session expiry (a new session, new watches), every node is read
//! again, so a change made meanwhile is applied.
//!
//! A document that does not parse or that the engine rejects, and a deleted node, are reported (logged,
//! given to [`ZookeeperDataSource::on_reload`] listeners, kept as [`ZookeeperDataSource::last_error`]) and
//! the rules in force stay. (Java gives null for a missing node: no change at start, but a node deleted
//! while watched gives its rule manager null, which clears the kind's rules;
//! [`ZookeeperDataSourceBuilder::clear_on_delete`] does that.)
//!
//! Written back through [`WritableDataSource`] (the command center's write-back): `setData` with the node's
//! version as this source last saw it (or `create` for a node that did not exist), so two writers never
//! silently overwrite each other; the loser gets [`WriteBackError::Conflict`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zookeeper_client as zk;

use super::remote::{
    settings_methods, source_accessors, split_credentials, Background, Credentials, Entry, Reports, SourceSettings,
};
use super::{ApplyError, ParseError, RuleSet, SourceStatus, WritableDataSource, WriteBackError};
use crate::{RuleError, RuleKind, Sentinel};

/// What happened to one node: given to [`ZookeeperDataSource::on_reload`] listeners.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ZookeeperReload {
    /// The document changed and its rules are in force.
    Applied {
        /// The node's path.
        path: String,
        /// The node's data version.
        version: i32,
        /// The kinds it holds.
        kinds: Vec<RuleKind>,
    },
    /// The document equals the one applied last (e.g. this source's own write-back, or a re-read), or is
    /// older than the change in force (a read answered before a later change this source already handled,
    /// such as its own write-back): nothing to apply.
    Unchanged {
        /// The node's path.
        path: String,
    },
    /// The node does not exist (yet): nothing to apply.
    Missing {
        /// The node's path.
        path: String,
    },
    /// The document was not applied (or the node was deleted); the rules in force stay.
    Rejected(ZookeeperSourceError),
}

/// Why a document from ZooKeeper was not applied, or why the data source is not connected.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZookeeperSourceError {
    /// Not a rule document (syntax, wrong type, unknown field, bad code, not UTF-8).
    #[error("rules from ZooKeeper node `{path}`: {error}; the rules in force stay")]
    Parse {
        /// The node's path.
        path: String,
        /// Where and why.
        #[source]
        error: ParseError,
    },
    /// A rule is invalid (the engine rejected the set).
    #[error("rules from ZooKeeper node `{path}`: {error}")]
    Invalid {
        /// The node's path.
        path: String,
        /// The rule and the field.
        #[source]
        error: RuleError,
    },
    /// A gateway flow rule or API definition is invalid (the engine rejected the document; feature `tower`).
    #[cfg(feature = "tower")]
    #[error("gateway rules from ZooKeeper node `{path}`: {error}")]
    InvalidGateway {
        /// The node's path.
        path: String,
        /// The rule or definition and the field.
        #[source]
        error: crate::web::gateway::GatewayRuleError,
    },
    /// The node was deleted.
    #[error("ZooKeeper node `{path}` was deleted; the rules in force stay")]
    Deleted {
        /// The node's path.
        path: String,
    },
    /// ZooKeeper is unreachable, or the session expired (the data source reconnects by itself).
    #[error("ZooKeeper data source at {servers}: {reason}; reconnecting, the rules in force stay")]
    Unavailable {
        /// The servers.
        servers: String,
        /// The failure.
        reason: String,
    },
    /// Bad settings.
    #[error("ZooKeeper data source: {0}")]
    Config(String),
}

/// What this source knows of one node.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// The node's data version as last read (a write-back expects it), `None` if the node is absent.
    version: Option<i32>,
    /// The text applied last.
    applied: Option<String>,
    /// The transaction id (`mzxid`) of the last change seen: it orders changes across a delete and a
    /// create, where the data version starts again at 0. Kept when the node is deleted.
    zxid: i64,
}

struct Inner {
    engine: Sentinel,
    servers: String,
    digest: Option<Credentials>,
    nodes: Vec<Entry>,
    retry_max: Duration,
    session_timeout: Duration,
    clear_on_delete: bool,
    seen: Mutex<Vec<Seen>>,
    client: Mutex<Option<zk::Client>>,
    reports: Reports<ZookeeperReload, ZookeeperSourceError>,
    /// Write-backs answered so far: a read that finds no node while one was answered is made again.
    writes: AtomicU64,
    /// Test-only points where a read stops until the test lets it go.
    #[cfg(test)]
    gate: super::gate::Gate,
}

/// Rules read from ZooKeeper nodes, applied on change through persistent watches, written back with a
/// version check.
///
/// ```no_run
/// use sentinel_runtime::{RuleKind, Sentinel, datasource::ZookeeperDataSource};
/// let engine = Sentinel::builder().app_name("shop").build();
/// // Java's `new ZookeeperDataSource<>(serverAddr, "SENTINEL_GROUP", "shop-flow-rules", parser)`:
/// let source = ZookeeperDataSource::builder("127.0.0.1:2181")
///     .rules_at(RuleKind::Flow, "SENTINEL_GROUP", "shop-flow-rules")
///     .digest("sentinel", "secret")
///     .start(&engine)?;
/// source.on_reload(|r| println!("{r:?}"));
/// # Ok::<(), sentinel_runtime::datasource::ZookeeperSourceError>(())
/// ```
#[must_use = "dropping the data source stops it"]
pub struct ZookeeperDataSource {
    inner: Arc<Inner>,
    background: Background,
}

impl std::fmt::Debug for ZookeeperDataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperDataSource")
            .field("servers", &self.inner.servers)
            .field("nodes", &self.inner.nodes)
            .finish_non_exhaustive()
    }
}

/// The nodes and settings of a [`ZookeeperDataSource`] before it starts.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct ZookeeperDataSourceBuilder {
    servers: String,
    settings: SourceSettings,
    session_timeout: Duration,
    clear_on_delete: bool,
}

impl ZookeeperDataSource {
    /// A data source on the ZooKeeper ensemble `servers` (`host:port,host:port`, optionally `zk://` and
    /// digest credentials first: `zk://user:password@host:port`). Add nodes with
    /// [`ZookeeperDataSourceBuilder::rules`], [`rules_at`](ZookeeperDataSourceBuilder::rules_at) or
    /// [`rule_set`](ZookeeperDataSourceBuilder::rule_set).
    pub fn builder(servers: impl Into<String>) -> ZookeeperDataSourceBuilder {
        let servers: String = servers.into();
        let rest = servers.strip_prefix("zk://").unwrap_or(&servers);
        let (digest, hosts) = split_credentials(rest);
        ZookeeperDataSourceBuilder {
            servers: hosts.to_string(),
            settings: SourceSettings::new(digest),
            session_timeout: Duration::from_secs(10),
            clear_on_delete: false,
        }
    }
}

source_accessors!(ZookeeperDataSource, ZookeeperReload, ZookeeperSourceError);
settings_methods!(ZookeeperDataSourceBuilder, "ZookeeperDataSource", path, "the node at `path`");

impl ZookeeperDataSourceBuilder {
    /// One kind's rules in the node `/{group_id}/{data_id}`: Java's `ZookeeperDataSource(serverAddr,
    /// groupId, dataId, parser)`.
    pub fn rules_at(self, kind: RuleKind, group_id: &str, data_id: &str) -> Self {
        self.rules(kind, format!("/{group_id}/{data_id}"))
    }

    /// The gateway's flow rules in the node `/{group_id}/{data_id}` (feature `tower`), as Java's
    /// `ZookeeperDataSource` reads them with a gateway rule parser.
    #[cfg(feature = "tower")]
    pub fn gateway_rules_at(self, group_id: &str, data_id: &str) -> Self {
        self.gateway_rules(format!("/{group_id}/{data_id}"))
    }

    /// The gateway's API definitions in the node `/{group_id}/{data_id}` (feature `tower`).
    #[cfg(feature = "tower")]
    pub fn api_definitions_at(self, group_id: &str, data_id: &str) -> Self {
        self.api_definitions(format!("/{group_id}/{data_id}"))
    }

    /// Digest authentication (`addauth digest user:password`, Java's `AuthInfo("digest", ...)`); replaces
    /// credentials given in the address.
    pub fn digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.settings.user = Some((user.into(), password.into()));
        self
    }

    /// The session timeout asked of the server (default 10 s; the server bounds it).
    pub fn session_timeout(mut self, d: Duration) -> Self {
        self.session_timeout = d;
        self
    }

    /// Whether a node deleted while watched clears its kinds' rules, as Java's `ZookeeperDataSource` does
    /// (default: no, the rules in force stay and the delete is reported). A node missing at start changes
    /// nothing either way, as in Java.
    pub fn clear_on_delete(mut self, clear: bool) -> Self {
        self.clear_on_delete = clear;
        self
    }

    /// Starts the data source on its own thread: watches and reads every node. A ZooKeeper that is down is
    /// not an error (it is reported and retried); bad settings are.
    pub fn start(self, engine: &Sentinel) -> Result<ZookeeperDataSource, ZookeeperSourceError> {
        let settings = self.settings;
        settings
            .check("node", |n| {
                (!n.name.starts_with('/') || n.name.len() < 2).then(|| format!("a node path must be absolute: {n:?}"))
            })
            .map_err(ZookeeperSourceError::Config)?;
        if self.servers.trim().is_empty() {
            return Err(ZookeeperSourceError::Config("no server".into()));
        }
        let inner = Arc::new(Inner {
            engine: engine.clone(),
            servers: self.servers,
            digest: settings.user,
            seen: Mutex::new(vec![Seen::default(); settings.entries.len()]),
            nodes: settings.entries,
            retry_max: settings.retry_max,
            session_timeout: self.session_timeout,
            clear_on_delete: self.clear_on_delete,
            client: Mutex::new(None),
            reports: Reports::new(),
            writes: AtomicU64::new(0),
            #[cfg(test)]
            gate: super::gate::Gate::default(),
        });
        let (run, stop) = (inner.clone(), inner.clone());
        let background = Background::spawn("sentinel-zk-rules", move || stop.reports.request_stop(), run.run())
            .map_err(|e| ZookeeperSourceError::Config(format!("could not start its thread: {e}")))?;
        Ok(ZookeeperDataSource { inner, background })
    }
}

/// What the watch tasks hand to the session loop.
enum Signal {
    /// A change of node `i` (data, create or delete): it is read.
    Node(usize),
    State(zk::SessionState),
}

impl Inner {
    async fn run(self: Arc<Self>) {
        let mut pause = Duration::from_millis(100).min(self.retry_max);
        while !self.reports.is_stopped() {
            match self.session(&mut pause).await {
                Ok(()) => break,
                Err(reason) => {
                    *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    self.lost(reason);
                    if !self.reports.pause(pause).await {
                        break;
                    }
                    pause = (pause * 2).min(self.retry_max);
                }
            }
        }
    }

    fn lost(&self, reason: String) {
        let was = self.reports.set_connected(false);
        let e = ZookeeperSourceError::Unavailable { servers: self.servers.clone(), reason };
        if was {
            tracing::warn!(error = %e, "ZooKeeper data source lost its connection");
        } else {
            tracing::debug!(error = %e, "ZooKeeper data source: not connected");
        }
        self.report(ZookeeperReload::Rejected(e), false);
    }

    async fn connect(&self) -> Result<zk::Client, String> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(Duration::from_secs(2));
        if let Some((u, p)) = &self.digest {
            connector = connector.with_auth("digest", format!("{u}:{p}").as_bytes());
        }
        tokio::time::timeout(Duration::from_secs(5), connector.connect(&self.servers))
            .await
            .map_err(|_| "no answer within 5 s".to_string())?
            .map_err(|e| e.to_string())
    }

    /// One session: watch and read every node, then follow the watches until the session ends (`Err`) or
    /// the source stops (`Ok`).
    async fn session(&self, pause: &mut Duration) -> Result<(), String> {
        let client = self.connect().await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = self.watch_all(&client, &tx).await?;
        let mut states = client.state_watcher();
        let result = async {
            self.read_all(&client).await?;
            *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
            if !self.reports.set_connected(true) {
                tracing::info!(servers = %self.servers, "ZooKeeper data source watching");
            }
            *pause = Duration::from_millis(100).min(self.retry_max);
            loop {
                let signal = tokio::select! {
                    s = rx.recv() => match s {
                        Some(s) => s,
                        None => return Err("the watches ended".to_string()),
                    },
                    s = states.changed() => Signal::State(s),
                    _ = self.reports.stop_notify.notified() => return Ok(()),
                };
                match signal {
                    // A delete too is read: its event may be older than a change this source already
                    // handled (its own write-back creating the node again), and carries no `mzxid`.
                    Signal::Node(i) => {
                        self.read(&client, i).await?;
                        #[cfg(test)]
                        self.gate.stop("after event").await;
                    }
                    Signal::State(zk::SessionState::SyncConnected) => {
                        // Back after a disconnection (same session): the server may be a restarted one that
                        // lost the watches, so watch again, then read everything again.
                        for t in tasks.drain(..) {
                            t.abort();
                        }
                        tasks = self.watch_all(&client, &tx).await?;
                        self.read_all(&client).await?;
                        if !self.reports.set_connected(true) {
                            tracing::info!(servers = %self.servers, "ZooKeeper data source reconnected");
                        }
                    }
                    Signal::State(zk::SessionState::Disconnected) => self.lost("disconnected".into()),
                    Signal::State(s) if s.is_terminated() => return Err(format!("session {s:?}")),
                    Signal::State(_) => {}
                }
            }
        }
        .await;
        for t in tasks {
            t.abort();
        }
        result
    }

    /// Sets a persistent watch on every node; each watch's events go to `tx` from a task of its own.
    async fn watch_all(
        &self,
        client: &zk::Client,
        tx: &tokio::sync::mpsc::UnboundedSender<Signal>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
        let mut tasks = Vec::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            let mut watcher = client.watch(&n.name, zk::AddWatchMode::Persistent).await.map_err(|e| e.to_string())?;
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let ev = watcher.changed().await;
                    let signal = match ev.event_type {
                        // The session's other states come from the state watcher, once.
                        zk::EventType::Session if !ev.session_state.is_terminated() => continue,
                        zk::EventType::Session => Signal::State(ev.session_state),
                        _ => Signal::Node(i),
                    };
                    let terminal = matches!(&signal, Signal::State(s) if s.is_terminated());
                    if tx.send(signal).is_err() || terminal {
                        break;
                    }
                }
            }));
        }
        Ok(tasks)
    }

    async fn read_all(&self, client: &zk::Client) -> Result<(), String> {
        for i in 0..self.nodes.len() {
            self.read(client, i).await?;
        }
        Ok(())
    }

    /// Reads node `i` and applies what it holds, or takes it for deleted if it was present.
    async fn read(&self, client: &zk::Client, i: usize) -> Result<(), String> {
        let path = &self.nodes[i].name;
        loop {
            let writes = self.writes.load(Ordering::SeqCst);
            #[cfg(test)]
            self.gate.stop("before get").await;
            let got = client.get_data(path).await;
            #[cfg(test)]
            self.gate.stop("after get").await;
            match got {
                Ok((data, stat)) => {
                    #[cfg(test)]
                    self.gate.stop("before put").await;
                    self.put(i, stat.version, stat.mzxid, &data);
                    #[cfg(test)]
                    self.gate.stop("after put").await;
                    return Ok(());
                }
                // A write-back of this source was answered meanwhile: ZooKeeper may have answered this read
                // before that write created the node (an absence has no `mzxid` to order it by). Read again.
                Err(zk::Error::NoNode) if self.writes.load(Ordering::SeqCst) != writes => continue,
                Err(zk::Error::NoNode) => {
                    let was = std::mem::take(&mut self.seen.lock().unwrap_or_else(|e| e.into_inner())[i].version);
                    if was.is_some() {
                        self.deleted(i);
                    } else {
                        tracing::info!(%path, "ZooKeeper data source: the node holds no rules yet");
                        self.report(ZookeeperReload::Missing { path: path.clone() }, true);
                    }
                    return Ok(());
                }
                Err(e) => return Err(format!("reading {path}: {e}")),
            }
        }
    }

    fn deleted(&self, i: usize) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen[i] = Seen { zxid: seen[i].zxid, ..Seen::default() };
        drop(seen);
        let n = &self.nodes[i];
        if self.clear_on_delete && n.holds.cleared().apply_all(&self.engine).is_ok() {
            tracing::warn!(path = %n.name, holds = %n.holds, "ZooKeeper node deleted: its rules are cleared");
        }
        let e = ZookeeperSourceError::Deleted { path: n.name.clone() };
        tracing::warn!(error = %e, "ZooKeeper data source: node deleted");
        self.report(ZookeeperReload::Rejected(e), true);
    }

    fn put(&self, i: usize, version: i32, zxid: i64, value: &[u8]) {
        let n = &self.nodes[i];
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            // A read answered before a later change this source already handled (its own write-back, whose
            // answer the runtime took first): that change is in force, and the next write expects its version.
            if zxid < seen[i].zxid {
                drop(seen);
                tracing::debug!(path = %n.name, version, "ZooKeeper data source: a read older than the change in force");
                return self.report(ZookeeperReload::Unchanged { path: n.name.clone() }, true);
            }
            seen[i].version = Some(version);
            seen[i].zxid = zxid;
            if seen[i].applied.as_deref().map(str::as_bytes) == Some(value) {
                drop(seen);
                return self.report(ZookeeperReload::Unchanged { path: n.name.clone() }, true);
            }
        }
        let parsed = n.holds.parse_bytes(value);
        let (text, set) = match parsed {
            Ok(ok) => ok,
            Err(error) => {
                let e = ZookeeperSourceError::Parse { path: n.name.clone(), error };
                tracing::warn!(error = %e, "ZooKeeper data source: malformed rules, the rules in force stay");
                return self.report(ZookeeperReload::Rejected(e), true);
            }
        };
        match set.apply_all(&self.engine) {
            Ok(kinds) => {
                self.seen.lock().unwrap_or_else(|e| e.into_inner())[i].applied = Some(text.to_string());
                self.reports.loaded();
                tracing::info!(path = %n.name, version, ?kinds, "ZooKeeper data source: rules applied");
                self.report(ZookeeperReload::Applied { path: n.name.clone(), version, kinds }, true);
            }
            Err(error) => {
                let path = n.name.clone();
                let e = match error {
                    ApplyError::Rules(error) => ZookeeperSourceError::Invalid { path, error },
                    #[cfg(feature = "tower")]
                    ApplyError::Gateway(error) => ZookeeperSourceError::InvalidGateway { path, error },
                };
                tracing::warn!(error = %e, "ZooKeeper data source: rules rejected, the rules in force stay");
                self.report(ZookeeperReload::Rejected(e), true);
            }
        }
    }

    fn report(&self, r: ZookeeperReload, document: bool) {
        let error = match &r {
            ZookeeperReload::Rejected(e) => Some(e),
            _ => None,
        };
        self.reports.report(&r, error, document);
    }

    /// Writes one node: `setData` at the version last seen, or `create` (with its parents) when it was absent.
    async fn write_node(&self, client: &zk::Client, i: usize, set: &RuleSet) -> Result<(), WriteBackError> {
        let n = &self.nodes[i];
        let target = format!("ZooKeeper node `{}`", n.name);
        let store = |reason: String| WriteBackError::Store { target: target.clone(), reason };
        let (expected, current) = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            (seen[i].version, seen[i].applied.clone())
        };
        // A combined document keeps the kinds the push does not hold as this source last read them.
        let text = n
            .holds
            .text(current.as_deref(), set, &self.engine)
            .map_err(|error| WriteBackError::Serialize { target: n.name.clone(), error })?;
        let conflict = |detail: String| WriteBackError::Conflict { target: target.clone(), detail };
        let stat = match expected {
            Some(v) => match client.set_data(&n.name, text.as_bytes(), Some(v)).await {
                Ok(stat) => stat,
                Err(zk::Error::BadVersion) => {
                    return Err(conflict(format!("expected version {v}, another writer changed the node")))
                }
                Err(zk::Error::NoNode) => return Err(conflict("another writer deleted the node".into())),
                Err(e) => return Err(store(e.to_string())),
            },
            None => {
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                if let Some((parent, _)) = n.name.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
                    match client.mkdir(parent, &options).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(store(e.to_string())),
                    }
                }
                match client.create(&n.name, text.as_bytes(), &options).await {
                    Ok((stat, _)) => stat,
                    Err(zk::Error::NodeExists) => {
                        return Err(conflict("expected no node, another writer created it".into()))
                    }
                    Err(e) => return Err(store(e.to_string())),
                }
            }
        };
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.written(i, stat.version, stat.mzxid, text);
        Ok(())
    }

    /// This source put `text` in node `i` at data `version`, by the change `zxid`: what is in force, so the
    /// read its watch makes finds nothing to do. Unless the watch already read a later change of the node
    /// (a later transaction: data versions start again when a node is created again): that one is in force,
    /// and the next write expects its version.
    ///
    /// And only if the engine runs what was written: when it runs something else (the watch applied another
    /// writer's change after the rules written were loaded), the read its watch makes applies it, so the
    /// engine ends with what the node holds.
    fn written(&self, i: usize, version: i32, zxid: i64, text: String) {
        if !self.nodes[i].holds.parse(&text, super::Format::Json).is_ok_and(|set| set.is_in_force(&self.engine)) {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen[i].zxid < zxid {
            seen[i] = Seen { version: Some(version), applied: Some(text), zxid };
        }
    }
}

impl WritableDataSource for ZookeeperDataSource {
    /// Writes each kind of `set` to its node (a combined document keeps the kinds `set` does not hold), with
    /// the node's version as this source last saw it: a node another writer changed meanwhile is not
    /// overwritten ([`WriteBackError::Conflict`]).
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        let inner = self.inner.clone();
        self.background.write_back(
            "ZooKeeper",
            format!("ZooKeeper {}", self.inner.servers),
            self.inner.nodes.iter().map(|e| e.holds),
            &self.inner.client,
            set,
            move |client, i, set| {
                let inner = inner.clone();
                async move { inner.write_node(&client, i, &set).await }
            },
        )
    }

    /// Writes the gateway's lists `docs` manages to their nodes (one holding that list, or a combined
    /// document), as [`write_rules`](WritableDataSource::write_rules) does.
    #[cfg(feature = "tower")]
    fn write_gateway(&self, docs: &super::GatewayDocuments) -> Result<(), WriteBackError> {
        self.write_rules(&RuleSet { gateway: docs.clone(), ..RuleSet::default() })
    }

    fn status(&self) -> SourceStatus {
        let nodes: Vec<&str> = self.inner.nodes.iter().map(|n| n.name.as_str()).collect();
        SourceStatus {
            connected: self.is_connected(),
            last_load_ms: self.inner.reports.last_load_ms(),
            last_error: self.last_error().map(|e| e.to_string()),
            ..SourceStatus::new("zookeeper", format!("{} {}", self.inner.servers, nodes.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source whose ZooKeeper never answers (nothing listens on port 1): its state is the test's alone.
    fn unreachable_source() -> (Sentinel, ZookeeperDataSource) {
        let engine = Sentinel::builder().build();
        let source = ZookeeperDataSource::builder("127.0.0.1:1")
            .rules(RuleKind::Flow, "/sentinel/flow")
            .retry_max(Duration::from_secs(60))
            .start(&engine)
            .unwrap();
        (engine, source)
    }

    #[test]
    fn a_write_back_answered_after_the_watch_read_a_later_change_keeps_that_change() {
        let (engine, source) = unreachable_source();
        let inner = &source.inner;
        // Another writer's document at version 3 is in force (the watch read it)...
        inner.put(0, 3, 30, br#"[{"resource": "api", "count": 3}]"#);
        // ... when this source's own write at version 2 is answered.
        inner.written(0, 2, 20, r#"[{"resource": "api", "count": 2}]"#.to_string());
        let seen = inner.seen.lock().unwrap()[0].clone();
        assert_eq!(seen.version, Some(3), "the next write expects version 3");
        assert_eq!(seen.applied.as_deref(), Some(r#"[{"resource": "api", "count": 3}]"#));
        // The same document from the store again is found in force.
        inner.put(0, 4, 40, br#"[{"resource": "api", "count": 2}]"#);
        assert_eq!(engine.flow_rules()[0].count, 2.0, "applied, not taken for the text in force");
        // A write answered before its watch's read: the write (loaded first, as the command center does) is
        // what is in force.
        let five = r#"[{"resource": "api", "count": 5}]"#;
        RuleSet::parse_entry(Some(RuleKind::Flow), five, super::super::Format::Json).unwrap().apply(&engine).unwrap();
        inner.written(0, 5, 50, five.to_string());
        assert_eq!(inner.seen.lock().unwrap()[0].version, Some(5));
    }

    #[test]
    fn a_write_back_answered_after_the_node_was_recreated_keeps_the_recreated_nodes_change() {
        let (engine, source) = unreachable_source();
        let inner = &source.inner;
        inner.put(0, 5, 10, br#"[{"resource": "api", "count": 5}]"#);
        // This source's write makes version 6; before its answer is handled, another writer deletes the node
        // and creates it again (its data version starts at 0 again), and the watch applies that document.
        inner.deleted(0);
        inner.put(0, 0, 13, br#"[{"resource": "api", "count": 100}]"#);
        assert_eq!(engine.flow_rules()[0].count, 100.0);
        inner.written(0, 6, 11, r#"[{"resource": "api", "count": 6}]"#.to_string());
        // The recreated node's change is the one in force: the next write expects its version.
        let seen = inner.seen.lock().unwrap()[0].clone();
        assert_eq!(seen.version, Some(0), "the next write expects the recreated node's version");
        assert_eq!(seen.applied.as_deref(), Some(r#"[{"resource": "api", "count": 100}]"#));
        // The store then holds the document this source wrote: it is applied, not taken for the one in force.
        inner.put(0, 1, 14, br#"[{"resource": "api", "count": 6}]"#);
        assert_eq!(engine.flow_rules()[0].count, 6.0, "the store's document is not in force");
    }

    /// The test's side of a source's [`Gate`](super::super::gate::Gate), with a plain client: "another writer".
    struct Driver {
        rt: tokio::runtime::Runtime,
        other: zk::Client,
        stopped: std::sync::mpsc::Receiver<&'static str>,
    }

    const PATH: &str = "/sentinel/flow";
    const WAIT: Duration = Duration::from_secs(10);

    impl Driver {
        /// Connects, and creates the node with version 0 (count 0).
        fn new(
            server: &sentinel_testkit::zookeeper::ZookeeperServer,
        ) -> (Driver, std::sync::mpsc::Sender<&'static str>) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let other = rt.block_on(zk::Client::connect(&server.connect_string())).expect("connect to ZooKeeper");
            rt.block_on(async {
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                other.mkdir("/sentinel", &options).await.expect("mkdir");
            });
            let (tell, stopped) = std::sync::mpsc::channel();
            (Driver { rt, other, stopped }, tell)
        }
        fn create(&self, count: f64) {
            let data = format!(r#"[{{"resource": "api", "count": {count}}}]"#);
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            self.rt.block_on(self.other.create(PATH, data.as_bytes(), &options)).expect("create");
        }
        fn delete(&self) {
            self.rt.block_on(self.other.delete(PATH, None)).expect("delete");
        }
        /// A source on `server`, its gate telling `tell`, once it has read the node at start and watches.
        fn source(
            server: &sentinel_testkit::zookeeper::ZookeeperServer,
            engine: &Sentinel,
            tell: std::sync::mpsc::Sender<&'static str>,
        ) -> ZookeeperDataSource {
            let source = ZookeeperDataSource::builder(server.connect_string())
                .rules(RuleKind::Flow, PATH)
                .retry_max(Duration::from_millis(200))
                .clear_on_delete(true)
                .start(engine)
                .unwrap();
            *source.inner.gate.stopped.lock().unwrap() = Some(tell);
            assert!(source.wait_for(1, WAIT), "the node read at start");
            let start = std::time::Instant::now();
            while !source.is_connected() {
                assert!(start.elapsed() < WAIT, "connected");
                std::thread::yield_now();
            }
            source
        }
        fn set(&self, count: f64) -> i32 {
            let data = format!(r#"[{{"resource": "api", "count": {count}}}]"#);
            self.rt.block_on(self.other.set_data(PATH, data.as_bytes(), None)).expect("set").version
        }
        /// Arms `point`: the next read that reaches it stops there.
        fn arm(source: &ZookeeperDataSource, point: &'static str) {
            source.inner.gate.armed.lock().unwrap().push(point);
        }
        /// Waits until a read stopped at `point`.
        fn stopped_at(&self, point: &'static str) {
            assert_eq!(self.stopped.recv_timeout(WAIT), Ok(point), "a read stopped at `{point}`");
        }
        /// Lets the stopped read go.
        fn go(source: &ZookeeperDataSource) {
            source.inner.gate.go.notify_one();
        }
        /// Arms `point`, lets the stopped read go, and waits until a read stopped at `point`.
        fn step(&self, source: &ZookeeperDataSource, point: &'static str) {
            Driver::arm(source, point);
            Driver::go(source);
            self.stopped_at(point);
        }
        /// A source on `server` that saw no node at start, stopped before its read of a node another writer
        /// then created (count 1) and deleted.
        fn created_and_deleted_before_the_read(
            server: &sentinel_testkit::zookeeper::ZookeeperServer,
            engine: &Sentinel,
        ) -> (Driver, ZookeeperDataSource) {
            let (driver, tell) = Driver::new(server);
            let source = Driver::source(server, engine, tell);
            assert!(engine.flow_rules().is_empty(), "no node at start");
            Driver::arm(&source, "before get");
            driver.create(1.0);
            driver.stopped_at("before get");
            driver.delete();
            (driver, source)
        }
    }

    fn count(engine: &Sentinel) -> f64 {
        engine.flow_rules()[0].count
    }

    /// A read of version 2 answered after this source's write-back of version 3: ZooKeeper answered the read
    /// first (it was asked first), but the source's runtime handled the write's answer first. The read's
    /// document is older than the one the write put in force (its `mzxid` is lower): applying it runs
    /// version 2's rules while the node holds version 3, and makes the next write-back expect version 2.
    #[test]
    fn zookeeper_a_read_handled_after_the_write_back_of_a_later_version_does_not_apply_the_older_document() {
        let test = "zookeeper_a_read_handled_after_the_write_back_of_a_later_version";
        let Some(server) = sentinel_testkit::zookeeper::ZookeeperServer::start(test) else { return };
        let (driver, tell) = Driver::new(&server);
        driver.create(0.0);
        let engine = Sentinel::builder().build();
        let source = Driver::source(&server, &engine, tell);
        assert_eq!(count(&engine), 0.0);
        // Another writer makes versions 1 and 2; the read of the first change runs after both, and finds 2.
        Driver::arm(&source, "before get");
        assert_eq!(driver.set(1.0), 1);
        driver.stopped_at("before get");
        assert_eq!(driver.set(2.0), 2);
        driver.step(&source, "after put");
        assert_eq!(count(&engine), 2.0, "version 2 applied");
        // The read of the second change finds version 2 too; before it is handled, the dashboard's push of
        // version 3 is in force and written back (it expects version 2, the one this source saw last).
        driver.step(&source, "before put");
        engine.load_flow_rules([crate::flow::FlowRule::new("api").count(3.0)]).unwrap();
        source.write_rules(&RuleSet::snapshot(&engine, &[RuleKind::Flow])).expect("the write-back of version 3");
        assert_eq!(source.inner.seen.lock().unwrap()[0].version, Some(3));
        // Now the read of version 2 is handled.
        driver.step(&source, "after put");
        let (version, zxid) = {
            let seen = source.inner.seen.lock().unwrap();
            (seen[0].version, seen[0].zxid)
        };
        let applied = count(&engine);
        Driver::go(&source);
        assert_eq!(applied, 3.0, "version 2's rules brought back while the node holds version 3");
        assert_eq!(version, Some(3), "the next write-back expects version 3 (zxid {zxid})");
    }

    /// The write-back the dashboard makes: `count` in force, then written back.
    fn push(engine: &Sentinel, source: &ZookeeperDataSource, count: f64) {
        engine.load_flow_rules([crate::flow::FlowRule::new("api").count(count)]).unwrap();
        source.write_rules(&RuleSet::snapshot(engine, &[RuleKind::Flow])).expect("the write-back");
    }

    /// Another writer creates the node and deletes it; before this source handles the delete, the dashboard's
    /// push creates the node again (this source had seen no node). The delete's event, older than the
    /// source's own create, then takes the node for deleted: the rules written are cleared (`clear_on_delete`)
    /// while the node holds them, and the next write-back would try to create it.
    #[test]
    fn zookeeper_a_delete_handled_after_the_write_back_created_the_node_again_keeps_the_rules_written() {
        let test = "zookeeper_a_delete_handled_after_the_write_back_created_the_node_again";
        let Some(server) = sentinel_testkit::zookeeper::ZookeeperServer::start(test) else { return };
        let engine = Sentinel::builder().build();
        let (driver, source) = Driver::created_and_deleted_before_the_read(&server, &engine);
        push(&engine, &source, 2.0);
        // The read of the create finds the push's node; then the delete's event.
        driver.step(&source, "after event");
        assert_eq!(count(&engine), 2.0);
        driver.step(&source, "after event");
        let (rules, version) = (engine.flow_rules(), source.inner.seen.lock().unwrap()[0].version);
        Driver::go(&source);
        assert_eq!(rules.len(), 1, "the rules written were cleared while the node holds them");
        assert_eq!(version, Some(0), "the next write-back expects the node the push created");
    }

    /// Another writer creates the node and deletes it; the read of the create finds no node, but before this
    /// source handles that answer, the dashboard's push creates the node (this source had seen no node). The
    /// answer, older than the source's own create, then takes the node for deleted.
    #[test]
    fn zookeeper_a_read_finding_no_node_handled_after_the_write_back_created_it_keeps_the_rules_written() {
        let test = "zookeeper_a_read_finding_no_node_handled_after_the_write_back_created_it";
        let Some(server) = sentinel_testkit::zookeeper::ZookeeperServer::start(test) else { return };
        let engine = Sentinel::builder().build();
        let (driver, source) = Driver::created_and_deleted_before_the_read(&server, &engine);
        driver.step(&source, "after get");
        push(&engine, &source, 2.0);
        driver.step(&source, "after event");
        let (rules, version) = (engine.flow_rules(), source.inner.seen.lock().unwrap()[0].version);
        Driver::go(&source);
        assert_eq!(rules.len(), 1, "the rules written were cleared while the node holds them");
        assert_eq!(version, Some(0), "the next write-back expects the node the push created");
    }
}
