//! What integrations (and the engine's handle) keep per engine without the engine's state knowing their
//! types.

use std::any::Any;
use std::sync::{Arc, Mutex};

/// One value per type, created on first use (a few per engine: a linear scan). Values are never removed.
#[derive(Default)]
pub(crate) struct Extensions {
    /// Each an `Arc<T>` of its own `T`.
    values: boxcar::Vec<Box<dyn Any + Send + Sync>>,
    /// Serializes first uses, so that each type has one value.
    insert: Mutex<()>,
}

impl Extensions {
    /// The value of type `T`, created with `T::default()` on first use.
    pub(crate) fn get<T: Any + Send + Sync + Default>(&self) -> &Arc<T> {
        if let Some(found) = self.find::<T>() {
            return found;
        }
        let guard = self.insert.lock().unwrap_or_else(|e| e.into_inner());
        if self.find::<T>().is_none() {
            self.values.push(Box::new(Arc::new(T::default())));
        }
        drop(guard);
        self.get()
    }

    fn find<T: Any>(&self) -> Option<&Arc<T>> {
        self.values.iter().find_map(|(_, v)| v.downcast_ref::<Arc<T>>())
    }
}
