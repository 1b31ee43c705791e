//! Stage 3: generate the function.
//!
//! The generated body: a `static` resource site and an `inventory` descriptor; enter (or `decide` and await the
//! queueing timer, in async code); on a block, dispatch to the block handler / fallback / `Err(E::from(..))`;
//! run the user's body in its own closure or async block (so `return` and `?` come back to us); on an `Err`,
//! apply the ignore / trace lists, trace, and call the fallback. The entry exits when it goes out of scope:
//! on every return path and on unwind. Our locals are `Span::mixed_site()` so user code cannot see or shadow
//! them.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, ReturnType, Type};

use crate::attr::{EntryKind, ErrorMatch};
use crate::tokens::mentions;
use crate::validate::{Naming, Plan, Reuse, Shape};

/// Where an `async fn`'s handler is awaited.
#[derive(Clone, Copy)]
enum Await {
    /// In the context the call was made in (a blocked call: no entry).
    Blocked,
    /// In the entry's context.
    InEntry,
    /// In the entry's context, the handler's future in a box (a rare path that must add no room).
    InEntryBoxed,
}

fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// `tokens` with every span set to `span`, so that an error about them points at the user's token (used only on
/// absolute paths and types, never on our hygienic locals).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut t| {
            if let TokenTree::Group(g) = &t {
                let mut ng = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                ng.set_span(span);
                t = TokenTree::Group(ng);
            } else {
                t.set_span(span);
            }
            t
        })
        .collect()
}

/// `if false { let r: R = loop {}; return r; }`: fixes the type the body's `return` and `?` produce to the
/// declared return type, so inference and type errors behave as in the user's own function.
fn fake_return_edge(ty: Option<&Type>) -> TokenStream {
    let Some(ty) = ty else {
        return TokenStream::new();
    };
    if mentions(ty.to_token_stream(), "impl") {
        return TokenStream::new();
    }
    let ret = local("__sentinel_ret");
    quote_spanned! {ty.span()=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #ret: #ty = loop {};
            return #ret;
        }
    }
}

