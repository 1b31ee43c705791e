//! The layers of `sentinel-runtime/src` point one way (see ARCHITECTURE.md): base → slot contract → rule kinds
//! → engine → integrations. This test reads the `crate::` and `super::` paths of every source file (outside
//! comments and the `tests` modules), resolves each to the file it names, and fails when a file imports a file
//! of a higher layer, when the files of the core (every layer below the integrations) import each other in a
//! circle (two files or more), or when two files of one outer room (`web/`, `transport/`, `outbound/`,
//! `datasource/`, `cluster/`, and the macro crate's `src/`) import each other.
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
            // Blocks in errors known only as a type parameter (the web layer's and the outbound guards' error paths).
            "error/",
            "pattern.rs",
            "names.rs",
            // fastjson's leniency made strict JSON (pure text; the rule documents and the gateway's JSON read it).
            "lenient_json.rs",
            "wait.rs",
            "flow/rule.rs",
            "circuit_breaker/rule.rs",
            "param_flow/rule.rs",
            "authority/rule.rs",
            "system/rule.rs",
            "adaptive/block.rs",
            "param_flow/value.rs",
        ],
    ),
    ("contract", &["slot/"]),
    ("kinds", &["authority/", "system/", "param_flow/", "flow/", "circuit_breaker/", "adaptive/"]),
    (
        "engine",
        &[
            "lib.rs",
            "engine/",
            "config.rs",
            "resource/",
            "context/",
            "node.rs",
            "entry/",
            "chain.rs",
            "rules.rs",
            "registry.rs",
            "macro_support.rs",
            "inspect.rs",
            "slot/every_nth.rs",
            "debug_impls.rs",
            // The observer registry: the engine owns it, integrations (the exporter) import it.
            "observe.rs",
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
            "outbound/",
        ],
    ),
];

/// The outer rooms: inside each, no two files import each other (layer → service → future, as tower's).
const ROOMS: &[&str] = &["web/", "transport/", "outbound/", "datasource/", "cluster/"];

/// Imports that break a rule today: (importer, imported, reason). Each is debt; the list only shrinks. An
/// entry on a circle of the core takes that import out of the graph the circle test walks.
const KNOWN: &[(&str, &str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The macro crate's sources.
fn macros_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sentinel-macros/src")
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

/// Every path after `super::` in the file `rel`, made relative to the crate root (`super::super::` climbs
/// twice), with groups expanded.
fn super_paths(rel: &str, code: &str) -> Vec<String> {
    let module = module_of(rel);
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "super::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // the second `super::` of `super::super::`, counted below
        }
        let mut up = 1;
        let mut tail = rest;
        while let Some(t) = tail.strip_prefix("super::") {
            up += 1;
            tail = t;
        }
        rest = tail;
        let Some(base) = module.len().checked_sub(up) else { continue };
        expand(&module[..base].join("::"), tail, &mut out);
    }
    out
}

/// The module path of the file `rel` (`flow/mod.rs` and `flow.rs` are `flow`).
fn module_of(rel: &str) -> Vec<&str> {
    let mut module: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
    if module.last().is_some_and(|m| *m == "mod" || *m == "lib") {
        module.pop();
    }
    module
}

