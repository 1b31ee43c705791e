use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(fallback = on_error)]
fn get(id: u64, name: String) -> Result<String, AppError> {
    Ok(format!("{id} {name}"))
}

fn on_error(_e: AppError) -> Result<String, AppError> {
    Ok(String::new())
}

fn main() {}
