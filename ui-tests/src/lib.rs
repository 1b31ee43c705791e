//! Compile-time tests of the macro live in `tests/`.
