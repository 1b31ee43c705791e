use sentinel_runtime::sentinel_resource;

#[sentinel_resource(block_handler = blocked)]
fn get(id: u64) -> String {
    format!("{id}")
}

fn blocked(id: u64, reason: String) -> String {
    format!("blocked {id}: {reason}")
}

fn main() {}
