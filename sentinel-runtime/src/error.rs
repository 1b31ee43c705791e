//! Error types: why a call was blocked, and why a rule set was rejected.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::authority::rule::AuthorityRule;
use crate::circuit_breaker::rule::DegradeRule;
use crate::flow::rule::FlowRule;
use crate::param_flow::rule::ParamFlowRule;

#[cfg(feature = "tower")]
mod carriers;
#[cfg(feature = "tower")]
pub(crate) use carriers::{nested_block, register_block_carrier};

/// Which system limit blocked an inbound call.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum SystemLimit {
    /// Inbound QPS over the limit.
    Qps {
        /// The limit.
        limit: f64,
    },
    /// Inbound calls in flight over the limit.
    Thread {
        /// The limit.
        limit: u64,
    },
    /// Inbound average response time over the limit (ms).
    AvgRt {
        /// The limit.
        limit: u64,
    },
    /// 1-minute load average over the limit, and BBR judged the process saturated.
    Load {
        /// The limit.
        limit: f64,
        /// The load read.
        load: f64,
    },
    /// Cpu usage over the limit.
    Cpu {
        /// The limit.
        limit: f64,
        /// The usage read.
        usage: f64,
    },
}

impl fmt::Display for SystemLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SystemLimit::Qps { limit } => write!(f, "inbound qps over {limit}"),
            SystemLimit::Thread { limit } => write!(f, "inbound concurrency over {limit}"),
            SystemLimit::AvgRt { limit } => write!(f, "inbound average rt over {limit} ms"),
            SystemLimit::Load { limit, load } => {
                write!(f, "system load {load:.2} over {limit} and saturated (BBR)")
            }
            SystemLimit::Cpu { limit, usage } => write!(f, "cpu usage {usage:.2} over {limit}"),
        }
    }
}

/// Why a call was blocked. Carries the resource, the rule and the caller's origin.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum BlockError {
    /// A flow rule.
    Flow {
        /// The resource.
        resource: Arc<str>,
        /// The rule that blocked.
        rule: Arc<FlowRule>,
        /// The caller's origin (empty when none).
        origin: Arc<str>,
        /// When the call could pass if retried, as seen when it was blocked (see [`BlockError::retry_after`]).
        retry_after: Option<Duration>,
    },
    /// An open circuit breaker.
    Degrade {
        /// The resource.
        resource: Arc<str>,
        /// The breaker's rule.
        rule: Arc<DegradeRule>,
        /// The caller's origin.
        origin: Arc<str>,
        /// Time left until the breaker lets a probe through (see [`BlockError::retry_after`]).
        retry_after: Option<Duration>,
    },
    /// System adaptive protection.
    System {
        /// The resource.
        resource: Arc<str>,
        /// Which limit.
        limit: SystemLimit,
        /// The caller's origin.
        origin: Arc<str>,
        /// For the QPS limit, when the inbound window could admit the call (see [`BlockError::retry_after`]).
        retry_after: Option<Duration>,
    },
    /// A hot-parameter rule.
    ParamFlow {
        /// The resource.
        resource: Arc<str>,
        /// The rule.
        rule: Arc<ParamFlowRule>,
        /// The value that was over its limit, as text.
        value: String,
        /// The count the value was held to: its item's ([`ParamFlowItem::count`]) when the rule has an item
        /// for it, else the rule's `count`.
        ///
        /// [`ParamFlowItem::count`]: crate::param_flow::ParamFlowItem::count
        threshold: f64,
        /// The caller's origin.
        origin: Arc<str>,
        /// When the value's counter could admit the call (see [`BlockError::retry_after`]).
        retry_after: Option<Duration>,
    },
    /// An authority (white/black list) rule.
    Authority {
        /// The resource.
        resource: Arc<str>,
        /// The rule.
        rule: Arc<AuthorityRule>,
        /// The caller's origin.
        origin: Arc<str>,
    },
    /// The downstream asked its callers to back off (an outbound call's `Retry-After` on a 429 or 503, or
    /// gRPC's `grpc-retry-pushback-ms`), and the time it gave has not passed: the call was not sent
    /// (the outbound guards of the `outbound` module, feature `tower`).
    Pushback {
        /// The resource.
        resource: Arc<str>,
        /// The caller's origin (empty when none).
        origin: Arc<str>,
        /// Time left until the downstream's back-off ends.
        retry_after: Duration,
    },
    /// An adaptive concurrency rule: the calls in flight reached the limit it measured (see
    /// [`crate::adaptive`]). The message says why, with the limit, the calls in flight and the measured RTTs.
    Adaptive {
        /// The resource.
        resource: Arc<str>,
        /// The caller's origin (empty when none).
        origin: Arc<str>,
        /// Why, and the limiter's numbers at that moment.
        block: crate::adaptive::block::AdaptiveBlock,
    },
    /// A user-defined slot.
    Custom {
        /// The resource.
        resource: Arc<str>,
        /// The slot's name.
        slot: &'static str,
        /// Why.
        reason: Arc<str>,
        /// The caller's origin.
        origin: Arc<str>,
    },
}

