//! What the engine keeps per resource name: its cluster node, its nodes per context and the rules in force.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::node::{ClusterNode, DefaultNode};
use crate::rcu::{RcuPtr, RetireBatch};
use crate::rules::ResourceRules;

/// Everything the engine keeps per resource name. Lives as long as its engine.
pub(crate) struct ResourceInner {
    /// The name, with its per-stripe copies for the errors of blocked calls.
    pub(crate) name: crate::stat::stripe::SharedName,
    pub(crate) cluster: ClusterNode,
    /// The rules in force, read in an RCU section (no reference count, no locked instruction on read).
    rules: RcuPtr<ResourceRules>,
    /// Whether `rules` holds anything: lets an entry skip the load entirely.
    pub(crate) has_rules: AtomicBool,
    /// Whether `rules` holds rules that a call's exit reads (circuit breakers, an adaptive limit): the
    /// exit reads the rules only then. Set before rules that need it are published and cleared after
    /// rules that do not, so that an entry admitted under rules it names finds it set at its exit.
    pub(crate) exit_reads_rules: AtomicBool,
    /// Response-time histogram and blocks by kind, once an integration observes them (next to
    /// `exit_reads_rules`, which every exit reads).
    pub(crate) observed: OnceLock<crate::observe::Observed>,
    default_ctx_node: OnceLock<Arc<DefaultNode>>,
    /// Whether the default context's node must record its own calls from its creation (a rule reads it).
    split_default: AtomicBool,
    ctx_nodes: boxcar::Vec<Arc<DefaultNode>>,
    insert: Mutex<()>,
}

impl ResourceInner {
    pub(crate) fn new(name: Arc<str>, rules: ResourceRules) -> Self {
        let split_default = rules.flow.as_ref().is_some_and(|f| f.reads_default_context());
        let has = !rules.is_empty();
        let exit_reads = exit_reads_rules(&rules);
        let cluster = ClusterNode::new();
        for (id, name) in &rules.named_origins {
            cluster.ensure_named_origin(*id, name);
        }
        ResourceInner {
            name: crate::stat::stripe::SharedName::new(name),
            cluster,
            rules: RcuPtr::new(rules),
            has_rules: AtomicBool::new(has),
            exit_reads_rules: AtomicBool::new(exit_reads),
            observed: OnceLock::new(),
            default_ctx_node: OnceLock::new(),
            split_default: AtomicBool::new(split_default),
            ctx_nodes: boxcar::Vec::new(),
            insert: Mutex::new(()),
        }
    }

    /// Publishes `rules`; the previous set goes to `retired`, freed after a grace period.
    pub(crate) fn set_rules(&self, rules: ResourceRules, retired: &mut RetireBatch<ResourceRules>) {
        if rules.flow.as_ref().is_some_and(|f| f.reads_default_context()) {
            self.split_default_node();
        }
        for (id, name) in &rules.named_origins {
            self.cluster.ensure_named_origin(*id, name);
        }
        let has = !rules.is_empty();
        let exit_reads = exit_reads_rules(&rules);
        if exit_reads {
            // Before the rules: an entry that reads them (an acquire load that the replace below
            // releases) then finds the flag set at its exit.
            self.exit_reads_rules.store(true, Ordering::Release);
        }
        retired.push(self.rules.replace(rules));
        self.has_rules.store(has, Ordering::Release);
        if !exit_reads {
            // After the rules: an exit that still reads `true` reads rules whose exit has nothing to do.
            self.exit_reads_rules.store(false, Ordering::Release);
        }
    }

    /// Runs `f` on the rules in force.
    #[inline(always)]
    pub(crate) fn with_rules<R>(&self, f: impl FnOnce(&ResourceRules) -> R) -> R {
        self.rules.read(f)
    }

    /// Whether the resource was ever entered (in any context, whether the call passed or not): its first
    /// entry makes its node in that context, as Java's first entry makes its cluster node.
    pub(crate) fn was_entered(&self) -> bool {
        self.default_ctx_node.get().is_some() || self.ctx_nodes.count() > 0
    }

    /// This resource's node in context `ctx_id` (0 is the default context), created on first use.
    #[inline]
    pub(crate) fn node_for(&self, ctx_id: u32) -> &Arc<DefaultNode> {
        if ctx_id == 0 {
            if let Some(n) = self.default_ctx_node.get() {
                return n;
            }
            return self.create_default_node();
        }
        for (_, n) in self.ctx_nodes.iter() {
            if n.context_id == ctx_id {
                return n;
            }
        }
        self.create_ctx_node(ctx_id)
    }

    #[cold]
    fn create_default_node(&self) -> &Arc<DefaultNode> {
        let _g = self.insert.lock().unwrap_or_else(|e| e.into_inner());
        let split = self.ctx_nodes.count() > 0 || self.split_default.load(Ordering::Relaxed);
        self.default_ctx_node
            .get_or_init(|| Arc::new(DefaultNode::new_default(self.name.clone(), &self.cluster.stat, split)))
    }

    #[cold]
    fn create_ctx_node(&self, ctx_id: u32) -> &Arc<DefaultNode> {
        let _g = self.insert.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = self.ctx_nodes.iter().find(|(_, n)| n.context_id == ctx_id) {
            return n;
        }
        // The default context's node no longer counts what the cluster node counts.
        if let Some(d) = self.default_ctx_node.get() {
            d.split();
        }
        let idx = self.ctx_nodes.push(Arc::new(DefaultNode::new(self.name.clone(), ctx_id)));
        &self.ctx_nodes[idx]
    }

    /// Makes the default context's node record its own calls (a rule reads it).
    fn split_default_node(&self) {
        let _g = self.insert.lock().unwrap_or_else(|e| e.into_inner());
        self.split_default.store(true, Ordering::Relaxed);
        if let Some(d) = self.default_ctx_node.get() {
            d.split();
        }
    }

    /// Every default node of the resource (one per context it was entered in).
    pub(crate) fn nodes(&self) -> Vec<Arc<DefaultNode>> {
        let mut v: Vec<_> = self.default_ctx_node.get().cloned().into_iter().collect();
        v.extend(self.ctx_nodes.iter().map(|(_, n)| n.clone()));
        v
    }
}

/// Whether a call's exit reads `rules`: circuit breakers count the call (a probe decides its breaker), an
/// adaptive limit takes back the call's place, a thread-grade hot-parameter rule takes back its permits.
fn exit_reads_rules(rules: &ResourceRules) -> bool {
    rules.degrade.is_some()
        || rules.default_degrade.is_some()
        || rules.adaptive.is_some()
        || rules.param.as_ref().is_some_and(|p| p.rules.iter().any(|st| st.holds_permits()))
}
