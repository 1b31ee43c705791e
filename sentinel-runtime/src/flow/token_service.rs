//! The one interface between the flow check and a cluster token service.
//!
//! A flow rule in cluster mode is decided against a limit shared by every instance. The core knows nothing
//! of how that limit is kept (the Redis service lives in the `cluster` module, behind the `cluster-redis`
//! feature): a service registered on the engine ([`TokenService`]) gets one [`RuleLease`] per cluster rule
//! in force, and keeps it filled with tokens it obtained from the shared limit. The flow check spends them
//! on the calling thread with the exact, lock-free machinery of the local limits
//! ([`AdmissionWindow`]'s lease mode): no network, lock or allocation while tokens are in hand.
//!
//! When the lease runs low, the call that notices tells the service (one flag and a wake-up that must not
//! block). When it is empty, a call waits for the service at most the service's timeout: outside the rules'
//! read section, by blocking the thread ([`Resource::enter`](crate::Resource::enter)) or by awaiting
//! ([`EntryBuilder::enter_async`](crate::EntryBuilder::enter_async) and annotated `async fn`s, through
//! [`pending`]). A call whose wait times out, and every call while the service reports a failure, is decided
//! by the rule's local fallback: a local limit the service sets (count ÷ live instances for global
//! thresholds), or a pass when the rule has no `fallback_to_local_when_fail`. A call never sees an error
//! from the service.

// Without a token service in the build (`cluster-redis`), the service's side of the interface is unused.
#![cfg_attr(not(feature = "cluster-redis"), allow(dead_code))]

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::Waker;

use arc_swap::ArcSwapOption;

use crate::stat::admission::{AdmissionWindow, Mode};

pub(super) mod pending;
mod service;

// `ClusterServiceInfo` for the tests below (through `super::*`).
#[cfg_attr(not(test), allow(unused_imports))]
pub use super::cluster_status::{ClusterRuleMode, ClusterRuleStatus, ClusterServiceInfo};
pub(crate) use service::TokenService;

pub(crate) use crate::wait::{mono_nanos, DeadlineScope, Wait};

use super::rule::{ClusterThresholdType, FallbackInstances, FlowRule};

pub(super) const MODE_LEASING: u8 = 0;
const MODE_FALLBACK: u8 = 1;
pub(super) const MODE_DETACHED: u8 = 2;

/// What the service reports about a lease, for [`ClusterRuleStatus`].
#[derive(Default)]
struct Report {
    key: Option<String>,
    reason: Option<String>,
    live: Option<u64>,
    /// The expected instance count configured (the rule's, else the service's).
    expected: Option<u64>,
}

/// One cluster rule's tokens, filled by the token service and spent by the flow check.
pub(crate) struct RuleLease {
    pub(super) rule: Arc<FlowRule>,
    pub(super) window: AdmissionWindow,
    service: Arc<dyn TokenService>,
    pub(super) mode: AtomicU8,
    /// Engine time (ms) before which an empty lease blocks the call without asking the service.
    pub(super) exhausted_until: AtomicU64,
    /// Bits of the local limit (calls per second) that falling back uses.
    pub(super) fallback_limit: AtomicU64,
    /// How much lower the local limit is while what the shared window held when the service failed is still
    /// in it ([`FallbackDebt`]), and the engine time (ms) from which it is nothing (the cold fallback path
    /// reads the schedule only before then).
    fallback_debt: ArcSwapOption<FallbackDebt>,
    fallback_debt_until: AtomicU64,
    /// Tokens left in the pool below which a call asks for more.
    low_water: AtomicU64,
    /// A call asked for tokens since the service last looked.
    requested: AtomicBool,
    /// The largest acquire count of a call that found too few tokens in hand since the service last looked:
    /// the next lease asks for at least that many, so that a call needing many tokens at once is decided by
    /// the shared window (as Java's token server decides `acquireCount` in one request), not by its wait's
    /// timeout.
    short_for: AtomicU64,
    /// Bumped by the service whenever what callers wait for may have changed.
    pub(super) version: AtomicU64,
    pub(super) timeout_nanos: u64,
    waiters: Mutex<Vec<(u64, Waker)>>,
    changed: Condvar,
    next_waiter: AtomicU64,
    report: Mutex<Report>,
    /// Calls the local fallback admitted, per slot of the rule's window: the service tells the shared limit
    /// about them when it answers again ([`RuleLease::take_local_admissions`]), also after the lease was
    /// dropped (the service keeps the slots: [`RuleLease::local_admissions`]).
    pub(super) local: Arc<LocalAdmissions>,
    pub(crate) counters: LeaseCounters,
    /// The tokens left in hand when the lease was dropped (its rule changed or was removed), and the last
    /// millisecond they could be spent in, for the service to give back (`u64::MAX`: not dropped yet).
    pub(crate) left_at_drop: Arc<(AtomicU64, AtomicU64)>,
}

impl Drop for RuleLease {
    fn drop(&mut self) {
        let (left, until) = &*self.left_at_drop;
        until.store(self.window.lease_valid_until(), Ordering::Relaxed);
        left.store(self.window.lease_left(), Ordering::Release);
    }
}

