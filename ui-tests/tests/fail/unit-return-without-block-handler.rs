use sentinel_runtime::sentinel_resource;

#[sentinel_resource(name = "notify")]
fn notify(user: u64) {
    println!("{user}");
}

fn main() {}
