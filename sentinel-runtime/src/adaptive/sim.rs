//! Test support: a simulated downstream on simulated time, driving a limiter without an engine.
//!
//! The downstream has `workers` concurrent workers and a FIFO queue in front of them, so latency grows with
//! load; optionally it answers 503 at once when `reject_at` calls are already inside it (a hidden capacity).
//! Callers arrive per origin at a given rate (intervals jittered ±50 %); each is admitted by a [`Gate`] (a
//! limiter alone, or the engine's entry path on a manual clock) or blocked. All randomness is seeded: a run
//! is the same on every machine.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::limiter::Limiter;
use super::permit::{PartitionId, Permit};

pub(crate) const MS: u64 = 1_000_000;
pub(crate) const SEC: u64 = 1_000 * MS;

/// Service time (nanoseconds) of one call that starts at `now`, given a uniform random number in [0, 1).
pub(crate) type ServiceTime = Box<dyn Fn(u64, f64) -> u64>;

/// What admits the simulated calls.
pub(crate) trait Gate {
    /// At `t`, a call from `origin` asks to be admitted.
    fn admit(&self, t: u64, origin: &Origin) -> Option<Ticket>;
    /// At `t`, the admitted call completes after `rtt`; `dropped` when the downstream refused it (503).
    fn complete(&self, ticket: Ticket, t: u64, rtt: u64, dropped: bool);
    /// The limit in force.
    fn limit(&self) -> u32;
}

/// What an admitted call holds: a limiter's permit, or what another gate keeps (the engine's entry).
pub(crate) enum Ticket {
    Permit(Permit),
    Other(Box<dyn std::any::Any>),
}

impl Gate for Limiter {
    fn admit(&self, _: u64, origin: &Origin) -> Option<Ticket> {
        self.try_acquire(origin.partition).map(Ticket::Permit)
    }
    fn complete(&self, ticket: Ticket, t: u64, rtt: u64, dropped: bool) {
        if let Ticket::Permit(p) = ticket {
            self.release(p, t, rtt, dropped);
        }
    }
    fn limit(&self) -> u32 {
        Limiter::limit(self)
    }
}

/// One caller population.
pub(crate) struct Origin {
    /// The origin's name (engine runs).
    pub(crate) name: &'static str,
    /// Its partition (limiter runs).
    pub(crate) partition: Option<PartitionId>,
    /// Calls per second offered from `start` to `stop` (nanoseconds of simulated time), rising linearly
    /// from `rate` to `rate_end`.
    pub(crate) rate: f64,
    pub(crate) rate_end: f64,
    pub(crate) start: u64,
    pub(crate) stop: u64,
}

impl Origin {
    pub(crate) fn steady(rate: f64, stop: u64) -> Self {
        Origin { name: "", partition: None, rate, rate_end: rate, start: 0, stop }
    }
    fn rate_at(&self, t: u64) -> f64 {
        let f = (t.saturating_sub(self.start)) as f64 / (self.stop - self.start).max(1) as f64;
        self.rate + (self.rate_end - self.rate) * f.min(1.0)
    }
}

/// What one simulated second saw.
#[derive(Clone, Debug, Default)]
pub(crate) struct Second {
    /// The limit at the end of the second (0 without a limiter).
    pub(crate) limit: u32,
    /// The most calls in flight at once.
    pub(crate) max_inflight: u32,
    /// Time-weighted average of calls in flight, per origin.
    pub(crate) inflight_by_origin: Vec<f64>,
    pub(crate) admitted: u64,
    pub(crate) blocked: u64,
    pub(crate) completed: u64,
    pub(crate) rejected_503: u64,
    /// The 99th percentile of the response times of the calls completed in the second, in ms.
    pub(crate) p99_ms: f64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    /// Job `n` leaves the downstream.
    Finish(usize),
}

struct Job {
    origin: usize,
    ticket: Option<Ticket>,
    admitted_at: u64,
    rejected: bool,
}

pub(crate) struct Sim<'l> {
    pub(crate) limiter: Option<&'l dyn Gate>,
    pub(crate) workers: usize,
    pub(crate) reject_at: Option<usize>,
    pub(crate) service: ServiceTime,
    pub(crate) origins: Vec<Origin>,
    pub(crate) seed: u64,
}

struct Run<'s, 'l> {
    sim: &'s Sim<'l>,
    rng: fastrand::Rng,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    jobs: Vec<Job>,
    queue: VecDeque<usize>,
    busy: usize,
    inside: usize,
    inflight_by_origin: Vec<u32>,
    integral: Vec<f64>,
    last_t: u64,
    cur: Second,
    rtts: Vec<u64>,
    seconds: Vec<Second>,
}