/// How much lower a rule's local limit is after its service failed, step by step: this instance's share of
/// what the shared window held at the service's last answer, shrinking as that window's buckets leave it.
/// Falling back on a full window then admits what the window frees, as it frees it (never a whole local
/// limit on top of what the leases admitted, never an empty second when buckets leave).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FallbackDebt {
    /// (engine ms before which the step applies, debt), `until` ascending; nothing from the last `until`.
    steps: Box<[(u64, u64)]>,
}

impl FallbackDebt {
    /// A schedule of `(until_ms, debt)` steps, each applying before its `until_ms` (and after the step
    /// before it); sorted here, and made non-increasing (a step never owes less than a later one).
    pub(crate) fn new(mut steps: Vec<(u64, u64)>) -> FallbackDebt {
        steps.sort_unstable();
        let mut owed = 0;
        for step in steps.iter_mut().rev() {
            owed = owed.max(step.1);
            step.1 = owed;
        }
        FallbackDebt { steps: steps.into_boxed_slice() }
    }

    /// The debt at engine time `now_ms`.
    pub(crate) fn at(&self, now_ms: u64) -> u64 {
        // A binary search: a window may have many buckets, and every call of an outage comes here.
        let i = self.steps.partition_point(|(until, _)| *until <= now_ms);
        self.steps.get(i).map_or(0, |(_, debt)| *debt)
    }

    /// The engine time from which the debt is nothing.
    pub(crate) fn until_ms(&self) -> u64 {
        self.steps.last().map_or(0, |(until, _)| *until)
    }
}

/// Calls admitted without a token of the shared limit (by the local fallback: while the service fails, or
/// when a call's wait for it timed out), counted per time slot of the rule's window, so that the service can
/// count them in the shared window once it answers: what an instance admitted on its own is then never
/// granted again to the others in the same window.
///
/// A slot is `slot_ms` long (the rule's bucket, or a few of them when the window has more than
/// [`LocalAdmissions::MAX_SLOTS`] buckets); the ring holds a window and one slot more. Each slot is one word:
/// the slot's index (low 32 bits of `engine_ms / slot_ms`) in the high half, the count in the low half.
/// Recording is a compare-and-swap on the fallback's path (never on the leased path); a slot older than the
/// ring is reused (its count had left the window).
pub(crate) struct LocalAdmissions {
    slot_ms: u64,
    slots: Box<[AtomicU64]>,
}

impl LocalAdmissions {
    /// The most slots a ring has (windows with more buckets use slots of several buckets).
    pub(crate) const MAX_SLOTS: u64 = 32;

    pub(crate) fn for_rule(rule: &FlowRule) -> LocalAdmissions {
        let c = rule.cluster_config.clone().unwrap_or_default();
        let samples = u64::from(c.sample_count.max(1));
        let bucket_ms = (c.window_interval_ms / samples).max(1);
        let per_slot = samples.div_ceil(Self::MAX_SLOTS);
        let slot_ms = bucket_ms.saturating_mul(per_slot);
        let len = samples.div_ceil(per_slot) + 1;
        LocalAdmissions { slot_ms, slots: (0..len).map(|_| AtomicU64::new(0)).collect() }
    }

    /// The length of a slot, ms (a multiple of the rule's bucket).
    pub(crate) fn slot_ms(&self) -> u64 {
        self.slot_ms
    }

    /// Counts `n` calls admitted at engine time `now_ms`.
    pub(crate) fn record(&self, now_ms: u64, n: u64) {
        let index = now_ms / self.slot_ms;
        let tag = index as u32;
        let slot = &self.slots[(index % self.slots.len() as u64) as usize];
        let mut cur = slot.load(Ordering::Acquire);
        loop {
            let have = (cur >> 32) as u32;
            // The slot holds this index, or a later one (a thread whose cached clock lags): add to it (a later
            // slot stays in the window longer, so the count is never early to leave it).
            let next = if cur != 0 && (have.wrapping_sub(tag) as i32) >= 0 {
                (cur & !0xFFFF_FFFF) | ((cur & 0xFFFF_FFFF) + n).min(0xFFFF_FFFF)
            } else {
                (u64::from(tag) << 32) | n.min(0xFFFF_FFFF)
            };
            match slot.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Takes the counts of the slots still within `window_ms` of `now_ms`: (the slot's first engine ms,
    /// calls), oldest first. Taken counts are cleared; older ones are dropped.
    pub(crate) fn take(&self, now_ms: u64, window_ms: u64) -> Vec<(u64, u64)> {
        let newest = now_ms / self.slot_ms;
        let oldest = now_ms.saturating_sub(window_ms) / self.slot_ms;
        let mut out = Vec::new();
        for slot in self.slots.iter() {
            let mut cur = slot.load(Ordering::Acquire);
            while cur & 0xFFFF_FFFF != 0 {
                match slot.compare_exchange_weak(cur, cur & !0xFFFF_FFFF, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        // The full index: the one nearest `newest` with these low bits; one ahead of
                        // `newest` (a thread whose clock leads) counts in `newest`.
                        let behind = (newest as u32).wrapping_sub((cur >> 32) as u32) as i32;
                        let index = newest.saturating_sub(u64::from(behind.max(0).unsigned_abs()));
                        if index >= oldest {
                            out.push((index * self.slot_ms, cur & 0xFFFF_FFFF));
                        }
                        break;
                    }
                    Err(seen) => cur = seen,
                }
            }
        }
        out.sort_unstable();
        out
    }
}

/// Counters of a lease (see [`ClusterRuleStatus`]); written off the common path only.
#[derive(Default)]
pub(crate) struct LeaseCounters {
    pub(crate) leased: AtomicU64,
    pub(crate) returned: AtomicU64,
    pub(crate) round_trips: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) reported: AtomicU64,
    pub(super) waits: AtomicU64,
    pub(super) wait_timeouts: AtomicU64,
    pub(super) fallback: AtomicU64,
    pub(super) exhausted: AtomicU64,
}

impl fmt::Debug for RuleLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuleLease").field("resource", &self.rule.resource).finish_non_exhaustive()
    }
}

