//! Each resource's rules, compiled from every kind's manager ([`ResourceRules`]) with the chain's flags for
//! them (which path a call on them can take): above the chain, so that the state below it
//! ([`super::shared::Shared`]) knows no chain.

use std::sync::Arc;

use crate::chain::{fast_path_apart, has_slow_rules};
use crate::engine::shared::Shared;
use crate::rules::{FastPath, ResourceRules};

/// The rules of every kind for the resource `name`, with the chain's flags for them.
pub(super) fn rules_for(shared: &Shared, name: &Arc<str>) -> ResourceRules {
    let flow = shared.flow.for_resource(name);
    // Origins the rules name are always tracked: interned here (and given their own node on this
    // resource when a flow rule reads it).
    let named_origins = flow
        .as_ref()
        .map(|f| f.named_origins().iter().map(|o| shared.named_origin(o)).map(|o| (o.id, o.name.clone())).collect())
        .unwrap_or_default();
    let authority = shared.authority.for_resource(name);
    if let Some(a) = &authority {
        for o in a.listed_origins() {
            shared.named_origin(o);
        }
    }
    let degrade = shared.degrade.for_resource(name);
    let mut rules = ResourceRules {
        named_origins,
        authority,
        param: shared.param.for_resource(name),
        fast_path: FastPath::No,
        cluster_only: false,
        flow,
        // The `"*"` breakers apply only to a resource with none of its own: kept only then, so that each
        // breaker slot reads one field.
        default_degrade: shared.degrade.default_breakers_for(name).filter(|_| degrade.is_none()),
        degrade,
        adaptive: shared.adaptive.for_resource(name),
        #[cfg(test)]
        every_nth: shared.every_nth.for_resource(name),
    };
    let slow = has_slow_rules(&rules, shared);
    let fast = !slow
        && rules.param.as_ref().is_none_or(|p| p.on_fast_path())
        && rules.flow.as_ref().is_none_or(|f| f.fast_rules().is_some())
        && rules.adaptive.as_ref().is_none_or(|a| a.never_waits());
    rules.fast_path = match (fast, fast_path_apart(&rules, shared)) {
        (false, _) => FastPath::No,
        (true, false) => FastPath::Common,
        (true, true) => FastPath::Apart,
    };
    rules.cluster_only = !slow && rules.param.is_none() && rules.flow.as_ref().is_some_and(|f| f.cluster_only());
    rules
}

/// Rebuilds every resource's rules after a manager changed.
pub(super) fn refresh_rules(shared: &Shared) {
    let _guard = shared.registry_lock.lock().unwrap_or_else(|e| e.into_inner());
    // One grace period for the whole refresh, when `retired` drops (after the lock is released).
    let mut retired = crate::rcu::RetireBatch::new();
    for (_, inner) in shared.resource_list.iter() {
        inner.set_rules(rules_for(shared, &inner.name), &mut retired);
    }
    drop(_guard);
    // The resources names past the cap share by their patterns that no longer match as they did leave the
    // bound on those (their names, which no new name gets any more, keep them). Taken once the registry's
    // lock is released: `shared_by_patterns` takes the registry's lock while it holds this one.
    shared
        .shared_by_patterns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|patterns, inner| shared.still_shared_by(patterns, inner));
    // After the resources' rules no longer hold them: a call waiting on an adaptive limiter that a changed
    // rule replaced is woken and decides again on the rules in force.
    shared.adaptive.retire_replaced();
}

#[cfg(test)]
mod tests {
    use crate::adaptive::AdaptiveRule;
    use crate::authority::{AuthorityRule, AuthorityStrategy};
    use crate::circuit_breaker::{DegradeGrade, DegradeRule};
    use crate::flow::{FlowGrade, FlowRule};
    use crate::param_flow::ParamFlowRule;
    use crate::rules::FastPath;
    use crate::Sentinel;

    /// The path the rules of a resource with `load`'s rules take.
    fn path(load: impl FnOnce(&Sentinel)) -> FastPath {
        let engine = Sentinel::builder().build();
        load(&engine);
        engine.resource("r").inner.with_rules(|r| r.fast_path)
    }

