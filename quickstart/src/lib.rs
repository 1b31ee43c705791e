//! Holds the quickstart example (`cargo run --example quickstart`) apart from the top-level package, whose
//! examples and tests need heavier dependencies. The example is `examples/quickstart.rs` of this package.
#![deny(missing_docs)]
