//! `#[sentinel_resource]` on impl blocks (inherent, generic, trait impls) names methods `module::Type::method`.
use sentinel_runtime::{sentinel_resource, BlockError, Sentinel};

#[derive(Debug)]
struct AppError;

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

struct Orders;
struct Cache<K>(K);

#[sentinel_resource]
impl Orders {
    /// Docs and other attributes stay.
    #[inline]
    #[sentinel_resource]
    pub fn get(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }

    #[sentinel_resource(name = "explicit")]
    fn named(&self) -> Result<(), AppError> {
        Ok(())
    }

    fn untouched(&self) -> u8 {
        1
    }
}

#[sentinel_resource]
impl<K: Clone> Cache<K> {
    #[sentinel_runtime::sentinel_resource]
    fn get(&self) -> Result<K, AppError> {
        Ok(self.0.clone())
    }
}

#[sentinel_resource]
impl std::fmt::Display for Orders {
    #[sentinel_resource(block_handler = Self::busy)]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("orders")
    }
}

impl Orders {
    fn busy(&self, f: &mut std::fmt::Formatter<'_>, _b: BlockError) -> std::fmt::Result {
        f.write_str("busy")
    }
}

fn main() {
    assert_eq!(Orders.get(1).unwrap(), 1);
    Orders.named().unwrap();
    assert_eq!(Orders.untouched(), 1);
    assert_eq!(Cache(2u8).get().unwrap(), 2);
    assert_eq!(Orders.to_string(), "orders");
    let names: Vec<&str> = Sentinel::registered_resources().iter().map(|d| d.name).collect();
    let m = module_path!();
    for n in [format!("{m}::Orders::get"), "explicit".into(), format!("{m}::Cache::get"), format!("{m}::Orders::fmt")] {
        assert!(names.contains(&n.as_str()), "{n} not in {names:?}");
    }
}
