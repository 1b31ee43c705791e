//! Rules from etcd: Java's `EtcdDataSource` semantics (a key holding Sentinel's JSON, watched), written back
//! with a transaction on the key's revision.
//!
//! Each key holds one kind's list (Java's documents) or a combined [`RuleSet`] document. The data source
//! reads every key when it starts, then watches each from the revision it read it at. After a lost connection
//! it watches each key again from the last revision its own watch reached (its last event, or a progress
//! notice), so every change made meanwhile is replayed in order: none is missed and none is applied twice,
//! whichever key's events arrived first. If etcd compacted that history away, the keys are read again.
//!
//! A document that does not parse or that the engine rejects, and a deleted key, are reported (logged, given
//! to [`EtcdDataSource::on_reload`] listeners, kept as [`EtcdDataSource::last_error`]) and the rules in force
//! stay. (Java clears the rules when the key is deleted; [`EtcdDataSourceBuilder::clear_on_delete`] does
//! that.)
//!
//! Written back through [`WritableDataSource`] (the command center's write-back): a transaction puts the
//! document only if the key's mod revision is still the one this source last saw, so two writers never
//! silently overwrite each other; the loser gets [`WriteBackError::Conflict`] and the store keeps the
//! winner's rules, whole.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, EventType, Txn, TxnOp, WatchOptions};
use futures::StreamExt;

use super::remote::{
    settings_methods, source_accessors, split_credentials, Background, Credentials, Entry, Reports, SourceSettings,
};
use super::{ApplyError, ParseError, RuleSet, SourceStatus, WritableDataSource, WriteBackError};
use crate::{RuleError, RuleKind, Sentinel};

/// What happened to one key: given to [`EtcdDataSource::on_reload`] listeners.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum EtcdReload {
    /// The document changed and its rules are in force.
    Applied {
        /// The key.
        key: String,
        /// The key's mod revision.
        revision: i64,
        /// The kinds it holds.
        kinds: Vec<RuleKind>,
    },
    /// The document equals the one applied last (e.g. this source's own write-back), or is older than the
    /// change in force (a read answered before a later change this source already handled, such as its own
    /// write-back): nothing to apply.
    Unchanged {
        /// The key.
        key: String,
        /// The key's mod revision.
        revision: i64,
    },
    /// The key does not exist (yet) at start: nothing to apply.
    Missing {
        /// The key.
        key: String,
    },
    /// The document was not applied (or the key was deleted); the rules in force stay.
    Rejected(EtcdSourceError),
}

/// Why a document from etcd was not applied, or why the data source is not connected.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdSourceError {
    /// Not a rule document (syntax, wrong type, unknown field, bad code, not UTF-8).
    #[error("rules from etcd key `{key}` (revision {revision}): {error}; the rules in force stay")]
    Parse {
        /// The key.
        key: String,
        /// The key's mod revision.
        revision: i64,
        /// Where and why.
        #[source]
        error: ParseError,
    },
    /// A rule is invalid (the engine rejected the set).
    #[error("rules from etcd key `{key}` (revision {revision}): {error}")]
    Invalid {
        /// The key.
        key: String,
        /// The key's mod revision.
        revision: i64,
        /// The rule and the field.
        #[source]
        error: RuleError,
    },
    /// A gateway flow rule or API definition is invalid (the engine rejected the document; feature `tower`).
    #[cfg(feature = "tower")]
    #[error("gateway rules from etcd key `{key}` (revision {revision}): {error}")]
    InvalidGateway {
        /// The key.
        key: String,
        /// The key's mod revision.
        revision: i64,
        /// The rule or definition and the field.
        #[source]
        error: crate::web::gateway::GatewayRuleError,
    },
    /// The key was deleted (revision of the delete).
    #[error("etcd key `{key}` was deleted at revision {revision}; the rules in force stay")]
    Deleted {
        /// The key.
        key: String,
        /// The revision of the delete.
        revision: i64,
    },
    /// etcd is unreachable (the data source reconnects by itself).
    #[error("etcd data source at {endpoints}: {reason}; reconnecting, the rules in force stay")]
    Unavailable {
        /// The endpoints.
        endpoints: String,
        /// The failure.
        reason: String,
    },
    /// Bad settings.
    #[error("etcd data source: {0}")]
    Config(String),
}

