//! The gateway rules and API definitions in force on an engine: loaded through [`Sentinel`]'s gateway
//! methods, read by the web layer's gateway mode and the command center.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::error::RuleError;
use crate::param_flow::ParamRuleOwner;
use crate::Sentinel;

use super::api::{ApiDefinition, ApiMatcher};
use super::error::GatewayRuleError;
use super::rule::GatewayFlowRule;
use super::rule_set::GatewayRuleSet;

/// What one engine holds of the gateway (kept as an engine extension: the engine knows nothing of it).
#[derive(Default)]
pub(crate) struct GatewayState {
    /// The rules and the API definitions, published together: a request reads both with one load.
    in_force: ArcSwap<InForce>,
    /// Serializes loads (a rule set is published together with its hot-parameter rules).
    load_lock: Mutex<()>,
    /// Whether a layer in gateway mode was built on the engine.
    layer_built: AtomicBool,
}

/// The gateway rules and the API definitions in force.
#[derive(Default)]
pub(crate) struct InForce {
    pub(crate) rules: Arc<GatewayRuleSet>,
    pub(crate) apis: Arc<ApiSet>,
}

/// The API definitions in force, as loaded and compiled.
#[derive(Default)]
pub(crate) struct ApiSet {
    pub(crate) definitions: Vec<ApiDefinition>,
    pub(crate) matcher: ApiMatcher,
    /// Each API's resource (in the matcher's order), found at the first request that matches it, so that a
    /// request enters it without looking its name up or taking a reference count. Its `ResourceInner` only:
    /// a `Resource` holds its engine, which holds this set.
    resources: Box<[std::sync::OnceLock<Arc<crate::resource::inner::ResourceInner>>]>,
}

impl ApiSet {
    fn new(definitions: Vec<ApiDefinition>, matcher: ApiMatcher) -> Self {
        let resources = (0..matcher.len()).map(|_| std::sync::OnceLock::new()).collect();
        ApiSet { definitions, matcher, resources }
    }

    /// Runs `f` on the resource of the API at `at` (in the matcher's order), named `name`.
    pub(crate) fn with_resource<R>(
        &self,
        engine: &Sentinel,
        at: usize,
        name: &str,
        f: impl FnOnce(&crate::Resource) -> R,
    ) -> R {
        let Some(slot) = self.resources.get(at) else {
            return f(&engine.resource_typed(name, crate::EntryType::In));
        };
        let inner = match slot.get() {
            Some(inner) => inner,
            None => {
                let resource = engine.resource_typed(name, crate::EntryType::In);
                if resource.name() != name {
                    // Past the resource cap: the overflow resource, not kept (a rule loaded later that names
                    // the API gives it a resource of its own).
                    return f(&resource);
                }
                slot.get_or_init(|| resource.inner.clone())
            }
        };
        crate::Resource::with_view(&engine.shared, inner, crate::EntryType::In, f)
    }
}

impl GatewayState {
    /// The rules and the API definitions in force (a request's one read of both).
    pub(crate) fn in_force(&self) -> arc_swap::Guard<Arc<InForce>> {
        self.in_force.load()
    }
    /// The rule set in force.
    pub(crate) fn rules(&self) -> Arc<GatewayRuleSet> {
        self.in_force.load().rules.clone()
    }
    /// The API definitions in force.
    pub(crate) fn apis(&self) -> Arc<ApiSet> {
        self.in_force.load().apis.clone()
    }
    /// Notes that a layer in gateway mode serves requests (the application is a gateway).
    pub(crate) fn mark_in_use(&self) {
        self.layer_built.store(true, Ordering::Relaxed);
    }
}

/// A converted rule the hot-parameter kind refused (the gateway's own validation should not let one
/// through): reported on the gateway rule it came from.
fn converted_rule_refused(e: RuleError, set: &GatewayRuleSet) -> GatewayRuleError {
    let RuleError::Invalid { index, field, reason, .. } = e;
    let resource = set.rules().get(index).map(|r| r.resource.as_str()).unwrap_or_default();
    GatewayRuleError::rule(index, resource, field, reason)
}

impl Sentinel {
    /// This engine's gateway state.
    pub(crate) fn gateway(&self) -> Arc<GatewayState> {
        self.extension::<GatewayState>()
    }

