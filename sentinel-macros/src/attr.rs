//! Stage 1: parse the attribute's arguments.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{bracketed, Expr, ExprPath, Ident, LitStr, Pat, Path, Token};

mod kw {
    syn::custom_keyword!(name);
    syn::custom_keyword!(entry_type);
    syn::custom_keyword!(block_handler);
    syn::custom_keyword!(fallback);
    syn::custom_keyword!(default_fallback);
    syn::custom_keyword!(exceptions_to_ignore);
    syn::custom_keyword!(exceptions_to_trace);
    syn::custom_keyword!(params);
    syn::custom_keyword!(origin);
    syn::custom_keyword!(context);
    syn::custom_keyword!(timeout_ms);
}

const KEYS: &str = "`name`, `entry_type`, `block_handler`, `fallback`, `default_fallback`, \
                    `exceptions_to_ignore`, `exceptions_to_trace`, `params`, `origin`, `context`, `timeout_ms`, `crate`";

/// `In` or `Out`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EntryKind {
    In,
    Out,
}

/// Which errors an `exceptions_to_*` argument selects.
pub enum ErrorMatch {
    /// `[pattern, ...]`, matched against `&error`.
    Patterns(Vec<Pat>),
    /// A predicate `fn(&E) -> bool`.
    Predicate(ExprPath),
}

/// A value with the span of the key that introduced it.
pub struct Keyed<T> {
    pub key: Span,
    pub value: T,
}

/// The parsed arguments of `#[sentinel_resource(...)]`.
#[derive(Default)]
pub struct Args {
    pub name: Option<Keyed<LitStr>>,
    pub entry_type: Option<Keyed<EntryKind>>,
    pub block_handler: Option<Keyed<ExprPath>>,
    pub fallback: Option<Keyed<ExprPath>>,
    pub default_fallback: Option<Keyed<ExprPath>>,
    pub exceptions_to_ignore: Option<Keyed<ErrorMatch>>,
    pub exceptions_to_trace: Option<Keyed<ErrorMatch>>,
    pub params: Option<Keyed<Vec<Expr>>>,
    pub origin: Option<Keyed<Expr>>,
    pub context: Option<Keyed<Expr>>,
    /// The time limit in milliseconds: an integer literal or a constant expression of type `u64`.
    pub timeout_ms: Option<Keyed<Expr>>,
    pub krate: Option<Keyed<Path>>,
}

impl Args {
    /// Whether no argument was given.
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.entry_type.is_none()
            && self.block_handler.is_none()
            && self.fallback.is_none()
            && self.default_fallback.is_none()
            && self.exceptions_to_ignore.is_none()
            && self.exceptions_to_trace.is_none()
            && self.params.is_none()
            && self.origin.is_none()
            && self.context.is_none()
            && self.timeout_ms.is_none()
            && self.krate.is_none()
    }
}

/// `timeout_ms = 200` or `timeout_ms = SOME_CONST`: a literal must be a positive integer.
fn parse_timeout(input: ParseStream<'_>) -> syn::Result<Expr> {
    let expr: Expr = input.parse()?;
    if let Expr::Lit(syn::ExprLit { lit, .. }) = &expr {
        let ok = match lit {
            syn::Lit::Int(i) => match i.base10_parse::<u64>() {
                Ok(0) => return Err(syn::Error::new(i.span(), "`timeout_ms` must be greater than 0")),
                Ok(_) => i.suffix().is_empty() || i.suffix() == "u64",
                Err(_) => false,
            },
            _ => false,
        };
        if !ok {
            return Err(syn::Error::new_spanned(
                lit,
                "`timeout_ms` takes a number of milliseconds: an integer literal such as `200`, or a `u64` constant",
            ));
        }
    }
    Ok(expr)
}

fn set<T>(slot: &mut Option<Keyed<T>>, key: Span, key_name: &str, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            key,
            format!("duplicate `{key_name}` argument: each argument of `#[sentinel_resource]` may appear once"),
        ));
    }
    *slot = Some(Keyed { key, value });
    Ok(())
}

