//! Read-mostly pointers whose readers execute no locked instruction: the rules of a resource are read on every
//! entry (and at exit when it has circuit breakers) and replaced only when rules are loaded.
//!
//! # Protocol
//!
//! A reader loads the global phase (1 or 2), stores it as the mark of its stripe's slot, runs the light side
//! of an asymmetric fence, reads the pointer, and clears the mark when the section ends. Nested sections keep
//! the outer mark. Threads beyond the number of owned stripes count their sections in one of two shared
//! counters (one per phase) with atomic read-modify-writes instead of a mark.
//!
//! A writer publishes the new pointer, then runs a grace period, after which the old values may be freed. A
//! grace period is **two** flips: each flip stores the other phase, runs the heavy side of the fence, and waits
//! until no slot shows (and no shared counter counts) the phase it flipped away from.
//!
//! The asymmetric fence: on the reader's side a compiler fence; on the writer's side a process-wide barrier
//! (Linux `membarrier`, private expedited), which runs a full fence on every CPU that runs a thread of the
//! process. Together they order like a full fence on both sides: for the pattern "reader stores its mark, then
//! loads the pointer" against "writer stores the phase (after the pointer), then loads the marks", at least one
//! of the two loads sees the other side's store (the store-buffering litmus test forbids both missing).
//! Where the barrier is unavailable, or switched off (`SENTINEL_MEMBARRIER=off`, read once), readers and
//! writers both run full fences. If the barrier fails after readers came to rely on it, readers are switched
//! to full fences and the writer retries the barrier (falling back to the kernel's global barrier) until one
//! succeeds, so that no section that relied on a compiler fence alone is left unordered; this is logged once.
//!
//! # Why no reader that can still see an old pointer is missed
//!
//! Let `W` be a writer that unpublished pointer `P` (its swap happens before its first flip) and `R` a read
//! section that loads `P`. Take `W`'s flip that waits for the phase `q` that `R` marked (of its two flips, one
//! flips from `q` to the other phase, whatever the phase was when `W` began: the flips alternate). That flip
//! stored the other phase after the swap, ran the heavy fence, and then scanned the slots.
//!
//! - If the scan saw `R`'s mark, `W` waits for `R`'s section to end before it frees `P`.
//! - If the scan missed `R`'s mark, apply the store-buffering argument to `W: swap the pointer; heavy fence;
//!   load R's slot` against `R: store the mark; light fence; load the pointer`: since `W`'s load missed `R`'s
//!   store, `R`'s load sees `W`'s swap or a later store, that is the new pointer or a later one, never `P`.
//!   Contradiction. (The phase itself only lets `W` stop waiting: sections that start after a flip mark the
//!   new phase.)
//!
//! The marks are read with acquire and cleared with release, so everything `R` did inside its section happens
//! before `W` frees what it read. A reader preempted between loading the phase and storing its mark (a
//! "stale" mark, possibly of a phase several flips old) is covered by the same argument: only the order of its
//! mark store and pointer load matters, and every grace period waits for both phases in turn. With a single flip
//! per grace period this fails: a reader that loaded phase 1 before writer `A` flipped to 2, and stored its
//! mark after `A`'s scan, holds `A`'s new pointer with a mark of 1; writer `B` then flips 2 → 1, waits only for
//! marks of 2, and frees what the reader holds (the `stale_phase_*` tests reproduce it with a hook between
//! the phase load and the mark store, and `model` checks both protocols over every interleaving).
//!
//! The shared counters follow the same argument with the counter increment as the mark store.

use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, Once};

use crossbeam_utils::CachePadded;

use crate::stat::stripe::{self, MAX_OWNED};

/// Owned stripes' marks: 0 when idle, else the phase (1 or 2) the read section started in.
static SLOTS: [CachePadded<AtomicU64>; MAX_OWNED] = [const { CachePadded::new(AtomicU64::new(0)) }; MAX_OWNED];
/// Read sections of threads on the shared stripe, per phase.
static SHARED: [CachePadded<AtomicU64>; 2] = [const { CachePadded::new(AtomicU64::new(0)) }; 2];
/// The phase new read sections start in: 1 or 2.
static PHASE: AtomicU64 = AtomicU64::new(1);
/// Serializes writers' grace periods.
static WRITERS: Mutex<()> = Mutex::new(());

/// Not decided yet: the first fence decides (readers use full fences until then).
const MODE_UNSET: u8 = 0;
/// The process-wide barrier is registered: readers use compiler fences.
const MODE_EXPEDITED: u8 = 1;
/// No process-wide barrier (unavailable, switched off, or failed): full fences on both sides.
const MODE_FENCE: u8 = 2;

/// How the asymmetric fence is implemented in this process.
static MODE: AtomicU8 = AtomicU8::new(MODE_UNSET);

/// Decides the mode once: registers for the process-wide barrier unless `SENTINEL_MEMBARRIER=off`.
fn init_mode() -> u8 {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let off = std::env::var("SENTINEL_MEMBARRIER").is_ok_and(|v| matches!(v.as_str(), "off" | "0" | "false"));
        let mode = if off || !register() { MODE_FENCE } else { MODE_EXPEDITED };
        // The mode first: the log below runs the application's subscriber.
        MODE.store(mode, Ordering::SeqCst);
        if off {
            log_contained(|| tracing::info!("SENTINEL_MEMBARRIER=off: rule reads and exact limits use full fences"));
        } else if mode == MODE_FENCE {
            log_contained(|| {
                tracing::info!("the process-wide memory barrier (membarrier) is unavailable: using full fences")
            });
        }
    });
    MODE.load(Ordering::SeqCst)
}

