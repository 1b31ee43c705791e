//! The adaptive kind through the engine's entry path: the simulated downstream drives owned entries on a
//! manual clock (the ramp, the seed's incident, partitions, AIMD on 503s), and the slot's contract
//! (a place given back when a later slot blocks or panics, reloads, regex rules, bad rules, the block's
//! message). Deterministic: simulated time, seeded randomness, no sleeps.

use super::sim::{
    check_hovers, check_incident, check_shares, hidden_capacity, incident_sim, two_origins, Gate, Origin, Second, Sim,
    Ticket, MS, SEC,
};
use super::*;
use crate::clock::ManualClock;
use crate::flow::{FlowGrade, FlowRule};
use crate::{BlockError, Entry, EntryType, Resource, RuleError, RuleKind, Sentinel};

/// The engine's entry path on a manual clock: simulated time `t` is the clock at `start + t`; a call is an
/// owned entry of `resource` from the origin's name, dropped at completion (marked as an overload when the
/// downstream refused it).
pub(crate) struct EngineGate {
    pub(crate) engine: Sentinel,
    pub(crate) clock: ManualClock,
    pub(crate) resource: Resource,
    pub(crate) start: u64,
}

impl EngineGate {
    /// An engine on a manual clock with the rules `load` loads, and a handle on `resource` of `direction`.
    pub(crate) fn new(resource: &str, direction: crate::EntryType, load: impl FnOnce(&Sentinel)) -> Self {
        let start = 1_000_000 * SEC;
        let clock = ManualClock::at_nanos(start);
        let engine = Sentinel::builder().manual_clock(clock.clone()).build();
        load(&engine);
        let resource = engine.resource_typed(resource, direction);
        EngineGate { engine, clock, resource, start }
    }
}

