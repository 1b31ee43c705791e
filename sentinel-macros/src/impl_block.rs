//! `#[sentinel_resource]` on an impl block: the block's annotated methods are named `module::Type::method`
//! after the type as written in the impl (an attribute on a method cannot see its impl block).
//!
//! The block's attribute takes no arguments. It expands each method that carries `#[sentinel_resource(..)]`
//! itself, through the same stages as a function, with the type's name as the default name's middle part;
//! other items are left as they are.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::{Attribute, ImplItem, ItemFn, ItemImpl, Meta, Type};

use crate::attr::Args;
use crate::{expand, validate};

/// Whether `attr` is `#[sentinel_resource]` (under any path: `sentinel_runtime::sentinel_resource`, a
/// re-export).
fn is_ours(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|s| s.ident == "sentinel_resource")
}

/// The type as written, without generic arguments: `Orders` for `impl Orders`, `Cache` for
/// `impl<K> Cache<K>`, `Client` for `impl Service for crate::net::Client`.
fn type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().map(|s| {
            let name = s.ident.to_string();
            name.strip_prefix("r#").map(str::to_string).unwrap_or(name)
        }),
        Type::Paren(p) => type_name(&p.elem),
        Type::Group(g) => type_name(&g.elem),
        Type::Reference(r) => type_name(&r.elem),
        _ => None,
    }
}

fn method_args(attr: &Attribute) -> syn::Result<Args> {
    match &attr.meta {
        Meta::Path(_) => Ok(Args::default()),
        Meta::List(list) => syn::parse2::<Args>(list.tokens.clone()),
        Meta::NameValue(nv) => {
            Err(syn::Error::new_spanned(nv, "write `#[sentinel_resource]` or `#[sentinel_resource(key = value, ..)]`"))
        }
    }
}

pub fn expand(args: &Args, mut block: ItemImpl) -> TokenStream {
    let mut errors: Vec<syn::Error> = Vec::new();
    if !args.is_empty() {
        errors.push(syn::Error::new(
            Span::call_site(),
            "`#[sentinel_resource]` on an impl block takes no arguments (it names the block's annotated methods \
             after the type); put the arguments on each method's `#[sentinel_resource(..)]`",
        ));
    }
    let ty = type_name(&block.self_ty);
    if ty.is_none() {
        errors.push(syn::Error::new_spanned(
            &block.self_ty,
            "`#[sentinel_resource]` on an impl block needs a named type (`impl Orders`, `impl Trait for Orders`) \
             to name the methods after; give each method a `name` instead",
        ));
    }
    let mut annotated = 0;
    for item in block.items.iter_mut() {
        let ImplItem::Fn(method) = item else { continue };
        let Some(pos) = method.attrs.iter().position(is_ours) else { continue };
        annotated += 1;
        let attr = method.attrs.remove(pos);
        let func = ItemFn {
            attrs: method.attrs.clone(),
            vis: method.vis.clone(),
            sig: method.sig.clone(),
            block: Box::new(method.block.clone()),
        };
        let result = method_args(&attr).and_then(|method_args| {
            let plan = validate::validate(&method_args, &func, ty.clone())?;
            Ok(expand::expand(&plan))
        });
        match result {
            Ok(tokens) if method.defaultness.is_none() => *item = ImplItem::Verbatim(tokens),
            Ok(_) => errors.push(syn::Error::new_spanned(
                method.defaultness,
                "`#[sentinel_resource]` does not support `default fn` (specialization)",
            )),
            // The method stays as written (without our attribute) beside the error.
            Err(e) => errors.push(e),
        }
    }
    if annotated == 0 && errors.is_empty() {
        errors.push(syn::Error::new(
            Span::call_site(),
            "no method of this impl block has `#[sentinel_resource]`: on an impl block the attribute names the \
             block's annotated methods; annotate the methods to guard, or remove it",
        ));
    }
    let errors = errors.into_iter().map(|e| e.to_compile_error());
    let block = block.into_token_stream();
    quote!(#block #(#errors)*)
}
