//! Hot-parameter rules (SPEC §8), with a manual clock.

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ClusterConfig, ControlBehavior, FlowGrade, FlowRule};
use sentinel_runtime::param_flow::{HotParam, ItemClass, ParamFlowItem, ParamFlowRule, ParamItemValue, ParamValue};
use sentinel_runtime::{BlockError, RuleError, RuleKind, Sentinel};

const T0: u64 = 1_700_000_000_000;

fn engine(rules: Vec<ParamFlowRule>) -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    let e = Sentinel::builder().manual_clock(clock.clone()).build();
    e.load_param_flow_rules(rules).unwrap();
    (e, clock)
}

/// One call with the given arguments; `Ok(())` or the blocked value's text.
fn call(e: &Sentinel, args: &[&dyn HotParam]) -> Result<(), String> {
    match e.resource("res").entry().args(args).enter() {
        Ok(_) => Ok(()),
        Err(BlockError::ParamFlow { value, .. }) => Err(value),
        Err(other) => panic!("unexpected block {other:?}"),
    }
}

fn passes(e: &Sentinel, n: usize, args: &[&dyn HotParam]) -> usize {
    (0..n).filter(|_| call(e, args).is_ok()).count()
}

#[test]
fn token_bucket_admits_count_per_value_and_refills_after_strictly_more_than_the_duration() {
    let (e, clock) = engine(vec![ParamFlowRule::new("res", 0).count(5.0)]);
    assert_eq!(passes(&e, 10, &[&1u64]), 5, "first sight leaves max - 1 = 4 tokens, 4 more pass");
    assert_eq!(passes(&e, 10, &[&2u64]), 5, "each value has its own bucket");
    clock.advance_millis(1000);
    assert_eq!(call(&e, &[&1u64]), Err("1".into()), "exactly the duration is not enough");
    clock.advance_millis(1);
    // 1001 ms: 1001 * 5 / 1000 = 5 tokens added.
    assert_eq!(passes(&e, 10, &[&1u64]), 5);
}

#[test]
fn partial_refill_adds_elapsed_times_count_over_duration() {
    // count 10, burst 10: max 20. After 20 passes, 1001 ms add 1001 * 10 / 1000 = 10 tokens: 10 pass.
    let (e, clock) = engine(vec![ParamFlowRule::new("res", 0).count(10.0).burst_count(10)]);
    assert_eq!(passes(&e, 30, &[&"k"]), 20);
    clock.advance_millis(1001);
    assert_eq!(passes(&e, 30, &[&"k"]), 10);
    // A long idle time refills only up to max = count + burst.
    clock.advance_millis(60_000);
    assert_eq!(passes(&e, 30, &[&"k"]), 20);
}

#[test]
fn burst_adds_to_the_first_window_and_the_cap() {
    let (e, clock) = engine(vec![ParamFlowRule::new("res", 0).count(5.0).burst_count(3)]);
    assert_eq!(passes(&e, 20, &[&7]), 8);
    clock.advance_millis(1001);
    assert_eq!(passes(&e, 20, &[&7]), 5, "refill adds count, not count + burst");
}

#[test]
fn duration_scales_the_refill_period() {
    // count 4 per 2 s: refill after > 2000 ms, 2001 * 4 / 2000 = 4 tokens.
    let (e, clock) = engine(vec![ParamFlowRule::new("res", 0).count(4.0).duration_in_sec(2)]);
    assert_eq!(passes(&e, 10, &[&1]), 4);
    clock.advance_millis(1500);
    assert_eq!(passes(&e, 10, &[&1]), 0);
    clock.advance_millis(501);
    assert_eq!(passes(&e, 10, &[&1]), 4);
    // 3000 ms: 3000 * 4 / 2000 = 6 tokens, capped at max 4.
    clock.advance_millis(3000);
    assert_eq!(passes(&e, 10, &[&1]), 4);
}

#[test]
fn acquire_takes_several_tokens_and_more_than_max_blocks() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(5.0)]);
    let r = e.resource("res");
    assert!(r.entry().acquire(6).args(&[&1]).enter().is_err(), "acquire > max blocks even on first sight");
    assert!(r.entry().acquire(3).args(&[&1]).enter().is_ok()); // first sight: 5 - 3 = 2 left
    assert!(r.entry().acquire(3).args(&[&1]).enter().is_err());
    assert!(r.entry().acquire(2).args(&[&1]).enter().is_ok());
    assert!(r.entry().acquire(1).args(&[&1]).enter().is_err());
}

