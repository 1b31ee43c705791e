//! The cluster client's thread: keeps every cluster rule's lease filled, renews memberships, and falls back
//! when Redis fails.
//!
//! It is a thread of its own (whether or not the application runs an async runtime: a busy application
//! runtime must not delay the leases that protect it), parked until a lease asks for tokens (the caller
//! unparks it: no lock, no allocation on the caller's side) or a deadline comes (a membership renewal, a
//! lease's end, the end of a used-up window, a probe of a failing Redis). Redis calls run on a small tokio
//! runtime it owns, each bounded by the timeout, several rules' calls pipelined on one multiplexed
//! connection that is re-established in the background.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::flow::token_service::{RuleLease, TokenService};
use crate::Sentinel;

use super::breaker::{Breaker, Failure, Gate};
use super::config::{redact, ClusterOptions};
use super::keys;
use super::lease::{CallAt, CallTimes, Driver, RedisClock};
use super::script::{LeaseCall, LeaseReply, Scripts};
use super::ClusterClientStatus;

/// A Redis call's outcome under a timeout.
type Timed<T> = Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>;

/// The least time given to making a connection (TCP and the handshake), whatever the call timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// The token service registered on the engine: what the engine's side sees of the client. It holds no
/// reference to the engine (the engine holds it).
pub(crate) struct Service {
    timeout: Duration,
    /// The Redis server's host and port, and the engine time the client started.
    host: String,
    port: u16,
    since_ms: u64,
    /// The client's state (whether Redis answers).
    shared: Arc<Shared>,
    /// Leases attached since the worker last looked.
    attached: Mutex<Vec<Weak<RuleLease>>>,
    pub(crate) thread: OnceLock<std::thread::Thread>,
}

impl Service {
    pub(crate) fn new(timeout: Duration, client: &redis::Client, shared: Arc<Shared>, since_ms: u64) -> Service {
        let (host, port) = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
            redis::ConnectionAddr::Unix(path) => (path.display().to_string(), 0),
            other => (other.to_string(), 0),
        };
        Service { timeout, host, port, since_ms, shared, attached: Mutex::new(Vec::new()), thread: OnceLock::new() }
    }
}

impl TokenService for Service {
    fn attach(&self, lease: &Arc<RuleLease>) {
        self.attached.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(lease));
        self.wake();
    }
    fn wake(&self) {
        // Parking is a futex on Linux (and the platforms' equivalents elsewhere): no lock, no allocation.
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn info(&self) -> crate::flow::ClusterServiceInfo {
        crate::flow::ClusterServiceInfo {
            kind: "redis",
            host: self.host.clone(),
            port: self.port,
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            connected: self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).connected,
            since_ms: self.since_ms,
        }
    }
}

/// State shared by the worker and the [`ClusterClient`](super::ClusterClient) handle.
pub(crate) struct Shared {
    pub(crate) stop: AtomicBool,
    pub(crate) status: Mutex<ClusterClientStatus>,
    pub(crate) status_changed: Condvar,
}

/// A default instance name: host, process, and a random part (two processes of one host differ).
pub(crate) fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".to_string());
    let random = RandomState::new().hash_one(std::process::id()) & 0xFFFF_FFFF;
    format!("{host}:{}:{random:08x}", std::process::id())
}

