//! Token helpers that `validate` and `expand` both use: the type as users write it, and whether a token
//! stream names an identifier. Below both stages; imports neither.

use proc_macro2::{TokenStream, TokenTree};

/// A type as users write it (`Option<String>`, not `Option < String >`).
pub fn type_string(tokens: &TokenStream) -> String {
    tokens
        .to_string()
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" ,", ",")
        .replace("& ", "&")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
}

/// Whether `tokens`, groups included, hold the identifier `ident` (`impl` of an `impl Trait`, `Self`).
pub fn mentions(tokens: TokenStream, ident: &str) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == ident,
        TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}
