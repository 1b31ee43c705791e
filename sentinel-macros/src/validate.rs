//! Stage 2: check the arguments against the function and decide the shape of the expansion.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::format_ident;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Block, Expr, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Stmt, Type, TypeParamBound,
};

use crate::attr::{Args, Keyed};
use crate::tokens::{mentions, type_string};

/// How the function runs.
pub enum Shape {
    /// A plain `fn`.
    Sync,
    /// An `async fn`.
    Async,
    /// A method rewritten by `#[async_trait]`: `fn .. -> Pin<Box<dyn Future<Output = R> + ..>>` whose body ends
    /// in `Box::pin(async move { .. })`. `future` is that async block; `prefix` the statements before it.
    AsyncTrait { prefix: Vec<Stmt>, future: Box<Expr> },
}

/// How an argument is handed to a handler again after the body ran.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// `&mut T` or `&mut self`: reborrowed (sync only).
    MutRef,
    /// Anything else: cloned before the body (`&T` and `Copy` types cost nothing).
    Clone,
}

/// One parameter of the function, including the receiver.
pub struct Param {
    /// How generated code names it (`self`, the user's ident, or a fresh name for a pattern).
    pub name: Ident,
    /// For a pattern parameter: the pattern to bind inside the body, from `name`.
    pub pattern: Option<Pat>,
    pub reuse: Reuse,
    /// A shared reference (`&T`, `&self`): `Copy`, so still at hand after the body ran, at no cost.
    pub shared_ref: bool,
    pub span: Span,
    /// Its type as written in a handler's `fn` pointer type (`_` where it holds an `impl Trait`).
    pub ty: TokenStream,
}

/// Where the default resource name comes from.
pub enum Naming {
    /// `name = ".."` was given.
    Explicit,
    /// A free function (or an associated function that does not mention `Self`): `module::function`.
    Free,
    /// A method of an impl block that carries the attribute: `module::Type::method`, `Type` as written.
    ImplType(String),
    /// A method (it has a receiver or mentions `Self` in its signature) of an impl block without the
    /// attribute: `module::Type::method`, `Type` found from `Self` at the first call.
    SelfType,
}

/// Everything the expansion needs.
pub struct Plan<'a> {
    pub args: &'a Args,
    pub func: &'a ItemFn,
    pub naming: Naming,
    pub shape: Shape,
    pub returns_result: bool,
    pub params: Vec<Param>,
    /// Whether handlers are checked by coercing them to a `fn` pointer type spelled from the signature (the
    /// clearest error: "expected fn pointer `fn(u64, String, BlockError) -> R`"). Not when the return type
    /// has an elided lifetime: the pointer type could not be written.
    pub typed_handlers: bool,
    /// The declared return type (for async functions, the output), when it can be named.
    pub output: Option<Type>,
    /// `E` of a `Result<T, E>` return, when written out.
    pub error_ty: Option<Type>,
}

fn has_elided_lifetime(tokens: TokenStream) -> bool {
    let mut prev_and = false;
    for t in tokens {
        match t {
            TokenTree::Punct(p) if p.as_char() == '\'' => {
                // The lifetime's name follows; `'_` is elided.
                prev_and = false;
                continue;
            }
            TokenTree::Ident(i) if i == "_" => return true,
            TokenTree::Group(g) => {
                if prev_and || has_elided_lifetime(g.stream()) {
                    return true;
                }
            }
            TokenTree::Punct(p) if p.as_char() == '&' => {
                prev_and = true;
                continue;
            }
            _ => {
                if prev_and {
                    return true;
                }
            }
        }
        prev_and = false;
    }
    prev_and
}

/// A type for a `fn` pointer: `_` when it holds an `impl Trait`.
fn pointer_ty(ty: &Type) -> TokenStream {
    let tokens = ty.to_token_stream();
    if mentions(tokens.clone(), "impl") {
        quote::quote!(_)
    } else {
        tokens
    }
}

fn result_error_ty(ty: &Type) -> Option<Type> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    let PathArguments::AngleBracketed(a) = &seg.arguments else {
        return None;
    };
    let types: Vec<&Type> = a
        .args
        .iter()
        .filter_map(|g| match g {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect();
    match types.as_slice() {
        [_, e] if !mentions(e.to_token_stream(), "impl") => Some((*e).clone()),
        _ => None,
    }
}

fn is_result_type(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        Type::Paren(p) => is_result_type(&p.elem),
        Type::Group(g) => is_result_type(&g.elem),
        _ => false,
    }
}

