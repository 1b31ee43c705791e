//! The statistics tree: default nodes per (resource, context), cluster nodes per resource with their origin
//! nodes, entrance nodes per context.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::stat::StatNode;

/// A resource's node in one context. Children are the resources entered while this one was active.
///
/// The default context's node of a resource entered in no other context would count exactly what the
/// resource's cluster node counts, so until the resource is first entered in a named context (or a chain rule
/// names the default context) it records nothing and reads the cluster node's numbers: an entry in the default
/// context then records on one node instead of two. From that moment on it records its own calls; the
/// numbers it shows then start from that moment.
pub struct DefaultNode {
    pub(crate) resource: Arc<str>,
    pub(crate) context_id: u32,
    pub(crate) stat: StatNode,
    pub(crate) children: Children,
    /// For the default context's node: the resource's cluster node, whose numbers it shows while not `split`.
    cluster: Option<NonNull<StatNode>>,
    /// Whether this node records its own calls.
    split: AtomicBool,
}

// SAFETY: `cluster` points to the cluster node of the resource that owns this node; the resource lives as long
// as its engine, which outlives every node of it, and `StatNode` is `Sync`.
unsafe impl Send for DefaultNode {}
unsafe impl Sync for DefaultNode {}

impl DefaultNode {
    pub(crate) fn new(resource: Arc<str>, context_id: u32) -> Self {
        DefaultNode {
            resource,
            context_id,
            stat: StatNode::new(),
            children: Children::default(),
            cluster: None,
            split: AtomicBool::new(true),
        }
    }
    /// The default context's node, showing `cluster`'s numbers until split.
    pub(crate) fn new_default(resource: Arc<str>, cluster: &StatNode, split: bool) -> Self {
        DefaultNode { cluster: Some(NonNull::from(cluster)), split: AtomicBool::new(split), ..Self::new(resource, 0) }
    }
    /// The nodes entered below this one.
    pub fn children(&self) -> Vec<Arc<DefaultNode>> {
        self.children.list()
    }
    /// Whether calls must be recorded on this node (false: it shows its cluster node's numbers).
    #[inline(always)]
    pub(crate) fn records(&self) -> bool {
        self.split.load(Ordering::Relaxed)
    }
    /// From now on, this node records its own calls.
    pub(crate) fn split(&self) {
        self.split.store(true, Ordering::Relaxed);
    }
    /// The numbers this node shows.
    pub(crate) fn stats(&self) -> &StatNode {
        match self.cluster {
            // SAFETY: see the `Send`/`Sync` note: the cluster node outlives this node.
            Some(c) if !self.records() => unsafe { c.as_ref() },
            _ => &self.stat,
        }
    }
}

impl std::fmt::Debug for DefaultNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DefaultNode").field("resource", &self.resource).finish_non_exhaustive()
    }
}

/// Child links of a node: appended once, read by the tree view. Weak, because the nodes are owned by their
/// resources and a resource entered inside itself (recursion) is its own child: strong links would form a
/// cycle that outlives the engine.
#[derive(Default)]
pub(crate) struct Children {
    list: boxcar::Vec<Weak<DefaultNode>>,
    insert: Mutex<()>,
    /// The child linked last: lets the common case skip the scan.
    last: AtomicPtr<DefaultNode>,
}

impl Children {
    /// Links `child` below this node unless already there.
    #[inline]
    pub(crate) fn ensure(&self, child: &Arc<DefaultNode>) {
        let ptr = Arc::as_ptr(child) as *mut DefaultNode;
        if self.last.load(Ordering::Relaxed) == ptr {
            return;
        }
        self.ensure_slow(child, ptr);
    }

    #[cold]
    fn ensure_slow(&self, child: &Arc<DefaultNode>, ptr: *mut DefaultNode) {
        let linked = |list: &boxcar::Vec<Weak<DefaultNode>>| list.iter().any(|(_, c)| std::ptr::eq(c.as_ptr(), ptr));
        if !linked(&self.list) {
            let _g = self.insert.lock().unwrap_or_else(|e| e.into_inner());
            if !linked(&self.list) {
                self.list.push(Arc::downgrade(child));
            }
        }
        self.last.store(ptr, Ordering::Relaxed);
    }

    pub(crate) fn list(&self) -> Vec<Arc<DefaultNode>> {
        self.list.iter().filter_map(|(_, c)| c.upgrade()).collect()
    }
}

/// A node for one origin of one resource.
pub(crate) struct OriginNode {
    pub(crate) origin_id: u32,
    pub(crate) origin: Arc<str>,
    pub(crate) stat: StatNode,
}

/// Origin ids covered by a cluster node's direct index (ids are dense: 1, 2, … per engine).
const INDEXED_ORIGINS: usize = BLOCKS * BLOCK;
const BLOCK: usize = 256;
const BLOCKS: usize = 256;

/// A block of the origin index: slot `id % BLOCK` points to the origin node of `id`, null until it exists.
type OriginBlock = [AtomicPtr<OriginNode>; BLOCK];