impl Gate for EngineGate {
    fn admit(&self, t: u64, origin: &Origin) -> Option<Ticket> {
        self.clock.set_nanos(self.start + t);
        match self.resource.entry_owned().origin(origin.name).enter() {
            Ok(e) => Some(Ticket::Other(Box::new(e))),
            Err(BlockError::Adaptive { .. } | BlockError::Flow { .. }) => None,
            Err(other) => panic!("only the adaptive or a flow rule blocks here: {other}"),
        }
    }
    fn complete(&self, ticket: Ticket, t: u64, _: u64, dropped: bool) {
        self.clock.set_nanos(self.start + t);
        if let Ticket::Other(e) = ticket
            && let (true, Ok(mut e)) = (dropped, e.downcast::<Entry<'static>>())
        {
            e.set_overload();
        }
    }
    fn limit(&self) -> u32 {
        self.engine.adaptive_status().first().map_or(0, |s| s.limit)
    }
}

fn gate(rule: AdaptiveRule, direction: EntryType) -> EngineGate {
    let name = rule.resource.clone();
    EngineGate::new(&name, direction, |e| e.load_adaptive_rules([rule]).unwrap())
}

/// Envoy's experiment's downstream: 8 workers; 98 % of calls 40-60 ms, 2 % 100-200 ms (p50 about 50 ms,
/// p99 about 150 ms).
fn ramp_service(_: u64, u: f64) -> u64 {
    if u < 0.98 {
        (40.0 + 20.0 * u / 0.98) as u64 * MS
    } else {
        (100.0 + 100.0 * (u - 0.98) / 0.02) as u64 * MS
    }
}

const RAMP_CAPACITY: f64 = 8.0 / 0.0525; // workers / mean service time

/// Offered load rising from 0.5x to 4x capacity over 160 simulated seconds.
fn ramp(g: Option<&dyn Gate>) -> Vec<Second> {
    let sim = Sim {
        limiter: g,
        workers: 8,
        reject_at: None,
        service: Box::new(ramp_service),
        origins: vec![Origin { rate_end: 4.0 * RAMP_CAPACITY, ..Origin::steady(0.5 * RAMP_CAPACITY, 160 * SEC) }],
        seed: 9,
    };
    sim.run(160 * SEC)
}

fn max_p99(s: &[Second]) -> f64 {
    s.iter().map(|x| x.p99_ms).fold(0.0, f64::max)
}

#[test]
fn through_the_engine_gradient2_keeps_goodput_and_p99_through_the_ramp_and_holds_its_limit_in_band() {
    let g = gate(AdaptiveRule::new("api").limits(1, 20, 200), EntryType::In);
    let s = ramp(Some(&g));
    assert_eq!(g.engine.adaptive_status()[0].algorithm, AlgorithmKind::Gradient2, "inbound defaults to gradient2");
    let no_load_p99 = max_p99(&s[5..15]);
    // From the moment the offered load is well past capacity (it passes it at about 23 s) on.
    let loaded = &s[40..];
    let goodput = loaded.iter().map(|x| x.completed as f64).sum::<f64>() / loaded.len() as f64;
    let (low, high) = loaded.iter().fold((u32::MAX, 0), |(lo, hi), x| (lo.min(x.limit), hi.max(x.limit)));
    assert!(goodput >= 0.9 * RAMP_CAPACITY, "goodput {goodput:.0}/s of {RAMP_CAPACITY:.0}");
    assert!(max_p99(loaded) <= 2.0 * no_load_p99, "p99 {:.0} ms against {no_load_p99:.0} ms", max_p99(loaded));
    // The band: 1-5x the 8 workers (Gradient2's queue allowance keeps it above them).
    assert!(low >= 8 && high <= 40, "limit within 8..=40: {low}..{high}");
}

#[test]
fn through_the_engine_the_ramp_without_a_limit_grows_latency_without_bound_and_a_static_64_sticks_high() {
    let none = EngineGate::new("api", EntryType::In, |_| {});
    let unlimited = ramp(Some(&none));
    let no_load_p99 = max_p99(&unlimited[5..15]);
    assert!(unlimited[159].p99_ms > 20.0 * no_load_p99, "unlimited p99 at the end: {:.0} ms", unlimited[159].p99_ms);
    assert!(unlimited[159].p99_ms > unlimited[100].p99_ms, "and still growing");

    let fixed = EngineGate::new("api", EntryType::In, |e| {
        e.load_flow_rules([FlowRule::new("api").grade(FlowGrade::Thread).count(64.0)]).unwrap()
    });
    let s = ramp(Some(&fixed));
    let p99 = max_p99(&s[60..]);
    assert!(p99 >= 3.0 * no_load_p99, "a static 64 keeps p99 at {p99:.0} ms, {:.1}x the no-load", p99 / no_load_p99);
}

#[test]
fn through_the_engine_the_incident_bounds_in_flight_halves_the_limit_and_recovers() {
    let g = gate(AdaptiveRule::new("inventory").algorithm(AlgorithmKind::Gradient2).limits(4, 20, 200), EntryType::Out);
    let s = incident_sim(Some(&g)).run(200 * SEC);
    check_incident("gradient2 through the engine", &s, 0.9);
    // The engine's own count of calls in flight agrees with the limiter's at the end.
    assert_eq!(g.engine.adaptive_status()[0].inflight, g.engine.cluster_stats("inventory").unwrap().threads as u32);
}

#[test]
fn through_the_engine_without_a_rule_the_incident_piles_up_thousands() {
    let g = EngineGate::new("inventory", EntryType::Out, |_| {});
    let s = incident_sim(Some(&g)).run(120 * SEC);
    assert!(s[119].max_inflight > 5_000, "{}", s[119].max_inflight);
}

#[test]
fn through_the_engine_partitions_get_their_share_under_overload_and_all_of_it_alone() {
    let rule = AdaptiveRule::new("api").limits(20, 20, 20).partition("mobile", 0.7).partition("default", 0.3);
    let g = gate(rule, EntryType::In);
    let s = two_origins(
        &g,
        Origin { name: "mobile", ..Origin::steady(0.0, 0) },
        Origin { name: "web", ..Origin::steady(0.0, 0) },
    );
    check_shares(&s);
}

#[test]
fn through_the_engine_aimd_is_the_outbound_default_and_hovers_under_a_hidden_capacity_on_503s() {
    let mut rule = AdaptiveRule::new("payments").limits(1, 20, 200);
    rule.window.min_samples = 10;
    let g = gate(rule, EntryType::Out);
    let s = hidden_capacity(&g);
    assert_eq!(g.engine.adaptive_status()[0].algorithm, AlgorithmKind::Aimd);
    check_hovers(&s);
}

// ---------------------------------------------------------------- the slot's contract

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_000_000);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