/// What this source knows of one key.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// The revision of the last change of the key this source saw (a put or a delete).
    revision: i64,
    /// Whether the key exists as of that change (a write-back then expects `revision`, else an absent key).
    present: bool,
    /// The text applied last.
    applied: Option<String>,
}

struct Inner {
    engine: Sentinel,
    endpoints: Vec<String>,
    user: Option<Credentials>,
    keys: Vec<Entry>,
    retry_max: Duration,
    clear_on_delete: bool,
    seen: Mutex<Vec<Seen>>,
    /// Per key, the store's revision up to which its changes were handled (its watch resumes after it); 0
    /// before the key is read.
    resume: Mutex<Vec<i64>>,
    client: Mutex<Option<Client>>,
    reports: Reports<EtcdReload, EtcdSourceError>,
    /// Test-only points where the session stops until the test lets it go.
    #[cfg(test)]
    gate: Arc<super::gate::Gate>,
}

/// Rules read from etcd keys, applied on change through a watch, written back with a transaction.
///
/// ```no_run
/// use sentinel_runtime::{RuleKind, Sentinel, datasource::EtcdDataSource};
/// let engine = Sentinel::builder().app_name("shop").build();
/// let source = EtcdDataSource::builder("http://127.0.0.1:2379")
///     .rules(RuleKind::Flow, "/sentinel/shop/flow-rules")
///     .credentials("sentinel", "secret")
///     .start(&engine)?;
/// source.on_reload(|r| println!("{r:?}"));
/// # Ok::<(), sentinel_runtime::datasource::EtcdSourceError>(())
/// ```
#[must_use = "dropping the data source stops it"]
pub struct EtcdDataSource {
    inner: Arc<Inner>,
    background: Background,
}

impl std::fmt::Debug for EtcdDataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDataSource")
            .field("endpoints", &self.inner.endpoints)
            .field("keys", &self.inner.keys)
            .finish_non_exhaustive()
    }
}

/// The keys and settings of an [`EtcdDataSource`] before it starts.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct EtcdDataSourceBuilder {
    url: String,
    settings: SourceSettings,
    clear_on_delete: bool,
    #[cfg(test)]
    gate: Arc<super::gate::Gate>,
}

impl EtcdDataSource {
    /// A data source on the etcd at `url`: `http://host:port`, several separated by commas, credentials
    /// optionally in the URL (`http://user:password@host:port`). Add keys with
    /// [`EtcdDataSourceBuilder::rules`] or [`EtcdDataSourceBuilder::rule_set`].
    pub fn builder(url: impl Into<String>) -> EtcdDataSourceBuilder {
        EtcdDataSourceBuilder {
            url: url.into(),
            settings: SourceSettings::new(None),
            clear_on_delete: false,
            #[cfg(test)]
            gate: Arc::default(),
        }
    }
}

source_accessors!(EtcdDataSource, EtcdReload, EtcdSourceError);
settings_methods!(EtcdDataSourceBuilder, "EtcdDataSource", key, "`key`");

