use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked)]
async fn get(id: u64) -> String {
    format!("{id}")
}

async fn blocked(_id: u64, _b: BlockError) -> Option<String> {
    None
}

fn main() {}
