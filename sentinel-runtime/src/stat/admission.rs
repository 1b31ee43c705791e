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
//!   compare-and-swap and spends it from its own stripe's word (a cache line only its core writes in the
//!   common case), so the shared pool is written about once per chunk instead of once per call.
//! - **Stealing.** When the pool cannot serve a call, the caller gathers tokens from the pool and from the other
//!   stripes; it blocks only when the tokens left everywhere are fewer than it asks for. Token moves that leave
//!   tokens briefly outside the pool and the stripes are announced in a `moving` word, and a block is decided
//!   only on a scan that no move overlapped, so a call is not blocked while enough tokens are left.
//! - **Closing a bucket.** Whoever first sees a later bucket (or a changed limit) closes the pool (a marker
//!   word; others wait, as for a window bucket being reset), drains every stripe, computes what the closing
//!   bucket used (`budget − tokens left`), and opens the next pool. Every word carries a generation tag, so a
//!   token of a closed generation can be neither spent nor credited.
//!
//! - **Over the limit.** A scan that found no token anywhere is remembered (with the `moving` count it saw);
//!   until a token is added (a move, a release, a bucket opening), blocked calls block without scanning or
//!   writing shared words.
//!
//! A call can block while enough tokens are left only (a) when a bucket closes while another thread holds a
//! chunk between the pool and its stripe (the chunk counts as used by the closing bucket: the next bucket's
//! budget is lower by at most that chunk; within the same bucket it goes back to the pool), (b) after 1000
//! scans in a row each overlapped by another thread's token move, or (c) while the limit of the open bucket
//! is being changed (a call may compare its `acquire` with the budget of the other limit). None over-admits.
//!
//! A time that goes backwards is counted in the newest bucket (never panics, never over-admits). Budgets are
//! capped at 2^50 − 2 tokens per bucket (about 1.1e15): a larger limit admits at most that many per bucket.
//! Generation tags are 14 bits: a thread would have to stall across 16384 bucket openings between reading a
//! word and writing it back for a tag to be mistaken.
//!
//! A second reject rule with a different limit on a node this entry already reserved on reserves in a plain
//! compare-and-swap window ([`CasWindow`]) that counts only the calls reaching that rule (rare: two rules on
//! one node).

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::stripe;
use super::window::deprecated;

const EMPTY: u64 = u64::MAX;
const RESETTING: u64 = u64::MAX - 1;

