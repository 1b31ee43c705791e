//! System adaptive protection (SPEC §7), with a manual clock and fed load/cpu readings.

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::system::{SystemReadings, SystemRule};
use sentinel_runtime::{BlockError, EntryType, RuleError, RuleKind, Sentinel, SystemLimit};

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let e = Sentinel::builder().manual_clock(clock.clone()).build();
    // Fed readings: the background sampler never runs in these tests.
    e.set_system_readings(None, None);
    (e, clock)
}

fn limit_of(r: Result<sentinel_runtime::Entry<'_>, BlockError>) -> Option<SystemLimit> {
    match r {
        Ok(_) => None,
        Err(BlockError::System { limit, .. }) => Some(limit),
        Err(other) => panic!("expected a system block, got {other:?}"),
    }
}

#[test]
fn qps_limit_counts_the_inbound_pass_qps_plus_acquire() {
    let (e, clock) = engine();
    e.load_system_rules(vec![SystemRule { qps: Some(2.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    assert_eq!(limit_of(api.enter()), None);
    assert_eq!(limit_of(api.enter()), None);
    assert_eq!(limit_of(api.enter()), Some(SystemLimit::Qps { limit: 2.0 }));
    // A different inbound resource shares the global inbound node.
    assert!(e.resource_typed("other", EntryType::In).enter().is_err());
    clock.advance_millis(1001); // the window no longer holds the passes

    assert!(api.enter().is_ok());
}

#[test]
fn qps_limit_with_acquire_counts_permits() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { qps: Some(5.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    assert!(api.entry().acquire(3).enter().is_ok()); // 0 + 3 <= 5
    assert!(api.entry().acquire(3).enter().is_err()); // 3 + 3 > 5
    assert!(api.entry().acquire(2).enter().is_ok()); // 3 + 2 <= 5
}

#[test]
fn outbound_entries_are_never_checked() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { qps: Some(0.0), max_thread: Some(0), ..Default::default() }]).unwrap();
    let out = e.resource("db");
    for _ in 0..10 {
        assert!(out.enter().is_ok());
    }
    assert!(e.resource_typed("api", EntryType::In).enter().is_err());
    // An outbound-typed entry of an inbound handle is outbound.
    assert!(e.resource_typed("api", EntryType::In).entry().entry_type(EntryType::Out).enter().is_ok());
}

#[test]
fn thread_limit_blocks_when_in_flight_exceeds_it() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { max_thread: Some(2), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    // `threads > max_thread` is read before the call is counted: with 2 in flight a third still passes.
    let a = api.enter().unwrap();
    let b = api.enter().unwrap();
    let c = api.enter().unwrap();
    assert_eq!(e.inbound_stats().threads, 3);
    assert_eq!(limit_of(api.enter()), Some(SystemLimit::Thread { limit: 2 }));
    drop((a, b));
    assert!(api.enter().is_ok());
    drop(c);
}

#[test]
fn avg_rt_limit_is_strictly_greater() {
    let (e, clock) = engine();
    e.load_system_rules(vec![SystemRule { avg_rt: Some(10), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    let entry = api.enter().unwrap();
    clock.advance_millis(10);
    drop(entry);
    assert_eq!(e.inbound_stats().avg_rt_ms, 10.0);
    let entry = api.enter().expect("avg rt 10 is not over 10");
    clock.advance_millis(30);
    drop(entry); // avg (10 + 30) / 2 = 20
    assert_eq!(limit_of(api.enter()), Some(SystemLimit::AvgRt { limit: 10 }));
    clock.advance_millis(1000); // the window slides past: no completions, avg rt 0
    assert!(api.enter().is_ok());
}

#[test]
fn load_over_the_limit_blocks_only_when_bbr_says_saturated() {
    let (e, _clock) = engine();
    e.set_system_readings(Some(8.0), None);
    e.load_system_rules(vec![SystemRule { highest_system_load: Some(4.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    // Nothing completed: max_success_qps = max(1, 0) * 2 / 1 = 2 and min_rt = 5000 ms, so BBR allows
    // 2 * 5000 / 1000 = 10 calls in flight; the check reads the count before this call: 11 pass.
    let held: Vec<_> = (0..11).map(|i| api.enter().unwrap_or_else(|b| panic!("call {i}: {b}"))).collect();
    assert_eq!(limit_of(api.enter()), Some(SystemLimit::Load { limit: 4.0, load: 8.0 }));
    drop(held);
}

#[test]
fn load_bbr_uses_max_success_qps_and_min_rt() {
    let (e, clock) = engine();
    e.set_system_readings(Some(8.0), None);
    e.load_system_rules(vec![SystemRule { highest_system_load: Some(4.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    let first = api.enter().unwrap();
    clock.advance_millis(1);
    drop(first); // one success of 1 ms: max_success_qps 2, min_rt 1 -> 2 * 1 / 1000 = 0.002
    let a = api.enter().unwrap(); // threads 0
    let b = api.enter().unwrap(); // threads 1: not > 1
    assert!(matches!(limit_of(api.enter()), Some(SystemLimit::Load { .. }))); // threads 2 > 1 and > 0.002
    drop((a, b));
}

#[test]
fn load_under_the_limit_or_unavailable_passes() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { highest_system_load: Some(4.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    e.set_system_readings(Some(4.0), None); // not strictly over
    let held: Vec<_> = (0..20).map(|_| api.enter().unwrap()).collect();
    e.set_system_readings(None, None); // unavailable: skipped
    assert!(api.enter().is_ok());
    e.set_system_readings(Some(4.5), None);
    assert!(api.enter().is_err());
    drop(held);
}

#[test]
fn cpu_over_the_limit_blocks() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(0.8), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    e.set_system_readings(None, Some(0.8));
    assert!(api.enter().is_ok(), "0.8 is not over 0.8");
    e.set_system_readings(None, Some(0.81));
    assert_eq!(limit_of(api.enter()), Some(SystemLimit::Cpu { limit: 0.8, usage: 0.81 }));
    e.set_system_readings(None, None);
    assert!(api.enter().is_ok(), "unavailable cpu usage skips the check");
    assert_eq!(e.system_readings(), SystemReadings { load: None, cpu: None });
}

#[test]
fn checks_run_in_java_order() {
    let (e, _clock) = engine();
    e.set_system_readings(Some(100.0), Some(1.0));
    e.load_system_rules(vec![SystemRule {
        qps: Some(0.0),
        max_thread: Some(0),
        avg_rt: Some(0),
        highest_system_load: Some(1.0),
        highest_cpu_usage: Some(0.5),
        ..Default::default()
    }])
    .unwrap();
    let api = e.resource_typed("api", EntryType::In);
    assert!(matches!(limit_of(api.enter()), Some(SystemLimit::Qps { .. })));
    e.load_system_rules(vec![SystemRule { max_thread: Some(0), highest_cpu_usage: Some(0.5), ..Default::default() }])
        .unwrap();
    // No qps limit now; 0 threads is not over 0; the rt limit is unset; load unset; cpu 1.0 > 0.5 blocks.
    assert!(matches!(limit_of(api.enter()), Some(SystemLimit::Cpu { limit: 0.5, usage: 1.0 })));
}

#[test]
fn cpu_is_checked_last_after_passing_thread_and_rt() {
    let (e, _clock) = engine();
    e.set_system_readings(None, Some(1.0));
    e.load_system_rules(vec![SystemRule {
        max_thread: Some(0),
        avg_rt: Some(100),
        highest_cpu_usage: Some(0.5),
        ..Default::default()
    }])
    .unwrap();
    let api = e.resource_typed("api", EntryType::In);
    // No thread in flight and no rt: thread and rt pass; cpu blocks.
    assert!(matches!(limit_of(api.enter()), Some(SystemLimit::Cpu { .. })));
    e.set_system_readings(None, Some(0.1));
    let held = api.enter().unwrap();
    assert!(matches!(limit_of(api.enter()), Some(SystemLimit::Thread { limit: 0 })));
    drop(held);
}

#[test]
fn each_field_takes_the_minimum_over_rules() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![
        SystemRule { qps: Some(10.0), ..Default::default() },
        SystemRule { qps: Some(3.0), ..Default::default() },
        SystemRule { qps: Some(7.0), max_thread: Some(100), ..Default::default() },
    ])
    .unwrap();
    let api = e.resource_typed("api", EntryType::In);
    let passed = (0..10).filter(|_| api.enter().is_ok()).count();
    assert_eq!(passed, 3);
    assert_eq!(e.system_rules().len(), 3);
}

/// Java lets the last loaded rule decide whether checking is on; ours turns it on when any rule sets a field.
#[test]
fn any_rule_setting_a_field_turns_checking_on_unlike_java() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { qps: Some(1.0), ..Default::default() }, SystemRule::default()]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    assert!(api.enter().is_ok());
    assert!(api.enter().is_err(), "a trailing empty rule does not turn protection off");
    e.load_system_rules(vec![]).unwrap();
    assert!(api.enter().is_ok(), "no rules: checking off");
}

#[test]
fn invalid_values_are_rejected_and_the_old_rules_stay() {
    let (e, _clock) = engine();
    let good = SystemRule { qps: Some(1.0), ..Default::default() };
    e.load_system_rules(vec![good.clone()]).unwrap();
    let cases = [
        (SystemRule { highest_system_load: Some(-1.0), ..Default::default() }, "highest_system_load"),
        (SystemRule { highest_system_load: Some(f64::NAN), ..Default::default() }, "highest_system_load"),
        (SystemRule { highest_cpu_usage: Some(1.5), ..Default::default() }, "highest_cpu_usage"),
        (SystemRule { highest_cpu_usage: Some(-0.1), ..Default::default() }, "highest_cpu_usage"),
        (SystemRule { highest_cpu_usage: Some(f64::NAN), ..Default::default() }, "highest_cpu_usage"),
        (SystemRule { qps: Some(-5.0), ..Default::default() }, "qps"),
        (SystemRule { qps: Some(f64::INFINITY), ..Default::default() }, "qps"),
    ];
    for (bad, field) in cases {
        let err = e.load_system_rules(vec![good.clone(), bad.clone()]).unwrap_err();
        match err {
            RuleError::Invalid { kind: RuleKind::System, index: 1, field: f, .. } => assert_eq!(f, field, "{bad:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(e.system_rules(), vec![good]);
    let api = e.resource_typed("api", EntryType::In);
    assert!(api.enter().is_ok());
    assert!(api.enter().is_err());
}

#[test]
fn a_system_block_names_the_limit_and_counts_on_the_inbound_node() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { qps: Some(0.0), ..Default::default() }]).unwrap();
    let err = e.resource_typed("api", EntryType::In).entry().origin("appA").enter().unwrap_err();
    assert_eq!(err.kind_name(), "SystemBlockException");
    assert_eq!(err.origin(), "appA");
    assert!(err.to_string().contains("inbound qps over 0"), "{err}");
    assert_eq!(e.inbound_stats().block_qps, 1.0);
}

#[cfg(target_os = "linux")]
#[test]
fn the_sampler_runs_only_while_a_rule_needs_load_or_cpu() {
    let e = Sentinel::builder().manual_clock(ManualClock::at_millis(1_700_000_000_000)).build();
    assert!(!e.system_sampler_running());
    e.load_system_rules(vec![SystemRule { qps: Some(100.0), ..Default::default() }]).unwrap();
    assert!(!e.system_sampler_running(), "qps alone needs no sampler");
    e.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(0.99), ..Default::default() }]).unwrap();
    assert!(e.system_sampler_running());
    e.load_system_rules(vec![SystemRule { qps: Some(100.0), ..Default::default() }]).unwrap();
    assert!(!e.system_sampler_running(), "stopped when no rule needs it");
    e.load_system_rules(vec![SystemRule { highest_system_load: Some(1000.0), ..Default::default() }]).unwrap();
    assert!(e.system_sampler_running());
    e.set_system_readings(Some(0.5), Some(0.5));
    assert!(!e.system_sampler_running(), "fed readings replace the sampler");
    e.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(0.9), ..Default::default() }]).unwrap();
    assert!(!e.system_sampler_running());
    assert_eq!(e.system_readings(), SystemReadings { load: Some(0.5), cpu: Some(0.5) });
}

#[test]
fn cpu_usage_bounds_zero_and_one_are_valid() {
    let (e, _clock) = engine();
    e.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(0.0), ..Default::default() }]).unwrap();
    e.load_system_rules(vec![SystemRule { highest_cpu_usage: Some(1.0), ..Default::default() }]).unwrap();
    e.set_system_readings(None, Some(1.0));
    assert!(e.resource_typed("api", EntryType::In).enter().is_ok(), "usage 1.0 is never over a limit of 1.0");
    assert!(SystemRule::default().qps.is_none(), "unset fields are off");
}

