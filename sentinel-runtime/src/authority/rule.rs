//! Authority rule data.

/// White or black list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AuthorityStrategy {
    /// Only the listed origins pass.
    #[default]
    White,
    /// The listed origins are blocked.
    Black,
}

/// An authority rule: which callers (origins) may use a resource.
///
/// ```
/// use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
/// let rule = AuthorityRule::new("queryOrder", "appA,appB", AuthorityStrategy::White);
/// assert_eq!(rule.limit_app, "appA,appB");
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuthorityRule {
    /// An id of the rule's source.
    pub id: Option<u64>,
    /// The resource, or a pattern when `regex` is set.
    pub resource: String,
    /// Whether `resource` is a regular expression (Java's `regex`): the rule applies to every resource whose
    /// whole name matches it.
    pub regex: bool,
    /// Comma-separated origins, matched exactly.
    pub limit_app: String,
    /// White or black list.
    pub strategy: AuthorityStrategy,
}

impl AuthorityRule {
    /// A rule for `resource` over the comma-separated `origins`.
    pub fn new(resource: impl Into<String>, origins: impl Into<String>, strategy: AuthorityStrategy) -> Self {
        AuthorityRule { id: None, resource: resource.into(), regex: false, limit_app: origins.into(), strategy }
    }
    /// Reads `resource` as a regular expression over whole resource names (see [`crate::pattern`]).
    pub fn regex(mut self, regex: bool) -> Self {
        self.regex = regex;
        self
    }
    /// Sets the rule id.
    pub fn id(mut self, id: u64) -> Self {
        self.id = Some(id);
        self
    }
}
