//! One cluster rule's lease, seen from the client: how many tokens to ask for, when, and what a reply means
//! for the tokens in hand.
//!
//! **Exactness.** Redis counts tokens per bucket of the rule's sliding window (`window_interval_ms /
//! sample_count` long) and grants at most what keeps every window within the limit. Tokens granted in a
//! bucket may be spent only while that bucket lasts: the lease's last millisecond is computed from the
//! Redis time the script read (`T`), the bucket's end (`E`) and the engine time before the call was sent
//! (`t0`) as `t0 + (E − T) − margin`. Since Redis read `T` after `t0`, the bucket cannot have ended by
//! then on Redis's clock, so no token is spent outside the bucket it was counted in (up to the margin,
//! which covers the clocks' rates and the cached clock's resolution). Tokens left when a lease ends are
//! given back to their bucket with the next call, in numbered batches sent again until a reply shows them
//! applied (the script applies each batch once), so the window counts only what was spent, also when the
//! give-back's first call failed.
//!
//! **Falling back.** Each reply lists what every bucket of the window holds. When Redis fails, the local
//! limit owes this instance's share of that (its local limit over the window's allowance, per token) until
//! each bucket leaves the window, at an engine time estimated never early (plus the other instances' shares
//! of what it was granted in the last two buckets, which their own last replies may not show): the
//! fallbacks together admit what the window frees, as it frees it, and a failure on a full window admits
//! nothing only until its oldest bucket leaves.
//!
//! **Few round trips.** The client measures the rate its leases served on this instance (tokens spent per
//! ms; calls that found no token, decided locally or blocked, do not count: a lease sized by them would sit
//! unspent) and asks for what it expects to spend until the lease ends (plus a quarter; at least a small
//! share of a bucket), at most a fair share of what the window had left (`left ÷ live instances`) per call,
//! so at a steady rate one call per bucket suffices, and no instance holds much more than it spends while
//! others find the window used up; callers ask for more when
//! the pool falls below what a round trip's worth of calls needs (the low-water mark), before it runs dry.
//! A lease call is held back only in the last round trips of a bucket (its tokens could not be spent in
//! it). While the window is used up, Redis says when it frees room again and calls block locally until
//! then, or until Redis's next bucket at the latest (leases that end give their unspent tokens back),
//! without a round trip each.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::flow::token_service::{FallbackDebt, LocalAdmissions, RuleLease};
use crate::flow::{ClusterThresholdType, FlowRule};

use super::keys::RuleKeys;
use super::script::{LeaseCall, LeaseReply};

/// The number before a member's first batch or call: above any this member used before it restarted under
/// the same name (fewer than a thousand a ms). At most 2^52, so that numbers stay below 2^53, the largest the
/// script reads (past it a number reads as nothing: every batch sent again would be applied again) whatever
/// time Redis's clock read.
fn first_number(at: &CallAt) -> u64 {
    u64::try_from(at.clock.redis_ms(at.now_ms)).unwrap_or(0).saturating_mul(1000).min(1 << 52)
}

/// When a call is made: the instant and engine time, and Redis's clock as last seen.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallAt {
    pub(crate) now: Instant,
    pub(crate) now_ms: u64,
    pub(crate) clock: RedisClock,
}

/// When a call was made: engine time before it was sent and after its reply, its round trip, the instant it
/// was applied, and the membership renewal interval.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallTimes {
    pub(crate) t0_ms: u64,
    pub(crate) t1_ms: u64,
    pub(crate) rtt: Duration,
    pub(crate) now: Instant,
    pub(crate) beat: Duration,
}

/// What the client knows of Redis's clock, from its replies (the scripts' `TIME`, and a `TIME` when the
/// client connects and probes).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RedisClock {
    /// A Redis time and the instant its reply arrived: Redis read it before then, so times estimated from it
    /// are never ahead of Redis's.
    anchor: Option<(Instant, i64)>,
    /// Redis time minus engine time, from a reply and the engine time before its call was sent: never less
    /// than the true difference (up to the engine clock's resolution).
    ahead_of_engine: Option<i64>,
}

impl RedisClock {
    /// A reply read Redis time `redis_ms`; its call was sent at engine time `sent_ms`, the reply arrived at
    /// `received`.
    pub(crate) fn observe(&mut self, redis_ms: i64, sent_ms: u64, received: Instant) {
        self.anchor = Some((received, redis_ms));
        self.ahead_of_engine = Some(redis_ms.saturating_sub(i64::try_from(sent_ms).unwrap_or(i64::MAX)));
    }

    /// The Redis time from which a call sent at `now` is late (its caller gave up after `timeout`): 0 (no
    /// deadline) until Redis answered once. Never later than the caller's own deadline on Redis's clock, so
    /// a call Redis runs after its caller gave up grants nothing.
    pub(crate) fn deadline(&self, now: Instant, timeout: Duration) -> i64 {
        match self.anchor {
            Some((at, ms)) => {
                let since = i64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(i64::MAX / 2);
                let timeout = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX / 4);
                ms.saturating_add(since).saturating_add(timeout.max(1))
            }
            None => 0,
        }
    }

    /// The Redis time at engine time `engine_ms` (never earlier than the true one; the same when unknown).
    fn redis_ms(&self, engine_ms: u64) -> i64 {
        (engine_ms as i64).saturating_add(self.ahead_of_engine.unwrap_or(0))
    }
}

/// What the window held per bucket at a reply, and when: the engine time the reply arrived and the Redis
/// time the script read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WindowSeen {
    arrived_ms: u64,
    redis_ms: i64,
    /// (bucket index, tokens), oldest first.
    buckets: Vec<(i64, u64)>,
}

impl WindowSeen {
    /// The engine time by which Redis's clock has passed the end of `bucket` (at the latest: Redis read
    /// `redis_ms` before the reply arrived).
    fn bucket_end_ms(&self, bucket: i64, bucket_ms: u64) -> i64 {
        let end = bucket.saturating_add(1).saturating_mul(bucket_ms as i64);
        (self.arrived_ms as i64).saturating_add(end.saturating_sub(self.redis_ms))
    }
}

/// The lease in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Current {
    /// The Redis bucket its tokens were counted in.
    bucket: i64,
    /// Its last millisecond, engine time.
    valid_until: u64,
}

/// The client's side of one rule.
pub(crate) struct Driver {
    pub(crate) lease: Weak<RuleLease>,
    /// What the lease held when it was dropped ([`RuleLease::left_at_drop`]).
    left_at_drop: Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64)>,
    /// The calls the lease's fallback admitted ([`RuleLease::local_admissions`]): still taken after the lease
    /// is dropped.
    local: Arc<LocalAdmissions>,
    pub(crate) keys: RuleKeys,
    /// Tokens per window: per instance for average-local thresholds, for all of them for global ones.
    allowance: f64,
    global: bool,
    bucket_ms: u64,
    sample_count: u32,
    margin_ms: u64,
    cur: Option<Current>,
    /// Tokens to give back, not sent yet: (bucket, count).
    returns: Vec<(i64, u64)>,
    /// Tokens given back in numbered batches no reply has shown applied yet: (batch, bucket, count). Sent
    /// again with every call (the script applies each batch once), so a give-back whose call failed (Redis
    /// down, hung, refusing) is applied when Redis answers again.
    unconfirmed: Vec<(u64, i64, u64)>,
    /// The last batch number used (0: none yet; the first is numbered from Redis's clock, so that an
    /// instance that restarts under the same name numbers its batches above those of its previous life).
    batch: u64,
    /// Calls the local fallback admitted, to count in the window: (bucket, count). Kept until a call that
    /// carried them got its reply (sent again after a failure; the script takes out what a call whose
    /// reply was not seen counted, so they are counted once).
    admitted: Vec<(i64, u64)>,
    /// The last call's number (0: none yet; the first is numbered from Redis's clock, as batches are), and
    /// the number of the first call whose reply was not seen since the last one that was: the script undoes
    /// what the last of those that ran counted (see the script's docs).
    seq: u64,
    unseen_from: Option<u64>,
    /// Which of the member's records in the window this driver's calls keep (see [`LeaseCall::record`]):
    /// the worker numbers the drivers of one window (several rules of one flowId) apart.
    pub(crate) record: u64,
    /// The window's length, ms.
    window_ms: u64,
    /// How long a caller waits for a lease call (the deadline each call carries).
    timeout: Duration,
    /// Tokens put in the pool so far, and given back so far (to measure what was spent).
    issued: u64,
    returned: u64,
    /// Demand on this instance, calls per ms (tokens spent, and calls that found no token: blocked on a
    /// used-up window or decided locally after a timed-out wait), and when it was last measured (with that
    /// count).
    rate: f64,
    measured: Option<(Instant, u64)>,
    /// Round trip, ms.
    rtt_ms: f64,
    pub(crate) live: u64,
    /// The largest live count seen within [`Driver::live_hold`] of now, and when it was last seen: what the
    /// fallback divides a global count by (see [`Driver::fallback_live`]).
    live_peak: Option<(u64, Instant)>,
    /// How long a lower live count must persist before the fallback believes it (twice the membership TTL;
    /// the worker sets it).
    pub(crate) live_hold: Duration,
    next_beat: Instant,
    /// The renewal interval (from the last reply's call), and the tokens spent from leases when the lease in
    /// force was last seen in hand at a renewal ([`Driver::release_idle`]).
    beat: Duration,
    idle_mark: Option<(Instant, u64)>,
    /// The window is used up until this engine time; `exhausted_seen`: the lease's count of calls blocked
    /// for it, when last looked at (more since means demand: ask again as soon as it frees room).
    exhausted_until: u64,
    exhausted_seen: u64,
    /// The engine time by which Redis is in the bucket after the last reply's (its latest estimate): a call
    /// made before it, once the lease ended, would get tokens it could not spend.
    next_bucket_at: u64,
    /// Calls wanted tokens while no lease call was worth making ([`Driver::hold_until`]): lease as soon as
    /// one is.
    pub(crate) ask_when_free: bool,
    /// The window's generation as last seen (0: none yet), and the tokens granted to this instance per
    /// bucket still in the window, net of those given back: counted again in a window made afresh.
    generation: i64,
    granted_by_bucket: Vec<(i64, u64)>,
    /// Tokens still free in the window at the last reply (`u64::MAX` before one).
    last_left: u64,
    /// What the window held per bucket at the last reply: what a fallback starting before the next one owes.
    window_seen: Option<WindowSeen>,
    /// Redis answers again after failing: the rule stays on its local limit until then, while the other
    /// instances come back and count what their fallbacks admitted (see [`Driver::resume_after`]).
    pub(crate) probation_until: Option<Instant>,
}