#[test]
fn a_call_over_the_limit_is_blocked_with_the_limit_in_flight_and_rtts_in_its_message() {
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Gradient2).limits(2, 2, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    let db = engine.resource("db");
    let first = db.enter().unwrap();
    clock.advance_millis(1_200);
    drop(first); // a 1.2 s call closes the first window
    let held = (db.enter().unwrap(), db.enter().unwrap());
    let err = db.enter().unwrap_err();
    let BlockError::Adaptive { block, .. } = &err else { panic!("an adaptive block, got {err:?}") };
    assert_eq!((block.reason, block.limit, block.inflight), (AdaptiveBlockReason::AtLimit, 2, 2));
    assert_eq!(block.rtt_nanos, 1_200 * MS);
    let text = err.to_string();
    for part in ["adaptive limit 2 reached", "2 in flight", "min RTT 1200.0 ms", "current RTT 1200.0 ms"] {
        assert!(text.contains(part), "`{part}` in: {text}");
    }
    assert_eq!(err.kind_name(), "AdaptiveException");
    assert_eq!(err.retry_after(), Some(std::time::Duration::from_millis(1_200)));
    drop(held);
}

#[test]
fn a_place_goes_back_when_a_later_slot_blocks_the_call() {
    let (engine, _) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1)]).unwrap();
    engine.deny_every_nth("db", 2); // order 0: after the adaptive slot (-500)
    let db = engine.resource("db");
    drop(db.enter().unwrap());
    assert!(matches!(db.enter(), Err(BlockError::Custom { .. })), "the second call is denied after it");
    let third = db.enter().expect("the denied call's place went back");
    assert!(matches!(db.enter(), Err(BlockError::Adaptive { .. })), "the limit of one still holds");
    drop(third);
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
}

#[test]
fn a_place_taken_under_rules_loaded_after_the_handle_goes_back_at_exit_with_no_breaker_loaded() {
    let (engine, _) = engine();
    let db = engine.resource("db"); // created with no rule: its exits read no rules
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1)]).unwrap();
    let first = db.enter().unwrap();
    assert!(matches!(db.enter(), Err(BlockError::Adaptive { .. })));
    drop(first);
    assert_eq!(engine.adaptive_status()[0].inflight, 0, "the exit read the rules and gave the place back");
    let held = db.enter().expect("the place is free");
    engine.load_adaptive_rules(Vec::<AdaptiveRule>::new()).unwrap();
    drop(held); // the rule is gone: its place goes back to nobody, and nothing else is read
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1)]).unwrap();
    let again = db.enter().expect("a new limiter starts with no call in flight");
    drop(again);
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
}

#[test]
fn a_place_goes_back_when_a_user_slot_after_it_panics() {
    use crate::slot::{Slot, SlotEntry};
    struct Panics;
    impl Slot for Panics {
        fn name(&self) -> &'static str {
            "panics"
        }
        fn entry(&self, e: &SlotEntry<'_>) -> Result<(), String> {
            if e.origin == "bad" {
                panic!("a user slot panicked");
            }
            Ok(())
        }
    }
    let (engine, _) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1)]).unwrap();
    engine.add_slot(100, Panics);
    let db = engine.resource("db");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| db.entry().origin("bad").enter()));
    assert!(panicked.is_err());
    assert_eq!(engine.adaptive_status()[0].inflight, 0, "the place went back before the panic went on");
    drop(db.enter().expect("the place is free"));
}

