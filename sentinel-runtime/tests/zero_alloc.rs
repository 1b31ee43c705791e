//! The hot path makes no heap allocation: counted with a counting global allocator.

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

// The counter is per thread: the clock ticker and other threads do not count.
#[test]
fn entry_and_exit_allocate_nothing() {
    let engine = Sentinel::builder().build();
    engine.load_flow_rules([FlowRule::new("pass").count(1e12), FlowRule::new("block").count(0.0)]).unwrap();
    let (none, pass, block) = (engine.resource("none"), engine.resource("pass"), engine.resource("block"));
    // Warm up: first use creates nodes and thread-locals.
    for _ in 0..1000 {
        drop(none.enter());
        drop(pass.enter());
        drop(block.enter());
    }
    let before = allocations();
    for _ in 0..100_000 {
        drop(none.enter().unwrap());
        drop(pass.enter().unwrap());
    }
    let after_pass = allocations();
    for _ in 0..100_000 {
        assert!(block.enter().is_err());
    }
    let after_block = allocations();
    assert_eq!(after_pass - before, 0, "allocations on 200k passing entries");
    assert_eq!(after_block - after_pass, 0, "allocations on 100k blocked entries");
}