impl Driver {
    pub(crate) fn new(
        lease: &Arc<RuleLease>,
        keys: RuleKeys,
        margin: Duration,
        timeout: Duration,
        now: Instant,
    ) -> Driver {
        let rule: &FlowRule = lease.rule();
        let c = rule.cluster_config.clone().unwrap_or_default();
        Driver {
            admitted: Vec::new(),
            window_ms: c.window_interval_ms.max(1),
            timeout,
            lease: Arc::downgrade(lease),
            live_peak: None,
            live_hold: Duration::from_secs(6),
            left_at_drop: lease.left_at_drop.clone(),
            local: lease.local_admissions().clone(),
            keys,
            allowance: rule.count * c.window_interval_ms as f64 / 1000.0,
            global: c.threshold_type == ClusterThresholdType::Global,
            bucket_ms: (c.window_interval_ms / c.sample_count.max(1) as u64).max(1),
            sample_count: c.sample_count.max(1),
            margin_ms: u64::try_from(margin.as_millis()).unwrap_or(u64::MAX),
            cur: None,
            returns: Vec::new(),
            unconfirmed: Vec::new(),
            batch: 0,
            seq: 0,
            unseen_from: None,
            record: 0,
            issued: 0,
            returned: 0,
            rate: 0.0,
            measured: None,
            rtt_ms: 1.0,
            live: 1,
            next_beat: now,
            beat: Duration::from_secs(1),
            idle_mark: None,
            exhausted_until: 0,
            exhausted_seen: 0,
            next_bucket_at: 0,
            ask_when_free: false,
            generation: 0,
            granted_by_bucket: Vec::new(),
            last_left: u64::MAX,
            window_seen: None,
            probation_until: None,
        }
    }

    /// The tokens per window for the live instances last seen.
    fn window_allowance(&self) -> f64 {
        if self.global {
            self.allowance
        } else {
            self.allowance * self.live.max(1) as f64
        }
    }

    /// Tokens spent from the leases so far.
    fn spent(&self, lease: &RuleLease) -> u64 {
        let (in_hand, valid_until) = lease.in_hand();
        let in_hand = if self.cur.is_some_and(|c| c.valid_until == valid_until) { in_hand } else { 0 };
        self.issued.saturating_sub(self.returned).saturating_sub(in_hand)
    }

    /// How much lower the local limit is from engine time `now_ms` if the client falls back now: this
    /// instance's share of what the window held at the last reply (its part of the local limit over the
    /// window's allowance, per token), step by step as the window's buckets leave it. Each bucket leaves at
    /// an engine time estimated never early (from the reply's arrival: Redis read its time before), so the
    /// instances' fallbacks together admit at most what the window frees, as it frees it.
    pub(crate) fn fallback_debt(&self, lease: &RuleLease, now_ms: u64) -> FallbackDebt {
        let Some(seen) = &self.window_seen else { return FallbackDebt::default() };
        let share = lease.local_limit() / self.window_allowance().max(f64::MIN_POSITIVE);
        let span = i64::from(self.sample_count).saturating_mul(self.bucket_ms as i64);
        // What this instance was granted in the last two buckets of the reply may be missing from the other
        // instances' last replies (a busy instance leases every bucket): it owes their shares of it too, so
        // that the fallbacks together count it whole.
        let newest = seen.buckets.last().map_or(i64::MIN, |(b, _)| *b);
        let others = self.live.max(1) - 1;
        let weight = |bucket: i64, n: u64| match self.granted_by_bucket.iter().find(|(b, _)| *b == bucket) {
            Some((_, mine)) if bucket >= newest.saturating_sub(1) => n.saturating_add(others.saturating_mul(*mine)),
            _ => n,
        };
        // Held at u64::MAX (a reply's counts may sum past it): owing everything, never a wrapped sum.
        let total = seen.buckets.iter().fold(0u64, |sum, (b, n)| sum.saturating_add(weight(*b, *n)));
        let mut held = total;
        let mut steps = Vec::with_capacity(seen.buckets.len());
        for (bucket, n) in &seen.buckets {
            let leaves = seen.bucket_end_ms(*bucket, self.bucket_ms).saturating_add(span - self.bucket_ms as i64);
            let debt = (held as f64 * share).ceil() as u64;
            if leaves > now_ms as i64 && debt > 0 {
                steps.push((leaves as u64, debt));
            }
            if total < u64::MAX {
                held -= weight(*bucket, *n);
            }
        }
        FallbackDebt::new(steps)
    }

    /// Redis answers again at `now`: the rule keeps its local limit for `pause` so that every instance has
    /// come back and counted what its fallback admitted before this one leases again. Meanwhile it reports
    /// its own local admissions every bucket (at least every 10 ms apart).
    pub(crate) fn resume_after(&mut self, now: Instant, pause: Duration) {
        self.probation_until = Some(now + pause);
        self.next_beat = now;
    }

    /// Whether the rule still waits to lease again ([`resume_after`](Self::resume_after)).
    pub(crate) fn on_probation(&self, now: Instant) -> bool {
        self.probation_until.is_some_and(|t| now < t)
    }

    /// Measures the rate this instance served from its leases (tokens spent per ms) since the last measure.
    /// Calls that found no token (blocked on a used-up window, or decided locally after a wait or while
    /// Redis failed) do not count: a lease sized by them would hold tokens nobody spends.
    fn measure(&mut self, lease: &RuleLease, now: Instant) {
        let spent = self.spent(lease);
        if let Some((t, s)) = self.measured {
            let dt = now.duration_since(t).as_secs_f64() * 1000.0;
            if dt >= 1.0 {
                let r = spent.saturating_sub(s) as f64 / dt;
                self.rate = if self.rate == 0.0 { r } else { 0.5 * self.rate + 0.5 * r };
                self.measured = Some((now, spent));
            }
        } else {
            self.measured = Some((now, spent));
        }
    }

    /// How long (ms) a lease granted at engine time `now_ms` could be spent: until Redis's current bucket
    /// ends (from the last reply, or from Redis's clock when that reply is older than a bucket).
    fn bucket_left_ms(&self, now_ms: u64, clock: &RedisClock) -> u64 {
        if self.next_bucket_at > now_ms && self.next_bucket_at - now_ms <= self.bucket_ms {
            return self.next_bucket_at - now_ms;
        }
        let into = clock.redis_ms(now_ms).rem_euclid(self.bucket_ms as i64) as u64;
        self.bucket_ms - into
    }

    /// The most one lease call may take: a fair share (÷ live instances) of what the window had left at the
    /// last reply (of the whole window before one, or once the window was used up: its room is unknown until
    /// the next reply).
    fn fair_share(&self) -> u64 {
        let window = self.window_allowance();
        let room = match self.last_left {
            0 | u64::MAX => window,
            left => window.min(left as f64),
        };
        (room / self.live.max(1) as f64).ceil().max(1.0) as u64
    }

    /// How many tokens to ask for at engine time `now_ms`: what this instance spends, at the rate its leases
    /// served, until the lease would end (plus a quarter), less what it holds; at least a small share of a
    /// bucket (a quiet instance, or one that just resumed, gets a useful first lease, given back unspent
    /// when it ends); never more than [`fair_share`](Self::fair_share), unless a call waits for more than
    /// is in hand (`short_for`, its acquire count): then at least what it lacks (Redis grants what the window
    /// has left; a call that needs more than that is blocked on the used-up window, as Java's token server
    /// blocks it).
    fn want(&self, lease: &RuleLease, now_ms: u64, clock: &RedisClock, short_for: u64) -> u64 {
        let (in_hand, horizon) = match self.cur {
            Some(c) if c.valid_until >= now_ms => (lease.in_hand().0, c.valid_until - now_ms + 1),
            _ => (0, self.bucket_left_ms(now_ms, clock)),
        };
        // At most what the limit itself admits over the lease's life (its rate over the horizon, a quarter
        // more), or one bucket's share of the window if that is more: a burst's rate, measured over a few
        // ms, must not take a long window whole for a lease that may end unspent (a hang).
        let limit_rate = self.window_allowance() / self.window_ms.max(1) as f64;
        let cap = (limit_rate * horizon as f64 * 1.25).max(self.window_allowance() / self.sample_count.max(1) as f64);
        let spend = (self.rate * horizon as f64 * 1.25).min(cap).ceil();
        let floor = (self.window_allowance() / (self.sample_count as f64 * self.live.max(1) as f64 * 2.0)).floor();
        let want = (spend.max(floor).max(1.0) as u64).saturating_sub(in_hand).clamp(1, self.fair_share());
        want.max(short_for.saturating_sub(in_hand))
    }

