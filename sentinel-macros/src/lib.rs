//! The `#[sentinel_resource]` attribute macro. Use it through `sentinel_runtime::sentinel_resource`.
#![deny(missing_docs)]

use proc_macro::TokenStream;

/// Marks a function as a Sentinel resource. See the `sentinel-runtime` documentation.
#[proc_macro_attribute]
pub fn sentinel_resource(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
