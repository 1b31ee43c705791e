//! Engine configuration from environment variables.
//!
//! | variable | field | Java's property |
//! |----------|-------|-----------------|
//! | `SENTINEL_APP_NAME` | [`Config::app_name`] | `csp.sentinel.app.name` / `project.name` |
//! | `SENTINEL_LOG_DIR` | [`Config::log_dir`] | `csp.sentinel.log.dir` |
//! | `SENTINEL_METRIC_FLUSH_INTERVAL_MS` | [`Config::metric_flush_interval_ms`] | `csp.sentinel.metric.flush.interval` (s) |
//! | `SENTINEL_METRIC_LOG_FILE_SIZE` | [`Config::metric_log_file_size`] (bytes) | `csp.sentinel.metric.file.single.size` |
//! | `SENTINEL_METRIC_LOG_FILE_COUNT` | [`Config::metric_log_file_count`] | `csp.sentinel.metric.file.total.count` |
//! | `SENTINEL_MAX_CONTEXTS` | [`Config::max_contexts`] | |
//! | `SENTINEL_MAX_RESOURCES` | [`Config::max_resources`] | |
//! | `SENTINEL_MAX_ORIGINS` | [`Config::max_origins`] | |
//! | `SENTINEL_MAX_ORIGINS_PER_RESOURCE` | [`Config::max_origins_per_resource`] | |
//! | `SENTINEL_CLOCK` | [`Config::clock`]: `system` (the default: the precise clock), `precise`, `cached` (ms, a ticker thread), `manual` (now) or `manual:<epoch ms>` | |
//!
//! Unset or empty variables keep the defaults; a value that does not parse is an error naming the variable.
//!
//! ```
//! use sentinel_runtime::Config;
//! let config = Config::from_vars([("SENTINEL_APP_NAME", "orders"), ("SENTINEL_MAX_RESOURCES", "100")]).unwrap();
//! assert_eq!(config.app_name, "orders");
//! assert_eq!(config.max_resources, 100);
//! assert!(Config::from_vars([("SENTINEL_MAX_RESOURCES", "many")]).is_err());
//! ```

use std::path::PathBuf;
use std::str::FromStr;

/// Default cap on contexts (Java's `MAX_CONTEXT_NAME_SIZE`).
pub const DEFAULT_MAX_CONTEXTS: usize = 2000;
/// Default cap on resources (Java's `MAX_SLOT_CHAIN_SIZE`).
pub const DEFAULT_MAX_RESOURCES: usize = 6000;
/// Default cap on the distinct caller origins an engine tracks; origins named by rules are always tracked and
/// not counted. Calls from further origins run as [`UNTRACKED_ORIGIN`].
pub const DEFAULT_MAX_ORIGINS: usize = 4096;
/// Default cap on the origin nodes of one resource; origins named by the resource's flow rules always get
/// their own node and are not counted. Further origins share the resource's [`UNTRACKED_ORIGIN`] node.
pub const DEFAULT_MAX_ORIGINS_PER_RESOURCE: usize = 256;
pub use crate::names::UNTRACKED_ORIGIN;
/// The id of [`UNTRACKED_ORIGIN`].
pub(crate) const UNTRACKED_ORIGIN_ID: u32 = u32::MAX;
/// The resource that new names share once [`Config::max_resources`] is reached, when no rule names them: a
/// resource like any other (checked by system rules and by any rule written for this name), so a name past
/// the cap is never left unchecked. Names that a rule names (exactly, by a matching regex rule, or as the
/// related resource of a relate rule) always get their own resource, cap or not.
pub const RESOURCE_OVERFLOW: &str = "sentinel_resource_overflow";
pub use crate::names::RESOURCE_PATTERNS_OVERFLOW;
/// The context that new context names share once [`Config::max_contexts`] is reached, when no chain rule
/// names them: its entries are checked like any other (Java passes them unchecked). Contexts that a chain rule
/// names always get their own, cap or not.
pub const CONTEXT_OVERFLOW: &str = "sentinel_context_overflow";

