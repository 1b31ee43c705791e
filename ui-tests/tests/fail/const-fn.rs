use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked)]
const fn double(x: u64) -> u64 {
    x * 2
}

fn blocked(_x: u64, _b: BlockError) -> u64 {
    0
}

fn main() {}