#[test]
fn count_zero_blocks_every_value() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(0.0)]);
    assert_eq!(call(&e, &[&"x"]), Err("x".into()));
    assert_eq!(call(&e, &[&42]), Err("42".into()));
}

#[test]
fn fractional_count_is_truncated_like_java() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(2.9)]);
    assert_eq!(passes(&e, 10, &[&1]), 2);
}

#[test]
fn exception_items_have_their_own_count_and_match_by_type() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0)
        .count(1.0)
        .item(ParamItemValue::Int(7), 3.0)
        .item(ParamItemValue::Str("vip".into()), 4.0)
        .item(ParamItemValue::Str("banned".into()), 0.0)]);
    assert_eq!(passes(&e, 10, &[&7i32]), 3, "the integer 7 has its own count");
    assert_eq!(passes(&e, 10, &[&"7"]), 1, "the string \"7\" is another value, with the rule's count");
    assert_eq!(passes(&e, 10, &[&8i64]), 1);
    assert_eq!(passes(&e, 10, &[&"vip"]), 4);
    assert_eq!(passes(&e, 10, &[&String::from("banned")]), 0);
    assert_eq!(passes(&e, 10, &[&7.0f64]), 1, "the float 7.0 is not the integer 7");
}

/// An item's Java class (kept to be written back as pushed) does not change what it matches: a call's integer
/// argument carries no Java class, and an integer of any width is one value.
#[test]
fn an_items_java_class_does_not_change_what_it_matches() {
    for class in [ItemClass::Long, ItemClass::Short, ItemClass::Byte, ItemClass::Int] {
        let (e, clock) = engine(vec![ParamFlowRule::new("res", 0)
            .count(1.0)
            .with_item(ParamFlowItem::new(ParamItemValue::Int(7), 3.0).with_class(class))]);
        for arg in [&7i32 as &dyn HotParam, &7i64, &7u8, &7usize] {
            clock.advance_millis(2000);
            assert_eq!(passes(&e, 10, &[arg]), 3, "{class:?}: the item's count");
        }
        assert_eq!(passes(&e, 10, &[&"7"]), 1, "{class:?}: a string is another value");
    }
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0)
        .count(1.0)
        .with_item(ParamFlowItem::new(ParamItemValue::Float(2.5), 3.0).with_class(ItemClass::Float))]);
    assert_eq!(passes(&e, 10, &[&2.5f32]), 3);
}

#[test]
fn integers_of_any_width_are_one_value() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(3.0)]);
    assert!(call(&e, &[&7u8]).is_ok());
    assert!(call(&e, &[&7i64]).is_ok());
    assert!(call(&e, &[&7usize]).is_ok());
    assert_eq!(call(&e, &[&7u32]), Err("7".into()));
    assert!(call(&e, &[&u64::MAX]).is_ok(), "a u64 above i64::MAX is its own value, not -1");
    assert!(call(&e, &[&-1i64]).is_ok());
}

#[test]
fn bool_char_and_float_values() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(1.0).item(ParamItemValue::Bool(true), 2.0)]);
    assert_eq!(passes(&e, 5, &[&true]), 2);
    assert_eq!(passes(&e, 5, &[&false]), 1);
    assert_eq!(passes(&e, 5, &[&'c']), 1);
    assert_eq!(call(&e, &[&'c']), Err("c".into()));
    assert_eq!(passes(&e, 5, &[&1.5f32]), 1);
    assert_eq!(call(&e, &[&1.5f64]), Err("1.5".into()), "f32 1.5 and f64 1.5 are one value");
}

#[test]
fn negative_param_idx_counts_from_the_end() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", -1).count(1.0)]);
    assert!(call(&e, &[&"a", &"b"]).is_ok());
    assert_eq!(call(&e, &[&"x", &"b"]), Err("b".into()), "the last argument is limited");
    assert!(call(&e, &[&"b", &"c"]).is_ok(), "the first argument is not");
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", -2).count(1.0)]);
    assert!(call(&e, &[&"a", &"b"]).is_ok());
    assert_eq!(call(&e, &[&"a", &"z"]), Err("a".into()));
}

