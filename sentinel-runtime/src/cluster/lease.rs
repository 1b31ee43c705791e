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
//! given back to their bucket in the next call, so the window counts only what was spent.
//!
//! **Few round trips.** The client learns the rule's rate on this instance (tokens spent per ms) and asks
//! for what it expects to spend until the bucket ends (plus a quarter), at most a fair share of the window
//! (`window ÷ live instances`) per call, so at a steady rate one call per bucket suffices and instances that
//! all want more than the window holds share it; callers ask for more when the pool falls below what a round trip's worth of calls
//! needs (the low-water mark), before it runs dry. While the window is used up, Redis says when it frees
//! room again and calls block locally until then, without a round trip each.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::flow::token_service::RuleLease;
use crate::flow::{ClusterThresholdType, FlowRule};

use super::keys::RuleKeys;
use super::script::{LeaseCall, LeaseReply};

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
    pub(crate) keys: RuleKeys,
    /// Tokens per window: per instance for average-local thresholds, for all of them for global ones.
    allowance: f64,
    global: bool,
    bucket_ms: u64,
    sample_count: u32,
    margin_ms: u64,
    cur: Option<Current>,
    /// Tokens to give back: (bucket, count).
    returns: Vec<(i64, u64)>,
    /// Tokens put in the pool so far, and given back so far (to measure what was spent).
    issued: u64,
    returned: u64,
    /// Spending rate on this instance, tokens per ms, and when it was last measured (with the spent count).
    rate: f64,
    measured: Option<(Instant, u64)>,
    /// Round trip, ms.
    rtt_ms: f64,
    pub(crate) live: u64,
    next_beat: Instant,
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
    /// Calls were blocked on a used-up window since the last lease: ask for a whole fair share.
    pressed: bool,
}

