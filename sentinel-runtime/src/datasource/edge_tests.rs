//! Rules files at the edges: write-back of what is in force, symbolic links, Kubernetes ConfigMap volumes,
//! half-written YAML and TOML files, a directory deleted and created again, oversized files.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::mpsc;

use super::*;
use crate::Sentinel;

const RULES: &str = r#"{"flowRules": [{"resource": "api", "count": 10}],
 "degradeRules": [{"resource": "db", "grade": 2, "count": 5, "timeWindow": 10}]}"#;
const REFUSED_DEGRADE: &str = r#"{"flowRules": [{"resource": "api", "count": 10}],
 "degradeRules": [{"resource": "db", "grade": 1, "count": 5, "timeWindow": 10}]}"#;

/// Loads the file(s) at `path` into a new engine, as a restart does.
fn restart(path: &Path) -> (Sentinel, Result<Reloaded, SourceError>) {
    let engine = Sentinel::builder().build();
    let r = FileDataSource::new(&engine, path).reload_now();
    (engine, r)
}

fn push_flow(engine: &Sentinel, source: &FileDataSource, count: f64) -> Result<(), WriteError> {
    engine.load_flow_rules(vec![FlowRule::new("api").count(count)]).unwrap();
    source.write_in_force(&[RuleKind::Flow])
}

#[test]
fn a_write_back_replaces_a_refused_edit_of_another_kind_with_the_rules_in_force() {
    for (name, good, refused) in [
        ("rules.json", RULES.to_string(), REFUSED_DEGRADE.to_string()),
        (
            "rules.yaml",
            "flowRules:\n  - resource: api\n    count: 10\ndegradeRules:\n  - resource: db\n    grade: 2\n    count: 5\n    timeWindow: 10\n".to_string(),
            "flowRules:\n  - resource: api\n    count: 10\ndegradeRules:\n  - resource: db\n    grade: 1\n    count: 5\n    timeWindow: 10\n".to_string(),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        fs::write(&file, good).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &file);
        source.reload_now().unwrap();
        fs::write(&file, refused).unwrap();
        assert!(matches!(source.reload_now(), Err(SourceError::Invalid { .. })));
        push_flow(&engine, &source, 3.0).unwrap();
        let (restarted, loaded) = restart(&file);
        assert!(loaded.is_ok(), "{name}: {loaded:?}");
        assert_eq!(restarted.flow_rules(), engine.flow_rules(), "{name}");
        assert_eq!(restarted.degrade_rules(), engine.degrade_rules(), "{name}");
    }
}

#[test]
fn a_directory_write_back_rewrites_a_refused_kind_file_with_the_rules_in_force() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("flow-rules.json"), r#"[{"resource": "api", "count": 10}]"#).unwrap();
    let degrade = dir.path().join("degrade-rules.yaml");
    fs::write(&degrade, "- resource: db\n  grade: 2\n  count: 5\n  timeWindow: 10\n").unwrap();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, dir.path());
    source.reload_now().unwrap();
    fs::write(&degrade, "- resource: db\n  grade: 1\n  count: 5\n  timeWindow: 10\n").unwrap();
    assert!(source.reload_now().is_err());
    push_flow(&engine, &source, 4.0).unwrap();
    let (restarted, loaded) = restart(dir.path());
    assert!(loaded.is_ok(), "{loaded:?}");
    assert_eq!(restarted.flow_rules()[0].count, 4.0);
    assert_eq!(restarted.degrade_rules(), engine.degrade_rules());
}