#[inline(always)]
fn mode() -> u8 {
    match MODE.load(Ordering::Relaxed) {
        MODE_UNSET => init_mode(),
        m => m,
    }
}

#[cfg(target_os = "linux")]
fn register() -> bool {
    use rustix::thread::{membarrier, MembarrierCommand};
    membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn register() -> bool {
    false
}

/// One process-wide barrier: `Ok` when it ran on every CPU running a thread of this process.
#[cfg(target_os = "linux")]
fn process_barrier(global: bool) -> Result<(), String> {
    use rustix::thread::{membarrier, MembarrierCommand};
    #[cfg(test)]
    if test_hooks::FAIL_BARRIERS.load(Ordering::SeqCst) > 0 {
        test_hooks::FAIL_BARRIERS.fetch_sub(1, Ordering::SeqCst);
        return Err("injected failure (test)".into());
    }
    let cmd = if global { MembarrierCommand::Global } else { MembarrierCommand::PrivateExpedited };
    membarrier(cmd).map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn process_barrier(_global: bool) -> Result<(), String> {
    Err("no process-wide barrier on this platform".into())
}

/// The fast side of the asymmetric fence (a compiler fence when the process-wide barrier is in use): orders
/// this thread's earlier stores before its later loads with respect to any thread that runs [`heavy`].
#[inline(always)]
pub(crate) fn light() {
    if MODE.load(Ordering::Relaxed) == MODE_EXPEDITED {
        compiler_fence(Ordering::SeqCst);
    } else {
        light_slow();
    }
}

#[cold]
fn light_slow() {
    let _ = mode();
    // Until the mode is decided, and always without the process-wide barrier: a full fence.
    fence(Ordering::SeqCst);
}

/// The slow side of the asymmetric fence: a full barrier on every thread of the process (microseconds).
pub(crate) fn heavy() {
    if mode() == MODE_EXPEDITED {
        match process_barrier(false) {
            Ok(()) => return,
            Err(e) => degrade(&e),
        }
    }
    fence(Ordering::SeqCst);
}

/// The barrier failed while readers rely on it: switch every reader to full fences, then run barriers until one
/// succeeds, so that the sections that started with a compiler fence alone are ordered too.
#[cold]
fn degrade(error: &str) {
    MODE.store(MODE_FENCE, Ordering::SeqCst);
    let mut backoff = std::time::Duration::from_micros(50);
    loop {
        // Either barrier orders every CPU running a thread of the process after the mode store above: from
        // then on every section runs full fences, and those that did not are ordered by this barrier.
        if process_barrier(false).is_ok() || process_barrier(true).is_ok() {
            break;
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(std::time::Duration::from_millis(100));
    }
    // Logged once the readers are safe again, and contained: the caller may hold an exact limit's pool
    // closed or its stripes claimed, which a panic unwinding from here would leave so for every other thread.
    if !DEGRADE_LOGGED.swap(true, Ordering::Relaxed) {
        log_contained(|| {
            tracing::error!(
                error,
                "the process-wide memory barrier failed; switching rule reads and exact limits to full fences"
            )
        });
    }
}

/// Whether [`degrade`] logged (once per process).
static DEGRADE_LOGGED: AtomicBool = AtomicBool::new(false);

/// Runs `log` (a `tracing` event, which calls the application's subscriber) without letting a panic in it
/// unwind into the caller: the barriers and the mode's first decision run inside read sections, rule
/// writers' grace periods and exact limits' bucket closes, whose state must not be left half-changed. A
/// panicking subscriber loses the one event; the panic hook still reports it.
#[cold]
fn log_contained(log: impl FnOnce()) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(log));
}

/// Marks a read section on this thread's stripe; clears it on drop (also on unwind).
pub(crate) struct ReadGuard {
    slot: Slot,
}

enum Slot {
    Owned { index: usize, prev: u64 },
    Shared { phase: usize },
}

impl ReadGuard {
    #[inline(always)]
    pub(crate) fn enter() -> ReadGuard {
        let lease = stripe::lease();
        // Acquire: a section that sees the new phase (and so is not waited for by the flip that stored it)
        // also sees the pointers that writer published before flipping.
        let phase = PHASE.load(Ordering::Acquire);
        #[cfg(test)]
        test_hooks::after_phase_load();
        if lease.exclusive {
            let s = &SLOTS[lease.index];
            let prev = s.load(Ordering::Relaxed);
            if prev == 0 {
                s.store(phase, Ordering::Relaxed);
            }
            light();
            ReadGuard { slot: Slot::Owned { index: lease.index, prev } }
        } else {
            let p = (phase - 1) as usize & 1;
            SHARED[p].fetch_add(1, Ordering::SeqCst);
            light();
            SHARED_DEPTH.with(|d| d.set(d.get() + 1));
            ReadGuard { slot: Slot::Shared { phase: p } }
        }
    }

    /// The stripe lease of the thread that entered this section (read when it entered).
    #[inline(always)]
    pub(crate) fn lease(&self) -> stripe::Lease {
        match self.slot {
            Slot::Owned { index, .. } => stripe::Lease { index, exclusive: true },
            Slot::Shared { .. } => stripe::Lease::shared(),
        }
    }

    /// Reads `ptr` inside this section.
    #[inline(always)]
    pub(crate) fn load<'g, T>(&'g self, ptr: &AtomicPtr<T>) -> &'g T {
        // SAFETY: pointers published in an `RcuPtr` are never null and are freed only after a grace period,
        // which waits for this section to end (see the module docs for the argument).
        unsafe { &*ptr.load(Ordering::Acquire) }
    }
}