use super::window::{BUCKET_MS, INTERVAL_MS, SAMPLES};

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
fn pack(gen: u64, tokens: u64) -> u64 {
    ((gen & GEN_MASK) << TOKEN_BITS) | tokens
}
#[inline(always)]
fn gen_of(w: u64) -> u64 {
    w >> TOKEN_BITS
}
#[inline(always)]
fn tokens_of(w: u64) -> u64 {
    w & TOKEN_MASK
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

#[inline(always)]
fn stripe_index() -> usize {
    stripe::lease().index
}

fn backoff(spins: &mut u32) {
    *spins += 1;
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
    /// Releases and bucket openings, which add tokens, count as started moves too.
    moving: AtomicU64,
    /// The value of `moving` right after a quiet scan found no token anywhere (`u64::MAX`: none). While
    /// `moving` still has that value, no token was added since: a call blocks without scanning (so that
    /// calls over the limit stay cheap and do not write shared words).
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
/// line only. The copies are written before tokens are credited, and a token spent with a compare-and-swap
/// on `word` proves no close drained the stripe since, so the copies read with it are those of its
/// generation.
struct Local {
    /// `pack(generation, tokens)`.
    word: AtomicU64,
    bucket: AtomicU64,
    limit: AtomicU64,
}

/// Exact admission for one node (see the module documentation).
pub(crate) struct AdmissionWindow {
    meta: CachePadded<Meta>,
    pool: CachePadded<Pool>,
    /// One word per stripe: `pack(generation, tokens)`.
    locals: Box<[CachePadded<Local>]>,
    /// For a second rule with another limit on this node.
    secondary: CasWindow,
}

/// A reservation to give back if a later check blocks the call.
///
/// Sixteen bytes, like a plain (start, count) pair: it is returned and stored on every call, and a wider value
/// written piecewise and read back whole stalls store forwarding. `word` holds the bucket start (ms) in its low
/// 45 bits (a nanosecond `u64` clock reaches 1.9e13 ms < 2^45) and, in its high 19 bits, the low 18 bits of
/// the bucket index in which a second rule reserved the same count in the node's [`CasWindow`], plus one
/// (0 when none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    word: u64,
    pub(crate) count: u32,
}

const START_BITS: u32 = 45;
const START_MASK: u64 = (1 << START_BITS) - 1;
const TAG_MASK: u64 = (1 << 18) - 1;

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
        let tag = ((bucket_start / BUCKET_MS) & TAG_MASK) + 1;
        self.word = (self.word & START_MASK) | (tag << START_BITS);
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
                        bucket: AtomicU64::new(NONE),
                        limit: AtomicU64::new(UNSET_LIMIT),
                    })
                })
                .collect(),
            secondary: CasWindow::new(),
        }
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
        let bucket = now_ms / BUCKET_MS;
        let idx = stripe_index();
        let local = &self.locals[idx];
        let a = acquire as u64;
        loop {
            let v = local.word.load(Ordering::Acquire);
            if tokens_of(v) >= a && a > 0 {
                let open = local.bucket.load(Ordering::Relaxed);
                if bucket <= open && local.limit.load(Ordering::Relaxed) == limit.to_bits() {
                    if local.word.compare_exchange(v, v - a, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        return Some(open);
                    }
                    continue;
                }
            }
            match self.slow(bucket, now_ms, idx, a, limit, borrowed) {
                Step::Done(r) => return r,
                Step::Again => continue,
            }
        }
    }

    /// The stripe's tokens do not serve the call (none left, a later bucket, another limit, `acquire == 0`).
    #[cold]
    #[inline(never)]
    fn slow(&self, bucket: u64, now_ms: u64, idx: usize, a: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> Step {
        let local = &self.locals[idx];
        let open = self.meta.bucket.load(Ordering::Acquire);
        // Before the first bucket `open` is `NONE` (no bucket is later) and the limit is `UNSET_LIMIT`
        // (no rule's limit: a NaN count is rejected by validation), so this opens the first bucket.
        if bucket > open || self.meta.limit.load(Ordering::Relaxed) != limit.to_bits() {
            self.open(bucket, limit, borrowed);
            return Step::Again;
        }
        if a == 0 {
            return Step::Done(self.zero(now_ms, open, limit, borrowed));
        }
        let v = local.word.load(Ordering::Acquire);
        if tokens_of(v) >= a {
            // Tokens whose copies did not match while the open bucket does (a refill of another thread
            // sharing the stripe raced with the read): spend them under the open bucket's view.
            if local.word.compare_exchange(v, v - a, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return Step::Done(Some(open));
            }
            return Step::Again;
        }
        if a > self.meta.budget.load(Ordering::Relaxed) {
            // More than the whole bucket holds (a zero limit, say): no scan can find enough.
            return Step::Done(None);
        }
        self.refill(bucket, idx, a, limit, borrowed)
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
    fn refill(&self, bucket: u64, idx: usize, a: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> Step {
        let mut spins = 0;
        loop {
            let p = self.pool.word.load(Ordering::Acquire);
            if p == CLOSED {
                backoff(&mut spins);
                continue;
            }
            let open = self.meta.bucket.load(Ordering::Acquire);
            if open == NONE || bucket > open || self.meta.limit.load(Ordering::Relaxed) != limit.to_bits() {
                self.open(bucket, limit, borrowed);
                continue;
            }
            let (g, left) = (gen_of(p), tokens_of(p));
            if left < a {
                return self.gather(open, idx, a);
            }
            let chunk = (left / (2 * self.locals.len() as u64)).max(a).min(left);
            let rest = chunk - a;
            if rest > 0 {
                self.pool.moving.fetch_add(MOVE_START, Ordering::AcqRel);
            }
            let ok = self.pool.word.compare_exchange(p, p - chunk, Ordering::AcqRel, Ordering::Acquire).is_ok();
            if ok && rest > 0 {
                self.credit(idx, g, rest, open, limit);
            }
            if rest > 0 {
                self.pool.moving.fetch_sub(1, Ordering::AcqRel);
            }
            if ok {
                return Step::Done(Some(open));
            }
        }
    }

    /// Adds `n` tokens of generation `g` (bucket `open`) to a stripe; if the generation was closed meanwhile,
    /// gives them to the pool instead.
    fn credit(&self, idx: usize, g: u64, n: u64, open: u64, limit: f64) {
        let local = &self.locals[idx];
        local.bucket.store(open, Ordering::Relaxed);
        local.limit.store(limit.to_bits(), Ordering::Relaxed);
        let local = &local.word;
        let mut v = local.load(Ordering::Acquire);
        loop {
            if gen_of(v) != g {
                self.give_back(open, n, false);
                return;
            }
            let t = (tokens_of(v) + n).min(MAX_TOKENS);
            match local.compare_exchange_weak(v, pack(g, t), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(x) => v = x,
            }
        }
    }

    /// Returns `n` tokens of bucket `bucket` to the pool, if that bucket is still open (else they are dropped:
    /// the closed bucket counted them as used, which only lowers what later buckets admit). `announce` when
    /// the caller is not inside a move already: the tokens added then count as a move for blocked callers.
    fn give_back(&self, bucket: u64, n: u64, announce: bool) {
        if n == 0 {
            return;
        }
        let mut spins = 0;
        loop {
            let p = self.pool.word.load(Ordering::Acquire);
            if p == CLOSED {
                backoff(&mut spins);
                continue;
            }
            // The bookkeeping changes only while the pool is closed: a successful swap below proves it was
            // read for the generation of `p`.
            if self.meta.bucket.load(Ordering::Acquire) != bucket {
                return;
            }
            let t = (tokens_of(p) + n).min(MAX_TOKENS);
            if self.pool.word.compare_exchange(p, pack(gen_of(p), t), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                if announce {
                    self.pool.moving.fetch_add(1 << 32, Ordering::AcqRel);
                }
                return;
            }
        }
    }

    /// Takes tokens from the pool and every stripe until `a` are gathered. Blocks (returns `None`) only when a
    /// scan that no token move overlapped found fewer than `a`.
    #[cold]
    fn gather(&self, open: u64, idx: usize, a: u64) -> Step {
        let n = self.locals.len();
        if self.pool.drained.load(Ordering::Acquire) == self.pool.moving.load(Ordering::Acquire) {
            return Step::Done(None);
        }
        for _ in 0..GATHER_RETRIES {
            let before = self.pool.moving.fetch_add(MOVE_START, Ordering::AcqRel);
            let mut have = 0u64;
            let mut gen = None;
            let mut stale = false;
            // The pool first, then this stripe, then the others.
            let mut p = self.pool.word.load(Ordering::Acquire);
            while p != CLOSED && have < a {
                let take = tokens_of(p).min(a - have);
                if take == 0 {
                    break;
                }
                match self.pool.word.compare_exchange_weak(p, p - take, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        have += take;
                        gen = Some(gen_of(p));
                    }
                    Err(x) if x == CLOSED || gen_of(x) != gen_of(p) => {
                        stale = true;
                        break;
                    }
                    Err(x) => p = x,
                }
            }
            if p == CLOSED {
                stale = true;
            }
            let g = gen.unwrap_or(gen_of(p));
            for k in 0..n {
                if have >= a || stale {
                    break;
                }
                let local = &self.locals[(idx + k) % n].word;
                let mut v = local.load(Ordering::Acquire);
                loop {
                    if gen_of(v) != g {
                        stale = true;
                        break;
                    }
                    let take = tokens_of(v).min(a - have);
                    if take == 0 {
                        break;
                    }
                    match local.compare_exchange_weak(v, v - take, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            have += take;
                            break;
                        }
                        Err(x) => v = x,
                    }
                }
            }
            if have >= a && !stale {
                self.pool.moving.fetch_sub(1, Ordering::AcqRel);
                return Step::Done(Some(open));
            }
            // Not enough (or the bucket closed under us): put back what was taken.
            self.give_back(open, have, false);
            let after = self.pool.moving.fetch_sub(1, Ordering::AcqRel);
            let quiet = (before & 0xFFFF_FFFF) == 0 && (after >> 32) == ((before >> 32) + 1) & 0xFFFF_FFFF;
            if stale {
                // A new bucket or limit was opened meanwhile: start over from its state.
                return Step::Again;
            }
            if quiet {
                if have == 0 {
                    self.pool.drained.store(after.wrapping_sub(1), Ordering::Release);
                }
                return Step::Done(None);
            }
            std::thread::yield_now();
        }
        Step::Done(None)
    }

    /// Closes the open bucket (drains every stripe) and opens the bucket `bucket` for `limit` (or re-opens the
    /// same bucket for a changed limit). Returns at once if someone else already did.
    #[cold]
    #[inline(never)]
    fn open(&self, bucket: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) {
        let mut spins = 0;
        let p = loop {
            let p = self.pool.word.load(Ordering::Acquire);
            if p == CLOSED {
                backoff(&mut spins);
                continue;
            }
            let open = self.meta.bucket.load(Ordering::Acquire);
            if open != NONE && bucket <= open && self.meta.limit.load(Ordering::Acquire) == limit.to_bits() {
                return;
            }
            if self.pool.word.compare_exchange(p, CLOSED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                break p;
            }
        };
        let g = gen_of(p);
        let ng = (g + 1) & GEN_MASK;
        let mut left = tokens_of(p);
        for l in self.locals.iter() {
            let v = l.word.swap(pack(ng, 0), Ordering::AcqRel);
            if gen_of(v) == g {
                left += tokens_of(v);
            }
        }
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
            let prev =
                if open != NONE && bucket == open + 1 { used + self.pool.borrowed.load(Ordering::Acquire) } else { 0 };
            base = prev + bor;
            budget = floor_tokens(limit - base as f64);
            tokens = budget;
        }
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
            return borrowed(bucket * BUCKET_MS);
        }
        let p = self.pool.word.load(Ordering::Acquire);
        let mut left = if p == CLOSED { 0 } else { tokens_of(p) };
        for l in self.locals.iter() {
            left += tokens_of(l.word.load(Ordering::Acquire));
        }
        let used = self.meta.budget.load(Ordering::Acquire).saturating_sub(left);
        if bucket <= open {
            self.pool.base.load(Ordering::Acquire) + used
        } else if bucket == open + 1 {
            used + self.pool.borrowed.load(Ordering::Acquire) + borrowed(bucket * BUCKET_MS)
        } else {
            borrowed(bucket * BUCKET_MS)
        }
    }

    /// Gives a reservation back (if its bucket is still open).
    pub(crate) fn release(&self, r: Reservation) {
        self.give_back(r.bucket_start() / BUCKET_MS, r.count as u64, true);
        if r.secondary() != 0 {
            self.secondary.release_tagged(r.secondary() - 1, r.count);
        }
    }
}