    /// Until when (engine ms) no lease call is worth making: the window is used up, or the lease of the
    /// current bucket ended (its margin) and Redis is not in the next bucket yet; 0 when a call is worth it.
    pub(crate) fn hold_until(&self, now_ms: u64) -> u64 {
        if now_ms < self.exhausted_until {
            return self.exhausted_until;
        }
        // Tokens granted now would arrive too late to be spent in Redis's current bucket (they would be
        // given back at once): only in its last round trips and margin. Earlier in the bucket a call is
        // worth it, whether or not a lease was granted in it yet.
        let lease_over = self.cur.is_none_or(|c| now_ms > c.valid_until);
        let too_late_from = self.next_bucket_at.saturating_sub(self.margin_ms + 1 + (2.0 * self.rtt_ms).ceil() as u64);
        if lease_over && now_ms >= too_late_from && now_ms < self.next_bucket_at {
            return self.next_bucket_at;
        }
        0
    }

    /// Whether calls were blocked on the used-up window since the last look (ask as soon as it frees room).
    pub(crate) fn demand_while_exhausted(&mut self, lease: &RuleLease) -> bool {
        let blocked = lease.exhausted_blocks();
        let more = blocked > self.exhausted_seen;
        self.exhausted_seen = blocked;
        more
    }

    /// The lease call to make now.
    pub(crate) fn lease_call(&mut self, lease: &RuleLease, member: &str, ttl: Duration, at: &CallAt) -> LeaseCall {
        self.measure(lease, at.now);
        let want = self.want(lease, at.now_ms, &at.clock, lease.take_short_for());
        self.call(want, member, ttl, at)
    }

    /// Gives the tokens of the lease in force back (with the next call) when none of them was spent for a
    /// renewal interval: an idle instance does not keep the others under the limit until its lease's bucket
    /// ends, as Java's token server lets whoever asks have the window's room. (It leases again when a call
    /// finds its lease empty.)
    pub(crate) fn release_idle(&mut self, lease: &RuleLease, now: Instant) {
        let Some(c) = self.cur else {
            self.idle_mark = None;
            return;
        };
        let spent = self.spent(lease);
        match self.idle_mark {
            Some((since, s)) if s == spent => {
                if now.duration_since(since) >= self.beat {
                    let left = lease.replace(0, 0);
                    self.cur = None;
                    self.idle_mark = None;
                    self.give_back(lease, c.bucket, left);
                }
            }
            _ => self.idle_mark = Some((now, spent)),
        }
    }

    /// A membership renewal (no tokens), giving back what is due and counting what the fallback admitted.
    pub(crate) fn beat_call(&mut self, member: &str, ttl: Duration, at: &CallAt) -> LeaseCall {
        self.call(0, member, ttl, at)
    }

    /// Leaving the rule's member set (the rule is gone, or the client stops), with what is due: the tokens
    /// a dropped lease still held are given back.
    pub(crate) fn leave_call(&mut self, member: &str, at: &CallAt) -> (RuleKeys, LeaseCall) {
        self.settle_dropped(at);
        let call = self.call(0, member, Duration::ZERO, at);
        (self.keys.clone(), call)
    }

    /// Once the lease is dropped: the tokens it still held go back, and what its fallback admitted since the
    /// last look is taken to be counted.
    fn settle_dropped(&mut self, at: &CallAt) {
        if self.lease.strong_count() > 0 {
            return;
        }
        let (left, until) = &*self.left_at_drop;
        let left = left.load(std::sync::atomic::Ordering::Acquire);
        if let Some(c) = self.cur.take().filter(|_| left != u64::MAX && left > 0)
            && until.load(std::sync::atomic::Ordering::Relaxed) == c.valid_until
        {
            self.returned = self.returned.saturating_add(left);
            self.add_return(c.bucket, left);
        }
        self.take_local_admissions(at);
    }

    /// Takes over what `gone` had not settled with Redis: `gone` drove the rule this driver's rule replaced
    /// (its count changed, say), under the same window key and member, and its lease is dropped. What its
    /// fallback admitted and the tokens it holds or gave back are counted by this driver's calls instead of a
    /// leave call (which would drop the member's records this driver goes on with), also when Redis does not
    /// answer now. It goes on above both drivers' numbering of calls and give-backs (Redis reads a call
    /// numbered at or below its record as late), with the newer view of the window (what a fallback owes) and
    /// `gone`'s grants (counted again in a window made afresh); what it takes over can only be counted twice,
    /// never missed.
    pub(crate) fn take_over(&mut self, mut gone: Driver, at: &CallAt) {
        gone.settle_dropped(at);
        gone.batch_returns(at);
        // Redis records the highest-numbered call of the member that ran and reads any call numbered at or
        // below it as late (it counts nothing): go on above both drivers' numbers. Undo only calls numbered
        // above the last either driver saw settled (a seen call is never undone; an unseen one below it is
        // counted twice at worst).
        // The lower of the two records goes on: a rule that replaced a gone one (its count changed) keeps
        // its record, and a rule that shares the window with another keeps the record it had.
        self.record = self.record.min(gone.record);
        if gone.seq > 0 {
            let settled = |d: &Driver| d.unseen_from.map_or(d.seq, |u| u - 1);
            let last_settled = settled(self).max(settled(&gone));
            self.unseen_from = [(self.unseen_from, self.seq), (gone.unseen_from, gone.seq)]
                .into_iter()
                .filter_map(|(u, s)| u.map(|u| u.max(last_settled + 1)).filter(|u| *u <= s))
                .min();
            self.seq = self.seq.max(gone.seq);
        }
        // Batches: numbered above both drivers' (one numbered below an applied batch reads as applied); those
        // numbered below this driver's applied ones may read as applied: given back at most once.
        self.batch = self.batch.max(gone.batch);
        self.unconfirmed.append(&mut gone.unconfirmed);
        self.unconfirmed.sort_unstable_by_key(|(q, _, _)| *q);
        // What the gone driver was granted, counted again if the window is made afresh.
        if self.generation == 0 {
            self.generation = gone.generation;
            self.granted_by_bucket = std::mem::take(&mut gone.granted_by_bucket);
        } else if gone.generation == self.generation {
            for (b, n) in std::mem::take(&mut gone.granted_by_bucket) {
                match self.granted_by_bucket.iter_mut().find(|(x, _)| *x == b) {
                    Some((_, c)) => *c = c.saturating_add(n),
                    None => self.granted_by_bucket.push((b, n)),
                }
            }
        } else if gone.generation != 0 {
            // Granted in a window this driver does not know: counted in the one it knows (twice at worst).
            for (b, n) in std::mem::take(&mut gone.granted_by_bucket) {
                self.add_admitted(b, n);
            }
        }
        // The latest view of the window (what a fallback owes).
        if gone
            .window_seen
            .as_ref()
            .is_some_and(|g| self.window_seen.as_ref().is_none_or(|s| g.arrived_ms > s.arrived_ms))
        {
            self.window_seen = gone.window_seen.take();
            self.live = self.live.max(gone.live);
        }
        for (b, n) in gone.admitted {
            self.add_admitted(b, n);
        }
    }

