//! The common case (one simple flow rule, local hot-parameter rules, their thread-grade permits included, an
//! adaptive limit, alone or beside them, closed breakers, nothing else) is decided without the general check
//! path; these tests pin that both paths agree: same window, same order of checks, same errors.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use sentinel_runtime::authority::{AuthorityRule, AuthorityStrategy};
use sentinel_runtime::circuit_breaker::{BreakerState, DegradeGrade, DegradeRule};
use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::{ControlBehavior, FlowGrade, FlowRule};
use sentinel_runtime::param_flow::{HotParam, ParamFlowRule, ParamValue};
use sentinel_runtime::{BlockError, Sentinel};

const T0: u64 = 1_700_000_000_000;

fn engine() -> (Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(T0);
    (Sentinel::builder().manual_clock(clock.clone()).build(), clock)
}

#[test]
fn prioritized_and_plain_calls_share_one_exact_window() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("api").count(3.0)]).unwrap();
    let api = engine.resource("api");
    drop(api.enter().unwrap()); // the fast path
    drop(api.entry().prioritized(true).decide().unwrap()); // the general path, with room left: a plain pass
    drop(api.enter().unwrap());
    match api.enter() {
        Err(BlockError::Flow { rule, .. }) => assert_eq!(rule.count, 3.0),
        other => panic!("the fourth call must be blocked by the flow rule, got {other:?}"),
    }
    assert_eq!(engine.cluster_stats("api").unwrap().pass_qps, 3.0);
    assert_eq!(engine.cluster_stats("api").unwrap().block_qps, 1.0);
}

#[test]
fn a_flow_rule_is_checked_before_an_open_breaker_on_both_paths() {
    let (engine, clock) = engine();
    engine.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    let breaker = DegradeRule::new("api", DegradeGrade::ErrorCount).count(0.0).min_request_amount(1).time_window_sec(5);
    engine.load_degrade_rules([breaker]).unwrap();
    let api = engine.resource("api");
    {
        let mut e = api.enter().unwrap(); // closed breaker: the fast path
        e.set_error();
    }
    assert_eq!(engine.circuit_breakers("api")[0].state, BreakerState::Open);
    // The flow window is used up and the breaker is open: the flow rule blocks first (Java's slot order).
    assert!(matches!(api.enter(), Err(BlockError::Flow { .. })));
    clock.advance_millis(1_000);
    // A new window: the flow rule passes, the open breaker blocks.
    assert!(matches!(api.enter(), Err(BlockError::Degrade { .. })));
    // After the retry time one probe goes through; its success closes the breaker.
    clock.advance_millis(5_000);
    drop(api.enter().unwrap());
    assert_eq!(engine.circuit_breakers("api")[0].state, BreakerState::Closed);
    clock.advance_millis(1_000);
    drop(api.enter().unwrap()); // closed again: the fast path
}

#[test]
fn a_breaker_without_flow_rules_counts_every_call_on_the_fast_path() {
    let (engine, _clock) = engine();
    let rule = DegradeRule::new("db", DegradeGrade::ErrorCount).count(2.0).min_request_amount(1).time_window_sec(5);
    engine.load_degrade_rules([rule]).unwrap();
    let db = engine.resource("db");
    for _ in 0..3 {
        let mut e = db.enter().unwrap();
        e.set_error();
    }
    assert_eq!(engine.circuit_breakers("db")[0].state, BreakerState::Open, "the third error is above 2");
    assert!(matches!(db.enter(), Err(BlockError::Degrade { .. })));
}

#[test]
fn a_blocked_fast_path_call_names_the_rule_resource_and_origin() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("pay").count(0.0)]).unwrap();
    match engine.resource("pay").entry().origin("shop").enter() {
        Err(BlockError::Flow { resource, rule, origin, .. }) => {
            assert_eq!(&*resource, "pay");
            assert_eq!(rule.resource, "pay");
            assert_eq!(&*origin, "shop");
        }
        other => panic!("expected a flow block, got {other:?}"),
    }
}

/// The grade of the flow rule that blocked `r`, or `None` when it passed.
fn flow_block_grade<T>(r: Result<T, BlockError>) -> Option<FlowGrade> {
    match r {
        Ok(_) => None,
        Err(BlockError::Flow { rule, .. }) => Some(rule.grade),
        Err(other) => panic!("expected a flow block or a pass, got {other:?}"),
    }
}

#[test]
fn a_thread_grade_rule_on_the_fast_path_holds_its_permit_until_exit_and_shares_it_with_the_general_path() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("api").grade(FlowGrade::Thread).count(2.0)]).unwrap();
    let api = engine.resource("api");
    let first = api.enter().unwrap(); // the fast path
    let second = api.entry().prioritized(true).decide().unwrap(); // the general path
    assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Thread), "two in flight: the third is refused");
    assert_eq!(flow_block_grade(api.entry().prioritized(true).decide()), Some(FlowGrade::Thread));
    drop(second);
    let third = api.enter().unwrap();
    drop((first, third));
    let both: Vec<_> = (0..2).map(|_| api.enter().unwrap()).collect();
    assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Thread), "every exit gave its permit back, once");
    drop(both);
    assert_eq!(engine.cluster_stats("api").unwrap().block_qps, 3.0);
}

#[test]
fn with_a_qps_and_a_thread_rule_the_first_to_refuse_names_the_block_and_what_the_other_took_goes_back() {
    // The QPS rule first: a call the thread rule refuses gives its QPS reservation back.
    let (engine, clock) = engine();
    let qps = FlowRule::new("api").count(3.0);
    let threads = FlowRule::new("api").grade(FlowGrade::Thread).count(1.0);
    engine.load_flow_rules([qps.clone(), threads.clone()]).unwrap();
    let api = engine.resource("api");
    let held = api.enter().unwrap();
    for _ in 0..5 {
        assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Thread));
    }
    drop(held);
    drop(api.enter().unwrap());
    drop(api.enter().unwrap());
    assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Qps), "three passed: the refused calls took none");
    assert_eq!(engine.cluster_stats("api").unwrap().pass_qps, 3.0);
    // A call the QPS rule refused took no permit: in the next window one call is in flight again.
    clock.advance_millis(1_000);
    let again = api.enter().unwrap();
    assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Thread));
    drop(again);

    // The thread rule first: a call the QPS rule refuses gives its permit back.
    let (engine, clock) = self::engine();
    engine.load_flow_rules([threads.count(1.0), qps.count(1.0)]).unwrap();
    let api = engine.resource("api");
    drop(api.enter().unwrap());
    for _ in 0..3 {
        assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Qps));
    }
    clock.advance_millis(1_000);
    let held = api.enter().expect("no permit was kept by the refused calls");
    assert_eq!(flow_block_grade(api.enter()), Some(FlowGrade::Thread), "the thread rule is checked first");
    drop(held);
}

