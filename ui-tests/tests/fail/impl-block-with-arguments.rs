use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

struct Orders;

#[sentinel_resource(entry_type = In)]
impl Orders {
    #[sentinel_resource]
    fn get(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }
}

fn main() {
    let _ = Orders.get(1);
}
