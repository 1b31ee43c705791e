//! Compile-time tests of `#[sentinel_resource]` (trybuild): each file of `fail/` must fail with exactly its
//! `.stderr`. Regenerate with `TRYBUILD=overwrite` and review every message. The files of `pass/`, which must
//! compile and run, are test targets of their own (`Cargo.toml`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/fail/*.rs");
}

/// Every file of `pass/` is a test target of `Cargo.toml` (a file without one would never be built).
#[test]
fn every_pass_case_is_a_test_target() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("the package's manifest");
    let mut cases: Vec<String> = std::fs::read_dir(dir.join("tests/pass"))
        .expect("tests/pass")
        .map(|e| e.expect("an entry of tests/pass").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rs"))
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no pass case found");
    let missing: Vec<&String> =
        cases.iter().filter(|name| !manifest.contains(&format!("path = \"tests/pass/{name}\""))).collect();
    assert!(missing.is_empty(), "pass cases without a [[test]] target (harness = false) in Cargo.toml: {missing:?}");
}
