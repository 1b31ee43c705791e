//! Exact admission for reject-style QPS limits.
//!
//! Java Sentinel reads a node's pass count and adds to it in two separate steps, so concurrent callers can all
//! read "one left" and all pass. Here a window never admits more than its limit, whatever the number of
//! threads, and concurrent callers of one node do not write one shared word on every call:
//!
//! - **Budget per bucket.** The bucket `b` (500 ms) may admit `B(b) = floor(limit − passes(b − 1) −
//!   borrowed(b))` (the previous bucket is always inside the window while `b` is current). `B(b)` tokens are
//!   put in a shared pool when the bucket is opened.
//! - **Leasing.** A thread takes a chunk of tokens (`max(acquire, pool / (2 · stripes))`) from the pool with one
//!   compare-and-swap and spends it from its own stripe (a cache line only its core writes in the common
//!   case), so the shared pool is written about once per chunk instead of once per call. A thread that owns
//!   its stripe spends without any locked instruction (see *Owner-private spending* below).
//! - **Stealing.** When the pool cannot serve a call, the caller gathers tokens from the pool and from the other
//!   stripes; it blocks only when the tokens left everywhere are fewer than it asks for. Token moves that leave
//!   tokens briefly outside the pool and the stripes are announced in a `moving` word, and a block is decided
//!   only on a scan that no move overlapped, so a call is not blocked while enough tokens are left.
//! - **Closing a bucket.** Whoever first sees a later bucket (or a changed limit) closes the pool (a marker
//!   word; others wait, as for a window bucket being reset), drains every stripe, computes what the closing
//!   bucket used (`budget − tokens left`), and opens the next pool. Every word carries a generation tag, so a
//!   token of a closed generation can be neither spent nor credited.
//! - **Over the limit.** A scan that found too few tokens is remembered (with the `moving` count it saw and
//!   the tokens it found); until a token is added (a move, a release, a bucket opening), calls asking for more
//!   than that block without scanning, writing shared words or running a process-wide barrier.
//!
//! **Owner-private spending.** An owned stripe (see `stripe::lease`) holds two words: `word =
//! pack(generation, credited − taken)`, written only with compare-and-swap (by the owner when it credits a
//! chunk, by other threads when they take tokens out), and `spent = pack(generation, n)`, written only by the
//! owner, with plain stores; its tokens are `word − spent`. Other threads take tokens out of an owned stripe
//! (stealing, closing) only while holding its `claim` word (a sequence number, odd while held; claims are taken
//! in ascending stripe order and no one waits for anything else while holding one, so they cannot deadlock),
//! and only after one process-wide barrier (`rcu::heavy`) run once their claims are set (a close takes every
//! claim and runs at most one barrier for all stripes). The owner spends `a` tokens by reading `claim` (`c0`, even;
//! acquire), `word` and `spent`, storing `spent + a`, running the compiler-only side of the asymmetric fence
//! (`rcu::light`), and reading `claim` again. The fence pair orders like a full fence on both sides (Dekker):
//! for every claim set after `c0`, either the claimer's reads of `spent` (after its barrier) see the spend, or
//! the owner's second read sees the claim. Claimers never leave a stripe below the `spent` they read (a thief
//! takes at most `word − spent`; a closer counts `word − spent` as left). Hence:
//!
//! - *Claim unchanged:* every claim completed before `c0` is reflected in the `word` the owner read (the acquire
//!   of `c0`), and every later claimer sees the spend and leaves it paid: the spend is exact.
//! - *Claim changed:* the owner cannot tell whether the claimer counted its spend. It takes the claim itself
//!   (waiting, briefly, for the claimer to finish) and keeps the spend only if it is still paid: in the same
//!   generation when `word ≥ spent + a` (what thieves took came out of the rest), after a close when the
//!   closer's `accounted` record (the spent count it counted as used, at most the `word` it drained) includes
//!   it. Otherwise it restores `spent` while holding the claim (so the next claimer reads the restored value),
//!   announces the tokens that came back as a move, and takes the slow path.
//!
//! A stripe whose `word` is below its `spent` has such a restore pending: a scan that sees one is not quiet.
//! The common call thus costs a thread-local read, six loads and one store to a cache line its thread owns
//! (plus the fence's flag), and no locked instruction. Process-wide barriers run only when a bucket closes
//! while other threads' stripes still hold tokens (a closer needs none for its own stripe, nor for a stripe
//! it drains empty: an owner's spend racing with that close read tokens a thief took since, overlapping the
//! thief's claim, and is settled), and when a gathering scan finds tokens on other owned stripes (near the
//! limit only: a scan over the limit that finds none is remembered, see above). The shared stripe (threads
//! beyond the owned ones) keeps one word spent with compare-and-swap.
//!
//! **Which bucket paid.** A reservation names the bucket whose tokens paid for it (its generation's), which
//! [`AdmissionWindow::release`] gives them back to while it is open. Its tokens may be of a later bucket than
//! the caller's time (which is then counted in the newer bucket) but never of another bucket than it names:
//! an owner's copies are its own; the shared stripe's bucket copy carries its generation (see `Local`); and a
//! call that read the open bucket before the tokens it spends reads it again after them.
//!
//! A call can block while enough tokens are left only (a) when a bucket closes while another thread holds a
//! chunk between the pool and its stripe (the chunk counts as used by the closing bucket: the next bucket's
//! budget is lower by at most that chunk; within the same bucket it goes back to the pool), or when a bucket
//! closes while a stripe is short of an owner's overlapping spend because a thief took part of it (that spend
//! is given back, and the closing bucket counts the fewer than `acquire` tokens it left on the stripe as
//! used), (b) after 1000 scans in a row each overlapped by another thread's token move, or (c) while the limit
//! of the open bucket is being changed (a call may compare its `acquire` with the budget of the other limit).
//! None over-admits.
//!
//! A time that goes backwards is counted in the newest bucket (never panics, never over-admits). Budgets are
//! capped at 2^50 − 2 tokens per bucket (about 1.1e15): a larger limit admits at most that many per bucket.
//! Generation tags are 14 bits: a thread would have to stall across 16384 bucket openings between reading a
//! word and writing it back for a tag to be mistaken (an owner's `spent` is reset when it credits a chunk, so
//! an idle owner's old count is not mistaken either).
//!
//! A second reject rule with a different limit on a node this entry already reserved on reserves in a window
//! of two buckets held in one word and changed by compare-and-swap ([`SecondWindow`], in `second_window`)
//! that counts only the calls reaching that rule (rare: two rules on one node).
//!
//! **Leases.** The same machinery spends tokens that an owner hands out as a whole (a cluster rule's lease
//! from its token service): [`AdmissionWindow::lease_replace`] closes the pool like a bucket change (the
//! unspent tokens are counted and returned to the owner) and opens it with the new tokens and the last
//! millisecond they may be spent in, which the common call compares instead of a bucket index;
//! [`AdmissionWindow::lease_add`] tops the pool up. Callers never open a lease themselves ([`Mode`]). That API
//! is in `lease`.

