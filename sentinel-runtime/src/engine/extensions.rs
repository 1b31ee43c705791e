//! What integrations keep per engine without the engine knowing their types, and the narrow door through
//! which the gateway loads its converted hot-parameter rules (as an owner of its own).

use std::any::Any;
use std::sync::Arc;

use crate::error::RuleError;
use crate::param_flow::{ParamFlowRule, ParamRuleOwner};
use crate::Sentinel;

/// One value per type, created on first use (a few per engine: a linear scan on a cold path).
#[derive(Default)]
pub(crate) struct Extensions {
    values: std::sync::Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Sentinel {
    /// This engine's value of type `T`, created with `T::default()` on first use. Cold path: integrations
    /// look it up once (a layer when built, a command when it runs) and keep the `Arc`.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn extension<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut values = self.shared.extensions.values.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = values.iter().find_map(|v| v.clone().downcast::<T>().ok()) {
            return found;
        }
        let value = Arc::new(T::default());
        values.push(value.clone());
        value
    }

    /// Replaces `owner`'s hot-parameter rules (the user's stay when the gateway loads, and the other way
    /// round); counters of rules that stay are kept.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn load_param_flow_rules_of(
        &self,
        owner: ParamRuleOwner,
        rules: Vec<ParamFlowRule>,
    ) -> Result<(), RuleError> {
        if self.shared.param.load(owner, rules)? {
            self.shared.refresh_rules();
        }
        Ok(())
    }
}