    /// Replaces the gateway flow rules (feature `tower`; see [`web::gateway`](crate::web::gateway)).
    ///
    /// The set is validated first: the first invalid rule rejects it, naming the rule and the field, and
    /// the rules in force stay. As in Java, each rule becomes a hot-parameter rule on its resource; these
    /// join the hot-parameter rules loaded with [`load_param_flow_rules`](Sentinel::load_param_flow_rules)
    /// without replacing them (and are not listed by [`param_flow_rules`](Sentinel::param_flow_rules)). A
    /// rule that stays keeps its counters, and loading either kind never resets the other's.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// use sentinel_runtime::web::gateway::{GatewayFlowRule, GatewayParamItem};
    /// let engine = Sentinel::builder().build();
    /// engine
    ///     .load_gateway_rules([GatewayFlowRule::new("orders").count(5.0).param_item(GatewayParamItem::client_ip())])
    ///     .unwrap();
    /// assert_eq!(engine.gateway_rules().len(), 1);
    /// assert!(engine.param_flow_rules().is_empty()); // the user's own list is untouched
    /// assert!(engine.uses_gateway());
    /// ```
    pub fn load_gateway_rules(&self, rules: impl IntoIterator<Item = GatewayFlowRule>) -> Result<(), GatewayRuleError> {
        let set = GatewayRuleSet::new(rules.into_iter().collect())?;
        let state = self.gateway();
        let _g = state.load_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.load_param_flow_rules_of(ParamRuleOwner::Gateway, set.param_flow_rules().to_vec())
            .map_err(|e| converted_rule_refused(e, &set))?;
        let apis = state.in_force.load().apis.clone();
        state.in_force.store(Arc::new(InForce { rules: Arc::new(set), apis }));
        Ok(())
    }

    /// The gateway flow rules in force (without repeats, in load order).
    pub fn gateway_rules(&self) -> Vec<GatewayFlowRule> {
        self.gateway().rules().rules().to_vec()
    }

    /// Replaces the API definitions (feature `tower`): named groups of paths, each a resource of its own
    /// that the web layer's gateway mode enters for every request whose path matches. The first invalid
    /// definition rejects the set and the definitions in force stay.
    ///
    /// ```
    /// use sentinel_runtime::Sentinel;
    /// use sentinel_runtime::web::gateway::{ApiDefinition, ApiPredicateItem};
    /// let engine = Sentinel::builder().build();
    /// engine.load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))]).unwrap();
    /// assert!(engine.load_api_definitions([ApiDefinition::new("bad").item(ApiPredicateItem::regex("a("))]).is_err());
    /// assert_eq!(engine.api_definitions()[0].api_name, "products");
    /// ```
    pub fn load_api_definitions(
        &self,
        definitions: impl IntoIterator<Item = ApiDefinition>,
    ) -> Result<(), GatewayRuleError> {
        let definitions: Vec<ApiDefinition> = definitions.into_iter().collect();
        let matcher = ApiMatcher::new(&definitions)?;
        let state = self.gateway();
        let _g = state.load_lock.lock().unwrap_or_else(|e| e.into_inner());
        let rules = state.in_force.load().rules.clone();
        state.in_force.store(Arc::new(InForce { rules, apis: Arc::new(ApiSet::new(definitions, matcher)) }));
        Ok(())
    }

    /// The API definitions in force, in load order.
    pub fn api_definitions(&self) -> Vec<ApiDefinition> {
        self.gateway().apis().definitions.clone()
    }

    /// Whether the application is a gateway: a web layer in gateway mode was built on this engine, or
    /// gateway rules or API definitions are loaded. The command center's heartbeat then reports
    /// `app_type=1`, so the dashboard shows its gateway pages.
    pub fn uses_gateway(&self) -> bool {
        let state = self.gateway();
        state.layer_built.load(Ordering::Relaxed) || !state.rules().is_empty() || !state.apis().definitions.is_empty()
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;
    use crate::web::gateway::ApiPredicateItem;

    #[test]
    fn an_api_groups_resource_is_entered_through_a_view_that_leaves_every_reference_count_as_it_was() {
        // Not leaked: an owned entry holds the engine's state (a hold on the thread's stripe, no count).
        let engine = Sentinel::builder().build();
        engine
            .load_api_definitions([ApiDefinition::new("products").item(ApiPredicateItem::prefix("/product/**"))])
            .unwrap();
        let state = engine.gateway();
        let apis = state.apis();
        assert!(apis.with_resource(&engine, 0, "products", |r| r.entry_owned().enter().is_ok()));
        let inner = apis.resources[0].get().expect("kept from the first request").clone();
        let counts = || (Arc::strong_count(&engine.shared), Arc::strong_count(&inner));
        let before = counts();
        for _ in 0..100 {
            apis.with_resource(&engine, 0, "products", |r| {
                assert_eq!(r.name(), "products");
                let e = r.entry_owned().enter().unwrap();
                drop(r.clone());
                drop(e);
            });
            assert_eq!(counts(), before);
        }
        let held = apis.with_resource(&engine, 0, "products", |r| r.entry_owned().enter().unwrap());
        assert_eq!(counts(), before, "an owned entry holds the engine's state without a count");
        drop(held);
        assert_eq!(counts(), before);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            apis.with_resource(&engine, 0, "products", |_| panic!("user code"))
        }));
        assert!(panicked.is_err());
        assert_eq!(counts(), before, "a panic in the call gives back nothing it did not take");
        assert_eq!(engine.cluster_stats("products").unwrap().minute_pass, 102);
    }
}
