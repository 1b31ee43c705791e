//! Per-second history of every resource, kept in memory for the dashboard's `metric` command and the
//! console's charts.
//!
//! The engine keeps each resource's last minute per second; this keeps [`DEFAULT_HISTORY_SECONDS`] (5
//! minutes, configurable) in a fixed ring per resource, sampled from the engine's complete seconds (the
//! second in progress is never recorded, so a line once answered never changes). It is sampled once a
//! second in the background and before every answer, so an answer is complete up to the last whole second
//! that has settled: on a manual clock, the last whole second; on any other clock, the last one that ended
//! a quarter of a second ago or more (so that a call whose thread stored its counts a little late is in its line).
//!
//! The adaptive limiters' limit and calls in flight are sampled with them (`adaptive_history`).
//!
//! Memory: one ring of 32-byte slots per resource that had traffic, so `32 × seconds` bytes (9,600 bytes for
//! 5 minutes) plus the name, allocated when the resource first shows traffic; at most as many resources as
//! the engine tracks ([`Config::max_resources`](crate::Config::max_resources)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::adaptive_history::{AdaptiveHistory, MAX_ADAPTIVE_SERIES};
use crate::{SecondTotals, Sentinel};

/// Seconds of history kept per resource by default (5 minutes).
pub const DEFAULT_HISTORY_SECONDS: usize = 300;
/// The fewest seconds of history a command center keeps (the dashboard looks 15 s back, then fetches
/// 6-second windows).
pub const MIN_HISTORY_SECONDS: usize = 30;

/// The name Java gives the global inbound node in metric lines.
pub(crate) const TOTAL_INBOUND: &str = "__total_inbound_traffic__";

/// One metric line: a resource's totals over one second, and its concurrency when it was sampled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LineRecord {
    pub(crate) resource: Arc<str>,
    pub(crate) totals: SecondTotals,
    pub(crate) concurrency: u64,
}

impl LineRecord {
    /// Appends Java's `MetricNode.toThinString` and a newline: `timestamp|resource|passQps|blockQps|
    /// successQps|exceptionQps|rt|occupiedPassQps|concurrency|classification`, the name as
    /// [`metric_line_name`](crate::stat::metric_line_name) writes it (`|`, `\n`, `\r` as `_`).
    pub(crate) fn write_thin(&self, out: &mut String) {
        use std::fmt::Write;
        let t = &self.totals;
        let _ = writeln!(
            out,
            "{}|{}|{}|{}|{}|{}|{}|{}|{}|0",
            t.start_ms,
            crate::stat::metric_line_name(&self.resource),
            t.pass,
            t.block,
            t.success,
            t.exception,
            t.rt_ms,
            t.occupied_pass,
            self.concurrency
        );
    }
}

/// One second of one resource: 32 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    /// Second since the epoch (0: empty).
    second: u32,
    pass: u32,
    block: u32,
    success: u32,
    exception: u32,
    rt_ms: u32,
    occupied_pass: u32,
    concurrency: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 32);

fn sat(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl Slot {
    fn of(t: &SecondTotals, concurrency: u64) -> Slot {
        Slot {
            second: sat(t.start_ms / 1000),
            pass: sat(t.pass),
            block: sat(t.block),
            success: sat(t.success),
            exception: sat(t.exception),
            rt_ms: sat(t.rt_ms),
            occupied_pass: sat(t.occupied_pass),
            concurrency: sat(concurrency),
        }
    }

    fn record(&self, resource: &Arc<str>) -> LineRecord {
        LineRecord {
            resource: resource.clone(),
            totals: SecondTotals {
                start_ms: u64::from(self.second) * 1000,
                pass: self.pass.into(),
                block: self.block.into(),
                success: self.success.into(),
                exception: self.exception.into(),
                rt_ms: self.rt_ms.into(),
                occupied_pass: self.occupied_pass.into(),
            },
            concurrency: self.concurrency.into(),
        }
    }
}

struct Ring {
    slots: Box<[Slot]>,
    /// The last second recorded (its start, ms).
    last_ms: u64,
}

struct State {
    rings: HashMap<Arc<str>, Ring>,
    /// The first second this history can answer for (its start, ms): seconds before it were never sampled.
    since_ms: Option<u64>,
    /// The end of the last complete second sampled (ms).
    sampled_to_ms: u64,
}

/// Bounded per-second history of an engine's resources.
pub(crate) struct History {
    seconds: usize,
    max_resources: usize,
    state: Mutex<State>,
    /// The adaptive limiters' limit and calls in flight, sampled with the rest.
    pub(crate) adaptive: AdaptiveHistory,
}

/// Dense series of one resource, one value per second, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Series {
    pub(crate) pass: Vec<u64>,
    pub(crate) block: Vec<u64>,
    pub(crate) success: Vec<u64>,
    pub(crate) exception: Vec<u64>,
    pub(crate) rt_ms: Vec<u64>,
}

