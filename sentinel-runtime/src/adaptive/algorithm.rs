//! The three limit algorithms, as plain state machines: each is fed one [`WindowSample`] per closed window
//! and answers the new limit. No clock, no atomics, no allocation: the limiter calls them once per window
//! under its control lock, and tests call them directly with hand-computed steps.
//!
//! The formulas are Netflix's (concurrency-limits) as published; the code is ours.

use super::rule::{AdaptiveRule, AimdParams, AlgorithmKind, Gradient2Params, VegasParams};

/// What one closed window of samples measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct WindowSample {
    /// The window's average round-trip time, in nanoseconds (> 0): the window's measure, the one RTT every
    /// algorithm reads.
    pub rtt_nanos: u64,
    /// The window's lowest round-trip time, in nanoseconds (> 0): shown, not read by the algorithms.
    pub min_rtt_nanos: u64,
    /// The most calls in flight any sample of the window saw when it started.
    pub max_inflight: u32,
    /// Samples in the window (>= 1).
    pub samples: u32,
    /// Whether a call of the window was marked as an overload drop.
    pub dropped: bool,
}

/// An exponential average that starts as a plain mean over its first `warmup` values (Netflix's
/// `ExpAvgMeasurement`): with a window of `n`, each later value weighs `2 / (n + 1)`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ExpAverage {
    value: f64,
    count: u32,
    warmup: u32,
    factor: f64,
}

impl ExpAverage {
    pub(crate) fn new(window: u32, warmup: u32) -> Self {
        ExpAverage { value: 0.0, count: 0, warmup, factor: 2.0 / (f64::from(window) + 1.0) }
    }
    /// Adds a value and returns the average.
    pub(crate) fn add(&mut self, x: f64) -> f64 {
        if self.count < self.warmup {
            self.count += 1;
            self.value += (x - self.value) / f64::from(self.count);
        } else {
            self.value = self.value * (1.0 - self.factor) + x * self.factor;
        }
        self.value
    }
    pub(crate) fn get(&self) -> f64 {
        self.value
    }
    pub(crate) fn set(&mut self, x: f64) {
        self.value = x;
        self.count = self.count.max(1);
    }
}

/// Gradient2: `gradient = clamp(tolerance · long / short, 0.5, 1)`, `new = limit · gradient + queue`, smoothed
/// `limit · (1 − smoothing) + new · smoothing`, clamped to the bounds. The long RTT is an exponential average
/// over `long_window` windows (plain mean over the first 10) and decays by 5 % per window while it is more
/// than twice the short RTT (recovery after a long overload). The limit does not change, up or down, while
/// fewer than half of it were in flight (the caller, not the downstream, is the bottleneck: the RTT says
/// nothing of the limit; the long RTT is still updated). Drops do not enter the formula
/// (as in Netflix's); their RTTs do, so a call that hit its time limit counts with that time.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Gradient2 {
    params: Gradient2Params,
    limit: f64,
    min: f64,
    max: f64,
    pub(super) long_rtt: ExpAverage,
    gradient: f64,
}

impl Gradient2 {
    pub(crate) fn new(params: Gradient2Params, initial: u32, min: u32, max: u32) -> Self {
        Gradient2 {
            params,
            limit: f64::from(initial),
            min: f64::from(min),
            max: f64::from(max),
            long_rtt: ExpAverage::new(params.long_window, 10),
            gradient: 1.0,
        }
    }

    pub(crate) fn update(&mut self, s: &WindowSample) -> f64 {
        let short = s.rtt_nanos.max(1) as f64;
        let long = self.long_rtt.add(short);
        if long / short > 2.0 {
            self.long_rtt.set(long * 0.95);
        }
        let gradient = (self.params.rtt_tolerance * long / short).clamp(0.5, 1.0);
        self.gradient = gradient;
        // App-limited: the limit stays as it is, neither up nor down (Netflix returns it unchanged).
        if f64::from(s.max_inflight) < self.limit / 2.0 {
            return self.limit;
        }
        let estimate = self.limit * gradient + f64::from(self.params.queue_size);
        let smoothed = self.limit * (1.0 - self.params.smoothing) + estimate * self.params.smoothing;
        let next = smoothed.clamp(self.min, self.max);
        self.limit = next;
        next
    }
}