mod lease;
mod second_window;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use self::second_window::SecondWindow;
use super::stripe;
use crate::rcu;

use super::window::BUCKET_MS;

const TOKEN_BITS: u32 = 50;
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;
const GEN_MASK: u64 = (1 << (64 - TOKEN_BITS)) - 1;
/// Most tokens a bucket holds (so that no packed word equals `CLOSED`).
pub(crate) const MAX_TOKENS: u64 = TOKEN_MASK - 1;
/// The pool while a bucket is being closed.
const CLOSED: u64 = u64::MAX;
/// `Meta::limit` before the first bucket: a NaN bit pattern no limit has.
const UNSET_LIMIT: u64 = 0x7FF8_5E47_1A11_0001;
/// No bucket opened yet.
const NONE: u64 = u64::MAX;
/// `moving`: one started move in the high half, one move in progress in the low half.
const MOVE_START: u64 = (1 << 32) | 1;
/// Gathering retries before a call blocks on a scan that moves kept overlapping.
const GATHER_RETRIES: u32 = 1000;

#[inline(always)]
fn pack(generation: u64, tokens: u64) -> u64 {
    ((generation & GEN_MASK) << TOKEN_BITS) | tokens
}
#[inline(always)]
fn gen_of(w: u64) -> u64 {
    w >> TOKEN_BITS
}
#[inline(always)]
fn tokens_of(w: u64) -> u64 {
    w & TOKEN_MASK
}
/// The count of a `spent` word in generation `g` (0 when it was written for another generation).
#[inline(always)]
fn spent_in(sp: u64, g: u64) -> u64 {
    if gen_of(sp) == g {
        tokens_of(sp)
    } else {
        0
    }
}

/// `floor(x)` as a token count: 0 for negative or NaN, capped at [`MAX_TOKENS`].
fn floor_tokens(x: f64) -> u64 {
    if x.is_nan() || x < 0.0 {
        0
    } else if x >= MAX_TOKENS as f64 {
        MAX_TOKENS
    } else {
        x.floor() as u64
    }
}

fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Read on every call, written when a bucket opens.
struct Meta {
    /// Index (`ms / BUCKET_MS`) of the open bucket, `NONE` before the first.
    bucket: AtomicU64,
    /// Bits of the limit the open bucket's budget was computed for.
    limit: AtomicU64,
    /// Tokens issued for the open bucket (its budget, plus what a limit change added).
    budget: AtomicU64,
}

/// Written when a thread takes a chunk; the bookkeeping fields only while the pool is closed.
struct Pool {
    /// `pack(generation, tokens)`, or `CLOSED`.
    word: AtomicU64,
    /// Moves that hold tokens outside the pool and the stripes: started (high half), in progress (low half).
    /// Releases, bucket openings and restored owner spends, which add tokens, count as started moves too.
    moving: AtomicU64,
    /// After a quiet scan found fewer tokens than it asked for: the started moves it saw (high half) and the
    /// tokens it found (low half); `u64::MAX`: none. While `moving` still shows those started moves and none
    /// in progress, no token was added since: a call for more than that many blocks without scanning (so
    /// that calls over the limit stay cheap, write no shared word and run no process-wide barrier).
    drained: AtomicU64,
    /// Passes in the window not paid with the open bucket's tokens: the previous bucket's passes and the
    /// passes prioritized calls borrowed in the open bucket.
    base: AtomicU64,
    /// Passes prioritized calls borrowed in the open bucket.
    borrowed: AtomicU64,
}