impl Drop for ReadGuard {
    #[inline(always)]
    fn drop(&mut self) {
        match self.slot {
            Slot::Owned { index, prev } => {
                if prev == 0 {
                    SLOTS[index].store(0, Ordering::Release);
                }
            }
            Slot::Shared { phase } => {
                SHARED[phase].fetch_sub(1, Ordering::Release);
                SHARED_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
            }
        }
    }
}

thread_local! {
    /// Read sections this thread has open on the shared stripe (owned stripes tell it by their mark).
    static SHARED_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is inside a read section (it cannot wait for a grace period: it would wait for itself).
fn in_read_section() -> bool {
    let lease = stripe::lease();
    if lease.exclusive {
        SLOTS[lease.index].load(Ordering::Relaxed) != 0
    } else {
        SHARED_DEPTH.with(|d| d.get()) > 0
    }
}

type Deferred = Vec<Box<dyn Send>>;

/// Values retired by threads inside a read section (e.g. rules loaded by a circuit breaker observer, which
/// runs at exit inside the section that reads the breakers): freed after the next grace period.
static DEFERRED: Mutex<Deferred> = Mutex::new(Vec::new());

/// Waits until every read section that could have seen pointers unpublished before this call has ended: two
/// flips of the phase (see the module docs for why one is not enough).
pub(crate) fn synchronize() {
    #[cfg(not(test))]
    let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
    // A writer that waits for another's grace period says so too: a test that stops a reader in its section
    // until its writer waits must not wait for a grace period of a test running beside it, which waits for
    // that reader (the two tests would wait for each other).
    #[cfg(test)]
    let _w = match WRITERS.try_lock() {
        Ok(w) => w,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            test_hooks::writer_waits();
            WRITERS.lock().unwrap_or_else(|e| e.into_inner())
        }
    };
    flip_and_wait();
    #[cfg(test)]
    test_hooks::between_flips();
    flip_and_wait();
    fence(Ordering::SeqCst);
}

/// Stores the other phase, runs the heavy fence, and waits until no section of the old phase remains.
fn flip_and_wait() {
    let old = PHASE.load(Ordering::Relaxed);
    let new = if old == 1 { 2 } else { 1 };
    PHASE.store(new, Ordering::SeqCst);
    heavy();
    let shared = &SHARED[(old - 1) as usize & 1];
    let mut spins = 0u32;
    for s in SLOTS.iter().chain(std::iter::once(shared)) {
        let is_shared = std::ptr::eq(s, shared);
        let mut reported = false;
        loop {
            let v = s.load(Ordering::Acquire);
            let busy = if is_shared { v != 0 } else { v == old };
            if !busy {
                break;
            }
            #[cfg(test)]
            if !reported {
                test_hooks::writer_waits();
            }
            reported = true;
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let _ = reported;
    }
}

/// A pointer to a boxed `T` that readers load inside a [`ReadGuard`] section.
pub(crate) struct RcuPtr<T> {
    ptr: AtomicPtr<T>,
}

impl<T> RcuPtr<T> {
    pub(crate) fn new(value: T) -> Self {
        RcuPtr { ptr: AtomicPtr::new(Box::into_raw(Box::new(value))) }
    }

    /// Runs `f` on the current value.
    #[inline(always)]
    pub(crate) fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let g = ReadGuard::enter();
        f(g.load(&self.ptr))
    }

    /// Publishes `value`; returns the previous value, to be dropped only after [`synchronize`].
    #[must_use = "the old value must outlive a grace period: pass it to `Retired`"]
    pub(crate) fn replace(&self, value: T) -> Retired<T> {
        let old = self.ptr.swap(Box::into_raw(Box::new(value)), Ordering::AcqRel);
        // SAFETY: `old` came from `Box::into_raw` and is no longer reachable through `ptr`.
        Retired { _value: unsafe { Box::from_raw(old) } }
    }
}

impl<T: Default> Default for RcuPtr<T> {
    fn default() -> Self {
        RcuPtr::new(T::default())
    }
}

impl<T> Drop for RcuPtr<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader can be in a section on this pointer.
        drop(unsafe { Box::from_raw(*self.ptr.get_mut()) });
    }
}

/// A value unpublished from an [`RcuPtr`]: drop it after [`synchronize`] (readers may still hold it before).
pub(crate) struct Retired<T> {
    _value: Box<T>,
}

/// Drops `value` after a grace period (after a later one, with the values deferred there, when this thread is
/// inside a read section): for a value that read sections may still reach although no pointer publishes it.
pub(crate) fn retire_boxed<T: Send + 'static>(value: Box<T>) {
    let mut batch = RetireBatch::new();
    batch.push(Retired { _value: value });
}

/// Values waiting for a grace period; dropping the batch runs one grace period and then frees them.
pub(crate) struct RetireBatch<T: Send + 'static> {
    items: Vec<Retired<T>>,
}

impl<T: Send + 'static> RetireBatch<T> {
    pub(crate) fn new() -> Self {
        RetireBatch { items: Vec::new() }
    }
    pub(crate) fn push(&mut self, r: Retired<T>) {
        self.items.push(r);
    }
}

