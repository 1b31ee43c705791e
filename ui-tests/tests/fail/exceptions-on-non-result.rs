use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked, exceptions_to_ignore = [None])]
fn get(id: u64) -> Option<String> {
    Some(format!("{id}"))
}

fn blocked(_id: u64, _b: BlockError) -> Option<String> {
    None
}

fn main() {}