impl EtcdDataSourceBuilder {
    /// etcd user and password (Java's `EtcdConfig` user/password); replaces credentials in the URL.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.settings.user = Some((user.into(), password.into()));
        self
    }

    /// Whether a deleted key clears its kinds' rules, as Java does (default: no, the rules in force stay and
    /// the delete is reported).
    pub fn clear_on_delete(mut self, clear: bool) -> Self {
        self.clear_on_delete = clear;
        self
    }

    /// Starts the data source on its own thread: reads every key, then watches them. An etcd that is down
    /// is not an error (it is reported and retried); bad settings are.
    pub fn start(self, engine: &Sentinel) -> Result<EtcdDataSource, EtcdSourceError> {
        let settings = self.settings;
        settings
            .check("key", |k| k.name.trim().is_empty().then(|| format!("blank key in {k:?}")))
            .map_err(EtcdSourceError::Config)?;
        let (endpoints, url_user) = parse_url(&self.url)?;
        let inner = Arc::new(Inner {
            engine: engine.clone(),
            endpoints,
            user: settings.user.or(url_user),
            seen: Mutex::new(vec![Seen::default(); settings.entries.len()]),
            resume: Mutex::new(vec![0; settings.entries.len()]),
            keys: settings.entries,
            retry_max: settings.retry_max,
            clear_on_delete: self.clear_on_delete,
            client: Mutex::new(None),
            reports: Reports::new(),
            #[cfg(test)]
            gate: self.gate,
        });
        let (run, stop) = (inner.clone(), inner.clone());
        let background = Background::spawn("sentinel-etcd-rules", move || stop.reports.request_stop(), run.run())
            .map_err(|e| EtcdSourceError::Config(format!("could not start its thread: {e}")))?;
        Ok(EtcdDataSource { inner, background })
    }
}

/// `http://user:password@host:port,host2:port` → endpoints and credentials.
fn parse_url(url: &str) -> Result<(Vec<String>, Option<Credentials>), EtcdSourceError> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let (user, hosts) = split_credentials(rest);
    let endpoints: Vec<String> = hosts
        .split(',')
        .map(|h| h.trim().trim_end_matches('/'))
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{h}"))
        .collect();
    if endpoints.is_empty() {
        return Err(EtcdSourceError::Config(format!("no endpoint in `{}`", redact(url))));
    }
    Ok((endpoints, user))
}

/// The URL with its password hidden.
fn redact(url: &str) -> String {
    match url.split_once("://").and_then(|(s, r)| r.rsplit_once('@').map(|(info, h)| (s, info, h))) {
        Some((scheme, info, hosts)) => {
            format!("{scheme}://{}:***@{hosts}", info.split_once(':').map_or(info, |(u, _)| u))
        }
        None => url.to_string(),
    }
}

impl Inner {
    fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    async fn run(self: Arc<Self>) {
        let mut pause = Duration::from_millis(100).min(self.retry_max);
        while !self.reports.is_stopped() {
            match self.session(&mut pause).await {
                Ok(()) => break,
                Err(reason) => {
                    *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    let was = self.reports.set_connected(false);
                    let e = EtcdSourceError::Unavailable { endpoints: self.endpoints(), reason };
                    if was {
                        tracing::warn!(error = %e, "etcd data source lost its connection");
                    } else {
                        tracing::debug!(error = %e, "etcd data source: not connected");
                    }
                    self.report(EtcdReload::Rejected(e), false);
                    if !self.reports.pause(pause).await {
                        break;
                    }
                    pause = (pause * 2).min(self.retry_max);
                }
            }
        }
    }

