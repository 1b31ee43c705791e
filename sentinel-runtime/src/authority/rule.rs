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
    /// The resource.
    pub resource: String,
    /// Comma-separated origins, matched exactly.
    pub limit_app: String,
    /// White or black list.
    pub strategy: AuthorityStrategy,
}

impl AuthorityRule {
    /// A rule for `resource` over the comma-separated `origins`.
    pub fn new(resource: impl Into<String>, origins: impl Into<String>, strategy: AuthorityStrategy) -> Self {
        AuthorityRule { id: None, resource: resource.into(), limit_app: origins.into(), strategy }
    }
}
