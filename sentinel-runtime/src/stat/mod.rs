//! Statistics: sliding windows and the nodes built on them.

pub(crate) mod admission;
mod node;
pub(crate) mod stripe;
mod window;

pub(crate) use node::Writer;
pub use node::{StatNode, MINUTE_INTERVAL_MS, MINUTE_SAMPLE_COUNT, SECOND_INTERVAL_MS, SECOND_SAMPLE_COUNT};
pub use window::{BucketTotals, MetricEvent};