#[test]
fn a_thread_grade_rule_beside_a_closed_breaker_limits_calls_in_flight_and_the_breaker_still_counts_every_call() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("db").grade(FlowGrade::Thread).count(1.0)]).unwrap();
    let rule = DegradeRule::new("db", DegradeGrade::ErrorCount).count(1.0).min_request_amount(1).time_window_sec(5);
    engine.load_degrade_rules([rule]).unwrap();
    let db = engine.resource("db");
    for _ in 0..2 {
        let mut e = db.enter().unwrap();
        assert_eq!(flow_block_grade(db.enter()), Some(FlowGrade::Thread));
        e.set_error();
    }
    assert_eq!(engine.circuit_breakers("db")[0].state, BreakerState::Open, "the second error is above 1");
    assert!(matches!(db.enter(), Err(BlockError::Degrade { .. })));
}

#[test]
fn authority_lists_on_the_fast_path_refuse_listed_origins_before_any_other_rule() {
    let (engine, _clock) = engine();
    engine.load_authority_rules([AuthorityRule::new("api", "crawler", AuthorityStrategy::Black)]).unwrap();
    engine.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    let api = engine.resource("api");
    drop(api.entry().origin("shop").enter().unwrap());
    // The flow window is used up; the listed origin is still refused by its list first (Java's slot order).
    match api.entry().origin("crawler").enter() {
        Err(BlockError::Authority { origin, rule, .. }) => {
            assert_eq!(&*origin, "crawler");
            assert_eq!(rule.strategy, AuthorityStrategy::Black);
        }
        other => panic!("expected the black list to refuse, got {other:?}"),
    }
    assert!(matches!(api.entry().origin("shop").enter(), Err(BlockError::Flow { .. })));
    assert!(matches!(api.enter(), Err(BlockError::Flow { .. })), "no origin: the lists pass it");
    // The same on the general path (a prioritized call).
    assert!(matches!(api.entry().origin("crawler").prioritized(true).decide(), Err(BlockError::Authority { .. })));
    // A white list admits only its members.
    engine.load_authority_rules([AuthorityRule::new("api", "shop", AuthorityStrategy::White)]).unwrap();
    assert!(matches!(api.entry().origin("crawler").enter(), Err(BlockError::Authority { .. })));
    assert!(matches!(api.entry().origin("shop").enter(), Err(BlockError::Flow { .. })));
}

#[test]
fn warm_up_and_rate_limiter_rules_decide_on_the_fast_path_as_on_the_general_path() {
    // Two engines on clocks that move alike: calls on one take the fast path (`enter`), on the other the
    // general path (a prioritized call, which these behaviours decide as any other). Every decision and every
    // wait must be the same.
    for behavior in [ControlBehavior::WarmUp, ControlBehavior::RateLimiter, ControlBehavior::WarmUpRateLimiter] {
        for with_threads in [false, true] {
            let mut rules = vec![FlowRule::new("api").count(20.0).control_behavior(behavior).max_queueing_time_ms(200)];
            if with_threads {
                rules.insert(0, FlowRule::new("api").grade(FlowGrade::Thread).count(5.0));
            }
            let (fast_engine, fast_clock) = engine();
            let (general_engine, general_clock) = engine();
            fast_engine.load_flow_rules(rules.clone()).unwrap();
            general_engine.load_flow_rules(rules).unwrap();
            let (fast, general) = (fast_engine.resource("api"), general_engine.resource("api"));
            let outcome = |r: Result<sentinel_runtime::Entry<'_>, BlockError>| match r {
                Ok(e) => Ok(e.waited()),
                Err(BlockError::Flow { rule, retry_after, .. }) => Err((rule.grade, retry_after)),
                Err(other) => panic!("unexpected block {other:?}"),
            };
            let (mut passed, mut waited) = (0, 0);
            for i in 0..400 {
                let a = outcome(fast.enter());
                let b = outcome(general.entry().prioritized(true).decide());
                assert_eq!(a, b, "{behavior:?}, thread rule {with_threads}, call {i}");
                passed += a.is_ok() as u32;
                waited += a.is_ok_and(|w| !w.is_zero()) as u32;
                fast_clock.advance_millis(7);
                general_clock.advance_millis(7);
            }
            assert!(passed > 0 && passed < 400, "{behavior:?}: some pass, some not ({passed})");
            if behavior != ControlBehavior::WarmUp {
                assert!(waited > 0, "{behavior:?}: the rate limiter asks calls to wait");
            }
        }
    }
}

#[test]
fn two_qps_rules_decide_on_the_fast_path_as_on_the_general_path_each_limit_exact() {
    // Two engines on clocks that move alike: one with the two rules alone (the fast path), one with a user slot
    // that passes every call (the general path). Every decision, block and wait must be the same.
    let reject = |count| FlowRule::new("api").count(count);
    let behaving = |count, behavior| reject(count).control_behavior(behavior).max_queueing_time_ms(200);
    let pairs = [
        [reject(5.0), reject(3.0)],
        [reject(3.0), reject(5.0)],
        [reject(4.0), reject(4.0)],
        [behaving(20.0, ControlBehavior::WarmUp), reject(6.0)],
        [reject(6.0), behaving(20.0, ControlBehavior::RateLimiter)],
        [behaving(10.0, ControlBehavior::RateLimiter), reject(4.0)],
    ];
    for rules in pairs {
        let ((fast_engine, fast_clock), (general_engine, general_clock)) = fast_and_general(&rules);
        let (fast, general) = (fast_engine.resource("api"), general_engine.resource("api"));
        let outcome = |r: Result<sentinel_runtime::Entry<'_>, BlockError>| match r {
            Ok(e) => Ok(e.waited()),
            Err(BlockError::Flow { rule, retry_after, .. }) => Err((rule.count, rule.control_behavior, retry_after)),
            Err(other) => panic!("unexpected block {other:?}"),
        };
        let (mut passed, mut blocked) = (0, 0);
        for i in 0..600 {
            let a = outcome(fast.enter());
            let b = outcome(general.enter());
            assert_eq!(a, b, "{rules:?}, call {i}");
            passed += a.is_ok() as u32;
            blocked += a.is_err() as u32;
            // Bursts of calls within a millisecond, then a step: windows fill and turn.
            if i % 4 == 3 {
                fast_clock.advance_millis(37);
                general_clock.advance_millis(37);
            }
        }
        assert!(passed > 0 && blocked > 0, "{rules:?}: some pass ({passed}), some not");
        assert_eq!(
            fast_engine.cluster_stats("api").unwrap().pass_qps,
            general_engine.cluster_stats("api").unwrap().pass_qps,
            "{rules:?}"
        );
    }
    // Each limit exact: under the lower limit's refusals, the higher one's tokens go back.
    let (engine, clock) = engine();
    engine.load_flow_rules([reject(5.0), reject(3.0)]).unwrap();
    let api = engine.resource("api");
    let refused = |r: Result<sentinel_runtime::Entry<'_>, BlockError>| match r {
        Err(BlockError::Flow { rule, .. }) => rule.count,
        other => panic!("expected a flow block, got {other:?}"),
    };
    for _ in 0..3 {
        drop(api.enter().unwrap());
    }
    for _ in 0..4 {
        assert_eq!(refused(api.enter()), 3.0, "the lower limit refuses");
    }
    // The rules swap their limits: the first (now 3) holds the three passes, none of the refused calls.
    engine.load_flow_rules([reject(3.0), reject(5.0)]).unwrap();
    assert_eq!(refused(api.enter()), 3.0);
    clock.advance_millis(1_000);
    for _ in 0..3 {
        drop(api.enter().unwrap());
    }
    assert_eq!(refused(api.enter()), 3.0);
}

