//! A gateway rule set: validated, converted into hot-parameter rules, with the arguments each resource's
//! rules read.

use std::collections::{HashMap, HashSet};

use crate::param_flow::{ParamFlowRule, ParamItemValue};

use super::error::GatewayRuleError;
use super::params::{CompiledItem, GatewayArguments};
use super::rule::{validate, GatewayFlowRule, GatewayParamItem, ResourceMode};
use super::{NOT_MATCHED_COUNT, NOT_MATCHED_PARAM};

/// A validated set of gateway flow rules and what it becomes (see [`GatewayRuleSet::new`]).
///
/// ```
/// use sentinel_runtime::web::gateway::{GatewayFlowRule, GatewayParamItem, GatewayRuleSet, ResourceMode};
/// let set = GatewayRuleSet::new(vec![
///     GatewayFlowRule::new("orders_route").count(100.0),
///     GatewayFlowRule::new("orders_route").count(5.0).param_item(GatewayParamItem::client_ip()),
/// ])
/// .unwrap();
/// let converted = set.param_flow_rules(); // one per rule, in the rules' order
/// assert_eq!((converted[0].param_idx, converted[0].count), (1, 100.0)); // the constant `$D`, last
/// assert_eq!((converted[1].param_idx, converted[1].count), (0, 5.0)); // per client IP
/// assert_eq!(set.arguments(ResourceMode::RouteId, "orders_route").unwrap().len(), 2);
/// ```
#[derive(Clone, Debug, Default)]
pub struct GatewayRuleSet {
    rules: Vec<GatewayFlowRule>,
    param_rules: Vec<ParamFlowRule>,
    /// By resource name, looked up on every request in gateway mode: foldhash, as the engine's name maps
    /// (short names, maps bounded by the rules; SipHash cost about five times as much).
    routes: HashMap<String, GatewayArguments, foldhash::fast::RandomState>,
    apis: HashMap<String, GatewayArguments, foldhash::fast::RandomState>,
}

/// A rule's identity for removing repeated rules (`count` by its bits).
#[derive(PartialEq, Eq, Hash)]
struct RuleKey<'r> {
    resource: &'r str,
    mode: ResourceMode,
    grade: crate::flow::FlowGrade,
    count: u64,
    interval_sec: u64,
    behavior: crate::flow::ControlBehavior,
    burst: u64,
    max_queueing_timeout_ms: u64,
    item: Option<&'r GatewayParamItem>,
}

impl<'r> RuleKey<'r> {
    fn of(r: &'r GatewayFlowRule) -> Self {
        RuleKey {
            resource: &r.resource,
            mode: r.resource_mode,
            grade: r.grade,
            count: r.count.to_bits(),
            interval_sec: r.interval_sec,
            behavior: r.control_behavior,
            burst: r.burst,
            max_queueing_timeout_ms: r.max_queueing_timeout_ms,
            item: r.param_item.as_ref(),
        }
    }
}

/// The hot-parameter rule a gateway rule becomes, reading argument `idx` (Java's `GatewayRuleConverter`):
/// the same threshold, grade, behaviour and burst, `interval_sec` as the duration, and, when the item has a
/// pattern, the "not matched" value with Java's budget of [`NOT_MATCHED_COUNT`].
pub(crate) fn to_param_rule(rule: &GatewayFlowRule, idx: usize) -> ParamFlowRule {
    let mut converted = ParamFlowRule::new(rule.resource.clone(), i32::try_from(idx).unwrap_or(i32::MAX))
        .count(rule.count)
        .grade(rule.grade)
        .duration_in_sec(rule.interval_sec)
        .burst_count(rule.burst)
        .control_behavior(rule.control_behavior)
        .max_queueing_time_ms(rule.max_queueing_timeout_ms);
    if rule.param_item.as_ref().and_then(GatewayParamItem::effective_pattern).is_some() {
        converted = converted.item(ParamItemValue::Str(NOT_MATCHED_PARAM.to_string()), NOT_MATCHED_COUNT);
    }
    converted
}

/// Whether `rule` is a rate limiter: values that do not match its pattern pass uncounted (see
/// `CompiledItem::without_unmatched`).
fn spaces_calls(rule: &GatewayFlowRule) -> bool {
    rule.grade == crate::flow::FlowGrade::Qps && rule.control_behavior == crate::flow::ControlBehavior::RateLimiter
}

