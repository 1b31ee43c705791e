//! Ant-style path patterns, matched as Spring's `AntPathMatcher` (the matcher behind Spring Cloud Gateway's
//! prefix predicates, and so behind Java Sentinel's API definitions) matches them.
//!
//! - A pattern and a path are split at `/`; empty segments are dropped (`/a//b` is `/a/b`), but a pattern
//!   that starts with `/` matches only paths that start with `/` (and the other way round).
//! - `**` as a whole segment matches zero or more segments: `/product/**` matches `/product`,
//!   `/product/` and `/product/a/b`, not `/productx`.
//! - In a segment, `*` matches zero or more characters, `?` one character, `{name}` like `*`, and
//!   `{name:regex}` the regular expression; everything else is literal and case-sensitive.
//! - A trailing `/` counts where the pattern ends in a plain segment: `/a/*` matches `/a/b` and `/a/`
//!   but not `/a/b/`; `/a/**` matches `/a/b/`.
//! - A pattern with no wildcard and no `{variable}` (`/product/`) is not a pattern: Spring Cloud Gateway's
//!   matcher never matches it (use `/product/**`, or an exact predicate item).

use regex::{Regex, RegexBuilder};
use smallvec::SmallVec;

use super::{GATEWAY_DFA_LIMIT, GATEWAY_REGEX_SIZE_LIMIT};

/// A path's segments kept on the stack up to this many while it is matched (a longer path takes a vector).
const INLINE_DIRS: usize = 16;

/// One segment of a pattern.
#[derive(Clone, Debug)]
enum Segment {
    /// `**`: zero or more segments.
    AnyDirs,
    /// `*` alone: any one segment.
    Star,
    /// A segment without wildcards, compared as is.
    Literal(Box<str>),
    /// A segment with `*`, `?` or `{variable}`, compiled to an anchored regular expression.
    Wild(Regex),
}

impl Segment {
    fn matches(&self, segment: &str) -> bool {
        match self {
            Segment::AnyDirs | Segment::Star => true,
            Segment::Literal(l) => **l == *segment,
            Segment::Wild(r) => r.is_match(segment),
        }
    }
    fn is_any_dirs(&self) -> bool {
        matches!(self, Segment::AnyDirs)
    }
}

/// A compiled Ant-style path pattern (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct AntPattern {
    segments: Vec<Segment>,
    leading_slash: bool,
    trailing_slash: bool,
    /// Whether the text is a pattern at all (has a wildcard or a variable); a plain path never matches.
    is_pattern: bool,
}

/// Whether Spring's matcher sees `text` as a pattern: a `*` or `?`, or a `{` closed by a later `}`.
fn is_pattern(text: &str) -> bool {
    let mut open = false;
    for c in text.chars() {
        match c {
            '*' | '?' => return true,
            '{' => open = true,
            '}' if open => return true,
            _ => {}
        }
    }
    false
}