/// Vegas: `queue = ceil(limit · (1 − no_load_rtt / rtt))`, with `log = max(1, floor(log10(limit)))`: a queue
/// at or under `log` grows the limit by `beta · log`, under `alpha · log` by `log`; over `beta · log` it
/// shrinks by `log`; a drop shrinks it by `log`. The new limit is clamped, then smoothed.
///
/// `rtt` is the window's measure, its average RTT, and the no-load RTT is the lowest such measure of a window
/// without a drop (a drop's RTT is not the downstream's latency): both sides of the ratio are window averages,
/// as in Netflix's windowed Vegas, which is fed one RTT per window. (Comparing a window's average with the
/// lowest single call would read the spread of a steady downstream's RTTs as a queue, and shrink the limit
/// for nothing.) The no-load RTT is measured afresh after `jitter · probe_multiplier · limit` updates (jitter
/// in [0.5, 1)):
/// Netflix counts the samples its Vegas is fed, which under its windowed limit are windows; counting calls
/// instead would re-measure every few seconds under load and take a loaded RTT for the no-load one.
#[derive(Clone, Debug)]
pub(crate) struct Vegas {
    params: VegasParams,
    limit: f64,
    min: f64,
    max: f64,
    pub(super) no_load_rtt: u64,
    updates_since_probe: u64,
    probe_jitter: f64,
    rng: fastrand::Rng,
    last_queue: f64,
}

/// `max(1, floor(log10(limit)))`, Netflix's integer log10 of the limit.
pub(crate) fn log10_at_least_one(limit: f64) -> f64 {
    limit.max(1.0).log10().floor().max(1.0)
}

impl Vegas {
    pub(crate) fn new(params: VegasParams, initial: u32, min: u32, max: u32, seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let probe_jitter = 0.5 + rng.f64() * 0.5;
        Vegas {
            params,
            limit: f64::from(initial),
            min: f64::from(min),
            max: f64::from(max),
            no_load_rtt: 0,
            updates_since_probe: 0,
            probe_jitter,
            rng,
            last_queue: 0.0,
        }
    }

    pub(crate) fn update(&mut self, s: &WindowSample) -> f64 {
        self.updates_since_probe += 1;
        // A window with a drop never gives the no-load RTT, nor a new measure of it (a due one waits for the
        // next window without a drop): a call the downstream refused or shed fast (a 503 after 1 ms) says
        // nothing of its latency, and the downstream was overloaded in that window anyway.
        if !s.dropped {
            let probe_after = self.probe_jitter * f64::from(self.params.probe_multiplier) * self.limit;
            if self.params.probe_multiplier > 0 && self.updates_since_probe as f64 >= probe_after {
                // Measure the no-load RTT afresh: the downstream may have become slower for good.
                self.updates_since_probe = 0;
                self.probe_jitter = 0.5 + self.rng.f64() * 0.5;
                self.no_load_rtt = s.rtt_nanos.max(1);
                return self.limit;
            }
            if self.no_load_rtt == 0 || s.rtt_nanos < self.no_load_rtt {
                self.no_load_rtt = s.rtt_nanos.max(1);
                return self.limit;
            }
        }
        let log = log10_at_least_one(self.limit.floor());
        let target = if s.dropped {
            self.limit - log
        } else if f64::from(s.max_inflight) * 2.0 < self.limit {
            return self.limit;
        } else {
            let queue = (self.limit * (1.0 - self.no_load_rtt as f64 / s.rtt_nanos.max(1) as f64)).ceil();
            self.last_queue = queue;
            if queue <= log {
                self.limit + self.params.beta * log
            } else if queue < self.params.alpha * log {
                self.limit + log
            } else if queue > self.params.beta * log {
                self.limit - log
            } else {
                return self.limit;
            }
        };
        let clamped = target.clamp(self.min, self.max);
        self.limit =
            (self.limit * (1.0 - self.params.smoothing) + clamped * self.params.smoothing).clamp(self.min, self.max);
        self.limit
    }
}

/// AIMD: a window with a drop, or whose RTT passes the timeout, multiplies the limit by the backoff ratio
/// (rounded down); otherwise, when at least half the limit was in flight, it grows by one. Clamped to the
/// bounds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Aimd {
    params: AimdParams,
    limit: f64,
    min: f64,
    max: f64,
}

impl Aimd {
    pub(crate) fn new(params: AimdParams, initial: u32, min: u32, max: u32) -> Self {
        Aimd { params, limit: f64::from(initial), min: f64::from(min), max: f64::from(max) }
    }

