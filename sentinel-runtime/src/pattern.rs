//! Regex resources: flow, degrade, authority and hot-parameter rules whose `resource` is a pattern (Java's `regex: true`).
//!
//! A rule with `regex` set applies to every resource whose **whole** name matches its `resource` (Java's
//! `Pattern.matcher(name).matches()`; here the pattern is anchored at both ends, so `"order.*"` matches
//! `"orderList"` and not `"myorder"`). Each matching resource is governed separately, as in Java: a flow rule
//! counts each resource's own calls against its own limit (with its own warm-up or queueing state), a
//! degrade rule gives each resource its own breaker, and an authority rule checks each one's callers.
//!
//! Matching happens when a rule set loads and when a resource is created, never per call: a resource's rules,
//! exact and matched, are resolved once and cached with the resource, so an entry costs the same whether or
//! not patterns are loaded. A resource's exact rules come first, then the rules of every pattern it matches
//! (in load order). [`Sentinel::diagnose`](crate::Sentinel::diagnose) names the pattern behind each rule it
//! reports ([`RuleFinding::pattern`](crate::diagnose::RuleFinding::pattern)).
//!
//! ```
//! use sentinel_runtime::{Sentinel, flow::FlowRule, authority::{AuthorityRule, AuthorityStrategy}};
//! let engine = Sentinel::builder().build();
//! engine.load_flow_rules([FlowRule::new("order_.*").regex(true).count(1.0)]).unwrap();
//! engine
//!     .load_authority_rules([AuthorityRule::new("admin/.*", "ops", AuthorityStrategy::White).regex(true)])
//!     .unwrap();
//! assert!(engine.resource("admin/users").entry().origin("web").enter().is_err());
//! let (list, get) = (engine.resource("order_list"), engine.resource("order_get"));
//! let _a = list.enter().unwrap();
//! assert!(list.enter().is_err()); // order_list used its own limit of 1 ...
//! assert!(get.enter().is_ok()); // ... order_get has its own
//! let d = engine.diagnose("order_get");
//! assert_eq!(d.flow[0].pattern.as_deref(), Some("order_.*"));
//! ```
//!
//! The syntax is the [`regex`](https://docs.rs/regex) crate's, which is Java's for everything resource
//! patterns usually hold (classes, alternation, repetition, groups, escapes). A pattern it cannot compile is a
//! [`RuleError`] naming the rule and the field `resource`, and the rules in force stay:
//! look-around and backreferences do not exist there (matching runs in linear time whatever the pattern),
//! and a pattern that compiles to more than 1 MiB is refused, as is a load of one kind whose patterns hold more
//! than 16 MiB compiled in all, so a pushed rule set cannot exhaust memory.
//! As in Java, `\d`, `\w`, `\s` and their negations are ASCII classes (`[0-9]`, `[a-zA-Z_0-9]`,
//! `[ \t\n\x0B\f\r]`) unless the pattern starts with `(?U)` (Java's `UNICODE_CHARACTER_CLASS`), which makes
//! them Unicode-aware; gateway patterns read them the same way.
//!
//! A regex flow rule cannot be in cluster mode (one cluster flow id cannot count every matching resource
//! separately; Java refuses it too). Java also ignores regex flow rules that warm up or queue, because its
//! controller would be shared by every matching resource; here each resource gets its own controller, so
//! those behaviours work per resource. A regex hot-parameter rule counts each matching resource's values
//! with counters of its own; it must reject (the default behaviour) and not be in cluster mode, as Java's
//! `ParamFlowRuleUtil` requires.

use std::collections::HashMap;
use std::sync::Arc;

use regex::{Regex, RegexBuilder};

use crate::error::{RuleError, RuleKind};

/// The largest compiled program of a pattern, and of its lazy DFA cache: enough for any realistic resource
/// pattern, small enough that a hostile rule push cannot exhaust memory.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// The largest lazy DFA cache a resource pattern grows as names are matched against it (names are matched
/// when a resource is created and when rules load, never per call: a small cache costs nothing that
/// matters). Counted with its pattern against [`PATTERNS_TOTAL_LIMIT`].
const PATTERN_DFA_LIMIT: usize = 32 << 10;

/// What the patterns one load of a rule kind compiles may hold in all, their programs and the lazy DFA
/// caches names matched against them grow: a push of many patterns (`.{1000}` is seven characters and about
/// 1 MiB compiled) cannot make their sum grow without bound.
pub(crate) const PATTERNS_TOTAL_LIMIT: usize = 16 << 20;