#[test]
fn absent_values_and_missing_arguments_pass() {
    let (e, _clock) = engine(vec![
        ParamFlowRule::new("res", 0).count(0.0),
        ParamFlowRule::new("res", 3).count(0.0),
        ParamFlowRule::new("res", -4).count(0.0),
    ]);
    let none: Option<&str> = None;
    for _ in 0..5 {
        assert!(call(&e, &[&none]).is_ok(), "None is absent");
        assert!(call(&e, &[]).is_ok(), "no arguments");
        assert!(call(&e, &[&Vec::<u32>::new()]).is_ok(), "an empty collection has no value");
    }
    assert_eq!(call(&e, &[&Some("x")]), Err("x".into()), "Some(x) is x");
}

#[test]
fn collections_check_each_element() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(1.0)]);
    assert!(call(&e, &[&vec![1, 2, 3]]).is_ok());
    assert_eq!(call(&e, &[&vec![4, 2]]), Err("2".into()), "any element over its limit blocks");
    assert_eq!(call(&e, &[&[5]]), Ok(()));
    let set: HashSet<&str> = ["a"].into_iter().collect();
    assert!(call(&e, &[&set]).is_ok());
    assert_eq!(call(&e, &[&&["a"][..]]), Err("a".into()));
    assert_eq!(call(&e, &[&[Some(6), None]]), Ok(()));
    assert_eq!(call(&e, &[&6]), Err("6".into()));
}

#[test]
fn user_types_can_be_hot_parameters() {
    struct Order {
        customer: String,
        #[allow(dead_code)]
        amount: u64,
    }
    impl HotParam for Order {
        fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
            f(ParamValue::Str(&self.customer))
        }
    }
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(2.0)]);
    let o = Order { customer: "acme".into(), amount: 10 };
    assert_eq!(passes(&e, 5, &[&o]), 2);
    assert_eq!(call(&e, &[&o]), Err("acme".into()));
}

#[test]
fn block_error_carries_rule_value_and_origin() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(0.0)]);
    let err = e.resource("res").entry().origin("appA").args(&[&"alice"]).enter().unwrap_err();
    match &err {
        BlockError::ParamFlow { resource, rule, value, origin, .. } => {
            assert_eq!(&**resource, "res");
            assert_eq!(rule.param_idx, 0);
            assert_eq!(value, "alice");
            assert_eq!(&**origin, "appA");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.kind_name(), "ParamFlowException");
    assert!(err.to_string().contains("value alice"), "{err}");
}

#[test]
fn several_rules_on_one_resource_all_apply() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(3.0), ParamFlowRule::new("res", 1).count(1.0)]);
    assert!(call(&e, &[&"u1", &"r1"]).is_ok());
    assert_eq!(call(&e, &[&"u1", &"r1"]), Err("r1".into()));
    assert!(call(&e, &[&"u1", &"r2"]).is_ok());
}

#[test]
fn rate_limiter_spaces_calls_per_value() {
    // count 10 per 1 s: one call per 100 ms per value; no queueing (max_queueing_time_ms 0).
    let (e, clock) =
        engine(vec![ParamFlowRule::new("res", 0).count(10.0).control_behavior(ControlBehavior::RateLimiter)]);
    assert!(call(&e, &[&1]).is_ok());
    assert!(call(&e, &[&1]).is_err());
    assert!(call(&e, &[&2]).is_ok(), "another value has its own spacing");
    clock.advance_millis(99);
    assert!(call(&e, &[&1]).is_err());
    clock.advance_millis(1);
    assert!(call(&e, &[&1]).is_ok());
}

#[test]
fn rate_limiter_queues_strictly_less_than_the_queueing_time() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0)
        .count(10.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(500)]);
    let r = e.resource("res");
    let waits: Vec<Option<u64>> =
        (0..7).map(|_| r.entry().args(&[&"k"]).enter().ok().map(|en| en.waited().as_millis() as u64)).collect();
    // 0, then 100, 200, 300, 400 ms; a wait of 500 is not < 500: blocked.
    assert_eq!(waits, vec![Some(0), Some(100), Some(200), Some(300), Some(400), None, None]);
}

