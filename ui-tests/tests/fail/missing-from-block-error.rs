use sentinel_runtime::sentinel_resource;

#[derive(Debug)]
struct AppError;

#[sentinel_resource]
fn get(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
