//! Compile-time tests of `#[sentinel_resource]` (trybuild). `pass/` must compile (and run); each file of `fail/`
//! must fail with exactly its `.stderr`. Regenerate with `TRYBUILD=overwrite` and review every message.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/pass/*.rs");
    t.compile_fail("tests/fail/*.rs");
}
