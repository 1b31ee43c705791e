use sentinel_runtime::{sentinel_resource, BlockError, Timeout};

#[derive(Debug)]
enum AppError {
    Blocked,
    TimedOut,
}

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError::Blocked
    }
}

impl From<Timeout> for AppError {
    fn from(_: Timeout) -> Self {
        AppError::TimedOut
    }
}

#[sentinel_resource(timeout_ms = 200)]
fn load(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = (load(1), AppError::Blocked, AppError::TimedOut);
}
