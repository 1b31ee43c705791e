use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(timeout_ms = 100, block_handler = blocked)]
async fn greet(who: String) -> String {
    format!("hello {who}")
}

fn blocked(_who: String, _b: BlockError) -> String {
    String::new()
}

fn main() {
    let _ = greet(String::new());
}
