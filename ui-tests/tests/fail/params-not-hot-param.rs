use sentinel_runtime::{sentinel_resource, BlockError};

struct Cart {
    items: Vec<u64>,
}

#[sentinel_resource(block_handler = blocked, params = [cart])]
fn checkout(cart: Cart) -> usize {
    cart.items.len()
}

fn blocked(_cart: Cart, _b: BlockError) -> usize {
    0
}

fn main() {}
