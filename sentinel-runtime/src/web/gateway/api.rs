//! API definitions (Java's `ApiDefinition`): named groups of paths, each group a resource of its own.

use std::collections::HashMap;
use std::sync::Arc;

use regex::Regex;

use super::ant::AntPattern;
use super::compile_regex;
use super::error::GatewayRuleError;
use super::rule::UrlMatchStrategy;

/// One path predicate of an API definition (Java's `ApiPathPredicateItem`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ApiPredicateItem {
    /// The path, Ant-style pattern or regular expression.
    pub pattern: String,
    /// How `pattern` is matched against the request path.
    pub match_strategy: UrlMatchStrategy,
}

impl ApiPredicateItem {
    /// The path `pattern`, matched exactly.
    pub fn exact(pattern: impl Into<String>) -> Self {
        ApiPredicateItem { pattern: pattern.into(), match_strategy: UrlMatchStrategy::Exact }
    }
    /// An Ant-style pattern (`/product/**`): Java's "prefix" strategy.
    pub fn prefix(pattern: impl Into<String>) -> Self {
        ApiPredicateItem { pattern: pattern.into(), match_strategy: UrlMatchStrategy::Prefix }
    }
    /// A regular expression the whole path must match.
    pub fn regex(pattern: impl Into<String>) -> Self {
        ApiPredicateItem { pattern: pattern.into(), match_strategy: UrlMatchStrategy::Regex }
    }
}

/// A named group of paths (Java's `ApiDefinition`): a request whose path matches any of its items also
/// enters the resource named `api_name` (gateway rules with
/// [`ResourceMode::CustomApiName`](super::ResourceMode::CustomApiName) name it).
///
/// Paths are the request's raw path (percent-encoded as sent, without the query; under a nested axum
/// router, the whole path the client sent, nesting prefix included), compared case-sensitively. A prefix item whose pattern has no wildcard (`/product/`) never matches, as in Spring
/// Cloud Gateway: write `/product/**`.
///
/// ```
/// use sentinel_runtime::web::gateway::{ApiDefinition, ApiPredicateItem, ApiMatcher};
/// let apis = ApiMatcher::new(&[ApiDefinition::new("products")
///     .item(ApiPredicateItem::prefix("/product/**"))
///     .item(ApiPredicateItem::regex(r"/item/\d+"))])
/// .unwrap();
/// assert_eq!(apis.matching("/product/7/reviews").collect::<Vec<_>>(), ["products"]);
/// assert_eq!(apis.matching("/item/12").count(), 1);
/// assert_eq!(apis.matching("/item/twelve").count(), 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ApiDefinition {
    /// The API's name: the resource its requests enter.
    pub api_name: String,
    /// The paths that belong to the API.
    pub predicate_items: Vec<ApiPredicateItem>,
}

impl ApiDefinition {
    /// An API named `api_name` with no paths yet.
    pub fn new(api_name: impl Into<String>) -> Self {
        ApiDefinition { api_name: api_name.into(), predicate_items: Vec::new() }
    }
    /// Adds a path predicate.
    pub fn item(mut self, item: ApiPredicateItem) -> Self {
        self.predicate_items.push(item);
        self
    }
}

/// One compiled path predicate.
#[derive(Clone, Debug)]
enum PathMatcher {
    Exact(Box<str>),
    Ant(AntPattern),
    Regex(Regex),
}

impl PathMatcher {
    fn matches(&self, path: &str) -> bool {
        match self {
            PathMatcher::Exact(p) => **p == *path,
            PathMatcher::Ant(a) => a.matches(path),
            PathMatcher::Regex(r) => r.is_match(path),
        }
    }
}

/// A validated, compiled set of API definitions: which APIs a request path belongs to.
#[derive(Clone, Debug, Default)]
pub struct ApiMatcher {
    apis: Vec<(Arc<str>, Vec<PathMatcher>)>,
}

/// Checks and compiles one definition.
fn compile(def: &ApiDefinition, index: usize) -> Result<Vec<PathMatcher>, GatewayRuleError> {
    let bad = |field, reason: String| GatewayRuleError::api(index, &def.api_name, field, reason);
    if def.api_name.trim().is_empty() {
        return Err(bad("api_name", "must not be blank".into()));
    }
    def.predicate_items
        .iter()
        .map(|item| {
            if item.pattern.trim().is_empty() {
                return Err(bad("predicate_items.pattern", "must not be blank".into()));
            }
            Ok(match item.match_strategy {
                UrlMatchStrategy::Exact => PathMatcher::Exact(item.pattern.as_str().into()),
                UrlMatchStrategy::Prefix => PathMatcher::Ant(
                    AntPattern::compile(&item.pattern)
                        .map_err(|reason| bad("predicate_items.pattern", format!("`{}` {reason}", item.pattern)))?,
                ),
                UrlMatchStrategy::Regex => PathMatcher::Regex(
                    compile_regex(&item.pattern)
                        .map_err(|reason| bad("predicate_items.pattern", format!("`{}` {reason}", item.pattern)))?,
                ),
            })
        })
        .collect()
}

