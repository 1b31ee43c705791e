//! The layers of `sentinel-runtime/src` point one way (see ARCHITECTURE.md): base → slot contract → rule kinds
//! → engine → integrations. This test reads the `crate::` paths of every source file (outside comments and
//! the `tests` modules), resolves each to the file it names, and fails when a file imports a file of a higher
//! layer, or when two files of the core (every layer below the integrations) import each other.
//!
//! `KNOWN` lists the imports that break a rule today, each with its reason: a new one fails the test, and so
//! does an entry of `KNOWN` that no longer occurs (remove it: the list only shrinks).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first, by the path of a file under `src` (the longest matching prefix wins).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "clock.rs",
            "rcu.rs",
            "stat/",
            "error.rs",
            "pattern.rs",
            "names.rs",
            "wait.rs",
            "flow/rule.rs",
            "circuit_breaker/rule.rs",
            "param_flow/rule.rs",
            "authority/rule.rs",
            "system/rule.rs",
            "param_flow/value.rs",
        ],
    ),
    ("contract", &["slot/"]),
    // `adaptive/` is a rule kind not yet in the chain (issue 31's groundwork).
    ("kinds", &["authority/", "system/", "param_flow/", "flow/", "circuit_breaker/", "adaptive/"]),
    (
        "engine",
        &[
            "lib.rs",
            "engine/",
            "config.rs",
            "resource.rs",
            "context.rs",
            "node.rs",
            "entry.rs",
            "chain.rs",
            "rules.rs",
            "registry.rs",
            "macro_support.rs",
            "inspect.rs",
            "slot/every_nth.rs",
            "debug_impls.rs",
        ],
    ),
    (
        "integrations",
        &[
            "web/",
            "transport/",
            "cluster/",
            "exporter",
            "datasource/",
            "log/",
            "diagnose",
            "http_server.rs",
            "observe.rs",
            "outbound/",
        ],
    ),
];

