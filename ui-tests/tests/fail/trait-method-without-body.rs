use sentinel_runtime::{sentinel_resource, BlockError};

trait Store {
    #[sentinel_resource(block_handler = blocked)]
    fn get(&self, id: u64) -> String;
}

fn blocked<S: ?Sized>(_s: &S, _id: u64, _b: BlockError) -> String {
    String::new()
}

fn main() {}
