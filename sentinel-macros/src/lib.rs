#![doc = include_str!("../README.md")]
//!
//! ## Implementation
//!
//! The work is staged: `attr` parses the arguments, `validate` checks them against the function and
//! decides the shape of the expansion (its plan), `expand` generates the code from the plan. Each stage
//! imports only the ones before it; the token helpers both of the last two need are in `tokens`, below
//! them. On any error the user's function is emitted unchanged beside the error, so the only error is ours
//! and IDE completion keeps working.
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};

mod attr;
mod expand;
mod impl_block;
mod tokens;
mod validate;

/// Marks a function as a Sentinel resource: every call enters the resource, runs the checks of its rules, and
/// exits when the call returns, returns early, fails with `?` or panics.
///
/// Arguments: `name`, `entry_type`, `block_handler`, `fallback`, `default_fallback`, `exceptions_to_ignore`,
/// `exceptions_to_trace`, `params`, `origin`, `context`, `timeout_ms`, `crate`. See the crate documentation
/// (the macro's README) for their meaning, the dispatch order, async functions and examples.
///
/// On an impl block (without arguments) it names the block's annotated methods `module::Type::method` after
/// the type as written, at compile time.
///
/// ```
/// use sentinel_runtime::{sentinel_resource, BlockError};
///
/// #[sentinel_resource(name = "greet", block_handler = greet_blocked)]
/// fn greet(who: &str) -> String {
///     format!("hello {who}")
/// }
///
/// fn greet_blocked(who: &str, _b: BlockError) -> String {
///     format!("busy, {who}")
/// }
///
/// assert_eq!(greet("you"), "hello you");
/// ```
#[proc_macro_attribute]
pub fn sentinel_resource(attr: TokenStream, item: TokenStream) -> TokenStream {
    let original: TokenStream2 = item.clone().into();
    let args = match syn::parse::<attr::Args>(attr) {
        Ok(a) => a,
        Err(e) => return with_error(original, e),
    };
    if let Ok(block) = syn::parse::<syn::ItemImpl>(item.clone()) {
        return impl_block::expand(&args, block).into();
    }
    let func: syn::ItemFn = match syn::parse(item) {
        Ok(f) => f,
        Err(_) => return with_error(original.clone(), not_a_function(original)),
    };
    match validate::validate(&args, &func, None) {
        Ok(plan) => expand::expand(&plan).into(),
        Err(e) => with_error(original, e),
    }
}

/// The original item, unchanged, and our error beside it.
fn with_error(original: TokenStream2, err: syn::Error) -> TokenStream {
    let mut out = original;
    out.extend(err.to_compile_error());
    out.into()
}

fn not_a_function(original: TokenStream2) -> syn::Error {
    if let Ok(m) = syn::parse2::<syn::TraitItemFn>(original.clone()) {
        if m.default.is_none() {
            return syn::Error::new_spanned(
                m.sig.ident,
                "`#[sentinel_resource]` needs a function body: put it on the method's implementation, not on its declaration in a trait",
            );
        }
    }
    let what = match syn::parse2::<syn::Item>(original) {
        Ok(syn::Item::Struct(_)) => "a struct",
        Ok(syn::Item::Enum(_)) => "an enum",
        Ok(syn::Item::Mod(_)) => "a module",
        Ok(syn::Item::Trait(_)) => "a trait",
        Ok(syn::Item::Static(_)) | Ok(syn::Item::Const(_)) => "a constant or static",
        Ok(syn::Item::Type(_)) => "a type alias",
        _ => "this item",
    };
    syn::Error::new(
        Span::call_site(),
        format!("`#[sentinel_resource]` applies to functions and methods with a body, not to {what}"),
    )
}