/// Bucket starts and reserved counts (the same geometry as the per-second window); a count is valid for the
/// start beside it, and a bucket is reset by whoever claims its start.
pub(crate) struct CasWindow {
    starts: [AtomicU64; SAMPLES],
    counts: [AtomicU64; SAMPLES],
}

/// A reservation in a [`CasWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CasReservation {
    pub(crate) bucket_start: u64,
    pub(crate) count: u32,
}

impl CasWindow {
    pub(crate) fn new() -> Self {
        CasWindow {
            starts: std::array::from_fn(|_| AtomicU64::new(EMPTY)),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[inline]
    fn current(&self, now_ms: u64, borrowed: &dyn Fn(u64) -> u64) -> usize {
        let b = now_ms / BUCKET_MS;
        let idx = (b % SAMPLES as u64) as usize;
        let start = b * BUCKET_MS;
        loop {
            let s = self.starts[idx].load(Ordering::Acquire);
            if s == start || (s < RESETTING && s > start) {
                return idx;
            }
            if s == RESETTING {
                std::hint::spin_loop();
                continue;
            }
            // Claim the stale bucket: whoever wins the CAS on its start zeroes its count, then publishes it.
            if self.starts[idx].compare_exchange(s, RESETTING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                // Prioritized calls that borrowed this bucket already count in it.
                self.counts[idx].store(borrowed(start), Ordering::Release);
                self.starts[idx].store(start, Ordering::Release);
                return idx;
            }
        }
    }

    fn others(&self, now_ms: u64, cur: usize) -> u64 {
        let mut total = 0;
        for i in 0..self.starts.len() {
            if i == cur {
                continue;
            }
            let s = self.starts[i].load(Ordering::Acquire);
            if s < RESETTING && !deprecated(now_ms, s, INTERVAL_MS) {
                total += self.counts[i].load(Ordering::Acquire);
            }
        }
        total
    }

    /// Reserves `acquire` passes if the window stays within `limit`; `None` means block.
    #[inline]
    pub(crate) fn try_reserve(
        &self,
        now_ms: u64,
        acquire: u32,
        limit: f64,
        borrowed: &dyn Fn(u64) -> u64,
    ) -> Option<CasReservation> {
        let cur = self.current(now_ms, borrowed);
        let others = self.others(now_ms, cur);
        let c = &self.counts[cur];
        let mut v = c.load(Ordering::Acquire);
        loop {
            if (others + v + acquire as u64) as f64 > limit {
                return None;
            }
            match c.compare_exchange_weak(v, v + acquire as u64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Some(CasReservation {
                        bucket_start: self.starts[cur].load(Ordering::Relaxed),
                        count: acquire,
                    })
                }
                Err(now) => v = now,
            }
        }
    }

    /// Whether the window (already holding this call's reservation) is within `limit`.
    pub(crate) fn within(&self, now_ms: u64, limit: f64, borrowed: &dyn Fn(u64) -> u64) -> bool {
        let cur = self.current(now_ms, borrowed);
        (self.others(now_ms, cur) + self.counts[cur].load(Ordering::Acquire)) as f64 <= limit
    }

    /// Gives back `count` reserved in the bucket whose index has these low bits (if it is still there).
    pub(crate) fn release_tagged(&self, bucket_low: u64, count: u32) {
        let idx = (bucket_low % SAMPLES as u64) as usize;
        let s = self.starts[idx].load(Ordering::Acquire);
        if s < RESETTING && (s / BUCKET_MS) & TAG_MASK == bucket_low {
            self.release(CasReservation { bucket_start: s, count });
        }
    }

    /// Gives a reservation back (if its bucket is still there).
    pub(crate) fn release(&self, r: CasReservation) {
        let idx = ((r.bucket_start / BUCKET_MS) % SAMPLES as u64) as usize;
        if self.starts[idx].load(Ordering::Acquire) == r.bucket_start {
            let _ = self.counts[idx]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(r.count as u64)));
        }
    }
}
