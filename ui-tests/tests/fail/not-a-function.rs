use sentinel_runtime::sentinel_resource;

#[sentinel_resource(name = "orders")]
struct Orders {
    count: u64,
}

fn main() {
    let _ = Orders { count: 0 }.count;
}
