//! Circuit breakers make no heap allocation on entry and exit, closed, open or probing: counted with a
//! counting global allocator (its own test binary: the counter is process-wide).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
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

#[test]
fn closed_open_and_probing_breakers_allocate_nothing() {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_flow_rules([FlowRule::new("api").count(1e12)]).unwrap();
    engine
        .load_degrade_rules([
            DegradeRule::new("api", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(1),
            DegradeRule::new("api", DegradeGrade::SlowRequestRatio).count(1e6).time_window_sec(1),
            DegradeRule::new("*", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(1),
        ])
        .unwrap();
    let (api, other) = (engine.resource("api"), engine.resource("other"));
    let cycle = |n: usize| {
        for _ in 0..n {
            drop(other.enter().unwrap()); // closed default breaker
            drop(api.enter().unwrap()); // closed
            let mut e = api.enter().unwrap();
            e.set_error(); // trips
            drop(e);
            assert!(api.enter().is_err()); // open
            clock.advance_millis(1_000);
            let mut probe = api.enter().unwrap();
            assert!(api.enter().is_err()); // half-open
            probe.set_error(); // a failed probe re-opens
            drop(probe);
            clock.advance_millis(1_000);
            drop(api.enter().unwrap()); // a fine probe closes
        }
    };
    cycle(100); // warm up: nodes, thread-locals
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    cycle(10_000);
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed) - before, 0, "allocations in 10k breaker cycles");
}
