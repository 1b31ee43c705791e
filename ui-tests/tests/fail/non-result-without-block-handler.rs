use sentinel_runtime::sentinel_resource;

#[sentinel_resource]
fn get(id: u64) -> String {
    format!("{id}")
}

fn main() {}
