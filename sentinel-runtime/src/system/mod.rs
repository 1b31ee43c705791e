//! System adaptive protection: limits on the whole process's inbound traffic.
//!
//! System rules apply to **inbound** entries ([`EntryType::In`](crate::EntryType::In)) only, and read the
//! global inbound node (the sum of every inbound resource). Each field of a [`SystemRule`] is a limit; the
//! limit in force for a field is the minimum over every loaded rule that sets it. The checks run in Java
//! Sentinel's order, and the first one over its limit blocks with [`BlockError::System`] naming the
//! [`SystemLimit`]:
//!
//! 1. qps: `inbound pass_qps + acquire > qps`;
//! 2. thread: `inbound threads > max_thread`;
//! 3. rt: `inbound avg_rt > avg_rt`;
//! 4. load: `load1 > highest_system_load` **and** BBR judges the process saturated:
//!    `threads > 1 && threads > max_success_qps * min_rt / 1000`;
//! 5. cpu: `cpu_usage > highest_cpu_usage`.
//!
//! Load is the 1-minute load average and cpu usage the busier of the whole system and this process, read
//! from Linux's `/proc` once a second by a background thread. The thread runs only while a rule sets
//! `highest_system_load` or `highest_cpu_usage`, and stops when the rules no longer need it or the engine is
//! dropped. Where `/proc` is missing or unreadable (other platforms, sandboxes) the readings are unavailable
//! and the load and cpu checks are skipped. Tests feed readings with [`Sentinel::set_system_readings`](crate::Sentinel::set_system_readings).
//!
//! # Differences from Java Sentinel
//!
//! Java decides whether system checking is on from the **last** rule loaded alone: a valid rule followed by
//! a rule that sets nothing (or only an out-of-range cpu usage, which Java skips with a warning) turns
//! protection off. Here checking is on when **any** loaded rule sets a field, and an invalid value (a
//! negative or non-finite number, a cpu usage outside `[0, 1]`) rejects the whole rule set with a
//! [`RuleError`], leaving the rules in force unchanged.
//!
//! ```
//! use sentinel_runtime::{Sentinel, EntryType, BlockError, SystemLimit, clock::ManualClock};
//! use sentinel_runtime::system::SystemRule;
//!
//! let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_000_000)).build();
//! engine.load_system_rules(vec![SystemRule { qps: Some(2.0), ..Default::default() }]).unwrap();
//! let api = engine.resource_typed("api", EntryType::In);
//! assert!(api.enter().is_ok());
//! assert!(api.enter().is_ok());
//! let blocked = api.enter().unwrap_err();
//! assert!(matches!(blocked, BlockError::System { limit: SystemLimit::Qps { .. }, .. }));
//! ```

pub(crate) mod rule;
mod sampler;

pub use rule::SystemRule;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::error::{BlockError, RuleError, RuleKind, SystemLimit};
use crate::rcu::{RcuPtr, RetireBatch};
use crate::slot::contract::{CallCx, CheckCx, FastCall, RuleSlot, Verdict};
use crate::stat::StatNode;

use sampler::{Readings, Sampler};

/// The limits in force: each the minimum over the loaded rules that set it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Thresholds {
    pub(crate) load: Option<f64>,
    pub(crate) cpu: Option<f64>,
    pub(crate) qps: Option<f64>,
    pub(crate) avg_rt: Option<u64>,
    pub(crate) max_thread: Option<u64>,
}

impl Thresholds {
    fn from_rules(rules: &[SystemRule]) -> Self {
        fn min_f(a: Option<f64>, b: Option<f64>) -> Option<f64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        fn min_u(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        rules.iter().fold(Thresholds::default(), |t, r| Thresholds {
            load: min_f(t.load, r.highest_system_load),
            cpu: min_f(t.cpu, r.highest_cpu_usage),
            qps: min_f(t.qps, r.qps),
            avg_rt: min_u(t.avg_rt, r.avg_rt),
            max_thread: min_u(t.max_thread, r.max_thread),
        })
    }
    fn any(&self) -> bool {
        self.load.is_some()
            || self.cpu.is_some()
            || self.qps.is_some()
            || self.avg_rt.is_some()
            || self.max_thread.is_some()
    }
    fn needs_sampler(&self) -> bool {
        self.load.is_some() || self.cpu.is_some()
    }
}

/// The load and cpu readings the system checks use. `None`: unavailable (the check is skipped).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SystemReadings {
    /// The 1-minute load average.
    pub load: Option<f64>,
    /// Cpu usage in `[0, 1]`: the busier of the whole system and this process.
    pub cpu: Option<f64>,
}