impl Driver {
    pub(crate) fn new(lease: &Arc<RuleLease>, keys: RuleKeys, margin: Duration, now: Instant) -> Driver {
        let rule: &FlowRule = lease.rule();
        let c = rule.cluster_config.clone().unwrap_or_default();
        Driver {
            lease: Arc::downgrade(lease),
            keys,
            allowance: rule.count * c.window_interval_ms as f64 / 1000.0,
            global: c.threshold_type == ClusterThresholdType::Global,
            bucket_ms: (c.window_interval_ms / c.sample_count.max(1) as u64).max(1),
            sample_count: c.sample_count.max(1),
            margin_ms: u64::try_from(margin.as_millis()).unwrap_or(u64::MAX),
            cur: None,
            returns: Vec::new(),
            issued: 0,
            returned: 0,
            rate: 0.0,
            measured: None,
            rtt_ms: 1.0,
            live: 1,
            next_beat: now,
            exhausted_until: 0,
            exhausted_seen: 0,
            next_bucket_at: 0,
            ask_when_free: false,
            pressed: false,
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

    /// Measures the spending rate (tokens per ms) from what left the pool since the last measure.
    fn measure(&mut self, lease: &RuleLease, now: Instant) {
        let (in_hand, valid_until) = lease.in_hand();
        let in_hand = if self.cur.is_some_and(|c| c.valid_until == valid_until) { in_hand } else { 0 };
        let spent = self.issued.saturating_sub(self.returned).saturating_sub(in_hand);
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

    /// How many tokens to ask for at engine time `now_ms`.
    fn want(&self, lease: &RuleLease, now_ms: u64) -> u64 {
        let share = (self.window_allowance() / (self.sample_count as f64 * self.live.max(1) as f64 * 2.0)).floor();
        let (in_hand, horizon) = match self.cur {
            Some(c) if c.valid_until >= now_ms => (lease.in_hand().0, (c.valid_until - now_ms + 1) as f64),
            _ => (0, self.bucket_ms as f64),
        };
        let expected = (self.rate * horizon * 1.25).ceil();
        // At most a fair share of the window per call: instances that all want more than the window holds
        // each get about their share, and a lone busy one comes back for the rest.
        let fair = (self.window_allowance() / self.live.max(1) as f64).ceil().max(1.0) as u64;
        if self.pressed {
            return fair;
        }
        let want = if self.rate > 0.0 { expected } else { share };
        (want.max(1.0) as u64).saturating_sub(in_hand).clamp(1, fair)
    }

    /// Until when (engine ms) no lease call is worth making: the window is used up, or the lease of the
    /// current bucket ended (its margin) and Redis is not in the next bucket yet; 0 when a call is worth it.
    pub(crate) fn hold_until(&self, now_ms: u64) -> u64 {
        if now_ms < self.exhausted_until {
            return self.exhausted_until;
        }
        let lease_over = self.cur.is_none_or(|c| now_ms > c.valid_until);
        if lease_over && now_ms < self.next_bucket_at {
            return self.next_bucket_at;
        }
        0
    }

    /// Whether calls were blocked on the used-up window since the last look (ask as soon as it frees room).
    /// Such calls show a demand the spending rate does not (it only shows what was granted): the next lease
    /// asks for a whole fair share.
    pub(crate) fn demand_while_exhausted(&mut self, lease: &RuleLease) -> bool {
        let blocked = lease.exhausted_blocks();
        let more = blocked > self.exhausted_seen;
        self.exhausted_seen = blocked;
        self.pressed |= more;
        more
    }

    /// The lease call to make now.
    pub(crate) fn lease_call(
        &mut self,
        lease: &RuleLease,
        member: &str,
        ttl: Duration,
        now: Instant,
        now_ms: u64,
    ) -> LeaseCall {
        self.measure(lease, now);
        let want = self.want(lease, now_ms);
        self.pressed = false;
        self.call(want, member, ttl)
    }

    /// A membership renewal (no tokens), giving back what is due.
    pub(crate) fn beat_call(&mut self, member: &str, ttl: Duration) -> LeaseCall {
        self.call(0, member, ttl)
    }

    fn call(&mut self, want: u64, member: &str, ttl: Duration) -> LeaseCall {
        LeaseCall {
            want,
            member: member.to_string(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            allowance: self.allowance,
            global: self.global,
            bucket_ms: self.bucket_ms,
            sample_count: self.sample_count,
            // Given back at most once: if the call fails they are dropped (counted as spent), never resent.
            returns: std::mem::take(&mut self.returns),
        }
    }

    fn give_back(&mut self, lease: &RuleLease, bucket: i64, n: u64) {
        if n == 0 {
            return;
        }
        self.returned += n;
        lease.counters.returned.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        match self.returns.iter_mut().find(|(b, _)| *b == bucket) {
            Some((_, c)) => *c += n,
            None => self.returns.push((bucket, n)),
        }
        // Buckets that left the window cannot take tokens back.
        let newest = self.returns.iter().map(|(b, _)| *b).max().unwrap_or(bucket);
        let oldest = newest - self.sample_count as i64 + 1;
        self.returns.retain(|(b, _)| *b >= oldest);
    }

    /// Ends the lease in force if its last millisecond passed (its tokens are given back).
    pub(crate) fn expire(&mut self, lease: &RuleLease, now_ms: u64) {
        if let Some(c) = self.cur {
            if now_ms > c.valid_until {
                let left = lease.replace(0, 0);
                self.cur = None;
                self.give_back(lease, c.bucket, left);
            }
        }
    }

    /// Applies a reply to `call`, made at the times of `at`.
    pub(crate) fn apply(&mut self, lease: &RuleLease, call: &LeaseCall, r: &LeaseReply, at: &CallTimes) {
        let CallTimes { t0_ms, t1_ms, rtt, now, beat } = *at;
        self.live = r.live.max(1);
        self.rtt_ms = 0.8 * self.rtt_ms + 0.2 * rtt.as_secs_f64() * 1000.0;
        self.next_beat = now + beat;
        let bucket_end = (r.bucket + 1).saturating_mul(self.bucket_ms as i64);
        let valid_until =
            (t0_ms as i64).saturating_add(bucket_end - r.redis_ms).saturating_sub(self.margin_ms as i64 + 1);
        if r.granted > 0 {
            lease.counters.leased.fetch_add(r.granted, std::sync::atomic::Ordering::Relaxed);
            match self.cur {
                Some(c) if c.bucket == r.bucket && lease.add(c.valid_until, r.granted) => self.issued += r.granted,
                _ if valid_until >= t1_ms as i64 => {
                    let valid_until = valid_until as u64;
                    let left = lease.replace(valid_until, r.granted);
                    if let Some(old) = self.cur.take() {
                        self.give_back(lease, old.bucket, left);
                    }
                    self.cur = Some(Current { bucket: r.bucket, valid_until });
                    self.issued += r.granted;
                }
                // Arrived too late to be spent within its bucket.
                _ => {
                    self.issued += r.granted;
                    self.give_back(lease, r.bucket, r.granted);
                }
            }
        }
        // Latest estimates (from the reply's arrival): asking earlier could find Redis still before them.
        self.next_bucket_at = (t1_ms as i64).saturating_add(bucket_end - r.redis_ms).max(0) as u64;
        if call.want > r.granted && r.left == 0 && r.retry_at_ms > r.redis_ms {
            self.exhausted_until = t1_ms.saturating_add((r.retry_at_ms - r.redis_ms) as u64);
        } else {
            self.exhausted_until = 0;
        }
        lease.set_exhausted_until(self.exhausted_until);
        // Ask for more while a round trip's worth of calls (twice over, plus a millisecond) is still in hand.
        lease.set_low_water((self.rate * (2.0 * self.rtt_ms + 1.0)).ceil().max(1.0) as u64);
        lease.set_leasing(Some(self.live));
        lease.changed();
    }

    /// When the driver next needs the worker: its membership renewal, the end of its lease, the end of a
    /// used-up window (engine ms, converted by the caller).
    pub(crate) fn next_beat(&self) -> Instant {
        self.next_beat
    }

    /// Whether the membership is due for renewal, or tokens wait to be given back.
    pub(crate) fn beat_due(&self, now: Instant) -> bool {
        now >= self.next_beat || !self.returns.is_empty()
    }

    /// Engine times (ms) at which the driver wants to act: the end of its lease.
    pub(crate) fn deadlines_ms(&self) -> impl Iterator<Item = u64> + '_ {
        self.cur.map(|c| c.valid_until + 1).into_iter()
    }
}
