use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked)]
fn get(id: u64) -> Result<String, std::io::Error> {
    Ok(format!("{id}"))
}

fn blocked(_id: u64, _b: BlockError) -> Option<String> {
    None
}

fn main() {}
