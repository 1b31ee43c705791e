//! One interface for the stores rules are written back to: the command center's write-back of pushed rules
//! goes through [`WritableDataSource`], whatever the store (a file, Redis, ZooKeeper, etcd, or a user's own).

use std::sync::Arc;

use super::{RuleSet, WriteError};

/// Why rules could not be written back to a store. The rules already in force stay in force; the store keeps
/// what it had (every implementation writes all of a push or nothing).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteBackError {
    /// A rules file (or directory) could not be written.
    #[error(transparent)]
    File(#[from] WriteError),
    /// Another writer changed the stored rules since this source last read them (a compare-and-set failed
    /// and was not retried): the store keeps the other writer's rules, whole.
    #[error("{target}: another writer changed the rules first ({detail}); the store keeps theirs")]
    Conflict {
        /// Where (a key, a node path).
        target: String,
        /// What was expected and what was found.
        detail: String,
    },
    /// The store is unreachable or refused the write.
    #[error("{target}: {reason}")]
    Store {
        /// Where (a key, a node path, a URL with its password hidden).
        target: String,
        /// The failure.
        reason: String,
    },
    /// The rules could not be written in the store's format.
    #[error("{target}: {error}")]
    Serialize {
        /// Where.
        target: String,
        /// Why.
        #[source]
        error: super::SerializeError,
    },
    /// The store does not hold rules of this kind.
    #[error("{target} does not store {kind} rules")]
    Unsupported {
        /// Where.
        target: String,
        /// The kind that was to be written.
        kind: crate::RuleKind,
    },
}

/// What a status page says about a data source: which store, when rules were last loaded from it, and the
/// last failure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStatus {
    /// The kind of store (`file`, `redis`, `zookeeper`, `etcd`, or a user's own name).
    pub kind: String,
    /// Where (a path, a URL with its password hidden, a key or node).
    pub target: String,
    /// Whether the source is connected to its store now (a file source always is).
    pub connected: bool,
    /// When rules were last applied from the store (ms since the Unix epoch), if ever.
    pub last_load_ms: Option<u64>,
    /// The last failure (a bad document, a deleted key, the store down), until rules load again.
    pub last_error: Option<String>,
}

impl SourceStatus {
    /// A status of `kind` at `target`, connected, never loaded, no error.
    pub fn new(kind: impl Into<String>, target: impl Into<String>) -> Self {
        SourceStatus { kind: kind.into(), target: target.into(), connected: true, ..SourceStatus::default() }
    }
}

/// A store that rules pushed through the command center (dashboard pushes, the console) are written back
/// to, so that they are what the next start loads.
///
/// The command center loads a push into the engine first (a rejected push changes nothing), then calls
/// [`write_rules`](WritableDataSource::write_rules) with the kinds pushed; an error makes the answer
/// `partial success (write data source failed)`: the rules are in force but not stored.
///
/// Implemented by [`FileDataSource`](super::FileDataSource), the Redis data source (feature
/// `cluster-redis`), the ZooKeeper (feature `zookeeper`) and etcd (feature `etcd`) data sources. A store of
/// your own implements it in a few lines:
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use sentinel_runtime::datasource::{Format, RuleSet, SourceStatus, WritableDataSource, WriteBackError};
///
/// /// Rules kept per kind in a map (a stand-in for a store such as Nacos or Apollo).
/// #[derive(Default)]
/// struct MapStore(Mutex<HashMap<String, String>>);
///
/// impl WritableDataSource for MapStore {
///     fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
///         let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
///         for kind in set.kinds() {
///             let text = set.kind_to_string(kind, Format::Json)
///                 .map_err(|error| WriteBackError::Serialize { target: kind.to_string(), error })?;
///             map.insert(kind.to_string(), text);
///         }
///         Ok(())
///     }
///     fn status(&self) -> SourceStatus {
///         SourceStatus::new("map", "memory")
///     }
/// }
///
/// let store = MapStore::default();
/// let set = RuleSet::new().with_flow(vec![sentinel_runtime::flow::FlowRule::new("api").count(5.0)]);
/// store.write_rules(&set).unwrap();
/// assert!(store.0.lock().unwrap()["flow"].contains("\"count\": 5.0"));
/// ```
pub trait WritableDataSource: Send + Sync + 'static {
    /// Writes the kinds `set` holds to the store (the kinds it does not hold stay as stored), all or nothing.
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError>;

    /// Which store, when it last loaded, and its last failure (for `diagnose` and the console).
    fn status(&self) -> SourceStatus;

    /// Writes the gateway lists `docs` manages (feature `tower`; the dashboard's gateway pages push them,
    /// one list at a time). The file, Redis, ZooKeeper and etcd sources store them (see
    /// [the module](super)); by default a store does not hold them: an error, and the command center answers
    /// `partial success (write data source failed)`.
    #[cfg(feature = "tower")]
    fn write_gateway(&self, docs: &super::GatewayDocuments) -> Result<(), WriteBackError> {
        let _ = docs;
        Err(WriteBackError::Store {
            target: self.status().target,
            reason: "this data source does not store gateway rules or API definitions".into(),
        })
    }
}