impl ApiMatcher {
    /// Validates and compiles `definitions`: names must be non-blank and distinct, patterns non-blank and
    /// valid, and their regular expressions may hold 16 MiB compiled in all. The first invalid definition
    /// rejects the set.
    pub fn new(definitions: &[ApiDefinition]) -> Result<Self, GatewayRuleError> {
        super::within_regex_budget(|| Self::compile_set(definitions))
    }

    /// [`new`](Self::new), within the set's budget for regular expressions.
    fn compile_set(definitions: &[ApiDefinition]) -> Result<Self, GatewayRuleError> {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut apis = Vec::with_capacity(definitions.len());
        for (index, def) in definitions.iter().enumerate() {
            let matchers = compile(def, index)?;
            if let Some(first) = seen.insert(def.api_name.as_str(), index) {
                return Err(GatewayRuleError::api(
                    index,
                    &def.api_name,
                    "api_name",
                    format!("is already the name of definition #{first}; merge their predicate items"),
                ));
            }
            apis.push((Arc::from(def.api_name.as_str()), matchers));
        }
        Ok(ApiMatcher { apis })
    }

    /// The names of the APIs `path` belongs to, in definition order (a path may belong to several).
    pub fn matching<'s>(&'s self, path: &'s str) -> impl Iterator<Item = &'s str> + 's {
        self.matching_at(path).map(|(_, name)| name)
    }

    /// [`matching`](Self::matching), each API with its place in definition order.
    pub(crate) fn matching_at<'s>(&'s self, path: &'s str) -> impl Iterator<Item = (usize, &'s str)> + 's {
        let apis = self.apis.iter().enumerate();
        apis.filter(move |(_, (_, ms))| ms.iter().any(|m| m.matches(path))).map(|(i, (name, _))| (i, &**name))
    }

    /// How many APIs are defined.
    pub(crate) fn len(&self) -> usize {
        self.apis.len()
    }

    /// Whether no API is defined.
    pub fn is_empty(&self) -> bool {
        self.apis.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(item: ApiPredicateItem) -> ApiMatcher {
        ApiMatcher::new(&[ApiDefinition::new("api").item(item)]).unwrap()
    }

    #[test]
    fn exact_items_match_the_whole_path_case_sensitively() {
        let m = one(ApiPredicateItem::exact("/product/baz"));
        assert_eq!(m.matching("/product/baz").count(), 1);
        for other in ["/product/baz/", "/product/ba", "/Product/baz", "/product/baz/x"] {
            assert_eq!(m.matching(other).count(), 0, "{other}");
        }
    }

    #[test]
    fn regex_items_match_the_whole_path() {
        let m = one(ApiPredicateItem::regex(r"/item/\d+"));
        assert_eq!(m.matching("/item/12").count(), 1);
        assert_eq!(m.matching("/x/item/12").count(), 0, "anchored at the start");
        assert_eq!(m.matching("/item/12/x").count(), 0, "anchored at the end");
    }

    #[test]
    fn prefix_items_are_ant_patterns_and_a_plain_prefix_never_matches() {
        let m = one(ApiPredicateItem::prefix("/product/**"));
        assert_eq!(m.matching("/product").count(), 1);
        assert_eq!(m.matching("/product/a/b").count(), 1);
        let plain = one(ApiPredicateItem::prefix("/product/"));
        assert_eq!(plain.matching("/product/a").count(), 0);
        assert_eq!(plain.matching("/product/").count(), 0);
    }

    #[test]
    fn a_path_enters_every_api_it_belongs_to_in_definition_order() {
        let m = ApiMatcher::new(&[
            ApiDefinition::new("all").item(ApiPredicateItem::prefix("/**")),
            ApiDefinition::new("none").item(ApiPredicateItem::exact("/nothing")),
            ApiDefinition::new("orders").item(ApiPredicateItem::prefix("/orders/*")),
        ])
        .unwrap();
        assert_eq!(m.matching("/orders/7").collect::<Vec<_>>(), ["all", "orders"]);
    }

    #[test]
    fn invalid_definitions_are_refused_naming_the_definition_and_the_field() {
        let err = |defs: &[ApiDefinition]| ApiMatcher::new(defs).unwrap_err();
        let e = err(&[ApiDefinition::new(" ")]);
        assert_eq!((e.index(), e.field()), (0, "api_name"));
        let e = err(&[ApiDefinition::new("a"), ApiDefinition::new("b").item(ApiPredicateItem::regex("/x/("))]);
        assert_eq!((e.index(), e.field()), (1, "predicate_items.pattern"));
        assert!(e.to_string().contains("`/x/(`"), "{e}");
        let e = err(&[ApiDefinition::new("a").item(ApiPredicateItem::exact(""))]);
        assert_eq!(e.field(), "predicate_items.pattern");
        let e = err(&[ApiDefinition::new("a"), ApiDefinition::new("a")]);
        assert_eq!((e.index(), e.field()), (1, "api_name"));
        let e = err(&[ApiDefinition::new("a").item(ApiPredicateItem::prefix("/u/{id:[}/**"))]);
        assert_eq!(e.field(), "predicate_items.pattern");
    }

    #[test]
    fn a_definition_without_items_matches_nothing() {
        let m = ApiMatcher::new(&[ApiDefinition::new("empty")]).unwrap();
        assert_eq!(m.matching("/").count(), 0);
        assert!(!m.is_empty());
    }
}