/// Three and four rules for every caller (QPS rules of each control behaviour, and a thread-grade rule) decide on
/// the fast path as on the general path: the same calls pass, with the same waits; the same rule refuses the
/// others, with the same retry time; the node counts the same passes; what the rules before a refusing one took
/// (a token, a permit) goes back, and nothing stays in flight.
#[test]
fn three_and_four_rules_for_every_caller_decide_on_the_fast_path_as_on_the_general_path() {
    let reject = |count| FlowRule::new("api").count(count);
    let behaving = |count, behavior| reject(count).control_behavior(behavior).max_queueing_time_ms(200);
    let threads = |count| FlowRule::new("api").grade(FlowGrade::Thread).count(count);
    let sets = [
        vec![reject(6.0), reject(4.0), reject(5.0)],
        vec![reject(3.0), reject(5.0), threads(2.0)],
        vec![threads(3.0), reject(5.0), reject(4.0)],
        vec![reject(7.0), threads(4.0), reject(5.0), reject(6.0)],
        vec![behaving(10.0, ControlBehavior::RateLimiter), reject(6.0), reject(4.0)],
        vec![behaving(10.0, ControlBehavior::RateLimiter), behaving(20.0, ControlBehavior::RateLimiter), reject(5.0)],
        vec![behaving(20.0, ControlBehavior::WarmUp), reject(6.0), threads(3.0), reject(5.0)],
        vec![reject(5.0), behaving(12.0, ControlBehavior::WarmUpRateLimiter), threads(2.0), reject(4.0)],
        vec![reject(4.0).limit_app("appA"), reject(6.0), threads(3.0), reject(5.0), reject(7.0)],
    ];
    for rules in sets {
        let (fast_engine, general_engine) = decide_alike(&rules, &["", "appA", "appB"], 600, 3, (4, 37));
        counted_alike(&fast_engine, &general_engine, &rules);
    }
}

/// Relate rules (Java's `RELATE`: a limit on a resource while another one is busy) decide on the fast path as on
/// the general path, beside the other rules for every caller and rules for an origin: before the related
/// resource exists, while it exists but was never entered (it has no node then, as in Java, and the rule lets
/// every call through), and once it was entered (its passes in the second, or its calls in flight, decide).
/// Every call meets the same on both paths: the same wait, or the same rule refusing it with the same retry time.
#[test]
fn relate_rules_decide_on_the_fast_path_as_on_the_general_path() {
    use sentinel_runtime::flow::FlowStrategy;
    let reject = |count| FlowRule::new("api").count(count);
    let relate = |count| reject(count).relate("orders");
    let threads = |count| FlowRule::new("api").grade(FlowGrade::Thread).count(count);
    let sets = [
        vec![relate(3.0)],
        vec![reject(6.0), relate(3.0)],
        vec![relate(4.0), reject(5.0)],
        vec![threads(1.0).relate("orders"), reject(6.0)],
        vec![threads(2.0), relate(4.0), reject(5.0), threads(2.0).relate("orders")],
        vec![relate(20.0).control_behavior(ControlBehavior::WarmUp).warm_up_period_sec(2), reject(6.0)],
        vec![reject(3.0).limit_app("appA"), relate(4.0), reject(8.0)],
    ];
    let outcome = |r: &Result<sentinel_runtime::Entry<'static>, BlockError>| match r {
        Ok(e) => Ok(e.waited()),
        Err(BlockError::Flow { rule, retry_after, .. }) => {
            Err((rule.count, rule.grade, rule.strategy, rule.limit_app.clone(), *retry_after))
        }
        Err(other) => panic!("unexpected block {other:?}"),
    };
    for rules in sets {
        let ((fast_engine, fast_clock), (general_engine, general_clock)) = fast_and_general(&rules);
        let (fast, general) = (fast_engine.resource("api"), general_engine.resource("api"));
        let mut orders = None;
        let (mut held, mut held_orders) = (Vec::new(), Vec::new());
        let mut by_relate = [0u32; 2];
        for i in 0..900 {
            // "orders" is created at call 100, and entered from call 200 on: every third call enters it, and
            // 0 to 2 of its entries stay in flight.
            if i == 100 {
                orders = Some((fast_engine.resource("orders"), general_engine.resource("orders")));
            }
            if let Some((fast_orders, general_orders)) = &orders
                && i >= 200
                && i % 3 == 0
            {
                held_orders
                    .push((fast_orders.entry_owned().enter().unwrap(), general_orders.entry_owned().enter().unwrap()));
            }
            while held_orders.len() > (i / 7) % 3 {
                drop(held_orders.remove(0));
            }
            let origin = ["", "appA", "appB"][i % 3];
            let (a, b) = (fast.entry_owned().origin(origin).enter(), general.entry_owned().origin(origin).enter());
            assert_eq!(outcome(&a), outcome(&b), "{rules:?}, call {i} from {origin:?}");
            if let Err((_, _, FlowStrategy::Relate, _, _)) = outcome(&a) {
                by_relate[usize::from(i >= 200)] += 1;
            }
            held.push((a, b));
            if held.len() > 3 {
                drop(held.remove(0));
            }
            if i % 4 == 3 {
                fast_clock.advance_millis(37);
                general_clock.advance_millis(37);
            }
        }
        drop((held, held_orders));
        assert_eq!(by_relate[0], 0, "{rules:?}: no node before \"orders\" is entered, no refusal");
        assert!(by_relate[1] > 0, "{rules:?}: \"orders\" busy, some refusals");
        counted_alike(&fast_engine, &general_engine, &rules);
    }
}

