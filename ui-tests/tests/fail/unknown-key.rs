use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(name = "get", blockHandler = blocked)]
fn get(id: u64) -> String {
    format!("{id}")
}

fn blocked(_id: u64, _b: BlockError) -> String {
    String::new()
}

fn main() {}