/// The memory the automata of the regular expression `anchored` hold, as the regex crate builds them with
/// programs of at most `limit` bytes (measured: the regex crate does not report it).
pub(crate) fn compiled_bytes(anchored: &str, limit: usize) -> usize {
    let config = regex_automata::meta::Config::new().nfa_size_limit(Some(limit));
    regex_automata::meta::Regex::builder().configure(config).build(anchored).map_or(0, |r| r.memory_usage())
}

/// A resource name pattern, compiled once per rule load.
#[derive(Clone, Debug)]
pub(crate) struct ResourcePattern {
    source: Arc<str>,
    regex: Regex,
}

impl ResourcePattern {
    /// Compiles `source` anchored at both ends (Java's `matches()`): the whole name must match.
    pub(crate) fn compile(source: &str) -> Result<Self, String> {
        RegexBuilder::new(&format!(r"\A(?:{})\z", java_syntax(source)))
            .size_limit(PATTERN_SIZE_LIMIT)
            .dfa_size_limit(PATTERN_DFA_LIMIT)
            .build()
            .map(|regex| ResourcePattern { source: source.into(), regex })
            .map_err(|e| describe(&e))
    }

    /// The pattern as written in the rule.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Whether the whole of `name` matches; every pattern matches
    /// [`RESOURCE_PATTERNS_OVERFLOW`](crate::RESOURCE_PATTERNS_OVERFLOW), the resource names past the bounds
    /// share, which every regex rule checks.
    pub(crate) fn matches(&self, name: &str) -> bool {
        name == crate::names::RESOURCE_PATTERNS_OVERFLOW || self.regex.is_match(name)
    }
}

/// A pattern written for Java's `Pattern`, in the regex crate's syntax: Java reads `\d`, `\w`, `\s` and their
/// negations as ASCII classes, the regex crate as Unicode ones, so each becomes the regex crate's ASCII class
/// (`[[:digit:]]`, `[[:word:]]`, `[[:space:]]`, the same sets as Java's), in a bracketed class too. A pattern
/// whose flags at the start hold Java's `U` (`(?U)`, `(?iU)`, `(?i)(?U)`: `UNICODE_CHARACTER_CLASS`, which the
/// regex crate would read as "swap greed") keeps Unicode classes, and the `U` is removed. Anything else is
/// left as written.
pub(crate) fn java_syntax(source: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    // Java's flags at the start (`(?iU)`, `(?i)(?U)`): with `U`, Unicode classes, and the flag removed.
    let mut rest = source;
    let mut flags = String::new();
    let mut unicode = false;
    while let Some(group) = rest.strip_prefix("(?").and_then(|r| r.split_once(')')).map(|(f, _)| f) {
        if group.is_empty() || !group.chars().all(|c| c.is_ascii_alphabetic() || c == '-') {
            break;
        }
        let (on, off) = group.split_once('-').unwrap_or((group, ""));
        unicode |= on.contains('U');
        let kept = |part: &str| part.chars().filter(|&c| c != 'U').collect::<String>();
        let (on, off) = (kept(on), kept(off));
        if !on.is_empty() || !off.is_empty() {
            flags.push_str(&format!("(?{on}{}{off})", if off.is_empty() { "" } else { "-" }));
        }
        rest = &rest[group.len() + 3..];
    }
    if unicode {
        return Cow::Owned(flags + rest);
    }
    if !source.contains('\\') {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len() + 16);
    let mut in_class = 0usize;
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('d' | 'D' | 'w' | 'W' | 's' | 'S')) => {
                    let name = match e.to_ascii_lowercase() {
                        'd' => "digit",
                        'w' => "word",
                        _ => "space",
                    };
                    let not = if e.is_ascii_uppercase() { "^" } else { "" };
                    if in_class > 0 {
                        out.push_str(&format!("[:{not}{name}:]"));
                    } else {
                        out.push_str(&format!("[[:{not}{name}:]]"));
                    }
                }
                Some(e) => {
                    out.push('\\');
                    out.push(e);
                }
                None => out.push('\\'),
            },
            '[' => {
                in_class += 1;
                out.push('[');
            }
            ']' if in_class > 0 => {
                in_class -= 1;
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The regex crate's error in one line, with what to do.
fn describe(e: &regex::Error) -> String {
    match e {
        regex::Error::Syntax(text) => {
            // The message is a diagram ("regex parse error:\n    a(\n     ^\nerror: unclosed group"): keep the
            // last line, which says what is wrong.
            let what = text.lines().rev().find_map(|l| l.strip_prefix("error: ")).unwrap_or(text.as_str());
            format!(
                "is not a valid pattern ({what}); write it in the regex crate's syntax (no look-around or \
                 backreferences), or set regex to false to name a resource exactly"
            )
        }
        regex::Error::CompiledTooBig(limit) => {
            format!("compiles to more than {limit} bytes; simplify the pattern")
        }
        other => format!("is not a valid pattern ({other})"),
    }
}

/// Compiles the patterns of a rule set's regex rules while the set is validated, each distinct pattern once,
/// reusing the compiled patterns of the set in force when a pattern is unchanged.
pub(crate) struct Compiler<'p, R> {
    kind: RuleKind,
    previous: &'p Patterns<R>,
    compiled: std::cell::RefCell<HashMap<Arc<str>, ResourcePattern>>,
    /// The bytes the patterns compiled so far hold ([`PATTERNS_TOTAL_LIMIT`] at most).
    held: std::cell::Cell<usize>,
}