impl std::fmt::Debug for dyn WritableDataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.status();
        f.debug_struct("WritableDataSource").field("kind", &s.kind).field("target", &s.target).finish()
    }
}

impl<T: WritableDataSource + ?Sized> WritableDataSource for Arc<T> {
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        (**self).write_rules(set)
    }
    fn status(&self) -> SourceStatus {
        (**self).status()
    }
    #[cfg(feature = "tower")]
    fn write_gateway(&self, docs: &super::GatewayDocuments) -> Result<(), WriteBackError> {
        (**self).write_gateway(docs)
    }
}

impl WritableDataSource for super::FileDataSource {
    fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
        super::FileDataSource::write_rules(self, set).map_err(WriteBackError::File)
    }
    #[cfg(feature = "tower")]
    fn write_gateway(&self, docs: &super::GatewayDocuments) -> Result<(), WriteBackError> {
        super::FileDataSource::write_gateway(self, docs)
    }
    fn status(&self) -> SourceStatus {
        SourceStatus {
            last_load_ms: self.last_load_ms(),
            last_error: self.last_error().map(|e| e.to_string()),
            ..SourceStatus::new("file", self.path().display().to_string())
        }
    }
}

/// Milliseconds since the Unix epoch, now (for [`SourceStatus::last_load_ms`]).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl RuleSet {
    /// Parses a document of one store entry: one kind's list (Java's per-kind documents) when `kind` is
    /// given, a combined document (`{"flowRules": [...], ...}`) when it is `None`.
    ///
    /// ```
    /// use sentinel_runtime::{RuleKind, datasource::{Format, RuleSet}};
    /// let set = RuleSet::parse_entry(Some(RuleKind::Flow), r#"[{"resource": "a", "count": 2}]"#, Format::Json).unwrap();
    /// assert_eq!(set.flow.unwrap()[0].count, 2.0);
    /// ```
    pub fn parse_entry(
        kind: Option<crate::RuleKind>,
        text: &str,
        format: super::Format,
    ) -> Result<RuleSet, super::ParseError> {
        use super::parse_rules;
        use crate::RuleKind;
        let mut set = RuleSet::default();
        match kind {
            None => return RuleSet::parse(text, format),
            Some(RuleKind::Flow) => set.flow = Some(parse_rules(text, format)?),
            Some(RuleKind::Degrade) => set.degrade = Some(parse_rules(text, format)?),
            Some(RuleKind::System) => set.system = Some(parse_rules(text, format)?),
            Some(RuleKind::Authority) => set.authority = Some(parse_rules(text, format)?),
            Some(RuleKind::ParamFlow) => set.param_flow = Some(parse_rules(text, format)?),
            Some(RuleKind::Adaptive) => set.adaptive = Some(parse_rules(text, format)?),
        }
        Ok(set)
    }

    /// One kind's rules of the set as that kind's list (Java's per-kind document); an empty list when the
    /// set does not hold the kind.
    pub fn kind_to_string(
        &self,
        kind: crate::RuleKind,
        format: super::Format,
    ) -> Result<String, super::SerializeError> {
        use super::rules_to_string;
        use crate::RuleKind;
        match kind {
            RuleKind::Flow => rules_to_string(self.flow.as_deref().unwrap_or_default(), format),
            RuleKind::Degrade => rules_to_string(self.degrade.as_deref().unwrap_or_default(), format),
            RuleKind::System => rules_to_string(self.system.as_deref().unwrap_or_default(), format),
            RuleKind::Authority => rules_to_string(self.authority.as_deref().unwrap_or_default(), format),
            RuleKind::ParamFlow => rules_to_string(self.param_flow.as_deref().unwrap_or_default(), format),
            RuleKind::Adaptive => rules_to_string(self.adaptive.as_deref().unwrap_or_default(), format),
        }
    }

    /// The text a store entry holds for this set: one kind's list when `kind` is given, else the combined
    /// document of the kinds the set holds.
    pub fn entry_to_string(
        &self,
        kind: Option<crate::RuleKind>,
        format: super::Format,
    ) -> Result<String, super::SerializeError> {
        match kind {
            Some(k) => self.kind_to_string(k, format),
            None => self.to_string(format),
        }
    }
}