impl BlockError {
    /// The blocked resource.
    pub fn resource(&self) -> &str {
        match self {
            BlockError::Flow { resource, .. }
            | BlockError::Degrade { resource, .. }
            | BlockError::System { resource, .. }
            | BlockError::ParamFlow { resource, .. }
            | BlockError::Authority { resource, .. }
            | BlockError::Pushback { resource, .. }
            | BlockError::Adaptive { resource, .. }
            | BlockError::Custom { resource, .. } => resource,
        }
    }
    /// The caller's origin (empty when none).
    pub fn origin(&self) -> &str {
        match self {
            BlockError::Flow { origin, .. }
            | BlockError::Degrade { origin, .. }
            | BlockError::System { origin, .. }
            | BlockError::ParamFlow { origin, .. }
            | BlockError::Authority { origin, .. }
            | BlockError::Pushback { origin, .. }
            | BlockError::Adaptive { origin, .. }
            | BlockError::Custom { origin, .. } => origin,
        }
    }
    /// A short name of the kind, as in Sentinel's block log (`FlowException`, ...).
    pub fn kind_name(&self) -> &'static str {
        match self {
            BlockError::Flow { .. } => "FlowException",
            BlockError::Degrade { .. } => "DegradeException",
            BlockError::System { .. } => "SystemBlockException",
            BlockError::ParamFlow { .. } => "ParamFlowException",
            BlockError::Authority { .. } => "AuthorityException",
            BlockError::Pushback { .. } => "PushbackException",
            BlockError::Adaptive { .. } => "AdaptiveException",
            BlockError::Custom { .. } => "CustomBlockException",
        }
    }
    /// How long after the block a retry of the same call could pass, when the rule that blocked knows it.
    ///
    /// Computed where the block was decided, from the state of the rule at that moment (nothing is computed
    /// on the passing path, and nothing is allocated):
    ///
    /// | blocked by | retry after |
    /// |---|---|
    /// | a QPS flow rule (reject, warm-up), the system QPS limit | the end of the 500 ms bucket after which the sliding second leaves room for the call: the current bucket's end, or the next one's when the current bucket alone is full |
    /// | a rate limiter (flow or hot-parameter) | the wait beyond the queueing limit: retried then, the call queues at most `max_queueing_time_ms` |
    /// | a hot-parameter token bucket | the refill that gives the value enough tokens |
    /// | an open circuit breaker | the time left until the breaker's retry time (when a probe may pass) |
    /// | a downstream's back-off (outbound calls) | the time left of the `Retry-After` / `grpc-retry-pushback-ms` it gave, capped |
    /// | an adaptive rule | about one measured round trip (a place frees when a call completes), at least 1 ms; 1 s before any measurement |
    ///
    /// `None` where no time is known: thread-grade limits (they free up when calls finish), a half-open breaker
    /// whose probe is out, the other system limits, authority rules, custom slots, and limits that can never
    /// admit the call (a count below the call's acquire count). The web layer turns it into `Retry-After` and
    /// `grpc-retry-pushback-ms`.
    ///
    /// ```
    /// use sentinel_runtime::{Sentinel, clock::ManualClock, flow::FlowRule};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::at_millis(1_000_100); // 100 ms into a 500 ms bucket
    /// let engine = Sentinel::builder().manual_clock(clock.clone()).build();
    /// engine.load_flow_rules([FlowRule::new("api").count(1.0)]).unwrap();
    /// let api = engine.resource("api");
    /// let _first = api.enter().unwrap();
    /// let blocked = api.enter().unwrap_err();
    /// // The current bucket holds the one pass the limit allows: room comes when it slides out of the window.
    /// assert_eq!(blocked.retry_after(), Some(Duration::from_millis(900)));
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            BlockError::Flow { retry_after, .. }
            | BlockError::Degrade { retry_after, .. }
            | BlockError::System { retry_after, .. }
            | BlockError::ParamFlow { retry_after, .. } => *retry_after,
            BlockError::Pushback { retry_after, .. } => Some(*retry_after),
            BlockError::Adaptive { block, .. } => Some(block.retry_after()),
            BlockError::Authority { .. } | BlockError::Custom { .. } => None,
        }
    }
    /// The `limitApp` of the rule that blocked (`"default"` where the rule has none).
    pub fn limit_app(&self) -> &str {
        match self {
            BlockError::Flow { rule, .. } => &rule.limit_app,
            BlockError::Degrade { rule, .. } => &rule.limit_app,
            BlockError::ParamFlow { rule, .. } => &rule.limit_app,
            BlockError::Authority { rule, .. } => &rule.limit_app,
            BlockError::System { .. }
            | BlockError::Pushback { .. }
            | BlockError::Adaptive { .. }
            | BlockError::Custom { .. } => crate::LIMIT_APP_DEFAULT,
        }
    }
}