/// Chain rules (Java's `CHAIN`: a limit on the calls made in one entrance's context) decide on the fast path as
/// on the general path, on the resource's node in that context, beside the other rules for every caller and
/// rules for an origin: calls in the context a rule names meet it, calls in any other context (or none) do not.
/// Every call meets the same on both paths: the same wait, or the same rule refusing it with the same retry
/// time; a token or a permit a chain rule took goes back when a later rule refuses the call.
#[test]
fn chain_rules_decide_on_the_fast_path_as_on_the_general_path() {
    use sentinel_runtime::flow::FlowStrategy;
    let reject = |count| FlowRule::new("api").count(count);
    let chain = |count| reject(count).chain("entrance");
    let threads = |count| FlowRule::new("api").grade(FlowGrade::Thread).count(count);
    let sets = [
        vec![chain(3.0)],
        vec![reject(8.0), chain(2.0)],
        vec![chain(4.0), reject(12.0)],
        vec![threads(1.0).chain("entrance"), reject(6.0)],
        vec![threads(2.0), chain(4.0), threads(1.0).chain("entrance"), reject(12.0)],
        vec![chain(4.0), chain(3.0)],
        vec![chain(3.0), reject(2.0).chain("back-office")],
        vec![chain(10.0).control_behavior(ControlBehavior::RateLimiter).max_queueing_time_ms(200), reject(6.0)],
        vec![chain(20.0).control_behavior(ControlBehavior::WarmUp).warm_up_period_sec(2), reject(40.0)],
        vec![reject(3.0).limit_app("appA"), chain(4.0), threads(2.0).chain("entrance"), reject(8.0)],
    ];
    let outcome = |r: &Result<sentinel_runtime::Entry<'static>, BlockError>| match r {
        Ok(e) => Ok(e.waited()),
        Err(BlockError::Flow { rule, retry_after, .. }) => Err((
            rule.count,
            rule.grade,
            rule.strategy,
            rule.ref_resource.clone(),
            rule.limit_app.clone(),
            *retry_after,
        )),
        Err(other) => panic!("unexpected block {other:?}"),
    };
    for rules in sets {
        let ((fast_engine, fast_clock), (general_engine, general_clock)) = fast_and_general(&rules);
        let (fast, general) = (fast_engine.resource("api"), general_engine.resource("api"));
        let mut held = Vec::new();
        let mut by_chain = 0;
        for i in 0..900 {
            // Calls in the entrance's context, in another one, and in none, from three callers.
            let context = ["entrance", "back-office", "", "entrance"][i % 4];
            let origin = ["", "appA", "appB"][i % 3];
            let enter = |engine: &Sentinel, api: &sentinel_runtime::Resource| {
                if context.is_empty() {
                    return api.entry_owned().origin(origin).enter();
                }
                let _context = engine.enter_context(context, origin).unwrap();
                api.entry_owned().enter()
            };
            let (a, b) = (enter(&fast_engine, &fast), enter(&general_engine, &general));
            assert_eq!(outcome(&a), outcome(&b), "{rules:?}, call {i} in {context:?} from {origin:?}");
            if let Err((_, _, FlowStrategy::Chain, named, _, _)) = outcome(&a) {
                assert_eq!(
                    named.as_deref(),
                    Some(context),
                    "{rules:?}: a chain rule refuses calls in its context only"
                );
                by_chain += 1;
            }
            held.push((a, b));
            if held.len() > (i / 5) % 4 {
                drop(held.remove(0));
            }
            if i % 6 == 5 {
                fast_clock.advance_millis(37);
                general_clock.advance_millis(37);
            }
        }
        drop(held);
        assert!(by_chain > 0, "{rules:?}: some calls in the entrance refused by a chain rule");
        counted_alike(&fast_engine, &general_engine, &rules);
    }
}

/// Rules for callers' origins (Java's `limitApp`: a named origin, or "other") beside rules for every caller
/// decide on the fast path as on the general path: the same calls pass, with the same waits; the same rule
/// refuses the others, with the same retry time; each origin's node and the resource's count the same. A token
/// or a permit the origin's rule took goes back when a rule for every caller refuses the call (the general
/// path's oracle would count more passes, or refuse more calls, otherwise).
#[test]
fn rules_for_origins_decide_on_the_fast_path_as_on_the_general_path() {
    let rule = |count, app: &str| FlowRule::new("api").count(count).limit_app(app);
    let behaving = |count, app: &str, behavior| rule(count, app).control_behavior(behavior).max_queueing_time_ms(200);
    let threads = |count| FlowRule::new("api").grade(FlowGrade::Thread).count(count);
    let sets = [
        vec![rule(5.0, "default"), rule(3.0, "appA")],
        vec![rule(3.0, "default"), rule(5.0, "appA")],
        vec![rule(4.0, "default"), rule(2.0, "appA"), rule(1.0, "other")],
        vec![rule(2.0, "appA")],
        vec![rule(2.0, "other"), rule(6.0, "default")],
        vec![rule(2.0, "appA"), rule(3.0, "appB"), rule(4.0, "default"), rule(3.0, "default")],
        vec![behaving(20.0, "appA", ControlBehavior::WarmUp), rule(6.0, "default")],
        vec![behaving(10.0, "appA", ControlBehavior::RateLimiter), rule(4.0, "default")],
        vec![rule(3.0, "appB"), threads(2.0)],
        vec![threads(1.0).limit_app("appA"), rule(5.0, "default")],
        vec![threads(1.0).limit_app("appA"), threads(2.0).limit_app("other"), threads(2.0), rule(6.0, "default")],
        // Several rules for one origin, or for "other": those that apply decide in order on the origin's node.
        // (The limits for every caller, high: the origins' own limits refuse.)
        vec![rule(3.0, "appA"), threads(1.0).limit_app("appA"), rule(30.0, "default")],
        vec![rule(4.0, "appA"), rule(2.0, "appB"), rule(3.0, "appA"), rule(30.0, "default")],
        vec![rule(2.0, "other"), rule(3.0, "other"), threads(2.0).limit_app("other"), rule(4.0, "appA")],
        vec![behaving(10.0, "appA", ControlBehavior::RateLimiter), rule(3.0, "appA"), threads(2.0).limit_app("appA")],
        vec![rule(5.0, "appA"), rule(4.0, "appA"), rule(3.0, "appA"), rule(30.0, "default"), threads(2.0)],
    ];
    let origins = ["appA", "appB", "appC", "", "appA", "other", "default"];
    for rules in sets {
        let (fast_engine, general_engine) = decide_alike(&rules, &origins, 700, 5, (5, 41));
        let in_flight = |e: &Sentinel| {
            e.cluster_stats("api").unwrap().threads + e.origins_of("api").iter().map(|(_, s)| s.threads).sum::<u64>()
        };
        assert_eq!((in_flight(&fast_engine), in_flight(&general_engine)), (0, 0), "{rules:?}: every permit back");
        let stats = |e: &Sentinel| {
            let mut seen = vec![("*".to_string(), e.cluster_stats("api").unwrap().minute_pass)];
            seen.extend(e.origins_of("api").into_iter().map(|(o, s)| (o, s.minute_pass)));
            seen.sort();
            seen
        };
        assert_eq!(stats(&fast_engine), stats(&general_engine), "{rules:?}");
    }
}