#[test]
fn a_write_back_over_a_document_that_does_not_parse_is_refused_and_leaves_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    fs::write(&file, RULES).unwrap();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, &file);
    source.reload_now().unwrap();
    fs::write(&file, r#"{"flowRules": [{"resource": "api", "#).unwrap();
    let e = push_flow(&engine, &source, 3.0).unwrap_err();
    assert!(matches!(e, WriteError::Unreadable { .. }), "{e}");
    assert_eq!(fs::read_to_string(&file).unwrap(), r#"{"flowRules": [{"resource": "api", "#);
}

#[test]
fn write_back_goes_through_a_chain_of_relative_and_absolute_links_to_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let (shared, app, etc) = (dir.path().join("shared"), dir.path().join("app"), dir.path().join("etc"));
    for d in [&shared, &app, &etc] {
        fs::create_dir_all(d).unwrap();
    }
    let target = shared.join("rules.json");
    fs::write(&target, RULES).unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
    // etc/rules.json -> ../app/rules.json (relative) -> <abs>/shared/rules.json
    symlink(&target, app.join("rules.json")).unwrap();
    symlink("../app/rules.json", etc.join("rules.json")).unwrap();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, etc.join("rules.json"));
    source.reload_now().unwrap();
    push_flow(&engine, &source, 3.0).unwrap();
    for link in [etc.join("rules.json"), app.join("rules.json")] {
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "{}", link.display());
    }
    assert_eq!(fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o640);
    let (restarted, _) = restart(&target);
    assert_eq!(restarted.flow_rules()[0].count, 3.0);
    assert_eq!(fs::read_dir(&shared).unwrap().count(), 1, "no temporary file is left behind");
}

#[test]
fn a_link_loop_is_a_write_error_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    symlink("b.json", dir.path().join("a.json")).unwrap();
    symlink("a.json", dir.path().join("b.json")).unwrap();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, dir.path().join("a.json"));
    let e = push_flow(&engine, &source, 3.0).unwrap_err();
    assert!(matches!(e, WriteError::Io { .. } | WriteError::Read { .. }), "{e}");
    assert!(fs::symlink_metadata(dir.path().join("a.json")).unwrap().file_type().is_symlink());
}

#[test]
fn yaml_and_toml_files_cut_before_a_required_field_are_refused_and_the_rules_stay() {
    let yaml = "- resource: a\n  count: 100\n- resource: b\n  count: 100\n";
    let toml = "[[rules]]\nresource = \"a\"\ncount = 100\n\n[[rules]]\nresource = \"b\"\ncount = 100\n";
    for (name, full, cuts) in [
        (
            "flow-rules.yaml",
            yaml,
            vec![
                "- resource: a\n  count: 100\n- resource: b\n",
                "- resource: a\n  count: 100\n- resource: b\n  count: ",
                "- resource: a\n  count: 100\n- resource: b\n  cou",
                "- resource: a\n  count: 100\n- resource: ",
                "- resource: a\n  count: 100\n- ",
            ],
        ),
        (
            "flow-rules.toml",
            toml,
            vec![
                "[[rules]]\nresource = \"a\"\ncount = 100\n\n[[rules]]\nresource = \"b\"\n",
                "[[rules]]\nresource = \"a\"\ncount = 100\n\n[[rules]]\n",
                "[[rules]]\nresource = \"a\"\ncount = 100\n\n[[rules]]\nresource = \"b\"\ncount = ",
                "[[rules]]\nresource = \"a\"\ncount = 100\n\n[[ru",
            ],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        fs::write(&file, full).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &file);
        source.reload_now().unwrap();
        for cut in cuts {
            fs::write(&file, cut).unwrap();
            let e = source.reload_now().unwrap_err();
            assert!(matches!(e, SourceError::Parse { .. }), "{name} cut {cut:?}: {e}");
            assert_eq!(engine.flow_rules().iter().map(|r| r.count).collect::<Vec<_>>(), [100.0, 100.0]);
        }
        fs::write(&file, full).unwrap();
        assert_eq!(source.reload_now().unwrap(), Reloaded::Unchanged);
    }
}

