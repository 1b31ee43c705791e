use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked)]
fn get(id: u64, name: String) -> String {
    format!("{id} {name}")
}

fn blocked(id: u64, name: &str, _b: BlockError) -> String {
    format!("blocked {id} {name}")
}

fn main() {}
