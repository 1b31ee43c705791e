// Our wrapper never makes a future `!Send`; a body that holds an `Rc` across `.await` is `!Send` on its own,
// and the error names the user's `Rc`, not generated code.
use std::rc::Rc;

use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = blocked)]
async fn get(id: u64) -> u64 {
    let shared = Rc::new(id);
    std::future::ready(()).await;
    *shared
}

fn blocked(_id: u64, _b: BlockError) -> u64 {
    0
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(get(1));
}