#[test]
fn a_reload_with_an_equal_rule_keeps_the_limit_found_and_a_changed_rule_takes_its_places_back_right() {
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule.clone()]).unwrap();
    let db = engine.resource("db");
    let mut e = db.enter().unwrap();
    e.set_overload();
    clock.advance_millis(10);
    drop(e); // a drop backs off at once: 10 -> 9
    assert_eq!(engine.adaptive_status()[0].limit, 9);
    engine.load_adaptive_rules([rule.clone()]).unwrap();
    assert_eq!(engine.adaptive_status()[0].limit, 9, "an equal rule keeps its limiter");
    let held = db.enter().unwrap();
    engine.load_adaptive_rules([rule.clone().limits(1, 3, 50)]).unwrap();
    // A changed rule starts a new limiter (at its initial limit), which still counts the call in flight.
    let two: Vec<_> = (0..2).map(|_| db.enter().unwrap()).collect();
    assert!(matches!(db.enter(), Err(BlockError::Adaptive { .. })));
    assert_eq!((engine.adaptive_status()[0].limit, engine.adaptive_status()[0].inflight), (3, 3));
    drop(held); // its place goes back to the new limiter
    assert_eq!(engine.adaptive_status()[0].inflight, 2);
    let third = db.enter().unwrap();
    assert!(matches!(db.enter(), Err(BlockError::Adaptive { .. })));
    drop((two, third));
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
}

#[test]
fn a_regex_rule_gives_each_matching_resource_its_own_limiter() {
    let (engine, _) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("GET:/orders/.*").regex(true).limits(1, 1, 10)]).unwrap();
    let (a, b) = (engine.resource("GET:/orders/1"), engine.resource("GET:/orders/2"));
    let (_a, _b) = (a.enter().unwrap(), b.enter().unwrap());
    assert!(matches!(a.enter(), Err(BlockError::Adaptive { .. })));
    assert!(engine.resource("GET:/users").enter().is_ok(), "not matched, not limited");
    assert_eq!(engine.adaptive_status().len(), 2);
}

#[test]
fn bad_rules_are_refused_naming_the_field_and_the_rules_in_force_stay() {
    let (engine, _) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 5, 10)]).unwrap();
    let mut nan = AdaptiveRule::new("db");
    nan.gradient2.smoothing = f64::NAN;
    let cases: Vec<(&str, AdaptiveRule)> = vec![
        ("min_limit", AdaptiveRule::new("db").limits(20, 20, 10)),
        ("gradient2.smoothing", nan),
        ("partitions", AdaptiveRule::new("db").partition("mobile", 0.0)),
        ("partitions", AdaptiveRule::new("db").partition("mobile", 0.7).partition("default", 0.4)),
        ("resource", AdaptiveRule::new("(").regex(true)),
    ];
    for (field, bad) in cases {
        let err = engine.load_adaptive_rules([AdaptiveRule::new("ok"), bad]).unwrap_err();
        assert!(
            matches!(&err, RuleError::Invalid { kind: RuleKind::Adaptive, index: 1, field: f, .. } if *f == field),
            "{field}: {err}"
        );
        assert_eq!(engine.adaptive_rules(), vec![AdaptiveRule::new("db").limits(1, 5, 10)], "{field}: rules stay");
    }
    let two = engine.load_adaptive_rules([AdaptiveRule::new("db"), AdaptiveRule::new("db").limits(1, 1, 1)]);
    assert!(matches!(two, Err(RuleError::Invalid { field: "resource", index: 1, .. })), "{two:?}");
}

#[test]
fn a_time_limit_hit_counts_as_a_drop() {
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    let mut e = engine.enter("db").unwrap();
    clock.advance_millis(200);
    e.set_timed_out(std::time::Duration::from_millis(200));
    assert!(e.is_overload());
    drop(e);
    assert_eq!(engine.adaptive_status()[0].limit, 9, "AIMD backed off");
}

#[test]
fn diagnose_shows_the_limit_against_in_flight_and_the_measured_rtts() {
    let (engine, _) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 4, 10).partition("mobile", 0.5)]).unwrap();
    assert!(engine.diagnose("db").notes.iter().any(|n| n.contains("adaptive rule governs")));
    let held = engine.resource("db").entry_owned().origin("mobile").enter().unwrap();
    let d = engine.diagnose("db");
    let s = d.adaptive.as_ref().expect("the limiter is built");
    assert_eq!((s.limit, s.inflight, s.partitions[0].inflight, s.partitions[0].guarantee), (4, 1, 1, 2));
    let text = d.to_string();
    assert!(text.contains("limit 4, 1 in flight"), "{text}");
    assert!(text.contains("partition `mobile`: share 0.50, guaranteed 2, 1 in flight"), "{text}");
    drop(held);
}

