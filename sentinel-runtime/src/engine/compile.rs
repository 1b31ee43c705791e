//! Each resource's rules, compiled from every kind's manager ([`ResourceRules`]) with the chain's flags for
//! them (which path a call on them can take): above the chain, so that the state below it
//! ([`super::shared::Shared`]) knows no chain.

use std::sync::Arc;

use crate::chain::has_slow_rules;
use crate::engine::shared::Shared;
use crate::rules::ResourceRules;

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
        fast_path: false,
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
    rules.fast_path = !has_slow_rules(&rules, shared)
        && rules.param.as_ref().is_none_or(|p| p.on_fast_path())
        && rules.flow.as_ref().is_none_or(|f| f.fast_rules().is_some())
        && rules.adaptive.as_ref().is_none_or(|a| a.never_waits());
    rules.cluster_only = !has_slow_rules(&rules, shared)
        && rules.param.is_none()
        && rules.flow.as_ref().is_some_and(|f| f.cluster_only());
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
}
