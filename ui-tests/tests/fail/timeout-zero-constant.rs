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

const NO_TIME: u64 = 0;

#[sentinel_resource(timeout_ms = NO_TIME)]
async fn store(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = store(1);
}