/// What a slow-path step decided: a result, or start over (a bucket was opened meanwhile).
enum Step {
    Done(Option<u64>),
    Again,
}

/// A stripe's tokens, with the bucket and limit they were issued for: the common call reads this one cache
/// line only. The copies are written before tokens are credited. On an owned stripe only the owner credits,
/// so tokens of the word's generation were credited with the copies of that generation. The shared stripe is
/// credited by many threads, and a credit of a generation closed meanwhile writes its copies before it finds
/// the stripe in a later generation (and gives its tokens back), so its copies can overwrite those of the
/// later generation's tokens: there the bucket copy carries the generation it was written for, and a call
/// spends under it only when that is the generation of the tokens it spends (all copies written for one
/// generation name its bucket). The limit copy carries no generation: a stale one only lets a call compare
/// its acquire with the tokens of the other limit while a limit changes (case (c) in the module
/// documentation); the bucket its reservation names is still the one whose tokens paid for it.
struct Local {
    /// `pack(generation, tokens)`: tokens credited minus tokens taken out by others (and, on the shared
    /// stripe, minus tokens spent).
    word: AtomicU64,
    /// Owned stripes: `pack(generation, tokens the owner spent of word)`; written by the owner only.
    spent: AtomicU64,
    /// The bucket (or lease key) the tokens were issued for; on the shared stripe `pack(generation, bucket)`.
    bucket: AtomicU64,
    limit: AtomicU64,
    /// Owned stripes: odd while another thread (or the owner settling a spend) holds the stripe.
    claim: AtomicU64,
    /// Owned stripes: `pack(generation, spent count the close of that generation counted as used)`.
    accounted: AtomicU64,
}

impl Local {
    /// Takes the claim (waits while someone else holds it); returns the odd value set.
    fn lock(&self) -> u64 {
        let mut spins = 0;
        loop {
            let c = self.claim.load(Ordering::Relaxed);
            if c & 1 == 0 && self.claim.compare_exchange_weak(c, c + 1, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                return c + 1;
            }
            backoff(&mut spins);
        }
    }

    fn unlock(&self, held: u64) {
        self.claim.store(held + 1, Ordering::Release);
    }
}

/// How a window's tokens are issued: by the window itself per bucket ([`Buckets`]), or by an owner that
/// replaces them as a whole (a cluster lease). Static, so that the local limits' path is compiled as before.
pub(crate) trait Mode {
    /// Whether a caller that finds a later key (or another limit) opens it itself. Lease callers never do:
    /// an expired lease gives no tokens until its owner replaces it.
    const OPENS: bool;
    /// A caller took a chunk from the pool; `left` tokens remain in it (not counting the stripes').
    #[inline(always)]
    fn took_chunk(&self, _left: u64) {}
}

/// A window's own buckets: budgets computed from the limit and the previous bucket.
pub(crate) struct Buckets;

impl Mode for Buckets {
    const OPENS: bool = true;
}

/// Exact admission for one node (see the module documentation).
pub(crate) struct AdmissionWindow {
    meta: CachePadded<Meta>,
    pool: CachePadded<Pool>,
    /// One per stripe: the owned ones, then the shared one.
    locals: Box<[CachePadded<Local>]>,
    /// For a second rule with another limit on this node.
    secondary: SecondWindow,
}

/// A reservation to give back if a later check blocks the call.
///
/// Sixteen bytes, like a plain (start, count) pair: it is returned and stored on every call, and a wider value
/// written piecewise and read back whole stalls store forwarding. `word` holds the bucket start (ms) in its low
/// 45 bits (a nanosecond `u64` clock reaches 1.9e13 ms < 2^45) and, in its high 19 bits, where a second rule
/// reserved the same count in the node's [`SecondWindow`]: 0 when none, else that bucket's index minus this
/// reservation's, plus `TAG_ZERO` (`TAG_KEPT` when the two are too far apart: that reservation is never
/// given back, which admits less, never more). The offset names the bucket exactly: low bits of its index
/// would also name one 2^18 buckets (36 h) later, from which a release would take what it never held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    word: u64,
    pub(crate) count: u32,
}

const START_BITS: u32 = 45;
const START_MASK: u64 = (1 << START_BITS) - 1;
/// The tag of a second bucket that is the reservation's own; offsets from it up to ±2^17 buckets.
const TAG_ZERO: i64 = 1 << 18;
/// The tag of a second bucket too far from the reservation's own to be named (never given back).
const TAG_KEPT: u64 = (1 << (64 - START_BITS)) - 1;

impl Reservation {
    #[inline(always)]
    fn new(bucket_start: u64, count: u32) -> Reservation {
        Reservation { word: bucket_start & START_MASK, count }
    }
    /// Start of the bucket whose tokens the reservation took.
    pub(crate) fn bucket_start(&self) -> u64 {
        self.word & START_MASK
    }
    fn secondary(&self) -> u64 {
        self.word >> START_BITS
    }
    fn set_secondary(&mut self, bucket_start: u64) {
        let offset = (bucket_start / BUCKET_MS) as i64 - (self.bucket_start() / BUCKET_MS) as i64;
        let tag = if offset.abs() < TAG_ZERO / 2 { (TAG_ZERO + offset) as u64 } else { TAG_KEPT };
        self.word = (self.word & START_MASK) | (tag << START_BITS);
    }
    /// The bucket a second rule reserved in, if it can be given back.
    fn secondary_bucket(&self) -> Option<u64> {
        let tag = self.secondary();
        (tag != 0 && tag != TAG_KEPT)
            .then(|| ((self.bucket_start() / BUCKET_MS) as i64 + (tag as i64 - TAG_ZERO)) as u64)
    }
}

