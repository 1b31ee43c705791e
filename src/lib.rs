//! The top-level package of the sentinel-rs workspace: it holds the examples (`examples/`) and the
//! behaviour tests (`tests/`). Users depend on `sentinel-runtime`.