impl<'p, R> Compiler<'p, R> {
    pub(crate) fn new(kind: RuleKind, previous: &'p Patterns<R>) -> Self {
        Compiler { kind, previous, compiled: Default::default(), held: Default::default() }
    }

    /// Compiles the pattern of rule `index` of the set; the error names the rule and the field.
    pub(crate) fn check(&self, index: usize, source: &str) -> Result<(), RuleError> {
        let mut compiled = self.compiled.borrow_mut();
        if compiled.contains_key(source) {
            return Ok(());
        }
        let pattern = match self.previous.get(source) {
            Some(p) => p.clone(),
            None => ResourcePattern::compile(source)
                .map_err(|reason| RuleError::invalid(self.kind, index, source, "resource", reason))?,
        };
        // Kept or new, every pattern of the set counts.
        let held = self.held.get() + compiled_bytes(pattern.regex.as_str(), PATTERN_SIZE_LIMIT) + PATTERN_DFA_LIMIT;
        if held > PATTERNS_TOTAL_LIMIT {
            let reason = format!(
                "brings the patterns of these rules past {} MiB compiled in all; simplify them or use fewer",
                PATTERNS_TOTAL_LIMIT >> 20
            );
            return Err(RuleError::invalid(self.kind, index, source, "resource", reason));
        }
        self.held.set(held);
        compiled.insert(pattern.source.clone(), pattern);
        Ok(())
    }

    /// The compiled patterns.
    pub(crate) fn finish(&self) -> HashMap<Arc<str>, ResourcePattern> {
        self.compiled.take()
    }
}

/// The regex rules of one kind grouped by pattern, in the order each pattern first appears.
pub(crate) struct Patterns<R> {
    groups: Vec<(ResourcePattern, Vec<R>)>,
}

impl<R> Default for Patterns<R> {
    fn default() -> Self {
        Patterns { groups: Vec::new() }
    }
}

impl<R> Patterns<R> {
    /// Groups `rules` (pattern source, rule) by pattern; every source must be in `compiled`.
    pub(crate) fn group<'a>(
        rules: impl IntoIterator<Item = (&'a str, R)>,
        compiled: &HashMap<Arc<str>, ResourcePattern>,
    ) -> Self {
        let mut groups: Vec<(ResourcePattern, Vec<R>)> = Vec::new();
        for (source, rule) in rules {
            match groups.iter_mut().find(|(p, _)| p.source() == source) {
                Some((_, rules)) => rules.push(rule),
                None => {
                    if let Some(p) = compiled.get(source) {
                        groups.push((p.clone(), vec![rule]));
                    }
                }
            }
        }
        Patterns { groups }
    }

    /// Whether there is no pattern (the common case: resolution is then a plain map lookup).
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The compiled pattern `source`, if it is one of these.
    pub(crate) fn get(&self, source: &str) -> Option<&ResourcePattern> {
        self.groups.iter().map(|(p, _)| p).find(|p| p.source() == source)
    }

    /// The rules of every pattern that `name` matches, in order, with their pattern.
    pub(crate) fn matching<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a ResourcePattern, &'a R)> + 'a {
        self.groups
            .iter()
            .filter(move |(p, _)| p.matches(name))
            .flat_map(|(p, rules)| rules.iter().map(move |r| (p, r)))
    }