fn parse_entry_type(input: ParseStream<'_>) -> syn::Result<EntryKind> {
    let path: Path = input.parse()?;
    let last = path.segments.last().map(|s| s.ident.to_string());
    match last.as_deref() {
        Some("In") => Ok(EntryKind::In),
        Some("Out") => Ok(EntryKind::Out),
        _ => Err(syn::Error::new_spanned(path, "`entry_type` must be `In` (inbound) or `Out` (outbound)")),
    }
}

fn parse_error_match(input: ParseStream<'_>, key_name: &str) -> syn::Result<ErrorMatch> {
    if input.peek(syn::token::Bracket) {
        let content;
        let brackets = bracketed!(content in input);
        let mut pats = Vec::new();
        while !content.is_empty() {
            let pat = Pat::parse_multi_with_leading_vert(&content).map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("malformed error pattern in `{key_name}`: {e}; expected patterns such as `[MyError::Timeout, MyError::Io(_)]`"),
                )
            })?;
            pats.push(pat);
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>().map_err(|e| {
                syn::Error::new(e.span(), format!("malformed error pattern in `{key_name}`: expected `,` or `]`"))
            })?;
        }
        if pats.is_empty() {
            return Err(syn::Error::new(brackets.span.join(), format!("`{key_name}` needs at least one pattern")));
        }
        Ok(ErrorMatch::Patterns(pats))
    } else if input.peek(Ident)
        || input.peek(Token![::])
        || input.peek(Token![<])
        || input.peek(Token![Self])
        || input.peek(Token![crate])
        || input.peek(Token![super])
        || input.peek(Token![self])
    {
        Ok(ErrorMatch::Predicate(input.parse()?))
    } else {
        Err(input.error(format!(
            "`{key_name}` takes a list of error patterns `[MyError::A, MyError::B(_)]` or a predicate path `fn(&E) -> bool`"
        )))
    }
}

