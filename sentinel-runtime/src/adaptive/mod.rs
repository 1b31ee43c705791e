//! Adaptive concurrency limits (issue 31): a rule kind that finds a resource's concurrency limit from
//! measured latency, instead of a number someone guessed.
//!
//! Every other limit is a number someone guessed; this one follows the downstream. A thread-grade flow rule
//! set for a fast downstream is too high when it slows down (the seed's incident: 50 ms to 3 s, and the
//! caller's concurrency fills), and set for the slow case it wastes capacity every other day. An adaptive
//! rule measures round-trip times and finds the limit of calls in flight by itself.
//!
//! ```
//! use sentinel_runtime::{Sentinel, BlockError, clock::ManualClock};
//! use sentinel_runtime::adaptive::{AdaptiveRule, AlgorithmKind};
//!
//! let clock = ManualClock::at_millis(1_000_000);
//! let engine = Sentinel::builder().manual_clock(clock.clone()).build();
//! engine
//!     .load_adaptive_rules([AdaptiveRule::new("inventory").algorithm(AlgorithmKind::Gradient2).limits(2, 4, 100)])
//!     .unwrap();
//! let inventory = engine.resource("inventory");
//! let held: Vec<_> = (0..4).map(|_| inventory.enter().unwrap()).collect();
//! match inventory.enter() {
//!     Err(BlockError::Adaptive { block, .. }) => assert_eq!((block.limit, block.inflight), (4, 4)),
//!     other => panic!("expected an adaptive block, got {other:?}"),
//! }
//! drop(held);
//! assert_eq!(engine.adaptive_status()[0].inflight, 0);
//! ```
//!
//! The rule kind: the rule data and its validation ([`AdaptiveRule`]), its JSON/YAML/TOML shape (`format`,
//! feature `serde`), the three limit algorithms as plain state machines (`algorithm`: Gradient2, Vegas, AIMD,
//! Netflix's formulas), the limiter (`limiter`, `wait`): permits against the current limit without a lock,
//! partitions by origin with guaranteed shares, and a bounded LIFO wait on a timer; the slot (`slot`, order
//! −500: the last built-in check) and the rules in force (`manager`). It knows no engine: the slot contract
//! and the base (clock, patterns) only.
//!
//! Calls the downstream refused or shed count as drops: mark them with
//! [`Entry::set_overload`](crate::Entry::set_overload) (the web layer and the outbound guards do for 429,
//! 503, `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and `DEADLINE_EXCEEDED`, the outbound guards for a transport
//! error; [`Entry::set_timed_out`](crate::Entry::set_timed_out) does).
//! A blocked call gets [`BlockError::Adaptive`](crate::BlockError::Adaptive), whose message gives the limit,
//! the calls in flight and the measured RTTs; the web layer answers it with 503 and `Retry-After`, gRPC with
//! `RESOURCE_EXHAUSTED`.
//!
//! # How it works
//!
//! Each completed call gives a sample: its round-trip time, the calls in flight when it started, and whether
//! it failed by overload (a drop). Samples are summed into a window (two atomic additions per call, no
//! floating point); when the window closes (after `window.window_ms`, once it holds `window.min_samples`
//! samples, or after `window.max_window_ms` with any sample: sparse windows are extended, never thrown away)
//! the algorithm computes a new limit once. Calls over the limit are blocked, or wait up to `max_wait_ms`,
//! newest first. A call that never completed (its caller gave up on its future, or it panicked) gives no
//! sample, unless it was marked as a drop (a time limit).
//!
//! A reload that leaves a resource's rule as it was keeps its limiter and the limit found; a changed rule
//! starts a new limiter at its `initial_limit`, which still counts the calls in flight under the old rule
//! until they end.
//!
//! # Partitions
//!
//! With `partitions` (`{"mobile": 0.6, "default": 0.4}`), each origin's partition is guaranteed
//! `ceil(limit · share)` calls in flight under contention and may use idle places beyond it while the total
//! is under the limit; origins not named use the `default` partition, or only the shared pool when there is
//! none. While a partition takes back its guarantee from borrowers, the total may pass the limit by at most
//! that guarantee, and falls back as borrowed places return.

pub(crate) mod algorithm;
pub(crate) mod block;
#[cfg(feature = "serde")]
pub(crate) mod format;
pub(crate) mod limiter;
pub(crate) mod manager;
pub(crate) mod permit;
pub(crate) mod rule;
pub(crate) mod slot;
mod status;
pub(crate) mod wait;
mod window;

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wait_tests;

pub use block::{AdaptiveBlock, AdaptiveBlockReason};
#[cfg(feature = "serde")]
pub use format::{parse_json, to_json};
pub use rule::{
    AdaptiveRule, AdaptiveRuleError, AimdParams, AlgorithmKind, Gradient2Params, Partition, ProbeConfig, VegasParams,
    WindowConfig, DEFAULT_PARTITION, MAX_LIMIT_CAP, MAX_PARTITIONS, MAX_WAITERS_CAP, MAX_WAIT_MS_CAP,
};
pub use status::{AdaptiveStatus, PartitionStatus};
