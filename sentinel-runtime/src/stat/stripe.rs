//! Thread-owned stripes, so that counters written on every call are written with plain stores to a cache
//! line only one thread writes.
//!
//! A thread leases a stripe on first use and gives it back when it exits. Threads beyond the number of
//! stripes share one extra stripe, written with atomic read-modify-write operations.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Most owned stripes (one bit each in the lease map).
pub(crate) const MAX_OWNED: usize = 64;

static LEASED: AtomicU64 = AtomicU64::new(0);

/// Owned stripes: twice the core count rounded up to a power of two, at least 2, at most 64.
pub(crate) fn owned_stripes() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        (cores * 2).next_power_of_two().clamp(2, MAX_OWNED)
    })
}

/// Stripes per counter: the owned ones plus the shared one (index `owned_stripes()`).
pub(crate) fn total_stripes() -> usize {
    owned_stripes() + 1
}

/// A thread's stripe: `exclusive` when the thread owns it (plain stores are safe).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lease {
    pub(crate) index: usize,
    pub(crate) exclusive: bool,
}

impl Lease {
    /// The stripe every thread without one of its own shares.
    pub(crate) fn shared() -> Lease {
        Lease { index: owned_stripes(), exclusive: false }
    }
}

struct Held(Lease);

impl Held {
    fn acquire() -> Held {
        let owned = owned_stripes();
        let mut map = LEASED.load(Ordering::Acquire);
        loop {
            let free = (!map).trailing_zeros() as usize;
            if free >= owned {
                return Held(Lease::shared());
            }
            match LEASED.compare_exchange_weak(map, map | (1 << free), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Held(Lease { index: free, exclusive: true }),
                Err(m) => map = m,
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // From now on this thread writes as a sharer: another thread may lease the stripe.
        CACHED.with(|c| c.set(SHARED_LEASE));
        if self.0.exclusive {
            LEASED.fetch_and(!(1 << self.0.index), Ordering::AcqRel);
        }
    }
}

thread_local! {
    static LEASE: Held = Held::acquire();
    /// The lease, cached in a thread-local without destructor (a plain read; the lease itself has a
    /// destructor, so every access to it checks its state): `index << 1 | exclusive`, or `UNSET`.
    static CACHED: Cell<usize> = const { Cell::new(UNSET) };
}

const UNSET: usize = usize::MAX;
/// Marks the cache of a thread whose lease was given back (it writes to the shared stripe).
const SHARED_LEASE: usize = usize::MAX - 1;

/// This thread's stripe (the shared one while the thread is being torn down).
#[inline(always)]
pub(crate) fn lease() -> Lease {
    let c = CACHED.with(|c| c.get());
    if c < SHARED_LEASE {
        return Lease { index: c >> 1, exclusive: c & 1 == 1 };
    }
    lease_slow(c)
}

#[cold]
fn lease_slow(cached: usize) -> Lease {
    let shared = Lease::shared();
    if cached == SHARED_LEASE {
        return shared;
    }
    match LEASE.try_with(|h| h.0) {
        Ok(l) => {
            CACHED.with(|c| c.set(l.index << 1 | l.exclusive as usize));
            l
        }
        Err(_) => shared,
    }
}

/// Adds `v` to a counter of the given stripe.
#[inline(always)]
pub(crate) fn add(c: &AtomicU64, v: u64, exclusive: bool) {
    if exclusive {
        c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    } else {
        c.fetch_add(v, Ordering::Relaxed);
    }
}

/// Copies of one value, one per owned stripe, each behind its own reference count: what a blocked call's
/// [`BlockError`](crate::BlockError) holds (the resource's name, the origin's, the rule), so that threads
/// blocked on one resource at once do not all write one reference count (a blocked call takes three counts
/// and gives them back: on a count shared by every thread, blocking did not scale).
///
/// A thread that owns a stripe gets its stripe's copy, made on its first use; a thread on the shared stripe
/// gets the value itself. Memory: nothing until a call of a thread that owns a stripe is blocked, then one
/// word per owned stripe and one copy per stripe that blocked (at most [`owned_stripes`] per value).
pub(crate) struct Shares<T: ?Sized> {
    copies: OnceLock<Box<[OnceLock<std::sync::Arc<T>>]>>,
}

impl<T: ?Sized> Default for Shares<T> {
    fn default() -> Self {
        Shares { copies: OnceLock::new() }
    }
}

impl<T: ?Sized> std::fmt::Debug for Shares<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shares").finish_non_exhaustive()
    }
}

/// A value [`Shares`] can copy.
pub(crate) trait Duplicate {
    /// A copy of `v` behind a reference count of its own.
    fn duplicate(v: &std::sync::Arc<Self>) -> std::sync::Arc<Self>;
}

impl Duplicate for str {
    fn duplicate(v: &std::sync::Arc<str>) -> std::sync::Arc<str> {
        std::sync::Arc::from(&**v)
    }
}

/// [`Duplicate`] for a type that is `Clone` (each rule kind says it for its rule type).
macro_rules! duplicate_by_clone {
    ($t:ty) => {
        impl $crate::stat::stripe::Duplicate for $t {
            fn duplicate(v: &std::sync::Arc<Self>) -> std::sync::Arc<Self> {
                std::sync::Arc::new((**v).clone())
            }
        }
    };
}
pub(crate) use duplicate_by_clone;

