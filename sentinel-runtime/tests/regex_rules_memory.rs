//! What regex resource rules make the application hold once names are matched against them: measured with a
//! global allocator that counts the bytes live (its own test binary, so nothing else shares the count).

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

#[path = "support/live_bytes.rs"]
mod live_bytes;
use live_bytes::{live, MIB};

/// The 16 MiB bound counts each pattern's compiled program (`memory_usage`), not the lazy DFA cache each
/// compiled regex grows as names are matched (up to its 1 MiB `dfa_size_limit`, per regex): a load of small
/// patterns with a large DFA passes the bound and, once client-chosen names are matched against them, holds
/// about 1 MiB per pattern.
#[test]
fn matching_names_against_a_load_of_regex_rules_holds_no_more_than_its_bound() {
    let engine = Sentinel::builder().build();
    let n = 64;
    let rules: Vec<FlowRule> =
        (1..=n).map(|i| FlowRule::new(format!("[ab]*a[ab]{{16}}x{{0,{i}}}")).regex(true).count(1.0)).collect();
    let before = live();
    engine.load_flow_rules(rules).unwrap();
    let loaded = live() - before;
    // Names a client may choose (a path, a search term), each matched against every pattern.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..4 {
        let name: String = (0..30_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x & 1 == 0 {
                    'a'
                } else {
                    'b'
                }
            })
            .collect();
        engine.has_rules_for(&name);
    }
    let held = live() - before;
    assert!(
        held < 2 * 16 * MIB,
        "a load of {n} patterns held {} KiB compiled, and {} MiB once names were matched",
        loaded / 1024,
        held / MIB
    );
}
