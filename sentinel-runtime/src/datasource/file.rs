//! A rules file (or directory) applied to an engine, reloaded on demand or when it changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{file_stem, parse_rules, rules_to_string, Format, RuleSet, SourceError, WriteError, ALL_KINDS};
use crate::adaptive::AdaptiveRule;
use crate::authority::AuthorityRule;
use crate::circuit_breaker::DegradeRule;
use crate::flow::FlowRule;
use crate::param_flow::ParamFlowRule;
use crate::system::SystemRule;
use crate::{RuleError, RuleKind, Sentinel};

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reloaded {
    /// The file(s) changed and their rules are in force.
    Applied {
        /// The kinds the file(s) hold.
        kinds: Vec<RuleKind>,
    },
    /// The content equals what was applied last: nothing to do.
    Unchanged,
}

type Listener = dyn Fn(&Result<Reloaded, SourceError>) + Send + Sync;

#[derive(Clone, Debug)]
enum Layout {
    /// One document with every kind (`{"flowRules": [...], ...}`).
    Combined(PathBuf),
    /// One kind's list (the file is named like `flow-rules.json`).
    Single(PathBuf, RuleKind),
    /// A directory with one file per kind, named `flow-rules.json`, `degrade-rules.yaml`, ...
    Dir(PathBuf),
    /// One of the gateway's lists, Java's file named by its stem (`gw-flow-rules`, `gw-api-definitions`).
    #[cfg(feature = "tower")]
    Gateway(PathBuf, &'static str),
}

/// Bounds on what a [`FileDataSource`] accepts: a file over either is refused with a typed error
/// ([`SourceError::TooLarge`], [`SourceError::TooManyRules`]) and the rules in force stay.
///
/// ```
/// use sentinel_runtime::{Sentinel, datasource::{FileDataSource, FileLimits}};
/// let engine = Sentinel::builder().build();
/// let source = FileDataSource::new(&engine, "rules.json")
///     .with_limits(FileLimits { max_file_bytes: 1 << 20, max_rules: 5_000 });
/// assert_eq!(source.limits().max_rules, 5_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimits {
    /// The largest rules file read, in bytes (each file of a directory). Default 16 MiB (about 400,000
    /// small JSON rules).
    pub max_file_bytes: u64,
    /// The most rules a reload applies, every kind and file counted together. Default 100,000.
    pub max_rules: usize,
}

/// The default of [`FileLimits::max_file_bytes`], also the bound on a store's entry (Redis, etcd, ZooKeeper).
pub(crate) const DEFAULT_MAX_BYTES: usize = 16 << 20;

/// The default of [`FileLimits::max_rules`], also the bound on a store's entry.
pub(crate) const DEFAULT_MAX_RULES: usize = 100_000;

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits { max_file_bytes: DEFAULT_MAX_BYTES as u64, max_rules: DEFAULT_MAX_RULES }
    }
}

#[derive(Default)]
struct State {
    /// The (path, content) pairs applied last.
    applied: Option<Vec<(PathBuf, String)>>,
    /// Files of a directory seen at the last reload.
    present: Vec<PathBuf>,
    last_error: Option<SourceError>,
    /// When rules were last applied from the file(s), ms since the Unix epoch.
    last_load_ms: Option<u64>,
    limits: FileLimits,
}

struct Inner {
    engine: Sentinel,
    layout: Layout,
    state: Mutex<State>,
    listeners: Mutex<Vec<Arc<Listener>>>,
}

/// A rules file or directory applied to an engine.
///
/// * a directory: one file per kind, named `flow-rules`, `degrade-rules`, `system-rules`, `authority-rules`,
///   `param-flow-rules`, with the extension `.json`, `.yaml`/`.yml` or `.toml` (each a list, as Java's files);
/// * a file named like one of those: that kind's list;
/// * `gw-flow-rules.json` or `gw-api-definitions.json` (feature `tower`): that gateway list, in Java's JSON
///   (a directory may hold them too, beside the other kinds' files);
/// * any other file: a combined document ([`RuleSet`]; with the gateway's `gwFlowRules` and
///   `gwApiDefinitions`).
///
/// [`reload_now`](FileDataSource::reload_now) reads and applies it; with the `file-watch` feature,
/// [`watch`](FileDataSource::watch) does so whenever it changes. A file that cannot be read, parsed or
/// validated is reported (with its path, line and field) and the rules in force stay; so does a deleted file.
///
/// It is also writable: [`write_rules`](FileDataSource::write_rules) stores rules (say, pushed from the
/// Sentinel Dashboard) back into the file(s), atomically and in the file's own format, so they survive a
/// restart.
///
/// ```
/// use sentinel_runtime::{Sentinel, datasource::FileDataSource};
/// let dir = std::env::temp_dir().join(format!("sentinel-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let file = dir.join("rules.json");
/// std::fs::write(&file, r#"{"flowRules": [{"resource": "api", "grade": 1, "count": 10}]}"#).unwrap();
/// let engine = Sentinel::builder().build();
/// let source = FileDataSource::new(&engine, &file);
/// source.reload_now().unwrap();
/// assert_eq!(engine.flow_rules()[0].count, 10.0);
/// # std::fs::remove_dir_all(&dir).ok();
/// ```
#[derive(Clone)]
pub struct FileDataSource {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FileDataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDataSource").field("layout", &self.inner.layout).finish_non_exhaustive()
    }
}