#[test]
fn a_sync_call_over_the_limit_waits_up_to_max_wait_for_a_place_and_the_newest_is_served_first() {
    let (engine, clock) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1).max_wait_ms(100)]).unwrap();
    let db = engine.resource("db");
    let held = db.enter().unwrap();
    // A waiter on another thread: it blocks outside the rules' read section until the place frees.
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.enter("db").map(|e| e.exit()).is_ok())
    };
    while engine.adaptive_status()[0].waiting == 0 {
        std::thread::yield_now();
    }
    // A reload meanwhile is not held back by the waiting call.
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1).max_wait_ms(100)]).unwrap();
    drop(held);
    assert!(waiter.join().unwrap(), "the waiter got the freed place");
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
    // Nobody frees the place: the wait runs out on the engine's clock.
    let held = db.enter().unwrap();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.enter("db").map(drop))
    };
    while engine.adaptive_status()[0].waiting == 0 {
        std::thread::yield_now();
    }
    clock.advance_millis(100);
    match waiter.join().unwrap() {
        Err(BlockError::Adaptive { block, .. }) => assert_eq!(block.reason, AdaptiveBlockReason::WaitTimedOut),
        other => panic!("the wait ran out: {other:?}"),
    }
    drop(held);
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
}

#[test]
fn a_sync_call_that_waited_for_a_place_measures_its_rtt_from_the_place() {
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Aimd).limits(1, 1, 1).max_wait_ms(1_000);
    rule.window = WindowConfig { window_ms: 1, min_samples: 1, max_window_ms: 1, ignore_rtt_under_us: 0 };
    engine.load_adaptive_rules([rule]).unwrap();
    let db = engine.resource("db");
    let held = db.enter().unwrap();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.enter("db").map(drop).is_ok())
    };
    while engine.adaptive_status()[0].waiting == 0 {
        std::thread::yield_now();
    }
    clock.advance_millis(90);
    // A 90 ms call (its window closes on it); its place goes to the waiter, which returns at once: no time
    // passes between its place and its exit.
    drop(held);
    assert!(waiter.join().unwrap(), "the waiter got the freed place");
    clock.advance_millis(2);
    // A call of no time closes the window that holds the waiter's sample and its own.
    drop(db.enter().unwrap());
    let sample = engine.adaptive_status()[0].sample_rtt;
    assert!(
        sample < std::time::Duration::from_millis(1),
        "two calls of no time averaged {sample:?}: the waiter's 90 ms in the queue counted as downstream latency"
    );
}

/// `db` under a Gradient2 rule that samples every call, behind a rate-limiting flow rule of 10 a second,
/// evenly: a call right after another waits 100 ms before it runs.
fn gradient2_behind_a_rate_limiter(engine: &Sentinel) {
    let mut rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Gradient2).limits(1, 10, 20);
    rule.window = WindowConfig { window_ms: 1, min_samples: 1, max_window_ms: 1, ignore_rtt_under_us: 0 };
    engine.load_adaptive_rules([rule]).unwrap();
    engine
        .load_flow_rules([FlowRule::new("db")
            .count(10.0)
            .control_behavior(crate::flow::ControlBehavior::RateLimiter)
            .max_queueing_time_ms(1_000)])
        .unwrap();
}

#[test]
fn a_calls_queueing_wait_for_a_rate_limiting_flow_rule_is_not_counted_in_its_rtt() {
    let (engine, clock) = engine();
    gradient2_behind_a_rate_limiter(&engine);
    let db = engine.resource("db");
    drop(db.enter().unwrap());
    for _ in 0..3 {
        let queued = db.enter().unwrap();
        assert!(queued.waited() >= std::time::Duration::from_millis(90), "{:?}", queued.waited());
        // The wait passes (the manual clock does not sleep), then the call takes no time.
        clock.advance(queued.waited());
        drop(queued);
        clock.advance_millis(2);
    }
    let sample = engine.adaptive_status()[0].sample_rtt;
    assert!(
        sample < std::time::Duration::from_millis(1),
        "calls of no time averaged {sample:?}: their wait in the rate limiter's queue counted as downstream latency"
    );
}