impl Mode for RuleLease {
    const OPENS: bool = false;
    #[inline(always)]
    fn took_chunk(&self, left: u64) {
        if left < self.low_water.load(Ordering::Relaxed) {
            self.request();
        }
    }
}

/// The instance count the fallback divides a global count by: the live instances last seen, or the
/// expected count configured, or [`ASSUMED_INSTANCES`](crate::flow::ASSUMED_INSTANCES).
fn fallback_instances_of(r: &Report) -> FallbackInstances {
    FallbackInstances::of(r.live, r.expected)
}

/// The expected instance count of `rule` (its own, else the service's `service`).
fn expected_of(rule: &FlowRule, service: Option<u32>) -> Option<u64> {
    rule.cluster_config.as_ref().and_then(|c| c.expected_instances).or(service).map(u64::from)
}

fn local_limit_of(rule: &FlowRule, live: u64) -> f64 {
    match rule.cluster_config.as_ref().map(|c| c.threshold_type) {
        Some(ClusterThresholdType::Global) => rule.count / live.max(1) as f64,
        _ => rule.count,
    }
}

impl RuleLease {
    fn new(rule: Arc<FlowRule>, service: Arc<dyn TokenService>) -> Self {
        let local = Arc::new(LocalAdmissions::for_rule(&rule));
        let timeout_nanos = u64::try_from(service.timeout().as_nanos()).unwrap_or(u64::MAX);
        let report = Report { expected: expected_of(&rule, None), ..Report::default() };
        let instances = fallback_instances_of(&report).count();
        RuleLease {
            fallback_limit: AtomicU64::new(local_limit_of(&rule, instances).to_bits()),
            fallback_debt: ArcSwapOption::empty(),
            fallback_debt_until: AtomicU64::new(0),
            rule,
            window: AdmissionWindow::new(),
            service,
            mode: AtomicU8::new(MODE_LEASING),
            exhausted_until: AtomicU64::new(0),
            low_water: AtomicU64::new(0),
            requested: AtomicBool::new(false),
            short_for: AtomicU64::new(0),
            version: AtomicU64::new(0),
            timeout_nanos,
            waiters: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            next_waiter: AtomicU64::new(0),
            report: Mutex::new(report),
            local,
            counters: LeaseCounters::default(),
            left_at_drop: Arc::new((AtomicU64::new(u64::MAX), AtomicU64::new(0))),
        }
    }

    /// The rule.
    pub(crate) fn rule(&self) -> &Arc<FlowRule> {
        &self.rule
    }

    // ----- the service's side -----------------------------------------------------------------------------

    /// Replaces the lease in force with `tokens` usable up to engine time `valid_until` (ms, inclusive; 0:
    /// none). Returns the tokens the replaced lease left unspent.
    pub(crate) fn replace(&self, valid_until: u64, tokens: u64) -> u64 {
        self.window.lease_replace(valid_until, tokens)
    }

    /// Adds tokens to the lease valid up to `valid_until`; false if that lease was replaced.
    pub(crate) fn add(&self, valid_until: u64, tokens: u64) -> bool {
        self.window.lease_add(valid_until, tokens)
    }

    /// Gives back `n` tokens a call took from the lease `key` (a later check blocked the call).
    pub(crate) fn release(&self, key: u64, n: u64) {
        self.window.lease_release(key, n);
    }

    /// Tokens in hand and the last millisecond they may be spent in.
    pub(crate) fn in_hand(&self) -> (u64, u64) {
        (self.window.lease_left(), self.window.lease_valid_until())
    }

    /// Whether a call asked for tokens since the last time (and clears the request).
    pub(crate) fn take_request(&self) -> bool {
        self.requested.swap(false, Ordering::AcqRel)
    }

    /// Asks for tokens at once for a call that needs `acquire` of them and found too few in hand.
    pub(crate) fn request_for(&self, acquire: u32) {
        self.short_for.fetch_max(u64::from(acquire), Ordering::AcqRel);
        self.request();
    }

