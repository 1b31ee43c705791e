//! Adaptive concurrency limits (issue 31): a rule kind that finds a resource's concurrency limit from
//! measured latency, instead of a number someone guessed.
//!
//! **Not in the slot chain yet.** This module is the part of the rule kind that needs no engine: the rule
//! data and its validation ([`rule::AdaptiveRule`]), its JSON/YAML/TOML shape (`format`, feature `serde`), the
//! three limit algorithms as plain state machines (`algorithm`: Gradient2, Vegas, AIMD, Netflix's formulas),
//! and the limiter (`limiter`, `wait`): permits against the current limit without a lock, partitions by
//! origin with guaranteed shares, and a bounded LIFO wait on a timer. It imports only the base (clock,
//! patterns). Wiring it into the engine (a slot on the slot contract, loading, the command center, data
//! sources, diagnose, gauges, the block error) comes with that contract.
//!
//! # How it works
//!
//! Each completed call gives a sample: its round-trip time, the calls in flight when it started, and whether
//! it failed by overload (a drop). Samples are summed into a window (two atomic additions per call, no
//! floating point); when the window closes (after `window.window_ms`, once it holds `window.min_samples`
//! samples, or after `window.max_window_ms` with any sample: sparse windows are extended, never thrown away)
//! the algorithm computes a new limit once. Calls over the limit are blocked, or wait up to `max_wait_ms`,
//! newest first.
//!
//! # Partitions
//!
//! With `partitions` (`{"mobile": 0.6, "default": 0.4}`), each origin's partition is guaranteed
//! `ceil(limit · share)` calls in flight under contention and may use idle places beyond it while the total
//! is under the limit; origins not named use the `default` partition, or only the shared pool when there is
//! none. While a partition takes back its guarantee from borrowers, the total may pass the limit by at most
//! that guarantee, and falls back as borrowed places return.

#![allow(dead_code)] // Used by its tests until the slot chain wires it in.

pub(crate) mod algorithm;
#[cfg(feature = "serde")]
pub(crate) mod format;
pub(crate) mod limiter;
pub(crate) mod rule;
pub(crate) mod wait;
mod window;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