/// How deep [`BlockError::find_in`] follows an error's causes (Java's `BlockException.isBlockException` looks
/// as deep; it also bounds a cyclic chain).
const MAX_CAUSE_DEPTH: usize = 10;

impl BlockError {
    /// The block `err` is, or was caused by: `err` or an error of its [`source`](std::error::Error::source)
    /// chain (at most 10 deep, as Java's `BlockException.isBlockException`) is a `BlockError`. Also seen inside
    /// the errors whose `source()` passes over the error they hold: a `std::io::Error` and, with feature
    /// `reqwest`, `reqwest_middleware::Error::Middleware`. The outbound guard's `ClientError::Blocked` gives
    /// its block as its `source()`.
    ///
    /// [`Entry::trace`](crate::Entry::trace) and the error filter never count such an error (Java never
    /// traces a `BlockException`, and its web adapters look for one among the causes), and the outbound guards
    /// tell a nested guard's block from a failure by it.
    ///
    /// ```
    /// use sentinel_runtime::{BlockError, Sentinel, flow::FlowRule};
    ///
    /// let engine = Sentinel::builder().build();
    /// engine.load_flow_rules([FlowRule::new("stock").count(0.0)]).unwrap();
    /// let block = engine.resource("stock").enter().unwrap_err();
    /// let wrapped = std::io::Error::other(block);
    /// assert!(BlockError::find_in(&wrapped).is_some());
    /// assert!(BlockError::find_in(&std::io::Error::other("refused")).is_none());
    /// ```
    #[cold]
    pub fn find_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a BlockError> {
        let mut cur = Some(err);
        let mut depth = 0;
        while let Some(e) = cur {
            if let Some(b) = e.downcast_ref::<BlockError>() {
                return Some(b);
            }
            depth += 1;
            if depth >= MAX_CAUSE_DEPTH {
                break;
            }
            cur = held(e).or_else(|| e.source());
        }
        None
    }
}