    /// The largest acquire count of a call that found too few tokens in hand since the last time (and clears
    /// it); 0 when none.
    pub(crate) fn take_short_for(&self) -> u64 {
        self.short_for.swap(0, Ordering::AcqRel)
    }

    /// Asks for tokens at once, as a call that found the lease low would.
    pub(crate) fn request(&self) {
        if !self.requested.load(Ordering::Relaxed) && !self.requested.swap(true, Ordering::AcqRel) {
            self.service.wake();
        }
    }

    /// The calls the local fallback admitted within `window_ms` of `now_ms` not taken yet: (engine ms of
    /// their slot's start, calls), oldest first; and the slot length (ms). The service counts them in the
    /// shared window; taking clears them.
    #[cfg(test)]
    pub(crate) fn take_local_admissions(&self, now_ms: u64, window_ms: u64) -> (Vec<(u64, u64)>, u64) {
        (self.local.take(now_ms, window_ms), self.local.slot_ms())
    }

    /// The slots of the calls the local fallback admitted, for the service to take them from after the lease
    /// is dropped (its rule changed or went while the service could not count them).
    pub(crate) fn local_admissions(&self) -> &Arc<LocalAdmissions> {
        &self.local
    }

    /// Counts `n` calls admitted without a token at engine time `now_ms` (as the fallback does).
    #[cfg(test)]
    pub(crate) fn record_local_admissions(&self, now_ms: u64, n: u64) {
        self.local.record(now_ms, n);
    }

    /// Calls blocked so far because the shared window was used up.
    pub(crate) fn exhausted_blocks(&self) -> u64 {
        self.counters.exhausted.load(Ordering::Relaxed)
    }

    /// Calls ask for tokens when a chunk leaves fewer than `n` in the pool.
    pub(crate) fn set_low_water(&self, n: u64) {
        self.low_water.store(n, Ordering::Relaxed);
    }

    /// The shared window is used up until engine time `until_ms` (0: it is not).
    pub(crate) fn set_exhausted_until(&self, until_ms: u64) {
        self.exhausted_until.store(until_ms, Ordering::Release);
    }

    /// Cluster mode works: calls spend leased tokens.
    pub(crate) fn set_leasing(&self, live: Option<u64>) {
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        if live.is_some() {
            r.live = live;
            self.fallback_limit
                .store(local_limit_of(&self.rule, fallback_instances_of(&r).count()).to_bits(), Ordering::Relaxed);
        }
        r.reason = None;
        drop(r);
        self.mode.store(MODE_LEASING, Ordering::Release);
    }

    /// The service fails (`why`): calls are decided by the local fallback (the limit for the live
    /// instances last seen) until [`set_leasing`](Self::set_leasing).
    pub(crate) fn set_fallback(&self, why: String) {
        self.report.lock().unwrap_or_else(|e| e.into_inner()).reason = Some(why);
        self.mode.store(MODE_FALLBACK, Ordering::Release);
    }

    /// The service fails (or answers again while the rule still decides locally): the local limit is lower
    /// by `debt` as long as its schedule says (this instance's share of what the shared window holds).
    pub(crate) fn set_fallback_debt(&self, debt: FallbackDebt) {
        let until = debt.until_ms();
        self.fallback_debt.store(Some(Arc::new(debt)));
        self.fallback_debt_until.store(until, Ordering::Release);
    }

    /// The service's expected instance count (the rule's own, if it has one, wins): what the fallback
    /// divides a global count by until live instances are seen (and at least, once they are).
    pub(crate) fn set_expected_instances(&self, service: Option<u32>) {
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        r.expected = expected_of(&self.rule, service);
        self.fallback_limit
            .store(local_limit_of(&self.rule, fallback_instances_of(&r).count()).to_bits(), Ordering::Relaxed);
    }

    /// How much lower the local limit is at engine time `now_ms`.
    pub(crate) fn fallback_debt_at(&self, now_ms: u64) -> u64 {
        if now_ms >= self.fallback_debt_until.load(Ordering::Acquire) {
            return 0;
        }
        self.fallback_debt.load().as_deref().map_or(0, |d| d.at(now_ms))
    }

    /// The local limit (calls per second) that falling back uses.
    pub(crate) fn local_limit(&self) -> f64 {
        f64::from_bits(self.fallback_limit.load(Ordering::Relaxed))
    }

    /// The service stopped: the rule is decided as with no service.
    pub(crate) fn detach(&self) {
        self.report.lock().unwrap_or_else(|e| e.into_inner()).reason = Some("the token service stopped".into());
        self.mode.store(MODE_DETACHED, Ordering::Release);
        self.window.lease_replace(0, 0);
    }

    /// Where the service keeps the rule (for the status).
    pub(crate) fn set_key(&self, key: String) {
        self.report.lock().unwrap_or_else(|e| e.into_inner()).key = Some(key);
    }

