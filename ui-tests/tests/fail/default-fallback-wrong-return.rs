use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(default_fallback = on_error)]
fn get(id: u64) -> Result<String, AppError> {
    Ok(format!("{id}"))
}

fn on_error(_e: AppError) -> Result<u64, AppError> {
    Ok(0)
}

fn main() {}
