//! Per-second history of every adaptive limiter (issue 31's console chart): the limit and the calls in flight
//! of each adaptive resource, and of each of its partitions (the partition's guarantee as its limit), over
//! the last [`DEFAULT_HISTORY_SECONDS`](super::DEFAULT_HISTORY_SECONDS) (5 minutes by default).
//!
//! It is written by the command center's sampler (once a second in the background, and before every answer
//! of the console), which reads [`Sentinel::adaptive_status`](crate::Sentinel::adaptive_status): nothing is added to a call, and no lock a call
//! takes is touched (the status is read under each limiter's control lock, which calls never wait for). A
//! second holds the limit last seen in it and the highest in-flight count seen in it, so a second sampled
//! several times keeps its peak.
//!
//! Memory: 12 bytes a second per series (3,600 bytes for 5 minutes), at most [`MAX_ADAPTIVE_SERIES`] series;
//! a series goes when its resource no longer has an adaptive limiter (its rule was removed or changed).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::adaptive::AdaptiveStatus;

/// The most series (one per adaptive resource, one per partition) kept at once: 1,024, so at most 3.7 MB
/// with 5 minutes of history. A series past it is not recorded (its figures are still served).
pub(crate) const MAX_ADAPTIVE_SERIES: usize = 1024;

/// One second of one series: 12 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Point {
    /// The second since the epoch, plus one (0: empty).
    tag: u32,
    limit: u32,
    inflight: u32,
}

const _: () = assert!(std::mem::size_of::<Point>() == 12);

/// A series: a resource's totals (`partition` `None`) or one of its partitions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SeriesKey {
    pub(crate) resource: Arc<str>,
    pub(crate) partition: Option<Arc<str>>,
}

/// One series over a span of seconds, oldest first: `None` where nothing was sampled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AdaptiveSeries {
    pub(crate) limit: Vec<Option<u32>>,
    pub(crate) inflight: Vec<Option<u32>>,
}

/// Bounded per-second history of an engine's adaptive limiters.
pub(crate) struct AdaptiveHistory {
    seconds: usize,
    max_series: usize,
    rings: Mutex<HashMap<SeriesKey, Box<[Point]>>>,
}

fn tag_of(second: u64) -> u32 {
    u32::try_from(second).unwrap_or(u32::MAX - 1).saturating_add(1)
}

impl AdaptiveHistory {
    pub(crate) fn new(seconds: usize, max_series: usize) -> Self {
        AdaptiveHistory { seconds: seconds.max(1), max_series, rings: Mutex::new(HashMap::new()) }
    }

    /// Records `status` (read at `now_ms`) into the second it was read in, and forgets the series of
    /// resources that no longer have a limiter.
    pub(crate) fn record(&self, now_ms: u64, status: &[AdaptiveStatus]) {
        let second = now_ms / 1000;
        let tag = tag_of(second);
        let i = (second % self.seconds as u64) as usize;
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let governed: HashSet<&str> = status.iter().map(|s| s.resource.as_str()).collect();
        rings.retain(|k, _| governed.contains(&*k.resource));
        let mut put = |key: SeriesKey, limit: u32, inflight: u32| {
            if !rings.contains_key(&key) {
                if rings.len() >= self.max_series {
                    return;
                }
                rings.insert(key.clone(), vec![Point::default(); self.seconds].into_boxed_slice());
            }
            let Some(ring) = rings.get_mut(&key) else { return };
            let p = &mut ring[i];
            let peak = if p.tag == tag { p.inflight.max(inflight) } else { inflight };
            *p = Point { tag, limit, inflight: peak };
        };
        for s in status {
            let resource: Arc<str> = Arc::from(s.resource.as_str());
            put(SeriesKey { resource: resource.clone(), partition: None }, s.limit, s.inflight);
            for p in &s.partitions {
                let key = SeriesKey { resource: resource.clone(), partition: Some(Arc::from(p.origin.as_str())) };
                put(key, p.guarantee, p.inflight);
            }
        }
    }

    /// Seconds kept per series.
    pub(crate) fn seconds(&self) -> usize {
        self.seconds
    }

    /// Every series over the seconds after the one of `after_ms` (all the history's span without it) up to
    /// the second of `now_ms` (included: its points are what was seen so far in it), and the start (ms) of
    /// the first of them.
    pub(crate) fn series(
        &self,
        now_ms: u64,
        after_ms: Option<u64>,
    ) -> (u64, usize, HashMap<SeriesKey, AdaptiveSeries>) {
        let last = now_ms / 1000;
        let kept = (last + 1).saturating_sub(self.seconds as u64);
        let first = after_ms.map_or(kept, |a| (a / 1000 + 1).max(kept)).min(last + 1);
        let n = (last + 1 - first) as usize;
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let out = rings
            .iter()
            .map(|(key, ring)| {
                let mut s = AdaptiveSeries { limit: vec![None; n], inflight: vec![None; n] };
                for k in 0..n {
                    let second = first + k as u64;
                    let p = ring[(second % self.seconds as u64) as usize];
                    if p.tag == tag_of(second) {
                        s.limit[k] = Some(p.limit);
                        s.inflight[k] = Some(p.inflight);
                    }
                }
                (key.clone(), s)
            })
            .collect();
        (first * 1000, n, out)
    }

    /// Series kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.rings.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::AdaptiveRule;
    use crate::clock::ManualClock;
    use crate::Sentinel;

    const T0: u64 = 1_700_000_000_000;

