use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(timeout_ms = 200)]
async fn load(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = load(1);
}
