//! The lease API of an [`AdmissionWindow`]: a token service's owner replaces or tops up the tokens as a whole,
//! and callers spend them with the same machinery as a bucket's (see the module above).

use std::sync::atomic::Ordering;

use super::{gen_of, spent_in, tokens_of, AdmissionWindow, Mode, CLOSED, MAX_TOKENS, NONE};

/// The limit a lease's tokens are tagged with (any fixed value: leases have no limit of their own).
const LEASE_LIMIT: f64 = 0.0;

impl AdmissionWindow {
    /// Spends `acquire` tokens of the lease in force if `now_ms` is within it (at most its `valid_until`);
    /// returns the lease's key (its `valid_until`) for [`lease_release`](Self::lease_release), or `None`:
    /// not enough tokens left, or the lease expired. Leases are the same exact machinery as the buckets: the
    /// common call spends from the thread's own stripe with plain stores.
    #[inline(always)]
    pub(crate) fn lease_take<M: Mode>(&self, now_ms: u64, acquire: u32, mode: &M) -> Option<u64> {
        debug_assert!(!M::OPENS);
        self.reserve_in(now_ms, now_ms, acquire, LEASE_LIMIT, &|_| 0, mode)
    }

    /// Replaces the lease in force (its unspent tokens are taken out) with `tokens` usable up to
    /// `valid_until` (ms, inclusive; 0: none). Returns the tokens the replaced lease left unspent. Tokens a
    /// caller was moving from the pool to its stripe at that moment count as spent (never as left).
    pub(crate) fn lease_replace(&self, valid_until: u64, tokens: u64) -> u64 {
        let (ng, left) = self.close(usize::MAX, || false).unwrap_or((0, 0));
        let tokens = tokens.min(MAX_TOKENS);
        // A budget no call exceeds: a lease is topped up without a new budget.
        self.publish(ng, valid_until, LEASE_LIMIT, 0, 0, MAX_TOKENS, tokens);
        left
    }

    /// Adds `tokens` to the lease valid up to `valid_until`; false if that lease was replaced (the tokens
    /// were not added).
    pub(crate) fn lease_add(&self, valid_until: u64, tokens: u64) -> bool {
        self.meta.limit.load(Ordering::Acquire) == LEASE_LIMIT.to_bits() && self.give_back(valid_until, tokens, true)
    }

    /// Gives back `n` tokens taken from the lease `key` (if it is still in force).
    pub(crate) fn lease_release(&self, key: u64, n: u64) {
        let _ = self.give_back(key, n, true);
    }

    /// The tokens of the lease in force not spent yet (an estimate while callers take them).
    pub(crate) fn lease_left(&self) -> u64 {
        let p = self.pool.word.load(Ordering::Acquire);
        if p == CLOSED {
            return 0;
        }
        let g = gen_of(p);
        let owned = self.owned();
        let mut left = tokens_of(p);
        for (k, l) in self.locals.iter().enumerate() {
            let v = l.word.load(Ordering::Acquire);
            if gen_of(v) != g {
                continue;
            }
            let s = if k < owned { spent_in(l.spent.load(Ordering::Acquire), g) } else { 0 };
            left += tokens_of(v).saturating_sub(s);
        }
        left
    }

    /// The `valid_until` of the lease in force (0 when none).
    pub(crate) fn lease_valid_until(&self) -> u64 {
        match self.meta.bucket.load(Ordering::Acquire) {
            NONE => 0,
            v => v,
        }
    }
}