    /// The patterns `name` matches, as written in their rules, in order.
    pub(crate) fn sources_matching<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Arc<str>> + 'a {
        self.groups.iter().filter(move |(p, _)| p.matches(name)).map(|(p, _)| &p.source)
    }

    /// Whether `name` matches any pattern.
    pub(crate) fn any_match(&self, name: &str) -> bool {
        self.groups.iter().any(|(p, _)| p.matches(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_javas_ascii_ones_unless_the_pattern_asks_for_unicode() {
        let arabic_digits = "\u{661}\u{662}";
        let digits = ResourcePattern::compile(r"order\d+").unwrap();
        assert!(digits.matches("order42"));
        assert!(!digits.matches(&format!("order{arabic_digits}")), "Java's \\d is [0-9]");
        let not_digits = ResourcePattern::compile(r"\D+").unwrap();
        assert!(not_digits.matches(arabic_digits));
        assert!(ResourcePattern::compile(r"[\w.-]+").unwrap().matches("a_b.c-9"));
        assert!(!ResourcePattern::compile(r"[\w]+").unwrap().matches("é"));
        assert!(ResourcePattern::compile(r"[^\W]+").unwrap().matches("ab"));
        assert!(ResourcePattern::compile(r"a\sb").unwrap().matches("a\tb"));
        assert!(!ResourcePattern::compile(r"a\sb").unwrap().matches("a\u{a0}b"));
        // Escapes stay as written: a backslash, a dot, a bracket.
        assert!(ResourcePattern::compile(r"a\\d").unwrap().matches(r"a\d"));
        assert!(ResourcePattern::compile(r"a\.\[\d\]").unwrap().matches("a.[7]"));
        // Java's (?U): Unicode classes (the regex crate's (?U) would swap greed).
        let unicode = ResourcePattern::compile(r"(?U)order\d+").unwrap();
        assert!(unicode.matches(&format!("order{arabic_digits}")));
        assert_eq!(unicode.source(), r"(?U)order\d+");
    }

    #[test]
    fn a_pattern_matches_whole_names_only() {
        let p = ResourcePattern::compile("order.*").unwrap();
        assert!(p.matches("order"));
        assert!(p.matches("orderList"));
        assert!(!p.matches("myorder"), "Java's matches() anchors the start");
        let p = ResourcePattern::compile("a|b").unwrap();
        assert!(p.matches("a") && p.matches("b"));
        assert!(!p.matches("ab"), "the anchors hold around an alternation");
        let p = ResourcePattern::compile("(?m)x$").unwrap();
        assert!(!p.matches("x\ny"), "flags inside the pattern do not loosen the anchors");
    }

    #[test]
    fn a_bad_pattern_says_what_is_wrong_in_one_line() {
        let e = ResourcePattern::compile("order(").unwrap_err();
        assert!(e.contains("unclosed group"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = ResourcePattern::compile("(?=x)y").unwrap_err();
        assert!(e.contains("look-around"), "{e}");
    }

    #[test]
    fn a_pattern_that_compiles_too_big_is_refused() {
        let e = ResourcePattern::compile(r"(?U)\w{1000}\w{1000}\w{1000}").unwrap_err();
        assert!(e.contains("simplify"), "{e}");
    }

    #[test]
    fn rules_are_grouped_by_pattern_in_first_appearance_order() {
        let empty: Patterns<()> = Patterns::default();
        let compiler = Compiler::new(RuleKind::Flow, &empty);
        for (i, p) in ["b.*", "a.*", "b.*"].into_iter().enumerate() {
            compiler.check(i, p).unwrap();
        }
        let compiled = compiler.finish();
        assert_eq!(compiled.len(), 2, "each distinct pattern is compiled once");
        let patterns = Patterns::group([("b.*", 0), ("a.*", 1), ("b.*", 2)], &compiled);
        let hits: Vec<(&str, i32)> = patterns.matching("bx").map(|(p, r)| (p.source(), *r)).collect();
        assert_eq!(hits, vec![("b.*", 0), ("b.*", 2)]);
        assert!(patterns.any_match("ay"));
        assert!(!patterns.any_match("c"));
    }

    #[test]
    fn the_first_bad_pattern_names_its_rule() {
        let empty: Patterns<()> = Patterns::default();
        let compiler = Compiler::new(RuleKind::Authority, &empty);
        compiler.check(0, "ok.*").unwrap();
        let e = compiler.check(3, "[z-a]").unwrap_err();
        let RuleError::Invalid { index, field, resource, .. } = &e;
        assert_eq!((*index, *field, resource.as_str()), (3, "resource", "[z-a]"));
    }

    #[test]
    fn javas_unicode_class_flag_among_other_flags_keeps_unicode_classes() {
        // Java: `Pattern.compile("(?iU)\\w+").matcher("été").matches()` is true, as with `(?U)` alone.
        assert!(ResourcePattern::compile(r"(?U)\w+").unwrap().matches("été"));
        assert!(ResourcePattern::compile(r"(?iU)\w+").unwrap().matches("été"), "(?iU)");
        assert!(ResourcePattern::compile(r"(?i)(?U)\w+").unwrap().matches("été"), "(?i)(?U)");
    }
}