fn parse_handler(input: ParseStream<'_>, key_name: &str) -> syn::Result<ExprPath> {
    input.parse::<ExprPath>().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{key_name}` takes the path of a function, such as `on_blocked` or `Self::on_blocked`"),
        )
    })
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let la = input.lookahead1();
            if la.peek(kw::name) {
                let k: kw::name = input.parse()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                if lit.value().is_empty() {
                    return Err(syn::Error::new(lit.span(), "the resource `name` must not be empty"));
                }
                set(&mut args.name, k.span, "name", lit)?;
            } else if la.peek(kw::entry_type) {
                let k: kw::entry_type = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.entry_type, k.span, "entry_type", parse_entry_type(input)?)?;
            } else if la.peek(kw::block_handler) {
                let k: kw::block_handler = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.block_handler, k.span, "block_handler", parse_handler(input, "block_handler")?)?;
            } else if la.peek(kw::fallback) {
                let k: kw::fallback = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.fallback, k.span, "fallback", parse_handler(input, "fallback")?)?;
            } else if la.peek(kw::default_fallback) {
                let k: kw::default_fallback = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.default_fallback, k.span, "default_fallback", parse_handler(input, "default_fallback")?)?;
            } else if la.peek(kw::exceptions_to_ignore) {
                let k: kw::exceptions_to_ignore = input.parse()?;
                input.parse::<Token![=]>()?;
                let m = parse_error_match(input, "exceptions_to_ignore")?;
                set(&mut args.exceptions_to_ignore, k.span, "exceptions_to_ignore", m)?;
            } else if la.peek(kw::exceptions_to_trace) {
                let k: kw::exceptions_to_trace = input.parse()?;
                input.parse::<Token![=]>()?;
                let m = parse_error_match(input, "exceptions_to_trace")?;
                set(&mut args.exceptions_to_trace, k.span, "exceptions_to_trace", m)?;
            } else if la.peek(kw::params) {
                let k: kw::params = input.parse()?;
                input.parse::<Token![=]>()?;
                if !input.peek(syn::token::Bracket) {
                    return Err(input.error(
                        "`params` takes a list of expressions over the arguments, such as `[user_id, item.as_str()]`",
                    ));
                }
                let content;
                bracketed!(content in input);
                let exprs: Punctuated<Expr, Token![,]> = Punctuated::parse_terminated(&content)?;
                set(&mut args.params, k.span, "params", exprs.into_iter().collect())?;
            } else if la.peek(kw::origin) {
                let k: kw::origin = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.origin, k.span, "origin", input.parse()?)?;
            } else if la.peek(kw::context) {
                let k: kw::context = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.context, k.span, "context", input.parse()?)?;
            } else if la.peek(kw::timeout_ms) {
                let k: kw::timeout_ms = input.parse()?;
                input.parse::<Token![=]>()?;
                set(&mut args.timeout_ms, k.span, "timeout_ms", parse_timeout(input)?)?;
            } else if la.peek(Token![crate]) {
                let k: Token![crate] = input.parse()?;
                input.parse::<Token![=]>()?;
                let path = if input.peek(LitStr) {
                    let lit: LitStr = input.parse()?;
                    lit.parse::<Path>()?
                } else {
                    input.parse::<Path>()?
                };
                set(&mut args.krate, k.span, "crate", path)?;
            } else if input.peek(Ident) {
                let unknown: Ident = input.parse()?;
                return Err(syn::Error::new(
                    unknown.span(),
                    format!("unknown `#[sentinel_resource]` argument `{unknown}`; expected one of {KEYS}"),
                ));
            } else {
                return Err(la.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> syn::Result<Args> {
        syn::parse_str::<Args>(s)
    }

    #[test]
    fn every_key_parses_in_any_order() {
        let a = parse(
            r#"crate = "my::rt", params = [a, b.len()], origin = who, context = "ctx",
               exceptions_to_trace = is_bad, exceptions_to_ignore = [E::A | E::B, E::C(_)],
               default_fallback = d, fallback = Self::f, block_handler = h::<T>, entry_type = In, name = "n""#,
        )
        .unwrap();
        assert_eq!(a.name.unwrap().value.value(), "n");
        assert_eq!(a.entry_type.unwrap().value, EntryKind::In);
        assert!(a.block_handler.is_some() && a.fallback.is_some() && a.default_fallback.is_some());
        assert!(matches!(a.exceptions_to_ignore.unwrap().value, ErrorMatch::Patterns(p) if p.len() == 2));
        assert!(matches!(a.exceptions_to_trace.unwrap().value, ErrorMatch::Predicate(_)));
        assert_eq!(a.params.unwrap().value.len(), 2);
        assert!(a.origin.is_some() && a.context.is_some());
    }

    #[test]
    fn empty_arguments_are_fine() {
        assert!(parse("").unwrap().name.is_none());
        assert!(parse("name = \"x\",").is_ok(), "a trailing comma is accepted");
    }

    #[test]
    fn repeated_and_unknown_keys_are_rejected_on_the_key() {
        let e = parse("fallback = a, fallback = b").err().unwrap();
        assert!(e.to_string().starts_with("duplicate `fallback` argument"), "{e}");
        let e = parse("blockHandler = a").err().unwrap();
        assert!(e.to_string().starts_with("unknown `#[sentinel_resource]` argument `blockHandler`"), "{e}");
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse("entry_type = Sideways").is_err());
        assert!(parse("name = \"\"").is_err());
        assert!(parse("exceptions_to_ignore = []").is_err());
        assert!(parse("exceptions_to_ignore = [A +]").is_err());
        assert!(parse("params = a").is_err());
        assert!(parse("block_handler = 1").is_err());
        assert!(parse("timeout_ms = 0").is_err());
        assert!(parse("timeout_ms = \"200ms\"").is_err());
        assert!(parse("timeout_ms = 1.5").is_err());
    }

    #[test]
    fn timeout_takes_a_literal_or_a_constant() {
        assert!(parse("timeout_ms = 200").unwrap().timeout_ms.is_some());
        assert!(parse("timeout_ms = 200u64").is_ok());
        assert!(parse("timeout_ms = LIMIT_MS").is_ok());
        assert!(parse("timeout_ms = config::LIMIT_MS").is_ok());
    }
}
