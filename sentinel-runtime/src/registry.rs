//! The link-time registry of annotated functions, and the check that rules name resources that exist.
//!
//! Every `#[sentinel_resource]` function submits a [`ResourceDescriptor`] with `inventory`, so at start-up
//! the runtime knows every resource in the binary ([`Sentinel::registered_resources`]). When rules are
//! loaded, a rule whose resource matches no registered, declared or created resource is logged with the
//! closest known name ("did you mean `queryOrder`?"): a typo in a rule silently protects nothing otherwise.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

use crate::error::RuleKind;
use crate::resource::EntryType;
use crate::Sentinel;

/// What the macro records about one annotated function.
#[derive(Clone, Copy, Debug)]
pub struct ResourceDescriptor {
    /// The resource name.
    ///
    /// A method annotated in an impl block without `#[sentinel_resource]` on the block is named
    /// `module::Type::method` from `Self`, which is known only once the method runs: until its first call its
    /// descriptor holds `module::Self::method` (see [`ResourceDescriptor::named_at_first_call`]). With the
    /// attribute on the impl block the name is known at compile time.
    pub name: &'static str,
    /// Inbound or outbound.
    pub entry_type: EntryType,
    /// The function's name.
    pub function: &'static str,
    /// `module_path!()` where the function is defined.
    pub module_path: &'static str,
    /// The source file.
    pub file: &'static str,
    /// The line of the function.
    pub line: u32,
    /// Whether the function is `async`.
    pub is_async: bool,
    /// Whether it has a `block_handler`.
    pub has_block_handler: bool,
    /// Whether it has a `fallback`.
    pub has_fallback: bool,
    /// Whether it has a `default_fallback`.
    pub has_default_fallback: bool,
    /// For a method named from `Self` at its first call: finds the descriptor with the name it got. Set by the
    /// macro; read it through [`Sentinel::registered_resources`].
    #[doc(hidden)]
    pub resolve: Option<fn(&'static ResourceDescriptor) -> Option<&'static ResourceDescriptor>>,
}

impl PartialEq for ResourceDescriptor {
    fn eq(&self, other: &Self) -> bool {
        // Every field but the resolver (a function's address says nothing about it).
        self.name == other.name
            && self.entry_type == other.entry_type
            && self.function == other.function
            && self.module_path == other.module_path
            && self.file == other.file
            && self.line == other.line
            && self.is_async == other.is_async
            && self.has_block_handler == other.has_block_handler
            && self.has_fallback == other.has_fallback
            && self.has_default_fallback == other.has_default_fallback
            && self.resolve.is_some() == other.resolve.is_some()
    }
}

impl Eq for ResourceDescriptor {}

impl ResourceDescriptor {
    /// Whether this is a method whose name is found from `Self` at its first call and was not found yet (its
    /// impl block carries no `#[sentinel_resource]`): [`name`](ResourceDescriptor::name) is a placeholder.
    pub fn named_at_first_call(&self) -> bool {
        self.resolve.is_some()
    }

    /// Whether a resource named `name` may be this method once it is named (`module::<any type>::function`).
    fn may_name(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(self.module_path).and_then(|r| r.strip_prefix("::")) else {
            return false;
        };
        rest.strip_suffix(self.function)
            .and_then(|t| t.strip_suffix("::"))
            .is_some_and(|ty| !ty.is_empty() && !ty.contains("::"))
    }
}

/// `module::Type::function`, where `Type` is the last segment of `type_name` (`core::any::type_name::<Self>()`)
/// without generic arguments: a method's default resource name.
pub(crate) fn method_resource_name(module: &str, type_name: &str, function: &str) -> String {
    let before_generics = type_name.split('<').next().unwrap_or(type_name);
    let ty = before_generics.rsplit("::").next().unwrap_or(before_generics);
    let ty = ty.trim_start_matches(['&', '*']).trim_start_matches("mut ").trim_start_matches("dyn ").trim();
    format!("{module}::{ty}::{function}")
}

inventory::collect!(ResourceDescriptor);

/// Names declared with [`Sentinel::declare_resources`] (process-wide, like the link-time registry).
static DECLARED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// A rule whose resource matches no known resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownRuleResource {
    /// The kind of the rule.
    pub kind: RuleKind,
    /// The resource the rule names.
    pub resource: String,
    /// The closest known resource name, when one is close enough to be a likely typo.
    pub suggestion: Option<String>,
}

