use sentinel_runtime::sentinel_resource;

#[derive(Debug)]
struct AppError;

#[sentinel_resource(timeout_ms = "200ms")]
async fn load(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = load(1);
}