/// The `Output = R` of `Pin<Box<dyn Future<Output = R> + ..>>`.
fn future_output(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Path(p) => {
            for seg in &p.path.segments {
                if let PathArguments::AngleBracketed(a) = &seg.arguments {
                    for arg in &a.args {
                        if let GenericArgument::Type(t) = arg {
                            if let Some(o) = future_output(t) {
                                return Some(o);
                            }
                        }
                    }
                }
            }
            None
        }
        Type::TraitObject(t) => t.bounds.iter().find_map(|b| match b {
            TypeParamBound::Trait(tb) => tb.path.segments.last().and_then(|s| match &s.arguments {
                PathArguments::AngleBracketed(a) if s.ident == "Future" => a.args.iter().find_map(|g| match g {
                    GenericArgument::AssocType(at) if at.ident == "Output" => Some(&at.ty),
                    _ => None,
                }),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    }
}

/// Recognizes the body `#[async_trait]` generates: `.. Box::pin(async move { .. })`.
fn async_trait_body(block: &Block) -> Option<(Vec<Stmt>, Box<Expr>)> {
    let (last, prefix) = block.stmts.split_last()?;
    let Stmt::Expr(Expr::Call(call), None) = last else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let segs: Vec<String> = func.path.segments.iter().map(|s| s.ident.to_string()).collect();
    if segs.len() < 2 || segs[segs.len() - 1] != "pin" || segs[segs.len() - 2] != "Box" || call.args.len() != 1 {
        return None;
    }
    match call.args.first() {
        Some(e @ Expr::Async(_)) => Some((prefix.to_vec(), Box::new(e.clone()))),
        _ => None,
    }
}

fn is_shared_ref(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => r.mutability.is_none(),
        Type::Paren(p) => is_shared_ref(&p.elem),
        Type::Group(g) => is_shared_ref(&g.elem),
        _ => false,
    }
}

fn is_mut_ref(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => r.mutability.is_some(),
        Type::Paren(p) => is_mut_ref(&p.elem),
        Type::Group(g) => is_mut_ref(&g.elem),
        _ => false,
    }
}

fn push(errors: &mut Option<syn::Error>, e: syn::Error) {
    match errors {
        Some(all) => all.combine(e),
        None => *errors = Some(e),
    }
}

fn key_error<T>(k: &Option<Keyed<T>>, msg: &str, errors: &mut Option<syn::Error>) {
    if let Some(k) = k {
        push(errors, syn::Error::new(k.key, msg));
    }
}

/// Checks the function and the arguments together. `impl_type` is the type of the impl block when the
/// attribute is on the block (its methods are named after it).
pub fn validate<'a>(args: &'a Args, func: &'a ItemFn, impl_type: Option<String>) -> syn::Result<Plan<'a>> {
    let sig = &func.sig;
    let mut errors = None;
    if let Some(c) = &sig.constness {
        push(
            &mut errors,
            syn::Error::new(
                c.span,
                "`#[sentinel_resource]` cannot be used on a `const fn`: entering a resource happens at run time; remove `const`",
            ),
        );
    }
    if let Some(v) = &sig.variadic {
        push(&mut errors, syn::Error::new(v.span(), "`#[sentinel_resource]` does not support variadic functions"));
    }

    let shape = if sig.asyncness.is_some() {
        Shape::Async
    } else if let (ReturnType::Type(_, ty), Some((prefix, future))) = (&sig.output, async_trait_body(&func.block)) {
        if future_output(ty).is_some() {
            Shape::AsyncTrait { prefix, future }
        } else {
            Shape::Sync
        }
    } else {
        Shape::Sync
    };

    let output_ty: Option<&Type> = match (&shape, &sig.output) {
        (_, ReturnType::Default) => None,
        (Shape::AsyncTrait { .. }, ReturnType::Type(_, ty)) => future_output(ty),
        (_, ReturnType::Type(_, ty)) => Some(ty),
    };
    let returns_result = output_ty.is_some_and(is_result_type);
    let is_async = !matches!(shape, Shape::Sync);

    if !returns_result {
        let returned = output_ty.map_or_else(|| "()".to_string(), |t| type_string(&t.to_token_stream()));
        if args.block_handler.is_none() {
            let span = match &sig.output {
                ReturnType::Type(_, ty) => ty.span(),
                ReturnType::Default => sig.ident.span(),
            };
            push(
                &mut errors,
                syn::Error::new(
                    span,
                    format!(
                        "`{}` returns `{returned}`, not a `Result`, so a blocked call has nothing to return: add \
                         `block_handler = ..` (called with the function's arguments and the `BlockError`, returning \
                         `{returned}`), or return `Result<_, E>` with `E: From<BlockError>`",
                        sig.ident
                    ),
                ),
            );
        }
        let msg = |key: &str| {
            format!(
                "`{key}` needs a function that returns `Result`: it acts on the `Err` the body returns, and `{}` returns `{returned}`",
                sig.ident
            )
        };
        key_error(&args.fallback, &msg("fallback"), &mut errors);
        key_error(&args.default_fallback, &msg("default_fallback"), &mut errors);
        key_error(&args.exceptions_to_ignore, &msg("exceptions_to_ignore"), &mut errors);
        key_error(&args.exceptions_to_trace, &msg("exceptions_to_trace"), &mut errors);
        if args.timeout_ms.is_some() && is_async {
            key_error(
                &args.timeout_ms,
                &format!(
                    "`timeout_ms` needs a function that returns `Result<_, E>` with `E: From<sentinel_runtime::Timeout>`: \
                     a call that runs out of time returns `Err(E::from(timeout))` (or passes it to the fallback), and \
                     `{}` returns `{returned}`",
                    sig.ident
                ),
                &mut errors,
            );
        }
    }
    if args.timeout_ms.is_some() && !is_async {
        key_error(
            &args.timeout_ms,
            &format!(
                "`timeout_ms` needs an `async fn`: when the time is up the macro drops the body's future, and a sync \
                 function's body cannot be stopped once it runs (a thread cannot be cancelled); make `{}` async, or \
                 bound the time inside it (a client or socket timeout)",
                sig.ident
            ),
            &mut errors,
        );
    }

    let mut params = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        match input {
            FnArg::Receiver(r) => {
                let mut_ref = is_mut_ref(&r.ty);
                params.push(Param {
                    name: Ident::new("self", r.self_token.span),
                    pattern: None,
                    reuse: if mut_ref { Reuse::MutRef } else { Reuse::Clone },
                    shared_ref: is_shared_ref(&r.ty),
                    span: r.span(),
                    ty: pointer_ty(&r.ty),
                });
            }
            FnArg::Typed(t) => {
                let reuse = if is_mut_ref(&t.ty) { Reuse::MutRef } else { Reuse::Clone };
                let shared_ref = is_shared_ref(&t.ty);
                match &*t.pat {
                    Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => params.push(Param {
                        name: pi.ident.clone(),
                        pattern: None,
                        reuse,
                        shared_ref,
                        span: pi.ident.span(),
                        ty: pointer_ty(&t.ty),
                    }),
                    other => params.push(Param {
                        name: format_ident!("__sentinel_arg{}", i, span = other.span()),
                        pattern: Some(other.clone()),
                        reuse,
                        shared_ref,
                        span: other.span(),
                        ty: pointer_ty(&t.ty),
                    }),
                }
            }
        }
    }

    if is_async {
        if let Some(fb) = &args.fallback {
            for p in params.iter().filter(|p| p.reuse == Reuse::MutRef) {
                let mut e = syn::Error::new(
                    p.span,
                    format!(
                        "`fallback` of an async fn cannot receive the `&mut` argument `{}` again: the body's future \
                         holds it; use `default_fallback` (which takes only the error), or take it by `&`",
                        p.name
                    ),
                );
                e.combine(syn::Error::new(fb.key, "`fallback` given here"));
                push(&mut errors, e);
            }
        }
    }

    match errors {
        Some(e) => Err(e),
        None => {
            let output = output_ty.filter(|t| !mentions(t.to_token_stream(), "impl")).cloned();
            // An async handler's future may borrow its arguments: its type cannot be `_` in a pointer type that
            // is generic over their lifetimes, so async functions taking references use the trait path.
            let borrows = |p: &Param| p.ty.to_string().contains('&') || p.ty.to_string().contains('\'');
            let typed_handlers = output_ty.is_none_or(|t| !has_elided_lifetime(t.to_token_stream()))
                && !(is_async && params.iter().any(borrows));
            let error_ty = output_ty.filter(|_| returns_result).and_then(result_error_ty);
            let is_method = sig.receiver().is_some() || mentions(sig.to_token_stream(), "Self");
            let naming = match impl_type {
                _ if args.name.is_some() => Naming::Explicit,
                Some(ty) => Naming::ImplType(ty),
                None if is_method => Naming::SelfType,
                None => Naming::Free,
            };
            Ok(Plan { args, func, naming, shape, returns_result, params, typed_handlers, output, error_ty })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elided(ty: &str) -> bool {
        has_elided_lifetime(syn::parse_str::<Type>(ty).unwrap().to_token_stream())
    }

    #[test]
    fn elided_lifetimes_are_detected() {
        assert!(elided("&str"));
        assert!(elided("Result<&mut u8, E>"));
        assert!(elided("Cow<'_, str>"));
        assert!(elided("&[u8]"));
        assert!(!elided("&'a str"));
        assert!(!elided("Result<String, E>"));
        assert!(!elided("&'static mut Vec<u8>"));
    }

    #[test]
    fn result_types_are_recognized_by_name() {
        let is = |t: &str| is_result_type(&syn::parse_str::<Type>(t).unwrap());
        assert!(is("Result<u8, E>") && is("io::Result<u8>") && is("::core::result::Result<(), E>"));
        assert!(!is("Option<u8>") && !is("u8") && !is("(Result<u8, E>, u8)"));
        let err =
            |t: &str| result_error_ty(&syn::parse_str::<Type>(t).unwrap()).map(|e| e.to_token_stream().to_string());
        assert_eq!(err("Result<u8, MyError>").as_deref(), Some("MyError"));
        assert_eq!(err("io::Result<u8>"), None);
    }

    #[test]
    fn async_trait_bodies_are_recognized() {
        let f: ItemFn = syn::parse_quote! {
            fn get<'a, 'async_trait>(&'a self) -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = u8> + Send + 'async_trait>> {
                Box::pin(async move { 1 })
            }
        };
        let args = Args::default();
        // u8 is not a Result and there is no block handler: the error names the future's output type.
        let e = validate(&args, &f, None).err().unwrap().to_string();
        assert!(e.contains("returns `u8`"), "{e}");
    }
}