/// The end (index of the closing `}`) of the variable that starts at `open` (a `{`): braces nest, and a
/// backslash escapes the next character. `None` when it is not closed.
fn variable_end(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut escaped = false;
    for (i, c) in s[open..].char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The regular expression of one segment with wildcards.
fn segment_regex(segment: &str) -> Result<Regex, String> {
    let mut re = String::from(r"\A(?s:");
    let mut literal = String::new();
    let mut i = 0;
    let flush = |re: &mut String, literal: &mut String| {
        re.push_str(&regex::escape(literal));
        literal.clear();
    };
    while i < segment.len() {
        let c = segment[i..].chars().next().unwrap_or_default();
        match c {
            '*' => {
                flush(&mut re, &mut literal);
                re.push_str(".*");
            }
            '?' => {
                flush(&mut re, &mut literal);
                re.push('.');
            }
            '{' => match variable_end(segment, i) {
                Some(end) => {
                    flush(&mut re, &mut literal);
                    let body = &segment[i + 1..end];
                    match body.split_once(':') {
                        Some((_, custom)) => {
                            re.push_str("(?:");
                            re.push_str(&crate::pattern::java_syntax(custom));
                            re.push(')');
                        }
                        None => re.push_str(".*"),
                    }
                    i = end + 1;
                    continue;
                }
                None => literal.push(c),
            },
            _ => literal.push(c),
        }
        i += c.len_utf8();
    }
    flush(&mut re, &mut literal);
    re.push_str(r")\z");
    let regex = RegexBuilder::new(&re)
        .size_limit(GATEWAY_REGEX_SIZE_LIMIT)
        .dfa_size_limit(GATEWAY_DFA_LIMIT)
        .build()
        .map_err(|e| format!("has a `{{name:regex}}` variable that is not a valid regular expression ({e})"))?;
    super::spend_regex_budget(&re).map_err(|e| format!("has a segment that {e}"))?;
    Ok(regex)
}

impl AntPattern {
    /// Compiles `pattern`; an error says which part is wrong.
    pub(crate) fn compile(pattern: &str) -> Result<Self, String> {
        let segments = pattern
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| match s {
                "**" => Ok(Segment::AnyDirs),
                "*" => Ok(Segment::Star),
                s if is_pattern(s) => segment_regex(s).map(Segment::Wild),
                s => Ok(Segment::Literal(s.into())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AntPattern {
            segments,
            leading_slash: pattern.starts_with('/'),
            trailing_slash: pattern.ends_with('/'),
            is_pattern: is_pattern(pattern),
        })
    }

    /// Whether `path` matches, as Spring's `AntPathMatcher::match` decides.
    pub(crate) fn matches(&self, path: &str) -> bool {
        if !self.is_pattern || path.starts_with('/') != self.leading_slash {
            return false;
        }
        // On the stack up to `INLINE_DIRS` segments (no allocation per request for a common path).
        let dirs: SmallVec<[&str; INLINE_DIRS]> = path.split('/').filter(|s| !s.is_empty()).collect();
        self.matches_dirs(&dirs, path.ends_with('/'))
    }

    fn matches_dirs(&self, dirs: &[&str], path_trailing_slash: bool) -> bool {
        let pat = &self.segments;
        // Half-open windows [ps, pe) of the pattern and [ds, de) of the path still to match.
        let (mut ps, mut pe, mut ds, mut de) = (0usize, pat.len(), 0usize, dirs.len());

        // Up to the first `**`.
        while ps < pe && ds < de && !pat[ps].is_any_dirs() {
            if !pat[ps].matches(dirs[ds]) {
                return false;
            }
            ps += 1;
            ds += 1;
        }
        if ds == de {
            // The path is used up: only `**`s may remain (or one `*` before a trailing slash).
            if ps == pe {
                return self.trailing_slash == path_trailing_slash;
            }
            if ps + 1 == pe && matches!(pat[ps], Segment::Star) && path_trailing_slash {
                return true;
            }
            return pat[ps..pe].iter().all(Segment::is_any_dirs);
        }
        if ps == pe {
            return false; // the pattern is used up, the path is not
        }

        // From the end, back to the last `**`.
        while ps < pe && ds < de && !pat[pe - 1].is_any_dirs() {
            if !pat[pe - 1].matches(dirs[de - 1]) {
                return false;
            }
            if pe == pat.len() && self.trailing_slash != path_trailing_slash {
                return false;
            }
            pe -= 1;
            de -= 1;
        }
        if ds == de {
            return pat[ps..pe].iter().all(Segment::is_any_dirs);
        }

        // Between `**`s: each run of plain segments matches at its first fit.
        while ps + 1 < pe && ds < de {
            let next = (ps + 1..pe).find(|&i| pat[i].is_any_dirs()).unwrap_or(pe);
            if next == ps + 1 {
                ps += 1; // `**/**`
                continue;
            }
            let run = &pat[ps + 1..next];
            let found = (ds..=de.saturating_sub(run.len()))
                .filter(|&start| start + run.len() <= de)
                .find(|&start| run.iter().zip(&dirs[start..]).all(|(p, d)| p.matches(d)));
            let Some(start) = found else { return false };
            ps = next;
            ds = start + run.len();
        }
        pat[ps..pe].iter().all(Segment::is_any_dirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ant(pattern: &str, path: &str) -> bool {
        AntPattern::compile(pattern).unwrap().matches(path)
    }

    #[test]
    fn double_star_matches_zero_or_more_segments_below_its_prefix() {
        for path in ["/product", "/product/", "/product/a", "/product/a/b/c", "/product//a"] {
            assert!(ant("/product/**", path), "{path}");
        }
        for path in ["/productx", "/prod", "/", "product/a", "/other/product/a"] {
            assert!(!ant("/product/**", path), "{path}");
        }
        assert!(ant("/**", "/") && ant("/**", "/anything/at/all"));
    }

    #[test]
    fn a_pattern_without_wildcards_never_matches_as_in_spring_cloud_gateway() {
        assert!(!ant("/product/", "/product/"));
        assert!(!ant("/product/", "/product/a"));
        assert!(!ant("/product", "/product"));
        assert!(!AntPattern::compile("/product/").unwrap().is_pattern);
    }

    #[test]
    fn single_star_and_question_mark_stay_within_one_segment() {
        assert!(ant("/a/*", "/a/b"));
        assert!(ant("/a/*", "/a/"), "a single trailing `*` matches an empty last segment");
        assert!(!ant("/a/*", "/a"));
        assert!(!ant("/a/*", "/a/b/c"));
        assert!(!ant("/a/*", "/a/b/"), "the pattern has no trailing slash");
        assert!(ant("/a/*/", "/a/b/"));
        assert!(ant("/files/*.json", "/files/x.json") && !ant("/files/*.json", "/files/x.jsonp"));
        assert!(ant("/v?/users", "/v1/users") && !ant("/v?/users", "/v10/users") && !ant("/v?/users", "/v/users"));
    }

    #[test]
    fn double_star_in_the_middle_matches_any_depth_and_trailing_slashes_count_after_it() {
        for path in ["/a/c", "/a/b/c", "/a/b/b2/c"] {
            assert!(ant("/a/**/c", path), "{path}");
        }
        assert!(!ant("/a/**/c", "/a/c/"));
        assert!(!ant("/a/**/c", "/a/b/d"));
        assert!(ant("/a/**", "/a/b/"));
        assert!(ant("/**/x/**/y", "/1/x/2/3/y") && !ant("/**/x/**/y", "/1/y/2/x"));
        assert!(ant("/a/**/**/b", "/a/b"));
    }

    #[test]
    fn variables_match_one_segment_and_may_carry_a_regex() {
        assert!(ant("/users/{id}", "/users/42") && !ant("/users/{id}", "/users/42/orders"));
        assert!(ant(r"/users/{id:\d+}", "/users/42") && !ant(r"/users/{id:\d+}", "/users/ann"));
        assert!(ant(r"/r/{code:[a-z]{2}}", "/r/ab") && !ant(r"/r/{code:[a-z]{2}}", "/r/abc"));
        assert!(AntPattern::compile("/x/{bad:(}").is_err());
    }

    #[test]
    fn matching_is_case_sensitive_and_literal_outside_wildcards() {
        assert!(!ant("/Product/**", "/product/a"));
        assert!(ant("/a.b/**", "/a.b/c") && !ant("/a.b/**", "/axb/c"), "regex characters are literal");
        assert!(ant("/a+(b)/*", "/a+(b)/c"));
    }

    #[test]
    fn leading_slashes_must_agree() {
        assert!(!ant("**", "/a"));
        assert!(ant("a/**", "a/b") && !ant("a/**", "/a/b"));
    }

    #[test]
    fn a_long_hostile_path_is_matched_in_bounded_time() {
        let path = "/a".repeat(20_000) + "/z";
        assert!(!ant("/**/a/**/b/**/c", &path));
        assert!(ant("/**/a/**/z", &path));
    }

    /// A plain recursive reading of the rules for paths and patterns without a trailing slash: `**` takes
    /// zero or more segments, every other segment one. (The path `/` ends in a slash, so paths are non-empty.)
    fn reference(pattern: &[&str], path: &[&str]) -> bool {
        match pattern.split_first() {
            None => path.is_empty(),
            Some((&"**", rest)) => (0..=path.len()).any(|skip| reference(rest, &path[skip..])),
            Some((seg, rest)) => match path.split_first() {
                Some((p, path_rest)) => {
                    AntPattern::compile(seg).unwrap().segments[0].matches(p) && reference(rest, path_rest)
                }
                None => false,
            },
        }
    }

    proptest::proptest! {
        #[test]
        fn matching_agrees_with_a_recursive_reading_of_the_rules(
            pattern in proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", "ab", "*", "**", "a*", "?", "{x}"]), 1..6),
            path in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "ab", "ba"]), 1..7),
        ) {
            let text = format!("/{}", pattern.join("/"));
            let compiled = AntPattern::compile(&text).unwrap();
            let want = compiled.is_pattern && reference(&pattern, &path);
            proptest::prop_assert_eq!(compiled.matches(&format!("/{}", path.join("/"))), want, "{} on {:?}", text, path);
        }
    }
}
