//! Statistics: sliding windows and the nodes built on them.

pub(crate) mod admission;
mod node;
pub(crate) mod stripe;
mod thread_gate;
mod window;

pub(crate) use node::Writer;
pub use node::{StatNode, MINUTE_INTERVAL_MS, MINUTE_SAMPLE_COUNT, SECOND_INTERVAL_MS, SECOND_SAMPLE_COUNT};
pub(crate) use thread_gate::ThreadGate;
pub(crate) use window::BUCKET_MS;
pub use window::{BucketTotals, MetricEvent};

/// How a resource name appears in a metric line (the metric log and the `metric` command): `|`, `\n` and
/// `\r` become `_`, so a name can neither add a field nor start a line of its own (Java replaces `|` the same
/// way). Names without these characters are returned as they are. Readers see the replaced name, and a
/// search by a name matches the lines of its replaced form.
///
/// ```
/// use sentinel_runtime::stat::metric_line_name;
/// assert_eq!(metric_line_name("GET /a|b"), "GET /a_b");
/// assert_eq!(metric_line_name("x\n1700000000000|forged"), "x_1700000000000_forged");
/// assert_eq!(metric_line_name("plain"), "plain");
/// ```
pub fn metric_line_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains(['|', '\n', '\r']) {
        std::borrow::Cow::Owned(name.replace(['|', '\n', '\r'], "_"))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}