/// Imports that break a rule today: (importer, imported, reason). Each is debt; the list only shrinks.
const KNOWN: &[(&str, &str, &str)] = &[
    // The check context still hands the kinds the engine's shared state (clock, resource lookup), the
    // resource and the node of the call, and the hot-parameter arguments.
    ("slot/contract.rs", "engine/mod.rs", "CheckCx::shared: the clock and the related-resource lookup"),
    ("slot/contract.rs", "resource.rs", "CheckCx::resource and FastCx::resource: the name and cluster node"),
    ("slot/contract.rs", "node.rs", "CheckCx::node: the call's node in its context (chain rules read it)"),
    ("slot/contract.rs", "param_flow/mod.rs", "CheckCx::args: the HotParam trait is the param kind's"),
    ("param_flow/mod.rs", "slot/contract.rs", "the param kind implements the contract (cycle through HotParam)"),
    ("flow/mod.rs", "resource.rs", "relate rules cache the related ResourceInner; check_simple_only reads it"),
    // Inside the engine layer.
    ("chain.rs", "engine/mod.rs", "the chain reads each kind's state in Shared; rules_for asks the chain"),
    ("context.rs", "engine/mod.rs", "contexts are interned in Shared; the engine's entry path uses them"),
    ("engine/mod.rs", "entry.rs", "Sentinel::enter builds entries; an entry holds the engine's Shared"),
    ("engine/mod.rs", "resource.rs", "Shared holds the resources; a resource holds Shared"),
    ("engine/mod.rs", "slot/every_nth.rs", "tests only: the test-only kind's rules live in Shared"),
    ("entry.rs", "macro_support.rs", "Entry::instrument uses InContext; the macro support builds entries"),
    ("entry.rs", "resource.rs", "a resource hands out entry builders; an entry holds its resource"),
    // The engine still reaches two integrations.
    ("engine/mod.rs", "diagnose.rs", "Sentinel::caps returns diagnose::Caps"),
    ("engine/mod.rs", "observe.rs", "Shared holds the observers that integrations register"),
    ("resource.rs", "observe.rs", "a resource holds what integrations observe of it"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(file: &str) -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (i, (name, prefixes)) in LAYERS.iter().enumerate() {
        for p in *prefixes {
            if file.starts_with(p) && best.is_none_or(|(len, _, _)| p.len() > len) {
                best = Some((p.len(), i, name));
            }
        }
    }
    best.map(|(_, i, name)| (i, name))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("src is readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `text` without its `#[cfg(test)]` modules (inline ones: from the attribute to the matching brace).
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_mod = ["mod ", "pub mod ", "pub(crate) mod "].iter().any(|p| item.starts_with(p));
        let open = item.find('{');
        let semi = item.find(';');
        match (is_mod, open) {
            (true, Some(o)) if semi.is_none_or(|s| s > o) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (k, c) in item[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &item[end..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// The code of a file without comments and without its `#[cfg(test)]` modules.
fn code(text: &str) -> String {
    let text = &without_test_modules(text);
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let line = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path after `crate::`, with `{...}` groups expanded (`crate::a::{b, c::D}` gives `a::b`, `a::c::D`).
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `sentinel_runtime_crate::` and the like
        }
        expand("", rest, &mut out);
    }
    out
}

fn expand(prefix: &str, s: &str, out: &mut Vec<String>) {
    if let Some(group) = s.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    expand(prefix, group[start..i].trim(), out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(prefix, group[start..i].trim(), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(s.len());
    let path = s[..end].trim_end_matches(':');
    let full = if prefix.is_empty() { path.to_string() } else { format!("{prefix}::{path}") };
    if s[end..].starts_with('{') && s[..end].ends_with("::") {
        expand(&full, &s[end..], out);
    } else if !full.is_empty() {
        out.push(full);
    }
}

/// The file a path names: the deepest module file that exists (`a::b::C`: `a/b.rs`, `a/b/mod.rs`, `a.rs`,
/// `a/mod.rs`); an item of the crate root re-exported from a module resolves to that module.
fn resolve(path: &str, reexports: &BTreeMap<String, String>) -> Option<String> {
    let segs: Vec<&str> = path.split("::").collect();
    if segs.len() == 1 {
        if let Some(m) = reexports.get(segs[0]) {
            return resolve(&format!("{m}::x"), reexports);
        }
    }
    for n in (1..=segs.len()).rev() {
        let base = segs[..n].join("/");
        for f in [format!("{base}.rs"), format!("{base}/mod.rs")] {
            if src().join(&f).is_file() {
                return Some(f);
            }
        }
    }
    Some("lib.rs".into())
}

/// `pub use module::{A, B}` / `pub use module::A` of `lib.rs`: item → module path.
fn root_reexports() -> BTreeMap<String, String> {
    let lib = code(&fs::read_to_string(src().join("lib.rs")).expect("lib.rs"));
    let mut map = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(i) = stmt.find("pub use ") else { continue };
        let mut out = Vec::new();
        expand("", stmt[i + "pub use ".len()..].trim(), &mut out);
        for p in out {
            if let Some((module, item)) = p.rsplit_once("::") {
                map.insert(item.to_string(), module.to_string());
            }
        }
    }
    map
}

fn imports() -> BTreeSet<(String, String)> {
    let root = src();
    let reexports = root_reexports();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut edges = BTreeSet::new();
    for f in all {
        let rel = f.strip_prefix(&root).expect("under src").to_string_lossy().replace('\\', "/");
        if rel.ends_with("tests.rs") || rel.contains("/tests/") || rel.ends_with("edge_tests.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).expect("a source file");
        for p in paths(&code(&text)) {
            if let Some(target) = resolve(&p, &reexports) {
                if target != rel {
                    edges.insert((rel.clone(), target));
                }
            }
        }
    }
    edges
}

#[test]
fn layers_point_one_way_and_no_two_core_files_import_each_other() {
    let edges = imports();
    let mut broken = BTreeSet::new();
    for (from, to) in &edges {
        let (Some((lf, nf)), Some((lt, nt))) = (layer_of(from), layer_of(to)) else { continue };
        if lt > lf {
            broken.insert((from.clone(), to.clone(), format!("{nf} imports {nt}")));
        }
        let core = |l: usize| l + 1 < LAYERS.len();
        if core(lf) && core(lt) && from < to && edges.contains(&(to.clone(), from.clone())) {
            broken.insert((from.clone(), to.clone(), "import each other".to_string()));
        }
    }
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().map(|(a, b, _)| (*a, *b)).collect();
    let new: Vec<_> = broken.iter().filter(|(a, b, _)| !known.contains(&(a.as_str(), b.as_str()))).collect();
    let gone: Vec<_> = KNOWN.iter().filter(|(a, b, _)| !broken.iter().any(|(x, y, _)| x == a && y == b)).collect();
    assert!(new.is_empty(), "imports against the layers (ARCHITECTURE.md):\n{new:#?}");
    assert!(gone.is_empty(), "fixed: remove these from KNOWN:\n{gone:#?}");
}

#[test]
fn every_source_file_has_a_layer() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let lost: Vec<_> = all
        .iter()
        .map(|f| f.strip_prefix(src()).expect("under src").to_string_lossy().replace('\\', "/"))
        .filter(|f| layer_of(f).is_none())
        .collect();
    assert!(lost.is_empty(), "files in no layer (add them to LAYERS): {lost:?}");
}

#[test]
fn the_path_reader_expands_groups_and_skips_comments() {
    let code = code(
        "// use crate::web::x;\nuse crate::{a::{b, c::D}, e};\nlet x = crate::f::g(); // crate::h\n\
         #[cfg(test)]\nmod tests {\n    fn f() { crate::web::x(); }\n}\n",
    );
    assert_eq!(paths(&code), ["a::b", "a::c::D", "e", "f::g"]);
}