/// Engine settings. Build it from [`Config::default`] (or the environment) and set fields: new fields may be
/// added in later versions.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The application's name (shown by the dashboard and logs).
    pub app_name: String,
    /// Most named contexts that no chain rule names (the default context aside, as Java's `MAX_CONTEXT_NAME_SIZE`); past it entries in new contexts run in [`CONTEXT_OVERFLOW`]
    /// (checked like any other), and contexts a chain rule names are still created.
    pub max_contexts: usize,
    /// Most resources that no rule names (the resources of annotated functions, bounded by the program, are
    /// not counted); past it a new name that no rule names gets a handle on [`RESOURCE_OVERFLOW`], which
    /// system rules and any rule on that name check, and a name that a rule names (exactly, or as a relate
    /// rule's `ref_resource`) still gets its own resource. Names that only regex rules match (which clients
    /// may choose) are capped apart at the same number: past it, new ones matching the same patterns share
    /// the resource of the first of them, which those rules check (together). Those shared resources, one
    /// per combination of patterns that names past the cap match, are bounded at the same number again:
    /// past that, names matching a combination that has none share [`RESOURCE_PATTERNS_OVERFLOW`], which
    /// every regex rule checks. Each resource costs the memory of its node statistics (see the README).
    /// [`Sentinel::caps`](crate::Sentinel::caps) shows where the engine stands.
    pub max_resources: usize,
    /// Most distinct caller origins tracked (origins named by rules excepted); past it calls from new
    /// origins run as [`UNTRACKED_ORIGIN`]. Each tracked origin costs about 100 bytes in the engine.
    pub max_origins: usize,
    /// Most origin nodes per resource (origins named by the resource's flow rules excepted); past it further
    /// origins share the resource's [`UNTRACKED_ORIGIN`] node. Each origin node costs the memory of a node's
    /// statistics (see the README).
    pub max_origins_per_resource: usize,
    /// Directory of the metric and block logs (default `~/logs/csp`, as Java's).
    pub log_dir: std::path::PathBuf,
    /// How often the metric log writer runs, in ms (default 1000).
    pub metric_flush_interval_ms: u64,
    /// Size at which a metric log file rolls over, in bytes (default 50 MiB, as Java's).
    pub metric_log_file_size: u64,
    /// Most metric log files kept (default 6, as Java's).
    pub metric_log_file_count: usize,
    /// The clock of an engine built without an explicit one.
    pub clock: ClockKind,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            app_name: "sentinel-rs-app".to_string(),
            max_contexts: DEFAULT_MAX_CONTEXTS,
            max_resources: DEFAULT_MAX_RESOURCES,
            max_origins: DEFAULT_MAX_ORIGINS,
            max_origins_per_resource: DEFAULT_MAX_ORIGINS_PER_RESOURCE,
            log_dir: default_log_dir(),
            metric_flush_interval_ms: DEFAULT_METRIC_FLUSH_INTERVAL_MS,
            metric_log_file_size: DEFAULT_METRIC_LOG_FILE_SIZE,
            metric_log_file_count: DEFAULT_METRIC_LOG_FILE_COUNT,
            clock: ClockKind::System,
        }
    }
}

/// Java's default metric flush interval.
pub const DEFAULT_METRIC_FLUSH_INTERVAL_MS: u64 = 1000;
/// Java's default metric log file size (50 MiB).
pub const DEFAULT_METRIC_LOG_FILE_SIZE: u64 = 50 * 1024 * 1024;
/// Java's default number of metric log files kept.
pub const DEFAULT_METRIC_LOG_FILE_COUNT: usize = 6;

