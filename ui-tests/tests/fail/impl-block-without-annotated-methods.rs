use sentinel_runtime::sentinel_resource;

struct Orders;

#[sentinel_resource]
impl Orders {
    fn get(&self, id: u64) -> u64 {
        id
    }
}

fn main() {
    let _ = Orders.get(1);
}