#[test]
fn a_refusal_by_a_rule_for_every_caller_gives_back_the_token_of_the_origins_rule() {
    let (engine, _clock) = engine();
    // appA may pass 3 a second, every caller 2: the third call from appA is refused by the rule for every
    // caller, after appA's rule took its token; that token goes back, so appA's rule still has one left for
    // a call the rule for every caller lets through.
    engine
        .load_flow_rules([FlowRule::new("api").count(3.0).limit_app("appA"), FlowRule::new("api").count(2.0)])
        .unwrap();
    let api = engine.resource("api");
    let from_a = || api.entry().origin("appA").enter();
    drop((from_a().unwrap(), from_a().unwrap()));
    for _ in 0..3 {
        match from_a() {
            Err(BlockError::Flow { rule, .. }) => assert_eq!((rule.count, rule.limit_app.as_str()), (2.0, "default")),
            other => panic!("the rule for every caller refuses, got {other:?}"),
        }
    }
    assert_eq!(engine.origin_stats("api", "appA").unwrap().pass_qps, 2.0);
    // The rule for every caller is raised; appA's rule keeps its window: one token left of its 3, not 0.
    engine
        .load_flow_rules([FlowRule::new("api").count(3.0).limit_app("appA"), FlowRule::new("api").count(100.0)])
        .unwrap();
    drop(from_a().expect("appA's rule gave back the tokens of the refused calls"));
    assert!(matches!(from_a(), Err(BlockError::Flow { rule, .. }) if rule.count == 3.0));
}

#[test]
fn beside_an_adaptive_limit_a_refusal_gives_back_the_tokens_of_the_origins_rule_and_the_others() {
    // appA may pass 2 a second, every caller 10, one call in flight: the calls the adaptive limit refuses give
    // back the tokens both flow rules took, on either path. The same with several rules for appA: a
    // thread-grade rule beside (its permit goes back too), or a QPS rule with a higher limit first.
    let for_a = |count| FlowRule::new("db").count(count).limit_app("appA");
    let sets = [
        vec![for_a(2.0)],
        vec![for_a(2.0), FlowRule::new("db").grade(FlowGrade::Thread).count(5.0).limit_app("appA")],
        vec![for_a(3.0), for_a(2.0)],
    ];
    let run = |rules: &[FlowRule], general: bool| {
        let engine = beside_one_place(&[rules, &[FlowRule::new("db").count(10.0)]].concat(), general);
        let db = engine.resource("db");
        let from_a = || db.entry_owned().origin("appA").enter();
        let mut seen = Vec::new();
        let first = from_a();
        seen.push(met(&first));
        seen.extend([met(&from_a()), met(&from_a())]);
        drop(first);
        seen.push(met(&from_a()));
        seen.push(met(&from_a()));
        let stats = engine.cluster_stats("db").unwrap();
        let origin = engine.origin_stats("db", "appA").unwrap();
        seen.push(if stats.pass_qps == 2.0 && origin.pass_qps == 2.0 { "two passes" } else { "other passes" });
        seen.push(if origin.threads == 0 { "none in flight" } else { "permits left" });
        seen
    };
    for rules in sets {
        let fast = run(&rules, false);
        assert_eq!(fast, ["pass", "adaptive", "adaptive", "pass", "flow", "two passes", "none in flight"], "{rules:?}");
        assert_eq!(fast, run(&rules, true), "{rules:?}: the general path decides the same calls the same way");
    }
}

#[test]
fn beside_an_adaptive_limit_a_refusal_gives_back_the_permit_of_the_origins_thread_grade_rule() {
    // appA may have 2 calls in flight, every caller 10 calls a second, the adaptive limit 1 call in flight: a
    // call the limit refuses gives back appA's permit, on either path (else appA's rule would refuse later).
    let run = |general: bool| {
        let for_a = FlowRule::new("db").grade(FlowGrade::Thread).count(2.0).limit_app("appA");
        let engine = beside_one_place(&[for_a, FlowRule::new("db").count(10.0)], general);
        let db = engine.resource("db");
        let from_a = || db.entry_owned().origin("appA").enter();
        let mut seen = Vec::new();
        let first = from_a();
        seen.push(met(&first));
        for _ in 0..3 {
            seen.push(met(&from_a()));
        }
        drop(first);
        let second = from_a();
        seen.push(met(&second));
        let origin = engine.origin_stats("db", "appA").unwrap();
        seen.push(if origin.threads == 1 { "one in flight" } else { "other count in flight" });
        drop(second);
        let origin = engine.origin_stats("db", "appA").unwrap();
        seen.push(if origin.threads == 0 { "none in flight" } else { "permits left" });
        seen
    };
    let fast = run(false);
    assert_eq!(fast, ["pass", "adaptive", "adaptive", "adaptive", "pass", "one in flight", "none in flight"]);
    assert_eq!(fast, run(true), "the general path decides the same calls the same way");
}

