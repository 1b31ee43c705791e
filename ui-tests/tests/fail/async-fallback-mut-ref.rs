use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(fallback = on_error)]
async fn fill(buf: &mut Vec<u8>) -> Result<usize, AppError> {
    buf.push(1);
    Ok(buf.len())
}

async fn on_error(_buf: &mut Vec<u8>, _e: AppError) -> Result<usize, AppError> {
    Ok(0)
}

fn main() {}