    #[test]
    fn an_adaptive_limit_beside_kinds_that_hold_takes_the_fast_path_that_undoes() {
        let flow = |e: &Sentinel| e.load_flow_rules([FlowRule::new("r").count(5.0)]).unwrap();
        let threads =
            |e: &Sentinel| e.load_flow_rules([FlowRule::new("r").grade(FlowGrade::Thread).count(5.0)]).unwrap();
        let param = |e: &Sentinel| e.load_param_flow_rules([ParamFlowRule::new("r", 0).count(5.0)]).unwrap();
        let adaptive = |e: &Sentinel| e.load_adaptive_rules([AdaptiveRule::new("r").limits(2, 2, 2)]).unwrap();
        let authority =
            |e: &Sentinel| e.load_authority_rules([AuthorityRule::new("r", "x", AuthorityStrategy::Black)]).unwrap();
        let breaker = |e: &Sentinel| {
            e.load_degrade_rules([DegradeRule::new("r", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(10)])
                .unwrap()
        };
        assert_eq!(path(|_| {}), FastPath::Common);
        for alone in [flow, threads, param, adaptive] {
            assert_eq!(path(alone), FastPath::Common);
        }
        // Kinds that never hold beside the limit: the common copy.
        assert_eq!(path(|e| (authority(e), adaptive(e)).1), FastPath::Common);
        assert_eq!(path(|e| (breaker(e), adaptive(e)).1), FastPath::Common);
        // Flow and hot-parameter rules hold (a token, a permit) before it: the copy that undoes.
        for holder in [flow, threads, param] {
            assert_eq!(path(|e| (holder(e), adaptive(e)).1), FastPath::Apart);
            assert_eq!(path(|e| (holder(e), breaker(e), authority(e), adaptive(e)).1), FastPath::Apart);
        }
        // A kind off the fast path still sends the rules to the general path.
        let waits =
            |e: &Sentinel| e.load_adaptive_rules([AdaptiveRule::new("r").limits(2, 2, 2).max_wait_ms(10)]).unwrap();
        assert_eq!(path(|e| (flow(e), waits(e)).1), FastPath::No);
    }

    #[test]
    fn up_to_four_rules_for_every_caller_take_the_fast_path_and_a_fifth_the_general_one() {
        let qps = |count| FlowRule::new("r").count(count);
        let threads = FlowRule::new("r").grade(FlowGrade::Thread).count(2.0);
        let two = |e: &Sentinel| e.load_flow_rules([qps(5.0), qps(3.0)]).unwrap();
        assert_eq!(path(two), FastPath::Common);
        let breaker = |e: &Sentinel| {
            e.load_degrade_rules([DegradeRule::new("r", DegradeGrade::ErrorRatio).count(0.5).time_window_sec(10)])
                .unwrap()
        };
        assert_eq!(path(|e| (two(e), breaker(e)).1), FastPath::Common);
        let three = |e: &Sentinel| e.load_flow_rules([qps(5.0), qps(3.0), threads.clone()]).unwrap();
        assert_eq!(path(|e| (three(e), breaker(e)).1), FastPath::Common);
        assert_eq!(path(|e| e.load_flow_rules([qps(5.0), qps(3.0), qps(2.0), qps(1.0)]).unwrap()), FastPath::Common);
        let five = |e: &Sentinel| e.load_flow_rules([qps(5.0), qps(4.0), qps(3.0), qps(2.0), qps(1.0)]).unwrap();
        assert_eq!(path(five), FastPath::No);
    }

    #[test]
    fn rules_for_origins_take_the_fast_path_while_those_of_one_origin_hold_one_permit_at_most() {
        let qps = |count, app: &str| FlowRule::new("r").count(count).limit_app(app);
        let load = |rules: Vec<FlowRule>| move |e: &Sentinel| e.load_flow_rules(rules).unwrap();
        let threads = FlowRule::new("r").grade(FlowGrade::Thread).count(2.0);
        // Rules for named origins and for "other" (those of one origin, or of "other", apply to a call), beside
        // rules for every caller or none.
        for rules in [
            vec![qps(5.0, "default"), qps(3.0, "appA")],
            vec![qps(3.0, "appA"), qps(2.0, "appB"), qps(1.0, "other")],
            vec![qps(3.0, "appA"), qps(5.0, "default"), threads.clone()],
            vec![qps(3.0, "appA"), qps(5.0, "default"), qps(4.0, "default")],
            vec![qps(3.0, "appA"), qps(5.0, "default"), qps(4.0, "default"), qps(3.0, "default")],
            vec![qps(3.0, "appA").control_behavior(crate::flow::ControlBehavior::RateLimiter)],
            vec![threads.clone().limit_app("appA"), threads.clone().limit_app("other"), qps(5.0, "default")],
            vec![qps(3.0, "appA"), qps(2.0, "appA")],
            vec![qps(1.0, "other"), qps(2.0, "other")],
            vec![threads.clone().limit_app("appA"), qps(2.0, "appA")],
            // Relate rules for every caller, which only read the related resource's node, and chain rules for
            // every caller, which decide on the resource's node in the context they name.
            vec![qps(5.0, "default").relate("other-resource")],
            vec![qps(5.0, "default"), threads.clone().chain("entrance"), qps(3.0, "default").chain("entrance")],
            vec![qps(3.0, "appA"), qps(5.0, "default"), threads.clone().relate("other-resource")],
        ] {
            assert_eq!(path(load(rules.clone())), FastPath::Common, "{rules:?}");
        }
        // Two thread-grade rules for one origin, five rules for one origin, a cluster rule for an origin, a rule
        // on another node, and five rules for every caller: the general path.
        for rules in [
            vec![threads.clone().limit_app("appA"), threads.clone().count(3.0).limit_app("appA")],
            (1..=5).map(|i| qps(f64::from(i), "appA")).collect(),
            vec![qps(3.0, "appA").cluster(crate::flow::ClusterConfig::new(crate::flow::ClusterThresholdType::Global))],
            vec![qps(3.0, "appA").chain("entrance")],
            vec![qps(3.0, "appA").relate("other-resource")],
            [vec![qps(3.0, "appA")], (1..=5).map(|i| qps(f64::from(i), "default")).collect()].concat(),
        ] {
            assert_eq!(path(load(rules.clone())), FastPath::No, "{rules:?}");
        }
    }
}