/// The error `e` holds where its `source()` passes over it (it gives the held error's own source).
fn held<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a (dyn std::error::Error + 'static)> {
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static));
    }
    #[cfg(feature = "reqwest")]
    if let Some(reqwest_middleware::Error::Middleware(m)) = e.downcast_ref::<reqwest_middleware::Error>() {
        let inner: &(dyn std::error::Error + Send + Sync + 'static) = m.as_ref();
        return Some(inner);
    }
    None
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origin = |o: &str| {
            if o.is_empty() {
                String::new()
            } else {
                format!(" (origin `{o}`)")
            }
        };
        match self {
            BlockError::Flow { resource, rule, origin: o, .. } => write!(
                f,
                "`{resource}` blocked by flow rule ({:?} {:?} limit {} for `{}`, {:?}){}",
                rule.grade,
                rule.strategy,
                rule.count,
                rule.limit_app,
                rule.control_behavior,
                origin(o)
            ),
            BlockError::Degrade { resource, rule, origin: o, .. } => write!(
                f,
                "`{resource}` blocked by an open circuit breaker ({:?}, count {}, open for {} s){}",
                rule.grade,
                rule.count,
                rule.time_window_sec,
                origin(o)
            ),
            BlockError::System { resource, limit, origin: o, .. } => {
                write!(f, "`{resource}` blocked by system protection: {limit}{}", origin(o))
            }
            BlockError::ParamFlow { resource, rule, value, threshold, origin: o, .. }
                if rule.grade == crate::flow::rule::FlowGrade::Thread =>
            {
                write!(
                    f,
                    "`{resource}` blocked by hot-parameter rule on argument {}: value {value} over {threshold} calls in flight{}",
                    rule.param_idx,
                    origin(o)
                )
            }
            BlockError::ParamFlow { resource, rule, value, threshold, origin: o, .. } => write!(
                f,
                "`{resource}` blocked by hot-parameter rule on argument {}: value {value} over {threshold} per {} s{}",
                rule.param_idx,
                rule.duration_in_sec,
                origin(o)
            ),
            BlockError::Authority { resource, rule, origin: o } => write!(
                f,
                "`{resource}` blocked by authority rule ({:?} list `{}`): origin `{o}` not allowed",
                rule.strategy, rule.limit_app
            ),
            BlockError::Pushback { resource, retry_after, origin: o } => write!(
                f,
                "`{resource}` held back: the downstream asked to retry after {} ms{}",
                retry_after.as_millis(),
                origin(o)
            ),
            BlockError::Adaptive { resource, block, origin: o } => {
                write!(f, "`{resource}` blocked by adaptive concurrency rule: {block}{}", origin(o))
            }
            BlockError::Custom { resource, slot, reason, origin: o } => {
                write!(f, "`{resource}` blocked by slot `{slot}`: {reason}{}", origin(o))
            }
        }
    }
}

impl std::error::Error for BlockError {}

