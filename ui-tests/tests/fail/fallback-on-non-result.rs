use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked, fallback = on_error)]
fn get(id: u64) -> String {
    format!("{id}")
}

fn blocked(id: u64, _b: BlockError) -> String {
    format!("{id}")
}

fn on_error(id: u64, _e: String) -> String {
    format!("{id}")
}

fn main() {}
