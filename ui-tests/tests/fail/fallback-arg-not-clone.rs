use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

struct Request {
    id: u64,
}

#[sentinel_resource(fallback = on_error)]
fn handle(req: Request) -> Result<u64, AppError> {
    Ok(req.id)
}

fn on_error(_req: Request, _e: AppError) -> Result<u64, AppError> {
    Ok(0)
}

fn main() {}