    fn sample(h: &AdaptiveHistory, engine: &Sentinel) {
        h.record(engine.now_millis(), &engine.adaptive_status());
    }

    fn total(series: &HashMap<SeriesKey, AdaptiveSeries>, resource: &str) -> AdaptiveSeries {
        series[&SeriesKey { resource: resource.into(), partition: None }].clone()
    }

    #[test]
    fn keeps_limit_and_peak_inflight_per_second_for_its_length_and_leaves_gaps_unsampled() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        // A limit held at 10 (the calls held here for seconds would make the algorithm lower it).
        engine.load_adaptive_rules([AdaptiveRule::new("api").limits(10, 10, 10)]).unwrap();
        let api = engine.resource("api");
        let h = AdaptiveHistory::new(60, 16);
        let mut held = Vec::new();
        // What the limiter showed in each sampled second: (limit last seen, peak in flight).
        let mut expected = HashMap::new();
        let now = |engine: &Sentinel| {
            let s = &engine.adaptive_status()[0];
            (s.limit, s.inflight)
        };
        for s in 0..100u64 {
            // In flight grows by one a second up to 10, then drains.
            if s % 20 < 10 {
                held.push(api.enter().unwrap());
            } else {
                held.pop();
            }
            if s % 10 != 7 {
                // (second 7 of every 10 is one the sampler missed)
                sample(&h, &engine);
                expected.insert(s, now(&engine));
            }
            if s % 20 == 3 {
                // Sampled again in the same second after one call left: the second keeps its peak.
                held.pop();
                sample(&h, &engine);
                let (limit, _) = now(&engine);
                let (_, peak) = expected[&s];
                expected.insert(s, (limit, peak));
                held.push(api.enter().unwrap());
            }
            clock.advance_millis(1000);
        }
        let (start, n, series) = h.series(T0 + 99_000, None);
        assert_eq!(n, 60, "the ring's length");
        assert_eq!(start, T0 + 40_000, "the span ends with the second asked for");
        let api = total(&series, "api");
        for k in 0..n {
            let s = 40 + k as u64;
            match expected.get(&s) {
                None => assert_eq!((api.limit[k], api.inflight[k]), (None, None), "second {s} was not sampled"),
                Some(&(limit, inflight)) => {
                    assert_eq!((api.limit[k], api.inflight[k]), (Some(limit), Some(inflight)), "second {s}")
                }
            }
            if s % 20 == 3 {
                assert_eq!(api.inflight[k], Some(4), "second {s}: the peak, not the last sample");
            }
        }
        // Later seconds than were sampled are gaps, and the span moves on.
        let (start, _, series) = h.series(T0 + 130_000, None);
        assert_eq!(start, T0 + 71_000);
        let api = total(&series, "api");
        assert_eq!(api.limit.iter().filter(|v| v.is_some()).count(), 29 - 3, "seconds 71..=99 less the missed ones");
        assert!(api.limit[29..].iter().all(Option::is_none));
        // Only the seconds after `after` (the one it falls in excluded), never before the span.
        let (start, n, series) = h.series(T0 + 99_000, Some(T0 + 97_500));
        assert_eq!((start, n), (T0 + 98_000, 2));
        assert_eq!(
            total(&series, "api").inflight,
            vec![expected.get(&98).map(|e| e.1), expected.get(&99).map(|e| e.1)]
        );
        assert_eq!(h.series(T0 + 99_000, Some(T0)).0, T0 + 40_000, "clamped to the span");
        assert_eq!(h.series(T0 + 99_000, Some(T0 + 99_000)).1, 0, "nothing after the current second");
    }

    #[test]
    fn partitions_have_series_of_their_own_with_their_guarantee_as_limit() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        engine
            .load_adaptive_rules([AdaptiveRule::new("api")
                .limits(2, 10, 100)
                .partition("mobile", 0.6)
                .partition("default", 0.4)])
            .unwrap();
        let api = engine.resource("api");
        let _mobile: Vec<_> = (0..3).map(|_| api.entry_owned().origin("mobile").enter().unwrap()).collect();
        let _other = api.enter().unwrap();
        let h = AdaptiveHistory::new(30, 16);
        sample(&h, &engine);
        let (_, n, series) = h.series(T0, None);
        let at = |p: Option<&str>| {
            let s = &series[&SeriesKey { resource: "api".into(), partition: p.map(Arc::from) }];
            (s.limit[n - 1], s.inflight[n - 1])
        };
        assert_eq!(at(None), (Some(10), Some(4)));
        assert_eq!(at(Some("mobile")), (Some(6), Some(3)));
        assert_eq!(at(Some("default")), (Some(4), Some(1)));
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn series_of_removed_rules_go_and_the_number_of_series_is_bounded() {
        let clock = ManualClock::at_millis(T0);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        let rules: Vec<_> = (0..10).map(|i| AdaptiveRule::new(format!("r{i}")).limits(1, 5, 10)).collect();
        engine.load_adaptive_rules(rules).unwrap();
        for i in 0..10 {
            drop(engine.enter(&format!("r{i}")).unwrap());
        }
        let h = AdaptiveHistory::new(30, 4);
        sample(&h, &engine);
        assert_eq!(h.len(), 4, "at most the cap");
        engine.load_adaptive_rules(Vec::new()).unwrap();
        clock.advance_millis(1000);
        sample(&h, &engine);
        assert_eq!(h.len(), 0, "a resource without a limiter has no series");
    }
}
