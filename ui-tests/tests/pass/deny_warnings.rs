// The expansion triggers no warning (clippy's lints are checked by the workspace's `tests/macro_lints.rs`).
#![deny(warnings)]
#![deny(clippy::all)]

use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug, Clone, PartialEq)]
pub enum AppError {
    Timeout,
    NotFound(u64),
}

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError::Timeout
    }
}

fn is_transient(e: &AppError) -> bool {
    matches!(e, AppError::Timeout)
}

/// Documented, annotated, public.
#[sentinel_resource(
    name = "lint.find",
    entry_type = In,
    fallback = find_fallback,
    exceptions_to_ignore = [AppError::NotFound(_)],
    exceptions_to_trace = is_transient,
    origin = "app",
    context = "lint-entrance"
)]
pub fn find(id: u64, label: String, mut scratch: Vec<u8>) -> Result<String, AppError> {
    scratch.push(1);
    if id == 0 {
        return Err(AppError::NotFound(id));
    }
    Ok(format!("{label}{id}{}", scratch.len()))
}

fn find_fallback(id: u64, label: String, scratch: Vec<u8>, e: AppError) -> Result<String, AppError> {
    Ok(format!("{label}{id}{}{e:?}", scratch.len()))
}

#[sentinel_resource(block_handler = unit_blocked)]
pub fn unit(flag: bool) {
    let _ = flag;
}

fn unit_blocked(_flag: bool, _b: BlockError) {}

#[sentinel_resource(default_fallback = async_default)]
pub async fn fetch(id: u64) -> Result<u64, AppError> {
    std::future::ready(()).await;
    Ok(id)
}

async fn async_default(e: AppError) -> Result<u64, AppError> {
    Err(e)
}

fn main() {
    assert_eq!(find(1, "x".into(), Vec::new()), Ok("x11".to_string()));
    assert_eq!(find(0, "x".into(), Vec::new()), Err(AppError::NotFound(0)));
    unit(true);
    assert_eq!(futures::executor::block_on(fetch(3)), Ok(3));
}
