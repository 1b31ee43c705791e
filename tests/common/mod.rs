//! Shared helpers of the behaviour tests: an isolated engine on a manual clock per test.
#![allow(dead_code)]

use sentinel_runtime::clock::ManualClock;
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{AsBlockError, BlockError, NodeStats, Sentinel};

/// A fresh engine with a manual clock, leaked so it can stand in for the global one ([`Sentinel::scoped`]).
pub fn engine() -> (&'static Sentinel, ManualClock) {
    let clock = ManualClock::at_millis(1_700_000_000_000);
    let engine = Sentinel::builder().manual_clock(clock.clone()).build().leak();
    (engine, clock)
}

/// An engine where each of `names` lets `qps` calls per second through.
pub fn engine_with_limits(names: &[&str], qps: f64) -> (&'static Sentinel, ManualClock) {
    let (engine, clock) = engine();
    engine.load_flow_rules(names.iter().map(|n| FlowRule::new(*n).count(qps))).unwrap();
    (engine, clock)
}

pub fn stats(engine: &Sentinel, name: &str) -> NodeStats {
    engine.cluster_stats(name).unwrap_or_else(|| panic!("no resource `{name}`"))
}

/// The error type of the tests' annotated functions.
#[derive(Debug, Clone, PartialEq)]
pub enum AppError {
    NotFound(u64),
    Timeout,
    Invalid(String),
    Blocked(String),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for AppError {}

impl From<BlockError> for AppError {
    fn from(b: BlockError) -> Self {
        AppError::Blocked(b.resource().to_string())
    }
}

/// An error type that says which of its values is a block ([`AsBlockError`]): a nested call's block that
/// escapes an annotated function's body in it is a block of that function's call.
#[derive(Debug, Clone)]
pub enum NestedError {
    Blocked(BlockError),
    Failed(&'static str),
}

impl From<BlockError> for NestedError {
    fn from(b: BlockError) -> Self {
        NestedError::Blocked(b)
    }
}

impl From<sentinel_runtime::Timeout> for NestedError {
    fn from(_: sentinel_runtime::Timeout) -> Self {
        NestedError::Failed("timed out")
    }
}

impl AsBlockError for NestedError {
    fn block_error(&self) -> Option<&BlockError> {
        match self {
            NestedError::Blocked(b) => Some(b),
            NestedError::Failed(_) => None,
        }
    }
}

/// Compares the resource of a block.
impl PartialEq for NestedError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (NestedError::Blocked(a), NestedError::Blocked(b)) => a.resource() == b.resource(),
            (NestedError::Failed(a), NestedError::Failed(b)) => a == b,
            _ => false,
        }
    }
}

/// A block of `resource`, as [`NestedError`] compares it (by resource).
pub fn blocked_at(resource: &str) -> NestedError {
    NestedError::Blocked(BlockError::Custom {
        resource: resource.into(),
        slot: "test",
        reason: "test".into(),
        origin: "".into(),
    })
}

/// An error that cannot be built from a block (functions returning it need a block handler).
#[derive(Debug, Clone, PartialEq)]
pub struct PlainError(pub &'static str);

/// A hot-parameter key of the tests (the runtime's own impls for std types are not relied on here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Key(pub u64);

impl sentinel_runtime::param_flow::HotParam for Key {
    fn visit_values(&self, f: &mut dyn FnMut(sentinel_runtime::param_flow::ParamValue<'_>)) {
        f(sentinel_runtime::param_flow::ParamValue::Int(self.0 as i64))
    }
}