/// A resource's node over all contexts, with a node per caller origin.
///
/// Origin nodes are bounded: origins named by the resource's flow rules always get one; other origins get
/// one until the cap, and share the untracked origin's node after it.
pub(crate) struct ClusterNode {
    pub(crate) stat: StatNode,
    origins: boxcar::Vec<OriginNode>,
    /// Origin nodes made for origins no rule of the resource named (counted against the cap).
    unnamed: std::sync::atomic::AtomicUsize,
    /// The node shared by the origins past the cap (and by the engine's untracked origin).
    untracked: OnceLock<Box<OriginNode>>,
    /// The origin nodes by origin id (two levels, allocated on first use), so that finding the node of a
    /// call's origin costs three loads however many origins call the resource. Ids past the index are found
    /// by a scan.
    index: OnceLock<Box<[OnceLock<Box<OriginBlock>>; BLOCKS]>>,
    insert: Mutex<()>,
}

impl ClusterNode {
    pub(crate) fn new() -> Self {
        ClusterNode {
            stat: StatNode::new(),
            origins: boxcar::Vec::new(),
            unnamed: std::sync::atomic::AtomicUsize::new(0),
            untracked: OnceLock::new(),
            index: OnceLock::new(),
            insert: Mutex::new(()),
        }
    }

    /// The node of an origin (by interned id), created on first use while fewer than `cap` origins the
    /// resource's rules do not name have one; the untracked node after that.
    #[inline]
    pub(crate) fn origin_node(&self, origin_id: u32, origin: &Arc<str>, cap: usize) -> &OriginNode {
        match self.find(origin_id) {
            Some(n) => n,
            None => self.create_origin(origin_id, origin, Some(cap)),
        }
    }

    /// Makes sure an origin named by a rule of the resource has its own node (whatever the cap).
    pub(crate) fn ensure_named_origin(&self, origin_id: u32, origin: &Arc<str>) {
        if origin_id != crate::config::UNTRACKED_ORIGIN_ID && self.find(origin_id).is_none() {
            self.create_origin(origin_id, origin, None);
        }
    }

    /// The node of an origin if one was created.
    pub(crate) fn find_origin(&self, origin_id: u32) -> Option<&StatNode> {
        self.find(origin_id).map(|n| &n.stat)
    }

    fn untracked_node(&self) -> &OriginNode {
        self.untracked.get_or_init(|| {
            Box::new(OriginNode {
                origin_id: crate::config::UNTRACKED_ORIGIN_ID,
                origin: crate::UNTRACKED_ORIGIN.into(),
                stat: StatNode::new(),
            })
        })
    }

    #[inline]
    fn find(&self, origin_id: u32) -> Option<&OriginNode> {
        if origin_id == crate::config::UNTRACKED_ORIGIN_ID {
            return Some(self.untracked_node());
        }
        let id = origin_id as usize;
        if id < INDEXED_ORIGINS {
            let block = self.index.get()?[id / BLOCK].get()?;
            let p = block[id % BLOCK].load(Ordering::Acquire);
            // SAFETY: the pointer is to an element of `origins`, which never moves or frees its elements
            // while the cluster node lives.
            return (!p.is_null()).then(|| unsafe { &*p });
        }
        self.origins.iter().map(|(_, n)| n).find(|n| n.origin_id == origin_id)
    }

    #[cold]
    fn create_origin(&self, origin_id: u32, origin: &Arc<str>, cap: Option<usize>) -> &OriginNode {
        use std::sync::atomic::Ordering::Relaxed;
        let _g = self.insert.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = self.find(origin_id) {
            return n;
        }
        if let Some(cap) = cap {
            if self.unnamed.load(Relaxed) >= cap {
                return self.untracked_node();
            }
            self.unnamed.fetch_add(1, Relaxed);
        }
        let idx = self.origins.push(OriginNode { origin_id, origin: origin.clone(), stat: StatNode::new() });
        let node = &self.origins[idx];
        let id = origin_id as usize;
        if id < INDEXED_ORIGINS {
            let top = self.index.get_or_init(|| Box::new([const { OnceLock::new() }; BLOCKS]));
            let block =
                top[id / BLOCK].get_or_init(|| Box::new([const { AtomicPtr::new(std::ptr::null_mut()) }; BLOCK]));
            block[id % BLOCK].store(node as *const OriginNode as *mut OriginNode, Ordering::Release);
        }
        node
    }

    /// Every origin node (the untracked one last, if any call used it).
    pub(crate) fn origins(&self) -> impl Iterator<Item = &OriginNode> {
        self.origins.iter().map(|(_, n)| n).chain(self.untracked.get().map(|b| &**b))
    }
}

/// The root of a context's tree: its numbers are the sums of its children's.
pub(crate) struct EntranceNode {
    pub(crate) name: Arc<str>,
    pub(crate) children: Children,
}
