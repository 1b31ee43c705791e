//! Read-mostly pointers whose readers execute no locked instruction: the rules of a resource are read on every
//! entry (and at exit when it has circuit breakers) and replaced only when rules are loaded.
//!
//! A reader marks its stripe's slot with the current phase, reads, and clears the slot. The mark and the read
//! are ordered by an asymmetric fence: on the reader's side a compiler fence only; on the writer's side a
//! process-wide barrier (Linux `membarrier`, private expedited). Where that barrier is unavailable, readers
//! issue a full fence instead (correct, a little slower).
//!
//! A writer publishes the new pointer, flips the phase, runs the process-wide barrier, and waits until no slot
//! still shows the old phase; only then may the old values be freed. The barrier guarantees that a reader
//! either had its mark visible to the writer's scan, or performs its read after the new pointer was published.
//! Readers that start after the flip mark the new phase, so a writer never waits for more than the read
//! sections already under way. Threads beyond the number of owned stripes share two counters (one per phase),
//! updated with atomic read-modify-write operations.

use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

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

/// Whether the process-wide barrier is available (decided once, before any reader relies on it).
fn expedited() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(register)
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

/// A fast flag mirroring `expedited()`, read on the hot path without touching the `OnceLock`.
static LIGHT_OK: AtomicBool = AtomicBool::new(false);

/// The fast side of the asymmetric fence (a compiler fence when `membarrier` is available): orders this
/// thread's earlier stores before its later loads with respect to any thread that runs [`heavy`].
#[inline(always)]
pub(crate) fn light() {
    if LIGHT_OK.load(Ordering::Relaxed) {
        compiler_fence(Ordering::SeqCst);
    } else {
        light_slow();
    }
}

#[cold]
fn light_slow() {
    if expedited() {
        LIGHT_OK.store(true, Ordering::Relaxed);
    }
    // Until the flag is seen set (and always without membarrier), a full fence.
    fence(Ordering::SeqCst);
}

/// The slow side of the asymmetric fence: a full barrier on every thread of the process (microseconds).
pub(crate) fn heavy() {
    #[cfg(target_os = "linux")]
    if expedited() {
        use rustix::thread::{membarrier, MembarrierCommand};
        // Once registered, the private expedited command has no failure mode (its errors are for processes
        // that did not register and for unknown commands).
        let _ = membarrier(MembarrierCommand::PrivateExpedited);
        return;
    }
    fence(Ordering::SeqCst);
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
        // Acquire: a section that sees the new phase (and so is not waited for by the writer that flipped it)
        // also sees the pointers that writer published before flipping.
        let phase = PHASE.load(Ordering::Acquire);
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
            SHARED_DEPTH.with(|d| d.set(d.get() + 1));
            ReadGuard { slot: Slot::Shared { phase: p } }
        }
    }

    /// Reads `ptr` inside this section.
    #[inline(always)]
    pub(crate) fn load<'g, T>(&'g self, ptr: &AtomicPtr<T>) -> &'g T {
        // SAFETY: pointers published in an `RcuPtr` are never null and are freed only after a grace period,
        // which waits for this section to end.
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

/// Waits until every read section that could have seen pointers unpublished before this call has ended.
pub(crate) fn synchronize() {
    let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
    let old = PHASE.load(Ordering::Relaxed);
    let new = if old == 1 { 2 } else { 1 };
    PHASE.store(new, Ordering::SeqCst);
    heavy();
    let p = (old - 1) as usize & 1;
    let mut spins = 0u32;
    for s in SLOTS.iter().chain(std::iter::once(&SHARED[p])) {
        loop {
            let v = s.load(Ordering::Acquire);
            let busy = if std::ptr::eq(s, &SHARED[p]) { v != 0 } else { v == old };
            if !busy {
                break;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
    fence(Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
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
}