#[test]
fn rate_limiter_cost_scales_with_duration_and_acquire() {
    // cost = 1000 * acquire * duration / count = 1000 * 2 * 2 / 10 = 400 ms.
    let (e, clock) = engine(vec![ParamFlowRule::new("res", 0)
        .count(10.0)
        .duration_in_sec(2)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(1000)]);
    let r = e.resource("res");
    assert_eq!(r.entry().acquire(2).args(&[&1]).enter().unwrap().waited(), Duration::ZERO);
    assert_eq!(r.entry().acquire(2).args(&[&1]).enter().unwrap().waited(), Duration::from_millis(400));
    assert_eq!(r.entry().acquire(2).args(&[&1]).enter().unwrap().waited(), Duration::from_millis(800));
    assert!(r.entry().acquire(2).args(&[&1]).enter().is_err(), "1200 ms is over the queue");
    clock.advance_millis(2000);
    assert_eq!(r.entry().acquire(2).args(&[&1]).enter().unwrap().waited(), Duration::ZERO);
}

#[test]
fn rate_limiter_with_count_zero_blocks() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0)
        .count(0.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(1000)]);
    assert!(call(&e, &[&1]).is_err());
}

#[test]
fn thread_grade_limits_calls_in_flight_per_value() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(2.0)]);
    let r = e.resource("res");
    let a = r.entry().args(&[&"u1"]).enter().unwrap();
    let b = r.entry().args(&[&"u1"]).enter().unwrap();
    assert!(r.entry().args(&[&"u1"]).enter().is_err());
    let c = r.entry().args(&[&"u2"]).enter().expect("another value");
    drop(a);
    let d = r.entry().args(&[&"u1"]).enter().expect("a permit was released at exit");
    assert!(r.entry().args(&[&"u1"]).enter().is_err());
    drop((b, c, d));
    let held: Vec<_> = (0..2).map(|_| r.entry().args(&[&"u1"]).enter().unwrap()).collect();
    assert_eq!(held.len(), 2);
}

#[test]
fn thread_grade_items_and_collections() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0)
        .grade(FlowGrade::Thread)
        .count(1.0)
        .item(ParamItemValue::Int(9), 2.0)]);
    let r = e.resource("res");
    let a = r.entry().args(&[&vec![9, 1]]).enter().unwrap();
    // 1 is at its limit: a call holding 9 and 1 again blocks, and gives back the permit it took on 9.
    assert!(r.entry().args(&[&vec![9, 1]]).enter().is_err());
    let b = r.entry().args(&[&9]).enter().expect("9 has 1 of 2 in flight");
    assert!(r.entry().args(&[&9]).enter().is_err());
    drop((a, b));
    assert!(r.entry().args(&[&vec![9, 1]]).enter().is_ok());
}

#[test]
fn thread_permit_is_released_when_a_later_slot_blocks() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(1.0)]);
    e.load_flow_rules(vec![FlowRule::new("res").count(0.0)]).unwrap();
    for _ in 0..3 {
        let err = e.resource("res").entry().args(&[&"u"]).enter().unwrap_err();
        assert!(matches!(err, BlockError::Flow { .. }), "param passes, flow blocks: {err:?}");
    }
    e.load_flow_rules(vec![]).unwrap();
    let r = e.resource("res");
    let held = r.entry().args(&[&"u"]).enter().expect("no permit leaked");
    assert!(r.entry().args(&[&"u"]).enter().is_err());
    drop(held);
}

#[test]
fn forty_threads_at_once_on_one_value_with_count_five_admit_exactly_five() {
    for round in 0..20u64 {
        let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(5.0)]);
        let e = Arc::new(e);
        let barrier = Arc::new(Barrier::new(40));
        let handles: Vec<_> = (0..40)
            .map(|_| {
                let (e, barrier) = (e.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    e.resource("res").entry().args(&[&round]).enter().is_ok()
                })
            })
            .collect();
        let passed = handles.into_iter().map(|h| h.join().unwrap()).filter(|ok| *ok).count();
        assert_eq!(passed, 5, "round {round}");
    }
}

#[test]
fn forty_threads_on_a_thread_grade_value_never_exceed_the_limit() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(5.0)]);
    let e = Arc::new(e);
    let barrier = Arc::new(Barrier::new(40));
    let handles: Vec<_> = (0..40)
        .map(|_| {
            let (e, barrier) = (e.clone(), barrier.clone());
            std::thread::spawn(move || {
                let r = e.resource("res");
                barrier.wait();
                let entry = r.entry().args(&[&"hot"]).enter();
                let ok = entry.is_ok();
                barrier.wait(); // hold the permits until everyone decided
                drop(entry);
                ok
            })
        })
        .collect();
    let passed = handles.into_iter().map(|h| h.join().unwrap()).filter(|ok| *ok).count();
    assert_eq!(passed, 5);
}