    async fn connect(&self) -> Result<Client, String> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        if let Some((u, p)) = &self.user {
            // etcd's auth tokens end (after `--auth-token-ttl`, or when the user's password is set): a request
            // refused for its token authenticates again, as Java's jetcd does, so a write-back made long after
            // connecting is not refused.
            options = options.with_user(u.clone(), p.clone()).with_auto_token_refresh(true);
        }
        tokio::time::timeout(Duration::from_secs(5), Client::connect(&self.endpoints, Some(options)))
            .await
            .map_err(|_| "no answer within 5 s".to_string())?
            .map_err(|e| e.to_string())
    }

    /// One connection: read the keys (first time, or after a compaction), watch from the last revision,
    /// apply events until the connection drops (`Err`) or the source stops (`Ok`).
    async fn session(&self, pause: &mut Duration) -> Result<(), String> {
        let mut client = self.connect().await?;
        if self.resume().contains(&0) {
            self.read_all(&mut client).await?;
        }
        loop {
            #[cfg(test)]
            self.gate.stop("before watch").await;
            let resume = self.resume();
            let mut streams = Vec::with_capacity(self.keys.len());
            for (i, k) in self.keys.iter().enumerate() {
                let options = WatchOptions::new().with_start_revision(resume[i] + 1).with_progress_notify();
                let stream = client.watch(k.name.as_str(), Some(options)).await.map_err(|e| e.to_string())?;
                // Each response is handled as its key's: the streams' events arrive in no common order.
                streams.push(stream.map(move |m| (i, m)));
            }
            *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
            if !self.reports.set_connected(true) {
                tracing::info!(endpoints = %self.endpoints(), from = ?resume, "etcd data source watching");
            }
            *pause = Duration::from_millis(100).min(self.retry_max);
            let mut all = futures::stream::select_all(streams);
            let compacted = loop {
                tokio::select! {
                    m = all.next() => match m {
                        Some((i, Ok(resp))) => {
                            if resp.canceled() || resp.compact_revision() > 0 {
                                break true;
                            }
                            for ev in resp.events() {
                                self.on_event(i, ev);
                            }
                            // A progress notice: every change of the key up to its revision was sent.
                            if resp.events().is_empty() && !resp.created() {
                                self.handled_up_to(i, resp.header().map_or(0, |h| h.revision()));
                            }
                        }
                        Some((_, Err(e))) => return Err(e.to_string()),
                        None => return Err("the watch stream closed".into()),
                    },
                    _ = self.reports.stop_notify.notified() => return Ok(()),
                }
            };
            if compacted {
                tracing::warn!(from = ?resume, "etcd compacted the history a watch needed: reading the keys again");
                self.read_all(&mut client).await?;
            }
        }
    }

    /// Per key, the revision its watch resumes after.
    fn resume(&self) -> Vec<i64> {
        self.resume.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every change of key `i` up to `revision` was handled.
    fn handled_up_to(&self, i: usize, revision: i64) {
        let mut resume = self.resume.lock().unwrap_or_else(|e| e.into_inner());
        resume[i] = resume[i].max(revision);
    }

    /// Reads every key and applies it; each key's watch then resumes after the revision it was read at.
    async fn read_all(&self, client: &mut Client) -> Result<(), String> {
        for (i, k) in self.keys.iter().enumerate() {
            let resp = client.get(k.name.as_str(), None).await.map_err(|e| e.to_string())?;
            #[cfg(test)]
            self.gate.stop("after get").await;
            let header = resp.header().map_or(0, |h| h.revision());
            match resp.kvs().first() {
                Some(kv) => self.put(i, kv.mod_revision(), kv.value(), true),
                // Present when last seen: deleted meanwhile (a compaction hid the delete from the watch).
                None if self.seen.lock().unwrap_or_else(|e| e.into_inner())[i].present => self.deleted(i, header),
                None => {
                    tracing::info!(key = %k.name, "etcd data source: the key holds no rules yet");
                    self.report(EtcdReload::Missing { key: k.name.clone() }, true);
                }
            }
            self.handled_up_to(i, header);
            #[cfg(test)]
            self.gate.stop("after read").await;
        }
        Ok(())
    }

    /// An event of key `i`'s watch.
    fn on_event(&self, i: usize, ev: &etcd_client::Event) {
        let Some(kv) = ev.kv() else { return };
        if self.keys[i].name.as_bytes() != kv.key() {
            return;
        }
        let revision = kv.mod_revision();
        match ev.event_type() {
            EventType::Put => self.put(i, revision, kv.value(), false),
            EventType::Delete => self.deleted(i, revision),
        }
        self.handled_up_to(i, revision);
    }

    fn deleted(&self, i: usize, revision: i64) {
        let k = &self.keys[i];
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if revision <= seen[i].revision {
                return;
            }
            seen[i] = Seen { revision, present: false, applied: None };
        }
        if self.clear_on_delete && k.holds.cleared().apply_all(&self.engine).is_ok() {
            tracing::warn!(key = %k.name, holds = %k.holds, "etcd key deleted: its rules are cleared");
        }
        let e = EtcdSourceError::Deleted { key: k.name.clone(), revision };
        tracing::warn!(error = %e, "etcd data source: key deleted");
        self.report(EtcdReload::Rejected(e), true);
    }

    /// A document at `revision`: applied unless this revision was handled already (a replayed event), a
    /// later change is (a read answered before this source's own write-back but handled after it), or the
    /// text is what is in force.
    fn put(&self, i: usize, revision: i64, value: &[u8], initial: bool) {
        let k = &self.keys[i];
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if revision <= seen[i].revision && !initial {
                return;
            }
            if revision < seen[i].revision {
                drop(seen);
                tracing::debug!(key = %k.name, revision, "etcd data source: a read older than the change in force");
                return self.report(EtcdReload::Unchanged { key: k.name.clone(), revision }, true);
            }
            seen[i].revision = revision;
            seen[i].present = true;
            let same = seen[i].applied.as_deref().map(str::as_bytes) == Some(value);
            drop(seen);
            if same {
                self.report(EtcdReload::Unchanged { key: k.name.clone(), revision }, true);
                return;
            }
        }
        let parsed = k.holds.parse_bytes(value);
        let (text, set) = match parsed {
            Ok(ok) => ok,
            Err(error) => {
                let e = EtcdSourceError::Parse { key: k.name.clone(), revision, error };
                tracing::warn!(error = %e, "etcd data source: malformed rules, the rules in force stay");
                return self.report(EtcdReload::Rejected(e), true);
            }
        };
        match set.apply_all(&self.engine) {
            Ok(kinds) => {
                self.seen.lock().unwrap_or_else(|e| e.into_inner())[i].applied = Some(text.to_string());
                self.reports.loaded();
                tracing::info!(key = %k.name, revision, ?kinds, "etcd data source: rules applied");
                self.report(EtcdReload::Applied { key: k.name.clone(), revision, kinds }, true);
            }
            Err(error) => {
                let key = k.name.clone();
                let e = match error {
                    ApplyError::Rules(error) => EtcdSourceError::Invalid { key, revision, error },
                    #[cfg(feature = "tower")]
                    ApplyError::Gateway(error) => EtcdSourceError::InvalidGateway { key, revision, error },
                };
                tracing::warn!(error = %e, "etcd data source: rules rejected, the rules in force stay");
                self.report(EtcdReload::Rejected(e), true);
            }
        }
    }

    fn report(&self, r: EtcdReload, document: bool) {
        let error = match &r {
            EtcdReload::Rejected(e) => Some(e),
            _ => None,
        };
        self.reports.report(&r, error, document);
    }

    /// Writes one key with a transaction on its mod revision.
    async fn write_key(&self, client: &mut Client, i: usize, set: &RuleSet) -> Result<(), WriteBackError> {
        let k = &self.keys[i];
        let store = |reason: String| WriteBackError::Store { target: format!("etcd key `{}`", k.name), reason };
        let (expected, current) = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            // An absent key's mod revision is 0.
            (if seen[i].present { seen[i].revision } else { 0 }, seen[i].applied.clone())
        };
        // A combined document keeps the kinds the push does not hold as this source last read them.
        let text = k
            .holds
            .text(current.as_deref(), set, &self.engine)
            .map_err(|error| WriteBackError::Serialize { target: k.name.clone(), error })?;
        let txn = Txn::new()
            .when([Compare::mod_revision(k.name.as_str(), CompareOp::Equal, expected)])
            .and_then([TxnOp::put(k.name.as_str(), text.as_str(), None)])
            .or_else([TxnOp::get(k.name.as_str(), None)]);
        let resp = client.txn(txn).await.map_err(|e| store(e.to_string()))?;
        if !resp.succeeded() {
            return Err(WriteBackError::Conflict {
                target: format!("etcd key `{}`", k.name),
                detail: format!("expected mod revision {expected}, another writer changed it"),
            });
        }
        self.written(i, resp.header().map_or(0, |h| h.revision()), text);
        Ok(())
    }

    /// This source put `text` in key `i` at `revision`: what is in force, so its watch event finds nothing to
    /// do. Unless the watch already handled it, or a later change of the key: that one is in force, and the
    /// next write expects its revision.
    ///
    /// And only if the engine runs what was written: when it runs something else (the watch applied another
    /// writer's change after the rules written were loaded), the watch's event of this write applies it, so
    /// the engine ends with what the key holds.
    fn written(&self, i: usize, revision: i64, text: String) {
        if !self.keys[i].holds.parse(&text, super::Format::Json).is_ok_and(|set| set.is_in_force(&self.engine)) {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen[i].revision < revision {
            seen[i] = Seen { revision, present: true, applied: Some(text) };
        }
    }
}