impl<T: Send + 'static> Drop for RetireBatch<T> {
    fn drop(&mut self) {
        if self.items.is_empty() {
            return;
        }
        if in_read_section() {
            // Waiting here would wait for this thread's own section: free them after a later grace period.
            let mut d = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
            d.extend(self.items.drain(..).map(|r| Box::new(r) as Box<dyn Send>));
            return;
        }
        let deferred = std::mem::take(&mut *DEFERRED.lock().unwrap_or_else(|e| e.into_inner()));
        synchronize();
        self.items.clear();
        drop(deferred);
    }
}

/// An exhaustive check of the grace-period protocol: every interleaving of a few readers and writers, each step
/// one atomic access, under sequential consistency (which the fence pairs of the real code provide for the
/// accesses that matter: see the module docs). It finds the use after free of one flip per grace period and
/// proves two flips free of it, for readers on owned stripes (marks) and on the shared stripe (counters).
#[cfg(test)]
mod model {
    use std::collections::HashSet;

    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    struct Reader {
        shared: bool,
        pc: u8,
        phase: u8,
        value: u8,
        sections_left: u8,
    }

    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    struct Writer {
        pc: u8,
        new: u8,
        old: u8,
        flip: u8,
        from: u8,
        scan: u8,
    }

    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct State {
        phase: u8,
        ptr: u8,
        /// Bit v: value v was freed.
        freed: u16,
        marks: Vec<u8>,
        shared: [u8; 2],
        lock: bool,
        readers: Vec<Reader>,
        writers: Vec<Writer>,
    }

    /// Explores every interleaving; returns a trace (thread indices) to a read of a freed value, if any.
    pub(super) fn find_use_after_free(
        flips: u8,
        shared_readers: &[bool],
        sections: u8,
        writers: u8,
    ) -> Option<Vec<usize>> {
        let init = State {
            phase: 1,
            ptr: 0,
            freed: 0,
            marks: vec![0; shared_readers.len()],
            shared: [0, 0],
            lock: false,
            readers: shared_readers
                .iter()
                .map(|&shared| Reader { shared, pc: 0, phase: 0, value: 0, sections_left: sections })
                .collect(),
            writers: (0..writers).map(|i| Writer { pc: 0, new: i + 1, old: 0, flip: 0, from: 0, scan: 0 }).collect(),
        };
        let mut seen = HashSet::new();
        let mut stack = vec![(init, Vec::new())];
        while let Some((state, trace)) = stack.pop() {
            if !seen.insert(state.clone()) {
                continue;
            }
            let threads = state.readers.len() + state.writers.len();
            for t in 0..threads {
                let mut next = state.clone();
                match step(&mut next, t, flips) {
                    Step::Blocked => {}
                    Step::Moved => {
                        let mut tr = trace.clone();
                        tr.push(t);
                        stack.push((next, tr));
                    }
                    Step::UseAfterFree => {
                        let mut tr = trace.clone();
                        tr.push(t);
                        return Some(tr);
                    }
                }
            }
        }
        None
    }

    enum Step {
        Moved,
        Blocked,
        UseAfterFree,
    }

    fn step(s: &mut State, t: usize, flips: u8) -> Step {
        let nr = s.readers.len();
        if t < nr {
            let r = &mut s.readers[t];
            match r.pc {
                0 if r.sections_left > 0 => {
                    r.phase = s.phase;
                    r.pc = 1;
                }
                1 => {
                    if r.shared {
                        s.shared[(r.phase - 1) as usize] += 1;
                    } else {
                        s.marks[t] = r.phase;
                    }
                    r.pc = 2;
                }
                2 => {
                    r.value = s.ptr;
                    r.pc = 3;
                }
                3 => {
                    if s.freed & (1 << r.value) != 0 {
                        return Step::UseAfterFree;
                    }
                    r.pc = 4;
                }
                4 => {
                    if r.shared {
                        s.shared[(r.phase - 1) as usize] -= 1;
                    } else {
                        s.marks[t] = 0;
                    }
                    r.sections_left -= 1;
                    r.pc = 0;
                }
                _ => return Step::Blocked,
            }
            return Step::Moved;
        }
        let readers = s.readers.clone();
        let w = &mut s.writers[t - nr];
        match w.pc {
            // Publish the new value (before the grace period, as `RcuPtr::replace`).
            0 => {
                w.old = s.ptr;
                s.ptr = w.new;
                w.pc = 1;
            }
            // Grace periods are serialized.
            1 if !s.lock => {
                s.lock = true;
                w.pc = 2;
            }
            // A flip.
            2 => {
                w.from = s.phase;
                s.phase = 3 - s.phase;
                w.scan = 0;
                w.pc = 3;
            }
            // Scan one reader's mark (or the shared counter of the old phase).
            3 => {
                let i = w.scan as usize;
                if i < readers.len() {
                    let busy =
                        if readers[i].shared { s.shared[(w.from - 1) as usize] != 0 } else { s.marks[i] == w.from };
                    if busy {
                        return Step::Blocked;
                    }
                    w.scan += 1;
                } else {
                    w.flip += 1;
                    w.pc = if w.flip < flips { 2 } else { 4 };
                }
            }
            // Free the unpublished value.
            4 => {
                s.freed |= 1 << w.old;
                s.lock = false;
                w.pc = 5;
            }
            _ => return Step::Blocked,
        }
        Step::Moved
    }
}

#[cfg(test)]
mod model_tests {
    use super::model::find_use_after_free;