impl History {
    pub(crate) fn new(seconds: usize, max_resources: usize) -> Self {
        History {
            seconds: seconds.max(MIN_HISTORY_SECONDS),
            max_resources,
            state: Mutex::new(State { rings: HashMap::new(), since_ms: None, sampled_to_ms: 0 }),
            adaptive: AdaptiveHistory::new(seconds.max(MIN_HISTORY_SECONDS), MAX_ADAPTIVE_SERIES),
        }
    }

    /// Seconds kept per resource.
    pub(crate) fn seconds(&self) -> usize {
        self.seconds
    }

    /// Records the engine's complete seconds not recorded yet, and the adaptive limiters' state now. Returns
    /// the end of the last complete second.
    pub(crate) fn sample(&self, engine: &Sentinel) -> u64 {
        let now = engine.now_millis();
        self.adaptive.record(now, &engine.adaptive_status());
        // Whole seconds that have settled (on a real clock, ended a quarter of a second ago or more).
        let settled = engine.settled_millis();
        let boundary = settled - settled % 1000;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.since_ms.is_none() {
            // The engine remembers the last minute: that is where this history starts.
            state.since_ms = Some(boundary.saturating_sub(crate::stat::MINUTE_INTERVAL_MS));
        }
        let add = |state: &mut State, name: &str, concurrency: u64, seconds: Vec<SecondTotals>| {
            if !seconds.iter().any(|t| t.start_ms < boundary) {
                return;
            }
            if !state.rings.contains_key(name) {
                if state.rings.len() >= self.max_resources {
                    return;
                }
                let slots = vec![Slot::default(); self.seconds].into_boxed_slice();
                state.rings.insert(Arc::from(name), Ring { slots, last_ms: 0 });
            }
            let Some(ring) = state.rings.get_mut(name) else { return };
            for t in seconds {
                if t.start_ms >= boundary || (t.start_ms <= ring.last_ms && ring.last_ms != 0) {
                    continue;
                }
                let i = (t.start_ms / 1000) as usize % ring.slots.len();
                ring.slots[i] = Slot::of(&t, concurrency);
                ring.last_ms = t.start_ms;
            }
        };
        for name in engine.resource_names() {
            let concurrency = engine.cluster_stats(&name).map(|s| s.threads).unwrap_or(0);
            add(&mut state, &name, concurrency, engine.resource_complete_seconds(&name));
        }
        add(&mut state, TOTAL_INBOUND, engine.inbound_stats().threads, engine.inbound_complete_seconds());
        state.sampled_to_ms = state.sampled_to_ms.max(boundary);
        boundary
    }

    /// The first second (ms) the history answers for: older seconds are either before it started or no
    /// longer kept.
    pub(crate) fn covered_from_ms(&self) -> u64 {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let kept_from = state.sampled_to_ms.saturating_sub(self.seconds as u64 * 1000);
        state.since_ms.unwrap_or(u64::MAX).max(kept_from)
    }