fn kind_of_file(path: &Path) -> Option<RuleKind> {
    let stem = path.file_stem()?.to_str()?;
    ALL_KINDS.into_iter().find(|k| file_stem(*k) == stem)
}

/// The layout of a rules file, from its name: one of the gateway's files (`gw-flow-rules.json`,
/// `gw-api-definitions.json`), one kind's list (`flow-rules.json`, ...), else a combined document.
fn file_layout(path: PathBuf) -> Layout {
    #[cfg(feature = "tower")]
    if let Some(stem) = super::gateway::gateway_stem(&path) {
        return Layout::Gateway(path, stem);
    }
    match kind_of_file(&path) {
        Some(kind) => Layout::Single(path, kind),
        None => Layout::Combined(path),
    }
}

fn format_of(path: &Path) -> Format {
    Format::from_path(path).unwrap_or(Format::Json)
}

const EXTENSIONS: [&str; 4] = ["json", "yaml", "yml", "toml"];

impl FileDataSource {
    /// A data source for the file or directory at `path`. A file need not exist yet (a directory must, to be
    /// taken for one). Nothing is read until [`reload_now`](FileDataSource::reload_now) or
    /// [`watch`](FileDataSource::watch).
    pub fn new(engine: &Sentinel, path: impl AsRef<Path>) -> Self {
        let path = path.as_ref().to_path_buf();
        let layout = if path.is_dir() { Layout::Dir(path) } else { file_layout(path) };
        FileDataSource {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                layout,
                state: Mutex::new(State::default()),
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A data source for a file holding one kind's list (Java's per-kind files), whatever its name.
    ///
    /// ```
    /// use sentinel_runtime::{RuleKind, Sentinel, datasource::FileDataSource};
    /// let dir = std::env::temp_dir().join(format!("sentinel-doc-kind-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// let file = dir.join("FlowRule.json");
    /// std::fs::write(&file, r#"[{"resource": "api", "count": 3}]"#).unwrap();
    /// let engine = Sentinel::builder().build();
    /// FileDataSource::for_kind(&engine, &file, RuleKind::Flow).reload_now().unwrap();
    /// assert_eq!(engine.flow_rules()[0].count, 3.0);
    /// # std::fs::remove_dir_all(&dir).ok();
    /// ```
    pub fn for_kind(engine: &Sentinel, path: impl AsRef<Path>, kind: RuleKind) -> Self {
        FileDataSource {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                layout: Layout::Single(path.as_ref().to_path_buf(), kind),
                state: Mutex::new(State::default()),
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The file or directory watched.
    pub fn path(&self) -> &Path {
        match &self.inner.layout {
            Layout::Combined(p) | Layout::Single(p, _) | Layout::Dir(p) => p,
            #[cfg(feature = "tower")]
            Layout::Gateway(p, _) => p,
        }
    }

    pub(crate) fn is_dir(&self) -> bool {
        matches!(self.inner.layout, Layout::Dir(_))
    }

    /// Whether the source is a file of one rule kind's list (whatever its name).
    #[cfg(feature = "tower")]
    fn is_single_kind(&self) -> bool {
        matches!(self.inner.layout, Layout::Single(..))
    }

    /// The paths whose content is the rules: the file, or every name a rules file of the directory may have
    /// (used by the watcher).
    #[cfg_attr(not(feature = "file-watch"), allow(dead_code))]
    pub(crate) fn watch_targets(&self) -> Vec<PathBuf> {
        match &self.inner.layout {
            Layout::Combined(p) | Layout::Single(p, _) => vec![p.clone()],
            #[cfg(feature = "tower")]
            Layout::Gateway(p, _) => vec![p.clone()],
            Layout::Dir(dir) => {
                #[allow(unused_mut)]
                let mut targets: Vec<PathBuf> = ALL_KINDS
                    .into_iter()
                    .flat_map(|kind| EXTENSIONS.map(|ext| dir.join(format!("{}.{ext}", file_stem(kind)))))
                    .collect();
                // The gateway's files (Java's names) change the rules too.
                #[cfg(feature = "tower")]
                targets.extend(super::gateway::GATEWAY_FILE_STEMS.map(|stem| dir.join(format!("{stem}.json"))));
                targets
            }
        }
    }

    /// Calls `f` with the outcome of every reload (by [`reload_now`](FileDataSource::reload_now) or the
    /// watcher): a good place to log rejected files.
    pub fn on_reload(&self, f: impl Fn(&Result<Reloaded, SourceError>) + Send + Sync + 'static) {
        self.inner.listeners.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(f));
    }

    /// When rules were last applied from the file(s) (ms since the Unix epoch), if ever.
    pub(crate) fn last_load_ms(&self) -> Option<u64> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).last_load_ms
    }