/// Which clock an engine uses when the builder is given none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockKind {
    /// The default system clock: today the precise one ([`ClockKind::Precise`]).
    #[default]
    System,
    /// The system clock read on every call (the CPU's time-stamp counter, about 10 ns per read; response times
    /// to the microsecond; no thread).
    Precise,
    /// The system clock cached at millisecond resolution by a ticker thread that wakes 1,000 times a second
    /// (Java's `TimeUtil`): a read is one load, but the ticker costs CPU even when the process is idle and
    /// preempts the workers of a process on few CPUs (see [`SystemClock::cached`](crate::clock::SystemClock::cached)).
    Cached,
    /// A manual clock starting at `start_ms` (ms since the epoch); advance it through
    /// [`Sentinel::manual_clock`](crate::Sentinel::manual_clock).
    Manual {
        /// The start time.
        start_ms: u64,
    },
}

/// A configuration variable has a value that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {variable}={value:?} is invalid: {reason}")]
pub struct ConfigError {
    /// The variable.
    pub variable: String,
    /// Its value.
    pub value: String,
    /// What was expected.
    pub reason: String,
}

/// Java's default log directory: `~/logs/csp`.
pub fn default_log_dir() -> PathBuf {
    match std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE")) {
        Some(home) if !home.is_empty() => PathBuf::from(home).join("logs").join("csp"),
        _ => std::env::temp_dir().join("logs").join("csp"),
    }
}

fn parse<T: FromStr>(variable: &str, value: &str, what: &str) -> Result<T, ConfigError> {
    value.trim().parse().map_err(|_| ConfigError {
        variable: variable.to_string(),
        value: value.to_string(),
        reason: format!("expected {what}"),
    })
}

fn positive<T: FromStr + PartialOrd + Default>(variable: &str, value: &str) -> Result<T, ConfigError> {
    let v: T = parse(variable, value, "a positive integer")?;
    if v <= T::default() {
        return Err(ConfigError {
            variable: variable.to_string(),
            value: value.to_string(),
            reason: "expected a positive integer".into(),
        });
    }
    Ok(v)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Config {
    /// The defaults, overridden by the `SENTINEL_*` environment variables (see [the module](crate::config)).
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(std::env::vars())
    }

    /// The defaults, overridden by the given `SENTINEL_*` variables (testable without touching the process
    /// environment). Other variables are ignored.
    pub fn from_vars<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            if v.trim().is_empty() {
                continue;
            }
            match k {
                "SENTINEL_APP_NAME" => c.app_name = v.trim().to_string(),
                "SENTINEL_LOG_DIR" => c.log_dir = PathBuf::from(v),
                "SENTINEL_METRIC_FLUSH_INTERVAL_MS" => c.metric_flush_interval_ms = positive(k, v)?,
                "SENTINEL_METRIC_LOG_FILE_SIZE" => c.metric_log_file_size = positive(k, v)?,
                "SENTINEL_METRIC_LOG_FILE_COUNT" => c.metric_log_file_count = positive(k, v)?,
                "SENTINEL_MAX_CONTEXTS" => c.max_contexts = positive(k, v)?,
                "SENTINEL_MAX_RESOURCES" => c.max_resources = positive(k, v)?,
                "SENTINEL_MAX_ORIGINS" => c.max_origins = positive(k, v)?,
                "SENTINEL_MAX_ORIGINS_PER_RESOURCE" => c.max_origins_per_resource = positive(k, v)?,
                "SENTINEL_CLOCK" => {
                    let v2 = v.trim().to_ascii_lowercase();
                    c.clock = match v2.as_str() {
                        "system" => ClockKind::System,
                        "precise" => ClockKind::Precise,
                        "cached" => ClockKind::Cached,
                        "manual" => ClockKind::Manual { start_ms: now_ms() },
                        other => match other.strip_prefix("manual:") {
                            Some(ms) => ClockKind::Manual { start_ms: parse(k, ms, "`manual:<epoch ms>`")? },
                            None => {
                                return Err(ConfigError {
                                    variable: k.to_string(),
                                    value: v.to_string(),
                                    reason: "expected `system`, `precise`, `cached`, `manual` or `manual:<epoch ms>`"
                                        .into(),
                                })
                            }
                        },
                    }
                }
                _ => {}
            }
        }
        Ok(c)
    }
}