    /// Lines with `from_ms <= second <= to_ms` (of `resource`, or of all), ordered by second, then name. A
    /// resource is matched by its name as metric lines show it ([`crate::stat::metric_line_name`]).
    pub(crate) fn lines(&self, from_ms: u64, to_ms: u64, resource: Option<&str>) -> Vec<LineRecord> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let kept_from = state.sampled_to_ms.saturating_sub(self.seconds as u64 * 1000);
        let from = from_ms.max(kept_from);
        let to = to_ms.min(state.sampled_to_ms.saturating_sub(1));
        let mut out = Vec::new();
        if from > to {
            return out;
        }
        for (name, ring) in &state.rings {
            // Matched as the lines show names, so that a name the dashboard read back finds its lines.
            if resource.is_some_and(|r| crate::stat::metric_line_name(r) != crate::stat::metric_line_name(name)) {
                continue;
            }
            let mut s = from / 1000;
            while s * 1000 <= to {
                let slot = &ring.slots[s as usize % ring.slots.len()];
                if u64::from(slot.second) == s {
                    out.push(slot.record(name));
                }
                s += 1;
            }
        }
        out.sort_by(|a, b| a.totals.start_ms.cmp(&b.totals.start_ms).then_with(|| a.resource.cmp(&b.resource)));
        out
    }

    /// Per-resource dense series over the seconds `(after_ms, to_ms]` (at most the ring's length), and the
    /// start of their first second.
    pub(crate) fn series(&self, after_ms: Option<u64>, to_ms: u64) -> (u64, usize, Vec<(Arc<str>, Series)>) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let end = to_ms.min(state.sampled_to_ms); // exclusive: the end of the last complete second
        let earliest = end.saturating_sub(self.seconds as u64 * 1000);
        let start = match after_ms {
            Some(a) => (a - a % 1000).saturating_add(1000).max(earliest),
            None => earliest,
        };
        let n = (end.saturating_sub(start) / 1000) as usize;
        let mut out = Vec::new();
        for (name, ring) in &state.rings {
            let mut s = Series {
                pass: vec![0; n],
                block: vec![0; n],
                success: vec![0; n],
                exception: vec![0; n],
                rt_ms: vec![0; n],
            };
            for k in 0..n {
                let sec = start / 1000 + k as u64;
                let slot = &ring.slots[sec as usize % ring.slots.len()];
                if u64::from(slot.second) == sec {
                    s.pass[k] = slot.pass.into();
                    s.block[k] = slot.block.into();
                    s.success[k] = slot.success.into();
                    s.exception[k] = slot.exception.into();
                    s.rt_ms[k] = slot.rt_ms.into();
                }
            }
            out.push((name.clone(), s));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        (start, n, out)
    }

    /// The last complete second recorded for `resource`, if it is the one just before `boundary_ms`.
    pub(crate) fn last_second(&self, resource: &str, boundary_ms: u64) -> Option<LineRecord> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (name, ring) = state.rings.get_key_value(resource)?;
        let want = boundary_ms.checked_sub(1000)? / 1000;
        let slot = &ring.slots[want as usize % ring.slots.len()];
        (u64::from(slot.second) == want).then(|| slot.record(name))
    }

    /// Resources with history.
    #[cfg(test)]
    pub(crate) fn resources(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).rings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const T0: u64 = 1_700_000_000_000;

    #[test]
    fn keeps_complete_seconds_beyond_the_engine_minute_and_forgets_past_its_length() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        let history = History::new(120, 100);
        let api = engine.resource("api");
        for s in 0..200u64 {
            for _ in 0..(s % 7 + 1) {
                drop(api.enter().unwrap());
            }
            clock.advance_millis(1000);
            if s % 30 == 0 {
                history.sample(&engine);
            }
        }
        history.sample(&engine);
        let lines = history.lines(0, u64::MAX, Some("api"));
        assert_eq!(lines.len(), 120, "the ring's length");
        assert_eq!(lines.last().unwrap().totals.start_ms, T0 + 199_000);
        assert_eq!(lines.first().unwrap().totals.start_ms, T0 + 80_000);
        for l in &lines {
            let s = (l.totals.start_ms - T0) / 1000;
            assert_eq!(l.totals.pass, s % 7 + 1, "second {s}");
        }
        assert_eq!(history.covered_from_ms(), T0 + 80_000);
    }

    #[test]
    fn the_second_in_progress_is_never_recorded() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        let history = History::new(60, 100);
        drop(engine.enter("api").unwrap());
        history.sample(&engine);
        assert!(history.lines(0, u64::MAX, None).is_empty());
        clock.advance_millis(1000);
        drop(engine.enter("api").unwrap());
        history.sample(&engine);
        let lines = history.lines(0, u64::MAX, None);
        assert_eq!(lines.len(), 1);
        assert_eq!((lines[0].totals.start_ms, lines[0].totals.pass), (T0, 1));
        let (start, n, series) = history.series(None, u64::MAX);
        assert_eq!(start + n as u64 * 1000, T0 + 1000, "the series ends with the last complete second");
        assert_eq!(series[0].1.pass.last(), Some(&1));
    }

    /// A clock the test sets, which the engine treats as a real one (not a manual clock).
    struct SetClock(std::sync::atomic::AtomicU64);
    impl crate::clock::Clock for SetClock {
        fn now_nanos(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::SeqCst) * 1_000_000
        }
    }

    #[test]
    fn on_a_real_clock_a_second_is_recorded_once_it_has_settled_with_the_calls_stored_late() {
        use std::sync::atomic::Ordering::SeqCst;
        let clock = Arc::new(SetClock(std::sync::atomic::AtomicU64::new(T0 + 999)));
        let engine = Sentinel::builder().clock(clock.clone()).build();
        let history = History::new(60, 100);
        drop(engine.enter("api").unwrap());
        // Just after the second: a call that read the clock in it may not have stored its counts yet.
        clock.0.store(T0 + 1_000 + crate::engine::shared::SETTLE_MS - 1, SeqCst);
        assert_eq!(history.sample(&engine), T0, "the second has not settled");
        assert!(history.lines(0, u64::MAX, None).is_empty());
        // A call of that second whose thread stored its counts late (its clock reading was in the second).
        clock.0.store(T0 + 999, SeqCst);
        drop(engine.enter("api").unwrap());
        clock.0.store(T0 + 1_000 + crate::engine::shared::SETTLE_MS, SeqCst);
        assert_eq!(history.sample(&engine), T0 + 1_000);
        let lines = history.lines(0, u64::MAX, None);
        let api: Vec<_> = lines.iter().filter(|l| &*l.resource == "api").collect();
        assert_eq!(api.len(), 1);
        assert_eq!((api[0].totals.start_ms, api[0].totals.pass), (T0, 2), "both calls in the second's line");
    }

    #[test]
    fn the_number_of_resources_is_bounded() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        let history = History::new(60, 3);
        for i in 0..10 {
            drop(engine.enter(&format!("r{i}")).unwrap());
        }
        clock.advance_millis(1000);
        history.sample(&engine);
        assert_eq!(history.resources(), 3);
    }
}