    /// The error of the last reload, if it failed.
    pub fn last_error(&self) -> Option<SourceError> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).last_error.clone()
    }

    /// Sets the bounds on what this source accepts (see [`FileLimits`]); takes effect at the next reload.
    pub fn with_limits(self, limits: FileLimits) -> Self {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).limits = limits;
        self
    }

    /// The bounds on what this source accepts.
    pub fn limits(&self) -> FileLimits {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).limits
    }

    /// Reads the file(s) now and applies them if they changed. On any error the rules in force stay: all of
    /// them for a file; in a directory, those of the file in error (each file stands alone, as Java's per-kind
    /// `FileRefreshableDataSource`s do), while the other files' rules are applied and the error is returned.
    pub fn reload_now(&self) -> Result<Reloaded, SourceError> {
        let result = {
            let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            let r = self.reload_locked(&mut state);
            state.last_error = r.as_ref().err().cloned();
            r
        };
        match &result {
            Ok(Reloaded::Applied { kinds }) => {
                tracing::info!(path = %self.path().display(), ?kinds, "rules reloaded")
            }
            Ok(Reloaded::Unchanged) => {}
            Err(e) => tracing::warn!(error = %e, "rules file rejected"),
        }
        let listeners: Vec<Arc<Listener>> = self.inner.listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for l in listeners {
            l(&result);
        }
        result
    }

    /// Writes the rules in force of `kinds` back to the file(s), with every other kind the file(s) hold, so
    /// that a restart loads exactly the rules in force: what the command center calls after a push. See
    /// [`write_rules`](FileDataSource::write_rules).
    pub fn write_in_force(&self, kinds: &[RuleKind]) -> Result<(), WriteError> {
        self.write_rules(&RuleSet::snapshot(&self.inner.engine, kinds))
    }

    /// Writes the kinds `set` holds back to the file(s), so that they are what a restart loads. Each file is
    /// written atomically in its own format (JSON, YAML or TOML): a temporary file in the same directory,
    /// synced, then renamed over the file (which keeps its permissions), so a reader sees the old content or
    /// the new, never a mix. A rules file that is a symbolic link (a chain of them, relative or absolute) is
    /// written through: the link's final target is replaced, in the target's own directory, and the link stays.
    ///
    /// The other kinds the file(s) hold are written as the engine has them **in force**, not as the file has
    /// them: an edit the engine refused (an invalid rule of another kind) is replaced by the rules in force,
    /// so a write that succeeds always survives a restart. Concretely:
    ///
    /// * a combined document holds afterwards the kinds of `set`, and every other kind it held, with the
    ///   rules in force (its current content must parse, or it is left untouched: [`WriteError::Unreadable`]);
    /// * a single-kind file takes only its own kind ([`WriteError::WrongKind`] for another);
    /// * a directory gets the kind's file, `flow-rules.json` and so on (the existing file's extension is kept);
    ///   another kind's file that differs from the rules in force is rewritten with them (one that does not
    ///   parse is left untouched and the write fails: [`WriteError::Unreadable`]).
    ///
    /// What is written is read back before it replaces anything ([`WriteError::RoundTrip`] if it would load
    /// differently). The write does not load the rules: load them into the engine first (only rules it
    /// accepted should be stored). The reload that the change triggers (a watcher sees it) finds the content
    /// it just wrote and does nothing, so the write and the watcher never fight; unless the engine no longer
    /// runs what was written (a reload of another edit came between the load and the write): then that reload
    /// applies the file, as Java's file source re-reads a file its writer wrote, and the engine runs what the
    /// file holds.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, datasource::{FileDataSource, RuleSet}, flow::FlowRule};
    /// let dir = std::env::temp_dir().join(format!("sentinel-doc-write-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// let file = dir.join("rules.json");
    /// let engine = Sentinel::builder().build();
    /// let source = FileDataSource::new(&engine, &file);
    /// let rules = vec![FlowRule::new("api").count(5.0)];
    /// engine.load_flow_rules(rules.clone()).unwrap();
    /// source.write_rules(&RuleSet::new().with_flow(rules)).unwrap();
    /// // A restart: a new engine loads the file.
    /// let restarted = Sentinel::builder().build();
    /// FileDataSource::new(&restarted, &file).reload_now().unwrap();
    /// assert_eq!(restarted.flow_rules()[0].count, 5.0);
    /// # std::fs::remove_dir_all(&dir).ok();
    /// ```
    pub fn write_rules(&self, set: &RuleSet) -> Result<(), WriteError> {
        #[cfg(feature = "tower")]
        if let Layout::Gateway(path, stem) = &self.inner.layout {
            if let Some(kind) = set.kinds().into_iter().next() {
                let holds = super::gateway::list_name(stem).to_string();
                return Err(WriteError::CannotHold { path: path.clone(), holds, what: format!("{kind} rules") });
            }
            return self.write_gateway_files(&set.gateway);
        }
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let limits = state.limits;
        let engine = &self.inner.engine;
        // The file's content as it stands: `None` when there is none yet.
        let current = |path: &Path| -> Result<Option<RuleSet>, WriteError> {
            match read(path, &limits) {
                Ok(text) if text.trim().is_empty() => Ok(None),
                Ok(text) => self
                    .parse_file(path, &text, format_of(path))
                    .map(Some)
                    .map_err(|error| WriteError::Unreadable { path: path.to_path_buf(), error }),
                Err(SourceError::Missing { .. }) => Ok(None),
                Err(e) => Err(WriteError::Read { path: path.to_path_buf(), error: Box::new(e) }),
            }
        };
        let writes: Vec<(PathBuf, RuleSet)> = match &self.inner.layout {
            Layout::Combined(path) => {
                let held = current(path)?.unwrap_or_default();
                let others: Vec<RuleKind> = held.kinds().into_iter().filter(|k| !set.has(*k)).collect();
                let mut doc = RuleSet::snapshot(engine, &others);
                // The gateway's lists the document holds are written as in force too.
                #[cfg(feature = "tower")]
                {
                    if held.gateway.rules.is_some() {
                        doc.gateway.rules = Some(engine.gateway_rules());
                    }
                    if held.gateway.api_definitions.is_some() {
                        doc.gateway.api_definitions = Some(engine.api_definitions());
                    }
                }
                doc.merge(set.clone());
                vec![(path.clone(), doc)]
            }
            Layout::Single(path, holds) => {
                if let Some(kind) = set.kinds().into_iter().find(|k| k != holds) {
                    return Err(WriteError::WrongKind { path: path.clone(), holds: *holds, kind });
                }
                #[cfg(feature = "tower")]
                if !set.gateway.is_empty() {
                    return Err(WriteError::CannotHold {
                        path: path.clone(),
                        holds: format!("{holds} rules"),
                        what: "the gateway's rules or API definitions".into(),
                    });
                }
                if set.has(*holds) {
                    vec![(path.clone(), set.clone())]
                } else {
                    Vec::new()
                }
            }
            // Written above.
            #[cfg(feature = "tower")]
            Layout::Gateway(..) => Vec::new(),
            Layout::Dir(dir) => {
                let mut out = Vec::new();
                for kind in ALL_KINDS {
                    let existing = EXTENSIONS
                        .iter()
                        .map(|ext| dir.join(format!("{}.{ext}", file_stem(kind))))
                        .find(|p| p.is_file());
                    let one = |rules: RuleSet| rules.only(kind);
                    if set.has(kind) {
                        let path = existing.unwrap_or_else(|| dir.join(format!("{}.json", file_stem(kind))));
                        out.push((path, one(set.clone())));
                    } else if let Some(path) = existing {
                        // Another kind's file: rewritten only if it would not load the rules in force.
                        let in_force = RuleSet::snapshot(engine, &[kind]);
                        if current(&path)?.as_ref() != Some(&in_force) {
                            out.push((path, in_force));
                        }
                    }
                }
                out
            }
        };
        let mut texts = Vec::with_capacity(writes.len());
        let mut counts = Vec::with_capacity(writes.len());
        let mut in_force = Vec::with_capacity(writes.len());
        for (path, doc) in writes {
            let text = self.text_of(&path, &doc)?;
            // What a restart would load must be what is meant: read the text back before writing it.
            match self.parse_file(&path, &text, format_of(&path)) {
                Ok(back) if back == doc => {}
                Ok(_) => return Err(WriteError::RoundTrip { path, error: None }),
                Err(error) => return Err(WriteError::RoundTrip { path, error: Some(error) }),
            }
            counts.push((path.clone(), doc.len()));
            // Whether the engine runs what is written (it may have reloaded another edit since the rules
            // written were loaded): only then is the text taken for what is in force.
            in_force.push(doc.is_in_force(&self.inner.engine));
            texts.push((path, text));
        }
        // The gateway's files a directory gets next count with the rest.
        #[cfg(feature = "tower")]
        if self.is_dir() {
            counts.extend(self.gateway_counts(&set.gateway));
        }
        self.check_limits(&texts, &counts, &limits)?;
        for ((path, text), in_force) in texts.iter().zip(in_force) {
            write_through(path, text).map_err(|e| WriteError::Io { path: path.clone(), source: Arc::new(e) })?;
            // What was just written is what is in force: the reload it triggers finds nothing to do. Unless the
            // engine runs something else: then that reload applies the file, as Java's re-reads a file written.
            // A source never loaded yet stays so (its next reload applies the whole file).
            if let Some(applied) = state.applied.as_mut() {
                match applied.iter_mut().find(|(p, _)| p == path) {
                    Some(_) if !in_force => applied.retain(|(p, _)| p != path),
                    Some(entry) => entry.1 = text.clone(),
                    None if !in_force => {}
                    None => applied.push((path.clone(), text.clone())),
                }
                if self.is_dir() {
                    applied.sort_by_key(|(p, _)| kind_order(p));
                    if !state.present.contains(path) {
                        state.present.push(path.clone());
                        state.present.sort_by_key(|p| kind_order(p));
                    }
                }
            }
        }
        drop(state);
        tracing::info!(path = %self.path().display(), kinds = ?set.kinds(), "rules written back");
        // A directory keeps the gateway's lists in files of their own.
        #[cfg(feature = "tower")]
        if self.is_dir() && !set.gateway.is_empty() {
            self.write_gateway_files(&set.gateway)?;
        }
        Ok(())
    }

    /// The text of `doc` for the file at `path`, in the file's format and shape.
    fn text_of(&self, path: &Path, doc: &RuleSet) -> Result<String, WriteError> {
        let format = format_of(path);
        let text = match (&self.inner.layout, kind_of_file(path)) {
            (Layout::Combined(_), _) => doc.to_string(format),
            (Layout::Single(_, kind), _) => kind_list(doc, *kind, format),
            (Layout::Dir(_), Some(kind)) => kind_list(doc, kind, format),
            (Layout::Dir(_), None) => doc.to_string(format),
            #[cfg(feature = "tower")]
            (Layout::Gateway(..), _) => doc.to_string(format),
        };
        text.map_err(|error| WriteError::Serialize { path: path.to_path_buf(), error })
    }

    /// Reloads a rules directory: every file that reads, parses and is accepted is applied; a file that does
    /// not (or that is gone) keeps its kind's rules in force and is the error returned (the first one).
    fn reload_dir(&self, dir: &Path, state: &mut State) -> Result<Reloaded, SourceError> {
        let found = dir_files(dir);
        let gone: Vec<PathBuf> = state.present.iter().filter(|p| !found.contains(p)).cloned().collect();
        state.present = found.clone();
        if found.is_empty() && gone.is_empty() {
            return Err(SourceError::Missing { path: dir.to_path_buf() });
        }
        let mut first_error = gone.into_iter().next().map(|path| SourceError::Missing { path });
        let mut good: Vec<(PathBuf, String, RuleSet)> = Vec::with_capacity(found.len());
        for path in found {
            let parsed = read(&path, &state.limits).and_then(|text| {
                let set = self.parse_dir_file(&path, &text)?;
                Ok((text, set))
            });
            match parsed {
                Ok((text, set)) => good.push((path, text, set)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let done = |first_error: Option<SourceError>, reloaded: Reloaded| match first_error {
            Some(e) => Err(e),
            None => Ok(reloaded),
        };
        let inputs: Vec<(PathBuf, String)> = good.iter().map(|(p, t, _)| (p.clone(), t.clone())).collect();
        if state.applied.as_ref() == Some(&inputs) {
            return done(first_error, Reloaded::Unchanged);
        }
        let count: usize = good.iter().map(|(_, _, set)| set.len()).sum();
        if count > state.limits.max_rules {
            return Err(SourceError::TooManyRules { path: dir.to_path_buf(), count, limit: state.limits.max_rules });
        }
        // Applied whole; a file the engine refuses is taken out (its kind's rules stay) and the rest applied.
        let kinds = loop {
            let mut set = RuleSet::default();
            for (_, _, part) in &good {
                set.merge(part.clone());
            }
            let refused = match set.apply_all(&self.inner.engine) {
                Ok(kinds) => break kinds,
                Err(super::ApplyError::Rules(error)) => {
                    let RuleError::Invalid { kind, .. } = &error;
                    let at = good.iter().position(|(p, _, _)| kind_of_file(p) == Some(*kind));
                    let path = at.map_or_else(|| dir.to_path_buf(), |i| good[i].0.clone());
                    (at, SourceError::Invalid { path, error })
                }
                #[cfg(feature = "tower")]
                Err(super::ApplyError::Gateway(e)) => {
                    let stem = match &e {
                        crate::web::gateway::GatewayRuleError::InvalidApi { .. } => super::API_DEFINITIONS_FILE_STEM,
                        _ => super::GATEWAY_RULES_FILE_STEM,
                    };
                    let path = dir.join(format!("{stem}.json"));
                    let at = good.iter().position(|(p, _, _)| *p == path);
                    (at, SourceError::Gateway { path, error: e.into() })
                }
            };
            first_error.get_or_insert(refused.1);
            match refused.0 {
                Some(at) => {
                    good.remove(at);
                }
                // Cannot happen (every kind comes from a file); nothing is applied.
                None => return done(first_error, Reloaded::Unchanged),
            }
        };
        state.applied = Some(good.into_iter().map(|(p, t, _)| (p, t)).collect());
        state.last_load_ms = Some(super::writable::now_ms());
        done(first_error, Reloaded::Applied { kinds })
    }

    /// A file of a rules directory as a set, or the error naming it.
    fn parse_dir_file(&self, path: &Path, text: &str) -> Result<RuleSet, SourceError> {
        #[cfg(feature = "tower")]
        if let Some(stem) = super::gateway::gateway_stem(path) {
            let gateway = super::GatewayDocuments::parse_file(stem, text)
                .map_err(|e| SourceError::Gateway { path: path.to_path_buf(), error: e.into() })?;
            return Ok(RuleSet { gateway, ..RuleSet::default() });
        }
        self.parse_file(path, text, format_of(path))
            .map_err(|error| SourceError::Parse { path: path.to_path_buf(), error })
    }

    fn reload_locked(&self, state: &mut State) -> Result<Reloaded, SourceError> {
        if let Layout::Dir(dir) = &self.inner.layout {
            return self.reload_dir(dir, state);
        }
        // One file (a rules directory is read above).
        let path = self.path().to_path_buf();
        let inputs = vec![(path.clone(), read(&path, &state.limits)?)];
        if state.applied.as_ref() == Some(&inputs) {
            return Ok(Reloaded::Unchanged);
        }
        let mut set = RuleSet::default();
        for (path, text) in &inputs {
            #[cfg(feature = "tower")]
            if let Some(stem) = super::gateway::gateway_stem(path).filter(|_| !self.is_single_kind()) {
                let parsed = super::GatewayDocuments::parse_file(stem, text)
                    .map_err(|e| SourceError::Gateway { path: path.clone(), error: e.into() })?;
                set.gateway.merge(parsed);
                continue;
            }
            let format = format_of(path);
            let parsed = self
                .parse_file(path, text, format)
                .map_err(|error| SourceError::Parse { path: path.clone(), error })?;
            set.merge(parsed);
        }
        let count = set.len();
        if count > state.limits.max_rules {
            return Err(SourceError::TooManyRules {
                path: self.path().to_path_buf(),
                count,
                limit: state.limits.max_rules,
            });
        }
        // The gateway's lists first (validated whole), put back if a kind is then refused.
        let kinds = set.apply_all(&self.inner.engine).map_err(|error| match error {
            super::ApplyError::Rules(error) => SourceError::Invalid { path: path.clone(), error },
            #[cfg(feature = "tower")]
            super::ApplyError::Gateway(e) => SourceError::Gateway { path: path.clone(), error: e.into() },
        })?;
        state.applied = Some(inputs);
        state.last_load_ms = Some(super::writable::now_ms());
        Ok(Reloaded::Applied { kinds })
    }

    /// Writes the gateway's lists `docs` manages back to the store (feature `tower`): in a rules directory,
    /// to `gw-flow-rules.json` and `gw-api-definitions.json` (Java's files, in Java's JSON), atomically each;
    /// in a combined document, to its `gwFlowRules` and `gwApiDefinitions` keys (with the rest of the
    /// document kept, as [`write_rules`](FileDataSource::write_rules) keeps it). A file of one kind's rules
    /// cannot hold them: an error.
    #[cfg(feature = "tower")]
    pub fn write_gateway(&self, docs: &super::GatewayDocuments) -> Result<(), super::WriteBackError> {
        match &self.inner.layout {
            Layout::Dir(_) | Layout::Gateway(..) => self.write_gateway_files(docs).map_err(super::WriteBackError::File),
            _ => self
                .write_rules(&RuleSet { gateway: docs.clone(), ..RuleSet::default() })
                .map_err(super::WriteBackError::File),
        }
    }

    /// Writes the gateway's lists `docs` manages to a rules directory's `gw-*.json` files, or to the
    /// gateway file this source is (which holds one list: the other is an error).
    #[cfg(feature = "tower")]
    fn write_gateway_files(&self, docs: &super::GatewayDocuments) -> Result<(), WriteError> {
        let targets: Vec<(&str, PathBuf)> = match &self.inner.layout {
            Layout::Dir(dir) => super::gateway::GATEWAY_FILE_STEMS
                .iter()
                .map(|stem| (*stem, dir.join(format!("{stem}.json"))))
                .collect(),
            Layout::Gateway(path, stem) => {
                if let Some(other) = super::gateway::GATEWAY_FILE_STEMS.into_iter().find(|s| s != stem)
                    && docs.file_text(other).is_some()
                {
                    return Err(WriteError::CannotHold {
                        path: path.clone(),
                        holds: super::gateway::list_name(stem).into(),
                        what: super::gateway::list_name(other).into(),
                    });
                }
                vec![(*stem, path.clone())]
            }
            _ => return Ok(()),
        };
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let texts: Vec<(PathBuf, String)> =
            targets.into_iter().filter_map(|(stem, path)| docs.file_text(stem).map(|text| (path, text))).collect();
        self.check_limits(&texts, &self.gateway_counts(docs), &state.limits)?;
        for (path, text) in texts {
            write_through(&path, &text).map_err(|e| WriteError::Io { path: path.clone(), source: Arc::new(e) })?;
            // Taken for what is in force only if the engine runs it (see `write_rules`).
            let list = super::gateway::gateway_stem(&path).map(|stem| {
                let mut one = super::GatewayDocuments::default();
                if stem == super::GATEWAY_RULES_FILE_STEM {
                    one.rules = docs.rules.clone();
                } else {
                    one.api_definitions = docs.api_definitions.clone();
                }
                RuleSet { gateway: one, ..RuleSet::default() }
            });
            let in_force = list.is_some_and(|set| set.is_in_force(&self.inner.engine));
            if let Some(applied) = state.applied.as_mut() {
                match applied.iter_mut().find(|(p, _)| *p == path) {
                    Some(_) if !in_force => applied.retain(|(p, _)| *p != path),
                    Some(entry) => entry.1 = text.clone(),
                    None if !in_force => {}
                    None => applied.push((path.clone(), text.clone())),
                }
                applied.sort_by_key(|(p, _)| kind_order(p));
            }
            if !state.present.contains(&path) {
                state.present.push(path.clone());
                state.present.sort_by_key(|p| kind_order(p));
            }
        }
        Ok(())
    }

    /// The gateway's files a write of `docs` puts (in a rules directory, or the gateway file this source
    /// is), each with the number of entries it will hold.
    #[cfg(feature = "tower")]
    fn gateway_counts(&self, docs: &super::GatewayDocuments) -> Vec<(PathBuf, usize)> {
        let file = |stem: &str| match &self.inner.layout {
            Layout::Dir(dir) => Some(dir.join(format!("{stem}.json"))),
            Layout::Gateway(path, own) if *own == stem => Some(path.clone()),
            _ => None,
        };
        let lists = [
            (super::GATEWAY_RULES_FILE_STEM, docs.rules.as_ref().map(Vec::len)),
            (super::API_DEFINITIONS_FILE_STEM, docs.api_definitions.as_ref().map(Vec::len)),
        ];
        lists.into_iter().filter_map(|(stem, n)| Some((file(stem)?, n?))).collect()
    }

    /// Refuses a write whose files the source would refuse at its next reload (see [`FileLimits`]): a file
    /// of `texts` over the bytes, or more rules than the bound once the files of `counts` (path, number of
    /// rules) are written (a directory's other files counted as they stand).
    fn check_limits(
        &self,
        texts: &[(PathBuf, String)],
        counts: &[(PathBuf, usize)],
        limits: &FileLimits,
    ) -> Result<(), WriteError> {
        let over = |error: SourceError| WriteError::OverLimit { error: Box::new(error) };
        for (path, text) in texts {
            let len = text.len() as u64;
            if len > limits.max_file_bytes {
                return Err(over(SourceError::TooLarge { path: path.clone(), len, limit: limits.max_file_bytes }));
            }
        }
        let count = match &self.inner.layout {
            Layout::Dir(dir) => self.dir_rules_after(dir, counts, limits),
            _ => counts.iter().map(|(_, n)| n).sum(),
        };
        if count > limits.max_rules {
            let path = self.path().to_path_buf();
            return Err(over(SourceError::TooManyRules { path, count, limit: limits.max_rules }));
        }
        Ok(())
    }

    /// The number of rules a reload of the directory reads once the files of `replaced` (path, number of
    /// rules) are written: theirs, and every other file it reads as it stands (one that does not parse
    /// counts none: that reload fails anyway).
    fn dir_rules_after(&self, dir: &Path, replaced: &[(PathBuf, usize)], limits: &FileLimits) -> usize {
        let read_by_reload = |p: &PathBuf| p.is_file() || replaced.iter().any(|(r, _)| r == p);
        #[allow(unused_mut)]
        let mut paths: Vec<PathBuf> = ALL_KINDS
            .into_iter()
            .filter_map(|kind| {
                EXTENSIONS.iter().map(|ext| dir.join(format!("{}.{ext}", file_stem(kind)))).find(read_by_reload)
            })
            .collect();
        #[cfg(feature = "tower")]
        paths.extend(
            super::gateway::GATEWAY_FILE_STEMS
                .map(|stem| dir.join(format!("{stem}.json")))
                .into_iter()
                .filter(read_by_reload),
        );
        paths
            .into_iter()
            .map(|p| match replaced.iter().find(|(r, _)| *r == p) {
                Some((_, n)) => *n,
                None => read(&p, limits).ok().and_then(|text| self.parse_in_dir(&p, &text)).map_or(0, |s| s.len()),
            })
            .sum()
    }

    /// A file of a rules directory as a set: a kind's file, or one of the gateway's (`None` if it does not
    /// parse).
    fn parse_in_dir(&self, path: &Path, text: &str) -> Option<RuleSet> {
        #[cfg(feature = "tower")]
        if let Some(stem) = super::gateway::gateway_stem(path) {
            let gateway = super::GatewayDocuments::parse_file(stem, text).ok()?;
            return Some(RuleSet { gateway, ..RuleSet::default() });
        }
        self.parse_file(path, text, format_of(path)).ok()
    }

    fn parse_file(&self, path: &Path, text: &str, format: Format) -> Result<RuleSet, super::ParseError> {
        let kind = match &self.inner.layout {
            Layout::Combined(_) => return RuleSet::parse(text, format),
            #[cfg(feature = "tower")]
            Layout::Gateway(_, stem) => {
                let gateway = super::GatewayDocuments::parse_file(stem, text).map_err(super::gateway::parse_error)?;
                return Ok(RuleSet { gateway, ..RuleSet::default() });
            }
            Layout::Single(_, kind) => *kind,
            Layout::Dir(_) => match kind_of_file(path) {
                Some(k) => k,
                None => return RuleSet::parse(text, format),
            },
        };
        let mut set = RuleSet::default();
        match kind {
            RuleKind::Flow => set.flow = Some(parse_rules::<FlowRule>(text, format)?),
            RuleKind::Degrade => set.degrade = Some(parse_rules::<DegradeRule>(text, format)?),
            RuleKind::System => set.system = Some(parse_rules::<SystemRule>(text, format)?),
            RuleKind::Authority => set.authority = Some(parse_rules::<AuthorityRule>(text, format)?),
            RuleKind::ParamFlow => set.param_flow = Some(parse_rules::<ParamFlowRule>(text, format)?),
            RuleKind::Adaptive => set.adaptive = Some(parse_rules::<AdaptiveRule>(text, format)?),
        }
        Ok(set)
    }
}

/// The files of a rules directory a reload reads, in order: each kind's file (the first of its extensions
/// that exists), then the gateway's.
fn dir_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for kind in ALL_KINDS {
        for ext in EXTENSIONS {
            let p = dir.join(format!("{}.{ext}", file_stem(kind)));
            if p.is_file() {
                found.push(p);
                break;
            }
        }
    }
    #[cfg(feature = "tower")]
    for stem in super::gateway::GATEWAY_FILE_STEMS {
        let p = dir.join(format!("{stem}.json"));
        if p.is_file() {
            found.push(p);
        }
    }
    found
}

/// The text of the file at `path`, refused if it is larger than the limit (checked before reading, and while
/// reading, for a file that grows meanwhile).
fn read(path: &Path, limits: &FileLimits) -> Result<String, SourceError> {
    use std::io::Read;
    let io_error = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => SourceError::Missing { path: path.to_path_buf() },
        _ => SourceError::Read { path: path.to_path_buf(), source: Arc::new(e) },
    };
    let too_large = |len: u64| SourceError::TooLarge { path: path.to_path_buf(), len, limit: limits.max_file_bytes };
    let file = std::fs::File::open(path).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    if len > limits.max_file_bytes {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limits.max_file_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(io_error)?;
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        io_error(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8: {}", e.utf8_error())))
    })
}

