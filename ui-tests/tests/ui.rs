//! Compile-time tests of `#[sentinel_resource]` (trybuild): each file of `fail/` must fail with exactly its
//! `.stderr`. Regenerate with `TRYBUILD=overwrite` and review every message. The files of `pass/`, which must
//! compile and run, are test targets of their own (`Cargo.toml`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/fail/*.rs");
}
