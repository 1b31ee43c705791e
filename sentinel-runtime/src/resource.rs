//! Resources and their handles.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::engine::Shared;
use crate::entry::EntryBuilder;
use crate::error::BlockError;
use crate::node::{ClusterNode, DefaultNode};
use crate::rules::ResourceRules;
use crate::Entry;

/// Whether calls come into this process (counted by system rules) or go out of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EntryType {
    /// An inbound call: checked by system rules and counted on the global inbound node.
    In,
    /// An outbound call (the default).
    #[default]
    Out,
}

/// Everything the engine keeps per resource name. Lives as long as its engine.
pub(crate) struct ResourceInner {
    pub(crate) name: Arc<str>,
    pub(crate) cluster: ClusterNode,
    /// The rules in force, read under a `seize` guard (no reference count, no locked instruction on read).
    rules: AtomicPtr<ResourceRules>,
    /// Whether `rules` holds anything: lets an entry skip the load entirely.
    pub(crate) has_rules: AtomicBool,
    /// Whether `rules` holds circuit breakers (the only rules an exit needs).
    pub(crate) has_breakers: AtomicBool,
    /// False for resources past the cap: their entries pass unchecked.
    pub(crate) checked: bool,
    default_ctx_node: OnceLock<Arc<DefaultNode>>,
    ctx_nodes: boxcar::Vec<Arc<DefaultNode>>,
    insert: Mutex<()>,
}

impl ResourceInner {
    pub(crate) fn new(name: Arc<str>, rules: ResourceRules, checked: bool) -> Self {
        let has = !rules.is_empty();
        let breakers = rules.degrade.is_some() || rules.default_degrade.is_some();
        ResourceInner {
            name,
            cluster: ClusterNode::new(),
            rules: AtomicPtr::new(Box::into_raw(Box::new(rules))),
            has_rules: AtomicBool::new(has),
            has_breakers: AtomicBool::new(breakers),
            checked,
            default_ctx_node: OnceLock::new(),
            ctx_nodes: boxcar::Vec::new(),
            insert: Mutex::new(()),
        }
    }

    pub(crate) fn set_rules(&self, collector: &seize::Collector, rules: ResourceRules) {
        let has = !rules.is_empty();
        let breakers = rules.degrade.is_some() || rules.default_degrade.is_some();
        let old = self.rules.swap(Box::into_raw(Box::new(rules)), Ordering::AcqRel);
        self.has_rules.store(has, Ordering::Release);
        self.has_breakers.store(breakers, Ordering::Release);
        // SAFETY: `old` came from `Box::into_raw`, is unlinked, and is freed once no guard can still see it.
        unsafe { collector.retire(old, seize::reclaim::boxed) };
    }

    /// Runs `f` on the rules in force.
    #[inline]
    pub(crate) fn with_rules<R>(&self, collector: &seize::Collector, f: impl FnOnce(&ResourceRules) -> R) -> R {
        use seize::Guard;
        let guard = collector.enter();
        let ptr = guard.protect(&self.rules, Ordering::Acquire);
        // SAFETY: the pointer is never null (always a boxed set), and the guard keeps it alive during `f`.
        f(unsafe { &*ptr })
    }

    /// This resource's node in context `ctx_id` (0 is the default context), created on first use.
    #[inline]
    pub(crate) fn node_for(&self, ctx_id: u32) -> &Arc<DefaultNode> {
        if ctx_id == 0 {
            if let Some(n) = self.default_ctx_node.get() {
                return n;
            }
            return self.default_ctx_node.get_or_init(|| Arc::new(DefaultNode::new(self.name.clone(), 0)));
        }
        for (_, n) in self.ctx_nodes.iter() {
            if n.context_id == ctx_id {
                return n;
            }
        }
        self.create_ctx_node(ctx_id)
    }

    #[cold]
    fn create_ctx_node(&self, ctx_id: u32) -> &Arc<DefaultNode> {
        let _g = self.insert.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = self.ctx_nodes.iter().find(|(_, n)| n.context_id == ctx_id) {
            return n;
        }
        let idx = self.ctx_nodes.push(Arc::new(DefaultNode::new(self.name.clone(), ctx_id)));
        &self.ctx_nodes[idx]
    }

    /// Every default node of the resource (one per context it was entered in).
    pub(crate) fn nodes(&self) -> Vec<Arc<DefaultNode>> {
        let mut v: Vec<_> = self.default_ctx_node.get().cloned().into_iter().collect();
        v.extend(self.ctx_nodes.iter().map(|(_, n)| n.clone()));
        v
    }
}

impl Drop for ResourceInner {
    fn drop(&mut self) {
        // SAFETY: no guard can be active (we have `&mut self`); earlier sets were retired to the collector.
        drop(unsafe { Box::from_raw(*self.rules.get_mut()) });
    }
}

/// A cheap, cloneable handle to a resource of one engine: create it once, enter it many times.
///
/// ```
/// use sentinel_runtime::{Sentinel, flow::FlowRule};
/// let engine = Sentinel::builder().build();
/// engine.load_flow_rules(vec![FlowRule::new("db").count(1.0)]).unwrap();
/// let db = engine.resource("db");
/// let first = db.enter();
/// assert!(first.is_ok());
/// assert!(db.enter().is_err()); // the second call in the same second is over the limit
/// ```
#[derive(Clone)]
pub struct Resource {
    pub(crate) shared: Arc<Shared>,
    pub(crate) inner: Arc<ResourceInner>,
    pub(crate) entry_type: EntryType,
}

impl std::fmt::Debug for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resource").field("name", &self.inner.name).field("entry_type", &self.entry_type).finish()
    }
}

impl Resource {
    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// Inbound or outbound.
    pub fn entry_type(&self) -> EntryType {
        self.entry_type
    }
    /// Enters the resource with one permit, in the current context.
    #[inline]
    pub fn enter(&self) -> Result<Entry<'_>, BlockError> {
        EntryBuilder::new(self).enter()
    }
    /// Starts an entry with options (acquire count, origin, context, hot parameters, priority).
    #[inline]
    pub fn entry(&self) -> EntryBuilder<'_, 'static> {
        EntryBuilder::new(self)
    }
    /// Starts an entry that owns a clone of this handle: a `'static` entry that can move into a future or a
    /// response body (middleware). Costs two reference-count updates more than [`Resource::entry`].
    pub fn entry_owned(&self) -> EntryBuilder<'static, 'static> {
        EntryBuilder::owned(self.clone())
    }
}