impl Sim<'_> {
    /// Runs from 0 to `end` nanoseconds of simulated time; returns one record per whole second.
    pub(crate) fn run(&self, end: u64) -> Vec<Second> {
        let n = self.origins.len();
        let mut run = Run {
            sim: self,
            rng: fastrand::Rng::with_seed(self.seed),
            events: BinaryHeap::new(),
            seq: 0,
            jobs: Vec::new(),
            queue: VecDeque::new(),
            busy: 0,
            inside: 0,
            inflight_by_origin: vec![0; n],
            integral: vec![0.0; n],
            last_t: 0,
            cur: Second::default(),
            rtts: Vec::new(),
            seconds: Vec::new(),
        };
        for (i, o) in self.origins.iter().enumerate() {
            run.schedule(o.start, Event::Arrival(i));
        }
        while let Some(Reverse((t, _, event))) = run.events.pop() {
            if t >= end {
                break;
            }
            run.advance_to(t);
            match event {
                Event::Arrival(o) => run.arrive(t, o),
                Event::Finish(job) => run.finish(t, job),
            }
        }
        run.advance_to(end);
        run.seconds
    }
}

impl Run<'_, '_> {
    fn schedule(&mut self, at: u64, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, e)));
    }

    /// Moves the time to `t`, closing the seconds passed.
    fn advance_to(&mut self, t: u64) {
        loop {
            let sec_end = (self.seconds.len() as u64 + 1) * SEC;
            let upto = t.min(sec_end);
            for (k, n) in self.inflight_by_origin.iter().enumerate() {
                self.integral[k] += f64::from(*n) * (upto - self.last_t) as f64;
            }
            self.last_t = upto;
            if t < sec_end {
                return;
            }
            let mut s = std::mem::take(&mut self.cur);
            s.inflight_by_origin = self.integral.iter().map(|x| x / SEC as f64).collect();
            self.integral.iter_mut().for_each(|x| *x = 0.0);
            s.limit = self.sim.limiter.map_or(0, |l| l.limit());
            self.rtts.sort_unstable();
            if let Some(&p) = self.rtts.get(self.rtts.len().saturating_mul(99) / 100) {
                s.p99_ms = p as f64 / MS as f64;
            }
            self.rtts.clear();
            self.seconds.push(s);
        }
    }

    fn arrive(&mut self, t: u64, o: usize) {
        let origin = &self.sim.origins[o];
        let interval = (SEC as f64 / origin.rate_at(t) * (0.5 + self.rng.f64())) as u64;
        if t + interval < origin.stop {
            self.schedule(t + interval, Event::Arrival(o));
        }
        let ticket = match self.sim.limiter {
            Some(l) => match l.admit(t, origin) {
                Some(p) => Some(p),
                None => {
                    self.cur.blocked += 1;
                    return;
                }
            },
            None => None,
        };
        self.cur.admitted += 1;
        self.inflight_by_origin[o] += 1;
        let total: u32 = self.inflight_by_origin.iter().sum();
        self.cur.max_inflight = self.cur.max_inflight.max(total);
        let rejected = self.sim.reject_at.is_some_and(|k| self.inside >= k);
        self.jobs.push(Job { origin: o, ticket, admitted_at: t, rejected });
        let job = self.jobs.len() - 1;
        if rejected {
            self.schedule(t + MS, Event::Finish(job));
            return;
        }
        self.inside += 1;
        if self.busy < self.sim.workers {
            self.start(t, job);
        } else {
            self.queue.push_back(job);
        }
    }

    fn start(&mut self, t: u64, job: usize) {
        self.busy += 1;
        let d = (self.sim.service)(t, self.rng.f64());
        self.schedule(t + d.max(1), Event::Finish(job));
    }

    fn finish(&mut self, t: u64, job: usize) {
        let j = &mut self.jobs[job];
        let (origin, rejected, rtt) = (j.origin, j.rejected, t - j.admitted_at);
        let ticket = j.ticket.take();
        if !rejected {
            self.inside -= 1;
            self.busy -= 1;
            if let Some(next) = self.queue.pop_front() {
                self.start(t, next);
            }
        }
        if let (Some(l), Some(p)) = (self.sim.limiter, ticket) {
            l.complete(p, t, rtt, rejected);
        }
        self.inflight_by_origin[origin] -= 1;
        self.cur.completed += 1;
        self.cur.rejected_503 += u64::from(rejected);
        self.rtts.push(rtt);
    }
}

/// A service time of `base` ±20 % (uniform).
pub(crate) fn around(base: u64, u: f64) -> u64 {
    (base as f64 * (0.8 + 0.4 * u)) as u64
}

// ---------------------------------------------------------------- scenarios shared by the limiter's and the engine's tests