#[test]
fn a_million_distinct_values_never_exceed_the_counter_cap() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(1.0)]);
    let r = e.resource("res");
    let (_, cap) = e.param_flow_tracked("res")[0];
    assert!(cap <= 4000, "min(4000 * 1, 200000)");
    for v in 0..1_000_000u64 {
        let entry = r.entry().args(&[&v]).enter();
        assert!(entry.is_ok(), "first sight of {v} passes");
        if v % 50_000 == 0 {
            let (tracked, _) = e.param_flow_tracked("res")[0];
            assert!(tracked <= cap, "{tracked} > {cap} after {v}");
        }
    }
    let (tracked, cap) = e.param_flow_tracked("res")[0];
    assert!(tracked <= cap && tracked > cap / 2, "tracked {tracked}, cap {cap}");
}

#[test]
fn reloading_an_equal_rule_keeps_its_counters_and_a_changed_rule_starts_fresh() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(2.0)]);
    assert_eq!(passes(&e, 5, &[&1]), 2);
    e.load_param_flow_rules(vec![ParamFlowRule::new("res", 0).count(2.0)]).unwrap();
    assert_eq!(passes(&e, 5, &[&1]), 0, "same rule: same buckets");
    e.load_param_flow_rules(vec![ParamFlowRule::new("res", 0).count(3.0)]).unwrap();
    assert_eq!(passes(&e, 5, &[&1]), 3, "a new rule has fresh buckets");
    e.load_param_flow_rules(vec![]).unwrap();
    assert_eq!(passes(&e, 5, &[&1]), 5, "no rule: no limit");
}

#[test]
fn thread_permits_go_back_to_the_rule_that_gave_them_whatever_was_reloaded_while_their_calls_ran() {
    let thread_rule = |count: f64| ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(count);
    let (e, _clock) = engine(vec![thread_rule(1.0)]);
    let r = e.resource("res");

    // The same rule reloaded, with another rule beside it: the permit goes back to the rule that stayed.
    let held = r.entry().args(&[&"u"]).enter().unwrap();
    e.load_param_flow_rules(vec![ParamFlowRule::new("res", 0).count(1_000.0), thread_rule(1.0)]).unwrap();
    assert!(r.entry().args(&[&"u"]).enter().is_err(), "the rule kept its counters: u is in flight");
    drop(held);
    drop(r.entry().args(&[&"u"]).enter().expect("the permit went back to the rule that stayed"));

    // A changed rule starts fresh, and the permit of the old one takes nothing from it.
    let old = r.entry().args(&[&"u"]).enter().unwrap();
    e.load_param_flow_rules(vec![thread_rule(2.0)]).unwrap();
    let a = r.entry().args(&[&"u"]).enter().expect("a fresh rule");
    let b = r.entry().args(&[&"u"]).enter().expect("two in flight under the new rule");
    assert!(r.entry().args(&[&"u"]).enter().is_err());
    drop(old);
    assert!(r.entry().args(&[&"u"]).enter().is_err(), "the old permit took nothing from the new rule");
    drop((a, b));

    // The rule removed while a call holds a permit, then loaded again: it starts fresh.
    let gone = r.entry().args(&[&"u"]).enter().unwrap();
    e.load_param_flow_rules(vec![]).unwrap();
    drop(gone);
    e.load_param_flow_rules(vec![thread_rule(1.0)]).unwrap();
    let again = r.entry().args(&[&"u"]).enter().expect("a fresh rule");
    assert!(r.entry().args(&[&"u"]).enter().is_err());
    drop(again);
    drop(r.entry().args(&[&"u"]).enter().expect("given back"));
}