impl WritableDataSource for EtcdDataSource {
    /// Puts each kind of `set` in its key (a combined document keeps the kinds `set` does not hold), in a
    /// transaction that succeeds only if the key's mod revision is the one this source saw last: a key
    /// another writer changed meanwhile is not overwritten ([`WriteBackError::Conflict`]).
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        let inner = self.inner.clone();
        self.background.write_back(
            "etcd",
            format!("etcd {}", self.inner.endpoints()),
            self.inner.keys.iter().map(|e| e.holds),
            &self.inner.client,
            set,
            move |mut client, i, set| {
                let inner = inner.clone();
                async move { inner.write_key(&mut client, i, &set).await }
            },
        )
    }

    /// Puts the gateway's lists `docs` manages in their keys (one holding that list, or a combined
    /// document), as [`write_rules`](WritableDataSource::write_rules) does.
    #[cfg(feature = "tower")]
    fn write_gateway(&self, docs: &super::GatewayDocuments) -> Result<(), WriteBackError> {
        self.write_rules(&RuleSet { gateway: docs.clone(), ..RuleSet::default() })
    }

    fn status(&self) -> SourceStatus {
        let keys: Vec<&str> = self.inner.keys.iter().map(|k| k.name.as_str()).collect();
        SourceStatus {
            connected: self.is_connected(),
            last_load_ms: self.inner.reports.last_load_ms(),
            last_error: self.last_error().map(|e| e.to_string()),
            ..SourceStatus::new("etcd", format!("{} {}", self.inner.endpoints(), keys.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source whose etcd never answers (nothing listens on port 1): its state is the test's alone.
    fn source(engine: &Sentinel) -> EtcdDataSource {
        EtcdDataSource::builder("http://127.0.0.1:1")
            .rules(RuleKind::Flow, "/a/flow")
            .rules(RuleKind::Degrade, "/b/degrade")
            .retry_max(Duration::from_secs(60))
            .start(engine)
            .unwrap()
    }

    #[test]
    fn each_keys_watch_resumes_after_what_its_own_watch_handled() {
        let engine = Sentinel::builder().build();
        let source = source(&engine);
        let inner = &source.inner;
        assert_eq!(inner.resume(), [0, 0], "no key read yet: the session reads them first");
        // Key 1's change at revision 10 came in before key 0's at 9 (the streams keep no common order).
        inner.handled_up_to(1, 10);
        assert_eq!(inner.resume(), [0, 10], "key 0 resumes before its change at 9");
        inner.handled_up_to(0, 9);
        inner.handled_up_to(0, 7);
        assert_eq!(inner.resume(), [9, 10], "never back");
    }

    #[test]
    fn a_write_back_answered_after_the_watch_applied_a_later_change_keeps_that_change() {
        let engine = Sentinel::builder().build();
        let source = source(&engine);
        let inner = &source.inner;
        // Another writer's document at revision 12 is in force (the watch applied it)...
        inner.put(0, 12, br#"[{"resource": "api", "count": 12}]"#, false);
        assert_eq!(engine.flow_rules()[0].count, 12.0);
        // ... when this source's own write at 11 is answered.
        inner.written(0, 11, r#"[{"resource": "api", "count": 11}]"#.to_string());
        let seen = inner.seen.lock().unwrap()[0].clone();
        assert_eq!((seen.revision, seen.present), (12, true), "the next write expects revision 12");
        assert_eq!(seen.applied.as_deref(), Some(r#"[{"resource": "api", "count": 12}]"#));
        // The same document from the store again is found in force.
        inner.put(0, 13, br#"[{"resource": "api", "count": 11}]"#, false);
        assert_eq!(engine.flow_rules()[0].count, 11.0, "applied, not taken for the text in force");
        // A write answered before its event: the write (loaded first, as the command center does) is what is
        // in force.
        let fourteen = r#"[{"resource": "api", "count": 14}]"#;
        RuleSet::parse_entry(Some(RuleKind::Flow), fourteen, super::super::Format::Json)
            .unwrap()
            .apply(&engine)
            .unwrap();
        inner.written(0, 14, fourteen.to_string());
        assert_eq!(inner.seen.lock().unwrap()[0].revision, 14);
    }

    /// A read made after a compaction, answered before this source's write-back but handled after it: the
    /// read's document (mod revision 3) is older than the one the write put in force (revision 6). Applying
    /// it runs the older rules while the key holds the newer, and makes the next write-back expect revision 3.
    #[test]
    fn etcd_a_read_after_a_compaction_handled_after_the_write_back_does_not_apply_the_older_document() {
        let test = "etcd_a_read_after_a_compaction_handled_after_the_write_back";
        let Some(etcd) = sentinel_testkit::etcd::EtcdServer::start(test) else { return };
        const WAIT: Duration = Duration::from_secs(10);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut other = rt.block_on(Client::connect([etcd.url()], None)).expect("connect to etcd");
        let doc = |count: f64| format!(r#"[{{"resource": "api", "count": {count}}}]"#);
        let b = rt.block_on(other.put("/sentinel/flow", doc(1.0), None)).expect("put").header().unwrap().revision();
        let engine = Sentinel::builder().build();
        let builder = EtcdDataSource::builder(etcd.url())
            .rules(RuleKind::Flow, "/sentinel/flow")
            .retry_max(Duration::from_millis(200));
        let (tell, stopped) = std::sync::mpsc::channel();
        *builder.gate.stopped.lock().unwrap() = Some(tell);
        builder.gate.armed.lock().unwrap().push("before watch");
        let gate = builder.gate.clone();
        let stopped_at = |point: &'static str| assert_eq!(stopped.recv_timeout(WAIT), Ok(point), "stopped");
        let source = builder.start(&engine).unwrap();
        // Read at start (revision `b`); stopped before its watch is made.
        stopped_at("before watch");
        assert_eq!(engine.flow_rules()[0].count, 1.0);
        // Other keys change, and etcd compacts its history past the key's watch's start.
        let mut last = 0;
        for n in 0..3 {
            last = rt.block_on(other.put("/other", n.to_string(), None)).unwrap().header().unwrap().revision();
        }
        rt.block_on(other.compact(last, None)).expect("compact");
        // The watch is cancelled (compacted): the key is read again; its answer (revision `b`) waits...
        gate.armed.lock().unwrap().push("after get");
        gate.go.notify_one();
        stopped_at("after get");
        // ... while the dashboard's push is in force and written back (it expects revision `b`).
        engine.load_flow_rules([crate::flow::FlowRule::new("api").count(2.0)]).unwrap();
        source.write_rules(&RuleSet::snapshot(&engine, &[RuleKind::Flow])).expect("the write-back");
        let written = source.inner.seen.lock().unwrap()[0].revision;
        assert!(written > last, "written at {written}");
        // Now the read is handled.
        gate.armed.lock().unwrap().push("after read");
        gate.go.notify_one();
        stopped_at("after read");
        let (count, seen) = (engine.flow_rules()[0].count, source.inner.seen.lock().unwrap()[0].revision);
        gate.go.notify_one();
        assert_eq!(
            count, 2.0,
            "the read of revision {b} brought its rules back while the key holds revision {written}"
        );
        assert_eq!(seen, written, "the next write-back expects the write's revision");
    }
}
