//! A `tracing` subscriber for tests: each event, as text, to a callback.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use sentinel_testkit::logs::{Logged, OnEvent};
//!
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let sink = seen.clone();
//! let subscriber = OnEvent(move |e: Logged| {
//!     if e.level == tracing::Level::WARN {
//!         sink.lock().unwrap().push(e.message);
//!     }
//! });
//! tracing::subscriber::with_default(subscriber, || tracing::warn!(rule = "api", "no such resource"));
//! assert_eq!(*seen.lock().unwrap(), ["no such resource"]);
//! ```

use std::fmt::Write;

/// One event, as text.
#[derive(Clone, Debug)]
pub struct Logged {
    /// Its level.
    pub level: tracing::Level,
    /// The module that logged it.
    pub module_path: Option<&'static str>,
    /// Its message (empty when it has none).
    pub message: String,
    /// Every field, the message included, as `name=value ` (strings without quotes, the rest as `Debug`).
    pub fields: String,
}

/// A subscriber that gives each event, of any level, to its callback (which may panic: a test of a
/// subscriber that panics). Spans are not followed.
pub struct OnEvent<F>(pub F);

impl<F> std::fmt::Debug for OnEvent<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnEvent")
    }
}

impl<F: Fn(Logged) + Send + Sync + 'static> tracing::Subscriber for OnEvent<F> {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut text = Text { message: String::new(), fields: String::new() };
        e.record(&mut text);
        let m = e.metadata();
        (self.0)(Logged {
            level: *m.level(),
            module_path: m.module_path(),
            message: text.message,
            fields: text.fields,
        });
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

struct Text {
    message: String,
    fields: String,
}

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        }
        let _ = write!(self.fields, "{}={:?} ", field.name(), value);
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        }
        let _ = write!(self.fields, "{}={} ", field.name(), value);
    }
}
