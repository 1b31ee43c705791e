use sentinel_runtime::{sentinel_resource, BlockError, Timeout};

#[derive(Debug)]
struct AppError;

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

impl From<Timeout> for AppError {
    fn from(_: Timeout) -> Self {
        AppError
    }
}

#[sentinel_resource(timeout_ms = 0)]
async fn load(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = load(1);
}