/// Every path into a child module the file `rel` declares (`mod x;`, then `x::Item` or `self::x::Item`),
/// made relative to the crate root, with groups expanded. A parent's re-exports (`pub use x::Item;`,
/// `pub(crate) use ...`) declare its face, they are not uses: left out.
fn child_paths(rel: &str, code: &str) -> Vec<String> {
    let module = module_of(rel).join("::");
    let mut children = Vec::new();
    for stmt in code.split(';') {
        let t = stmt.trim();
        let t = t.rsplit(']').next().unwrap_or(t).trim(); // after attributes such as `#[cfg(...)]`
        for p in ["mod ", "pub mod ", "pub(crate) mod ", "pub(super) mod "] {
            if let Some(name) = t.strip_prefix(p).filter(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_')) {
                children.push(name.to_string());
            }
        }
    }
    let uses: String = code
        .split_inclusive(';')
        .filter(|stmt| {
            let t = stmt.trim_start();
            let t = t.rsplit(']').next().unwrap_or(t).trim_start();
            !["pub use ", "pub(crate) use ", "pub(super) use "].iter().any(|p| t.starts_with(p))
        })
        .collect::<String>()
        .replace("self::", "");
    let mut out = Vec::new();
    for child in &children {
        let needle = format!("{child}::");
        let mut rest = uses.as_str();
        while let Some(i) = rest.find(&needle) {
            let before = rest[..i].chars().last();
            let tail = &rest[i..];
            rest = &rest[i + needle.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            expand(&module, tail, &mut out);
        }
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
fn resolve(root: &Path, path: &str, reexports: &BTreeMap<String, String>) -> Option<String> {
    let segs: Vec<&str> = path.split("::").collect();
    // `crate::Item` and `crate::Item::Variant` of an item the root re-exports: the module it comes from.
    let is_module = |m: &str| root.join(format!("{m}.rs")).is_file() || root.join(m).join("mod.rs").is_file();
    if let Some(m) = reexports.get(segs[0]).filter(|_| !is_module(segs[0])) {
        return resolve(root, &format!("{m}::x"), reexports);
    }
    for n in (1..=segs.len()).rev() {
        let base = segs[..n].join("/");
        for f in [format!("{base}.rs"), format!("{base}/mod.rs")] {
            if root.join(&f).is_file() {
                return Some(f);
            }
        }
    }
    Some("lib.rs".into())
}

/// `pub use module::{A, B}` / `pub use module::A` of `lib.rs`: item → module path.
fn root_reexports(root: &Path) -> BTreeMap<String, String> {
    let lib = code(&fs::read_to_string(root.join("lib.rs")).expect("lib.rs"));
    let mut map = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(i) = stmt.find("pub use ") else { continue };
        let mut out = Vec::new();
        expand("", stmt[i + "pub use ".len()..].trim(), &mut out);
        for p in out {
            if let Some((module, item)) = p.rsplit_once("::") {
                map.insert(item.to_string(), module.trim_start_matches("crate::").to_string());
            }
        }
    }
    map
}

/// Every (importer, imported) pair of files under `root`.
fn imports(root: &Path) -> BTreeSet<(String, String)> {
    let reexports = root_reexports(root);
    let mut all = Vec::new();
    files(root, &mut all);
    let mut edges = BTreeSet::new();
    for f in all {
        let rel = f.strip_prefix(root).expect("under src").to_string_lossy().replace('\\', "/");
        if rel.ends_with("tests.rs") || rel.contains("/tests/") || rel.ends_with("edge_tests.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).expect("a source file");
        let code = code(&text);
        let mut found = paths(&code);
        found.extend(super_paths(&rel, &code));
        found.extend(child_paths(&rel, &code));
        for p in found {
            if let Some(target) = resolve(root, &p, &reexports)
                && target != rel
            {
                edges.insert((rel.clone(), target));
            }
        }
    }
    edges
}

/// The strongly connected components of more than one file (Tarjan's algorithm), each sorted.
fn circles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct Walk<'a> {
        next: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.next[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &v in next.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Pairs of files of one room that import each other.
fn mutual_in_room<'e>(edges: &'e BTreeSet<(String, String)>, room: &str) -> Vec<&'e (String, String)> {
    edges
        .iter()
        .filter(|(a, b)| a.starts_with(room) && b.starts_with(room) && a < b)
        .filter(|(a, b)| edges.contains(&(b.clone(), a.clone())))
        .collect()
}

#[test]
fn layers_point_one_way_and_no_two_core_files_import_each_other() {
    let edges = imports(&src());
    let core = |l: usize| l + 1 < LAYERS.len();
    let mut broken = BTreeSet::new();
    for (from, to) in &edges {
        let (Some((lf, nf)), Some((lt, nt))) = (layer_of(from), layer_of(to)) else { continue };
        if lt > lf {
            broken.insert((from.clone(), to.clone(), format!("{nf} imports {nt}")));
        }
        if core(lf) && core(lt) && from < to && edges.contains(&(to.clone(), from.clone())) {
            broken.insert((from.clone(), to.clone(), "import each other".to_string()));
        }
    }
    for room in ROOMS {
        for (a, b) in mutual_in_room(&edges, room) {
            broken.insert((a.clone(), b.clone(), format!("import each other inside {room}")));
        }
    }
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().map(|(a, b, _)| (*a, *b)).collect();
    let new: Vec<_> = broken.iter().filter(|(a, b, _)| !known.contains(&(a.as_str(), b.as_str()))).collect();
    // The core's circles, once the known imports are out: none may be left. The crate root's own imports
    // are declarations and re-exports, not dependencies: they are left out.
    let core_edges: BTreeSet<(String, String)> = edges
        .iter()
        .filter(|(a, _)| a != "lib.rs")
        .filter(|(a, b)| layer_of(a).is_some_and(|(l, _)| core(l)) && layer_of(b).is_some_and(|(l, _)| core(l)))
        .filter(|(a, b)| !known.contains(&(a.as_str(), b.as_str())))
        .cloned()
        .collect();
    let left = circles(&core_edges);
    let gone: Vec<_> = KNOWN
        .iter()
        .filter(|(a, b, _)| !broken.iter().any(|(x, y, _)| x == a && y == b))
        .filter(|(a, b, _)| {
            // An entry that only breaks a longer circle stays while the circle would come back without it.
            let (a, b) = (a.to_string(), b.to_string());
            let mut with = core_edges.clone();
            if !edges.contains(&(a.clone(), b.clone())) {
                return true;
            }
            with.insert((a.clone(), b.clone()));
            !circles(&with).iter().any(|c| c.contains(&a) && c.contains(&b))
        })
        .collect();
    assert!(new.is_empty(), "imports against the layers (ARCHITECTURE.md):\n{new:#?}");
    let circle_edges: Vec<_> =
        core_edges.iter().filter(|(a, b)| left.iter().any(|c| c.contains(a) && c.contains(b))).collect();
    assert!(left.is_empty(), "files of the core that import each other in a circle:\n{left:#?}\n{circle_edges:#?}");
    assert!(gone.is_empty(), "fixed: remove these from KNOWN:\n{gone:#?}");
}

#[test]
fn no_two_files_of_the_macro_crate_import_each_other() {
    let edges = imports(&macros_src());
    let left = circles(&edges);
    assert!(left.is_empty(), "files of sentinel-macros/src that import each other in a circle:\n{left:#?}");
}

#[test]
fn the_circle_finder_finds_circles_of_two_and_more_and_nothing_else() {
    let edges: BTreeSet<(String, String)> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "e"), ("e", "d"), ("f", "a"), ("c", "g")]
            .iter()
            .map(|(x, y)| (x.to_string(), y.to_string()))
            .collect();
    let mut found = circles(&edges);
    found.sort();
    assert_eq!(found, [vec!["a", "b", "c"], vec!["d", "e"]]);
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
fn the_path_reader_reads_super_paths_from_the_crate_root() {
    assert_eq!(super_paths("a/b.rs", "use super::c::D;"), ["a::c::D"]);
    assert_eq!(super_paths("a/b/mod.rs", "use super::{c, d::E};"), ["a::c", "a::d::E"]);
    assert_eq!(super_paths("a/b/c.rs", "use super::super::x;"), ["a::x"]);
}

#[test]
fn the_path_reader_expands_groups_and_skips_comments() {
    let code = code(
        "// use crate::web::x;\nuse crate::{a::{b, c::D}, e};\nlet x = crate::f::g(); // crate::h\n\
         #[cfg(test)]\nmod tests {\n    fn f() { crate::web::x(); }\n}\n",
    );
    assert_eq!(paths(&code), ["a::b", "a::c::D", "e", "f::g"]);
}