/// A kind's rules of `set` as one kind's list in `format`; `None` if `set` does not hold the kind.
fn kind_text(set: &RuleSet, kind: RuleKind, format: Format) -> Option<Result<String, super::SerializeError>> {
    match kind {
        RuleKind::Flow => set.flow.as_deref().map(|r| rules_to_string::<FlowRule>(r, format)),
        RuleKind::Degrade => set.degrade.as_deref().map(|r| rules_to_string::<DegradeRule>(r, format)),
        RuleKind::System => set.system.as_deref().map(|r| rules_to_string::<SystemRule>(r, format)),
        RuleKind::Authority => set.authority.as_deref().map(|r| rules_to_string::<AuthorityRule>(r, format)),
        RuleKind::ParamFlow => set.param_flow.as_deref().map(|r| rules_to_string::<ParamFlowRule>(r, format)),
        RuleKind::Adaptive => set.adaptive.as_deref().map(|r| rules_to_string::<AdaptiveRule>(r, format)),
    }
}

/// A kind's rules of `doc` as one kind's list in `format` (empty if `doc` does not hold the kind).
fn kind_list(doc: &RuleSet, kind: RuleKind, format: Format) -> Result<String, super::SerializeError> {
    kind_text(doc, kind, format).unwrap_or_else(|| rules_to_string::<FlowRule>(&[], format))
}

