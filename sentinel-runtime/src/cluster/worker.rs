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
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::flow::token_service::{RuleLease, TokenService};
use crate::flow::FlowRule;
use crate::Sentinel;

use super::breaker::{Breaker, Failure, Gate};
use super::config::ClusterOptions;
use super::connection::{Conn, Link, Topology};
use super::keys;
use super::lease::{CallAt, CallTimes, Driver, RedisClock};
use super::script::{LeaseCall, LeaseReply, Scripts};
use super::status::ClusterClientStatus;

/// A Redis call's outcome under a timeout.
type Timed<T> = Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>;

/// The least time given to making a connection (TCP and the handshake), whatever the call timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// The group of the connection itself (its checks, `TIME`): on a standalone Redis or behind Sentinel every
/// rule is in it too; on a Redis Cluster each rule has a group of its own (a shard down makes only its
/// rules fall back).
const CONNECTION: &str = "";

/// The token service registered on the engine: what the engine's side sees of the client. It holds no
/// reference to the engine (the engine holds it).
pub(crate) struct Service {
    timeout: Duration,
    kind: &'static str,
    /// The Redis server's host and port (behind Sentinel, the master last found; the first sentinel
    /// until then), and the engine time the client started.
    server: Mutex<(String, u16)>,
    since_ms: u64,
    /// The client's state (whether Redis answers).
    client: Arc<ClientState>,
    /// Leases attached since the worker last looked, with their rule's rank in the rule list it came into
    /// force with ([`keys::rank_in`]).
    attached: Mutex<Vec<(Weak<RuleLease>, usize)>>,
    pub(crate) thread: OnceLock<std::thread::Thread>,
}

impl Service {
    pub(crate) fn new(timeout: Duration, topology: &Topology, client: Arc<ClientState>, since_ms: u64) -> Service {
        let first = match topology {
            Topology::Standalone { url } => Some(url),
            Topology::Cluster { nodes } => nodes.first(),
            Topology::Sentinel { sentinels, .. } => sentinels.first(),
        };
        let info = first.and_then(|u| redis::IntoConnectionInfo::into_connection_info(u.as_str()).ok());
        Service {
            timeout,
            kind: topology.kind(),
            server: Mutex::new(host_port(info.as_ref().map(redis::ConnectionInfo::addr))),
            since_ms,
            client,
            attached: Mutex::new(Vec::new()),
            thread: OnceLock::new(),
        }
    }
}

impl TokenService for Service {
    fn attach(&self, lease: &Arc<RuleLease>, rules: &[FlowRule]) {
        // Ranked in the list the rule comes into force with: the list in force may still be the one before,
        // where the rule this one replaces (a changed count, the same fingerprint) would count before it and
        // name another window.
        let rank = keys::rank_in(lease.rule(), rules);
        self.attached.lock().unwrap_or_else(|e| e.into_inner()).push((Arc::downgrade(lease), rank));
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
        let (host, port) = self.server.lock().unwrap_or_else(|e| e.into_inner()).clone();
        crate::flow::ClusterServiceInfo {
            kind: self.kind,
            host,
            port,
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            connected: self.client.status.lock().unwrap_or_else(|e| e.into_inner()).connected,
            since_ms: self.since_ms,
        }
    }
}

/// The host and port of `addr`, as the dashboard shows them.
fn host_port(addr: Option<&redis::ConnectionAddr>) -> (String, u16) {
    match addr {
        Some(redis::ConnectionAddr::Tcp(h, p)) => (h.clone(), *p),
        Some(redis::ConnectionAddr::Unix(path)) => (path.display().to_string(), 0),
        Some(other) => (other.to_string(), 0),
        None => (String::new(), 0),
    }
}