impl AdmissionWindow {
    pub(crate) fn new() -> Self {
        AdmissionWindow {
            meta: CachePadded::new(Meta {
                bucket: AtomicU64::new(NONE),
                limit: AtomicU64::new(UNSET_LIMIT),
                budget: AtomicU64::new(0),
            }),
            pool: CachePadded::new(Pool {
                word: AtomicU64::new(pack(0, 0)),
                moving: AtomicU64::new(0),
                drained: AtomicU64::new(u64::MAX),
                base: AtomicU64::new(0),
                borrowed: AtomicU64::new(0),
            }),
            locals: (0..stripe::total_stripes())
                .map(|_| {
                    CachePadded::new(Local {
                        word: AtomicU64::new(pack(0, 0)),
                        spent: AtomicU64::new(pack(0, 0)),
                        bucket: AtomicU64::new(NONE),
                        limit: AtomicU64::new(UNSET_LIMIT),
                        claim: AtomicU64::new(0),
                        accounted: AtomicU64::new(pack(GEN_MASK, 0)),
                    })
                })
                .collect(),
            secondary: SecondWindow::new(),
        }
    }

    /// Stripes owned by one thread each (the last stripe is the shared one).
    #[inline(always)]
    fn owned(&self) -> usize {
        self.locals.len() - 1
    }

    /// Reserves `acquire` passes if the window stays within `limit`; `None` means block.
    #[inline]
    pub(crate) fn try_reserve(
        &self,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
    ) -> Option<Reservation> {
        // The bucket comes back in registers; the reservation is built here (building an `Option` of it
        // inside the loop below made the caller read it back from the stack in pieces, a store-forwarding stall).
        self.reserve(now_ms, acquire, limit, borrowed).map(|bucket| Reservation::new(bucket * BUCKET_MS, acquire))
    }

    /// The bucket (index) whose tokens paid for `acquire` passes, or `None`: block.
    #[inline(always)]
    fn reserve(&self, now_ms: u64, acquire: u32, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> Option<u64> {
        self.reserve_in(now_ms / BUCKET_MS, now_ms, acquire, limit, borrowed, &Buckets)
    }

    /// [`reserve`](Self::reserve) at the key `bucket` (a bucket index, or a lease's time: see [`Mode`]).
    #[inline(always)]
    fn reserve_in<M: Mode>(
        &self,
        bucket: u64,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
        mode: &M,
    ) -> Option<u64> {
        let lease = stripe::lease();
        let idx = lease.index;
        let local = &self.locals[idx];
        let a = acquire as u64;
        if lease.exclusive {
            loop {
                // Owner-private spending (module documentation): no locked instruction.
                let c0 = local.claim.load(Ordering::Acquire);
                let v = local.word.load(Ordering::Acquire);
                let g = gen_of(v);
                let s = spent_in(local.spent.load(Ordering::Relaxed), g);
                if c0 & 1 == 0 && tokens_of(v) >= s + a && a > 0 {
                    let open = local.bucket.load(Ordering::Relaxed);
                    if bucket <= open && local.limit.load(Ordering::Relaxed) == limit.to_bits() {
                        local.spent.store(pack(g, s + a), Ordering::Relaxed);
                        rcu::light();
                        if local.claim.load(Ordering::Relaxed) == c0 || self.settle(local, g, s, a) {
                            return Some(open);
                        }
                        continue;
                    }
                }
                match self.slow(bucket, now_ms, idx, false, a, limit, borrowed, mode) {
                    Step::Done(r) => return r,
                    Step::Again => continue,
                }
            }
        }
        loop {
            let v = local.word.load(Ordering::Acquire);
            if tokens_of(v) >= a && a > 0 {
                // The shared stripe's copy is `pack(generation, bucket)` (see `Local::bucket`): a copy of another
                // generation than the tokens' (a credit of a closed generation overwrote it) does not serve.
                let c = local.bucket.load(Ordering::Relaxed);
                let open = tokens_of(c);
                if gen_of(c) == gen_of(v) && bucket <= open && local.limit.load(Ordering::Relaxed) == limit.to_bits() {
                    if local.word.compare_exchange(v, v - a, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        return Some(open);
                    }
                    continue;
                }
            }
            match self.slow(bucket, now_ms, idx, true, a, limit, borrowed, mode) {
                Step::Done(r) => return r,
                Step::Again => continue,
            }
        }
    }

    /// An owner's spend of `a` tokens (on top of `s` spent in generation `g`) overlapped a claim: keeps it if
    /// it is still paid for, else restores `spent` (module documentation). Returns whether it was kept.
    #[cold]
    #[inline(never)]
    fn settle(&self, local: &Local, g: u64, s: u64, a: u64) -> bool {
        let held = local.lock();
        #[cfg(test)]
        tests::SETTLES.fetch_add(1, Ordering::Relaxed);
        let w = local.word.load(Ordering::Acquire);
        let kept = if gen_of(w) == g {
            tokens_of(w) >= s + a
        } else {
            let acc = local.accounted.load(Ordering::Acquire);
            gen_of(acc) == g && tokens_of(acc) >= s + a
        };
        if !kept {
            #[cfg(test)]
            tests::RESTORES.fetch_add(1, Ordering::Relaxed);
            local.spent.store(pack(g, s), Ordering::Release);
        }
        local.unlock(held);
        if !kept && gen_of(w) == g && tokens_of(w) > s {
            // Tokens the thief left are spendable again: not a quiet scan for anyone who missed them.
            self.pool.moving.fetch_add(1 << 32, Ordering::AcqRel);
        }
        kept
    }

    /// The stripe's tokens do not serve the call (none left, a later bucket, another limit, `acquire == 0`, a
    /// claim on the owned stripe).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn slow<M: Mode>(
        &self,
        bucket: u64,
        now_ms: u64,
        idx: usize,
        shared: bool,
        a: u64,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
        mode: &M,
    ) -> Step {
        let local = &self.locals[idx];
        let open = self.meta.bucket.load(Ordering::Acquire);
        // Before the first bucket `open` is `NONE` (no bucket is later) and the limit is `UNSET_LIMIT`
        // (no rule's limit: a NaN count is rejected by validation), so this opens the first bucket.
        if bucket > open || self.meta.limit.load(Ordering::Relaxed) != limit.to_bits() {
            if !M::OPENS {
                // A lease that expired (or none yet): only its owner replaces it.
                return Step::Done(None);
            }
            self.open(bucket, limit, borrowed, if shared { usize::MAX } else { idx });
            return Step::Again;
        }
        if a == 0 {
            return Step::Done(self.zero(now_ms, open, limit, borrowed));
        }
        if shared {
            #[cfg(test)]
            test_hooks::shared_slow();
            let v = local.word.load(Ordering::Acquire);
            if tokens_of(v) >= a {
                // Tokens whose copies did not match while the open bucket does (a refill of another thread
                // sharing the stripe raced with the read, or a credit of a closed generation overwrote the
                // copies): spend them under the open bucket's view. `open` was read before `v`, and the
                // stripe may hold tokens of a bucket opened since: read again after `v`, the open bucket is
                // the one `v`'s tokens were issued for if the swap below succeeds (no later bucket opened
                // before it: that close swapped the stripe to its generation first), so the reservation
                // names the bucket whose tokens paid for it.
                if self.meta.bucket.load(Ordering::Acquire) != open
                    || self.meta.limit.load(Ordering::Acquire) != limit.to_bits()
                {
                    return Step::Again;
                }
                if local.word.compare_exchange(v, v - a, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    return Step::Done(Some(open));
                }
                return Step::Again;
            }
        }
        if a > self.meta.budget.load(Ordering::Relaxed) {
            // More than the whole bucket holds (a zero limit, say): no scan can find enough.
            return Step::Done(None);
        }
        self.refill(bucket, idx, !shared, a, limit, borrowed, mode)
    }