/// The position of a directory's rules file in the order the directory is read.
fn kind_order(path: &Path) -> usize {
    if let Some(i) = kind_of_file(path).and_then(|k| ALL_KINDS.iter().position(|x| *x == k)) {
        return i;
    }
    #[cfg(feature = "tower")]
    if let Some(stem) = super::gateway::gateway_stem(path) {
        let i = super::gateway::GATEWAY_FILE_STEMS.iter().position(|s| *s == stem).unwrap_or(0);
        return ALL_KINDS.len() + i;
    }
    usize::MAX
}

/// The chain of symbolic links starting at `path`: `path`, then each link's target in turn (a relative
/// target read from the link's own directory), the last being no link (or missing). A chain longer than 40
/// links (the kernel's own limit), a loop included, is an error.
pub(crate) fn link_chain(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut chain = vec![path.to_path_buf()];
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
                chain.push(p.clone());
            }
            _ => return Ok(chain),
        }
    }
    Err(std::io::Error::other(format!("{}: too many levels of symbolic links", path.display())))
}

/// Replaces the file at `path` (the final target, when `path` is a symbolic link: the link stays) with `text`
/// atomically: a temporary file in the target's directory (so the rename does not cross file systems), synced
/// to disk, given the old file's permissions (a new file: 0666 less the umask), renamed over the target; then the directory is synced so the
/// rename itself survives a crash.
fn write_through(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let path = &link_chain(path)?.pop().unwrap_or_else(|| path.to_path_buf());
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    let existing = std::fs::metadata(path).ok().map(|m| m.permissions());
    // Created with the existing file's mode (never more open, even for a moment), or for a new rules file the
    // mode any new file gets (0666 less the umask, as Java's `FileOutputStream` creates it), not the
    // temporary file's own 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(existing.clone().unwrap_or_else(|| std::fs::Permissions::from_mode(0o666)));
    }
    let mut tmp = builder.tempfile_in(&dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    // Exactly the existing file's mode (the umask may have narrowed it at creation).
    if let Some(permissions) = existing {
        tmp.as_file().set_permissions(permissions)?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all(); // not every platform syncs directories; the rename is done either way
    }
    Ok(())
}