impl<T: ?Sized + Duplicate> Shares<T> {
    /// A reference to `value` (whose copies these are) for the calling thread: its stripe's copy, or `value`
    /// itself on the shared stripe.
    #[inline]
    pub(crate) fn share(&self, value: &std::sync::Arc<T>) -> std::sync::Arc<T> {
        let lease = lease();
        if !lease.exclusive {
            return value.clone();
        }
        let copies =
            self.copies.get_or_init(|| (0..owned_stripes()).map(|_| OnceLock::new()).collect::<Vec<_>>().into());
        match copies.get(lease.index) {
            Some(slot) => slot.get_or_init(|| T::duplicate(value)).clone(),
            None => value.clone(),
        }
    }
}

/// A reference to a [`Spread`] value: one count per stripe's reference, so that a thread counts on its own.
/// Aligned to a cache line (so is the count before it in its `Arc`): the stripes' references are made one
/// after another, and two counts in one line would be one word again for the cache.
#[cfg(feature = "tower")]
pub(crate) struct SpreadRef<T>(crossbeam_utils::CachePadded<std::sync::Arc<T>>);

#[cfg(feature = "tower")]
impl<T> Duplicate for SpreadRef<T> {
    fn duplicate(v: &std::sync::Arc<Self>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(SpreadRef(crossbeam_utils::CachePadded::new((*v.0).clone())))
    }
}

#[cfg(feature = "tower")]
impl<T> std::ops::Deref for SpreadRef<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A value that handles on many threads keep alive, each thread counting on a reference of its own stripe
/// ([`Shares`] of [`SpreadRef`]s): what an integration's service keeps when a server or client clones it, or
/// makes a call that keeps it, once a request on every worker thread. A count on one shared `Arc` is a word
/// every one of those threads writes twice a request, and does not scale across cores.
///
/// The `Spread` owns the stripes' references and each reference owns the value, so the value lives until the
/// `Spread` and every reference handed out are dropped (plain `Arc` ownership, no cycle). Memory: a word per
/// owned stripe once a thread that owns one asks, and 256 bytes per stripe that asked (a reference and its
/// count, each on a cache line of its own).
#[cfg(feature = "tower")]
pub(crate) struct Spread<T> {
    value: std::sync::Arc<SpreadRef<T>>,
    per_stripe: Shares<SpreadRef<T>>,
}

#[cfg(feature = "tower")]
impl<T> Spread<T> {
    pub(crate) fn new(value: T) -> Self {
        let value = SpreadRef(crossbeam_utils::CachePadded::new(std::sync::Arc::new(value)));
        Spread { value: std::sync::Arc::new(value), per_stripe: Shares::default() }
    }

    /// The value.
    #[inline(always)]
    pub(crate) fn get(&self) -> &std::sync::Arc<T> {
        &self.value.0
    }

    /// A reference that keeps the value alive, counted on the calling thread's stripe.
    #[inline]
    pub(crate) fn share(&self) -> std::sync::Arc<SpreadRef<T>> {
        self.per_stripe.share(&self.value)
    }

    /// How many references count on the shared one (tests).
    #[cfg(test)]
    pub(crate) fn shared_count(&self) -> usize {
        std::sync::Arc::strong_count(&self.value)
    }
}

/// A name with its [`Shares`]: the resource's name and the origin's, as the engine keeps them (a check sees
/// them through one pointer). Reads as the name's `Arc<str>`.
pub(crate) struct SharedName {
    name: std::sync::Arc<str>,
    shares: Shares<str>,
}

impl SharedName {
    pub(crate) fn new(name: std::sync::Arc<str>) -> Self {
        SharedName { name, shares: Shares::default() }
    }
    /// The name for a blocked call's error (see [`Shares`]).
    #[inline]
    pub(crate) fn share(&self) -> std::sync::Arc<str> {
        self.shares.share(&self.name)
    }
    /// The name.
    #[inline(always)]
    pub(crate) fn as_str(&self) -> &str {
        &self.name
    }
}

impl std::ops::Deref for SharedName {
    type Target = std::sync::Arc<str>;
    #[inline(always)]
    fn deref(&self) -> &std::sync::Arc<str> {
        &self.name
    }
}

impl std::fmt::Display for SharedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl std::fmt::Debug for SharedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.name, f)
    }
}

#[cfg(test)]
mod shares_tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_that_own_stripes_share_copies_of_their_own_and_the_value_is_the_same() {
        let value: Arc<str> = Arc::from("orders");
        let shares = Shares::<str>::default();
        let mine = shares.share(&value);
        assert_eq!(&*mine, "orders");
        let again = shares.share(&value);
        if lease().exclusive {
            assert!(!Arc::ptr_eq(&mine, &value), "a copy, not the value's own count");
            assert!(Arc::ptr_eq(&mine, &again), "one copy per stripe, made once");
        }
        let value_c = value.clone();
        let other = std::thread::scope(|s| s.spawn(|| shares.share(&value_c)).join().unwrap());
        assert_eq!(&*other, "orders");
        if lease().exclusive && !Arc::ptr_eq(&other, &value) {
            assert!(!Arc::ptr_eq(&other, &mine), "another thread's stripe, another copy");
        }
    }
}
