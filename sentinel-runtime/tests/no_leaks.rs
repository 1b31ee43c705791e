//! Nothing an engine allocated outlives it (issue 10 §5): a resource entered inside itself (recursion) used to
//! link its node to itself with a strong reference, a cycle that leaked every node of the chain.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::Sentinel;

/// Counts the bytes this thread holds (allocated minus freed).
struct LiveBytes;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn live() -> isize {
    LIVE.with(|c| c.get())
}

unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + layout.size() as isize));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|c| c.set(c.get() - layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + new_size as isize - layout.size() as isize));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

/// An engine with recursive and mutually recursive calls, its tree read, then dropped.
fn recursive_calls_then_drop() {
    let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_700_000_000_000)).build();
    engine.load_flow_rules([FlowRule::new("a").count(1e9)]).unwrap();
    let (a, b) = (engine.resource("a"), engine.resource("b"));
    {
        let _a1 = a.enter().unwrap();
        let _a2 = a.enter().unwrap();
        let _b1 = b.enter().unwrap();
        let _a3 = a.enter().unwrap();
    }
    {
        let _ctx = engine.enter_context("web", "appA").unwrap();
        let _b1 = b.enter().unwrap();
        let _a1 = a.enter().unwrap();
        let _b2 = b.enter().unwrap();
    }
    assert!(!engine.tree().is_empty());
    drop((a, b));
    drop(engine);
}

#[test]
fn recursive_entries_leave_nothing_allocated_after_the_engine_drops() {
    // The first run creates this thread's lasting state (stripe lease, thread-locals, lazily built globals).
    recursive_calls_then_drop();
    let before = live();
    for _ in 0..3 {
        recursive_calls_then_drop();
    }
    assert_eq!(live() - before, 0, "bytes still held after three engines were dropped");
}