#[test]
fn a_yaml_rule_without_count_is_an_error_naming_the_field_while_json_keeps_java_defaults() {
    let e = parse_rules::<FlowRule>("- resource: a\n", Format::Yaml).unwrap_err();
    assert!(e.message.contains("`count`"), "{e}");
    let e = parse_rules::<DegradeRule>("- resource: a\n  count: 3\n", Format::Yaml).unwrap_err();
    assert!(e.message.contains("`timeWindow`"), "{e}");
    let e = parse_rules::<AuthorityRule>("[[rules]]\nresource = \"a\"\n", Format::Toml).unwrap_err();
    assert!(e.message.contains("`limitApp`"), "{e}");
    assert_eq!(parse_rules::<FlowRule>(r#"[{"resource": "a"}]"#, Format::Json).unwrap()[0].count, 0.0);
    assert_eq!(parse_rules::<SystemRule>("- qps: 3\n", Format::Yaml).unwrap().len(), 1);
}

#[test]
fn a_file_over_the_size_cap_is_refused_reported_and_the_rules_stay() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    fs::write(&file, RULES).unwrap();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, &file).with_limits(FileLimits { max_file_bytes: 4096, max_rules: 10 });
    let (tx, rx) = mpsc::channel();
    source.on_reload(move |r| {
        let _ = tx.send(r.clone());
    });
    source.reload_now().unwrap();
    let mut big = RULES.as_bytes().to_vec();
    big.resize(4097, b' ');
    fs::write(&file, &big).unwrap();
    let e = source.reload_now().unwrap_err();
    assert!(matches!(e, SourceError::TooLarge { len: 4097, limit: 4096, .. }), "{e}");
    assert!(matches!(source.last_error(), Some(SourceError::TooLarge { .. })));
    assert!(matches!(rx.try_iter().last(), Some(Err(SourceError::TooLarge { .. }))));
    assert_eq!((engine.flow_rules().len(), engine.degrade_rules().len()), (1, 1));
    // Too many rules, though a small file.
    let many: Vec<String> = (0..11).map(|i| format!(r#"{{"resource":"r{i}","count":1}}"#)).collect();
    fs::write(&file, format!("[{}]", many.join(","))).unwrap();
    let e = FileDataSource::for_kind(&engine, &file, RuleKind::Flow)
        .with_limits(FileLimits { max_file_bytes: 4096, max_rules: 10 })
        .reload_now()
        .unwrap_err();
    assert!(matches!(e, SourceError::TooManyRules { count: 11, limit: 10, .. }), "{e}");
    assert_eq!(engine.flow_rules().len(), 1);
}

#[test]
fn many_duplicate_rules_load_as_one_and_distinct_ones_all_load() {
    let engine = Sentinel::builder().build();
    engine.load_flow_rules((0..50_000).map(|_| FlowRule::new("api").count(5.0))).unwrap();
    assert_eq!(engine.flow_rules().len(), 1);
    // Many distinct rules on one resource, then the same again: states are reused, nothing is lost.
    let rules: Vec<FlowRule> = (0..5_000).map(|i| FlowRule::new("api").count(f64::from(i) + 1.0)).collect();
    engine.load_flow_rules(rules.clone()).unwrap();
    engine.load_flow_rules(rules.iter().rev().cloned()).unwrap();
    assert_eq!(engine.flow_rules().len(), 5_000);
    // 0.0 and -0.0 are the same threshold.
    engine.load_flow_rules([FlowRule::new("a").count(0.0), FlowRule::new("a").count(-0.0)]).unwrap();
    assert_eq!(engine.flow_rules().len(), 1);
    engine
        .load_degrade_rules((0..1000).map(|_| {
            DegradeRule::new("db", crate::circuit_breaker::DegradeGrade::ErrorCount).count(3.0).time_window_sec(5)
        }))
        .unwrap();
    assert_eq!(engine.degrade_rules().len(), 1);
}

/// A file saved with a UTF-8 byte order mark (Windows editors write one): fastjson skips it
/// (`JSONScanner`: `if (ch == 65279) next()`), so Java's `FileRefreshableDataSource` loads the file.
#[test]
fn a_rules_file_saved_with_a_utf8_byte_order_mark_loads_as_java_loads_it() {
    const BOM: &str = "\u{feff}";
    for (name, text) in [
        ("rules.json", RULES.to_string()),
        ("flow-rules.json", r#"[{"resource": "api", "count": 10}]"#.to_string()),
        ("flow-rules.yaml", "- resource: api\n  count: 10\n".to_string()),
        ("flow-rules.toml", "[[rules]]\nresource = \"api\"\ncount = 10\n".to_string()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        fs::write(&file, format!("{BOM}{text}")).unwrap();
        let (engine, loaded) = restart(&file);
        assert!(loaded.is_ok(), "{name}: {loaded:?}");
        assert_eq!(engine.flow_rules()[0].count, 10.0, "{name}");
        // A write-back over it reads what it holds (a combined document keeps its other kinds).
        let source = FileDataSource::new(&engine, &file);
        source.reload_now().unwrap();
        push_flow(&engine, &source, 3.0).unwrap();
        let (restarted, loaded) = restart(&file);
        assert!(loaded.is_ok(), "{name}: {loaded:?}");
        assert_eq!(restarted.flow_rules()[0].count, 3.0, "{name}");
        assert_eq!(restarted.degrade_rules(), engine.degrade_rules(), "{name}");
    }
    // The gateway's files, in a rules directory.
    #[cfg(feature = "tower")]
    {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("flow-rules.json"), format!(r#"{BOM}[{{"resource": "api", "count": 10}}]"#)).unwrap();
        fs::write(
            dir.path().join("gw-flow-rules.json"),
            format!(r#"{BOM}[{{"resource": "route", "resourceMode": 0, "grade": 1, "count": 7, "intervalSec": 1}}]"#),
        )
        .unwrap();
        let (engine, loaded) = restart(dir.path());
        assert!(loaded.is_ok(), "{loaded:?}");
        assert_eq!(engine.gateway_rules().len(), 1);
    }
    // What a store holds (Redis, etcd, ZooKeeper read their entries through `parse_entry`).
    let set = RuleSet::parse_entry(
        Some(RuleKind::Flow),
        &format!(r#"{BOM}[{{"resource": "api", "count": 2}}]"#),
        Format::Json,
    );
    assert_eq!(set.map(|s| s.flow.unwrap_or_default().len()), Ok(1));
    let set = RuleSet::parse(&format!("{BOM}{RULES}"), Format::Json);
    assert_eq!(set.map(|s| s.len()), Ok(2));
}

/// `write_rules` promises that a write that succeeds survives a restart: what it writes must be what the
/// source will read back, so a file (or directory) over the source's own bounds cannot be written.
#[test]
fn a_write_back_over_the_sources_bounds_is_refused_so_that_a_success_always_survives_a_restart() {
    let limits = FileLimits { max_file_bytes: 4096, max_rules: 2 };
    let many = |n: usize| -> Vec<FlowRule> { (0..n).map(|i| FlowRule::new(format!("r{i}")).count(1.0)).collect() };
    // A combined document, a single kind's file, and a directory (whose files count together).
    let dir = tempfile::tempdir().unwrap();
    let combined = dir.path().join("rules.json");
    let single = dir.path().join("flow-rules.json");
    let rules_dir = dir.path().join("rules.d");
    fs::create_dir(&rules_dir).unwrap();
    fs::write(
        rules_dir.join("degrade-rules.json"),
        r#"[{"resource": "db", "grade": 2, "count": 5, "timeWindow": 10}]"#,
    )
    .unwrap();
    for (path, rules) in [(&combined, 3), (&single, 3), (&rules_dir, 2)] {
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, path).with_limits(limits);
        let _ = source.reload_now();
        engine.load_flow_rules(many(rules)).unwrap();
        let written = source.write_in_force(&[RuleKind::Flow]);
        if written.is_ok() {
            let restarted = Sentinel::builder().build();
            let loaded = FileDataSource::new(&restarted, path).with_limits(limits).reload_now();
            panic!("{}: the write succeeded, the restart then loads {loaded:?}", path.display());
        }
        assert!(matches!(&written, Err(WriteError::OverLimit { .. })), "{}: {written:?}", path.display());
    }
    // Bytes: one rule whose text is over the bound.
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, &single).with_limits(limits);
    engine.load_flow_rules([FlowRule::new("x".repeat(5000)).count(1.0)]).unwrap();
    let written = source.write_in_force(&[RuleKind::Flow]);
    assert!(matches!(&written, Err(WriteError::OverLimit { .. })), "a file of more than 4096 bytes: {written:?}");
}

/// A rules file a write-back creates gets the mode any new file gets (0666 less the umask), as Java's
/// `FileWritableDataSource` (a `FileOutputStream`) creates it: other readers of the rules (a sidecar, a Java
/// service under another user) can read it.
#[test]
fn a_rules_file_created_by_a_write_back_gets_the_mode_any_new_file_gets() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    fs::File::create(&probe).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let expected = mode(&probe);
    // A combined document, then a directory's new kind file.
    let file = dir.path().join("rules.json");
    let engine = Sentinel::builder().build();
    push_flow(&engine, &FileDataSource::new(&engine, &file), 3.0).unwrap();
    assert_eq!(format!("{:o}", mode(&file)), format!("{expected:o}"), "rules.json");
    let rules_dir = dir.path().join("rules.d");
    fs::create_dir(&rules_dir).unwrap();
    fs::write(rules_dir.join("degrade-rules.json"), "[]").unwrap();
    push_flow(&engine, &FileDataSource::new(&engine, &rules_dir), 3.0).unwrap();
    let created = rules_dir.join("flow-rules.json");
    assert_eq!(format!("{:o}", mode(&created)), format!("{expected:o}"), "flow-rules.json");
    // An existing file keeps its own mode.
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).unwrap();
    push_flow(&engine, &FileDataSource::new(&engine, &file), 4.0).unwrap();
    assert_eq!(mode(&file), 0o640);
}

/// `status()` says when rules were last loaded (the console's rules page shows it as "last loaded"), for a
/// file source as for the stores.
#[test]
fn a_file_sources_status_says_when_its_rules_were_last_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    fs::write(&file, RULES).unwrap();
    let engine = Sentinel::builder().build();
    let source = FileDataSource::new(&engine, &file);
    assert_eq!(WritableDataSource::status(&source).last_load_ms, None, "never loaded");
    source.reload_now().unwrap();
    let status = WritableDataSource::status(&source);
    assert!(status.last_load_ms.is_some_and(|ms| ms > 0), "{status:?}");
    assert!(status.last_error.is_none());
}

/// A push's write-back that lands after a reload applied another edit of the file: the file then holds the
/// push, and the reload that write triggers must bring the engine to it (Java's poller re-reads the file
/// after `FileWritableDataSource` wrote it), not take the write for what is in force.
#[test]
fn a_write_back_landing_after_a_reload_of_another_edit_is_what_the_engine_ends_with() {
    for name in ["rules.json", "flow-rules.json", "rules.d"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        let file = if name == "rules.d" {
            fs::create_dir(&path).unwrap();
            path.join("flow-rules.json")
        } else {
            path.clone()
        };
        let text = |count: u32| match name {
            "rules.json" => format!(r#"{{"flowRules": [{{"resource": "api", "count": {count}}}]}}"#),
            _ => format!(r#"[{{"resource": "api", "count": {count}}}]"#),
        };
        fs::write(&file, text(1)).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, &path);
        source.reload_now().unwrap();
        // The push: in force, its snapshot taken for the write-back...
        engine.load_flow_rules([FlowRule::new("api").count(5.0)]).unwrap();
        let push = RuleSet::snapshot(&engine, &[RuleKind::Flow]);
        // ... another edit of the file is reloaded before the write-back runs...
        fs::write(&file, text(7)).unwrap();
        source.reload_now().unwrap();
        assert_eq!(engine.flow_rules()[0].count, 7.0);
        // ... then the write-back, and the reload it triggers.
        source.write_rules(&push).unwrap();
        let _ = source.reload_now();
        let (restarted, _) = restart(&path);
        assert_eq!(restarted.flow_rules()[0].count, 5.0, "{name}: the file holds the push");
        assert_eq!(engine.flow_rules(), restarted.flow_rules(), "{name}: the engine runs what the file holds");
    }
}

#[cfg(feature = "file-watch")]
mod watching {
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (at most 10 s) for a reload after which `cond` holds.
    fn reloaded_until(rx: &mpsc::Receiver<()>, cond: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || rx.recv_timeout(left).is_err() {
                return cond();
            }
        }
        true
    }

    fn reloads(source: &FileDataSource) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        source.on_reload(move |_| {
            let _ = tx.send(());
        });
        rx
    }

    fn count(engine: &Sentinel) -> f64 {
        engine.flow_rules().first().map_or(-1.0, |r| r.count)
    }

    fn configmap_version(d: &Path, stamp: &str, count: u32) {
        let v = d.join(format!("..{stamp}"));
        fs::create_dir_all(&v).unwrap();
        fs::write(v.join("rules.json"), format!(r#"{{"flowRules": [{{"resource": "api", "count": {count}}}]}}"#))
            .unwrap();
        symlink(v.file_name().unwrap(), d.join("..data_tmp")).unwrap();
        fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    }

    #[test]
    fn configmap_updates_are_reloaded_twice_in_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        configmap_version(d, "2026_01", 10);
        symlink("..data/rules.json", d.join("rules.json")).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, d.join("rules.json"));
        source.reload_now().unwrap();
        let rx = reloads(&source);
        let _watch = source.watch(Duration::from_millis(20)).unwrap();
        configmap_version(d, "2026_02", 2);
        fs::remove_dir_all(d.join("..2026_01")).unwrap();
        assert!(reloaded_until(&rx, || count(&engine) == 2.0), "count {}", count(&engine));
        configmap_version(d, "2026_03", 7);
        fs::remove_dir_all(d.join("..2026_02")).unwrap();
        assert!(reloaded_until(&rx, || count(&engine) == 7.0), "count {}", count(&engine));
    }

    #[test]
    fn a_rules_file_whose_link_is_repointed_or_whose_target_changes_is_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, app) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("app"));
        for d in [&a, &b, &app] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(a.join("rules.json"), r#"{"flowRules": [{"resource": "api", "count": 1}]}"#).unwrap();
        fs::write(b.join("rules.json"), r#"{"flowRules": [{"resource": "api", "count": 2}]}"#).unwrap();
        symlink("../a/rules.json", app.join("rules.json")).unwrap();
        let engine = Sentinel::builder().build();
        let source = FileDataSource::new(&engine, app.join("rules.json"));
        source.reload_now().unwrap();
        let rx = reloads(&source);
        let _watch = source.watch(Duration::from_millis(20)).unwrap();
        // The target edited in its own directory.
        fs::write(a.join("rules.json"), r#"{"flowRules": [{"resource": "api", "count": 3}]}"#).unwrap();
        assert!(reloaded_until(&rx, || count(&engine) == 3.0), "count {}", count(&engine));
        // The link re-pointed (atomically, by rename).
        symlink("../b/rules.json", app.join("tmp-link")).unwrap();
        fs::rename(app.join("tmp-link"), app.join("rules.json")).unwrap();
        assert!(reloaded_until(&rx, || count(&engine) == 2.0), "count {}", count(&engine));
        // Then the new target edited.
        fs::write(b.join("rules.json"), r#"{"flowRules": [{"resource": "api", "count": 4}]}"#).unwrap();
        assert!(reloaded_until(&rx, || count(&engine) == 4.0), "count {}", count(&engine));
    }

    #[test]
    fn the_watcher_reloads_after_its_directory_is_deleted_and_created_twice() {
        for dir_layout in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let rules_dir = dir.path().join("conf").join("rules.d");
            fs::create_dir_all(&rules_dir).unwrap();
            let file = rules_dir.join("flow-rules.json");
            fs::write(&file, r#"[{"resource": "api", "count": 10}]"#).unwrap();
            let engine = Sentinel::builder().build();
            let source = FileDataSource::new(&engine, if dir_layout { rules_dir.as_path() } else { file.as_path() });
            source.reload_now().unwrap();
            let rx = reloads(&source);
            let _watch = source.watch(Duration::from_millis(20)).unwrap();
            for n in [3.0, 4.0] {
                // The whole parent goes too: the watcher falls back to the nearest ancestor left.
                fs::remove_dir_all(dir.path().join("conf")).unwrap();
                assert!(reloaded_until(&rx, || source.last_error().is_some()), "the removal is reported");
                assert_eq!(engine.flow_rules().len(), 1, "the rules in force stay");
                fs::create_dir_all(&rules_dir).unwrap();
                fs::write(&file, format!(r#"[{{"resource": "api", "count": {n}}}]"#)).unwrap();
                assert!(
                    reloaded_until(&rx, || count(&engine) == n),
                    "layout dir {dir_layout}: count {}",
                    count(&engine)
                );
            }
            // A later edit is still followed.
            fs::write(&file, r#"[{"resource": "api", "count": 5}]"#).unwrap();
            assert!(reloaded_until(&rx, || count(&engine) == 5.0), "count {}", count(&engine));
        }
    }
}
