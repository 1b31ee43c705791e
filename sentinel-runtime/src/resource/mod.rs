//! Resources: the public handle ([`Resource`]) and what the engine keeps per resource name
//! ([`inner::ResourceInner`]). The handle's entry methods sit with the entry builder (`entry/builder.rs`), so
//! that entries import resources and not the other way round.

pub(crate) mod inner;

use std::sync::Arc;

use crate::engine::keep::SharedHandle;
use crate::resource::inner::ResourceInner;

pub use crate::slot::EntryType;

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
    pub(crate) shared: Arc<SharedHandle>,
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

    /// Runs `f` on a handle of `inner` in the engine `shared` made without taking a reference count on
    /// either (a caller that keeps the resource's `ResourceInner` but not a `Resource`, which would hold its
    /// engine: the gateway's API definitions, kept by the engine itself). A clone of the handle takes counts
    /// of its own, as any clone.
    #[cfg(feature = "tower")]
    pub(crate) fn with_view<R>(
        shared: &Arc<SharedHandle>,
        inner: &Arc<ResourceInner>,
        entry_type: EntryType,
        f: impl FnOnce(&Resource) -> R,
    ) -> R {
        // SAFETY: each `Arc` is rebuilt from the pointer of a live `Arc` that the caller lends for the whole
        // call, so it points to a live allocation with a count of at least one. The handle is never dropped
        // (`ManuallyDrop`, also when `f` unwinds), so it gives back no count it did not take, and it does not
        // outlive the call: `f` only borrows it, and cannot move it out of the `ManuallyDrop`.
        let view = std::mem::ManuallyDrop::new(unsafe {
            Resource {
                shared: Arc::from_raw(Arc::as_ptr(shared)),
                inner: Arc::from_raw(Arc::as_ptr(inner)),
                entry_type,
            }
        });
        f(&view)
    }
}
