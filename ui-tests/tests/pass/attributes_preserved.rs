// Visibility, `unsafe`, `extern`, docs and other attributes survive the expansion.
#![deny(missing_docs)]
//! Crate docs.

use sentinel_runtime::{sentinel_resource, BlockError};

/// Docs on the function stay.
#[must_use]
#[inline]
#[sentinel_resource(block_handler = blocked)]
pub(crate) fn kept(x: u32) -> u32 {
    x
}

fn blocked(_x: u32, _b: BlockError) -> u32 {
    0
}

/// An unsafe function stays unsafe: its body may call unsafe code without a block. Handlers are safe
/// Rust functions (an `unsafe fn` or `extern "C" fn` is not callable as a closure).
#[sentinel_resource(block_handler = read_blocked)]
pub unsafe fn read(p: *const u32) -> u32 {
    *p
}

fn read_blocked(_p: *const u32, _b: BlockError) -> u32 {
    0
}

/// `extern "C"` functions too.
#[sentinel_resource(block_handler = c_blocked)]
pub extern "C" fn c_abi(x: i32) -> i32 {
    x * 2
}

fn c_blocked(_x: i32, _b: BlockError) -> i32 {
    0
}

#[sentinel_resource(block_handler = cfg_blocked)]
#[cfg(not(any()))]
#[allow(unused_variables)]
fn with_cfg(unused: u8) -> u8 {
    1
}

fn cfg_blocked(_u: u8, _b: BlockError) -> u8 {
    0
}

fn main() {
    assert_eq!(kept(2), 2);
    let v = 7u32;
    // SAFETY: `v` is a live u32.
    assert_eq!(unsafe { read(&v) }, 7);
    assert_eq!(c_abi(2), 4);
    assert_eq!(with_cfg(0), 1);
}
