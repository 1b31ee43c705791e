use sentinel_runtime::sentinel_resource;

#[derive(Debug)]
struct AppError;

#[sentinel_resource(fallback = on_error)]
fn get(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn on_error(_id: u64, _e: AppError) -> Result<u64, AppError> {
    Ok(0)
}

fn main() {}