impl GatewayRuleSet {
    /// Validates `rules` (the first invalid one rejects the set, naming the rule and the field), drops
    /// repeated ones, and converts each into a hot-parameter rule on its resource, as Java does:
    ///
    /// - a rule with a parameter item reads its own argument; these take positions 0, 1, … per resource
    ///   name, in load order;
    /// - the rules without one (the resource as a whole) read the constant [`DEFAULT_PARAM`](super::DEFAULT_PARAM)
    ///   at the next position, shared by all of them (one for route rules, then one for API rules when a
    ///   name is used as both).
    pub fn new(rules: Vec<GatewayFlowRule>) -> Result<Self, GatewayRuleError> {
        super::within_regex_budget(|| Self::compile_set(rules))
    }

    /// [`new`](Self::new), within the set's budget for regular expressions.
    fn compile_set(rules: Vec<GatewayFlowRule>) -> Result<Self, GatewayRuleError> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (index, rule) in rules.iter().enumerate() {
            validate(rule, index)?;
            let item = match &rule.param_item {
                Some(item) => {
                    let compiled = CompiledItem::compile(item)
                        .map_err(|reason| GatewayRuleError::rule(index, &rule.resource, "param_item", reason))?;
                    Some(if spaces_calls(rule) { compiled.without_unmatched() } else { compiled })
                }
                None => None,
            };
            compiled.push(item);
        }
        let mut seen = HashSet::new();
        let unique: Vec<(usize, Option<CompiledItem>)> =
            compiled.into_iter().enumerate().filter(|(i, _)| seen.insert(RuleKey::of(&rules[*i]))).collect();

        // Positions per resource name: parameter rules first, in load order, then one constant per mode.
        let mut next: HashMap<&str, usize> = HashMap::new();
        let mut positions = vec![0usize; rules.len()];
        for (i, item) in &unique {
            if item.is_some() {
                let n = next.entry(rules[*i].resource.as_str()).or_default();
                positions[*i] = *n;
                *n += 1;
            }
        }
        let mut constants: HashMap<(&str, ResourceMode), usize> = HashMap::new();
        for mode in [ResourceMode::RouteId, ResourceMode::CustomApiName] {
            for (i, item) in &unique {
                let r = &rules[*i];
                if item.is_none() && r.resource_mode == mode && !constants.contains_key(&(r.resource.as_str(), mode)) {
                    let n = next.entry(r.resource.as_str()).or_default();
                    constants.insert((r.resource.as_str(), mode), *n);
                    *n += 1;
                }
            }
        }

        let mut set = GatewayRuleSet::default();
        for (i, item) in unique {
            let rule = &rules[i];
            let idx = match item {
                Some(_) => positions[i],
                None => constants[&(rule.resource.as_str(), rule.resource_mode)],
            };
            set.param_rules.push(to_param_rule(rule, idx));
            let by_mode = match rule.resource_mode {
                ResourceMode::RouteId => &mut set.routes,
                ResourceMode::CustomApiName => &mut set.apis,
            };
            let args = by_mode.entry(rule.resource.clone()).or_default();
            args.len = next[rule.resource.as_str()];
            match item {
                Some(item) => args.items.push((idx, item)),
                None => args.constant = Some(idx),
            }
            set.rules.push(rule.clone());
        }
        // A name used in both modes: each mode's arguments span every position of the name.
        for (name, args) in set.routes.iter_mut().chain(set.apis.iter_mut()) {
            args.len = next[name.as_str()];
        }
        Ok(set)
    }

    /// The rules, without repeats, in load order.
    pub fn rules(&self) -> &[GatewayFlowRule] {
        &self.rules
    }

    /// The hot-parameter rules the gateway rules become (one per rule, in the order of [`rules`](Self::rules)).
    pub fn param_flow_rules(&self) -> &[ParamFlowRule] {
        &self.param_rules
    }

    /// The arguments the rules of `resource` read when a request enters it in `mode` (as its route, or as
    /// an API it belongs to); `None` when no rule of that mode names it.
    pub fn arguments(&self, mode: ResourceMode, resource: &str) -> Option<&GatewayArguments> {
        match mode {
            ResourceMode::RouteId => self.routes.get(resource),
            ResourceMode::CustomApiName => self.apis.get(resource),
        }
    }

    /// Whether the set holds no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}