    /// `acquire == 0`: passes while the window is within the limit.
    #[cold]
    fn zero(&self, now_ms: u64, open: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> Option<u64> {
        if self.total(now_ms, borrowed) as f64 <= limit {
            Some(open)
        } else {
            None
        }
    }

    /// The stripe's tokens do not cover the call: take a chunk from the pool, or gather.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn refill<M: Mode>(
        &self,
        bucket: u64,
        idx: usize,
        owner: bool,
        a: u64,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
        mode: &M,
    ) -> Step {
        let mut spins = 0;
        loop {
            let p = self.open_pool(&mut spins);
            let open = self.meta.bucket.load(Ordering::Acquire);
            if open == NONE || bucket > open || self.meta.limit.load(Ordering::Relaxed) != limit.to_bits() {
                if !M::OPENS {
                    return Step::Done(None);
                }
                self.open(bucket, limit, borrowed, if owner { idx } else { usize::MAX });
                continue;
            }
            let (g, left) = (gen_of(p), tokens_of(p));
            if left < a {
                return self.gather(open, g, idx, a);
            }
            let chunk = (left / (2 * self.locals.len() as u64)).max(a).min(left);
            let rest = chunk - a;
            if rest > 0 {
                self.pool.moving.fetch_add(MOVE_START, Ordering::AcqRel);
            }
            let ok = self.pool.word.compare_exchange(p, p - chunk, Ordering::AcqRel, Ordering::Acquire).is_ok();
            if ok && rest > 0 {
                #[cfg(test)]
                test_hooks::before_credit();
                self.credit(idx, owner, g, rest, open, limit);
            }
            if rest > 0 {
                self.pool.moving.fetch_sub(1, Ordering::AcqRel);
            }
            if ok {
                mode.took_chunk(left - chunk);
                return Step::Done(Some(open));
            }
        }
    }