/// What a call met: a pass, or the kind of block (hot parameter, flow or adaptive; any other fails the test).
fn met(r: &Result<sentinel_runtime::Entry<'_>, BlockError>) -> &'static str {
    match r {
        Ok(_) => "pass",
        Err(BlockError::ParamFlow { .. }) => "param",
        Err(BlockError::Flow { .. }) => "flow",
        Err(BlockError::Adaptive { .. }) => "adaptive",
        Err(other) => panic!("unexpected block {other:?}"),
    }
}

/// What one call with `value` as its hot parameter met.
fn outcome(engine: &Sentinel, value: &str) -> &'static str {
    met(&engine.resource("api").entry().args(&[&value]).enter())
}

#[test]
fn hot_parameter_rules_on_the_fast_path_decide_as_the_general_path_does() {
    // The same calls on two engines: one whose rules take the fast path, one that an authority rule (which
    // lets every caller through) sends down the general path.
    let run = |general: bool| {
        let (engine, clock) = engine();
        engine.load_param_flow_rules([ParamFlowRule::new("api", 0).count(2.0)]).unwrap();
        engine.load_flow_rules([FlowRule::new("api").count(3.0)]).unwrap();
        if general {
            engine.load_authority_rules([AuthorityRule::new("api", "nobody", AuthorityStrategy::Black)]).unwrap();
        }
        let mut seen = Vec::new();
        for v in ["a", "a", "a", "b", "b", "c"] {
            seen.push(outcome(&engine, v));
        }
        let stats = engine.cluster_stats("api").unwrap();
        seen.push(if (stats.pass_qps, stats.block_qps) == (3.0, 3.0) { "counted" } else { "miscounted" });
        // A new flow window, but not yet a refill for the values (strictly more than the duration).
        clock.advance_millis(1_000);
        for v in ["b", "c", "a"] {
            seen.push(outcome(&engine, v));
        }
        seen
    };
    let fast = run(false);
    assert_eq!(
        fast,
        [
            "pass", "pass", "param", // value "a": first sight leaves max - 1 = 1 token, 1 more passes
            "pass",  // value "b", the flow window's third pass
            "flow",
            "flow", // "b" and "c" pass their rule, the window is full: their tokens go back (Java keeps them)
            "counted", "pass", "pass",
            "param", // "b" has the token its blocked call gave back, "c" both, "a" none until the refill
        ]
    );
    assert_eq!(fast, run(true), "the general path decides the same calls the same way");
}

#[test]
fn a_hot_parameter_rate_limiter_on_the_fast_path_asks_the_call_to_wait() {
    let (engine, _clock) = engine();
    let rule = ParamFlowRule::new("api", 0).count(2.0).control_behavior(ControlBehavior::RateLimiter);
    engine.load_param_flow_rules([rule.max_queueing_time_ms(1_000)]).unwrap();
    engine.load_flow_rules([FlowRule::new("api").count(100.0)]).unwrap();
    let api = engine.resource("api");
    let first = api.entry().args(&[&7u64]).decide().unwrap();
    assert_eq!(first.waited(), Duration::ZERO);
    let second = api.entry().args(&[&7u64]).decide().unwrap();
    assert_eq!(second.waited(), Duration::from_millis(500), "two a second per value: 500 ms apart");
    let other = api.entry().args(&[&8u64]).decide().unwrap();
    assert_eq!(other.waited(), Duration::ZERO, "each value has its own spacing");
}

/// A user's hot parameter that panics when the checks read it.
struct Exploding;
impl HotParam for Exploding {
    fn visit_values(&self, _f: &mut dyn FnMut(ParamValue<'_>)) {
        panic!("user HotParam panics (expected by the test)");
    }
}

#[test]
fn a_panicking_hot_parameter_on_the_fast_path_leaves_nothing_taken() {
    let (engine, _clock) = engine();
    engine.load_param_flow_rules([ParamFlowRule::new("api", 0).count(5.0)]).unwrap();
    engine.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    let api = engine.resource("api");
    assert!(catch_unwind(AssertUnwindSafe(|| drop(api.entry().args(&[&Exploding]).enter()))).is_err());
    let stats = engine.cluster_stats("api").unwrap();
    assert_eq!((stats.pass_qps, stats.block_qps, stats.threads), (0.0, 0.0, 0), "the call was never counted");
    // The flow rule's only token of this window is still there.
    drop(api.entry().args(&[&1u64]).enter().unwrap());
    assert!(matches!(api.entry().args(&[&2u64]).enter(), Err(BlockError::Flow { .. })));
}

/// A user's hot parameter that hands the checks one value, then panics.
struct HalfExploding(i64);
impl HotParam for HalfExploding {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Int(self.0));
        panic!("user HotParam panics after one value (expected by the test)");
    }
}

#[test]
fn thread_grade_hot_parameter_rules_on_the_fast_path_decide_as_the_general_path_does() {
    // A thread-grade hot-parameter rule (its permit held until exit) before a QPS flow rule: a call the flow
    // rule refuses gives its value's permit back, on either path.
    let run = |general: bool| {
        let (engine, clock) = engine();
        engine
            .load_param_flow_rules([
                ParamFlowRule::new("api", 0).grade(FlowGrade::Thread).count(1.0),
                ParamFlowRule::new("api", 0).count(100.0),
            ])
            .unwrap();
        engine.load_flow_rules([FlowRule::new("api").count(3.0)]).unwrap();
        if general {
            engine.load_authority_rules([AuthorityRule::new("api", "nobody", AuthorityStrategy::Black)]).unwrap();
        }
        let api = engine.resource("api");
        let mut seen = Vec::new();
        let mut note = |r: &Result<sentinel_runtime::Entry, BlockError>| seen.push(met(r));
        let a = api.entry().args(&[&"a"]).enter();
        note(&a);
        let a2 = api.entry().args(&[&"a"]).enter(); // "a" has its one call in flight
        note(&a2);
        let b = api.entry().args(&[&"b"]).enter();
        note(&b);
        drop(a);
        let c = api.entry().args(&[&"c"]).enter(); // the flow window's third pass
        note(&c);
        let d = api.entry().args(&[&"d"]).enter(); // refused by the flow rule: "d" gives its permit back
        note(&d);
        drop((b, c));
        clock.advance_millis(1_000);
        let d = api.entry().args(&[&"d"]).enter(); // a new flow window: "d" has no call in flight
        note(&d);
        let d2 = api.entry().args(&[&"d"]).enter();
        note(&d2);
        drop(d);
        let a = api.entry().args(&[&"a"]).enter();
        note(&a);
        drop(a);
        let stats = engine.cluster_stats("api").unwrap();
        seen.push(if stats.threads == 0 { "all back" } else { "leaked" });
        seen
    };
    let fast = run(false);
    assert_eq!(fast, ["pass", "param", "pass", "pass", "flow", "pass", "param", "pass", "all back"]);
    assert_eq!(fast, run(true), "the general path decides the same calls the same way");
}

