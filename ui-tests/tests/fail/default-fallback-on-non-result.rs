use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked, default_fallback = on_error)]
fn get(id: u64) -> Option<String> {
    Some(format!("{id}"))
}

fn blocked(_id: u64, _b: BlockError) -> Option<String> {
    None
}

fn on_error(_e: String) -> Option<String> {
    None
}

fn main() {}