/// The answers of an inbound call to `api` from `origin`, on the fast path and on the general path (a
/// prioritized call takes the general one; neither waits here).
fn answers(e: &Sentinel, origin: &str) -> [Result<(), String>; 2] {
    let api = e.resource_typed("api", EntryType::In);
    let kind = |r: Result<sentinel_runtime::Entry<'_>, BlockError>| match r {
        Ok(_) => Ok(()),
        Err(BlockError::System { limit, .. }) => Err(format!("system {limit:?}")),
        Err(BlockError::Authority { .. }) => Err("authority".to_string()),
        Err(other) => Err(format!("{other:?}")),
    };
    [kind(api.entry().origin(origin).enter()), kind(api.entry().origin(origin).prioritized(true).enter())]
}

#[test]
fn beside_a_resources_simple_rules_the_system_rules_answer_as_on_the_general_path_in_java_order() {
    use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
    use sentinel_runtime::circuit_breaker::{DegradeGrade, DegradeRule};
    use sentinel_runtime::flow::{FlowGrade, FlowRule};
    use sentinel_runtime::param_flow::ParamFlowRule;
    let (e, _clock) = engine();
    // Rules the fast path decides: a QPS and a thread-grade flow rule, a closed breaker, a hot-parameter rule
    // (no argument is passed), an authority black list.
    e.load_flow_rules([FlowRule::new("api").count(1e9), FlowRule::new("api").grade(FlowGrade::Thread).count(1.0)])
        .unwrap();
    e.load_degrade_rules([DegradeRule::new("api", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(10)]).unwrap();
    e.load_param_flow_rules([ParamFlowRule::new("api", 0).count(1e9)]).unwrap();
    e.load_authority_rules([AuthorityRule::new("api", "intruder", AuthorityStrategy::Black)]).unwrap();
    assert_eq!(answers(&e, "app"), [Ok(()), Ok(())]);

    // A limit of no call at all: both paths refuse with it; the authority list still answers first (order
    // -6000 before -5000).
    e.load_system_rules(vec![SystemRule { qps: Some(0.0), ..Default::default() }]).unwrap();
    let system = Err("system Qps { limit: 0.0 }".to_string());
    assert_eq!(answers(&e, "app"), [system.clone(), system]);
    assert_eq!(answers(&e, "intruder"), [Err("authority".into()), Err("authority".into())]);

    // The refused calls took nothing from the rules after the system slot: with the limit gone, the
    // thread-grade rule (a limit of one) admits one call in flight, then refuses the next.
    e.load_system_rules(vec![]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    let held = api.enter().expect("the thread-grade rule's one place is free");
    assert!(matches!(api.enter(), Err(BlockError::Flow { .. })));
    drop(held);

    // A thread limit, read on the fast path from the calls in flight on every inbound resource.
    e.load_system_rules(vec![SystemRule { max_thread: Some(0), ..Default::default() }]).unwrap();
    let other = e.resource_typed("other", EntryType::In);
    let other = other.enter().expect("no call in flight yet");
    assert_eq!(
        answers(&e, "app"),
        [Err("system Thread { limit: 0 }".into()), Err("system Thread { limit: 0 }".into())]
    );
    drop(other);
    assert_eq!(answers(&e, "app"), [Ok(()), Ok(())]);
}

#[test]
fn beside_an_adaptive_limit_and_a_flow_rule_the_system_rules_refuse_before_either_takes_anything() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    use sentinel_runtime::flow::{FlowGrade, FlowRule};
    let (e, _clock) = engine();
    // The fast path's copy that keeps what the checks take (an adaptive limit beside a flow rule), with the
    // system rules: a limit of one call in flight for each of the two resource rules.
    e.load_flow_rules([FlowRule::new("api").grade(FlowGrade::Thread).count(1.0)]).unwrap();
    e.load_adaptive_rules([AdaptiveRule::new("api").algorithm(AlgorithmKind::Vegas).limits(1, 1, 1)]).unwrap();
    e.load_system_rules(vec![SystemRule { qps: Some(0.0), ..Default::default() }]).unwrap();
    let api = e.resource_typed("api", EntryType::In);
    for _ in 0..3 {
        assert_eq!(limit_of(api.enter()), Some(SystemLimit::Qps { limit: 0.0 }));
    }
    // Nothing was taken: the one place of each rule is free.
    e.load_system_rules(vec![]).unwrap();
    let held = api.enter().expect("both rules have their place free");
    assert!(api.enter().is_err(), "a second call in flight is refused");
    drop(held);
    assert!(api.enter().is_ok());
}