    /// Wakes the calls waiting for this lease: call after every change they may wait for (tokens, the
    /// window used up, a failure).
    pub(crate) fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        let wakers = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_all();
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// This rule's state.
    pub(crate) fn status(&self, now_ms: u64) -> ClusterRuleStatus {
        let (tokens, valid_until) = self.in_hand();
        let r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        let fallback = self.rule.cluster_config.as_ref().is_some_and(|c| c.fallback_to_local_when_fail);
        let mode = match self.mode.load(Ordering::Acquire) {
            MODE_LEASING => ClusterRuleMode::Leasing,
            MODE_FALLBACK if fallback => ClusterRuleMode::Fallback,
            MODE_FALLBACK => ClusterRuleMode::Passing,
            _ => ClusterRuleMode::NoService,
        };
        let c = &self.counters;
        ClusterRuleStatus {
            rule: (*self.rule).clone(),
            key: r.key.clone(),
            mode,
            reason: r.reason.clone(),
            tokens_in_hand: if valid_until >= now_ms { tokens } else { 0 },
            lease_valid_for_ms: (valid_until + 1).saturating_sub(now_ms),
            exhausted_for_ms: self.exhausted_until.load(Ordering::Acquire).saturating_sub(now_ms),
            live_instances: r.live,
            local_limit: f64::from_bits(self.fallback_limit.load(Ordering::Relaxed)),
            fallback_instances: self
                .rule
                .cluster_config
                .as_ref()
                .is_some_and(|c| c.threshold_type == ClusterThresholdType::Global)
                .then(|| fallback_instances_of(&r)),
            tokens_leased: c.leased.load(Ordering::Relaxed),
            tokens_returned: c.returned.load(Ordering::Relaxed),
            round_trips: c.round_trips.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
            wait_timeouts: c.wait_timeouts.load(Ordering::Relaxed),
            fallback_decisions: c.fallback.load(Ordering::Relaxed),
            exhausted_blocks: c.exhausted.load(Ordering::Relaxed),
            local_admissions_reported: c.reported.load(Ordering::Relaxed),
        }
    }

    // ----- the flow check's side --------------------------------------------------------------------------

    /// Spends `acquire` leased tokens if they are in hand (the lone rule's fast path: nothing to give back
    /// later, since no check follows).
    #[inline(always)]
    pub(crate) fn take_in_hand(&self, now_ms: u64, acquire: u32) -> bool {
        acquire > 0 && self.window.lease_take(now_ms, acquire, self).is_some()
    }
}

/// Whether a cluster rule falls back to a local limit (else it passes) when it has no working service.
pub(crate) fn no_service(rule: &FlowRule) -> bool {
    rule.cluster_config.as_ref().is_some_and(|c| c.fallback_to_local_when_fail)
}

/// The engine's cluster registration: the service, if one is registered.
#[derive(Default)]
pub(crate) struct Registration {
    service: Mutex<Option<Arc<dyn TokenService>>>,
}

impl Registration {
    pub(crate) fn service(&self) -> Option<Arc<dyn TokenService>> {
        self.service.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub(crate) fn set(&self, s: Option<Arc<dyn TokenService>>) -> Option<Arc<dyn TokenService>> {
        std::mem::replace(&mut *self.service.lock().unwrap_or_else(|e| e.into_inner()), s)
    }
}

/// The lease of a cluster rule state, made (and attached) on first need when a service is registered.
pub(crate) fn lease_for(
    slot: &OnceLock<Arc<RuleLease>>,
    rule: &Arc<FlowRule>,
    service: &Arc<dyn TokenService>,
    rules: &[FlowRule],
) {
    let mut made = false;
    let lease = slot.get_or_init(|| {
        made = true;
        Arc::new(RuleLease::new(rule.clone(), service.clone()))
    });
    if made {
        service.attach(lease, rules);
    }
}

/// Whether `lease` is bound to `service`.
pub(crate) fn bound_to(lease: &RuleLease, service: &Arc<dyn TokenService>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(&lease.service), Arc::as_ptr(service))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::clock::ManualClock;
    use crate::flow::{ClusterConfig, FlowRule};
    use crate::{BlockError, Sentinel};
    use std::future::Future;
    use std::sync::Weak;

    /// A token service that hands out tokens only when the test says so (or, with `fill_on_wake`, at once).
    struct FakeService {
        leases: Mutex<Vec<Weak<RuleLease>>>,
        wakes: AtomicU64,
        fill_on_wake: u64,
        timeout: Duration,
    }

    impl FakeService {
        fn new(fill_on_wake: u64, timeout: Duration) -> Arc<FakeService> {
            Arc::new(FakeService { leases: Mutex::new(Vec::new()), wakes: AtomicU64::new(0), fill_on_wake, timeout })
        }
        fn lease(&self) -> Arc<RuleLease> {
            self.leases.lock().unwrap().iter().find_map(Weak::upgrade).expect("a lease was attached")
        }
    }

