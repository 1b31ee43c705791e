use sentinel_runtime::sentinel_resource;

struct Orders;

#[sentinel_resource]
impl Orders {
    // The error is reported on the method, as without the impl attribute.
    #[sentinel_resource(fallback = nothing)]
    fn get(&self, id: u64) -> u64 {
        id
    }
}

fn main() {
    let _ = Orders.get(1);
}