impl fmt::Display for UnknownRuleResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rule for `{}` matches no resource", self.kind, self.resource)?;
        if let Some(s) = &self.suggestion {
            write!(f, "; did you mean `{s}`?")?;
        }
        Ok(())
    }
}

impl Sentinel {
    /// Every function annotated with `#[sentinel_resource]` in the binary, sorted by resource name.
    ///
    /// A method named from `Self` (its impl block carries no `#[sentinel_resource]`) is listed under its name
    /// once it was called, and under a placeholder before (see [`ResourceDescriptor::name`]).
    pub fn registered_resources() -> Vec<&'static ResourceDescriptor> {
        let mut v: Vec<&'static ResourceDescriptor> = inventory::iter::<ResourceDescriptor>
            .into_iter()
            .map(|d| match d.resolve {
                Some(resolve) => resolve(d).unwrap_or(d),
                None => d,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(b.name).then(a.file.cmp(b.file)).then(a.line.cmp(&b.line)));
        v
    }

    /// Creates, in this engine, the resource (and its cluster node) of every annotated function in the binary, so
    /// that they are listed and have rules attached before their first call. Returns how many were created.
    pub fn prebuild_registered_resources(&self) -> usize {
        let known: BTreeSet<String> = self.resource_names().into_iter().collect();
        let mut created = 0;
        // A method named from `Self` that was never called has no name yet.
        for d in Sentinel::registered_resources().into_iter().filter(|d| !d.named_at_first_call()) {
            if !known.contains(d.name) {
                let _ = self.site_resource_typed(d.name, d.entry_type);
                created += 1;
            }
        }
        created
    }

    /// Declares resource names used only by manual entries ([`Sentinel::enter`], [`crate::Resource`]), so
    /// that rules naming them are not reported as unknown before their first call. Process-wide.
    pub fn declare_resources<I, S>(names: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut d = DECLARED.lock().unwrap_or_else(|e| e.into_inner());
        d.extend(names.into_iter().map(Into::into));
    }