    impl TokenService for FakeService {
        fn attach(&self, lease: &Arc<RuleLease>, _: &[FlowRule]) {
            self.leases.lock().unwrap().push(Arc::downgrade(lease));
        }
        fn wake(&self) {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            if self.fill_on_wake > 0 {
                let lease = self.lease();
                lease.replace(u64::MAX - 1, self.fill_on_wake);
                lease.changed();
            }
        }
        fn timeout(&self) -> Duration {
            self.timeout
        }
        fn info(&self) -> ClusterServiceInfo {
            ClusterServiceInfo {
                kind: "test",
                host: "nowhere".into(),
                port: 0,
                timeout_ms: self.timeout.as_millis() as u64,
                connected: true,
                since_ms: 0,
            }
        }
    }

    const T0: u64 = 1_700_000_000_000;

    fn cluster_rule(resource: &str, count: f64) -> FlowRule {
        FlowRule {
            cluster_mode: true,
            cluster_config: Some(ClusterConfig {
                threshold_type: ClusterThresholdType::Global,
                ..ClusterConfig::default()
            }),
            ..FlowRule::new(resource).count(count)
        }
    }

    fn engine_with(service: &Arc<FakeService>, rules: Vec<FlowRule>) -> (Sentinel, ManualClock) {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        engine.load_flow_rules(rules).unwrap();
        let svc: Arc<dyn TokenService> = service.clone();
        engine.set_cluster_service(Some(svc)).unwrap();
        (engine, clock)
    }