#[test]
fn invalid_rules_are_rejected_and_the_old_rules_stay() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(1.0)]);
    let cases: Vec<(ParamFlowRule, &str)> = vec![
        (ParamFlowRule::new(" ", 0).count(1.0), "resource"),
        (ParamFlowRule::new("res", 0).count(-1.0), "count"),
        (ParamFlowRule::new("res", 0).count(f64::NAN), "count"),
        (ParamFlowRule::new("res", 0).count(1.0).duration_in_sec(0), "duration_in_sec"),
        (ParamFlowRule::new("res", 0).count(1.0).control_behavior(ControlBehavior::WarmUp), "control_behavior"),
        (
            ParamFlowRule::new("res", 0).count(1.0).control_behavior(ControlBehavior::WarmUpRateLimiter),
            "control_behavior",
        ),
        (ParamFlowRule::new("res", 0).count(1.0).item(ParamItemValue::Int(1), -2.0), "items.count"),
        (ParamFlowRule { cluster_mode: true, ..ParamFlowRule::new("res", 0).count(1.0) }, "cluster_config"),
    ];
    for (bad, field) in cases {
        let err = e.load_param_flow_rules(vec![ParamFlowRule::new("ok", 0), bad.clone()]).unwrap_err();
        match err {
            RuleError::Invalid { kind: RuleKind::ParamFlow, index: 1, field: f, .. } => assert_eq!(f, field, "{bad:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(e.param_flow_rules(), vec![ParamFlowRule::new("res", 0).count(1.0)]);
    assert_eq!(passes(&e, 3, &[&1]), 1);
}

#[test]
fn rules_apply_to_their_own_resource_only() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(0.0)]);
    assert!(e.resource("other").entry().args(&[&1]).enter().is_ok());
}

#[test]
fn rule_defaults_match_java() {
    let r = ParamFlowRule::default();
    assert_eq!(r.grade, FlowGrade::Qps);
    assert_eq!(r.control_behavior, ControlBehavior::Reject);
    assert_eq!(r.max_queueing_time_ms, 0);
    assert_eq!(r.burst_count, 0);
    assert_eq!(r.duration_in_sec, 1);
    assert_eq!(r.limit_app, "default");
    assert!(r.items.is_empty());
    assert_eq!(sentinel_runtime::param_flow::counter_capacity(r.duration_in_sec), 4000);
}

#[test]
fn a_cluster_mode_thread_rule_is_checked_locally_as_in_java() {
    // Java's `ParamFlowChecker.passCheck` asks a token service for QPS rules only: a thread-grade rule in
    // cluster mode is checked locally, fallback or not.
    let config = ClusterConfig::default().flow_id(7).fallback_to_local_when_fail(false);
    let (e, _clock) =
        engine(vec![ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(1.0).cluster(config.clone())]);
    let r = e.resource("res");
    let held = r.entry().args(&[&"u"]).enter().unwrap();
    assert!(r.entry().args(&[&"u"]).enter().is_err(), "u is in flight: the thread rule applies locally");
    drop(held);
    drop(r.entry().args(&[&"u"]).enter().expect("the permit went back"));
    // A QPS rule in cluster mode without a fallback passes, as in Java with no token service.
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(0.0).cluster(config)]);
    assert_eq!(passes(&e, 3, &[&"u"]), 3);
}

#[test]
fn a_value_repeated_in_one_call_is_one_call_in_flight() {
    // Java reads each element's calls in flight before the call is counted: a call whose list holds a value
    // twice passes when nothing is in flight, and then holds that value.
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(1.0)]);
    let r = e.resource("res");
    let held = r.entry().args(&[&vec![5, 5]]).enter().expect("nothing in flight");
    assert!(r.entry().args(&[&5]).enter().is_err(), "5 is in flight");
    assert!(r.entry().args(&[&[6, 7, 6]]).enter().is_ok());
    drop(held);
    drop(r.entry().args(&[&5]).enter().expect("given back"));
    let held = r.entry().args(&[&[8, 9, 10, 8, 10]]).enter().expect("nothing in flight");
    assert!(r.entry().args(&[&8]).enter().is_err(), "8 is in flight");
    drop(held);
    drop(r.entry().args(&[&8]).enter().expect("given back"));
    // The QPS grade spends a token per element, as in Java.
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).count(1.0)]);
    assert_eq!(call(&e, &[&vec![5, 5]]), Err("5".into()));
}