pub(crate) struct Worker {
    pub(crate) engine: Sentinel,
    pub(crate) service: Arc<Service>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) opts: ClusterOptions,
    pub(crate) namespace: String,
    pub(crate) member: String,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) client: redis::Client,
    conn: Option<ConnectionManager>,
    scripts: Scripts,
    drivers: Vec<Driver>,
    breaker: Breaker,
    /// Whether Redis answered at least once.
    reached: bool,
    /// Redis's clock, as its replies show it.
    clock: RedisClock,
    /// Whether the lease script was loaded on this connection's Redis (again after a failure: a restarted
    /// Redis has an empty script cache).
    loaded: bool,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        engine: Sentinel,
        service: Arc<Service>,
        shared: Arc<Shared>,
        opts: ClusterOptions,
        namespace: String,
        member: String,
        rt: tokio::runtime::Runtime,
        client: redis::Client,
    ) -> Worker {
        let breaker = Breaker::new(opts.retry_max);
        Worker {
            engine,
            service,
            shared,
            opts,
            namespace,
            member,
            rt,
            client,
            conn: None,
            scripts: Scripts::new(),
            drivers: Vec::new(),
            breaker,
            reached: false,
            clock: RedisClock::default(),
            loaded: false,
        }
    }

    /// The connection, made (lazily: no round trip) when there is none.
    fn conn(&mut self) -> Option<ConnectionManager> {
        if self.conn.is_none() {
            let timeout = self.opts.timeout.max(CONNECT_TIMEOUT);
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(None)
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(self.opts.retry_max);
            let _in_runtime = self.rt.enter();
            match ConnectionManager::new_lazy_with_config(self.client.clone(), config) {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    tracing::error!(error = %e, "cluster flow control: cannot set up the Redis connection");
                    return None;
                }
            }
        }
        self.conn.clone()
    }

    pub(crate) fn run(mut self) {
        tracing::info!(
            url = %redact(&self.opts.url),
            namespace = %self.namespace,
            instance = %self.member,
            "cluster flow control: client started"
        );
        self.adopt();
        let _ = self.ping();
        while !self.shared.stop.load(Ordering::Acquire) {
            self.adopt();
            let now = Instant::now();
            let now_ms = self.engine.now_millis();
            self.step(now, now_ms);
            let next = self.next_wake(Instant::now(), self.engine.now_millis());
            if !self.shared.stop.load(Ordering::Acquire) {
                std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
            }
        }
        self.shutdown();
    }

    /// A connection check (at start, so that the status says at once whether Redis is reachable, and as the
    /// breaker's probe). Returns whether Redis answered.
    fn ping(&mut self) -> bool {
        // A connection being made gets the connection timeout; one in place, the call timeout.
        let timeout = if self.conn.is_some() { self.opts.timeout } else { self.opts.timeout.max(CONNECT_TIMEOUT) };
        let Some(mut conn) = self.conn() else { return false };
        let sent_ms = self.engine.now_millis();
        // `TIME` answers as a PING would, and tells Redis's clock (the deadlines of the calls that follow).
        let r = self.rt.block_on(async {
            tokio::time::timeout(timeout, redis::cmd("TIME").query_async::<(i64, i64)>(&mut conn)).await
        });
        match r {
            Ok(Ok((secs, micros))) => {
                self.clock.observe(secs.saturating_mul(1000).saturating_add(micros / 1000), sent_ms, Instant::now());
                if !self.loaded {
                    // Best effort: a lease call loads the script itself when Redis does not have it.
                    let scripts = &self.scripts;
                    let loaded =
                        self.rt.block_on(async { tokio::time::timeout(timeout, scripts.load(&mut conn)).await });
                    self.loaded = matches!(loaded, Ok(Ok(())));
                }
                self.on_success();
                true
            }
            Ok(Err(e)) => {
                self.on_failure(Failure::of(&e));
                false
            }
            Err(_) => {
                self.on_failure(Failure::Timeout(timeout));
                false
            }
        }
    }

    /// Takes the leases attached since the last look, and forgets those whose rules are gone.
    fn adopt(&mut self) {
        let new: Vec<Weak<RuleLease>> =
            std::mem::take(&mut *self.service.attached.lock().unwrap_or_else(|e| e.into_inner()));
        if !new.is_empty() {
            let rules = self.engine.flow_rules();
            let now = Instant::now();
            for lease in new.iter().filter_map(Weak::upgrade) {
                let id = keys::identity(lease.rule(), keys::rank_in(lease.rule(), &rules));
                let k = keys::keys(&self.namespace, &id);
                lease.set_key(k.window.clone());
                lease.set_expected_instances(self.opts.expected_instances);
                if self.breaker.is_closed() {
                    lease.set_leasing(None);
                } else if let Some(f) = &self.breaker.last {
                    lease.set_fallback(f.to_string());
                }
                tracing::debug!(resource = %lease.rule().resource, key = %k.window, "cluster flow control: leasing for a rule");
                self.drivers.push(Driver::new(&lease, k, self.opts.lease_margin, self.opts.timeout, now));
            }
        }
        let before = self.drivers.len();
        let gone: Vec<Driver> = {
            let (alive, gone): (Vec<Driver>, Vec<Driver>) =
                std::mem::take(&mut self.drivers).into_iter().partition(|d| d.lease.strong_count() > 0);
            self.drivers = alive;
            gone
        };
        if !gone.is_empty() && self.breaker.is_closed() {
            // Rules no longer in force: leave their member sets at once (best effort).
            let mut gone = gone;
            let at = self.call_at(Instant::now(), self.engine.now_millis());
            let leave: Vec<(super::keys::RuleKeys, LeaseCall)> =
                gone.iter_mut().map(|d| d.leave_call(&self.member, &at)).collect();
            self.leave(leave);
        }
        if before != self.drivers.len() {
            self.publish_status();
        }
    }

    fn step(&mut self, now: Instant, now_ms: u64) {
        // Leases whose last millisecond passed give their tokens back (also covers a lagging cached clock).
        for d in &mut self.drivers {
            if let Some(lease) = d.lease.upgrade() {
                d.expire(&lease, now_ms);
                d.sample_spent(&lease, now_ms);
            }
        }
        match self.breaker.gate(now) {
            Gate::OpenUntil(_) => {
                // Failing: no lease calls; requests are dropped (calls are decided by the fallback).
                for d in &self.drivers {
                    if let Some(lease) = d.lease.upgrade() {
                        lease.take_request();
                    }
                }
            }
            Gate::Probe => {
                // A ping first (bounded by the connection timeout, so that a connection being made again
                // reports its own failure), then one renewal per rule.
                if self.ping() && !self.drivers.is_empty() {
                    let calls = self.collect(now, now_ms, true);
                    self.run_calls(calls);
                }
            }
            Gate::Closed => {
                let calls = self.collect(now, now_ms, false);
                if !calls.is_empty() {
                    self.run_calls(calls);
                }
            }
        }
    }

    /// The calls to make now: a lease for each rule whose callers asked (or whose used-up window just freed
    /// room while calls were blocked on it), a renewal for each rule due for one (`all`: every rule).
    fn collect(&mut self, now: Instant, now_ms: u64, all: bool) -> Vec<(usize, LeaseCall)> {
        let mut calls = Vec::new();
        let ttl = self.opts.member_ttl;
        let at = self.call_at(now, now_ms);
        for (i, d) in self.drivers.iter_mut().enumerate() {
            let Some(lease) = d.lease.upgrade() else { continue };
            let asked = lease.take_request();
            let demand = d.demand_while_exhausted(&lease);
            if d.probation_until.is_some() {
                // Resuming: report (the reply of the call made once the pause is over resumes leasing).
                if all || d.beat_due(now) || !d.on_probation(now) {
                    calls.push((i, d.beat_call(&lease, &self.member, ttl, &at)));
                }
                continue;
            }
            if d.hold_until(now_ms) > 0 {
                // Ask as soon as a lease call is worth it (see `next_wake`).
                d.ask_when_free |= asked || demand;
                if all || d.beat_due(now) {
                    calls.push((i, d.beat_call(&lease, &self.member, ttl, &at)));
                }
                continue;
            }
            if asked || demand || d.ask_when_free {
                d.ask_when_free = false;
                calls.push((i, d.lease_call(&lease, &self.member, ttl, &at)));
            } else if all || d.beat_due(now) {
                calls.push((i, d.beat_call(&lease, &self.member, ttl, &at)));
            }
        }
        calls
    }

    /// Runs `calls` concurrently (pipelined), each bounded by the timeout, and applies their replies.
    fn run_calls(&mut self, calls: Vec<(usize, LeaseCall)>) {
        let Some(conn) = self.conn() else { return };
        let timeout = self.opts.timeout;
        let scripts = &self.scripts;
        let t0_ms = self.engine.now_millis();
        let results: Vec<(Timed<LeaseReply>, Duration)> =
            self.rt.block_on(futures::future::join_all(calls.iter().map(|(i, call)| {
                let mut conn = conn.clone();
                let keys = &self.drivers[*i].keys;
                async move {
                    let start = Instant::now();
                    let r = tokio::time::timeout(timeout, scripts.lease(&mut conn, keys, call)).await;
                    (r, start.elapsed())
                }
            })));
        let t1_ms = self.engine.now_millis();
        let now = Instant::now();
        let mut failure = None;
        let mut ok = false;
        for (result, _) in &results {
            if let Ok(Ok(reply)) = result {
                self.clock.observe(reply.redis_ms, t0_ms, now);
            }
        }
        for ((i, call), (result, rtt)) in calls.iter().zip(results) {
            let d = &mut self.drivers[*i];
            let Some(lease) = d.lease.upgrade() else { continue };
            lease.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(Ok(reply)) => {
                    ok = true;
                    let at = CallTimes { t0_ms, t1_ms, rtt, now, beat: self.opts.heartbeat_interval };
                    d.apply(&lease, call, &reply, &at);
                }
                Ok(Err(e)) => {
                    lease.counters.failures.fetch_add(1, Ordering::Relaxed);
                    failure = Some(Failure::of(&e));
                }
                Err(_) => {
                    lease.counters.failures.fetch_add(1, Ordering::Relaxed);
                    failure = Some(Failure::Timeout(timeout));
                }
            }
        }
        match failure {
            Some(f) => self.on_failure(f),
            None if ok => self.on_success(),
            None => {}
        }
    }

    fn on_success(&mut self) {
        let first = !self.reached;
        self.reached = true;
        if self.breaker.success() {
            tracing::info!(
                url = %redact(&self.opts.url),
                "cluster flow control: Redis answers again; cluster rules lease from it again once every instance \
                 could count what its fallback admitted"
            );
            // Every instance probes within `retry_max` of Redis coming back, and reports what its fallback
            // admitted with its first call: lease again once they all could.
            let now = Instant::now();
            let pause = self.opts.retry_max + self.opts.timeout.max(CONNECT_TIMEOUT) + self.opts.timeout;
            for d in &mut self.drivers {
                d.resume_after(now, pause);
                if let Some(lease) = d.lease.upgrade() {
                    lease.set_fallback(
                        "Redis answers again: leasing resumes once the other instances have counted what their \
                         fallbacks admitted"
                            .to_string(),
                    );
                    lease.changed();
                }
            }
            self.publish_status();
        } else if first {
            tracing::info!(url = %redact(&self.opts.url), "cluster flow control: connected to Redis");
            self.publish_status();
        }
    }

    fn on_failure(&mut self, f: Failure) {
        let why = f.to_string();
        self.loaded = false;
        if f.needs_new_connection() {
            // Made afresh on the next attempt (an authentication failure, for one, is not retried by the
            // connection manager).
            self.conn = None;
        }
        if self.breaker.failure(Instant::now(), f) {
            // Falling back now: for a second, the local limits count what the leases admitted.
            let now_ms = self.engine.now_millis();
            for d in &mut self.drivers {
                // A rule still resuming had not leased since it last fell back: nothing to count.
                let leasing = d.probation_until.take().is_none();
                if let Some(lease) = d.lease.upgrade().filter(|_| leasing) {
                    lease.set_fallback_debt(now_ms, d.fallback_debt(&lease));
                }
            }
            tracing::warn!(
                url = %redact(&self.opts.url),
                reason = %why,
                "cluster flow control falls back to local limits (count / live instances for global \
                 thresholds): {why}"
            );
        } else {
            tracing::debug!(reason = %why, "cluster flow control: Redis still failing");
        }
        for d in &self.drivers {
            if let Some(lease) = d.lease.upgrade() {
                lease.set_fallback(why.clone());
                lease.changed();
            }
        }
        self.publish_status();
    }

    /// Leaves the member sets of `calls` (best effort, bounded by the timeout).
    fn leave(&mut self, calls: Vec<(super::keys::RuleKeys, LeaseCall)>) {
        let Some(conn) = self.conn() else { return };
        let timeout = self.opts.timeout.max(Duration::from_millis(200));
        let scripts = &self.scripts;
        let _ = self.rt.block_on(futures::future::join_all(calls.iter().map(|(keys, call)| {
            let mut conn = conn.clone();
            async move { tokio::time::timeout(timeout, scripts.lease(&mut conn, keys, call)).await }
        })));
    }

    /// When to wake up next (at the latest): the next renewal, lease end, used-up window's end or probe.
    fn next_wake(&self, now: Instant, now_ms: u64) -> Instant {
        let mut next = now + self.opts.heartbeat_interval;
        let ms = |t: u64| now + Duration::from_millis(t.saturating_sub(now_ms));
        if let Gate::OpenUntil(t) = self.breaker.gate(now) {
            next = next.min(t);
        }
        for d in &self.drivers {
            next = next.min(d.next_beat());
            for t in d.deadlines_ms() {
                next = next.min(ms(t));
            }
            if d.ask_when_free {
                // A deferred lease call: when it is worth making.
                next = next.min(ms(d.hold_until(now_ms)));
            }
            if let Some(t) = d.probation_until {
                next = next.min(t);
            }
        }
        next.max(now)
    }

    /// The instant, engine time and Redis clock a call made now carries.
    fn call_at(&self, now: Instant, now_ms: u64) -> CallAt {
        CallAt { now, now_ms, clock: self.clock }
    }

    fn publish_status(&self) {
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        s.connected = self.reached && self.breaker.is_closed();
        s.last_error = self.breaker.last.as_ref().map(ToString::to_string);
        s.rules = self.drivers.len();
        drop(s);
        self.shared.status_changed.notify_all();
    }

    fn shutdown(&mut self) {
        let calls: Vec<(super::keys::RuleKeys, LeaseCall)> = {
            let member = self.member.clone();
            let at = self.call_at(Instant::now(), self.engine.now_millis());
            let mut out = Vec::new();
            for d in &mut self.drivers {
                if let Some(lease) = d.lease.upgrade() {
                    d.expire(&lease, u64::MAX);
                }
                out.push(d.leave_call(&member, &at));
            }
            out
        };
        if self.breaker.is_closed() && !calls.is_empty() {
            self.leave(calls);
        }
        for d in &self.drivers {
            if let Some(lease) = d.lease.upgrade() {
                lease.detach();
                lease.changed();
            }
        }
        let service: Arc<dyn TokenService> = self.service.clone();
        if let Err(e) = self.engine.unregister_cluster_service(&service) {
            tracing::error!(error = %e, "cluster flow control: could not unregister the token service");
        }
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        s.connected = false;
        s.stopped = true;
        drop(s);
        self.shared.status_changed.notify_all();
        tracing::info!(instance = %self.member, "cluster flow control: client stopped");
    }
}