/// Where an engine stands against its caps on names ([`Sentinel::caps`](crate::Sentinel::caps)). Names that rules name (and the
/// resources of annotated functions) are not counted and always get their own resource or context; past a
/// cap, other new names share [`RESOURCE_OVERFLOW`],
/// [`CONTEXT_OVERFLOW`] or [`UNTRACKED_ORIGIN`], which are
/// checked like any other: no cap switches a rule off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caps {
    /// Resources counted against [`max_resources`](crate::Config::max_resources).
    pub resources: usize,
    /// The cap on resources.
    pub max_resources: usize,
    /// Handles on new names given the overflow resource since the engine started (or, for names that only
    /// regex rules match, a resource shared past their cap).
    pub resources_overflowed: u64,
    /// Resources of names that only regex rules match, counted against a cap of their own of the same size
    /// ([`max_resources`](crate::Config::max_resources)).
    pub matched_resources: usize,
    /// Past that cap, the resources that names matching the same patterns share, one per combination of
    /// patterns, at most [`max_resources`](crate::Config::max_resources) at a time; past that bound, such names
    /// share [`RESOURCE_PATTERNS_OVERFLOW`].
    pub shared_by_patterns: usize,
    /// Contexts counted against [`max_contexts`](crate::Config::max_contexts): the named contexts that no chain
    /// rule names (the default context is not counted, as in Java).
    pub contexts: usize,
    /// The cap on contexts.
    pub max_contexts: usize,
    /// Entries in new contexts sent to the overflow context since the engine started.
    pub contexts_overflowed: u64,
    /// Caller origins counted against [`max_origins`](crate::Config::max_origins).
    pub origins: usize,
    /// The cap on origins.
    pub max_origins: usize,
}

impl Caps {
    /// Whether new resource names that no rule names now share the overflow resource.
    pub fn resource_cap_reached(&self) -> bool {
        self.resources >= self.max_resources
    }
    /// Whether new names that only regex rules match now share a resource with the names matching the same
    /// patterns.
    pub fn matched_cap_reached(&self) -> bool {
        self.matched_resources >= self.max_resources
    }
    /// Whether new combinations of patterns now share [`RESOURCE_PATTERNS_OVERFLOW`].
    pub fn patterns_bound_reached(&self) -> bool {
        self.shared_by_patterns >= self.max_resources
    }
    /// Whether new contexts that no chain rule names now run in the overflow context.
    pub fn context_cap_reached(&self) -> bool {
        self.contexts >= self.max_contexts
    }
}