    /// The names declared with [`Sentinel::declare_resources`].
    pub fn declared_resources() -> Vec<String> {
        DECLARED.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    /// Rules in force whose resource matches no registered, declared or created resource, each with the
    /// closest known name. Loading rules logs these as warnings.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, flow::FlowRule};
    /// let engine = Sentinel::builder().build();
    /// let _ = engine.resource("queryOrder");
    /// engine.load_flow_rules(vec![FlowRule::new("queryOrdr").count(5.0)]).unwrap();
    /// let unknown = engine.unknown_rule_resources();
    /// assert_eq!(unknown[0].resource, "queryOrdr");
    /// assert_eq!(unknown[0].suggestion.as_deref(), Some("queryOrder"));
    /// ```
    pub fn unknown_rule_resources(&self) -> Vec<UnknownRuleResource> {
        let mut out = Vec::new();
        for kind in [RuleKind::Authority, RuleKind::ParamFlow, RuleKind::Flow, RuleKind::Degrade, RuleKind::Adaptive] {
            out.extend(self.unknown_rule_resources_of(kind));
        }
        out
    }

    fn rule_resources(&self, kind: RuleKind) -> BTreeSet<String> {
        match kind {
            // A regex rule names no resource: it applies to those that match, now or later.
            RuleKind::Flow => self.flow_rules().into_iter().filter(|r| !r.regex).map(|r| r.resource).collect(),
            RuleKind::Degrade => self.degrade_rules().into_iter().filter(|r| !r.regex).map(|r| r.resource).collect(),
            RuleKind::ParamFlow => {
                self.param_flow_rules().into_iter().filter(|r| !r.regex).map(|r| r.resource).collect()
            }
            RuleKind::Authority => {
                self.authority_rules().into_iter().filter(|r| !r.regex).map(|r| r.resource).collect()
            }
            RuleKind::Adaptive => self.adaptive_rules().into_iter().filter(|r| !r.regex).map(|r| r.resource).collect(),
            RuleKind::System => BTreeSet::new(),
        }
    }

    fn unknown_rule_resources_of(&self, kind: RuleKind) -> Vec<UnknownRuleResource> {
        self.unknown_rule_resources_up_to(kind, usize::MAX)
    }

    /// The first `limit` rule resources of `kind` that match nothing known, with a suggestion each (finding
    /// one compares the name with every known name, so loads report a bounded number).
    fn unknown_rule_resources_up_to(&self, kind: RuleKind, limit: usize) -> Vec<UnknownRuleResource> {
        let names = self.rule_resources(kind);
        if names.is_empty() {
            return Vec::new();
        }
        let mut known: BTreeSet<String> = self.resource_names().into_iter().collect();
        let registered = Sentinel::registered_resources();
        known.extend(registered.iter().filter(|d| !d.named_at_first_call()).map(|d| d.name.to_string()));
        known.extend(Sentinel::declared_resources());
        let unnamed: Vec<_> = registered.iter().filter(|d| d.named_at_first_call()).collect();
        names
            .into_iter()
            // "*" holds the default circuit breaker, which applies to every resource.
            .filter(|n| n != "*" && !known.contains(n) && !unnamed.iter().any(|d| d.may_name(n)))
            .take(limit)
            .map(|resource| {
                let suggestion = closest(&resource, known.iter().map(String::as_str)).map(str::to_string);
                UnknownRuleResource { kind, resource, suggestion }
            })
            .collect()
    }

    /// Logs a warning for each rule of `kind` whose resource matches nothing known. Called after loading rules.
    pub(crate) fn warn_unknown_rule_resources(&self, kind: RuleKind) {
        // A load of many rules logs (and looks for a suggestion for) the first few unknown names only.
        const LOGGED: usize = 20;
        for u in self.unknown_rule_resources_up_to(kind, LOGGED) {
            tracing::warn!(kind = %u.kind, resource = %u.resource, suggestion = ?u.suggestion, "{u}");
        }
    }
}

/// The known name closest to `name`, if close enough to be a typo of it (edit distance at most a third of the
/// name's length, and at least 2 allowed; case differences cost little).
fn closest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(2);
    known
        .map(|k| {
            let exact = strsim::levenshtein(name, k);
            let folded = strsim::levenshtein(&name.to_lowercase(), &k.to_lowercase());
            (exact.min(folded + 1), k)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)))
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowRule;

    #[test]
    fn a_method_is_named_after_the_last_segment_of_its_type_without_generics() {
        let name = |t: &str| method_resource_name("app::shop", t, "get");
        assert_eq!(name("app::shop::Orders"), "app::shop::Orders::get");
        assert_eq!(name("app::shop::Cache<alloc::string::String, app::Item>"), "app::shop::Cache::get");
        assert_eq!(name("&app::shop::Orders"), "app::shop::Orders::get");
        assert_eq!(name("Orders"), "app::shop::Orders::get");
    }

    #[test]
    fn closest_name_is_suggested_for_a_typo() {
        let known = ["queryOrder", "createOrder", "listUsers"];
        assert_eq!(closest("queryOrdr", known.iter().copied()), Some("queryOrder"));
        assert_eq!(closest("QueryOrder", known.iter().copied()), Some("queryOrder"));
        assert_eq!(closest("createOrdre", known.iter().copied()), Some("createOrder"));
        assert_eq!(closest("somethingElse", known.iter().copied()), None);
    }

    #[test]
    fn rule_for_unknown_resource_is_reported_with_suggestion() {
        let engine = Sentinel::builder().build();
        let _r = engine.resource("registry_test::queryOrder");
        engine
            .load_flow_rules(vec![
                FlowRule::new("registry_test::queryOrdr").count(1.0),
                FlowRule::new("registry_test::queryOrder").count(1.0),
            ])
            .unwrap();
        let unknown = engine.unknown_rule_resources();
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].kind, RuleKind::Flow);
        assert_eq!(unknown[0].resource, "registry_test::queryOrdr");
        assert_eq!(unknown[0].suggestion.as_deref(), Some("registry_test::queryOrder"));
        assert_eq!(
            unknown[0].to_string(),
            "flow rule for `registry_test::queryOrdr` matches no resource; did you mean `registry_test::queryOrder`?"
        );
    }

    #[test]
    fn declared_names_and_default_breaker_are_not_reported() {
        let engine = Sentinel::builder().build();
        Sentinel::declare_resources(["registry_test::manualOnly"]);
        engine
            .load_flow_rules(vec![FlowRule::new("registry_test::manualOnly").count(1.0), FlowRule::new("*").count(1.0)])
            .unwrap();
        assert!(engine.unknown_rule_resources().is_empty(), "{:?}", engine.unknown_rule_resources());
        assert!(Sentinel::declared_resources().contains(&"registry_test::manualOnly".to_string()));
    }
}