    /// Adds `n` tokens of generation `g` (bucket `open`) to a stripe; if the generation was closed meanwhile,
    /// gives them to the pool instead. `owner`: the caller owns the stripe.
    fn credit(&self, idx: usize, owner: bool, g: u64, n: u64, open: u64, limit: f64) {
        let local = &self.locals[idx];
        // Keys fit in 50 bits: bucket indices, and lease times in ms (below 2^45, see `Reservation`).
        debug_assert!(open <= TOKEN_MASK);
        local.bucket.store(if owner { open } else { pack(g, open & TOKEN_MASK) }, Ordering::Relaxed);
        local.limit.store(limit.to_bits(), Ordering::Relaxed);
        if owner && gen_of(local.spent.load(Ordering::Relaxed)) != g {
            // Means 0 spent either way; resets a count an idle owner left in an old generation, so that it
            // cannot be mistaken once generation tags wrap around.
            local.spent.store(pack(g, 0), Ordering::Relaxed);
        }
        let local = &local.word;
        let mut v = local.load(Ordering::Acquire);
        loop {
            if gen_of(v) != g {
                let _ = self.give_back(open, n, false);
                return;
            }
            let t = (tokens_of(v) + n).min(MAX_TOKENS);
            match local.compare_exchange_weak(v, pack(g, t), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(x) => v = x,
            }
        }
    }

    /// The pool's word once no close is in progress (a close ends with [`publish`](Self::publish)): every
    /// change of the pool starts here.
    #[inline]
    fn open_pool(&self, spins: &mut u32) -> u64 {
        loop {
            let p = self.pool.word.load(Ordering::Acquire);
            if p != CLOSED {
                return p;
            }
            backoff(spins);
        }
    }

    /// Returns `n` tokens of bucket `bucket` to the pool, if that bucket is still open (else they are dropped:
    /// the closed bucket counted them as used, which only lowers what later buckets admit). `announce` when
    /// the caller is not inside a move already: the tokens added then count as a move for blocked callers.
    fn give_back(&self, bucket: u64, n: u64, announce: bool) -> bool {
        if n == 0 {
            return true;
        }
        let mut spins = 0;
        loop {
            let p = self.open_pool(&mut spins);
            // The bookkeeping changes only while the pool is closed: a successful swap below proves it was
            // read for the generation of `p`.
            if self.meta.bucket.load(Ordering::Acquire) != bucket {
                return false;
            }
            let t = (tokens_of(p) + n).min(MAX_TOKENS);
            if self.pool.word.compare_exchange(p, pack(gen_of(p), t), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                if announce {
                    self.pool.moving.fetch_add(1 << 32, Ordering::AcqRel);
                }
                return true;
            }
        }
    }

