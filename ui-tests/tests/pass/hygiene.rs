// The expansion uses absolute paths and hygienic locals: shadowing prelude names, `core`, `std`, our crate's
// name, and our own local names must change nothing.
#![allow(dead_code, non_camel_case_types, non_snake_case, unused_imports, clippy::all)]

mod core {}
mod std {}
mod sentinel_runtime {}

use ::sentinel_runtime as real;
use real::{sentinel_resource, BlockError};

struct Option;
struct Some;
struct None;
struct Box;
struct String;
struct Vec;
fn Ok() {}
fn Err() {}
fn drop() {}
fn matches() {}
trait Future {}
trait Clone {}
trait From {}
trait Into {}
trait Send {}

#[derive(Debug)]
struct AppError(u8);
impl ::core::convert::From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError(0)
    }
}

#[sentinel_resource(crate = real, fallback = fb, exceptions_to_ignore = [AppError(9)])]
fn shadowing(x: u8) -> ::core::result::Result<u8, AppError> {
    let __sentinel_entry = 1u8;
    let __sentinel_result = 2u8;
    let __SENTINEL_SITE = 3u8;
    let __sentinel_error = x;
    ::core::result::Result::Ok(__sentinel_entry + __sentinel_result + __SENTINEL_SITE + __sentinel_error)
}

fn fb(_x: u8, e: AppError) -> ::core::result::Result<u8, AppError> {
    ::core::result::Result::Err(e)
}

mod inner {
    use ::sentinel_runtime::{sentinel_resource, BlockError};
    type Option = ();
    type Ready = ();
    struct Entry;
    struct Resource;
    struct EntryType;

    #[sentinel_resource(block_handler = blocked)]
    pub fn unit_result(x: u8) -> Option {
        let _ = x;
    }

    fn blocked(_x: u8, _b: BlockError) -> Option {}
}

fn main() {
    assert_eq!(shadowing(4).unwrap(), 10);
    inner::unit_result(1);
}