    #[test]
    fn model_one_flip_per_grace_period_frees_what_a_stale_reader_holds() {
        let trace = find_use_after_free(1, &[false], 1, 2);
        assert!(trace.is_some(), "the single-flip protocol has the stale-phase use after free");
        assert!(find_use_after_free(1, &[true], 1, 2).is_some(), "also on the shared stripe");
    }

    #[test]
    fn model_two_flips_per_grace_period_never_free_what_a_reader_holds() {
        for readers in [&[false][..], &[true], &[false, false], &[false, true], &[true, true]] {
            for sections in 1..=2 {
                assert_eq!(
                    find_use_after_free(2, readers, sections, 2),
                    None,
                    "readers {readers:?}, {sections} sections"
                );
            }
        }
        assert_eq!(find_use_after_free(2, &[true], 1, 3), None, "three writers");
        assert_eq!(find_use_after_free(2, &[false], 2, 3), None, "three writers");
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only points where a test makes a thread stop, to force an interleaving (a preemption there).
    use std::cell::RefCell;
    use std::sync::atomic::AtomicU32;

    /// A test-only stopping point: runs once on the thread that set it.
    pub(crate) type Hook = RefCell<Option<Box<dyn FnMut()>>>;

    thread_local! {
        /// Runs once on this thread between a reader's phase load and its mark.
        pub(crate) static AFTER_PHASE_LOAD: Hook = const { RefCell::new(None) };
        /// Runs once on this thread when its grace period first finds a section it has to wait for, or
        /// another grace period it has to wait for.
        pub(crate) static WRITER_WAITS: Hook = const { RefCell::new(None) };
        /// Runs once on this thread between the two flips of its grace period.
        pub(crate) static BETWEEN_FLIPS: Hook = const { RefCell::new(None) };
    }

    /// Process-wide barriers that fail (pretend to) before the next one succeeds.
    pub(crate) static FAIL_BARRIERS: AtomicU32 = AtomicU32::new(0);

    pub(crate) fn run(hook: &'static std::thread::LocalKey<Hook>) {
        // `try_with`: a section may run while thread-locals are torn down.
        if let Ok(Some(mut f)) = hook.try_with(|h| h.borrow_mut().take()) {
            f();
        }
    }
    pub(crate) fn after_phase_load() {
        run(&AFTER_PHASE_LOAD);
    }
    pub(crate) fn writer_waits() {
        run(&WRITER_WAITS);
    }
    pub(crate) fn between_flips() {
        run(&BETWEEN_FLIPS);
    }
    /// Sets `hook` on this thread.
    pub(crate) fn set(hook: &'static std::thread::LocalKey<Hook>, f: impl FnMut() + 'static) {
        hook.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    /// The addresses of what threads are waiting for now (a lock), for a test that lets a stopped thread go
    /// once another thread waits: a set, so that waits of tests running beside it, on other things, neither
    /// hide nor fake this one.
    pub(crate) struct Waiters(std::sync::Mutex<Vec<usize>>);

    impl Waiters {
        pub(crate) const fn new() -> Self {
            Waiters(std::sync::Mutex::new(Vec::new()))
        }
        fn list(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
        /// A thread is about to wait for what is at `at`.
        pub(crate) fn arrive(&self, at: usize) {
            self.list().push(at);
        }
        /// It waits no more.
        pub(crate) fn leave(&self, at: usize) {
            let mut list = self.list();
            if let Some(i) = list.iter().position(|&a| a == at) {
                list.swap_remove(i);
            }
        }
        /// Whether a thread waits for what is at `at`.
        pub(crate) fn has(&self, at: usize) -> bool {
            self.list().contains(&at)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    struct Counted(Arc<AtomicUsize>, u64);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn old_values_are_freed_after_the_grace_period_and_readers_see_a_whole_value() {
        let freed = Arc::new(AtomicUsize::new(0));
        let p = Arc::new(RcuPtr::new(Counted(freed.clone(), 0)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (p, stop) = (p.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seen = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        p.read(|v| {
                            // A freed value would have been overwritten by the allocator or show a lower value.
                            assert!(v.1 >= seen);
                            seen = v.1;
                        });
                    }
                    seen
                })
            })
            .collect();
        for i in 1..=200u64 {
            let mut batch = RetireBatch::new();
            batch.push(p.replace(Counted(freed.clone(), i)));
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().expect("reader") <= 200);
        }
        assert_eq!(freed.load(Ordering::SeqCst), 200);
        p.read(|v| assert_eq!(v.1, 200));
    }

    #[test]
    fn a_writer_inside_a_read_section_defers_instead_of_waiting_for_itself() {
        let freed = Arc::new(AtomicUsize::new(0));
        let p = RcuPtr::new(Counted(freed.clone(), 1));
        p.read(|v| {
            let mut batch = RetireBatch::new();
            batch.push(p.replace(Counted(freed.clone(), 2)));
            drop(batch); // must not deadlock
            assert_eq!(v.1, 1, "the value this section reads is still alive");
            assert_eq!(freed.load(Ordering::SeqCst), 0);
        });
        // The next grace period outside a section frees it.
        let mut batch = RetireBatch::new();
        batch.push(p.replace(Counted(freed.clone(), 3)));
        drop(batch);
        // Another test's grace period may have taken the deferred value: it frees it when that period ends.
        let mut rounds = 0;
        while freed.load(Ordering::SeqCst) < 2 && rounds < 10_000 {
            synchronize();
            std::thread::yield_now();
            rounds += 1;
        }
        assert_eq!(freed.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn nested_sections_keep_the_outer_mark() {
        let p = RcuPtr::new(7u64);
        let outer = ReadGuard::enter();
        {
            let inner = ReadGuard::enter();
            assert_eq!(*inner.load(&p.ptr), 7);
        }
        let lease = stripe::lease();
        if lease.exclusive {
            assert_ne!(SLOTS[lease.index].load(Ordering::Relaxed), 0, "the inner exit must not clear the mark");
        }
        assert_eq!(*outer.load(&p.ptr), 7);
    }

    // ---- Forced interleavings: a reader stopped between its phase load and its mark ----

    use super::test_hooks::{AFTER_PHASE_LOAD, BETWEEN_FLIPS, WRITER_WAITS};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Where the reader stops, relative to writer A's grace period.
    #[derive(Clone, Copy, Debug)]
    enum StaleAt {
        /// It loads the phase before writer A's grace period and marks it after.
        BeforeGracePeriod,
        /// It loads the phase between writer A's two flips and marks it after the second.
        BetweenFlips,
    }

    fn retire(p: &RcuPtr<Counted>, freed: &Arc<AtomicUsize>, id: u64) {
        let mut batch = RetireBatch::new();
        batch.push(p.replace(Counted(freed.clone(), id)));
    }

    /// Tests that put threads on stripes of a kind ([`spawn_on_stripe`], or as many spenders as there are owned
    /// stripes) hold this for their whole run: in one test process, one that holds every owned stripe (to reach
    /// the shared one) would leave none for another that needs an owned one, and the other way round.
    pub(crate) fn stripe_test_lock() -> std::sync::MutexGuard<'static, ()> {
        static STRIPE_TESTS: Mutex<()> = Mutex::new(());
        STRIPE_TESTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on a thread whose stripe is shared (`shared`) or owned; hold [`stripe_test_lock`] meanwhile.
    ///
    /// A thread keeps its stripe for its whole life and frees it when it exits. Threads are started until one
    /// gets a stripe of the kind asked for. For a shared stripe, the others hold the owned ones until `f`
    /// returns, and the returned handle joins them too, so their stripes are free again when it is joined. For
    /// an owned stripe, a thread that got the shared one exits at once and the next try waits for it, so a
    /// stripe that a thread of another test frees on its exit is found (within 60 s, or the test fails).
    pub(crate) fn spawn_on_stripe<R: Send + 'static>(
        shared: bool,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let mut holders: Vec<std::thread::JoinHandle<Option<R>>> = Vec::new();
        let mut f = Some(f);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (lease_tx, lease_rx) = mpsc::channel::<bool>();
            let (run_tx, run_rx) = mpsc::channel::<Box<dyn FnOnce() -> R + Send>>();
            let release_rx = release_rx.clone();
            let tx = release_tx.clone();
            let h = std::thread::spawn(move || {
                let exclusive = stripe::lease().exclusive;
                lease_tx.send(exclusive).unwrap();
                if exclusive == shared {
                    // The wrong kind. A holder of an owned stripe keeps it until `f` is done (the thread that
                    // runs `f` holds the last sender); a thread on the shared stripe just exits.
                    drop(tx);
                    if exclusive {
                        let _ = release_rx.lock().unwrap().recv();
                    }
                    return None;
                }
                let f = run_rx.recv().unwrap();
                let r = f();
                drop(tx);
                Some(r)
            });
            let exclusive = lease_rx.recv().unwrap();
            if exclusive != shared {
                run_tx.send(Box::new(f.take().unwrap())).unwrap();
                drop(release_tx);
                return std::thread::spawn(move || {
                    let r = h.join().unwrap().unwrap();
                    for holder in holders {
                        holder.join().unwrap();
                    }
                    r
                });
            }
            if exclusive {
                holders.push(h);
            } else {
                // Only an owned stripe will do: this thread frees the shared lease as it exits; owned stripes
                // are free once the threads of other tests that hold them exit.
                h.join().unwrap();
                assert!(std::time::Instant::now() < deadline, "no owned stripe became free in 60 s");
                std::thread::yield_now();
            }
        }
    }

    fn stale_phase_reader_is_waited_for(shared: bool, at: StaleAt) {
        let _stripes = stripe_test_lock();
        let freed = Arc::new(AtomicUsize::new(0));
        let p = Arc::new(RcuPtr::new(Counted(freed.clone(), 0)));
        let (start_tx, start_rx) = mpsc::channel::<()>();
        let (phase_loaded_tx, phase_loaded_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (holding_tx, holding_rx) = mpsc::channel::<u64>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let pr = p.clone();
        let reader = spawn_on_stripe(shared, move || {
            assert_eq!(stripe::lease().exclusive, !shared);
            start_rx.recv().unwrap();
            test_hooks::set(&AFTER_PHASE_LOAD, move || {
                phase_loaded_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            });
            pr.read(|v| {
                holding_tx.send(v.1).unwrap();
                done_rx.recv().unwrap();
                // Read the value again: a use after free if a writer freed it (memcheck reports it).
                // SAFETY: `v` is a live reference for the whole section; that is what this test checks.
                unsafe { std::ptr::read_volatile(&v.1) }
            })
        });
        // Writer A: a whole grace period while the reader sits between its phase load and its mark.
        match at {
            StaleAt::BeforeGracePeriod => {
                start_tx.send(()).unwrap();
                phase_loaded_rx.recv().unwrap();
            }
            StaleAt::BetweenFlips => test_hooks::set(&BETWEEN_FLIPS, move || {
                start_tx.send(()).unwrap();
                phase_loaded_rx.recv().unwrap();
            }),
        }
        retire(&p, &freed, 1);
        assert_eq!(freed.load(Ordering::SeqCst), 1, "writer A freed value 0");
        go_tx.send(()).unwrap();
        assert_eq!(holding_rx.recv().unwrap(), 1, "the reader holds value 1");
        // Writer B retires value 1: its grace period must wait for the reader.
        let (waits_tx, waits_rx) = mpsc::channel::<()>();
        let (pw, fw) = (p.clone(), freed.clone());
        let writer_b = std::thread::spawn(move || {
            test_hooks::set(&WRITER_WAITS, move || waits_tx.send(()).unwrap());
            retire(&pw, &fw, 2);
        });
        loop {
            match waits_rx.recv_timeout(Duration::from_millis(10)) {
                Ok(()) => break,
                Err(_) => assert!(
                    !writer_b.is_finished(),
                    "{at:?}, shared stripe {shared}: writer B's grace period ended while the reader held value 1"
                ),
            }
        }
        assert_eq!(freed.load(Ordering::SeqCst), 1, "value 1 is alive while the reader holds it");
        done_tx.send(()).unwrap();
        assert_eq!(reader.join().unwrap(), 1);
        writer_b.join().unwrap();
        assert_eq!(freed.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn hooked_stale_phase_reader_on_an_owned_stripe_is_waited_for() {
        stale_phase_reader_is_waited_for(false, StaleAt::BeforeGracePeriod);
    }

    #[test]
    fn hooked_stale_phase_reader_on_the_shared_stripe_is_waited_for() {
        stale_phase_reader_is_waited_for(true, StaleAt::BeforeGracePeriod);
    }

    #[test]
    fn hooked_reader_that_loads_the_phase_between_two_flips_is_waited_for_on_an_owned_stripe() {
        stale_phase_reader_is_waited_for(false, StaleAt::BetweenFlips);
    }

    #[test]
    fn hooked_reader_that_loads_the_phase_between_two_flips_is_waited_for_on_the_shared_stripe() {
        stale_phase_reader_is_waited_for(true, StaleAt::BetweenFlips);
    }

    /// Through the engine: an entry whose rules read section started with a stale phase sits in a user slot
    /// (it holds its `ResourceRules`) while two reloads run; the second must wait for it.
    #[test]
    fn hooked_entry_in_a_user_slot_across_two_reloads_keeps_its_rules_alive() {
        use crate::flow::FlowRule;
        use crate::slot::{Slot, SlotEntry};
        use crate::Sentinel;
        struct Hold(Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>);
        impl Slot for Hold {
            fn name(&self) -> &'static str {
                "hold"
            }
            fn entry(&self, _: &SlotEntry<'_>) -> Result<(), String> {
                let pair = self.0.lock().unwrap().take();
                if let Some((tx, rx)) = pair {
                    tx.send(()).unwrap();
                    rx.recv().unwrap();
                }
                Ok(())
            }
        }
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([FlowRule::new("r").count(1e9)]).unwrap();
        let (in_slot_tx, in_slot_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        // Before the flow slot: after it returns, the flow check reads the rules the section holds.
        engine.add_slot(-6500, Hold(Mutex::new(Some((in_slot_tx, release_rx)))));
        let r = engine.resource("r");
        let (phase_loaded_tx, phase_loaded_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            test_hooks::set(&AFTER_PHASE_LOAD, move || {
                phase_loaded_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            });
            r.enter().map(drop).map_err(|e| e.to_string())
        });
        phase_loaded_rx.recv().unwrap();
        engine.load_flow_rules([FlowRule::new("r").count(2e9)]).unwrap(); // writer A
        go_tx.send(()).unwrap();
        in_slot_rx.recv().unwrap();
        let (waits_tx, waits_rx) = mpsc::channel::<()>();
        let e2 = engine.clone();
        let writer_b = std::thread::spawn(move || {
            test_hooks::set(&WRITER_WAITS, move || waits_tx.send(()).unwrap());
            e2.load_flow_rules([FlowRule::new("r").count(3e9)]).unwrap()
        });
        loop {
            match waits_rx.recv_timeout(Duration::from_millis(10)) {
                Ok(()) => break,
                Err(_) => assert!(!writer_b.is_finished(), "the entry's ResourceRules were freed under it"),
            }
        }
        release_tx.send(()).unwrap();
        assert_eq!(reader.join().unwrap(), Ok(()));
        writer_b.join().unwrap();
        assert_eq!(engine.flow_rules()[0].count, 3e9);
    }

    /// The tests that make the process-wide barrier fail, one at a time.
    static DEGRADING: Mutex<()> = Mutex::new(());

    /// The barrier's failure is logged through the application's subscriber, from inside exact limits' bucket
    /// closes and rule writers' grace periods: a subscriber that panics loses its event, and nothing unwinds
    /// into the caller (whose pool would stay closed for every other thread).
    #[test]
    fn a_panicking_subscriber_cannot_unwind_out_of_the_barriers_fall_back() {
        if !register() {
            eprintln!("skipped: no process-wide barrier on this machine, so it cannot fail and fall back");
            return;
        }
        // Not beside the other test that fails barriers (its fall-back would log in this one's place).
        let _one = DEGRADING.lock().unwrap_or_else(|e| e.into_inner());
        let events = Arc::new(AtomicUsize::new(0));
        DEGRADE_LOGGED.store(false, Ordering::SeqCst);
        let counted = events.clone();
        let panicking = sentinel_testkit::logs::OnEvent(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            panic!("the application's subscriber panics (expected by the test)");
        });
        let degraded = tracing::subscriber::with_default(panicking, || {
            std::panic::catch_unwind(|| degrade("injected failure (test)"))
        });
        assert!(degraded.is_ok(), "the subscriber's panic stayed inside the log");
        assert_eq!(events.load(Ordering::SeqCst), 1, "the subscriber was given the event");
        assert_eq!(MODE.load(Ordering::SeqCst), MODE_FENCE, "readers use full fences from then on");
        // Sections and grace periods still work.
        let freed = Arc::new(AtomicUsize::new(0));
        let p = RcuPtr::new(Counted(freed.clone(), 1));
        let old = p.replace(Counted(freed.clone(), 2));
        synchronize();
        drop(old);
        assert_eq!((p.read(|c| c.1), freed.load(Ordering::SeqCst)), (2, 1));
    }

    /// A failing process-wide barrier switches readers to full fences and is retried until one succeeds:
    /// grace periods stay correct (readers keep seeing whole values, nothing is freed early).
    #[test]
    fn a_failing_process_barrier_falls_back_to_full_fences() {
        let _one = DEGRADING.lock().unwrap_or_else(|e| e.into_inner());
        let expedited = mode() == MODE_EXPEDITED;
        if expedited {
            test_hooks::FAIL_BARRIERS.store(3, Ordering::SeqCst);
        }
        let freed = Arc::new(AtomicUsize::new(0));
        let p = Arc::new(RcuPtr::new(Counted(freed.clone(), 0)));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                while !stop.load(Ordering::Relaxed) {
                    p.read(|v| {
                        assert!(v.1 >= seen);
                        seen = v.1;
                    });
                }
            })
        };
        for i in 1..=20 {
            retire(&p, &freed, i);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(freed.load(Ordering::SeqCst), 20);
        if expedited {
            assert_eq!(MODE.load(Ordering::SeqCst), MODE_FENCE, "a failed barrier leaves full fences in force");
            assert_eq!(test_hooks::FAIL_BARRIERS.load(Ordering::SeqCst), 0, "the failures were retried");
        }
    }

    /// Without any injected delay (preemption only): readers yield inside their sections while two writers
    /// replace continuously; a value dropped while a reader still held it is counted. Bounded by grace
    /// periods, not time; `SENTINEL_STRESS_SCALE=<n>` runs n times as many.
    #[test]
    fn readers_preempted_in_their_sections_never_see_a_freed_value() {
        const IDS: usize = 1 << 16;
        static DROPPED: std::sync::OnceLock<Vec<AtomicBool>> = std::sync::OnceLock::new();
        let dropped = DROPPED.get_or_init(|| (0..IDS).map(|_| AtomicBool::new(false)).collect());
        struct V(usize);
        impl Drop for V {
            fn drop(&mut self) {
                DROPPED.get().unwrap()[self.0 % IDS].store(true, Ordering::SeqCst);
            }
        }
        let scale: usize = std::env::var("SENTINEL_STRESS_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
        let grace_periods = 1000 * scale.max(1);
        let p = Arc::new(RcuPtr::new(V(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2 * stripe::owned_stripes() + 2)
            .map(|_| {
                let (p, stop, violations) = (p.clone(), stop.clone(), violations.clone());
                std::thread::spawn(move || {
                    let dropped = DROPPED.get().unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        p.read(|v| {
                            let id = v.0 % IDS;
                            std::thread::yield_now();
                            if dropped[id].load(Ordering::SeqCst) {
                                violations.fetch_add(1, Ordering::SeqCst);
                            }
                        });
                    }
                })
            })
            .collect();
        let next = Arc::new(AtomicUsize::new(1));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (p, next) = (p.clone(), next.clone());
                std::thread::spawn(move || {
                    for _ in 0..grace_periods / 2 {
                        let id = next.fetch_add(1, Ordering::Relaxed) % IDS;
                        let mut b = RetireBatch::new();
                        b.push(p.replace(V(id)));
                    }
                })
            })
            .collect();
        writers.into_iter().for_each(|w| w.join().unwrap());
        stop.store(true, Ordering::Relaxed);
        readers.into_iter().for_each(|r| r.join().unwrap());
        let _ = dropped;
        assert_eq!(violations.load(Ordering::SeqCst), 0, "values dropped while a reader held them");
    }

    /// The hooked interleavings again, under valgrind's memcheck: no invalid read of a freed value.
    #[test]
    fn forced_interleavings_pass_under_memcheck() {
        const INNER: &str = "SENTINEL_RCU_UNDER_MEMCHECK";
        if std::env::var_os(INNER).is_some() {
            return; // this is the run under valgrind
        }
        let Some(valgrind) = sentinel_testkit::require_program("valgrind", "forced_interleavings_pass_under_memcheck")
        else {
            return;
        };
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(valgrind)
            .args(["--tool=memcheck", "--error-exitcode=99", "--quiet"])
            .arg(&exe)
            .args(["--test-threads=1", "rcu::tests::hooked_"])
            .env(INNER, "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "memcheck run failed ({}):\n{stdout}\n{stderr}", out.status);
        assert!(!stderr.contains("Invalid read"), "memcheck reports an invalid read:\n{stderr}");
        assert!(stdout.contains("5 passed"), "the hooked tests did not all run under memcheck:\n{stdout}");
    }
}
