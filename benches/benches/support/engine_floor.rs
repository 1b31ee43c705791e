//! A model, written by hand, of the least an engine must do for an entry and its exit with one passing QPS
//! rule in the default context, keeping what Sentinel's semantics ask of that call and nothing more (its
//! instructions: the `part-engine-floor` variant of `benches/examples/web_instructions.rs`; its time: the `model` row
//! of `--bench cost`):
//!
//! - the rules are read in a read section, since they can be replaced under running calls: a word of the
//!   thread's own set while the rules are read (a writer that replaces them waits until it is clear, as an
//!   RCU writer does; the writer's side is not modelled);
//! - two clock readings (the call's start and end: its response time);
//! - the engine switched on, and the resource's node linked in the default context's call tree (a flag each,
//!   read);
//! - the rule's exact admission over Sentinel's sliding second (two buckets of 500 ms): the passes of the
//!   buckets still in the second summed, and one compare-and-swap on the current bucket's count;
//! - a pass, then a completion, on the resource's node (`StatNode`'s public API, per thread, merged when
//!   read);
//! - the thread's context: the entry's node installed as the innermost one, so that entries made inside it
//!   are its children, and the outer one put back at its exit;
//! - an entry the caller holds and drops, which exits the call.
//!
//! It leaves out what the engine does besides: contexts by name and their call trees, origins, entries moved
//! between threads or dropped out of order, panics, queueing, the other rule kinds and custom slots.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};

use sentinel_runtime::clock::{Clock, SystemClock};
use sentinel_runtime::stat::StatNode;

/// The rules in force.
struct Rules {
    /// The QPS limit of the one rule.
    limit: u64,
}

/// The model engine: one resource, one rule.
pub struct FloorEngine {
    clock: SystemClock,
    /// Replaced under running calls by a writer (not modelled); read in a read section.
    rules: AtomicPtr<Rules>,
    /// The resource's node in the default context.
    node: StatNode,
    /// The rule's exact admission: two buckets of 500 ms, each its start (high 32 bits, in half-seconds) and
    /// its passes (low 32 bits).
    buckets: [AtomicU64; 2],
    /// Whether the engine checks calls.
    enabled: AtomicBool,
    /// Whether the node is linked in the default context's call tree (done by the first call).
    linked: AtomicBool,
}

/// The threads' read sections: a word each, which a writer would scan.
static READING: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

thread_local! {
    /// This thread's word in `READING` (a `Cell`, as a real engine assigns it at the thread's first call: the
    /// model reads it like one, though every thread here has the first).
    static SLOT: Cell<usize> = const { Cell::new(0) };
    /// The thread's context: its innermost entry's node and the depth of the call tree.
    static CONTEXT: Cell<(*const StatNode, u32)> = const { Cell::new((std::ptr::null(), 0)) };
}

/// A call that passed; dropping it exits the call.
pub struct FloorEntry<'e> {
    engine: &'e FloorEngine,
    start: u64,
    /// The context to put back.
    outer: (*const StatNode, u32),
}

impl FloorEngine {
    /// An engine with one rule of `limit` calls a second, leaked (nothing counts references to it).
    pub fn leaked(limit: u64) -> &'static FloorEngine {
        let rules = Box::into_raw(Box::new(Rules { limit }));
        let engine = FloorEngine {
            clock: SystemClock::new(),
            rules: AtomicPtr::new(rules),
            node: StatNode::new(),
            buckets: [AtomicU64::new(0), AtomicU64::new(0)],
            enabled: AtomicBool::new(true),
            linked: AtomicBool::new(false),
        };
        Box::leak(Box::new(engine))
    }

    /// Enters the resource: the entry, or `None` when the rule blocks the call (or the engine is switched off,
    /// which the model does not tell apart).
    #[inline]
    pub fn enter(&self) -> Option<FloorEntry<'_>> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        if !self.linked.load(Ordering::Relaxed) {
            self.linked.store(true, Ordering::Relaxed);
        }
        let slot = &READING[SLOT.with(Cell::get)];
        slot.store(1, Ordering::Relaxed);
        // The writer's process-wide barrier orders the store above before the loads below.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: the rules are never null, and a writer frees replaced rules only once every read section that
        // may have seen them has ended.
        let rules = unsafe { &*self.rules.load(Ordering::Acquire) };
        let start = self.clock.now_nanos();
        let ms = start / 1_000_000;
        // The half-second's index, kept to 32 bits (compared, never ordered).
        let half = (ms / 500) & 0xffff_ffff;
        let (current, previous) = (&self.buckets[(half & 1) as usize], &self.buckets[(!half & 1) as usize]);
        let count = |word: u64, start: u64| if word >> 32 == start { word & 0xffff_ffff } else { 0 };
        let before = count(previous.load(Ordering::Relaxed), half.wrapping_sub(1) & 0xffff_ffff);
        let mut seen = current.load(Ordering::Relaxed);
        let admitted = loop {
            let passed = count(seen, half);
            if before + passed >= rules.limit {
                break false;
            }
            match current.compare_exchange_weak(seen, half << 32 | (passed + 1), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break true,
                Err(now) => seen = now,
            }
        };
        slot.store(0, Ordering::Release);
        if !admitted {
            return None;
        }
        self.node.on_pass(ms, 1);
        let outer = CONTEXT.with(|c| {
            let outer = c.get();
            c.set((&self.node, outer.1 + 1));
            outer
        });
        Some(FloorEntry { engine: self, start, outer })
    }
}

impl Drop for FloorEntry<'_> {
    #[inline]
    fn drop(&mut self) {
        let end = self.engine.clock.now_nanos();
        let rt_micros = end.saturating_sub(self.start) / 1000;
        self.engine.node.on_complete(end / 1_000_000, rt_micros, 1, false);
        CONTEXT.with(|c| c.set(self.outer));
    }
}