#[cfg(feature = "serde")]
#[test]
fn a_float_item_matches_an_f32_argument_as_a_java_float_does() {
    use sentinel_runtime::datasource::{parse_rules, Format};
    let rules = parse_rules::<ParamFlowRule>(
        r#"[{"resource": "res", "paramIdx": 0, "count": 1, "paramFlowItemList": [
            {"object": "1.1", "count": 3, "classType": "float"},
            {"object": "2.2", "count": 3, "classType": "java.lang.Float"},
            {"object": "3.3", "count": 3, "classType": "double"}]}]"#,
        Format::Json,
    )
    .unwrap();
    let (e, _clock) = engine(rules);
    assert_eq!(passes(&e, 5, &[&1.1f32]), 3, "Float.parseFloat(\"1.1\") is the f32 1.1");
    assert_eq!(passes(&e, 5, &[&2.2f32]), 3);
    assert_eq!(passes(&e, 5, &[&3.3f64]), 3);
    assert_eq!(passes(&e, 5, &[&1.1f64]), 1, "the double 1.1 is not the float 1.1 (Double.equals(Float) is false)");
}

#[test]
fn cluster_config_is_validated_as_in_java() {
    // Java's `ParamFlowRuleUtil.checkCluster`: a flow id > 0 and a window split into equal buckets.
    let (e, _clock) = engine(vec![]);
    let base = ClusterConfig::default().flow_id(1);
    for (config, field) in [
        (ClusterConfig { flow_id: Some(0), ..base.clone() }, "cluster_config.flow_id"),
        (ClusterConfig { sample_count: 0, ..base.clone() }, "cluster_config.sample_count"),
        (ClusterConfig { window_interval_ms: 0, ..base.clone() }, "cluster_config.window_interval_ms"),
        (
            ClusterConfig { window_interval_ms: 1000, sample_count: 3, ..base.clone() },
            "cluster_config.window_interval_ms",
        ),
    ] {
        let rule = ParamFlowRule::new("res", 0).count(1.0).cluster(config);
        match e.load_param_flow_rules(vec![rule.clone()]) {
            Err(RuleError::Invalid { kind: RuleKind::ParamFlow, field: f, .. }) => assert_eq!(f, field, "{rule:?}"),
            other => panic!("expected an error on {field}: {other:?}"),
        }
    }
    e.load_param_flow_rules(vec![ParamFlowRule::new("res", 0).count(1.0).cluster(base)]).unwrap();
}

#[test]
fn the_waits_of_several_rate_limiter_rules_overlap() {
    // Java sleeps in the first rule's check, so the second rule is checked after that wait: a call waits
    // the longer of the two waits, not their sum.
    let rl = |idx| {
        ParamFlowRule::new("res", idx)
            .count(10.0)
            .control_behavior(ControlBehavior::RateLimiter)
            .max_queueing_time_ms(1000)
    };
    let (e, _clock) = engine(vec![rl(0), rl(1)]);
    let r = e.resource("res");
    let waited = |a: &str, b: &str| r.entry().args(&[&a, &b]).enter().map(|en| en.waited().as_millis() as u64).ok();
    assert_eq!(waited("a", "x"), Some(0));
    assert_eq!(waited("a", "x"), Some(100));
    assert_eq!(waited("a", "x"), Some(200));
    assert_eq!(waited("b", "x"), Some(300), "x's spacing alone");
    assert_eq!(waited("a", "y"), Some(300), "a's spacing alone");
}

#[test]
fn a_flow_rate_limiter_after_a_hot_parameter_wait_is_checked_when_that_wait_ends() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0)
        .count(10.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(1000)]);
    e.load_flow_rules(vec![FlowRule::new("res")
        .count(10.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(1000)])
        .unwrap();
    let r = e.resource("res");
    let waited = || r.entry().args(&[&"a"]).enter().map(|en| en.waited().as_millis() as u64).ok();
    assert_eq!(waited(), Some(0));
    assert_eq!(waited(), Some(100), "Java: the param slot sleeps 100 ms, then the flow rule's turn has come");
    assert_eq!(waited(), Some(200));
}