/// An error that may be a block: a [`BlockError`] converted into it (by `From`, `?` or `Into`).
///
/// Implement it for the error type of an annotated function (`#[sentinel_resource]`) so that a nested call's
/// block that escapes the function's body as an `Err` is handled as a block, as Java Sentinel handles a
/// `BlockException` that escapes the method: the function's `block_handler` (or its fallback) answers, and the
/// call is neither traced as an error nor sent to the fallback as a failure. An error type that does not
/// implement it is a failure of the function, as before.
///
/// ```
/// use sentinel_runtime::{AsBlockError, BlockError};
///
/// #[derive(Debug)]
/// enum OrderError {
///     Busy(BlockError),
///     NotFound,
/// }
/// impl From<BlockError> for OrderError {
///     fn from(b: BlockError) -> Self {
///         OrderError::Busy(b)
///     }
/// }
/// impl AsBlockError for OrderError {
///     fn block_error(&self) -> Option<&BlockError> {
///         match self {
///             OrderError::Busy(b) => Some(b),
///             _ => None,
///         }
///     }
/// }
/// # assert!(OrderError::NotFound.block_error().is_none());
/// ```
///
/// Implemented for `BlockError` itself, for boxed errors (`Box<dyn Error>`, `+ Send`, `+ Send + Sync`) and
/// `std::io::Error` that are, or are caused by, a `BlockError` ([`BlockError::find_in`]: a guarded client's
/// blocked `ClientError` in a box is one), for the outbound guard's `ClientError` (feature `tower`), for
/// `reqwest_middleware::Error` holding a block (feature `reqwest`) and for `anyhow::Error` holding or caused by
/// one (feature `anyhow`).
pub trait AsBlockError {
    /// The block this error is, if it is one.
    fn block_error(&self) -> Option<&BlockError>;
}

impl AsBlockError for BlockError {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        Some(self)
    }
}

impl AsBlockError for Box<dyn std::error::Error + 'static> {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        BlockError::find_in(&**self)
    }
}

impl AsBlockError for Box<dyn std::error::Error + Send + 'static> {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        BlockError::find_in(&**self)
    }
}

impl AsBlockError for Box<dyn std::error::Error + Send + Sync + 'static> {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        BlockError::find_in(&**self)
    }
}

impl AsBlockError for std::io::Error {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        BlockError::find_in(self)
    }
}

/// A block converted into an `anyhow::Error` (by `?`), with or without context, or an error held by one that
/// is or was caused by a block ([`BlockError::find_in`]): an annotated function returning `anyhow::Result<T>`
/// hands a nested call's block to its block handler (feature `anyhow`).
#[cfg(feature = "anyhow")]
impl AsBlockError for anyhow::Error {
    #[inline]
    fn block_error(&self) -> Option<&BlockError> {
        self.downcast_ref::<BlockError>().or_else(|| BlockError::find_in(self.as_ref()))
    }
}

/// The kinds of rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RuleKind {
    /// Flow rules.
    Flow,
    /// Degrade (circuit breaker) rules.
    Degrade,
    /// System rules.
    System,
    /// Hot-parameter rules.
    ParamFlow,
    /// Authority rules.
    Authority,
    /// Adaptive concurrency rules.
    Adaptive,
}

impl fmt::Display for RuleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleKind::Flow => "flow",
            RuleKind::Degrade => "degrade",
            RuleKind::System => "system",
            RuleKind::ParamFlow => "param-flow",
            RuleKind::Authority => "authority",
            RuleKind::Adaptive => "adaptive",
        })
    }
}

/// A rule set was rejected; the rules in force stay.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// A field of one rule is invalid.
    #[error("invalid {kind} rule #{index} (resource `{resource}`): `{field}` {reason}; no rule of the set was loaded")]
    Invalid {
        /// The kind of rule.
        kind: RuleKind,
        /// The rule's position in the set (0-based).
        index: usize,
        /// The rule's resource.
        resource: String,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl RuleError {
    pub(crate) fn invalid(
        kind: RuleKind,
        index: usize,
        resource: &str,
        field: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        RuleError::Invalid { kind, index, resource: resource.to_string(), field, reason: reason.into() }
    }
}

/// A guarded call ran past its time limit (the macro's `timeout_ms`, the web layer's `timeout`).
///
/// The call counts as an exception and as a slow call whose response time is the limit; an error type that
/// implements `From<Timeout>` receives it (for the fallback, or as the returned `Err`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{resource}` timed out after {} ms", limit.as_millis())]
pub struct Timeout {
    /// The resource.
    pub resource: Arc<str>,
    /// The time limit that ran out.
    pub limit: std::time::Duration,
}