#[test]
fn a_hot_parameter_that_panics_on_the_fast_path_gives_back_the_thread_permits_it_took() {
    let (engine, _clock) = engine();
    engine.load_param_flow_rules([ParamFlowRule::new("api", 0).grade(FlowGrade::Thread).count(1.0)]).unwrap();
    engine.load_flow_rules([FlowRule::new("api").count(100.0)]).unwrap();
    let api = engine.resource("api");
    // The first value takes its permit, then the impl panics before the call is decided.
    assert!(catch_unwind(AssertUnwindSafe(|| drop(api.entry().args(&[&HalfExploding(7)]).enter()))).is_err());
    let held = api.entry().args(&[&7u64]).enter().expect("value 7's permit went back when the check unwound");
    assert!(matches!(api.entry().args(&[&7u64]).enter(), Err(BlockError::ParamFlow { .. })), "the limit holds");
    drop(held);
    assert_eq!(engine.cluster_stats("api").unwrap().threads, 0);
}

#[test]
fn an_adaptive_limit_alone_decides_on_the_fast_path_as_on_the_general_path() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    // A limit pinned at 2 (its bounds are equal), partitioned by origin; an authority rule (which lets every
    // caller through) sends the second engine's calls down the general path.
    let run = |general: bool| {
        let (engine, _clock) = engine();
        let rule = AdaptiveRule::new("db").algorithm(AlgorithmKind::Vegas).limits(2, 2, 2).partition("mobile", 0.5);
        engine.load_adaptive_rules([rule]).unwrap();
        if general {
            engine.load_authority_rules([AuthorityRule::new("db", "nobody", AuthorityStrategy::Black)]).unwrap();
        }
        let db = engine.resource("db");
        let mut seen = Vec::new();
        let mut note = |r: &Result<sentinel_runtime::Entry, BlockError>| seen.push(met(r));
        let a = db.entry().origin("mobile").enter();
        note(&a);
        let b = db.entry().origin("web").enter();
        note(&b);
        let c = db.entry().origin("web").enter(); // at the limit
        note(&c);
        drop(a);
        let d = db.entry().origin("web").enter(); // a's place is back
        note(&d);
        drop((b, d));
        let status = &engine.adaptive_status()[0];
        seen.push(if status.inflight == 0 { "all back" } else { "leaked" });
        seen
    };
    let fast = run(false);
    assert_eq!(fast, ["pass", "pass", "adaptive", "pass", "all back"]);
    assert_eq!(fast, run(true), "the general path decides the same calls the same way");
}

#[test]
fn beside_a_flow_rule_an_adaptive_refusal_gives_the_flow_token_back() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("db").count(2.0)]).unwrap();
    engine.load_adaptive_rules([AdaptiveRule::new("db").algorithm(AlgorithmKind::Vegas).limits(1, 1, 1)]).unwrap();
    let db = engine.resource("db");
    let first = db.enter().unwrap();
    // The flow rule passes the second call (its second token), the adaptive limit refuses it: the token goes
    // back, so one call more passes in this second once the place is free.
    assert!(matches!(db.enter(), Err(BlockError::Adaptive { .. })));
    drop(first);
    drop(db.enter().expect("the refused call's flow token went back"));
    assert!(matches!(db.enter(), Err(BlockError::Flow { .. })), "two passes this second");
}

/// Two engines on clocks that move alike, with `rules`: one decides on the fast path, the other (with a user
/// slot that passes every call) on the general path.
fn fast_and_general(rules: &[FlowRule]) -> ((Sentinel, ManualClock), (Sentinel, ManualClock)) {
    let (fast, general) = (engine(), engine());
    fast.0.load_flow_rules(rules.to_vec()).unwrap();
    general.0.load_flow_rules(rules.to_vec()).unwrap();
    general.0.add_slot(0, PassAll);
    (fast, general)
}

/// Calls on both engines of [`fast_and_general`] with `rules` on `api`: `calls` calls from `origins` in turn, the
/// last `hold` entries of each engine held (owned entries, which leave the thread's context alone, so that
/// thread-grade rules have calls in flight to count), both clocks stepping `step_ms` after every `every` calls
/// (bursts within a millisecond, then a step: windows fill and turn). Every call must meet the same on both
/// paths: the same wait, or the same rule refusing it with the same retry time. The two engines, with nothing
/// held, once some calls passed and some were refused.
fn decide_alike(
    rules: &[FlowRule],
    origins: &[&str],
    calls: usize,
    hold: usize,
    (every, step_ms): (usize, u64),
) -> (Sentinel, Sentinel) {
    let outcome = |r: &Result<sentinel_runtime::Entry<'static>, BlockError>| match r {
        Ok(e) => Ok(e.waited()),
        Err(BlockError::Flow { rule, retry_after, .. }) => {
            Err((rule.count, rule.grade, rule.control_behavior, rule.limit_app.clone(), *retry_after))
        }
        Err(other) => panic!("unexpected block {other:?}"),
    };
    let ((fast_engine, fast_clock), (general_engine, general_clock)) = fast_and_general(rules);
    let (fast, general) = (fast_engine.resource("api"), general_engine.resource("api"));
    let (mut passed, mut blocked) = (0, 0);
    let mut held = Vec::new();
    for i in 0..calls {
        let origin = origins[i % origins.len()];
        let a = fast.entry_owned().origin(origin).enter();
        let b = general.entry_owned().origin(origin).enter();
        assert_eq!(outcome(&a), outcome(&b), "{rules:?}, call {i} from {origin:?}");
        passed += a.is_ok() as u32;
        blocked += a.is_err() as u32;
        held.push((a, b));
        if held.len() > hold {
            drop(held.remove(0));
        }
        if i % every == every - 1 {
            fast_clock.advance_millis(step_ms);
            general_clock.advance_millis(step_ms);
        }
    }
    drop(held);
    assert!(passed > 0 && blocked > 0, "{rules:?}: some pass ({passed}), some not");
    (fast_engine, general_engine)
}

