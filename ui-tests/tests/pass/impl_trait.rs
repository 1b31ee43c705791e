use std::fmt::Display;

use sentinel_runtime::{sentinel_resource, BlockError};

#[sentinel_resource(block_handler = show_blocked)]
fn show(items: impl IntoIterator<Item = impl Display>) -> impl Display {
    items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn show_blocked(_items: impl IntoIterator<Item = impl Display>, _b: BlockError) -> String {
    "blocked".to_string()
}

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource]
fn evens(limit: u32) -> Result<impl Iterator<Item = u32>, AppError> {
    Ok((0..limit).filter(|n| n % 2 == 0))
}

impl From<std::num::ParseIntError> for AppError {
    fn from(_: std::num::ParseIntError) -> Self {
        AppError
    }
}

// An `impl Trait` `Ok` type and a body whose `?` leaves its error type to the declared one.
#[sentinel_resource]
fn parsed(s: &str) -> Result<impl Iterator<Item = u32>, AppError> {
    let n: u32 = s.parse()?;
    Ok(0..n)
}

#[sentinel_resource]
async fn parsed_async(s: String) -> Result<impl Iterator<Item = u32>, AppError> {
    let n: u32 = s.parse()?;
    Ok(0..n)
}

#[sentinel_resource(block_handler = iter_blocked)]
fn boxed(limit: u32) -> Box<dyn Iterator<Item = u32>> {
    Box::new(0..limit)
}

fn iter_blocked(_limit: u32, _b: BlockError) -> Box<dyn Iterator<Item = u32>> {
    Box::new(std::iter::empty())
}

fn main() {
    assert_eq!(show([1, 2]).to_string(), "1,2");
    assert_eq!(evens(5).unwrap().count(), 3);
    assert_eq!(boxed(3).count(), 3);
    assert_eq!(parsed("4").unwrap().count(), 4);
    assert!(parsed("x").is_err());
    assert_eq!(futures::executor::block_on(parsed_async("2".to_string())).unwrap().count(), 2);
    assert!(futures::executor::block_on(parsed_async("x".to_string())).is_err());
}
