//! Reading the numbers of any node from outside: per resource, origin, context and entrance.

use std::sync::Arc;

use crate::node::DefaultNode;
use crate::stat::{MetricEvent, StatNode};
use crate::Sentinel;

/// A node's numbers at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStats {
    /// Passed per second (sliding 1 s window).
    pub pass_qps: f64,
    /// Blocked per second.
    pub block_qps: f64,
    /// Completed per second.
    pub success_qps: f64,
    /// Completed with a traced error, per second.
    pub exception_qps: f64,
    /// Pass plus block per second.
    pub total_qps: f64,
    /// Prioritized passes that borrowed a later window, per second.
    pub occupied_pass_qps: f64,
    /// Average response time, ms.
    pub avg_rt_ms: f64,
    /// Minimum response time, ms (at least 1; 5000 when none).
    pub min_rt_ms: f64,
    /// Calls in flight.
    pub threads: u64,
    /// Passes in the previous whole second.
    pub previous_pass_qps: f64,
    /// Blocks in the previous whole second.
    pub previous_block_qps: f64,
    /// `max(1, max bucket success) * samples / interval`.
    pub max_success_qps: f64,
    /// Passes over the last minute.
    pub minute_pass: u64,
    /// Blocks over the last minute.
    pub minute_block: u64,
    /// Completions over the last minute.
    pub minute_success: u64,
    /// Exceptions over the last minute.
    pub minute_exception: u64,
}

impl NodeStats {
    pub(crate) fn read(node: &StatNode, now_ms: u64) -> Self {
        let minute = node.minute_totals(now_ms);
        NodeStats {
            pass_qps: node.pass_qps(now_ms),
            block_qps: node.block_qps(now_ms),
            success_qps: node.success_qps(now_ms),
            exception_qps: node.exception_qps(now_ms),
            total_qps: node.total_qps(now_ms),
            occupied_pass_qps: node.occupied_pass_qps(now_ms),
            avg_rt_ms: node.avg_rt_ms(now_ms),
            min_rt_ms: node.min_rt_ms(now_ms),
            threads: node.cur_threads(),
            previous_pass_qps: node.previous_pass_qps(now_ms),
            previous_block_qps: node.previous_block_qps(now_ms),
            max_success_qps: node.max_success_qps(now_ms),
            minute_pass: minute.get(MetricEvent::Pass),
            minute_block: minute.get(MetricEvent::Block),
            minute_success: minute.get(MetricEvent::Success),
            minute_exception: minute.get(MetricEvent::Exception),
        }
    }

    /// Sums children (an entrance node, the machine root); rt is the children's average rts weighted by their
    /// pass qps, as Java's `EntranceNode.avgRt` (`Σ avgRt·passQps / ΣpassQps`, 0 without passes).
    pub(crate) fn sum(children: &[NodeStats]) -> Self {
        let mut s = NodeStats { min_rt_ms: 5000.0, ..Default::default() };
        let mut rt_weighted = 0.0;
        for c in children {
            s.pass_qps += c.pass_qps;
            s.block_qps += c.block_qps;
            s.success_qps += c.success_qps;
            s.exception_qps += c.exception_qps;
            s.total_qps += c.total_qps;
            s.occupied_pass_qps += c.occupied_pass_qps;
            s.threads += c.threads;
            s.previous_pass_qps += c.previous_pass_qps;
            s.previous_block_qps += c.previous_block_qps;
            s.max_success_qps += c.max_success_qps;
            s.minute_pass += c.minute_pass;
            s.minute_block += c.minute_block;
            s.minute_success += c.minute_success;
            s.minute_exception += c.minute_exception;
            s.min_rt_ms = s.min_rt_ms.min(c.min_rt_ms);
            rt_weighted += c.avg_rt_ms * c.pass_qps;
        }
        if s.pass_qps > 0.0 {
            s.avg_rt_ms = rt_weighted / s.pass_qps;
        }
        s
    }
}

/// A node's totals over one whole second, in the units of Sentinel's metric lines (the metric log, the
/// dashboard's `metric` command).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SecondTotals {
    /// Start of the second, ms since the epoch.
    pub start_ms: u64,
    /// Passed calls.
    pub pass: u64,
    /// Blocked calls.
    pub block: u64,
    /// Completed calls (Java's "success": with or without error).
    pub success: u64,
    /// Completed calls with a traced error.
    pub exception: u64,
    /// Average response time of the completed calls, whole ms (0 when none completed).
    pub rt_ms: u64,
    /// Prioritized calls that borrowed a later window.
    pub occupied_pass: u64,
}

impl SecondTotals {
    pub(crate) fn new(start_ms: u64, t: &crate::stat::BucketTotals) -> Self {
        let success = t.get(MetricEvent::Success);
        SecondTotals {
            start_ms,
            pass: t.get(MetricEvent::Pass),
            block: t.get(MetricEvent::Block),
            success,
            exception: t.get(MetricEvent::Exception),
            rt_ms: t.get(MetricEvent::RtMicros).checked_div(success).map_or(0, |us| us / 1000),
            occupied_pass: t.get(MetricEvent::OccupiedPass),
        }
    }

    /// The complete seconds (before the one `now_ms` is in) of `node` with at least one event, oldest first.
    pub(crate) fn complete(node: &StatNode, now_ms: u64) -> Vec<SecondTotals> {
        let boundary = now_ms - now_ms % 1000;
        node.seconds(now_ms).into_iter().filter(|(s, _)| *s < boundary).map(|(s, t)| Self::new(s, &t)).collect()
    }
}