/// The minute's passes and blocks of `api` on both engines of [`fast_and_general`] are the same, and nothing is
/// in flight on either (every permit went back).
fn counted_alike(fast: &Sentinel, general: &Sentinel, rules: &[FlowRule]) {
    let counts = |e: &Sentinel| {
        let s = e.cluster_stats("api").unwrap();
        (s.minute_pass, s.minute_block, s.threads)
    };
    assert_eq!(counts(fast), counts(general), "{rules:?}");
    assert_eq!(counts(fast).2, 0, "{rules:?}: every permit back");
}

/// An engine with the flow rules `flow` on `db` and an adaptive limit of one call in flight beside them, which
/// decides on the fast path, or on the general path when `general` (a user slot that passes every call).
fn beside_one_place(flow: &[FlowRule], general: bool) -> Sentinel {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    let (engine, _clock) = engine();
    engine.load_flow_rules(flow.to_vec()).unwrap();
    engine.load_adaptive_rules([AdaptiveRule::new("db").algorithm(AlgorithmKind::Vegas).limits(1, 1, 1)]).unwrap();
    if general {
        engine.add_slot(0, PassAll);
    }
    engine
}

/// A user slot that lets every call through: an engine with one decides every call on the general path.
struct PassAll;

impl sentinel_runtime::slot::Slot for PassAll {
    fn name(&self) -> &'static str {
        "pass-all"
    }
    fn entry(&self, _: &sentinel_runtime::slot::SlotEntry<'_>) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn flow_rules_beside_an_adaptive_limit_decide_on_the_fast_path_as_on_the_general_path() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    // A QPS rule (10 a second) and a thread-grade rule (3 in flight) before an adaptive limit pinned at 2: a
    // call the limit refuses gives back the QPS rule's token and the thread-grade rule's permit, on either path.
    // The same with more rules for every caller: QPS rules with higher limits, which check on the first's
    // token, and a rate limiter that never refuses (the token is then the third rule's, the permit the
    // second's).
    let (qps, threads) =
        (|count| FlowRule::new("db").count(count), FlowRule::new("db").grade(FlowGrade::Thread).count(3.0));
    let spacing =
        FlowRule::new("db").count(1e9).control_behavior(ControlBehavior::RateLimiter).max_queueing_time_ms(500);
    // Relate rules that never refuse in between (on a resource never entered, on `db` itself): the copy of the
    // fast path for relate and chain rules gives back the same. Chain rules naming the context of these calls
    // (the default one): their token and their permit, on the resource's node in that context, go back too.
    let related = |name| FlowRule::new("db").count(1e9).relate(name);
    let in_context = |rule: FlowRule| rule.chain(sentinel_runtime::DEFAULT_CONTEXT_NAME);
    let sets = [
        vec![qps(10.0), threads.clone()],
        vec![qps(10.0), qps(12.0), threads.clone(), qps(11.0)],
        vec![spacing, threads.clone(), qps(10.0)],
        vec![qps(10.0), related("idle"), threads.clone()],
        vec![threads.clone(), related("db"), qps(10.0)],
        vec![in_context(qps(10.0)), threads.clone()],
        vec![qps(12.0), in_context(threads.clone()), in_context(qps(10.0))],
    ];
    let run = |rules: &[FlowRule], general: bool| {
        let (engine, clock) = engine();
        engine.load_flow_rules(rules.to_vec()).unwrap();
        engine.load_adaptive_rules([AdaptiveRule::new("db").algorithm(AlgorithmKind::Vegas).limits(2, 2, 2)]).unwrap();
        if general {
            engine.add_slot(0, PassAll);
        }
        let db = engine.resource("db");
        let mut seen = Vec::new();
        let (a, b) = (db.enter(), db.enter());
        seen.extend([met(&a), met(&b)]);
        // The flow rules pass the third call (the third permit), the adaptive limit refuses it; the fourth
        // meets the same, unless the third kept its permit (the thread-grade rule would refuse it then).
        seen.extend([met(&db.enter()), met(&db.enter())]);
        drop((a, b));
        // Two tokens spent this second: eight more calls pass, unless the refused calls kept theirs.
        for _ in 0..9 {
            seen.push(met(&db.enter()));
        }
        clock.advance_millis(1_000);
        seen.push(met(&db.enter()));
        let status = &engine.adaptive_status()[0];
        let stats = engine.cluster_stats("db").unwrap();
        seen.push(if status.inflight == 0 && stats.threads == 0 { "all back" } else { "leaked" });
        seen
    };
    let mut want = vec!["pass", "pass", "adaptive", "adaptive"];
    want.extend(["pass"; 8]);
    want.extend(["flow", "pass", "all back"]);
    for rules in sets {
        let fast = run(&rules, false);
        assert_eq!(fast, want, "{rules:?}");
        assert_eq!(fast, run(&rules, true), "{rules:?}: the general path decides the same calls the same way");
    }
}

#[test]
fn hot_parameter_permits_beside_an_adaptive_limit_go_back_when_it_refuses() {
    use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
    // A thread-grade hot-parameter rule (one call in flight per value) before an adaptive limit pinned at 1.
    let run = |general: bool| {
        let (engine, _clock) = engine();
        engine.load_param_flow_rules([ParamFlowRule::new("api", 0).grade(FlowGrade::Thread).count(1.0)]).unwrap();
        engine.load_adaptive_rules([AdaptiveRule::new("api").algorithm(AlgorithmKind::Vegas).limits(1, 1, 1)]).unwrap();
        if general {
            engine.add_slot(0, PassAll);
        }
        let api = engine.resource("api");
        let mut seen = Vec::new();
        let mut note = |r: &Result<sentinel_runtime::Entry, BlockError>| seen.push(met(r));
        let x = api.entry().args(&[&"x"]).enter();
        note(&x);
        let y = api.entry().args(&[&"y"]).enter(); // "y" takes its permit, the adaptive limit refuses the call
        note(&y);
        drop((x, y));
        let y = api.entry().args(&[&"y"]).enter(); // "y"'s permit went back
        note(&y);
        let y2 = api.entry().args(&[&"y"]).enter();
        note(&y2);
        drop((y, y2));
        let status = &engine.adaptive_status()[0];
        seen.push(if status.inflight == 0 && engine.cluster_stats("api").unwrap().threads == 0 {
            "all back"
        } else {
            "leaked"
        });
        seen
    };
    let fast = run(false);
    assert_eq!(fast, ["pass", "adaptive", "pass", "param", "all back"]);
    assert_eq!(fast, run(true), "the general path decides the same calls the same way");
}
