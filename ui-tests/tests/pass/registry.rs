use sentinel_runtime::{sentinel_resource, BlockError, EntryType, Sentinel};

#[sentinel_resource(name = "registered.one", entry_type = In, block_handler = blocked)]
fn one() -> u8 {
    1
}

mod nested {
    use sentinel_runtime::{sentinel_resource, BlockError};

    #[sentinel_resource(block_handler = blocked)]
    pub fn two() -> u8 {
        2
    }

    fn blocked(_b: BlockError) -> u8 {
        0
    }
}

fn blocked(_b: BlockError) -> u8 {
    0
}

fn main() {
    assert_eq!(one() + nested::two(), 3);
    let all = Sentinel::registered_resources();
    let one = all.iter().find(|d| d.name == "registered.one").unwrap();
    assert_eq!(one.entry_type, EntryType::In);
    assert!(one.has_block_handler);
    assert!(all.iter().any(|d| d.name.ends_with("::nested::two") && d.module_path.ends_with("::nested")));
}