#[test]
fn a_prioritized_call_that_borrows_a_later_window_is_still_held_to_the_adaptive_limit() {
    let t0 = 1_700_000_000_000u64;
    let clock = ManualClock::at_millis(t0 - t0 % 1000 + 200);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_flow_rules([FlowRule::new("db").count(10.0)]).unwrap();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1)]).unwrap();
    let db = engine.resource("db");
    for _ in 0..9 {
        drop(db.enter().unwrap());
    }
    let held = db.enter().unwrap(); // the tenth pass of the second, holding the one place
    clock.advance_millis(500); // the next bucket starts within the occupy timeout
    let unprioritized = db.enter();
    assert!(matches!(unprioritized, Err(BlockError::Flow { .. })), "{unprioritized:?}");
    match db.entry().prioritized(true).enter() {
        Err(BlockError::Adaptive { .. }) => {}
        Ok(e) => panic!(
            "admitted past the adaptive limit of 1 (occupied: {}; the limiter counts {} in flight for 2 calls)",
            e.is_occupied(),
            engine.adaptive_status()[0].inflight
        ),
        Err(other) => panic!("an adaptive block, got {other}"),
    }
    drop(held);
}

#[test]
fn a_prioritized_call_the_adaptive_limit_refuses_gives_back_the_window_it_borrowed() {
    let t0 = 1_700_000_000_000u64;
    let clock = ManualClock::at_millis(t0 - t0 % 1000 + 200);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    engine.load_flow_rules([FlowRule::new("db").count(1.0)]).unwrap();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 1, 1)]).unwrap();
    let db = engine.resource("db");
    let held = db.enter().unwrap(); // the second's one pass, holding the one place
    clock.advance_millis(500); // the next bucket starts within the occupy timeout
    let refused = db.entry().prioritized(true).enter();
    assert!(matches!(refused, Err(BlockError::Adaptive { .. })), "{refused:?}");
    drop(held);
    // The refused call's borrow went back: the next bucket's one place is there for the next borrower (one
    // borrow already counted would fill the limit of 1 and block it by the flow rule).
    let e = db.entry().prioritized(true).enter().expect("the later window's room is still there");
    assert!(e.is_occupied());
    assert_eq!(engine.adaptive_status()[0].inflight, 1, "the borrower holds its place under the adaptive limit");
    drop(e);
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
}

#[test]
fn calls_that_panicked_give_no_rtt_sample_to_the_adaptive_limit() {
    let (engine, clock) = engine();
    let mut rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Aimd).limits(1, 10, 50);
    rule.window.min_samples = 1;
    engine.load_adaptive_rules([rule]).unwrap();
    let db = engine.resource("db");
    for _ in 0..5 {
        // Six calls in flight whose code panics after 1 s: none of them completed.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _calls: Vec<_> = (0..6).map(|_| db.enter().unwrap()).collect();
            clock.advance_millis(1_000);
            panic!("the call's code panicked");
        }));
        assert!(unwound.is_err());
    }
    let s = &engine.adaptive_status()[0];
    assert_eq!(s.inflight, 0, "every place went back");
    // Netflix's limiters ignore a call that threw (`onIgnore`): its time is no RTT of the downstream. Taken
    // as completed calls, six panics a second grow AIMD's limit by one per window.
    assert_eq!((s.limit, s.sample_rtt), (10, std::time::Duration::ZERO), "{s:?}");
}

#[test]
fn a_call_that_queued_then_timed_out_is_measured_at_its_time_limit() {
    let (engine, clock) = engine();
    gradient2_behind_a_rate_limiter(&engine);
    let db = engine.resource("db");
    let first = db.enter().unwrap();
    clock.advance_millis(2);
    drop(first); // a 2 ms call closes the first window
    let mut queued = db.enter().unwrap();
    let waited = queued.waited();
    assert!(waited >= std::time::Duration::from_millis(90), "{waited:?}");
    // The wait passes, then the call runs into its 200 ms time limit (a limit that starts once it runs, as
    // the macro's `timeout_ms`, the web layer's and the outbound guards' do).
    clock.advance(waited);
    clock.advance_millis(200);
    queued.set_timed_out(std::time::Duration::from_millis(200));
    drop(queued);
    let sample = engine.adaptive_status()[0].sample_rtt;
    assert_eq!(sample, std::time::Duration::from_millis(200), "the downstream had the call for 200 ms");
}

