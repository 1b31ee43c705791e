//! Which traced errors count: a global filter by error type (ignore set, trace set) and predicate.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

type TypeTest = fn(&(dyn StdError + 'static)) -> bool;
type Predicate = dyn Fn(&(dyn StdError + 'static)) -> bool + Send + Sync;

fn is_type<E: StdError + 'static>(e: &(dyn StdError + 'static)) -> bool {
    e.is::<E>()
}

/// Decides which errors traced on an entry ([`Entry::trace`](crate::Entry::trace)) count as errors for
/// statistics and circuit breakers: Java Sentinel's `Tracer` settings (`exceptionsToIgnore`,
/// `exceptionsToTrace`, `exceptionPredicate`).
///
/// An error matches a type when it, or any error in its [`source`](StdError::source) chain, is of that type.
/// In order: an error matching an ignored type does not count; when trace types are set, only an error
/// matching one of them counts; then the predicate, when set, decides. A
/// [`BlockError`](crate::BlockError) never counts. (In Java, a predicate, when set, decides alone: the
/// ignore and trace classes are then not consulted. Here all three apply.)
///
/// ```
/// use sentinel_runtime::{Sentinel, circuit_breaker::TraceFilter};
///
/// #[derive(Debug)]
/// struct NotFound;
/// impl std::fmt::Display for NotFound {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("not found") }
/// }
/// impl std::error::Error for NotFound {}
///
/// let engine = Sentinel::builder().build();
/// engine.set_trace_filter(TraceFilter::new().ignore::<NotFound>());
/// let mut entry = engine.enter("lookup").unwrap();
/// entry.trace(&NotFound);
/// assert!(!entry.has_error()); // a miss is an answer, not a failure
/// entry.trace(&std::io::Error::other("disk"));
/// assert!(entry.has_error());
/// ```
#[derive(Clone, Default)]
pub struct TraceFilter {
    ignore: Vec<TypeTest>,
    trace: Vec<TypeTest>,
    predicate: Option<Arc<Predicate>>,
}

impl fmt::Debug for TraceFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceFilter")
            .field("ignored_types", &self.ignore.len())
            .field("traced_types", &self.trace.len())
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

impl TraceFilter {
    /// A filter that counts every error.
    pub fn new() -> Self {
        Self::default()
    }

    /// Errors of type `E` (or caused by one) never count.
    pub fn ignore<E: StdError + 'static>(mut self) -> Self {
        self.ignore.push(is_type::<E>);
        self
    }

    /// Only errors of the traced types (or caused by one) count; call once per type.
    pub fn trace<E: StdError + 'static>(mut self) -> Self {
        self.trace.push(is_type::<E>);
        self
    }

    /// An error that passed the type sets counts only if `f` returns true.
    pub fn predicate(mut self, f: impl Fn(&(dyn StdError + 'static)) -> bool + Send + Sync + 'static) -> Self {
        self.predicate = Some(Arc::new(f));
        self
    }

    fn matches(tests: &[TypeTest], err: &(dyn StdError + 'static)) -> bool {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
        let mut depth = 0;
        while let Some(e) = cur {
            if tests.iter().any(|t| t(e)) {
                return true;
            }
            depth += 1;
            if depth >= 32 {
                break; // a cyclic or absurdly deep chain
            }
            cur = e.source();
        }
        false
    }

    /// Whether `err` counts.
    pub fn accepts(&self, err: &(dyn StdError + 'static)) -> bool {
        if crate::BlockError::find_in(err).is_some() {
            return false;
        }
        if !self.ignore.is_empty() && Self::matches(&self.ignore, err) {
            return false;
        }
        if !self.trace.is_empty() && !Self::matches(&self.trace, err) {
            return false;
        }
        self.predicate.as_ref().is_none_or(|p| p(err))
    }
}
