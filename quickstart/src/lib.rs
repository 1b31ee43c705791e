//! Holds the quickstart example (`cargo run -p sentinel-quickstart --example quickstart`) apart from the
//! top-level package, whose examples and tests need heavier dependencies.
#![deny(missing_docs)]