/// Checks one system rule; the first invalid field is reported.
pub(crate) fn validate(rule: &SystemRule, index: usize) -> Result<(), RuleError> {
    let bad = |field, reason: &str| Err(RuleError::invalid(RuleKind::System, index, "", field, reason));
    let non_negative = |v: Option<f64>| v.is_none_or(|v| v.is_finite() && v >= 0.0);
    if !non_negative(rule.highest_system_load) {
        return bad("highest_system_load", "must be a finite number >= 0");
    }
    if !rule.highest_cpu_usage.is_none_or(|v| (0.0..=1.0).contains(&v)) {
        return bad("highest_cpu_usage", "must be in [0, 1] (a ratio, not a percentage)");
    }
    if !non_negative(rule.qps) {
        return bad("qps", "must be a finite number >= 0");
    }
    Ok(())
}

/// Holds the system rules and the load/cpu readings.
#[derive(Default)]
pub(crate) struct SystemManager {
    rules: ArcSwap<Vec<SystemRule>>,
    /// Read by every inbound call while a limit is on: in the engine's read section (a compiler fence), not an
    /// `ArcSwap` (about 50 instructions a load).
    thresholds: RcuPtr<Thresholds>,
    /// Whether any limit is set: the one load an inbound entry pays when no system rule exists.
    active: AtomicBool,
    readings: Arc<Readings>,
    /// Readings are fed by the user (tests): the sampler never runs.
    fed: AtomicBool,
    /// The sampler, while a rule needs load or cpu. Also serializes loads.
    sampler: Mutex<Option<Sampler>>,
}

impl SystemManager {
    /// Validates and replaces the rule set; `Ok(true)` when something changed.
    pub(crate) fn load(&self, rules: Vec<SystemRule>) -> Result<bool, RuleError> {
        for (i, r) in rules.iter().enumerate() {
            validate(r, i)?;
        }
        // Dropped last (after the lock): frees the old thresholds after a grace period.
        let mut retired = RetireBatch::new();
        let mut sampler = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        if **self.rules.load() == rules {
            return Ok(false);
        }
        let t = Thresholds::from_rules(&rules);
        retired.push(self.thresholds.replace(t));
        self.rules.store(Arc::new(rules));
        self.active.store(t.any(), Ordering::Relaxed);
        if t.needs_sampler() && !self.fed.load(Ordering::Relaxed) {
            if !sampler.as_ref().is_some_and(Sampler::is_running) {
                *sampler = Sampler::start(self.readings.clone());
            }
        } else {
            *sampler = None; // stops and joins the thread
        }
        Ok(true)
    }

    pub(crate) fn rules(&self) -> Vec<SystemRule> {
        self.rules.load().as_ref().clone()
    }

    /// Whether any system limit is on (the check is skipped otherwise): one relaxed atomic load.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Feeds readings; from now on the sampler never runs for this engine.
    pub(crate) fn set_readings(&self, r: SystemReadings) {
        let mut sampler = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        self.fed.store(true, Ordering::Relaxed);
        *sampler = None;
        self.readings.set(r.load, r.cpu);
    }

    pub(crate) fn readings(&self) -> SystemReadings {
        SystemReadings { load: self.readings.load(), cpu: self.readings.cpu() }
    }

    pub(crate) fn sampler_running(&self) -> bool {
        self.sampler.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(Sampler::is_running)
    }

