use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(exceptions_to_trace = is_serious)]
fn get(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn is_serious(_e: AppError) -> bool {
    true
}

fn main() {}