/// A node of the call tree (for the `tree` command and diagnostics).
#[derive(Clone, Debug, PartialEq)]
pub struct TreeNode {
    /// The resource's name, or the context's for an entrance.
    pub name: String,
    /// The node's numbers.
    pub stats: NodeStats,
    /// Nodes entered below it.
    pub children: Vec<TreeNode>,
}

fn tree_of(node: &Arc<DefaultNode>, now_ms: u64, depth: usize) -> TreeNode {
    tree_below(node, now_ms, &mut Vec::with_capacity(depth + 8))
}

/// A node's tree; `path` holds its ancestors. A node entered inside itself (recursion) is shown once more
/// below itself, without its children again, so the tree stays finite however the calls recurse.
fn tree_below(node: &Arc<DefaultNode>, now_ms: u64, path: &mut Vec<*const DefaultNode>) -> TreeNode {
    let me = Arc::as_ptr(node);
    let children = if path.contains(&me) || path.len() > 64 {
        Vec::new()
    } else {
        path.push(me);
        let c = node.children().iter().map(|c| tree_below(c, now_ms, path)).collect();
        path.pop();
        c
    };
    TreeNode { name: node.resource.to_string(), stats: NodeStats::read(node.stats(), now_ms), children }
}

impl Sentinel {
    /// A resource's numbers over all contexts and origins (its cluster node).
    pub fn cluster_stats(&self, resource: &str) -> Option<NodeStats> {
        let r = self.shared.find_resource(resource)?;
        Some(NodeStats::read(&r.cluster.stat, self.shared.now_ms()))
    }

    /// A resource's numbers for one caller origin.
    pub fn origin_stats(&self, resource: &str, origin: &str) -> Option<NodeStats> {
        let r = self.shared.find_resource(resource)?;
        let id = self.shared.origin_id(origin)?;
        let n = r.cluster.find_origin(id)?;
        Some(NodeStats::read(n, self.shared.now_ms()))
    }

    /// Every origin that called a resource, with its numbers.
    pub fn origins_of(&self, resource: &str) -> Vec<(String, NodeStats)> {
        let now = self.shared.now_ms();
        self.shared
            .find_resource(resource)
            .map(|r| r.cluster.origins().map(|o| (o.origin.to_string(), NodeStats::read(&o.stat, now))).collect())
            .unwrap_or_default()
    }

    /// A resource's numbers in one context.
    pub fn context_stats(&self, resource: &str, context: &str) -> Option<NodeStats> {
        let r = self.shared.find_resource(resource)?;
        let now = self.shared.now_ms();
        r.nodes()
            .iter()
            .find(|n| self.context_name(n.context_id).as_deref() == Some(context))
            .map(|n| NodeStats::read(n.stats(), now))
    }

    /// A context's entrance numbers: the sums of the resources entered directly in it.
    pub fn entrance_stats(&self, context: &str) -> Option<NodeStats> {
        let now = self.shared.now_ms();
        let ctx = self.shared.contexts().find(|c| &**c.name() == context)?;
        let children: Vec<NodeStats> =
            ctx.entrance.children.list().iter().map(|c| NodeStats::read(c.stats(), now)).collect();
        Some(NodeStats::sum(&children))
    }

    /// The global inbound node's numbers (all `In` entries).
    pub fn inbound_stats(&self) -> NodeStats {
        NodeStats::read(&self.shared.inbound, self.shared.now_ms())
    }

    /// The call tree: one entrance per context, with the resources entered below it. The default context
    /// shows once a call has run in it (Java makes its entrance with the first call outside any context).
    pub fn tree(&self) -> Vec<TreeNode> {
        let now = self.shared.now_ms();
        self.shared
            .contexts()
            .filter_map(|c| {
                let children: Vec<TreeNode> = c.entrance.children.list().iter().map(|n| tree_of(n, now, 0)).collect();
                if children.is_empty() && &**c.name() == crate::context::DEFAULT_CONTEXT_NAME {
                    return None;
                }
                let stats = NodeStats::sum(&children.iter().map(|t| t.stats.clone()).collect::<Vec<_>>());
                Some(TreeNode { name: c.name().to_string(), stats, children })
            })
            .collect()
    }

    /// Per-second totals of a resource over the last minute, oldest first (for metric logs).
    pub fn resource_seconds(&self, resource: &str) -> Vec<(u64, crate::stat::BucketTotals)> {
        match self.shared.find_resource(resource) {
            Some(r) => r.cluster.stat.seconds(self.shared.now_ms()),
            None => Vec::new(),
        }
    }

    /// A resource's complete seconds over the last minute (the second in progress left out), oldest first,
    /// seconds with no event left out: what the metric log and the dashboard's `metric` command report.
    pub fn resource_complete_seconds(&self, resource: &str) -> Vec<SecondTotals> {
        match self.shared.find_resource(resource) {
            Some(r) => SecondTotals::complete(&r.cluster.stat, self.shared.now_ms()),
            None => Vec::new(),
        }
    }

    /// The complete seconds of the global inbound node (all `In` entries), as
    /// [`resource_complete_seconds`](Sentinel::resource_complete_seconds).
    pub fn inbound_complete_seconds(&self) -> Vec<SecondTotals> {
        SecondTotals::complete(&self.shared.inbound, self.shared.now_ms())
    }

    fn context_name(&self, id: u32) -> Option<String> {
        self.shared.context_by_id(id).map(|c| c.name().to_string())
    }
}