    /// Checks an inbound call against the system limits, in Java's order; `node`: the inbound node.
    pub(crate) fn check(&self, cx: &CallCx<'_>, node: &StatNode) -> Result<(), BlockError> {
        let t = self.thresholds.read(|t| *t);
        let block_after = |limit, retry_after| {
            Err(BlockError::System { resource: cx.resource.share(), limit, origin: cx.origin.share(), retry_after })
        };
        let block = |limit| block_after(limit, None);
        let now = cx.now_ms;
        if let Some(limit) = t.qps
            && node.pass_qps(now) + cx.acquire as f64 > limit
        {
            return block_after(SystemLimit::Qps { limit }, node.qps_retry_after(now, cx.acquire, limit));
        }
        let threads = node.cur_threads();
        if let Some(limit) = t.max_thread
            && threads > limit
        {
            return block(SystemLimit::Thread { limit });
        }
        if let Some(limit) = t.avg_rt
            && node.avg_rt_ms(now) > limit as f64
        {
            return block(SystemLimit::AvgRt { limit });
        }
        if let (Some(limit), Some(load)) = (t.load, self.readings.load())
            && load > limit
        {
            let saturated = threads > 1 && threads as f64 > node.max_success_qps(now) * node.min_rt_ms(now) / 1000.0;
            if saturated {
                return block(SystemLimit::Load { limit, load });
            }
        }
        if let (Some(limit), Some(usage)) = (t.cpu, self.readings.cpu())
            && usage > limit
        {
            return block(SystemLimit::Cpu { limit, usage });
        }
        Ok(())
    }
}

/// The system slot (order -5000): inbound calls against the system limits, while a system rule is loaded. On the
/// fast path too: it holds nothing and reads only the call and the inbound node.
pub(crate) struct SystemSlot;

impl RuleSlot for SystemSlot {
    /// The system rules are the engine's, not a resource's.
    type Rules = SystemManager;
    /// The inbound node, which the limits read.
    type State = StatNode;
    type Held = ();
    type Taken = ();
    type FastTaken = ();
    const ORDER: i32 = crate::slot::ORDER_SYSTEM;
    const ON_FAST_PATH: bool = true;

    #[inline(always)]
    fn check(
        rules: &SystemManager,
        inbound: &StatNode,
        cx: &CheckCx<'_>,
        _: &mut (),
        _: &mut (),
    ) -> Result<Verdict, BlockError> {
        rules.check(cx, inbound).map(|()| Verdict::PASS)
    }

    #[inline(always)]
    fn check_fast<'c>(
        rules: &SystemManager,
        inbound: &StatNode,
        call: &impl FastCall<'c>,
        _: &mut u64,
        _: &mut (),
        _: Option<&mut ()>,
    ) -> Result<(), BlockError> {
        rules.check(&call.call(), inbound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sentinel;

    #[test]
    fn thresholds_take_the_minimum_of_each_field() {
        let rules = vec![
            SystemRule { qps: Some(100.0), max_thread: Some(10), ..Default::default() },
            SystemRule { qps: Some(50.0), avg_rt: Some(20), ..Default::default() },
            SystemRule { qps: Some(80.0), highest_cpu_usage: Some(0.7), ..Default::default() },
        ];
        let t = Thresholds::from_rules(&rules);
        assert_eq!(t.qps, Some(50.0));
        assert_eq!(t.max_thread, Some(10));
        assert_eq!(t.avg_rt, Some(20));
        assert_eq!(t.cpu, Some(0.7));
        assert_eq!(t.load, None);
        assert!(t.any() && t.needs_sampler());
    }

    #[test]
    fn engine_drop_stops_the_sampler_and_frees_the_engine() {
        let engine = Sentinel::builder().build();
        engine.load_system_rules(vec![SystemRule { highest_system_load: Some(100.0), ..Default::default() }]).unwrap();
        assert_eq!(engine.system_sampler_running(), sampler::supported());
        let weak = Arc::downgrade(&engine.shared);
        let readings = engine.shared.system.readings.clone();
        drop(engine);
        assert!(weak.upgrade().is_none(), "the sampler must not keep the engine alive");
        assert_eq!(Arc::strong_count(&readings), 1, "the sampler thread ended");
    }
}