/// A call another value, rule or check refuses gives back the tokens its values took (Java keeps them, so a
/// caller refused for someone else's limit loses its own budget), on the fast path and on the general path.
#[test]
fn tokens_a_refused_call_took_go_back_whatever_refused_it() {
    use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
    for general in [false, true] {
        let (e, _clock) = engine(vec![ParamFlowRule::new("r", 0).count(1.0), ParamFlowRule::new("r", 1).count(1.0)]);
        if general {
            // Lets everyone through, and sends the calls down the general path.
            e.load_authority_rules([AuthorityRule::new("r", "nobody", AuthorityStrategy::Black)]).unwrap();
        }
        let r = e.resource("r");
        let call = |user: &str, ip: &str| r.entry().args(&[&user, &ip]).enter().map(drop);
        assert!(call("u1", "ip1").is_ok());
        // The second rule refuses ip1: u2's token goes back.
        assert!(matches!(call("u2", "ip1"), Err(BlockError::ParamFlow { ref value, .. }) if value == "ip1"));
        assert!(call("u2", "ip2").is_ok(), "general path: {general}");
        // A collection: the value refused after another gives the other's token back.
        let list = |users: Vec<&'static str>| r.entry().args(&[&users, &"ip3"]).enter().map(drop);
        assert!(list(vec!["u3", "u1"]).is_err(), "u1 is spent");
        assert!(list(vec!["u3"]).is_ok(), "u3's token came back; general path: {general}");
        // A later check (a flow rule) refuses the call: its values' tokens go back.
        e.load_flow_rules([FlowRule::new("r").count(0.0)]).unwrap();
        assert!(matches!(call("u4", "ip4"), Err(BlockError::Flow { .. })));
        e.load_flow_rules([]).unwrap();
        assert!(call("u4", "ip4").is_ok(), "general path: {general}");
    }
}

/// Java's `ParameterMetric.addThreadCount` adds one per element once the call passes: a call whose list holds a
/// value twice counts twice on it while in flight (each element was checked against the count before the
/// call, so the call itself passes).
#[test]
fn a_value_repeated_in_one_call_counts_once_per_element_while_in_flight() {
    let (e, _clock) = engine(vec![ParamFlowRule::new("res", 0).grade(FlowGrade::Thread).count(2.0)]);
    let r = e.resource("res");
    let held = r.entry().args(&[&vec![5, 5]]).enter().expect("nothing in flight");
    assert!(r.entry().args(&[&5]).enter().is_err(), "5 is counted twice: 2 + 1 > 2");
    drop(held);
    let a = r.entry().args(&[&5]).enter().expect("both given back");
    let b = r.entry().args(&[&5]).enter().expect("1 + 1 <= 2");
    drop((a, b));
}

/// A call that waits for an adaptive place and is then decided again takes one slot of a hot-parameter rate
/// limiter, not one per decision: the slot its first decision took goes back.
#[test]
fn a_call_decided_again_after_an_adaptive_wait_takes_one_slot_of_a_value() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, _clock) = engine(vec![ParamFlowRule::new("db", 0)
        .count(10.0)
        .control_behavior(ControlBehavior::RateLimiter)
        .max_queueing_time_ms(1000)]);
    engine
        .load_adaptive_rules([AdaptiveRule::new("db").algorithm(AlgorithmKind::Aimd).limits(1, 1, 1).max_wait_ms(1000)])
        .unwrap();
    let db = engine.resource("db");
    let held = db.entry().args(&[&"k"]).enter().unwrap();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.resource("db").entry().args(&[&"k"]).enter().map(|e| e.waited()))
    };
    while engine.adaptive_status()[0].waiting == 0 {
        std::thread::yield_now();
    }
    drop(held);
    let waited = waiter.join().unwrap().expect("the freed place");
    assert_eq!(waited, Duration::from_millis(100), "the slot after the first call's");
    assert_eq!(db.entry().args(&[&"k"]).enter().unwrap().waited(), Duration::from_millis(200), "the next slot");
}

/// A call that waits for an adaptive place and is then decided again spends one token of a value's bucket,
/// not one per decision: the token its first decision spent goes back.
#[test]
fn a_call_decided_again_after_an_adaptive_wait_spends_one_token_of_a_value() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, _clock) = engine(vec![ParamFlowRule::new("db", 0).count(3.0)]);
    engine
        .load_adaptive_rules([AdaptiveRule::new("db").algorithm(AlgorithmKind::Aimd).limits(1, 1, 1).max_wait_ms(1000)])
        .unwrap();
    let db = engine.resource("db");
    let held = db.entry().args(&[&"k"]).enter().unwrap();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.resource("db").entry().args(&[&"k"]).enter().map(drop).is_ok())
    };
    while engine.adaptive_status()[0].waiting == 0 {
        std::thread::yield_now();
    }
    drop(held);
    assert!(waiter.join().unwrap(), "the freed place");
    assert!(db.entry().args(&[&"k"]).enter().is_ok(), "the third of 3 tokens");
    assert!(db.entry().args(&[&"k"]).enter().is_err(), "3 spent");
}