impl std::fmt::Display for Caps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reached = |r: bool| if r { " (reached)" } else { "" };
        write!(
            f,
            "resources {}/{}{}, {} handles on `{}` or shared; names regex rules match {}/{}{}, shared by \
             patterns {}/{}{}; contexts {}/{}{}, {} entries in `{}`; origins {}/{}",
            self.resources,
            self.max_resources,
            reached(self.resource_cap_reached()),
            self.resources_overflowed,
            RESOURCE_OVERFLOW,
            self.matched_resources,
            self.max_resources,
            reached(self.matched_cap_reached()),
            self.shared_by_patterns,
            self.max_resources,
            reached(self.patterns_bound_reached()),
            self.contexts,
            self.max_contexts,
            reached(self.context_cap_reached()),
            self.contexts_overflowed,
            CONTEXT_OVERFLOW,
            self.origins,
            self.max_origins
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sentinel;

    #[test]
    fn variables_override_the_defaults() {
        let c = Config::from_vars([
            ("SENTINEL_APP_NAME", " orders "),
            ("SENTINEL_LOG_DIR", "/var/log/sentinel"),
            ("SENTINEL_METRIC_FLUSH_INTERVAL_MS", "250"),
            ("SENTINEL_METRIC_LOG_FILE_SIZE", "1048576"),
            ("SENTINEL_METRIC_LOG_FILE_COUNT", "3"),
            ("SENTINEL_MAX_CONTEXTS", "10"),
            ("SENTINEL_MAX_ORIGINS", "30"),
            ("SENTINEL_MAX_ORIGINS_PER_RESOURCE", "40"),
            ("SENTINEL_MAX_RESOURCES", "20"),
            ("SENTINEL_CLOCK", "manual:1700000000000"),
            ("PATH", "/usr/bin"),
        ])
        .unwrap();
        assert_eq!(c.app_name, "orders");
        assert_eq!(c.log_dir, PathBuf::from("/var/log/sentinel"));
        assert_eq!(c.metric_flush_interval_ms, 250);
        assert_eq!(c.metric_log_file_size, 1 << 20);
        assert_eq!(c.metric_log_file_count, 3);
        assert_eq!((c.max_contexts, c.max_resources), (10, 20));
        assert_eq!((c.max_origins, c.max_origins_per_resource), (30, 40));
        assert_eq!(c.clock, ClockKind::Manual { start_ms: 1_700_000_000_000 });
        let engine = Sentinel::builder().config(c).build();
        assert_eq!(engine.now_millis(), 1_700_000_000_000);
        engine.manual_clock().unwrap().advance_millis(5);
        assert_eq!(engine.now_millis(), 1_700_000_000_005);
    }

    #[test]
    fn empty_variables_keep_defaults_and_bad_ones_are_named() {
        let c = Config::from_vars([("SENTINEL_APP_NAME", ""), ("SENTINEL_CLOCK", "system")]).unwrap();
        assert_eq!(c.app_name, Config::default().app_name);
        assert_eq!(c.clock, ClockKind::System);
        assert_eq!(Config::default().clock, ClockKind::System);
        let e = Config::from_vars([("SENTINEL_METRIC_LOG_FILE_COUNT", "0")]).unwrap_err();
        assert_eq!(e.variable, "SENTINEL_METRIC_LOG_FILE_COUNT");
        let e = Config::from_vars([("SENTINEL_CLOCK", "sundial")]).unwrap_err();
        assert!(e.to_string().contains("SENTINEL_CLOCK"), "{e}");
        assert!(Sentinel::builder().build().manual_clock().is_none());
    }

    #[test]
    fn the_precise_clock_can_be_chosen() {
        let c = Config::from_vars([("SENTINEL_CLOCK", "Precise")]).unwrap();
        assert_eq!(c.clock, ClockKind::Precise);
        let engine = Sentinel::builder().config(c).build();
        assert!(engine.manual_clock().is_none());
        assert!(engine.now_millis() > 1_600_000_000_000, "anchored to the wall clock");
    }

    /// Whether `engine` reads the cached clock (`None`: not a system clock).
    fn reads_cached(engine: &Sentinel) -> Option<bool> {
        match &engine.shared.clock {
            crate::clock::EngineClock::System(c) => Some(c.is_cached()),
            _ => None,
        }
    }

    #[test]
    fn engines_run_on_the_precise_clock_unless_told_otherwise() {
        assert_eq!(reads_cached(&Sentinel::builder().build()), Some(false));
        for (v, cached) in [("system", false), ("precise", false), (" Cached ", true)] {
            let c = Config::from_vars([("SENTINEL_CLOCK", v)]).unwrap();
            let engine = Sentinel::builder().config(c).build();
            assert_eq!(reads_cached(&engine), Some(cached), "{v}");
            assert!(engine.now_millis() > 1_600_000_000_000, "{v}: anchored to the wall clock");
        }
        assert_eq!(reads_cached(&Sentinel::builder().cached_clock().build()), Some(true));
        assert_eq!(reads_cached(&Sentinel::builder().precise_clock().build()), Some(false));
    }
}