pub fn expand(plan: &Plan<'_>) -> TokenStream {
    let args = plan.args;
    let func = plan.func;
    let sig = &func.sig;
    let krate = match &args.krate {
        Some(k) => k.value.to_token_stream(),
        None => quote!(::sentinel_runtime),
    };
    let private = quote!(#krate::__private);
    let is_async = !matches!(plan.shape, Shape::Sync);

    let fn_name = sig.ident.to_string();
    let fn_name = fn_name.strip_prefix("r#").unwrap_or(&fn_name).to_string();
    let name = match (&args.name, &plan.naming) {
        (Some(k), _) => k.value.to_token_stream(),
        (None, Naming::ImplType(ty)) => quote!(::core::concat!(::core::module_path!(), "::", #ty, "::", #fn_name)),
        // Named at the first call; the registry shows this placeholder until then.
        (None, Naming::SelfType) => quote!(::core::concat!(::core::module_path!(), "::Self::", #fn_name)),
        (None, _) => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
    };
    let from_self = matches!(plan.naming, Naming::SelfType);
    let entry_type = match args.entry_type.as_ref().map(|k| k.value) {
        Some(EntryKind::In) => quote!(#krate::EntryType::In),
        _ => quote!(#krate::EntryType::Out),
    };

    let site = Ident::new("__SENTINEL_SITE", Span::mixed_site());
    let has_bh = args.block_handler.is_some();
    let has_fb = args.fallback.is_some();
    let has_dfb = args.default_fallback.is_some();
    // The site and the descriptor live in a block of their own, so their names are not in scope in the body.
    let site_ref = local("__sentinel_site");
    let resolve_fn = local("__sentinel_resolve");
    let (new_site, resolver, resolve) = if from_self {
        (
            quote!(#private::ResourceSite::method(::core::module_path!(), #fn_name, #entry_type)),
            quote! {
                fn #resolve_fn(
                    base: &'static #private::ResourceDescriptor,
                ) -> ::core::option::Option<&'static #private::ResourceDescriptor> {
                    #site.resolved_descriptor(base)
                }
            },
            quote!(::core::option::Option::Some(#resolve_fn)),
        )
    } else {
        (
            quote!(#private::ResourceSite::new(#name, #entry_type)),
            TokenStream::new(),
            quote!(::core::option::Option::None),
        )
    };
    let registration = quote! {
        let #site_ref: &'static #private::ResourceSite = {
            static #site: #private::ResourceSite = #new_site;
            #resolver
            #private::inventory::submit! {
                #private::ResourceDescriptor {
                    name: #name,
                    entry_type: #entry_type,
                    function: #fn_name,
                    module_path: ::core::module_path!(),
                    file: ::core::file!(),
                    line: ::core::line!(),
                    is_async: #is_async,
                    has_block_handler: #has_bh,
                    has_fallback: #has_fb,
                    has_default_fallback: #has_dfb,
                    resolve: #resolve,
                }
            }
            &#site
        };
    };

    // The entry builder.
    let resource = if from_self {
        quote!(#site_ref.method_resource(::core::any::type_name::<Self>))
    } else {
        quote!(#site_ref.resource())
    };
    let mut builder = quote!(#resource.entry());
    if let Some(p) = &args.params {
        let values = p.value.iter().map(|e| {
            let private = respan(private.clone(), e.span());
            quote_spanned!(e.span()=> #private::hot_param(&(#e)))
        });
        builder = quote!(#builder.args(&[#(#values),*]));
    }
    if let Some(o) = &args.origin {
        let e = &o.value;
        builder = quote!(#builder.origin(#private::as_str(&(#e))));
    }
    if let Some(c) = &args.context {
        let e = &c.value;
        builder = quote!(#builder.context(#private::as_str(&(#e))));
    }

    let entry = local("__sentinel_entry");
    let decision = local("__sentinel_decision");
    let block = local("__sentinel_block");
    let result = local("__sentinel_result");
    let error = local("__sentinel_error");
    let slow = local("__sentinel_slow");
    let scope = local("__sentinel_scope");
    // An async fn's handler is called and awaited in the call's context: a fallback in the entry's (still
    // open), a block handler in the context the call was made in.
    // Spanned on the handler's path, so that a handler whose output does not fit is reported there.
    // A block handler called for a nested call's block that escaped the body runs in the entry too; its output
    // is awaited in a box, so that this rare path adds no room to the call's future.
    let await_output = |call: TokenStream, at: Await, span: Span| -> TokenStream {
        let private = respan(private.clone(), span);
        match (is_async, at) {
            (false, _) => call,
            (true, Await::InEntry) => {
                quote_spanned!(span=> #private::entry_output(&mut #scope, &#entry, move || #call).await)
            }
            (true, Await::InEntryBoxed) => {
                quote_spanned!(span=> #private::entry_output_boxed(&mut #scope, &#entry, move || #call).await)
            }
            (true, Await::Blocked) => quote_spanned!(span=> #private::blocked_output(&mut #scope, move || #call).await),
        }
    };

    // Arguments as handlers receive them: before the body (block path) and after it (fallback).
    let names: Vec<&Ident> = plan.params.iter().map(|p| &p.name).collect();
    let clone_vars: Vec<Ident> =
        (0..plan.params.len()).map(|i| local(&format!("__sentinel_fallback_arg{i}"))).collect();
    let mut clones = TokenStream::new();
    let mut reused = Vec::new();
    if has_fb {
        for (p, var) in plan.params.iter().zip(&clone_vars) {
            let n = &p.name;
            match p.reuse {
                Reuse::Clone => {
                    clones.extend(quote_spanned!(p.span=> let #var = #private::clone_for_fallback(&#n);));
                    reused.push(var.to_token_stream());
                }
                Reuse::MutRef => reused.push(n.to_token_stream()),
            }
        }
    }

    // Block dispatch (SPEC §1 step 1).
    let output_ty: Option<&Type> = match (&plan.shape, &sig.output) {
        (_, ReturnType::Default) => None,
        (Shape::AsyncTrait { .. }, ReturnType::Type(..)) => None,
        (_, ReturnType::Type(_, ty)) => Some(ty),
    };
    // Handlers are called through a `fn` pointer typed from the signature when possible, so a mismatch reads
    // "expected fn pointer `fn(u64, String, BlockError) -> R`, found fn item `fn(u64, BlockError) -> R`" on the
    // handler's path; else through `Handler` (a trait over `FnOnce`).
    let block_error_ty = quote!(#krate::BlockError);
    let ret_ptr = if is_async {
        quote!(_)
    } else {
        match (&sig.output, &plan.output) {
            (ReturnType::Default, _) => quote!(()),
            (_, Some(t)) => t.to_token_stream(),
            (_, None) => quote!(_),
        }
    };
    let err_ptr = match &plan.error_ty {
        Some(e) => e.to_token_stream(),
        None => quote!(_),
    };
    let param_tys: Vec<&TokenStream> = plan.params.iter().map(|p| &p.ty).collect();
    let handler_var = local("__sentinel_handler");
    let call = |path: &syn::ExprPath,
                last_ty: &TokenStream,
                call_args: Vec<TokenStream>,
                all_args: bool,
                via: &str,
                at: Await| {
        let span = path.span();
        let call = if plan.typed_handlers {
            let tys: Vec<TokenStream> =
                if all_args { param_tys.iter().map(|t| respan((*t).clone(), span)).collect() } else { Vec::new() };
            let last_ty = respan(last_ty.clone(), span);
            let ret_ptr = respan(ret_ptr.clone(), span);
            quote_spanned! {span=>
                {
                    #[allow(clippy::type_complexity)]
                    let #handler_var: fn(#(#tys,)* #last_ty) -> #ret_ptr = #path;
                    #handler_var(#(#call_args),*)
                }
            }
        } else {
            let via = Ident::new(via, span);
            let private = respan(private.clone(), span);
            if all_args {
                quote_spanned!(span=> #private::#via(#path, (#(#call_args,)*)))
            } else {
                quote_spanned!(span=> #private::#via(#path, #(#call_args)*))
            }
        };
        await_output(call, at, span)
    };
    let with_names = |last: TokenStream| -> Vec<TokenStream> {
        let mut v: Vec<TokenStream> = names.iter().map(|n| n.to_token_stream()).collect();
        v.push(last);
        v
    };
    // `E: From<BlockError>` is required on the error type: errors about it point there.
    let error_span = match (&plan.error_ty, output_ty) {
        (Some(e), _) => e.span(),
        (None, Some(t)) => t.span(),
        (None, None) => sig.ident.span(),
    };
    let private_at_error = respan(private.clone(), error_span);
    let on_block = if let Some(h) = &args.block_handler {
        call(&h.value, &block_error_ty, with_names(block.to_token_stream()), true, "call_block_handler", Await::Blocked)
    } else if let Some(f) = &args.fallback {
        let converted = quote_spanned!(error_span=> #private_at_error::block_error_into(#block));
        call(&f.value, &err_ptr, with_names(converted), true, "call_fallback", Await::Blocked)
    } else if let Some(f) = &args.default_fallback {
        let converted = quote_spanned!(error_span=> #private_at_error::block_error_into(#block));
        call(&f.value, &err_ptr, vec![converted], false, "call_default_fallback", Await::Blocked)
    } else {
        quote_spanned!(error_span=> #private_at_error::blocked_result(#block))
    };

    // Mutable: the body's return is marked on it (`body_returned`), and errors are traced on it.
    let mutability = quote!(mut);
    let enter = if is_async {
        quote! {
            // Decided in the first poll, in the context of the thread that polls; the entry installs itself
            // there, and the call's work runs in its context (`in_entry`). A call that passes without waiting
            // goes straight on. Else: a blocked call goes to its handler; a queueing rule's wait is awaited;
            // a check that asks the call to wait (a cluster rule whose leased tokens ran out, an adaptive
            // rule's `maxWaitMs`) makes it await that wait (without blocking the executor) and decide again,
            // with the arguments re-borrowed.
            //
            // The first decision moves whole into the slow path before anything is awaited, and its local ends
            // with the block: the call's future keeps no room for it (a match that moved only a part of it
            // would keep all of it across the awaits that follow).
            let mut #scope = #private::EntryScope::new();
            let #mutability #entry = {
                let #slow = #private::decide_now(#builder);
                match #slow {
                    ::core::result::Result::Ok(e) => e,
                    ::core::result::Result::Err(_) => {
                        let #decision = #private::decide_slow(#slow, &mut #scope, |w| {
                            #private::decide_async(#builder, w)
                        })
                        .await;
                        match #decision {
                            ::core::result::Result::Ok(e) => e,
                            ::core::result::Result::Err(_) => {
                                let #block = #private::refusal(#decision);
                                return #on_block;
                            }
                        }
                    }
                }
            };
        }
    } else {
        quote! {
            let #decision = #builder.enter();
            let #mutability #entry = match #decision {
                ::core::result::Result::Ok(e) => e,
                ::core::result::Result::Err(#block) => return #on_block,
            };
        }
    };

    // An async call's future may be dropped before its body comes back (its caller gave up): marked as
    // started, such a call gives no round-trip sample to an adaptive limit.
    let started = if is_async { quote!(#private::body_started(&mut #entry);) } else { TokenStream::new() };

    // The user's body, in its own scope.
    let user_block = &func.block;
    let pattern_lets: Vec<TokenStream> = plan
        .params
        .iter()
        .filter_map(|p| {
            p.pattern.as_ref().map(|pat| {
                let n = &p.name;
                quote!(let #pat = #n;)
            })
        })
        .collect();
    let edge = fake_return_edge(output_ty);

    // An error (traced, or a timeout) goes to the fallback, the default fallback, or is returned.
    let to_fallback = || {
        if let Some(f) = &args.fallback {
            let mut v = reused.clone();
            v.push(error.to_token_stream());
            call(&f.value, &err_ptr, v, true, "call_fallback", Await::InEntry)
        } else if let Some(f) = &args.default_fallback {
            call(&f.value, &err_ptr, vec![error.to_token_stream()], false, "call_default_fallback", Await::InEntry)
        } else {
            quote!(::core::result::Result::Err(#error))
        }
    };
    let outcome = if plan.returns_result {
        // Error dispatch (SPEC §1 step 2).
        let mut checks = TokenStream::new();
        let mut conds = Vec::new();
        let matcher = |m: &ErrorMatch| match m {
            ErrorMatch::Patterns(pats) => quote!(::core::matches!(&#error, #(#pats)|*)),
            ErrorMatch::Predicate(p) => {
                let private = respan(private.clone(), p.span());
                quote_spanned!(p.span()=> #private::call_error_predicate(#p, &#error))
            }
        };
        if let Some(ig) = &args.exceptions_to_ignore {
            let v = local("__sentinel_ignored");
            let m = matcher(&ig.value);
            checks.extend(quote!(#[allow(unused_variables)] let #v: bool = #m;));
            conds.push(quote!(!#v));
        }
        if let Some(tr) = &args.exceptions_to_trace {
            let v = local("__sentinel_traced");
            let m = matcher(&tr.value);
            checks.extend(quote!(#[allow(unused_variables)] let #v: bool = #m;));
            conds.push(quote!(#v));
        }
        let on_traced = to_fallback();
        let traced = quote! {
            #private::trace_error(&mut #entry);
            #on_traced
        };
        let handle_err = if conds.is_empty() {
            traced
        } else {
            quote! {
                #checks
                if #(#conds)&&* {
                    #traced
                } else {
                    ::core::result::Result::Err(#error)
                }
            }
        };
        let run_body = match (&plan.shape, &args.timeout_ms) {
            (Shape::Sync, _) => quote! {
                let #result = #private::run_body(|| {
                    #edge
                    #(#pattern_lets)*
                    #user_block
                });
            },
            (Shape::Async, None) => quote! {
                let #result = #private::in_entry(&mut #scope, &#entry, async move {
                    #edge
                    #(#pattern_lets)*
                    #user_block
                })
                .await;
            },
            (Shape::AsyncTrait { future, .. }, None) => quote! {
                let #result = #private::in_entry(&mut #scope, &#entry, #future).await;
            },
            (shape, Some(timeout)) => {
                // The body races a timer on the engine's clock; when the time is up the body's future is dropped
                // (exiting what it entered), the call counts as an exception whose response time is the limit,
                // and `E::from(Timeout)` goes to the fallback or is returned. Timeouts are always traced.
                let body = match shape {
                    Shape::AsyncTrait { future, .. } => future.to_token_stream(),
                    _ => quote! {
                        async move {
                            #edge
                            #(#pattern_lets)*
                            #user_block
                        }
                    },
                };
                let limit = local("__sentinel_limit");
                let ms = &timeout.value;
                let checked = quote_spanned!(ms.span()=> const { #private::checked_timeout_ms(#ms) });
                let on_timeout = to_fallback();
                let timed_out = quote_spanned!(error_span=> #private_at_error::timed_out(&mut #entry, #limit));
                quote! {
                    let #limit = ::core::time::Duration::from_millis(#checked);
                    let #result = match #private::in_entry(
                        &mut #scope,
                        &#entry,
                        #private::time_limited(&#entry, #limit, #body),
                    )
                    .await
                    {
                        ::core::option::Option::Some(r) => r,
                        ::core::option::Option::None => {
                            let #error = #timed_out;
                            return #on_timeout;
                        }
                    };
                }
            }
        };
        // A nested call's block that escaped the body (`?`), in an error type that says so (`AsBlockError`):
        // a block of this call, as Java's aspect catches a `BlockException` from the method before any other
        // error. Not traced, past the ignore/trace lists, to the block handler when the arguments are still at
        // hand (cloned for the fallback, or shared references), else where a block goes without one. Types that
        // cannot be a block probe to a constant `None`: nothing is generated for them.
        // The error's type, when written out: the probe's method is chosen from it, so it must be known there.
        let probe_ty = match &plan.error_ty {
            Some(e) => quote!(::<#e>),
            None => TokenStream::new(),
        };
        // The probe borrows the error inside a function: in an `async fn`, a local borrowed at some point keeps its
        // room across every later await, the error path's included.
        let probed = local("__sentinel_probed");
        let split = |keep: TokenStream| {
            quote! {
                #private::probe_block(#error, |#probed| {
                    #[allow(unused_imports)]
                    use #private::{CarriesBlock as _, CarriesNoBlock as _};
                    #keep((&#private::BlockProbe #probe_ty (#probed)).escaped_block())
                })
            }
        };
        let args_after_body: Option<Vec<TokenStream>> = if has_fb {
            Some(reused.clone())
        } else if plan.params.iter().all(|p| p.shared_ref) {
            Some(names.iter().map(|n| n.to_token_stream()).collect())
        } else {
            None
        };
        let escaped = match (&args.block_handler, args_after_body) {
            (Some(h), Some(mut v)) => {
                v.push(block.to_token_stream());
                let on_escaped = call(&h.value, &block_error_ty, v, true, "call_block_handler", Await::InEntryBoxed);
                let nested = local("__sentinel_nested");
                let split_owned = split(quote!(#private::owned_block));
                // The block's local ends before the error path's own awaits: it takes no room beside them.
                quote! {
                    let #error = {
                        let (#error, #nested): (_, ::core::option::Option<::std::boxed::Box<#block_error_ty>>) =
                            #split_owned;
                        match #nested {
                            ::core::option::Option::Some(#block) => {
                                let #block = *#block;
                                #private::discard(#error);
                                #[allow(clippy::needless_return)]
                                return #on_escaped;
                            }
                            ::core::option::Option::None => #error,
                        }
                    };
                    #handle_err
                }
            }
            _ => {
                let on_escaped = to_fallback();
                let nested = local("__sentinel_nested");
                let split_bool = split(quote!(#private::is_block));
                quote! {
                    let (#error, #nested): (_, bool) = #split_bool;
                    if #nested {
                        #on_escaped
                    } else {
                        #handle_err
                    }
                }
            }
        };
        let value = local("__sentinel_value");
        quote! {
            #clones
            #started
            #run_body
            #private::body_returned(&mut #entry);
            // Unifies the body's result with the declared return type before the error is probed (a body whose
            // `Ok` type is an `impl Trait` leaves the error type open until then), without moving it: the `Ok`
            // arm below moves its value alone, not the whole result (an error type may be far larger).
            #[allow(unreachable_code, clippy::needless_return)]
            if false {
                return #result;
            }
            match #result {
                ::core::result::Result::Ok(#value) => ::core::result::Result::Ok(#value),
                ::core::result::Result::Err(#error) => { #escaped }
            }
        }
    } else {
        let out = local("__sentinel_out");
        let run = match &plan.shape {
            Shape::AsyncTrait { future, .. } => quote!(#private::in_entry(&mut #scope, &#entry, #future).await),
            Shape::Async => {
                let edge = fake_return_edge(output_ty);
                quote! {
                    #private::in_entry(&mut #scope, &#entry, async move {
                        #edge
                        #(#pattern_lets)*
                        #user_block
                    })
                    .await
                }
            }
            // In a closure, so that a `return` comes back here too.
            Shape::Sync => {
                let edge = fake_return_edge(output_ty);
                quote! {
                    #private::run_body(|| {
                        #edge
                        #(#pattern_lets)*
                        #user_block
                    })
                }
            }
        };
        match (&plan.shape, output_ty) {
            // A body that never returns: nothing to mark.
            (Shape::Sync, Some(Type::Never(_))) => quote!(#(#pattern_lets)* #user_block),
            _ => quote! {
                #started
                #[allow(clippy::let_unit_value)]
                let #out = #run;
                #private::body_returned(&mut #entry);
                #out
            },
        }
    };

    let attrs = &func.attrs;
    let vis = &func.vis;
    // Pattern parameters get a name in the signature and are destructured inside the body.
    let mut sig = sig.clone();
    for (input, p) in sig.inputs.iter_mut().zip(&plan.params) {
        if let (syn::FnArg::Typed(t), Some(_)) = (input, &p.pattern) {
            *t.pat = syn::Pat::Ident(syn::PatIdent {
                attrs: Vec::new(),
                by_ref: None,
                mutability: None,
                ident: p.name.clone(),
                subpat: None,
            });
        }
    }
    let new_block = match &plan.shape {
        Shape::Sync => quote! {
            {
                #registration
                #enter
                #outcome
            }
        },
        // The async fn's own future decides the call and awaits its work in the entry's context: no wrapper
        // around the whole (the code before the first await runs in the first poll, in the poller's context).
        Shape::Async => quote! {
            {
                #registration
                #enter
                #outcome
            }
        },
        Shape::AsyncTrait { prefix, .. } => quote! {
            {
                #(#prefix)*
                #registration
                ::std::boxed::Box::pin(#private::in_context(async move {
                    #enter
                    #outcome
                }))
            }
        },
    };
    quote! {
        #(#attrs)*
        #vis #sig
        #new_block
    }
}
