use std::fmt::Debug;

use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(block_handler = first_blocked)]
fn first<T, I>(items: I) -> Option<T>
where
    I: IntoIterator<Item = T>,
    T: Debug + Clone,
{
    items.into_iter().next()
}

fn first_blocked<T, I>(_items: I, _b: BlockError) -> Option<T>
where
    I: IntoIterator<Item = T>,
{
    None
}

#[sentinel_resource(fallback = len_fallback)]
fn len_of<S: AsRef<str> + ?Sized>(s: &S) -> Result<usize, AppError> {
    Ok(s.as_ref().len())
}

fn len_fallback<S: ?Sized>(_s: &S, _e: AppError) -> Result<usize, AppError> {
    Ok(0)
}

#[sentinel_resource(block_handler = sized_blocked)]
fn sized<T: ?Sized + Debug>(value: &T) -> String {
    format!("{value:?}")
}

fn sized_blocked<T: ?Sized>(_value: &T, _b: BlockError) -> String {
    String::new()
}

#[sentinel_resource]
fn const_generic<const N: usize>(xs: [u8; N]) -> Result<usize, AppError> {
    Ok(xs.len() + N)
}

fn main() {
    assert_eq!(first(vec![1, 2]), Some(1));
    assert_eq!(len_of("abc").unwrap(), 3);
    assert_eq!(sized("x"), "\"x\"");
    assert_eq!(const_generic([1, 2]).unwrap(), 4);
}