#[test]
fn a_changed_rule_still_counts_the_calls_in_flight_under_the_rule_it_replaced() {
    let (engine, _) = engine();
    engine.load_adaptive_rules([AdaptiveRule::new("db").limits(1, 2, 2)]).unwrap();
    let db = engine.resource("db");
    let held = (db.enter().unwrap(), db.enter().unwrap());
    // An operator changes a field (a longer wait queue) while both calls run; the limit is the same.
    let mut changed = AdaptiveRule::new("db").limits(1, 2, 2);
    changed.max_waiters = 5;
    engine.load_adaptive_rules([changed]).unwrap();
    match db.enter() {
        Err(BlockError::Adaptive { block, .. }) => assert_eq!((block.limit, block.inflight), (2, 2)),
        Ok(_) => panic!(
            "a third call in flight under a limit of 2 (the limiter counts {})",
            engine.adaptive_status()[0].inflight
        ),
        Err(other) => panic!("an adaptive block, got {other}"),
    }
    drop(held);
    assert_eq!(engine.adaptive_status()[0].inflight, 0, "the calls of the old rule gave their places back");
    let two = (db.enter().unwrap(), db.enter().unwrap());
    assert!(matches!(db.enter(), Err(BlockError::Adaptive { .. })));
    drop(two);
    assert_eq!(engine.adaptive_status()[0].inflight, 0);
}

/// A rule that updates its limit on every sampled call (a window of one sample).
fn every_call_a_window(algorithm: AlgorithmKind, ignore_rtt_under_us: u64) -> AdaptiveRule {
    let mut rule = AdaptiveRule::new("db").algorithm(algorithm).limits(1, 20, 200);
    rule.window = WindowConfig { window_ms: 1, min_samples: 1, max_window_ms: 1, ignore_rtt_under_us };
    rule
}

#[test]
fn gradient2_leaves_its_limit_while_fewer_than_half_of_it_are_in_flight_however_the_rtt_moves() {
    // Netflix's `Gradient2Limit._update` returns the limit unchanged while `inflight < estimatedLimit / 2`
    // ("app limited"): the caller, not the downstream, is the bottleneck, so the RTT says nothing of the limit,
    // up or down.
    let (engine, clock) = engine();
    engine.load_adaptive_rules([every_call_a_window(AlgorithmKind::Gradient2, 0)]).unwrap();
    let db = engine.resource("db");
    let call = |ms: u64| {
        let e = db.enter().unwrap();
        clock.advance_millis(ms);
        drop(e);
    };
    for _ in 0..10 {
        call(10);
    }
    // One call in flight at a time (of a limit of 20), each a hundred times slower than before.
    for _ in 0..10 {
        call(1_000);
    }
    assert_eq!(engine.adaptive_status()[0].limit, 20, "1 of 20 in flight: app-limited, unchanged");
}

#[test]
fn a_sample_counts_the_calls_in_flight_when_its_call_was_admitted() {
    // Netflix's `AbstractLimiter.createListener` reads `inFlight.incrementAndGet()` when the call is admitted
    // and passes it to `onSample` when the call completes. AIMD grows by one when `inflight · 2 >= limit`.
    let (engine, clock) = engine();
    let mut rule = every_call_a_window(AlgorithmKind::Aimd, 100);
    rule = rule.limits(1, 10, 100);
    engine.load_adaptive_rules([rule]).unwrap();
    let db = engine.resource("db");
    // Ten calls at once: the limit is used in full.
    let mut calls: Vec<_> = (0..10).map(|_| db.enter().unwrap()).collect();
    let last = calls.pop().unwrap();
    // Nine answer at once, under the 100 µs a sample needs (not sampled); the tenth after 10 ms.
    drop(calls);
    clock.advance_millis(10);
    drop(last);
    assert_eq!(engine.adaptive_status()[0].limit, 11, "admitted with 10 of 10 in flight: 10 · 2 >= 10, grows by one");
}