    pub(crate) fn update(&mut self, s: &WindowSample) -> f64 {
        let timeout = self.params.timeout_ms.saturating_mul(1_000_000);
        let next = if s.dropped || s.rtt_nanos > timeout {
            (self.limit * self.params.backoff_ratio).floor()
        } else if f64::from(s.max_inflight) * 2.0 >= self.limit {
            self.limit + 1.0
        } else {
            self.limit
        };
        self.limit = next.clamp(self.min, self.max);
        self.limit
    }
}

/// One of the algorithms, dispatched statically.
#[derive(Clone, Debug)]
pub(crate) enum Algorithm {
    Gradient2(Gradient2),
    Vegas(Vegas),
    Aimd(Aimd),
}

impl Algorithm {
    /// The algorithm of `kind` configured by `rule`; `seed` drives Vegas's probe jitter.
    pub(crate) fn new(rule: &AdaptiveRule, kind: AlgorithmKind, seed: u64) -> Self {
        let (i, lo, hi) = (rule.initial_limit, rule.min_limit, rule.max_limit);
        match kind {
            AlgorithmKind::Gradient2 => Algorithm::Gradient2(Gradient2::new(rule.gradient2, i, lo, hi)),
            AlgorithmKind::Vegas => Algorithm::Vegas(Vegas::new(rule.vegas, i, lo, hi, seed)),
            AlgorithmKind::Aimd => Algorithm::Aimd(Aimd::new(rule.aimd, i, lo, hi)),
        }
    }

    /// Feeds one window; returns the new (fractional) limit.
    pub(crate) fn update(&mut self, s: &WindowSample) -> f64 {
        match self {
            Algorithm::Gradient2(a) => a.update(s),
            Algorithm::Vegas(a) => a.update(s),
            Algorithm::Aimd(a) => a.update(s),
        }
    }

    /// Whether a window with a drop lowers the limit (AIMD, Vegas): only then does a drop close its window
    /// early. Gradient2 leaves drops out of its formula.
    pub(crate) fn backs_off_on_drop(&self) -> bool {
        match self {
            Algorithm::Gradient2(_) => false,
            Algorithm::Vegas(_) | Algorithm::Aimd(_) => true,
        }
    }

    /// Which algorithm this is.
    pub(crate) fn kind(&self) -> AlgorithmKind {
        match self {
            Algorithm::Gradient2(_) => AlgorithmKind::Gradient2,
            Algorithm::Vegas(_) => AlgorithmKind::Vegas,
            Algorithm::Aimd(_) => AlgorithmKind::Aimd,
        }
    }

    /// The current (fractional) limit.
    pub(crate) fn limit(&self) -> f64 {
        match self {
            Algorithm::Gradient2(a) => a.limit,
            Algorithm::Vegas(a) => a.limit,
            Algorithm::Aimd(a) => a.limit,
        }
    }

    /// The RTT the algorithm compares against (Gradient2's long-term RTT, Vegas's no-load RTT), in
    /// nanoseconds; 0 where it has none (AIMD).
    pub(crate) fn baseline_rtt_nanos(&self) -> u64 {
        match self {
            Algorithm::Gradient2(a) => a.long_rtt.get() as u64,
            Algorithm::Vegas(a) => a.no_load_rtt,
            Algorithm::Aimd(_) => 0,
        }
    }

    /// Gradient2's last gradient (1.0 for the others).
    pub(crate) fn gradient(&self) -> f64 {
        match self {
            Algorithm::Gradient2(a) => a.gradient,
            Algorithm::Vegas(_) | Algorithm::Aimd(_) => 1.0,
        }
    }

    /// Resets the baseline to a probe's measurement `s` (the window of an unloaded downstream): its average
    /// RTT, the measure both algorithms compare. Vegas keeps its no-load RTT when the window had a drop (a
    /// drop's RTT is not the downstream's latency).
    pub(crate) fn reset_baseline(&mut self, s: &WindowSample) {
        match self {
            Algorithm::Gradient2(a) => a.long_rtt.set(s.rtt_nanos.max(1) as f64),
            Algorithm::Vegas(a) if !s.dropped => {
                a.no_load_rtt = s.rtt_nanos.max(1);
                a.updates_since_probe = 0;
            }
            Algorithm::Vegas(_) | Algorithm::Aimd(_) => {}
        }
    }
}
