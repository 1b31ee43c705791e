//! The hot path makes no heap allocation: counted with a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// One test per binary: the allocation counter is process-wide.
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
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..100_000 {
        drop(none.enter().unwrap());
        drop(pass.enter().unwrap());
    }
    let after_pass = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..100_000 {
        assert!(block.enter().is_err());
    }
    let after_block = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(after_pass - before, 0, "allocations on 200k passing entries");
    assert_eq!(after_block - after_pass, 0, "allocations on 100k blocked entries");
}