    /// Takes `a − have` tokens at most (of generation `g`) out of stripe `k`, whose claim the caller holds
    /// (after the barrier) if it is owned. Returns whether the stripe's generation was still `g`; sets
    /// `pending` if an owner's restore is pending on it.
    fn take_from(&self, k: usize, g: u64, a: u64, have: &mut u64, pending: &mut bool) -> bool {
        let l = &self.locals[k];
        let s = if k < self.owned() { l.spent.load(Ordering::Acquire) } else { pack(g, 0) };
        let s = spent_in(s, g);
        let mut v = l.word.load(Ordering::Acquire);
        loop {
            if gen_of(v) != g {
                return false;
            }
            if tokens_of(v) < s {
                *pending = true;
            }
            let take = tokens_of(v).saturating_sub(s).min(a - *have);
            if take == 0 {
                return true;
            }
            match l.word.compare_exchange_weak(v, v - take, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    *have += take;
                    return true;
                }
                Err(x) => v = x,
            }
        }
    }

    /// Takes tokens of generation `g` (bucket `open`) from the pool and every stripe until `a` are gathered.
    /// Blocks (returns `None`) only when a scan that no token move overlapped found fewer than `a`.
    #[cold]
    fn gather(&self, open: u64, g: u64, idx: usize, a: u64) -> Step {
        let owned = self.owned();
        let (d, m) = (self.pool.drained.load(Ordering::Acquire), self.pool.moving.load(Ordering::Acquire));
        if d != u64::MAX && m & 0xFFFF_FFFF == 0 && d >> 32 == m >> 32 && a > d & 0xFFFF_FFFF {
            return Step::Done(None);
        }
        for _ in 0..GATHER_RETRIES {
            let before = self.pool.moving.fetch_add(MOVE_START, Ordering::AcqRel);
            let mut have = 0u64;
            let mut pending = false;
            // The pool first, then the shared stripe, then the owned ones (this thread's first). Tokens of
            // another generation than the caller's `open` would be tagged with the wrong bucket: start over.
            let mut p = self.pool.word.load(Ordering::Acquire);
            let mut stale = p == CLOSED || gen_of(p) != g;
            while !stale && have < a {
                let take = tokens_of(p).min(a - have);
                if take == 0 {
                    break;
                }
                match self.pool.word.compare_exchange_weak(p, p - take, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => have += take,
                    Err(x) if x == CLOSED || gen_of(x) != g => stale = true,
                    Err(x) => p = x,
                }
            }
            if !stale && have < a && !self.take_from(owned, g, a, &mut have, &mut pending) {
                stale = true;
            }
            if !stale && have < a {
                // Owned stripes that seem to hold tokens (tokens reach a stripe only by a credit, announced as
                // a move, or by a restore, announced too; a pending restore makes the scan not quiet).
                let mut candidates = 0u64;
                for k in 0..owned {
                    let l = &self.locals[k];
                    let v = l.word.load(Ordering::Acquire);
                    if gen_of(v) != g {
                        stale = true;
                        break;
                    }
                    let s = spent_in(l.spent.load(Ordering::Acquire), g);
                    if tokens_of(v) > s {
                        candidates |= 1 << k;
                    } else if tokens_of(v) < s {
                        pending = true;
                    }
                }
                if !stale && candidates != 0 {
                    let mut held = [0u64; stripe::MAX_OWNED];
                    for k in (0..owned).filter(|k| candidates & (1 << k) != 0) {
                        held[k] = self.locals[k].lock();
                    }
                    // This thread's own stripe needs no barrier: it is the only one spending from it.
                    if idx >= owned || candidates & !(1 << idx) != 0 {
                        rcu::heavy();
                    }
                    for j in 0..owned {
                        let k = (idx + j) % owned;
                        if candidates & (1 << k) == 0 || have >= a || stale {
                            continue;
                        }
                        if !self.take_from(k, g, a, &mut have, &mut pending) {
                            stale = true;
                        }
                    }
                    for k in (0..owned).filter(|k| candidates & (1 << k) != 0) {
                        self.locals[k].unlock(held[k]);
                    }
                }
            }
            if have >= a && !stale {
                self.pool.moving.fetch_sub(1, Ordering::AcqRel);
                return Step::Done(Some(open));
            }
            // Not enough (or the bucket closed under us): put back what was taken.
            let _ = self.give_back(open, have, false);
            let after = self.pool.moving.fetch_sub(1, Ordering::AcqRel);
            let quiet = !pending && (before & 0xFFFF_FFFF) == 0 && (after >> 32) == ((before >> 32) + 1) & 0xFFFF_FFFF;
            if stale {
                // A new bucket or limit was opened meanwhile: start over from its state.
                return Step::Again;
            }
            if quiet {
                // `have < a <= u32::MAX`: the low half is never all ones, so this is never `u64::MAX`.
                self.pool.drained.store((after >> 32) << 32 | have, Ordering::Release);
                return Step::Done(None);
            }
            std::thread::yield_now();
        }
        Step::Done(None)
    }

    /// Closes the open bucket (drains every stripe) and opens the bucket `bucket` for `limit` (or re-opens the
    /// same bucket for a changed limit). Returns at once if someone else already did. `own`: the stripe the
    /// caller owns (`usize::MAX` for none).
    #[cold]
    #[inline(never)]
    fn open(&self, bucket: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64, own: usize) {
        let done = || {
            let open = self.meta.bucket.load(Ordering::Acquire);
            open != NONE && bucket <= open && self.meta.limit.load(Ordering::Acquire) == limit.to_bits()
        };
        let Some((ng, left)) = self.close(own, done) else {
            return;
        };
        let open = self.meta.bucket.load(Ordering::Acquire);
        let used = self.meta.budget.load(Ordering::Acquire).saturating_sub(left);
        let (target, base, bor, budget, tokens);
        if open != NONE && bucket <= open {
            // Same bucket, another limit: what was used stays used.
            target = open;
            base = self.pool.base.load(Ordering::Acquire);
            bor = self.pool.borrowed.load(Ordering::Acquire);
            tokens = floor_tokens(limit - base as f64).saturating_sub(used);
            budget = used + tokens;
        } else {
            target = bucket;
            bor = borrowed(bucket * BUCKET_MS);
            // The previous bucket is in the window: what it used and what was borrowed in it, or, when no call
            // opened it, what prioritized calls borrowed in it (they pass in it all the same).
            let prev = if open != NONE && bucket == open + 1 {
                used + self.pool.borrowed.load(Ordering::Acquire)
            } else {
                bucket.checked_sub(1).map_or(0, |b| borrowed(b * BUCKET_MS))
            };
            base = prev + bor;
            budget = floor_tokens(limit - base as f64);
            tokens = budget;
        }
        self.publish(ng, target, limit, base, bor, budget, tokens);
    }

    /// Closes the pool and drains every stripe (unless `done` says, before the pool is closed, that someone
    /// else already opened what the caller wants): returns the next generation and the tokens left unspent.
    /// The pool stays closed until [`publish`](Self::publish). `own`: the stripe the caller owns.
    fn close(&self, own: usize, done: impl Fn() -> bool) -> Option<(u64, u64)> {
        let mut spins = 0;
        let p = loop {
            let p = self.open_pool(&mut spins);
            if done() {
                return None;
            }
            if self.pool.word.compare_exchange(p, CLOSED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                break p;
            }
        };
        let g = gen_of(p);
        let ng = (g + 1) & GEN_MASK;
        let mut left = tokens_of(p);
        // Every owned stripe's claim, then one barrier: each owner's spend is seen below or settled by it.
        let owned = self.owned();
        let mut held = [0u64; stripe::MAX_OWNED];
        for (k, l) in self.locals[..owned].iter().enumerate() {
            held[k] = l.lock();
        }
        // The words first (no owner spends from the new, empty ones). A stripe drained with no token needs no
        // barrier: an owner's spend racing with this close read tokens a thief has taken since, overlapping
        // the thief's claim (which ran a barrier), so the owner settles it, and is told below that it was not
        // counted. Nor does the caller's own stripe: its owner is not spending.
        let mut words = [0u64; stripe::MAX_OWNED + 1];
        let mut barrier = false;
        for (k, l) in self.locals.iter().enumerate() {
            words[k] = l.word.swap(pack(ng, 0), Ordering::AcqRel);
            barrier |= k < owned && k != own && gen_of(words[k]) == g && tokens_of(words[k]) > 0;
        }
        if barrier {
            rcu::heavy();
        }
        for (k, l) in self.locals.iter().enumerate() {
            let v = words[k];
            if gen_of(v) != g {
                continue;
            }
            if k < owned {
                let sp = l.spent.load(Ordering::Acquire);
                let counted = spent_in(sp, g).min(tokens_of(v));
                if gen_of(sp) == g {
                    l.accounted.store(pack(g, counted), Ordering::Release);
                }
                left += tokens_of(v) - counted;
            } else {
                left += tokens_of(v);
            }
        }
        for (k, l) in self.locals[..owned].iter().enumerate() {
            l.unlock(held[k]);
        }
        Some((ng, left))
    }

    /// Opens generation `ng` (the pool closed by [`close`](Self::close)) for `target` and `limit`.
    #[allow(clippy::too_many_arguments)]
    fn publish(&self, ng: u64, target: u64, limit: f64, base: u64, bor: u64, budget: u64, tokens: u64) {
        self.pool.base.store(base, Ordering::Release);
        self.pool.borrowed.store(bor, Ordering::Release);
        self.meta.budget.store(budget, Ordering::Release);
        self.meta.limit.store(limit.to_bits(), Ordering::Release);
        self.meta.bucket.store(target, Ordering::Release);
        self.pool.word.store(pack(ng, tokens), Ordering::Release);
        self.pool.moving.fetch_add(1 << 32, Ordering::AcqRel);
    }

    /// For a second rule on a node this entry already reserved on: reserves in the secondary window (the first
    /// time) or checks it (a third rule), so that each limit holds exactly.
    pub(crate) fn within(
        &self,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
        held: &mut Reservation,
    ) -> bool {
        if held.secondary() != 0 {
            return self.secondary.within(now_ms, limit, borrowed);
        }
        match self.secondary.try_reserve(now_ms, acquire, limit, borrowed) {
            Some(r) => {
                held.set_secondary(r.bucket_start);
                true
            }
            None => false,
        }
    }

    /// Passes in the window at `now_ms` (an estimate while other threads take tokens).
    pub(crate) fn total(&self, now_ms: u64, borrowed: &dyn Fn(u64) -> u64) -> u64 {
        let bucket = now_ms / BUCKET_MS;
        let open = self.meta.bucket.load(Ordering::Acquire);
        if open == NONE {
            return bucket.checked_sub(1).map_or(0, |b| borrowed(b * BUCKET_MS)) + borrowed(bucket * BUCKET_MS);
        }
        let p = self.pool.word.load(Ordering::Acquire);
        let mut left = if p == CLOSED { 0 } else { tokens_of(p) };
        let owned = self.owned();
        for (k, l) in self.locals.iter().enumerate() {
            let v = l.word.load(Ordering::Acquire);
            let s = if k < owned { spent_in(l.spent.load(Ordering::Acquire), gen_of(v)) } else { 0 };
            left += tokens_of(v).saturating_sub(s);
        }
        let used = self.meta.budget.load(Ordering::Acquire).saturating_sub(left);
        if bucket <= open {
            self.pool.base.load(Ordering::Acquire) + used
        } else if bucket == open + 1 {
            used + self.pool.borrowed.load(Ordering::Acquire) + borrowed(bucket * BUCKET_MS)
        } else {
            bucket.checked_sub(1).map_or(0, |b| borrowed(b * BUCKET_MS)) + borrowed(bucket * BUCKET_MS)
        }
    }

    /// Whether prioritized calls may still borrow passes in bucket `bucket`: no bucket from it on is open or
    /// being opened (whose budget would not count them). Call it holding the lock the `borrowed` reads of
    /// openings take.
    pub(crate) fn may_borrow(&self, bucket: u64) -> bool {
        if self.pool.word.load(Ordering::Acquire) == CLOSED {
            return false;
        }
        let open = self.meta.bucket.load(Ordering::Acquire);
        open == NONE || open < bucket
    }

    /// Gives a reservation back (if its bucket is still open).
    pub(crate) fn release(&self, r: Reservation) {
        let _ = self.give_back(r.bucket_start() / BUCKET_MS, r.count as u64, true);
        if let Some(bucket) = r.secondary_bucket() {
            self.secondary.release(bucket, r.count);
        }
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Test-only points where a test makes a thread stop, to force an interleaving (a preemption there); the
    //! machinery is rcu's (`rcu::test_hooks`).
    pub(crate) use crate::rcu::test_hooks::set;
    use crate::rcu::test_hooks::{run, Hook};
    use std::cell::RefCell;

    thread_local! {
        /// Runs once on this thread when a call on the shared stripe reaches the slow path, between its read
        /// of the open bucket and its read of the stripe's tokens.
        pub(crate) static SHARED_SLOW: Hook = const { RefCell::new(None) };
        /// Runs once on this thread between taking a chunk from the pool and crediting the rest to its stripe.
        pub(crate) static BEFORE_CREDIT: Hook = const { RefCell::new(None) };
    }

    pub(crate) fn shared_slow() {
        run(&SHARED_SLOW);
    }
    pub(crate) fn before_credit() {
        run(&BEFORE_CREDIT);
    }
}
