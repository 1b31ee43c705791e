//! `Debug` for the public types whose fields are internal (handles, pointers, futures): each shows its name
//! only. Written against the public paths, so the types may move between files.

use std::fmt;

impl fmt::Debug for crate::EntryBuilder<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntryBuilder").finish_non_exhaustive()
    }
}

impl<O: crate::__private::HandlerOutput<R, M>, R, M> fmt::Debug for crate::__private::HandlerFuture<O, R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerFuture").finish_non_exhaustive()
    }
}

impl fmt::Debug for crate::__private::AsyncWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncWait").finish_non_exhaustive()
    }
}

impl fmt::Debug for crate::__private::ResourceSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceSite").finish_non_exhaustive()
    }
}
