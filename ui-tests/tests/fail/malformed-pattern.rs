use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
enum AppError {
    Timeout,
    Io(String),
}
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError::Timeout
    }
}

#[sentinel_resource(exceptions_to_ignore = [AppError::Timeout, AppError::Io(_) +])]
fn get(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
