//! The engine's public methods on the rule kinds: circuit breaker observers and states, the error filter
//! from a trace filter, the system readings, the hot-parameter tracking. The kinds know no engine; the engine
//! answers for them here.

use std::sync::Arc;

use crate::circuit_breaker::{snapshot, BreakerSnapshot, BreakerState, DegradeRule, TraceFilter};
use crate::system::SystemReadings;
use crate::Sentinel;

impl Sentinel {
    /// Registers a circuit breaker state-change observer under `name` (replacing one of the same name).
    ///
    /// It is called on every transition of every breaker of this engine with `(previous, new, rule,
    /// snapshot)`; see [`StateObserver`](crate::circuit_breaker::StateObserver) for the snapshot. It runs on
    /// the thread that caused the transition, so keep it short. A panic in an observer is caught and logged.
    /// It runs while that call reads the resource's rules: loading rules from it is fine (they take effect
    /// for later calls), but an observer that blocks holds back rule reloads until it returns.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use sentinel_runtime::{Sentinel, clock::ManualClock};
    /// use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
    ///
    /// let engine = Sentinel::builder().manual_clock(ManualClock::at_millis(1_000_000)).build();
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// engine.register_state_observer("log", move |prev, new, _rule, snapshot| {
    ///     log.lock().unwrap().push((prev, new, snapshot));
    /// });
    /// engine
    ///     .load_degrade_rules(vec![DegradeRule::new("pay", DegradeGrade::ErrorCount)
    ///         .count(0.0).time_window_sec(10).min_request_amount(1)])
    ///     .unwrap();
    /// let mut entry = engine.enter("pay").unwrap();
    /// entry.set_error();
    /// drop(entry);
    /// assert_eq!(seen.lock().unwrap()[0], (BreakerState::Closed, BreakerState::Open, Some(1.0)));
    /// ```
    pub fn register_state_observer(
        &self,
        name: &str,
        f: impl Fn(BreakerState, BreakerState, &DegradeRule, Option<f64>) + Send + Sync + 'static,
    ) {
        self.shared.degrade.observers.register(name, Arc::new(f));
    }

    /// Removes the state-change observer registered under `name`; `true` if there was one.
    pub fn unregister_state_observer(&self, name: &str) -> bool {
        self.shared.degrade.observers.unregister(name)
    }

    /// The circuit breakers that apply to `resource` and their states: its own degrade rules' breakers, or
    /// else the breakers it got from the default (`"*"`) rules (once it exists).
    pub fn circuit_breakers(&self, resource: &str) -> Vec<BreakerSnapshot> {
        let now_ms = self.shared.now_ms();
        if let Some(inner) = self.shared.find_resource(resource) {
            return inner.with_rules(|rules| match rules.degrade.as_ref().or(rules.default_degrade.as_ref()) {
                Some(b) => snapshot(b, now_ms),
                None => Vec::new(),
            });
        }
        match self.shared.degrade.exact_for(resource) {
            Some(b) => snapshot(&b, now_ms),
            None => Vec::new(),
        }
    }
}

impl Sentinel {
    /// Sets the global error filter from a [`TraceFilter`] (replacing any filter set before, including one
    /// set with [`set_error_filter`](Sentinel::set_error_filter)).
    pub fn set_trace_filter(&self, filter: TraceFilter) {
        self.set_error_filter(move |e| filter.accepts(e));
    }
}

impl Sentinel {
    /// Feeds the load and cpu readings the system rules use, instead of sampling `/proc` (tests, or a
    /// platform where you measure them yourself). `None`, a negative or a non-finite value means
    /// unavailable: that check is skipped. From the first call on, this engine never starts its sampler.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, EntryType, SystemLimit, BlockError};
    /// use sentinel_runtime::system::SystemRule;
    /// let engine = Sentinel::builder().build();
    /// engine.set_system_readings(None, Some(0.95));
    /// engine.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(0.8), ..Default::default() }]).unwrap();
    /// let err = engine.resource_typed("api", EntryType::In).enter().unwrap_err();
    /// assert!(matches!(err, BlockError::System { limit: SystemLimit::Cpu { .. }, .. }));
    /// ```
    pub fn set_system_readings(&self, load: Option<f64>, cpu: Option<f64>) {
        self.shared.system.set_readings(SystemReadings { load, cpu });
    }

    /// The load and cpu readings in use now.
    pub fn system_readings(&self) -> SystemReadings {
        self.shared.system.readings()
    }

    /// Whether the background load/cpu sampler thread is running (only while a system rule needs it).
    pub fn system_sampler_running(&self) -> bool {
        self.shared.system.sampler_running()
    }
}