    #[test]
    fn cluster_calls_spend_exactly_the_leased_tokens_then_block_while_the_window_is_used_up() {
        let svc = FakeService::new(0, Duration::from_millis(1));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 100.0)]);
        let lease = svc.lease();
        lease.replace(T0 + 99, 7);
        lease.set_exhausted_until(T0 + 100);
        let api = engine.resource("api");
        let passed = (0..20).filter(|_| api.enter().is_ok()).count();
        assert_eq!(passed, 7, "the leased tokens, no more");
        assert!(matches!(api.enter(), Err(BlockError::Flow { .. })));
        let st = &engine.cluster_status()[0];
        assert_eq!(st.mode, ClusterRuleMode::Leasing);
        assert_eq!(st.exhausted_blocks, 14);
        assert_eq!(st.waits, 0, "a used-up window blocks without waiting for the service");
    }

    #[test]
    fn cluster_call_with_an_empty_lease_waits_for_the_service_and_passes_with_its_tokens() {
        let svc = FakeService::new(3, Duration::from_secs(5));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 100.0)]);
        let api = engine.resource("api");
        assert!(api.enter().is_ok(), "the service filled the lease while the call waited");
        assert_eq!(svc.wakes.load(Ordering::Relaxed), 1);
        assert_eq!(engine.cluster_status()[0].tokens_in_hand, 2);
        assert_eq!(engine.cluster_status()[0].wait_timeouts, 0);
    }

    #[test]
    fn cluster_call_whose_wait_times_out_is_decided_by_the_local_fallback() {
        let svc = FakeService::new(0, Duration::from_millis(1));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 2.0)]);
        svc.lease().set_leasing(Some(1));
        let api = engine.resource("api");
        let passed = (0..5).filter(|_| api.enter().is_ok()).count();
        assert_eq!(passed, 2, "the local fallback limit (count ÷ 1 live instance)");
        let st = &engine.cluster_status()[0];
        assert_eq!(st.wait_timeouts, 5);
        assert_eq!(st.fallback_decisions, 5);
    }

    /// An engine with a global cluster rule of `count` on `api` whose service fails, `live` instances seen.
    fn fallen_back(count: f64, live: u64) -> (Sentinel, ManualClock, Arc<RuleLease>) {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let (engine, clock) = engine_with(&svc, vec![cluster_rule("api", count)]);
        let lease = svc.lease();
        lease.set_leasing(Some(live));
        lease.set_fallback("redis down".into());
        (engine, clock, lease)
    }

    #[test]
    fn cluster_rule_in_fallback_limits_each_instance_to_its_share_of_a_global_count() {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let (engine, clock) = engine_with(&svc, vec![cluster_rule("api", 12.0)]);
        let lease = svc.lease();
        lease.set_leasing(Some(4));
        lease.set_fallback("redis down".into());
        let api = engine.resource("api");
        assert_eq!((0..10).filter(|_| api.enter().is_ok()).count(), 3, "12 ÷ 4 live instances");
        let st = &engine.cluster_status()[0];
        assert_eq!(st.mode, ClusterRuleMode::Fallback);
        assert_eq!(st.reason.as_deref(), Some("redis down"));
        assert_eq!(st.local_limit, 3.0);
        assert_eq!(svc.wakes.load(Ordering::Relaxed), 0, "falling back asks nothing of the service");
        clock.advance_millis(1000);
        lease.set_leasing(None);
        lease.replace(T0 + 1999, 5);
        lease.set_exhausted_until(T0 + 2000);
        assert_eq!((0..10).filter(|_| api.enter().is_ok()).count(), 5, "leasing again");
    }

    #[test]
    fn cluster_rule_without_local_fallback_passes_while_the_service_fails() {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let mut rule = cluster_rule("api", 1.0);
        rule.cluster_config.as_mut().unwrap().fallback_to_local_when_fail = false;
        let (engine, _clock) = engine_with(&svc, vec![rule]);
        svc.lease().set_fallback("redis down".into());
        let api = engine.resource("api");
        assert_eq!((0..10).filter(|_| api.enter().is_ok()).count(), 10);
        assert_eq!(engine.cluster_status()[0].mode, ClusterRuleMode::Passing);
    }

    #[test]
    fn leased_token_is_given_back_when_a_later_rule_blocks_the_call() {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 100.0), FlowRule::new("api").count(0.0)]);
        let lease = svc.lease();
        lease.replace(T0 + 99, 4);
        let api = engine.resource("api");
        assert!(api.enter().is_err(), "the local rule blocks");
        assert_eq!(lease.in_hand().0, 4, "the cluster token came back");
    }

    #[test]
    fn async_cluster_call_awaits_the_lease_without_blocking_and_passes_when_tokens_arrive() {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 100.0)]);
        let api = engine.resource("api");
        let mut fut = std::pin::pin!(api.entry().enter_async());
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "waiting for the service, the thread free");
        assert_eq!(svc.wakes.load(Ordering::Relaxed), 1);
        let lease = svc.lease();
        lease.replace(T0 + 99, 2);
        lease.changed();
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(_entry)) => {}
            other => panic!("expected a pass, got {:?}", other.map(|r| r.map(|_| ()))),
        }
        assert_eq!(lease.in_hand().0, 1);
    }

    #[test]
    fn annotated_async_fn_awaits_the_lease_and_decides_again_with_fresh_arguments() {
        // What `#[sentinel_resource]` generates for an `async fn`: decide, await the wait, decide again.
        let svc = FakeService::new(0, Duration::from_secs(5));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 100.0)]);
        let api = engine.resource("api");
        let mut fut = std::pin::pin!(async {
            let mut wait = crate::__private::AsyncWait::new();
            let mut decisions = 0;
            loop {
                decisions += 1;
                match crate::__private::decide_async(api.entry(), &mut wait) {
                    Some(d) => break (d.map(|_| ()), decisions),
                    None => wait.wait().await,
                }
            }
        });
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        let lease = svc.lease();
        lease.replace(T0 + 99, 1);
        lease.changed();
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready((Ok(()), 2)) => {}
            other => panic!("expected a pass on the second decision, got {:?}", other.map(|(r, n)| (r.is_ok(), n))),
        }
    }

    #[test]
    fn async_wait_that_times_out_decides_by_the_local_fallback() {
        let svc = FakeService::new(0, Duration::from_millis(1));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 1.0)]);
        svc.lease().set_expected_instances(Some(1));
        let api = engine.resource("api");
        assert!(futures::executor::block_on(api.entry().enter_async()).is_ok(), "fallback: 1 per second");
        assert!(futures::executor::block_on(api.entry().enter_async()).is_err(), "fallback: over 1 per second");
        let st = &engine.cluster_status()[0];
        assert_eq!((st.waits, st.wait_timeouts), (2, 2));
    }

    #[test]
    fn local_admissions_are_taken_per_slot_within_the_window_and_only_once() {
        // 1 s in 10 buckets: slots of 100 ms, a ring of 11.
        let rule = cluster_rule("api", 100.0);
        let local = LocalAdmissions::for_rule(&rule);
        assert_eq!(local.slot_ms(), 100);
        local.record(T0 + 5, 1);
        local.record(T0 + 99, 2);
        local.record(T0 + 250, 4);
        assert_eq!(local.take(T0 + 300, 1000), vec![(T0, 3), (T0 + 200, 4)]);
        assert!(local.take(T0 + 300, 1000).is_empty(), "taken once");
        // A slot older than the window is dropped, and its place in the ring reused.
        local.record(T0 + 300, 1);
        assert!(local.take(T0 + 1400, 1000).is_empty());
        local.record(T0 + 1400, 5);
        local.record(T0 + 300, 7); // a caller whose clock lags: counted in the later slot it finds
        assert_eq!(local.take(T0 + 1400, 1000), vec![(T0 + 1400, 12)]);
    }

    #[test]
    fn windows_with_many_buckets_count_local_admissions_in_coarser_slots() {
        let mut rule = cluster_rule("api", 100.0);
        let c = rule.cluster_config.as_mut().unwrap();
        c.window_interval_ms = 60_000;
        c.sample_count = 600;
        let local = LocalAdmissions::for_rule(&rule);
        assert_eq!(local.slot_ms(), 100 * 19, "600 buckets in at most 32 slots");
        assert!(local.slots.len() as u64 * local.slot_ms() >= 60_000 + local.slot_ms());
    }

    #[test]
    fn calls_the_fallback_admits_are_recorded_for_the_service_and_blocked_ones_are_not() {
        let (engine, _clock, lease) = fallen_back(3.0, 1);
        let api = engine.resource("api");
        assert_eq!((0..10).filter(|_| api.enter().is_ok()).count(), 3);
        let (slots, _) = lease.take_local_admissions(T0, 1000);
        assert_eq!(slots.iter().map(|(_, n)| n).sum::<u64>(), 3, "the 3 admitted, not the 7 blocked");
    }

    #[test]
    fn falling_back_mid_second_counts_what_the_lease_admitted_against_the_local_limit() {
        let (engine, clock, lease) = fallen_back(10.0, 1);
        lease.set_fallback_debt(FallbackDebt::new(vec![(T0 + 1000, 8)]));
        let api = engine.resource("api");
        assert_eq!((0..10).filter(|_| api.enter().is_ok()).count(), 2, "10 per second, 8 of them leased");
        clock.advance_millis(1000);
        assert_eq!((0..20).filter(|_| api.enter().is_ok()).count(), 10, "a second later: the whole local limit");
    }

    #[test]
    fn the_fallback_debt_shrinks_step_by_step_and_the_local_limit_admits_what_each_step_frees() {
        let (engine, clock, lease) = fallen_back(10.0, 1);
        // The shared window held 10 when the service failed: 6 of it leaves at T0 + 100, 2 more at T0 + 500,
        // the rest at T0 + 900.
        lease.set_fallback_debt(FallbackDebt::new(vec![(T0 + 100, 10), (T0 + 500, 4), (T0 + 900, 2)]));
        let api = engine.resource("api");
        let admitted = |n: usize| (0..n).filter(|_| api.enter().is_ok()).count();
        assert_eq!(admitted(5), 0, "the window was full");
        clock.advance_millis(100);
        assert_eq!(admitted(10), 6, "what the first bucket freed");
        clock.advance_millis(400);
        assert_eq!(admitted(10), 2);
        clock.advance_millis(400);
        assert_eq!(admitted(10), 2, "the rest: 10 in the second, never more");
        assert_eq!(lease.fallback_debt_at(T0 + 900), 0);
        assert_eq!(FallbackDebt::new(vec![(T0 + 5, 1), (T0 + 9, 3)]).at(T0), 3, "never owes less than later");
    }

    #[test]
    fn cluster_rule_without_a_service_is_decided_locally_with_its_whole_count() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock).build();
        engine.load_flow_rules([cluster_rule("api", 2.0)]).unwrap();
        let api = engine.resource("api");
        assert_eq!((0..5).filter(|_| api.enter().is_ok()).count(), 2);
        assert_eq!(engine.cluster_status()[0].mode, ClusterRuleMode::NoService);
    }

    #[test]
    fn the_fallback_divides_a_global_count_by_the_instances_seen_or_configured_and_never_takes_it_whole() {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let mut configured = cluster_rule("configured", 90.0);
        configured.cluster_config.as_mut().unwrap().expected_instances = Some(3);
        let (_engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 100.0), configured]);
        let leases: Vec<Arc<RuleLease>> = svc.leases.lock().unwrap().iter().filter_map(Weak::upgrade).collect();
        let of = |resource: &str| leases.iter().find(|l| l.rule().resource == resource).unwrap().clone();
        let (api, configured) = (of("api"), of("configured"));
        let instances = |l: &RuleLease| l.status(T0).fallback_instances;
        // Nothing seen, nothing configured: a conservative share, never the whole count.
        assert_eq!(instances(&api), Some(FallbackInstances::Assumed(crate::flow::ASSUMED_INSTANCES)));
        assert_eq!(api.local_limit(), 100.0 / crate::flow::ASSUMED_INSTANCES as f64);
        // The client's expected count; the rule's own wins over it.
        api.set_expected_instances(Some(2));
        configured.set_expected_instances(Some(2));
        assert_eq!(instances(&api), Some(FallbackInstances::Configured(2)));
        assert_eq!(api.local_limit(), 50.0);
        assert_eq!(instances(&configured), Some(FallbackInstances::Configured(3)));
        assert_eq!(configured.local_limit(), 30.0);
        // Seen: more than expected counts; fewer (instances still cold) does not lower it.
        api.set_leasing(Some(5));
        assert_eq!(instances(&api), Some(FallbackInstances::Seen(5)));
        assert_eq!(api.local_limit(), 20.0);
        api.set_leasing(Some(1));
        assert_eq!(instances(&api), Some(FallbackInstances::Configured(2)));
        assert_eq!(api.local_limit(), 50.0);
        api.set_fallback("redis down".into());
        let shown = api.status(T0).to_string();
        assert!(shown.contains("count ÷ 2 expected instances configured"), "{shown}");
    }

    #[test]
    fn registering_a_service_leases_for_the_cluster_rules_already_in_force_and_keeps_local_ones() {
        let svc = FakeService::new(0, Duration::from_secs(5));
        let (engine, _clock) = engine_with(&svc, vec![cluster_rule("api", 2.0), FlowRule::new("db").count(1.0)]);
        assert_eq!(svc.leases.lock().unwrap().len(), 1, "only the cluster rule has a lease");
        // Reloading an equal set keeps the lease (and its tokens).
        svc.lease().replace(T0 + 99, 9);
        engine.load_flow_rules([cluster_rule("api", 2.0), FlowRule::new("db").count(1.0)]).unwrap();
        assert_eq!(svc.lease().in_hand().0, 9);
        assert_eq!(svc.leases.lock().unwrap().len(), 1);
    }
}