    fn call(&mut self, want: u64, member: &str, ttl: Duration, at: &CallAt) -> LeaseCall {
        self.take_local_admissions(at);
        self.batch_returns(at);
        if self.seq == 0 {
            self.seq = first_number(at);
        }
        self.seq = self.seq.saturating_add(1);
        let unseen_from = *self.unseen_from.get_or_insert(self.seq);
        LeaseCall {
            want,
            member: member.to_string(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            allowance: self.allowance,
            global: self.global,
            bucket_ms: self.bucket_ms,
            sample_count: self.sample_count,
            deadline_ms: at.clock.deadline(at.now, self.timeout),
            generation: self.generation,
            seq: self.seq,
            unseen_from,
            record: self.record,
            returns: self.unconfirmed.clone(),
            admitted: self.admitted.clone(),
        }
    }

    /// Numbers the tokens to give back as one batch (sent with every call until a reply shows it applied),
    /// and forgets batches of buckets that left the window (Redis would ignore them).
    fn batch_returns(&mut self, at: &CallAt) {
        if !self.returns.is_empty() {
            if self.batch == 0 {
                self.batch = first_number(at);
            }
            self.batch = self.batch.saturating_add(1);
            let q = self.batch;
            self.unconfirmed.extend(self.returns.drain(..).map(|(b, n)| (q, b, n)));
        }
        let newest = at.clock.redis_ms(at.now_ms).div_euclid(self.bucket_ms as i64);
        self.unconfirmed.retain(|(_, b, _)| *b > newest.saturating_sub(self.sample_count as i64));
    }

    /// Moves the calls the fallback admitted since the last look into `admitted`, in Redis buckets: each
    /// slot's count goes to the bucket its last millisecond falls in on Redis's clock (estimated never
    /// early), so that it stays in the window at least as long as it should.
    fn take_local_admissions(&mut self, at: &CallAt) {
        let (slots, slot_ms) = (self.local.take(at.now_ms, self.window_ms), self.local.slot_ms());
        for (start, n) in slots {
            self.add_admitted(at.clock.redis_ms(start + slot_ms - 1).div_euclid(self.bucket_ms as i64), n);
        }
        // Buckets that left the window need not be counted.
        let newest = at.clock.redis_ms(at.now_ms).div_euclid(self.bucket_ms as i64);
        self.admitted.retain(|(b, _)| *b > newest.saturating_sub(self.sample_count as i64));
    }

    /// Adds `n` calls to count in Redis bucket `bucket`.
    fn add_admitted(&mut self, bucket: i64, n: u64) {
        match self.admitted.iter_mut().find(|(b, _)| *b == bucket) {
            Some((_, c)) => *c = c.saturating_add(n),
            None => self.admitted.push((bucket, n)),
        }
    }

    /// A call that carried `call` got its reply: what it counted is counted.
    fn counted(&mut self, lease: &RuleLease, call: &LeaseCall) {
        for (b, n) in &call.admitted {
            if let Some(i) = self.admitted.iter().position(|(x, _)| x == b) {
                let left = self.admitted[i].1.saturating_sub(*n);
                if left == 0 {
                    self.admitted.swap_remove(i);
                } else {
                    self.admitted[i].1 = left;
                }
            }
            lease.counters.reported.fetch_add(*n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn give_back(&mut self, lease: &RuleLease, bucket: i64, n: u64) {
        if n == 0 {
            return;
        }
        if let Some((_, c)) = self.granted_by_bucket.iter_mut().find(|(b, _)| *b == bucket) {
            *c = c.saturating_sub(n);
        }
        self.returned = self.returned.saturating_add(n);
        lease.counters.returned.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        self.add_return(bucket, n);
    }

    /// Sends `n` tokens back to `bucket` with the next call.
    fn add_return(&mut self, bucket: i64, n: u64) {
        match self.returns.iter_mut().find(|(b, _)| *b == bucket) {
            Some((_, c)) => *c = c.saturating_add(n),
            None => self.returns.push((bucket, n)),
        }
        // Buckets that left the window cannot take tokens back.
        let newest = self.returns.iter().map(|(b, _)| *b).max().unwrap_or(bucket);
        let oldest = newest.saturating_sub(self.sample_count as i64 - 1);
        self.returns.retain(|(b, _)| *b >= oldest);
    }

    /// Ends the lease in force if its last millisecond passed (its tokens are given back).
    pub(crate) fn expire(&mut self, lease: &RuleLease, now_ms: u64) {
        if let Some(c) = self.cur
            && now_ms > c.valid_until
        {
            let left = lease.replace(0, 0);
            self.cur = None;
            self.give_back(lease, c.bucket, left);
        }
    }

    /// Applies a reply to `call`, made at the times of `at`.
    pub(crate) fn apply(&mut self, lease: &RuleLease, call: &LeaseCall, r: &LeaseReply, at: &CallTimes) {
        let CallTimes { t0_ms, t1_ms, rtt, now, beat } = *at;
        // Every call up to this one is settled: seen, or undone by this one when it ran.
        if self.unseen_from.is_some_and(|from| call.seq >= from) {
            self.unseen_from = (call.seq < self.seq).then_some(call.seq + 1);
        }
        if !r.late {
            // (Run after its deadline, it counted none of the fallback's admissions: they are sent again.)
            self.counted(lease, call);
        }
        // Every batch the call carried is applied now (by it, or by an earlier call whose reply was lost).
        if let Some(top) = call.returns.iter().map(|(q, _, _)| *q).max() {
            self.unconfirmed.retain(|(q, _, _)| *q > top);
        }
        if r.generation != self.generation {
            if self.generation != 0 {
                // The window was made afresh (its key was lost): it grants this instance nothing until the
                // tokens it holds or spent in it are counted there again; ask again with them at once. Tokens
                // given back are net of them (the new window never counted them: not given back there).
                self.unconfirmed.clear();
                self.returns.clear();
                let oldest = r.bucket.saturating_sub(i64::from(self.sample_count) - 1);
                for (b, n) in std::mem::take(&mut self.granted_by_bucket) {
                    if b >= oldest && n > 0 {
                        self.add_admitted(b.min(r.bucket), n);
                    }
                }
                self.ask_when_free = true;
            }
            self.generation = r.generation;
        }
        if r.granted > 0 {
            match self.granted_by_bucket.iter_mut().find(|(b, _)| *b == r.bucket) {
                Some((_, c)) => *c = c.saturating_add(r.granted),
                None => self.granted_by_bucket.push((r.bucket, r.granted)),
            }
            // The window's buckets, and as many ahead of this reply's (Redis's clock stepped back): a clock
            // that steps back at every reply must not keep every bucket it ever granted in.
            let span = i64::from(self.sample_count) - 1;
            let (oldest, newest) = (r.bucket.saturating_sub(span), r.bucket.saturating_add(span));
            self.granted_by_bucket.retain(|(b, _)| *b >= oldest && *b <= newest);
        }
        self.last_left = r.left;
        self.window_seen = Some(WindowSeen { arrived_ms: t1_ms, redis_ms: r.redis_ms, buckets: r.window.clone() });
        if r.late {
            // Redis ran it after its deadline (slower than the timeout, yet the reply made it): nothing
            // granted; ask again.
            self.ask_when_free |= call.want > 0;
        }
        self.live = r.live.max(1);
        let fallback_live = self.fallback_live(now);
        self.rtt_ms = 0.8 * self.rtt_ms + 0.2 * rtt.as_secs_f64() * 1000.0;
        self.next_beat = now + beat;
        self.beat = beat;
        let bucket_end = r.bucket.saturating_add(1).saturating_mul(self.bucket_ms as i64);
        let valid_until = (t0_ms as i64)
            .saturating_add(bucket_end.saturating_sub(r.redis_ms))
            .saturating_sub(self.margin_ms as i64 + 1);
        if r.granted > 0 {
            lease.counters.leased.fetch_add(r.granted, std::sync::atomic::Ordering::Relaxed);
            match self.cur {
                // More for the lease in force (if it is still in force: tokens added to an ended lease could
                // not be spent).
                Some(c) if c.bucket == r.bucket && c.valid_until >= t1_ms && lease.add(c.valid_until, r.granted) => {
                    self.issued = self.issued.saturating_add(r.granted)
                }
                _ if valid_until >= t1_ms as i64 => {
                    let valid_until = valid_until as u64;
                    let left = lease.replace(valid_until, r.granted);
                    if let Some(old) = self.cur.take() {
                        self.give_back(lease, old.bucket, left);
                    }
                    self.cur = Some(Current { bucket: r.bucket, valid_until });
                    self.issued = self.issued.saturating_add(r.granted);
                }
                // Arrived too late to be spent within its bucket.
                _ => {
                    self.issued = self.issued.saturating_add(r.granted);
                    self.give_back(lease, r.bucket, r.granted);
                }
            }
        }
        // Latest estimates (from the reply's arrival): asking earlier could find Redis still before them.
        self.next_bucket_at = (t1_ms as i64).saturating_add(bucket_end.saturating_sub(r.redis_ms)).max(0) as u64;
        if !r.late && call.want > r.granted && r.left == 0 && r.retry_at_ms > r.redis_ms {
            // Until the window frees room, or until Redis's next bucket at the latest: leases that end with
            // the bucket give their unspent tokens back then, which the window's oldest buckets do not show.
            self.exhausted_until =
                t1_ms.saturating_add(r.retry_at_ms.saturating_sub(r.redis_ms) as u64).min(self.next_bucket_at);
        } else {
            self.exhausted_until = 0;
        }
        lease.set_exhausted_until(self.exhausted_until);
        // Ask for more while a round trip's worth of calls (twice over, plus a millisecond) is still in hand.
        lease.set_low_water((self.rate * (2.0 * self.rtt_ms + 1.0)).ceil().max(1.0) as u64);
        if self.on_probation(now) {
            // Still deciding locally while the other instances come back: for the next second, admit at most
            // this instance's share of the room the window has left (what the others' fallbacks admitted
            // is counted there as they report it).
            let room = r.left as f64 / fallback_live as f64;
            let debt = (lease.local_limit() - room).max(0.0).ceil() as u64;
            lease.set_fallback_debt(FallbackDebt::new(vec![(t1_ms.saturating_add(1000), debt)]));
            // Report again a bucket from now; lease once the pause is over.
            self.next_beat = now + Duration::from_millis(self.bucket_ms.max(10)).min(beat);
        } else {
            self.probation_until = None;
            lease.set_leasing(Some(fallback_live));
        }
        lease.changed();
    }

    /// The live count the fallback divides a global count by, given the count just seen: the largest seen
    /// within [`live_hold`](Driver::live_hold). An instance that stops leaves the membership set only after
    /// its TTL, so a count that drops faster than that means the set itself was lost (Redis restarted
    /// without its data, a flush, a failover to a replica that missed it) while the other instances still
    /// run: dividing by the lower count then would multiply the limit if Redis failed next.
    fn fallback_live(&mut self, now: Instant) -> u64 {
        let seen = self.live.max(1);
        match self.live_peak {
            Some((peak, at)) if peak > seen && now.saturating_duration_since(at) < self.live_hold => peak,
            _ => {
                self.live_peak = Some((seen, now));
                seen
            }
        }
    }

    /// When the driver next needs the worker: its membership renewal, the end of its lease, the end of a
    /// used-up window (engine ms, converted by the caller).
    pub(crate) fn next_beat(&self) -> Instant {
        self.next_beat
    }

    /// Whether the membership is due for renewal, or tokens wait to be given back, or admissions to be
    /// counted.
    pub(crate) fn beat_due(&self, now: Instant) -> bool {
        now >= self.next_beat || !self.returns.is_empty() || !self.unconfirmed.is_empty() || !self.admitted.is_empty()
    }

    /// Engine times (ms) at which the driver wants to act: the end of its lease.
    pub(crate) fn deadlines_ms(&self) -> impl Iterator<Item = u64> + '_ {
        self.cur.map(|c| c.valid_until + 1).into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::token_service::{lease_for, ClusterServiceInfo, TokenService};
    use crate::flow::ClusterConfig;
    use std::sync::OnceLock;

    /// A service that is never asked anything (the driver is fed replies by hand).
    struct Idle;

    impl TokenService for Idle {
        fn attach(&self, _: &Arc<RuleLease>, _: &[FlowRule]) {}
        fn wake(&self) {}
        fn timeout(&self) -> Duration {
            Duration::from_millis(20)
        }
        fn info(&self) -> ClusterServiceInfo {
            ClusterServiceInfo {
                kind: "test",
                host: String::new(),
                port: 0,
                timeout_ms: 20,
                connected: true,
                since_ms: 0,
            }
        }
    }

    /// A driver for a global rule of 1000 per second in 10 buckets of 100 ms.
    fn driver() -> (Driver, Arc<RuleLease>) {
        let rule = FlowRule {
            cluster_mode: true,
            cluster_config: Some(ClusterConfig { threshold_type: ClusterThresholdType::Global, ..Default::default() }),
            ..FlowRule::new("api").count(1000.0)
        };
        let slot = OnceLock::new();
        let svc: Arc<dyn TokenService> = Arc::new(Idle);
        lease_for(&slot, &Arc::new(rule.clone()), &svc, &[rule]);
        let lease = slot.get().unwrap().clone();
        let keys = super::super::keys::keys("ns", "res:api");
        let d = Driver::new(&lease, keys, Duration::from_millis(2), Duration::from_millis(20), Instant::now());
        (d, lease)
    }

    const REDIS_MS: i64 = 1_700_000_000_050; // 50 ms into bucket 17_000_000_000
    const ENGINE_MS: u64 = 5_000_000;

    fn reply(want: u64, granted: u64, left: u64, retry_at_ms: i64) -> (LeaseCall, LeaseReply) {
        let call = LeaseCall {
            want,
            member: "me".into(),
            ttl_ms: 3000,
            allowance: 1000.0,
            global: true,
            bucket_ms: 100,
            sample_count: 10,
            deadline_ms: 0,
            generation: 0,
            seq: 1,
            unseen_from: 1,
            record: 0,
            returns: Vec::new(),
            admitted: Vec::new(),
        };
        let r = LeaseReply {
            granted,
            redis_ms: REDIS_MS,
            bucket: REDIS_MS / 100,
            live: 3,
            left,
            retry_at_ms,
            late: false,
            generation: 7,
            window: vec![(REDIS_MS / 100, granted)],
        };
        (call, r)
    }

    fn times() -> CallTimes {
        CallTimes {
            t0_ms: ENGINE_MS,
            t1_ms: ENGINE_MS + 1,
            rtt: Duration::from_millis(1),
            now: Instant::now(),
            beat: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_lease_call_is_held_back_only_in_the_last_round_trips_of_a_bucket() {
        let (mut d, lease) = driver();
        // A renewal (no tokens) answered 50 ms into a bucket, no lease in force: the bucket ends 50 ms later.
        let (call, r) = reply(0, 0, 1000, 0);
        d.apply(&lease, &call, &r, &times());
        assert_eq!(d.hold_until(ENGINE_MS + 2), 0, "mid-bucket, a lease call is worth making");
        assert_eq!(d.hold_until(ENGINE_MS + 40), 0);
        assert_eq!(d.hold_until(ENGINE_MS + 49), ENGINE_MS + 51, "its tokens could not be spent in the bucket");
        assert_eq!(d.hold_until(ENGINE_MS + 51), 0, "the next bucket");
    }

    #[test]
    fn a_live_count_that_drops_faster_than_members_expire_does_not_raise_the_fallback() {
        // Three instances seen; then the membership set is lost (Redis restarted without its data) and the
        // next reply sees this instance alone: the fallback keeps dividing by three until a lower count has
        // lasted longer than a member takes to expire.
        let (mut d, lease) = driver();
        let base = times();
        let (call, r) = reply(0, 0, 1000, 0);
        d.apply(&lease, &call, &r, &base);
        assert_eq!(lease.local_limit(), 1000.0 / 3.0);
        let alone = LeaseReply { live: 1, ..r.clone() };
        let soon = CallTimes { now: base.now + d.live_hold / 2, ..base };
        d.apply(&lease, &call, &alone, &soon);
        assert_eq!(d.live, 1, "leases are sized by the count seen");
        assert_eq!(lease.local_limit(), 1000.0 / 3.0, "the fallback holds the larger count");
        let later = CallTimes { now: base.now + d.live_hold * 2, ..base };
        d.apply(&lease, &call, &alone, &later);
        assert_eq!(lease.local_limit(), 1000.0, "a lower count that lasted is believed");
        let more = LeaseReply { live: 4, ..r.clone() };
        d.apply(&lease, &call, &more, &later);
        assert_eq!(lease.local_limit(), 1000.0 / 4.0, "a higher count is believed at once");
    }

    /// Engine times after the reply of [`times`], as the instant and engine ms a call is made at.
    fn at(base: Instant, after_ms: u64) -> CallAt {
        CallAt {
            now: base + Duration::from_millis(after_ms),
            now_ms: ENGINE_MS + after_ms,
            clock: RedisClock::default(),
        }
    }

    /// A lease of 40 tokens until the bucket ends (50 ms from the reply, less the 2 ms margin and a
    /// millisecond) with `left` tokens left in the window for 3 live instances; `spent` of them spent in the
    /// first `after_ms`: what the lease call made then asks for.
    fn want_after_spending(left: u64, spent: u64, after_ms: u64) -> u64 {
        let (mut d, lease) = driver();
        let (call, r) = reply(40, 40, left, 0);
        d.apply(&lease, &call, &r, &times());
        let base = Instant::now();
        d.lease_call(&lease, "me", Duration::from_secs(3), &at(base, 0));
        for _ in 0..spent {
            assert!(lease.take_in_hand(ENGINE_MS + after_ms, 1));
        }
        d.lease_call(&lease, "me", Duration::from_secs(3), &at(base, after_ms)).want
    }

    #[test]
    fn a_lease_call_asks_for_what_the_instance_spends_before_the_lease_ends_at_the_rate_its_leases_served() {
        // 20 spent in 10 ms: 2 per ms; the lease has 38 ms left: 95 wanted (a quarter more), 20 in hand.
        assert_eq!(want_after_spending(900, 20, 10), 75);
    }

    #[test]
    fn a_burst_asks_for_no_more_than_the_limit_admits_over_the_lease_or_a_bucket_share() {
        // 40 spent in 2 ms (20 per ms) with 900 left for 3 instances: the rate would ask for over 900, the
        // fair share allows 300; the limit (1 per ms) over the lease's rest is under 60, a bucket's share of
        // the window is 100: 100.
        assert_eq!(want_after_spending(900, 40, 2), 100);
    }

    #[test]
    fn a_lease_call_never_takes_more_than_a_fair_share_of_what_the_window_has_left() {
        // 30 tokens left in the window for 3 live instances: at most 10 per call, however busy this one is
        // (40 spent in 2 ms).
        assert_eq!(want_after_spending(30, 40, 2), 10);
    }

    #[test]
    fn a_quiet_instance_asks_for_a_small_share_of_a_bucket_not_the_window() {
        let (mut d, lease) = driver();
        let (call, r) = reply(0, 0, 1000, 0);
        d.apply(&lease, &call, &r, &times());
        // Nothing served yet (or nothing since a long outage): a sixth of a bucket's share for 3 instances.
        let call = d.lease_call(&lease, "me", Duration::from_secs(3), &at(Instant::now(), 2));
        assert_eq!(call.want, 1000 / (10 * 3 * 2));
    }

    #[test]
    fn tokens_granted_after_the_lease_in_force_ended_are_given_back_not_added_to_it() {
        let (mut d, lease) = driver();
        let (call, r) = reply(40, 40, 900, 0);
        d.apply(&lease, &call, &r, &times());
        assert_eq!(lease.in_hand(), (40, ENGINE_MS + 47));
        // A reply for the same bucket arrives after that lease's last millisecond: its 10 tokens could not be
        // spent in the bucket.
        let (call, mut late) = reply(10, 10, 890, 0);
        late.window = vec![(REDIS_MS / 100, 50)];
        late.redis_ms = REDIS_MS + 45;
        let t = CallTimes { t0_ms: ENGINE_MS + 45, t1_ms: ENGINE_MS + 48, ..times() };
        d.apply(&lease, &call, &late, &t);
        assert_eq!(lease.in_hand(), (40, ENGINE_MS + 47), "not added to the lease that ended");
        assert_eq!(lease.counters.returned.load(std::sync::atomic::Ordering::Relaxed), 10, "given back");
    }

    #[test]
    fn a_reply_while_resuming_caps_the_fallback_at_this_instance_share_of_the_room_left() {
        let (mut d, lease) = driver();
        lease.set_fallback("redis down".into());
        let now = Instant::now();
        d.resume_after(now, Duration::from_secs(1));
        // 60 tokens left in the window for 3 instances: this one's fallback admits 20 more in the second.
        let (call, r) = reply(0, 0, 60, 0);
        d.apply(&lease, &call, &r, &CallTimes { now, ..times() });
        assert!(d.on_probation(now));
        let debt = (lease.local_limit() - 20.0) as u64;
        assert_eq!(lease.fallback_debt_at(ENGINE_MS + 1), debt);
        assert_eq!(lease.fallback_debt_at(ENGINE_MS + 1000), debt, "for the next second");
        assert_eq!(lease.fallback_debt_at(ENGINE_MS + 1 + 1000), 0);
    }

    #[test]
    fn tokens_a_lease_held_when_its_rule_changed_are_given_back_when_the_client_leaves_it() {
        let (mut d, lease) = driver();
        let (call, r) = reply(40, 40, 900, 0);
        d.apply(&lease, &call, &r, &times());
        assert!(lease.take_in_hand(ENGINE_MS + 2, 1));
        // The rule is replaced: the engine drops its lease with 39 tokens unspent.
        drop(lease);
        let (_, leave) = d.leave_call("me", &at(Instant::now(), 3));
        assert_eq!(given_back(&leave), vec![(REDIS_MS / 100, 39)]);
        assert_eq!(leave.ttl_ms, 0, "it leaves the member set");
    }

    #[test]
    fn a_used_up_window_is_asked_again_at_the_next_bucket_at_the_latest() {
        let (mut d, lease) = driver();
        // Nothing left until 900 ms from now (the oldest bucket leaves the window), but leases that end with
        // this bucket give tokens back then.
        let (call, r) = reply(50, 0, 0, REDIS_MS + 900);
        d.apply(&lease, &call, &r, &times());
        assert_eq!(d.hold_until(ENGINE_MS + 10), ENGINE_MS + 51);
    }

    #[test]
    fn a_late_reply_grants_nothing_and_the_lease_is_asked_for_again() {
        let (mut d, lease) = driver();
        let (call, mut r) = reply(50, 0, 500, 0);
        r.late = true;
        d.apply(&lease, &call, &r, &times());
        assert!(d.ask_when_free, "asked again");
        assert_eq!(d.hold_until(ENGINE_MS + 10), 0, "not taken for a used-up window");
    }

    #[test]
    fn a_window_made_afresh_grants_nothing_until_the_tokens_held_from_the_lost_one_are_counted_again() {
        let (mut d, lease) = driver();
        let (call, r) = reply(50, 40, 900, 0);
        d.apply(&lease, &call, &r, &times());
        let at = CallAt { now: Instant::now(), now_ms: ENGINE_MS + 2, clock: RedisClock::default() };
        let next = d.lease_call(&lease, "me", Duration::from_secs(3), &at);
        assert_eq!(next.generation, 7, "the call names the window it knows");
        // The key was lost: a new window (generation 8) granted nothing to this call.
        let (_, mut fresh) = reply(50, 0, 1000, 0);
        fresh.generation = 8;
        d.apply(&lease, &next, &fresh, &times());
        assert!(d.ask_when_free, "asks again at once");
        let again = d.lease_call(&lease, "me", Duration::from_secs(3), &at);
        assert_eq!(again.generation, 8);
        assert_eq!(again.admitted, vec![(REDIS_MS / 100, 40)], "the 40 tokens granted in the lost window");
    }

    #[test]
    fn a_call_deadline_on_redis_time_is_never_later_than_its_caller_gives_up() {
        let mut clock = RedisClock::default();
        let now = Instant::now();
        assert_eq!(clock.deadline(now, Duration::from_millis(20)), 0, "no deadline before Redis answered");
        // Redis read 1000 before the reply arrived at `now`: 5 ms later Redis is at 1005 or more.
        clock.observe(1000, 40, now);
        assert_eq!(clock.deadline(now + Duration::from_millis(5), Duration::from_millis(20)), 1025);
        assert_eq!(clock.redis_ms(50), 1010, "Redis time from engine time, never early");
    }

    #[test]
    fn a_driver_that_replaces_a_gone_one_counts_what_the_gone_one_had_not_and_goes_on_with_its_numbers() {
        let now = Instant::now();
        let mut clock = RedisClock::default();
        clock.observe(ENGINE_MS as i64, ENGINE_MS, now);
        let at = CallAt { now, now_ms: ENGINE_MS + 150, clock };
        let bucket = (ENGINE_MS as i64 + 199) / 100;
        // The gone rule's driver: a window seen, then Redis failed: two calls went unanswered, and its
        // fallback admitted 3 calls after its last look, which its lease still holds when it is dropped.
        let gone_driver = || {
            let (mut gone, lease) = driver();
            let (call, r) = reply(0, 0, 1000, 0);
            gone.apply(&lease, &call, &r, &times());
            lease.set_fallback("redis down".into());
            let first = gone.beat_call("me", Duration::from_secs(3), &at);
            let second = gone.beat_call("me", Duration::from_secs(3), &at);
            lease.record_local_admissions(ENGINE_MS + 100, 3);
            (gone, lease, first.seq, second.seq)
        };

        // A driver that has made no call yet goes on from the gone one.
        let (gone, lease, first, second) = gone_driver();
        drop(lease);
        let (mut d, _new_lease) = driver();
        d.take_over(gone, &at);
        let call = d.beat_call("me", Duration::from_secs(3), &at);
        assert_eq!(call.admitted, vec![(bucket, 3)], "the dropped lease's admissions are counted");
        assert_eq!((call.seq, call.unseen_from), (second + 1, first), "its unseen calls are undone by this one");
        assert!(d.window_seen.is_some(), "what the window held is still owed");

        // A driver that has called already goes on above both drivers' numbers (Redis reads a call numbered at
        // or below its record as late: here the gone driver's second call and this one's first share the
        // millisecond), and counts them all the same.
        let (gone, lease, _, second) = gone_driver();
        drop(lease);
        let (mut d, _new_lease) = driver();
        let own = d.beat_call("me", Duration::from_secs(3), &at);
        d.take_over(gone, &at);
        let call = d.beat_call("me", Duration::from_secs(3), &at);
        assert_eq!(call.admitted, vec![(bucket, 3)]);
        assert_eq!((call.seq, call.unseen_from), (second.max(own.seq) + 1, own.unseen_from));
    }

    #[test]
    fn a_driver_that_called_without_a_reply_still_owes_what_the_gone_driver_saw_in_the_window() {
        // The gone rule's driver saw the window hold 900 of 1000.
        let (mut gone, old_lease) = driver();
        let (call, mut r) = reply(0, 0, 100, 0);
        r.window = vec![(REDIS_MS / 100, 900)];
        gone.apply(&old_lease, &call, &r, &times());
        // The new rule's driver was adopted before the old lease dropped and made a call Redis never answered.
        let (mut d, lease) = driver();
        let _ = d.beat_call("me", Duration::from_secs(3), &at(Instant::now(), 2));
        drop(old_lease);
        d.take_over(gone, &at(Instant::now(), 3));
        lease.set_fallback_debt(d.fallback_debt(&lease, ENGINE_MS + 3));
        assert!(lease.fallback_debt_at(ENGINE_MS + 3) > 0, "the window's 900 are still owed");
    }

    #[test]
    fn tokens_a_gone_driver_spent_are_counted_again_in_a_window_made_afresh_after_a_driver_with_calls_took_over() {
        // The gone rule's driver was granted 40 in generation 7, all spent.
        let (mut gone, old_lease) = driver();
        let (call, r) = reply(40, 40, 900, 0);
        gone.apply(&old_lease, &call, &r, &times());
        assert!(old_lease.take_in_hand(ENGINE_MS + 2, 40));
        // The new rule's driver had called already (generation 7 seen).
        let (mut d, lease) = driver();
        let base = Instant::now();
        let own = d.beat_call("me", Duration::from_secs(3), &at(base, 2));
        let (_, seen) = reply(0, 0, 860, 0);
        d.apply(&lease, &own, &seen, &times());
        drop(old_lease);
        d.take_over(gone, &at(base, 3));
        // The key is lost: a new window (generation 8).
        let next = d.beat_call("me", Duration::from_secs(3), &at(base, 4));
        let (_, mut fresh) = reply(0, 0, 1000, 0);
        fresh.generation = 8;
        d.apply(&lease, &next, &fresh, &times());
        let again = d.beat_call("me", Duration::from_secs(3), &at(base, 5));
        assert_eq!(again.admitted, vec![(REDIS_MS / 100, 40)], "the gone driver's 40 spent tokens");
    }

    #[test]
    fn a_fresh_driver_that_takes_over_two_gone_ones_is_not_numbered_below_the_calls_redis_recorded() {
        let Some((_redis, rt, mut conn, scripts)) = on_redis("take_over_two_gone") else { return };
        let (mut a, lease_a) = driver();
        let keys = a.keys.clone();
        let mut run = |call: &LeaseCall| rt.block_on(scripts.lease(&mut conn, &keys, call)).unwrap();
        let probe = LeaseCall { member: "probe".into(), ..reply(0, 0, 0, 0).0 };
        let mut clock = RedisClock::default();
        clock.observe(run(&probe).redis_ms, ENGINE_MS, Instant::now());
        let at = |after: u64| CallAt { now: Instant::now(), now_ms: ENGINE_MS + after, clock };
        // Rule A, then B (adopted while A's lease was still held); both call, B's call is Redis's last record.
        let ca = a.beat_call("me", Duration::from_secs(3), &at(1));
        let ra = run(&ca);
        a.apply(&lease_a, &ca, &ra, &times());
        let (mut b, lease_b) = driver();
        let cb = b.beat_call("me", Duration::from_secs(3), &at(10));
        let rb = run(&cb);
        b.apply(&lease_b, &cb, &rb, &times());
        // A's fallback admitted 3 calls; then both are gone and C (no call yet) takes them over, in order.
        lease_a.record_local_admissions(ENGINE_MS + 11, 3);
        drop((lease_a, lease_b));
        let (mut c, lease_c) = driver();
        c.take_over(a, &at(12));
        c.take_over(b, &at(12));
        let cc = c.beat_call("me", Duration::from_secs(3), &at(13));
        let rc = run(&cc);
        c.apply(&lease_c, &cc, &rc, &times());
        assert!(!rc.late, "C's call is read as one older than Redis's record: it counts nothing");
        let held: u64 = rc.window.iter().map(|(_, n)| n).sum();
        assert_eq!(held, 3, "the 3 calls A's fallback admitted: {:?}", rc.window);
    }

    #[test]
    fn what_the_fallback_admitted_is_reported_in_redis_buckets_until_a_reply_counts_it() {
        let (mut d, lease) = driver();
        let mut clock = RedisClock::default();
        let now = Instant::now();
        // Redis is 10 ms ahead of the engine's clock.
        clock.observe(ENGINE_MS as i64 + 10, ENGINE_MS, now);
        lease.set_fallback("redis down".into());
        // Admitted locally in the engine's slot [ENGINE_MS + 100, +200): Redis's bucket of its last ms + 10.
        let admitted_at = ENGINE_MS + 100;
        let at = CallAt { now, now_ms: admitted_at + 50, clock };
        lease.record_local_admissions(admitted_at, 3);
        let call = d.beat_call("me", Duration::from_secs(3), &at);
        let bucket = (admitted_at as i64 + 99 + 10) / 100;
        assert_eq!(call.admitted, vec![(bucket, 3)]);
        // Not answered (a failure): sent again with the next call.
        let again = d.beat_call("me", Duration::from_secs(3), &at);
        assert_eq!(again.admitted, vec![(bucket, 3)]);
        let (_, r) = reply(0, 0, 1000, 0);
        d.apply(&lease, &again, &r, &times());
        assert!(d.beat_call("me", Duration::from_secs(3), &at).admitted.is_empty(), "counted once");
        assert_eq!(lease.counters.reported.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn a_window_of_huge_bucket_counts_makes_a_fallback_owe_everything_and_panics_nowhere() {
        // A reply valid in shape whose buckets hold more than a u64 can sum (the parser keeps each count up to
        // i64::MAX): the fallback owes all its limit, not what a wrapped sum says.
        let (mut d, lease) = driver();
        let (call, mut r) = reply(0, 0, 0, 0);
        let b = REDIS_MS / 100;
        r.window = vec![(b - 2, i64::MAX as u64), (b - 1, i64::MAX as u64), (b, i64::MAX as u64)];
        d.apply(&lease, &call, &r, &times());
        let debt = d.fallback_debt(&lease, ENGINE_MS + 2);
        assert!(debt.at(ENGINE_MS + 2) as f64 >= lease.local_limit(), "{debt:?}");
    }

    #[test]
    fn replies_with_extreme_times_buckets_and_grants_panic_nowhere() {
        for (redis_ms, bucket, retry_at_ms, granted) in [
            (i64::MIN, i64::MIN, i64::MAX, u64::MAX / 2),
            (i64::MAX, i64::MAX, i64::MIN, u64::MAX / 2),
            (0, i64::MAX, i64::MAX, 1),
            (i64::MAX, i64::MIN, 0, 1),
        ] {
            let (mut d, lease) = driver();
            let mut clock = RedisClock::default();
            clock.observe(redis_ms, ENGINE_MS, Instant::now());
            for _ in 0..3 {
                let (call, mut r) = reply(10, granted, 0, retry_at_ms);
                r.redis_ms = redis_ms;
                r.bucket = bucket;
                r.window = vec![(i64::MIN, 5), (bucket, granted)];
                d.apply(&lease, &call, &r, &times());
                let at = CallAt { clock, ..at(Instant::now(), 5) };
                lease.record_local_admissions(ENGINE_MS + 5, 1);
                let _ = d.lease_call(&lease, "me", Duration::from_secs(3), &at);
                let _ = d.fallback_debt(&lease, ENGINE_MS + 5);
                d.expire(&lease, u64::MAX);
                let _ = d.hold_until(ENGINE_MS + 6);
            }
        }
    }

    #[test]
    fn what_an_instance_was_granted_per_bucket_stays_bounded_when_redis_time_steps_back_at_each_reply() {
        // Redis's clock steps one bucket back at every reply (valid in shape: time, bucket and window agree).
        let (mut d, lease) = driver();
        for i in 0..5_000i64 {
            let (call, mut r) = reply(1, 1, 900, 0);
            r.redis_ms = REDIS_MS - i * 100;
            r.bucket = r.redis_ms / 100;
            r.window = vec![(r.bucket, 1)];
            d.apply(&lease, &call, &r, &times());
        }
        assert!(d.granted_by_bucket.len() <= 2 * 10, "{} buckets kept", d.granted_by_bucket.len());
    }

    /// A real `redis-server` (kept while the first value lives), a runtime, a connection and the scripts.
    fn on_redis(
        test: &str,
    ) -> Option<(
        sentinel_testkit::redis::RedisServer,
        tokio::runtime::Runtime,
        redis::aio::MultiplexedConnection,
        super::super::script::Scripts,
    )> {
        let redis = sentinel_testkit::redis::RedisServer::start(test)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let conn = rt.block_on(redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection()).unwrap();
        Some((redis, rt, conn, super::super::script::Scripts::new()))
    }

    #[test]
    fn a_give_back_sent_again_is_applied_once_after_redis_time_read_far_ahead_when_batches_were_first_numbered() {
        let Some((_redis, rt, mut conn, scripts)) = on_redis("give_back_after_far_ahead_time") else { return };
        let (mut d, lease) = driver();
        let keys = d.keys.clone();
        let base = Instant::now();
        let mut run = |call: &LeaseCall| rt.block_on(scripts.lease(&mut conn, &keys, call)).unwrap();
        // A reply read Redis's clock far ahead (year 2300) when this instance first gave tokens back: its batches
        // are numbered from there.
        let mut far = RedisClock::default();
        far.observe(10_500_000_000_000, ENGINE_MS, base);
        d.give_back(&lease, 10_500_000_000_000 / 100, 1);
        let first = d.beat_call("me", Duration::from_secs(3), &CallAt { clock: far, ..at(base, 0) });
        assert_eq!(given_back(&first), vec![(10_500_000_000_000 / 100, 1)]);
        let ok = run(&first);
        d.apply(&lease, &first, &ok, &times());
        // Redis's clock is right again: a lease of this bucket, ended unspent, is given back.
        let call = d.lease_call(&lease, "me", Duration::from_secs(3), &at(base, 1));
        let granted = run(&call);
        assert!(granted.granted > 0);
        d.apply(&lease, &call, &granted, &times());
        d.expire(&lease, u64::MAX - 1);
        // Another instance is granted 30 in the same bucket.
        let other = LeaseCall { member: "other".into(), want: 30, seq: 1, unseen_from: 1, ..call.clone() };
        assert_eq!(run(&other).granted, 30);
        // The give-back's call runs, its reply is lost; it is sent again (same batch): applied once.
        let back = d.beat_call("me", Duration::from_secs(3), &at(base, 2));
        assert_eq!(given_back(&back), vec![(granted.bucket, granted.granted)]);
        run(&back);
        let again = d.beat_call("me", Duration::from_secs(3), &at(base, 3));
        assert_eq!(again.returns, back.returns);
        let r = run(&again);
        let held: u64 = r.window.iter().map(|(_, n)| n).sum();
        assert_eq!(held, 30, "the other instance's 30 still counted: {:?} (batch {})", r.window, back.returns[0].0);
    }

    /// The (bucket, count) pairs a call gives back, whatever their batches.
    fn given_back(call: &LeaseCall) -> Vec<(i64, u64)> {
        call.returns.iter().map(|(_, b, n)| (*b, *n)).collect()
    }

    /// A lease of 40 tokens of which `spent` were spent, ended (its unspent tokens to give back).
    fn ended_lease(spent: u32) -> (Driver, Arc<RuleLease>) {
        let (mut d, lease) = driver();
        let (call, r) = reply(40, 40, 900, 0);
        d.apply(&lease, &call, &r, &times());
        if spent > 0 {
            assert!(lease.take_in_hand(ENGINE_MS + 2, spent));
        }
        d.expire(&lease, ENGINE_MS + 48);
        (d, lease)
    }

    #[test]
    fn a_give_back_whose_call_failed_is_sent_again_until_a_reply_shows_it_applied() {
        // Redis hangs; the lease ends meanwhile with 39 tokens unspent.
        let (mut d, lease) = ended_lease(1);
        let base = Instant::now();
        let first = d.beat_call("me", Duration::from_secs(3), &at(base, 60));
        assert_eq!(given_back(&first), vec![(REDIS_MS / 100, 39)]);
        // The call times out (no reply): the batch goes again, under the same number (Redis applies it once,
        // whether or not the first call ran), with what was given back since in a batch of its own.
        d.give_back(&lease, REDIS_MS / 100, 5);
        let again = d.beat_call("me", Duration::from_secs(3), &at(base, 900));
        assert_eq!(again.returns[0], first.returns[0]);
        assert_eq!(given_back(&again), vec![(REDIS_MS / 100, 39), (REDIS_MS / 100, 5)]);
        assert!(again.returns[1].0 > again.returns[0].0, "a later batch is numbered higher");
        assert!(d.beat_due(base), "a give-back still owed makes a call due");
        // Redis answers again: the reply shows both applied; nothing is sent again.
        let (_, ok) = reply(0, 0, 1000, 0);
        d.apply(&lease, &again, &ok, &times());
        assert!(d.beat_call("me", Duration::from_secs(3), &at(base, 950)).returns.is_empty());
        assert_eq!(lease.counters.returned.load(std::sync::atomic::Ordering::Relaxed), 44);
    }

    #[test]
    fn each_call_names_the_first_call_whose_reply_was_not_seen() {
        let (mut d, lease) = driver();
        let base = Instant::now();
        let ttl = Duration::from_secs(3);
        let first = d.beat_call("me", ttl, &at(base, 0));
        assert!(first.seq > ENGINE_MS * 1000, "numbered from the clock, above a previous life's numbers");
        assert_eq!(first.unseen_from, first.seq, "no earlier call to undo");
        // Its reply is not seen (a timeout): the calls after it name it until one's reply is.
        let second = d.beat_call("me", ttl, &at(base, 10));
        let third = d.beat_call("me", ttl, &at(base, 20));
        assert_eq!((second.seq, third.seq), (first.seq + 1, first.seq + 2));
        assert_eq!((second.unseen_from, third.unseen_from), (first.seq, first.seq));
        let (_, ok) = reply(0, 0, 1000, 0);
        d.apply(&lease, &third, &ok, &times());
        let fourth = d.beat_call("me", ttl, &at(base, 30));
        assert_eq!(fourth.unseen_from, fourth.seq, "every earlier call is settled: seen, or undone by the third");
    }

    #[test]
    fn a_give_back_for_buckets_that_left_the_window_is_no_longer_sent() {
        let (mut d, _lease) = ended_lease(0);
        let mut clock = RedisClock::default();
        clock.observe(REDIS_MS, ENGINE_MS, Instant::now());
        let soon = CallAt { clock, ..at(Instant::now(), 500) };
        assert_eq!(given_back(&d.beat_call("me", Duration::from_secs(3), &soon)), vec![(REDIS_MS / 100, 40)]);
        // Redis stays down until the bucket has left the window (10 buckets of 100 ms): the give-back is moot.
        let later = CallAt { clock, ..at(Instant::now(), 960) };
        let late = d.beat_call("me", Duration::from_secs(3), &later);
        assert!(late.returns.is_empty(), "{:?}", late.returns);
    }

    #[test]
    fn a_window_made_afresh_takes_no_give_back_of_the_lost_one_and_counts_the_net_grant() {
        let (mut d, lease) = ended_lease(10);
        let base = Instant::now();
        let next = d.beat_call("me", Duration::from_secs(3), &at(base, 49));
        assert_eq!(given_back(&next), vec![(REDIS_MS / 100, 30)]);
        // The window key was lost: the script took no give-back there (generations differ).
        let (_, mut fresh) = reply(0, 0, 1000, 0);
        fresh.generation = 8;
        d.apply(&lease, &next, &fresh, &times());
        let again = d.beat_call("me", Duration::from_secs(3), &at(base, 50));
        assert!(again.returns.is_empty(), "nothing to give back to the new window");
        assert_eq!(again.admitted, vec![(REDIS_MS / 100, 10)], "what was spent is counted there");
    }

    /// Three instances, each with a third of a global 1000 per second (10 buckets of 100 ms), all having seen
    /// `held` in the window's buckets at the reply of [`times`] (Redis at [`REDIS_MS`], 50 ms into its
    /// bucket), fall back `fail_after` ms after that reply and admit as much as their local limit lets them
    /// (each its own sliding second, less the debt). Returns, per Redis bucket from the reply's on, what the
    /// three fallbacks admitted in it.
    fn fallback_after_full_window(held: &[u64], fail_after: u64) -> Vec<u64> {
        let (mut d, lease) = driver();
        let (call, mut r) = reply(0, 0, 0, 0);
        let reply_bucket = REDIS_MS / 100;
        r.window =
            held.iter().enumerate().map(|(i, n)| (reply_bucket - held.len() as i64 + 1 + i as i64, *n)).collect();
        d.apply(&lease, &call, &r, &times());
        let fail_ms = ENGINE_MS + 1 + fail_after;
        let debt = d.fallback_debt(&lease, fail_ms);
        let limit = lease.local_limit();
        // Redis's clock at engine time `e`: exactly what it read when the reply arrived (the latest a bucket
        // can leave the window is then the true one).
        let bucket_of = |e: u64| (REDIS_MS + (e - (ENGINE_MS + 1)) as i64).div_euclid(100) - reply_bucket;
        let mut per_bucket = vec![0u64; 40];
        let mut mine: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
        for e in fail_ms..fail_ms + 2500 {
            while mine.front().is_some_and(|t| t + 1000 <= e) {
                mine.pop_front();
            }
            while (mine.len() + 1) as f64 <= limit - debt.at(e) as f64 {
                mine.push_back(e);
                per_bucket[bucket_of(e) as usize] += 3;
            }
        }
        per_bucket
    }

    #[test]
    fn falling_back_on_a_full_window_admits_what_its_buckets_free_as_they_leave_never_more() {
        let held = [50, 0, 200, 100, 150, 0, 300, 100, 50, 50];
        for fail_after in [0, 20, 49, 130, 480] {
            let admitted = fallback_after_full_window(&held, fail_after);
            // Every window of 10 buckets ending at or after the reply's holds at most the limit: what the
            // reply saw still in it, plus what the fallbacks admitted in it.
            for end in 0..admitted.len() as i64 {
                let seen: u64 = held.iter().enumerate().filter(|(i, _)| *i as i64 - 9 > end - 10).map(|(_, n)| n).sum();
                let local: u64 = admitted[(end - 9).max(0) as usize..=end as usize].iter().sum();
                assert!(seen + local <= 1000, "failing {fail_after} ms after: window ending {end}: {seen} + {local}");
            }
            // The second the failure starts in is not empty: each bucket that leaves frees room at once.
            let fail_bucket = ((50 + fail_after) / 100) as usize;
            let first_second: u64 = admitted[fail_bucket..fail_bucket + 10].iter().sum();
            assert!(first_second >= 900, "failing {fail_after} ms after: {first_second} in the first second");
            // The room a bucket that held something frees when it leaves (at the start of the bucket after
            // it, a window later) is used in that bucket.
            for m in fail_bucket.max(1)..=held.len() {
                if held[m - 1] > 0 {
                    assert!(admitted[m] > 0, "failing {fail_after} ms after, bucket {m}: {admitted:?}");
                }
            }
        }
    }

    #[test]
    fn a_fallback_owes_the_others_shares_of_what_it_was_granted_last_as_their_replies_may_not_show_it() {
        let (mut d, lease) = driver();
        // This instance was granted 40 in bucket R (3 live instances); the window held 1000 in all.
        let (call, mut r) = reply(40, 40, 0, 0);
        r.window = vec![(REDIS_MS / 100 - 9, 960), (REDIS_MS / 100, 40)];
        d.apply(&lease, &call, &r, &times());
        let debt = d.fallback_debt(&lease, ENGINE_MS + 2);
        // (1000 + 2 × 40) ÷ 3, until the oldest bucket leaves; then (40 + 2 × 40) ÷ 3 until bucket R does.
        assert_eq!(debt.at(ENGINE_MS + 2), 360);
        assert_eq!(debt.at(ENGINE_MS + 1 + 50), 40);
        assert_eq!(debt.at(ENGINE_MS + 1 + 950), 0);
    }
}