/// The seed's incident: 8 workers, 50 ms calls, offered at 1.2× capacity (192/s); from 60 s to 120 s the
/// service time is 3 s, then 50 ms again.
pub(crate) fn incident_sim(gate: Option<&dyn Gate>) -> Sim<'_> {
    Sim {
        limiter: gate,
        workers: 8,
        reject_at: None,
        service: Box::new(
            |t, u| if (60 * SEC..120 * SEC).contains(&t) { around(3_000 * MS, u) } else { around(50 * MS, u) },
        ),
        origins: vec![Origin::steady(192.0, 200 * SEC)],
        seed: 1,
    }
}

/// Checks the fall during the incident; returns the limit before it.
pub(crate) fn check_fall(name: &str, s: &[Second]) -> u32 {
    let before = s[59].limit;
    let trace: Vec<_> = s.iter().map(|x| (x.limit, x.max_inflight)).collect();
    assert!(before >= 8, "{name}: the limit before the jump ({before}) holds the 8 workers: {trace:?}");
    assert!(f64::from(s[79].limit) <= 0.75 * f64::from(before), "{name}: a quarter down within 20 s: {trace:?}");
    assert!(f64::from(s[99].limit) <= 0.5 * f64::from(before), "{name}: half down within 40 s: {trace:?}");
    let most = s[60..120].iter().map(|x| x.max_inflight).max().unwrap_or(0);
    assert!(most <= before + 1, "{name}: in flight stays bounded by the limit before the jump: {most} > {before}");
    before
}

/// Checks the fall, and the climb back to `recovered` of the limit before within 30 s of the recovery.
pub(crate) fn check_incident(name: &str, s: &[Second], recovered: f64) {
    let before = check_fall(name, s);
    let trace: Vec<_> = s.iter().map(|x| x.limit).collect();
    assert!(
        s[120..150].iter().any(|x| f64::from(x.limit) >= recovered * f64::from(before)),
        "{name}: back to {recovered} of {before} within 30 s of recovery: {trace:?}"
    );
}

/// Two caller populations at 400 calls/s each against 8 workers of 50 ms, the second stopping at 60 s.
pub(crate) fn two_origins(gate: &dyn Gate, first: Origin, second: Origin) -> Vec<Second> {
    let sim = Sim {
        limiter: Some(gate),
        workers: 8,
        reject_at: None,
        service: Box::new(|_, u| around(50 * MS, u)),
        origins: vec![
            Origin { rate: 400.0, rate_end: 400.0, stop: 120 * SEC, ..first },
            Origin { rate: 400.0, rate_end: 400.0, stop: 60 * SEC, ..second },
        ],
        seed: 3,
    };
    sim.run(120 * SEC)
}

/// Checks shares of 0.7 and 0.3 of a limit of 20 while both origins call, and the whole limit for the
/// first alone.
pub(crate) fn check_shares(s: &[Second]) {
    let avg = |range: std::ops::Range<usize>, o: usize| {
        range.clone().map(|i| s[i].inflight_by_origin[o]).sum::<f64>() / range.len() as f64
    };
    let (m, w) = (avg(10..59, 0), avg(10..59, 1));
    assert!((m / 20.0 - 0.7).abs() <= 0.07, "mobile holds {m:.2} of 20");
    assert!((w / 20.0 - 0.3).abs() <= 0.03, "web holds {w:.2} of 20");
    let alone = avg(70..119, 0);
    assert!(alone >= 19.0, "mobile alone uses the whole limit: {alone:.2}");
}

/// A downstream that answers 503 at once when 12 calls are inside it, 400 calls/s offered for 180 s.
pub(crate) fn hidden_capacity(gate: &dyn Gate) -> Vec<Second> {
    let sim = Sim {
        limiter: Some(gate),
        workers: 8,
        reject_at: Some(12),
        service: Box::new(|_, u| around(50 * MS, u)),
        origins: vec![Origin::steady(400.0, 180 * SEC)],
        seed: 5,
    };
    sim.run(180 * SEC)
}

/// Checks that from 60 s on the limit hovers at the hidden capacity of 12 and 503s stay rare.
pub(crate) fn check_hovers(s: &[Second]) {
    let late = &s[60..];
    let avg_limit = late.iter().map(|x| f64::from(x.limit)).sum::<f64>() / late.len() as f64;
    assert!(avg_limit <= 13.0, "the limit hovers at the capacity of 12: {avg_limit:.1}");
    let (admitted, rejected): (u64, u64) = late.iter().fold((0, 0), |a, x| (a.0 + x.completed, a.1 + x.rejected_503));
    assert!((rejected as f64) < 0.05 * admitted as f64, "{rejected} of {admitted} got 503");
    assert!(late.iter().all(|x| x.rejected_503 * 2 < x.completed.max(1)), "no second where most calls fail");
}