impl Sentinel {
    /// How many distinct values each hot-parameter rule of `resource` tracks now, with its cap:
    /// `(tracked, capacity)` per rule, in load order. Memory stays bounded: `tracked <= capacity` always.
    pub fn param_flow_tracked(&self, resource: &str) -> Vec<(usize, usize)> {
        self.shared.param.for_resource(resource).map(|r| r.tracked()).unwrap_or_default()
    }
}

impl Sentinel {
    /// Replaces the adaptive concurrency rules (see [`crate::adaptive`]). An invalid rule (min above max,
    /// a NaN, a zero share, shares summing over 1, ...) refuses the whole set with an error naming its index
    /// and field, and the rules in force stay. A resource whose rule is unchanged keeps its limiter and the
    /// limit it found.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, BlockError, RuleError, RuleKind};
    /// use sentinel_runtime::adaptive::AdaptiveRule;
    ///
    /// let engine = Sentinel::builder().build();
    /// engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 2, 50)]).unwrap();
    /// let db = engine.resource("db");
    /// let (_a, _b) = (db.enter().unwrap(), db.enter().unwrap());
    /// let blocked = db.enter().unwrap_err();
    /// assert!(matches!(blocked, BlockError::Adaptive { .. }), "{blocked}");
    ///
    /// let err = engine.load_adaptive_rules([AdaptiveRule::new("db").limits(10, 10, 5)]).unwrap_err();
    /// assert!(matches!(err, RuleError::Invalid { kind: RuleKind::Adaptive, field: "min_limit", .. }));
    /// assert_eq!(engine.adaptive_rules()[0].max_limit, 50); // the rules in force stay
    /// ```
    pub fn load_adaptive_rules(
        &self,
        rules: impl IntoIterator<Item = crate::adaptive::AdaptiveRule>,
    ) -> Result<(), crate::RuleError> {
        if self.shared.adaptive.load(rules.into_iter().collect())? {
            super::compile::refresh_rules(&self.shared);
        }
        self.warn_unknown_rule_resources(crate::RuleKind::Adaptive);
        Ok(())
    }

    /// The adaptive concurrency rules in force.
    pub fn adaptive_rules(&self) -> Vec<crate::adaptive::AdaptiveRule> {
        self.shared.adaptive.rules()
    }

    /// The state of every adaptive limiter in force, by resource name: the limit, calls in flight, RTTs,
    /// gradient and partitions (a limiter exists once its resource was checked).
    pub fn adaptive_status(&self) -> Vec<crate::adaptive::AdaptiveStatus> {
        self.shared
            .adaptive
            .cells()
            .into_iter()
            .filter_map(|(name, cell)| cell.built().map(|l| crate::adaptive::AdaptiveStatus::of(&name, &cell.rule, l)))
            .collect()
    }

    /// The adaptive rules in force that no limiter runs for yet: a rule's limiter starts at the first checked
    /// call of a resource it governs (which also picks its default algorithm, by the call's direction), so
    /// until then [`adaptive_status`](Self::adaptive_status) has nothing for it. A pattern's rule is listed
    /// until a resource it matches was called.
    ///
    /// ```
    /// use sentinel_runtime::{adaptive::AdaptiveRule, Sentinel};
    /// let engine = Sentinel::builder().build();
    /// engine.load_adaptive_rules([AdaptiveRule::new("db")]).unwrap();
    /// assert_eq!(engine.adaptive_rules_waiting().len(), 1);
    /// drop(engine.resource("db").enter().unwrap());
    /// assert!(engine.adaptive_rules_waiting().is_empty());
    /// ```
    pub fn adaptive_rules_waiting(&self) -> Vec<crate::adaptive::AdaptiveRule> {
        let started: Vec<_> = self
            .shared
            .adaptive
            .cells()
            .into_iter()
            .filter(|(_, c)| c.built().is_some())
            .map(|(_, c)| c.rule.clone())
            .collect();
        self.shared.adaptive.rules().into_iter().filter(|r| !started.iter().any(|s| **s == *r)).collect()
    }

    /// Replaces `owner`'s hot-parameter rules (the user's stay when the gateway loads, and the other way
    /// round); counters of rules that stay are kept.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn load_param_flow_rules_of(
        &self,
        owner: crate::param_flow::ParamRuleOwner,
        rules: Vec<crate::param_flow::ParamFlowRule>,
    ) -> Result<(), crate::RuleError> {
        if self.shared.param.load(owner, rules)? {
            super::compile::refresh_rules(&self.shared);
        }
        Ok(())
    }
}

#[cfg(test)]
impl Sentinel {
    /// Denies every `n`-th call of `resource` from now on (the test-only kind's "load rules").
    pub(crate) fn deny_every_nth(&self, resource: &str, n: u64) {
        self.shared.every_nth.set(resource, n);
        super::compile::refresh_rules(&self.shared);
    }
}
