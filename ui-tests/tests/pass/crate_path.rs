// A framework re-exporting the runtime: `crate = path` points the expansion at the re-export.
mod framework {
    pub mod reexport {
        pub use sentinel_runtime as sentinel;
    }
}

use framework::reexport::sentinel::{sentinel_resource, BlockError};

#[sentinel_resource(crate = framework::reexport::sentinel, block_handler = blocked)]
fn through_path(x: u32) -> u32 {
    x + 1
}

#[sentinel_resource(crate = "framework::reexport::sentinel", block_handler = blocked)]
fn through_string(x: u32) -> u32 {
    x + 2
}

fn blocked(_x: u32, _b: BlockError) -> u32 {
    0
}

fn main() {
    assert_eq!(through_path(1), 2);
    assert_eq!(through_string(1), 3);
}