/// State shared by the worker and the [`ClusterClient`](super::ClusterClient) handle.
pub(crate) struct ClientState {
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
    pub(crate) client: Arc<ClientState>,
    pub(crate) opts: ClusterOptions,
    pub(crate) namespace: String,
    pub(crate) member: String,
    pub(crate) rt: tokio::runtime::Runtime,
    link: Link,
    conn: Option<Conn>,
    /// A Redis Cluster: a fresh connection being made in the background after a call timed out (it takes
    /// the place of `conn` once made: see [`Link::fresh_cluster_connection`]).
    refresh: Option<tokio::task::JoinHandle<Option<Conn>>>,
    scripts: Scripts,
    drivers: Vec<Driver>,
    /// One breaker per group of rules one server serves (see [`CONNECTION`]); a group without one is closed.
    breakers: HashMap<String, Breaker>,
    /// Per group, the failure last logged, until the group's scripts run again: a failure is logged once
    /// per change, not again at each probe (a wrong node answers a ping, then fails the script again).
    reported: HashMap<String, Failure>,
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
        client: Arc<ClientState>,
        opts: ClusterOptions,
        namespace: String,
        member: String,
        rt: tokio::runtime::Runtime,
        link: Link,
    ) -> Worker {
        Worker {
            engine,
            service,
            client,
            opts,
            namespace,
            member,
            rt,
            link,
            conn: None,
            refresh: None,
            scripts: Scripts::new(),
            drivers: Vec::new(),
            breakers: HashMap::new(),
            reported: HashMap::new(),
            reached: false,
            clock: RedisClock::default(),
            loaded: false,
        }
    }

    /// The connection, made when there is none (standalone: lazily, no round trip; a cluster: its slot map
    /// from a seed node; Sentinel: the master the sentinels name now), bounded by four connection timeouts.
    fn conn(&mut self) -> Result<Conn, Failure> {
        if self.refresh.as_ref().is_some_and(tokio::task::JoinHandle::is_finished)
            && let Some(fresh) = self.refresh.take().and_then(|h| self.rt.block_on(h).ok().flatten())
        {
            tracing::debug!("cluster flow control: a fresh Redis Cluster connection takes over");
            self.conn = Some(fresh);
            self.loaded = false;
        }
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let timeout = self.opts.timeout.max(CONNECT_TIMEOUT);
        let (link, retry_max) = (&mut self.link, self.opts.retry_max);
        let made =
            self.rt.block_on(async { tokio::time::timeout(timeout * 4, link.connect(timeout, retry_max)).await });
        let c = match made {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Failure::of(&e)),
            Err(_) => return Err(Failure::Timeout(timeout * 4)),
        };
        if let Some(addr) = c.master_addr() {
            // Behind Sentinel: the master found now (a failover changes it).
            *self.service.server.lock().unwrap_or_else(|e| e.into_inner()) = host_port(Some(addr));
        }
        self.conn = Some(c.clone());
        Ok(c)
    }

    /// The group of the rule whose window key is `window` (see [`CONNECTION`]).
    fn group_of(&self, window: &str) -> String {
        if self.link.is_sharded() {
            window.to_string()
        } else {
            CONNECTION.to_string()
        }
    }

    fn breaker(&mut self, group: &str) -> &mut Breaker {
        let max = self.opts.retry_max;
        self.breakers.entry(group.to_string()).or_insert_with(|| Breaker::new(max))
    }

    /// Whether every group's breaker is closed.
    fn all_closed(&self) -> bool {
        self.breakers.values().all(Breaker::is_closed)
    }

    /// The drivers of `group`.
    fn in_group(&self, group: &str) -> Vec<usize> {
        (0..self.drivers.len()).filter(|i| self.group_of(&self.drivers[*i].keys.window) == group).collect()
    }

    pub(crate) fn run(mut self) {
        tracing::info!(
            redis = %self.opts.topology.describe(),
            namespace = %self.namespace,
            instance = %self.member,
            "cluster flow control: client started"
        );
        self.adopt();
        let _ = self.ping();
        while !self.client.stop.load(Ordering::Acquire) {
            self.adopt();
            let now = Instant::now();
            let now_ms = self.engine.now_millis();
            self.step(now, now_ms);
            let next = self.next_wake(Instant::now(), self.engine.now_millis());
            if !self.client.stop.load(Ordering::Acquire) {
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
        let mut conn = match self.conn() {
            Ok(c) => c,
            Err(f) => {
                self.on_failure(CONNECTION, f);
                return false;
            }
        };
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
                self.on_success(CONNECTION, false);
                true
            }
            Ok(Err(e)) => {
                self.on_failure(CONNECTION, Failure::of(&e));
                false
            }
            Err(_) => {
                self.on_failure(CONNECTION, Failure::Timeout(timeout));
                false
            }
        }
    }

    /// Takes the leases attached since the last look, and forgets those whose rules are gone.
    fn adopt(&mut self) {
        let new: Vec<(Weak<RuleLease>, usize)> =
            std::mem::take(&mut *self.service.attached.lock().unwrap_or_else(|e| e.into_inner()));
        if !new.is_empty() {
            let now = Instant::now();
            for (lease, rank) in new.iter().filter_map(|(l, rank)| Some((l.upgrade()?, *rank))) {
                let id = keys::identity(lease.rule(), rank);
                let k = keys::keys(&self.namespace, &id);
                lease.set_key(k.window.clone());
                lease.set_expected_instances(self.opts.expected_instances);
                let group = self.group_of(&k.window);
                let b = self.breaker(&group);
                if b.is_closed() {
                    lease.set_leasing(None);
                } else if let Some(f) = &b.last {
                    lease.set_fallback(f.to_string());
                }
                tracing::debug!(resource = %lease.rule().resource, key = %k.window, "cluster flow control: leasing for a rule");
                // Rules of this instance that share the window (one flowId) keep records of their own there.
                let record = (0..)
                    .find(|r| !self.drivers.iter().any(|d| d.keys.window == k.window && d.record == *r))
                    .unwrap_or(0);
                let mut driver = Driver::new(&lease, k, self.opts.lease_margin, self.opts.timeout, now);
                driver.record = record;
                driver.live_hold = self.opts.member_ttl.saturating_mul(2);
                self.drivers.push(driver);
            }
        }
        let before = self.drivers.len();
        let mut gone: Vec<Driver> = {
            let (alive, gone): (Vec<Driver>, Vec<Driver>) =
                std::mem::take(&mut self.drivers).into_iter().partition(|d| d.lease.strong_count() > 0);
            self.drivers = alive;
            gone
        };
        if !gone.is_empty() {
            // A rule that replaced a gone one under the same key (its count changed, say) takes over what the
            // gone one had not settled with Redis, whether Redis answers now or not; no leave call for it (it
            // would drop the member's records the new one goes on with).
            let at = self.call_at(Instant::now(), self.engine.now_millis());
            let mut left = Vec::with_capacity(gone.len());
            for g in gone {
                match self.drivers.iter().position(|d| d.keys.window == g.keys.window) {
                    Some(i) => {
                        let d = &mut self.drivers[i];
                        d.take_over(g, &at);
                        let group = self.group_of(&self.drivers[i].keys.window);
                        let falling_back = self.breakers.get(&group).is_some_and(|b| !b.is_closed());
                        let d = &mut self.drivers[i];
                        if let Some(lease) = d.lease.upgrade().filter(|_| falling_back) {
                            // What the window held at the gone rule's last reply is still owed.
                            lease.set_fallback_debt(d.fallback_debt(&lease, at.now_ms));
                        }
                    }
                    None => left.push(g),
                }
            }
            gone = left;
        }
        if self.link.is_sharded() && !gone.is_empty() {
            // The breakers of rules no longer in force go with them.
            let live: HashSet<String> = self.drivers.iter().map(|d| d.keys.window.clone()).collect();
            self.breakers.retain(|g, _| g.as_str() == CONNECTION || live.contains(g));
            self.reported.retain(|g, _| g.as_str() == CONNECTION || live.contains(g));
        }
        if !gone.is_empty() && self.all_closed() {
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
            }
        }
        // Each rule's gate, before the connection's probe changes it.
        let gates: Vec<Gate> = (0..self.drivers.len())
            .map(|i| {
                let group = self.group_of(&self.drivers[i].keys.window);
                self.breakers.get(&group).map_or(Gate::Closed, |b| b.gate(now))
            })
            .collect();
        // A failing connection is probed with a ping first (bounded by the connection timeout, so that a
        // connection being made again reports its own failure).
        let probed = match self.breakers.get(CONNECTION).map(|b| b.gate(now)) {
            Some(Gate::Probe) => self.ping(),
            _ => true,
        };
        // On a cluster a rule's probe is its own renewal, whatever the node a ping reached says.
        let probed = probed || self.link.is_sharded();
        let plan: Vec<Option<bool>> = gates
            .iter()
            .map(|g| match g {
                Gate::Closed => Some(false),
                // Probing (after the ping, when the rule is the connection's): one renewal.
                Gate::Probe => probed.then_some(true),
                // Failing: no lease calls; requests are dropped (calls are decided by the fallback).
                Gate::OpenUntil(_) => None,
            })
            .collect();
        let calls = self.collect(now, now_ms, &plan);
        if !calls.is_empty() {
            self.run_calls(calls);
        }
    }

    /// The calls to make now: a lease for each rule whose callers asked (or whose used-up window just freed
    /// room while calls were blocked on it), a renewal for each rule due for one. `plan` per rule: `None`,
    /// no call (its Redis fails: its callers' requests are dropped); `Some(true)`, a renewal in any case
    /// (a probe).
    fn collect(&mut self, now: Instant, now_ms: u64, plan: &[Option<bool>]) -> Vec<(usize, LeaseCall)> {
        let mut calls = Vec::new();
        let ttl = self.opts.member_ttl;
        let at = self.call_at(now, now_ms);
        for (i, d) in self.drivers.iter_mut().enumerate() {
            let Some(lease) = d.lease.upgrade() else { continue };
            let asked = lease.take_request();
            let Some(all) = plan.get(i).copied().flatten() else { continue };
            let demand = d.demand_while_exhausted(&lease);
            if d.probation_until.is_some() {
                // Resuming: report (the reply of the call made once the pause is over resumes leasing).
                if all || d.beat_due(now) || !d.on_probation(now) {
                    calls.push((i, d.beat_call(&self.member, ttl, &at)));
                }
                continue;
            }
            if d.hold_until(now_ms) > 0 {
                // Ask as soon as a lease call is worth it (see `next_wake`).
                d.ask_when_free |= asked || demand;
                if all || d.beat_due(now) {
                    d.release_idle(&lease, now);
                    calls.push((i, d.beat_call(&self.member, ttl, &at)));
                }
                continue;
            }
            if asked || demand || d.ask_when_free {
                d.ask_when_free = false;
                calls.push((i, d.lease_call(&lease, &self.member, ttl, &at)));
            } else if all || d.beat_due(now) {
                d.release_idle(&lease, now);
                calls.push((i, d.beat_call(&self.member, ttl, &at)));
            }
        }
        calls
    }

    /// Runs `calls` concurrently (pipelined), each bounded by the timeout, and applies their replies.
    fn run_calls(&mut self, calls: Vec<(usize, LeaseCall)>) {
        let groups: Vec<String> = calls.iter().map(|(i, _)| self.group_of(&self.drivers[*i].keys.window)).collect();
        let conn = match self.conn() {
            Ok(c) => c,
            Err(f) => {
                let failed: HashSet<&String> = groups.iter().collect();
                for g in failed {
                    self.on_failure(g, f.clone());
                }
                return;
            }
        };
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
        let mut failures: HashMap<&str, Failure> = HashMap::new();
        let mut answered: HashSet<&str> = HashSet::new();
        for (result, _) in &results {
            if let Ok(Ok(reply)) = result {
                self.clock.observe(reply.redis_ms, t0_ms, now);
            }
        }
        for (((i, call), (result, rtt)), group) in calls.iter().zip(results).zip(&groups) {
            let d = &mut self.drivers[*i];
            let Some(lease) = d.lease.upgrade() else { continue };
            lease.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(Ok(reply)) => {
                    answered.insert(group);
                    let at = CallTimes { t0_ms, t1_ms, rtt, now, beat: self.opts.heartbeat_interval };
                    d.apply(&lease, call, &reply, &at);
                }
                Ok(Err(e)) => {
                    lease.counters.failures.fetch_add(1, Ordering::Relaxed);
                    failures.insert(group, Failure::of(&e));
                }
                Err(_) => {
                    lease.counters.failures.fetch_add(1, Ordering::Relaxed);
                    failures.insert(group, Failure::Timeout(timeout));
                }
            }
        }
        // A group falls back when one of its calls failed, and resumes when all answered.
        let answered: Vec<String> =
            answered.into_iter().filter(|g| !failures.contains_key(g)).map(str::to_string).collect();
        let failures: Vec<(String, Failure)> = failures.into_iter().map(|(g, f)| (g.to_string(), f)).collect();
        for (g, f) in failures {
            self.on_failure(&g, f);
        }
        for g in answered {
            self.on_success(&g, true);
        }
    }

    /// Which rules a group's state concerns, for log lines: every rule, or one rule's window key.
    fn rules_of(group: &str) -> &str {
        if group == CONNECTION {
            "every cluster rule"
        } else {
            group
        }
    }

    /// A call of `group` succeeded: `script`, a lease script (else the connection's check).
    fn on_success(&mut self, group: &str, script: bool) {
        let first = !self.reached;
        self.reached = true;
        if script || (group == CONNECTION && self.link.is_sharded()) {
            self.reported.remove(group);
        }
        let outstanding = self.reported.contains_key(group);
        if self.breaker(group).success() {
            if outstanding {
                tracing::debug!(rules = %Self::rules_of(group), "cluster flow control: Redis answers a check");
            } else {
                tracing::info!(
                    redis = %self.opts.topology.describe(),
                    rules = %Self::rules_of(group),
                    "cluster flow control: Redis answers again; cluster rules lease from it again once every \
                     instance could count what its fallback admitted"
                );
            }
            // Every instance probes within `retry_max` of Redis coming back, and reports what its fallback
            // admitted with its first call: lease again once they all could.
            let now = Instant::now();
            let pause = self.opts.retry_max + self.opts.timeout.max(CONNECT_TIMEOUT) + self.opts.timeout;
            for i in self.in_group(group) {
                let d = &mut self.drivers[i];
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
            tracing::info!(redis = %self.opts.topology.describe(), "cluster flow control: connected to Redis");
            self.publish_status();
        }
    }

    fn on_failure(&mut self, group: &str, f: Failure) {
        let why = f.to_string();
        self.loaded = false;
        // Made afresh on the next attempt (an authentication failure, for one, is not retried by the
        // connection manager; behind Sentinel, the master is looked up again, also when it stops answering:
        // a hung or cut-off master is replaced by the sentinels while its connection stays open). A cluster
        // connection follows its nodes by itself: one shard failing is no reason to drop the others.
        let renew = f.needs_new_connection() || self.link.finds_master();
        if renew && (!self.link.is_sharded() || matches!(f, Failure::Auth(_))) {
            self.conn = None;
        }
        // A Redis Cluster node that stops answering keeps its slots in the connection's map until a
        // redirection or a dropped connection says otherwise: a fresh connection, made in the background,
        // learns whether the cluster promoted a replica in its place (the calls go on meanwhile).
        if matches!(f, Failure::Timeout(_)) && self.conn.is_some() && self.refresh.is_none() {
            let timeout = self.opts.timeout.max(CONNECT_TIMEOUT);
            if let Some(fresh) = self.link.fresh_cluster_connection(timeout) {
                let bounded = async move { tokio::time::timeout(timeout * 4, fresh).await.ok().and_then(Result::ok) };
                self.refresh = Some(self.rt.spawn(bounded));
            }
        }
        // Reported once per state change: when the group falls back, and when the reason changes kind.
        let fresh = self.reported.get(group).is_none_or(|last| !last.same_kind(&f));
        if fresh {
            self.reported.insert(group.to_string(), f.clone());
        }
        let b = self.breaker(group);
        let changed = b.last.as_ref().is_some_and(|last| !last.same_kind(&f));
        if b.failure(Instant::now(), f) {
            // Falling back now: the local limits owe each instance's share of what the window held at the last
            // reply, until it leaves the window.
            let now_ms = self.engine.now_millis();
            for i in self.in_group(group) {
                let d = &mut self.drivers[i];
                // A rule still resuming had not leased since it last fell back: nothing to count.
                let leasing = d.probation_until.take().is_none();
                if let Some(lease) = d.lease.upgrade().filter(|_| leasing) {
                    lease.set_fallback_debt(d.fallback_debt(&lease, now_ms));
                }
            }
            if fresh {
                tracing::warn!(
                    redis = %self.opts.topology.describe(),
                    rules = %Self::rules_of(group),
                    reason = %why,
                    "cluster flow control falls back to local limits (count / live instances for global \
                     thresholds): {why}"
                );
            } else {
                tracing::debug!(reason = %why, "cluster flow control falls back again");
            }
        } else if fresh && changed {
            tracing::warn!(
                redis = %self.opts.topology.describe(),
                rules = %Self::rules_of(group),
                reason = %why,
                "cluster flow control: Redis still failing, now for another reason: {why}"
            );
        } else {
            tracing::debug!(reason = %why, "cluster flow control: Redis still failing");
        }
        for i in self.in_group(group) {
            if let Some(lease) = self.drivers[i].lease.upgrade() {
                lease.set_fallback(why.clone());
                lease.changed();
            }
        }
        self.publish_status();
    }

    /// Leaves the member sets of `calls` (best effort, bounded by the timeout).
    fn leave(&mut self, calls: Vec<(super::keys::RuleKeys, LeaseCall)>) {
        let Ok(conn) = self.conn() else { return };
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
        for b in self.breakers.values() {
            if let Gate::OpenUntil(t) = b.gate(now) {
                next = next.min(t);
            }
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
        let mut s = self.client.status.lock().unwrap_or_else(|e| e.into_inner());
        s.connected = self.reached && self.all_closed();
        // The connection's failure first, else a rule's.
        let mut open: Vec<(&String, &Breaker)> = self.breakers.iter().filter(|(_, b)| b.last.is_some()).collect();
        open.sort_by(|a, b| a.0.cmp(b.0));
        s.last_error = open.first().and_then(|(_, b)| b.last.as_ref()).map(ToString::to_string);
        s.rules = self.drivers.len();
        drop(s);
        self.client.status_changed.notify_all();
    }

    fn shutdown(&mut self) {
        let calls: Vec<(super::keys::RuleKeys, LeaseCall)> = {
            let member = self.member.clone();
            let at = self.call_at(Instant::now(), self.engine.now_millis());
            let mut out = Vec::new();
            let sharded = self.link.is_sharded();
            for d in &mut self.drivers {
                if let Some(lease) = d.lease.upgrade() {
                    d.expire(&lease, u64::MAX);
                }
                // Only where Redis answers (a failing server would hold the stop up to the timeout).
                let group = if sharded { d.keys.window.as_str() } else { CONNECTION };
                if self.breakers.get(group).is_none_or(Breaker::is_closed) {
                    out.push(d.leave_call(&member, &at));
                }
            }
            out
        };
        if !calls.is_empty() {
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
        let mut s = self.client.status.lock().unwrap_or_else(|e| e.into_inner());
        s.connected = false;
        s.stopped = true;
        drop(s);
        self.client.status_changed.notify_all();
        tracing::info!(instance = %self.member, "cluster flow control: client stopped");
    }
}
