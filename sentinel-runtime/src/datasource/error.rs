//! Errors of the rule formats and of the file data source.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::Format;
use crate::RuleError;

/// A document could not be read as rules: where, which field, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The format being read.
    pub format: Format,
    /// 1-based line of the problem, when the parser knows it.
    pub line: Option<usize>,
    /// 1-based column of the problem, when the parser knows it.
    pub column: Option<usize>,
    /// Path of the field, e.g. `[0].grade` or `flowRules[2].clusterConfig.flowId`.
    pub field: Option<String>,
    /// What was wrong.
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(
        format: Format,
        line: Option<usize>,
        column: Option<usize>,
        field: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        ParseError { format, line, column, field, message: message.into() }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error", self.format)?;
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, " at line {l}, column {c}")?,
            (Some(l), None) => write!(f, " at line {l}")?,
            _ => {}
        }
        if let Some(field) = &self.field {
            write!(f, " in field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ParseError {}

/// Rules could not be written in a format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("could not write rules as {format}: {message}")]
pub struct SerializeError {
    /// The format.
    pub format: Format,
    /// Why.
    pub message: String,
}

impl SerializeError {
    pub(crate) fn new(format: Format, message: String) -> Self {
        SerializeError { format, message }
    }
}

/// A rule set was refused by the engine ([`RuleSet::apply_all`](super::RuleSet::apply_all)); the engine's
/// rules are as they were.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// A rule of one kind is invalid.
    #[error(transparent)]
    Rules(#[from] RuleError),
    /// A gateway flow rule or API definition is invalid (feature `tower`).
    #[cfg(feature = "tower")]
    #[error(transparent)]
    Gateway(#[from] crate::web::gateway::GatewayRuleError),
}

/// A rules file could not be applied; the rules in force stay.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The file (or every rules file of the directory) is gone.
    #[error("rules file {} is missing (deleted or moved); the rules in force stay", path.display())]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("could not read rules file {}: {source}; the rules in force stay", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Syntax error, wrong type, unknown field or bad code.
    #[error("rules file {}: {error}; the rules in force stay", path.display())]
    Parse {
        /// The path.
        path: PathBuf,
        /// Where and why.
        #[source]
        error: ParseError,
    },
    /// A gateway rules or API definitions file (`gw-flow-rules.json`, `gw-api-definitions.json`) is not
    /// Java's JSON, or holds an invalid entry (feature `tower`).
    #[cfg(feature = "tower")]
    #[error("rules file {}: {error}; the rules in force stay", path.display())]
    Gateway {
        /// The path.
        path: PathBuf,
        /// Where and why.
        #[source]
        error: super::gateway::GatewayDocumentError,
    },
    /// A rule is invalid (the engine rejected the set).
    #[error("rules file {}: {error}", path.display())]
    Invalid {
        /// The path.
        path: PathBuf,
        /// The rule, by its position in the file, and the field.
        #[source]
        error: RuleError,
    },
    /// The file is larger than [`FileLimits::max_file_bytes`](super::FileLimits::max_file_bytes).
    #[error("rules file {} is {len} bytes, over the limit of {limit} bytes; the rules in force stay", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// Its size (at least this much).
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// The file(s) hold more rules than [`FileLimits::max_rules`](super::FileLimits::max_rules).
    #[error("rules file {} holds {count} rules, over the limit of {limit}; the rules in force stay", path.display())]
    TooManyRules {
        /// The path (the directory, for a directory of rules files).
        path: PathBuf,
        /// How many rules it holds.
        count: usize,
        /// The limit.
        limit: usize,
    },
}

impl SourceError {
    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            SourceError::Missing { path }
            | SourceError::Read { path, .. }
            | SourceError::Parse { path, .. }
            | SourceError::Invalid { path, .. }
            | SourceError::TooLarge { path, .. }
            | SourceError::TooManyRules { path, .. } => path,
            #[cfg(feature = "tower")]
            SourceError::Gateway { path, .. } => path,
        }
    }
}

/// Rules could not be written back to a rules file; the file is as it was (the write is atomic).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The file holds one list and was asked to write another: the gateway's rules or API definitions to a
    /// file of one rule kind, a rule kind or the other gateway list to a gateway file (feature `tower`). A
    /// rules directory or a combined document holds them all.
    #[cfg(feature = "tower")]
    #[error("rules file {} holds only {holds} and cannot store {what}", path.display())]
    CannotHold {
        /// The file.
        path: PathBuf,
        /// What it holds.
        holds: String,
        /// What was to be written.
        what: String,
    },
    /// The source is a file of one kind and was asked to write another.
    #[error("rules file {} holds only {holds} rules and cannot store {kind} rules", path.display())]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// The kind the file holds.
        holds: crate::RuleKind,
        /// The kind that was to be written.
        kind: crate::RuleKind,
    },
    /// The file's current content is not a valid rules document, so its other kinds cannot be kept: it is
    /// left untouched (fix or remove it, then push again).
    #[error("rules file {} is not valid ({error}); it was left untouched", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why it does not parse.
        #[source]
        error: ParseError,
    },
    /// The file's current content could not be read (so its other kinds could not be checked): it was left
    /// untouched.
    #[error("rules file {} could not be read ({error}); it was left untouched", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: Box<SourceError>,
    },
    /// The text to be written would not load as the rules meant (a rule the format cannot carry): nothing
    /// was written.
    #[error("rules file {}: the rules would not load back as they are in force{}; it was left untouched",
        path.display(), error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    RoundTrip {
        /// The file.
        path: PathBuf,
        /// The error reading it back, if it did not parse.
        error: Option<ParseError>,
    },
    /// The rules could not be written in the file's format.
    #[error("rules file {}: {error}", path.display())]
    Serialize {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: SerializeError,
    },
    /// What would be written is over the source's bounds ([`FileLimits`](super::FileLimits)): the source
    /// would refuse it at its next reload (a restart would not load it), so nothing was written. The error
    /// is the one that reload would give ([`SourceError::TooLarge`] or [`SourceError::TooManyRules`]).
    #[error("nothing was written: the next reload would refuse it ({error})")]
    OverLimit {
        /// What the reload would report.
        #[source]
        error: Box<SourceError>,
    },
    /// The temporary file could not be written, synced or renamed over the file.
    #[error("could not write rules file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
}
