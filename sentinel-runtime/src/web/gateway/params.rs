//! A gateway rule's parameter, taken from a request: the value, matched against the rule's pattern, bounded.

use std::borrow::Cow;

use http::HeaderName;
use regex::Regex;

use crate::web::{RequestView, TrustedProxies};

use super::rule::{GatewayParamItem, ParamMatchStrategy, ParseStrategy};
use super::{compile_regex, DEFAULT_PARAM, NOT_MATCHED_PARAM};

/// The most bytes of a parameter value a rule counts under: a longer value is matched against the pattern
/// whole, and counted under its first `MAX_PARAM_VALUE_LEN` bytes (cut at a character boundary), so a huge
/// header or cookie never becomes a huge key. Longer values that share those bytes share a budget (stricter,
/// never looser).
pub const MAX_PARAM_VALUE_LEN: usize = 4096;

/// The most `name=value` pairs of the query string read when looking for a URL parameter. A parameter
/// beyond them is absent (as if the client had not sent it, which it may do anyway): the work per request
/// stays bounded.
pub const MAX_QUERY_PAIRS: usize = 256;

/// The most cookies (over every `Cookie` header) read when looking for a cookie, as for [`MAX_QUERY_PAIRS`].
pub const MAX_COOKIE_PAIRS: usize = 256;

/// What a matched value that spells [`NOT_MATCHED_PARAM`] is counted under instead: a client cannot claim
/// the unmatched values' budget by sending the marker.
const ESCAPED_NOT_MATCHED: &str = "\\$NM";

/// Where a value comes from.
#[derive(Clone, Debug)]
enum Source {
    ClientIp,
    Host,
    Header(HeaderName),
    UrlParam(Box<str>),
    Cookie(Box<str>),
}

/// How values are matched against a pattern.
#[derive(Clone, Debug)]
enum ValueMatcher {
    Exact(Box<str>),
    Prefix(Box<str>),
    Contains(Box<str>),
    Regex(Regex),
}

impl ValueMatcher {
    fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatcher::Exact(p) => value == &**p,
            ValueMatcher::Prefix(p) => value.starts_with(&**p),
            ValueMatcher::Contains(p) => value.contains(&**p),
            ValueMatcher::Regex(r) => r.is_match(value),
        }
    }
}

/// One rule's parameter, compiled from its [`GatewayParamItem`].
#[derive(Clone, Debug)]
pub(crate) struct CompiledItem {
    source: Source,
    matcher: Option<ValueMatcher>,
    /// What a value that does not match counts under: [`NOT_MATCHED_PARAM`], or nothing (the value passes
    /// uncounted) under a rate-limiter rule (see [`without_unmatched`](Self::without_unmatched)).
    unmatched: Option<&'static str>,
}

impl CompiledItem {
    /// Compiles a validated item (see `rule::validate`); `Err` only for an item that was not validated.
    pub(crate) fn compile(item: &GatewayParamItem) -> Result<Self, String> {
        let name = || item.field_name.as_deref().unwrap_or("").trim();
        let source = match item.parse_strategy {
            ParseStrategy::ClientIp => Source::ClientIp,
            ParseStrategy::Host => Source::Host,
            ParseStrategy::Header => {
                Source::Header(HeaderName::from_bytes(name().as_bytes()).map_err(|e| e.to_string())?)
            }
            ParseStrategy::UrlParam => Source::UrlParam(name().into()),
            ParseStrategy::Cookie => Source::Cookie(name().into()),
        };
        let matcher = match item.effective_pattern() {
            None => None,
            Some(p) => Some(match item.match_strategy {
                ParamMatchStrategy::Exact => ValueMatcher::Exact(p.into()),
                ParamMatchStrategy::Prefix => ValueMatcher::Prefix(p.into()),
                ParamMatchStrategy::Contains => ValueMatcher::Contains(p.into()),
                ParamMatchStrategy::Regex => ValueMatcher::Regex(compile_regex(p)?),
            }),
        };
        Ok(CompiledItem { source, matcher, unmatched: Some(NOT_MATCHED_PARAM) })
    }

    /// The item of a rate-limiter rule: a value that does not match passes without being counted. Java counts
    /// such values under [`NOT_MATCHED_PARAM`], whose count (10,000,000) makes its spacing
    /// `round(1000 * interval / 10,000,000)` ms, 0 for any interval under 5,000 s: they all pass at once. Spaced
    /// to the nanosecond here, they would queue one behind another (an interval of an hour: 360 µs apart, so
    /// fewer than 2,800 a second in all, past which they are blocked).
    pub(crate) fn without_unmatched(mut self) -> Self {
        self.unmatched = None;
        self
    }

    /// The value this item counts for `req`: `None` when the request does not carry it (never limited).
    #[cfg(test)]
    pub(crate) fn value<'a>(&self, req: &RequestView<'a>, proxies: &TrustedProxies) -> Option<Cow<'a, str>> {
        self.value_with(req, &|| proxies.client_ip_text_java(req))
    }

    /// The value this item counts for `req`, with the client's address as text from `client_ip` (found once
    /// per request when several items read it).
    fn value_with<'a>(
        &self,
        req: &RequestView<'a>,
        client_ip: &dyn Fn() -> Option<Cow<'a, str>>,
    ) -> Option<Cow<'a, str>> {
        let raw = match &self.source {
            Source::ClientIp => client_ip()?,
            Source::Host => host(req)?,
            Source::Header(name) => text(req.headers().get(name)?.as_bytes()),
            Source::UrlParam(name) => url_param(req, name)?,
            Source::Cookie(name) => cookie(req, name)?,
        };
        Some(match &self.matcher {
            None => bounded(raw),
            Some(m) if m.matches(&raw) => match raw {
                v if v == NOT_MATCHED_PARAM => Cow::Borrowed(ESCAPED_NOT_MATCHED),
                v => bounded(v),
            },
            Some(_) => Cow::Borrowed(self.unmatched?),
        })
    }
}

/// Header bytes as text: borrowed when they are UTF-8, with replacement characters otherwise.
fn text(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// `v` cut to [`MAX_PARAM_VALUE_LEN`] bytes at a character boundary.
fn bounded(v: Cow<'_, str>) -> Cow<'_, str> {
    if v.len() <= MAX_PARAM_VALUE_LEN {
        return v;
    }
    let end = (0..=MAX_PARAM_VALUE_LEN).rev().find(|&i| v.is_char_boundary(i)).unwrap_or(0);
    match v {
        Cow::Borrowed(s) => Cow::Borrowed(&s[..end]),
        Cow::Owned(mut s) => {
            s.truncate(end);
            Cow::Owned(s)
        }
    }
}

/// The host the request was sent to: the URI's authority (HTTP/2, absolute URIs), else the `Host` header.
fn host<'a>(req: &RequestView<'a>) -> Option<Cow<'a, str>> {
    match req.uri().authority() {
        Some(a) => Some(Cow::Borrowed(a.as_str())),
        None => Some(text(req.headers().get(http::header::HOST)?.as_bytes())),
    }
}

/// The first value of query parameter `name`, percent-decoded (`+` is a space), within the first
/// [`MAX_QUERY_PAIRS`] pairs. As Spring reads a query (`getQueryParams().getFirst`), a first occurrence
/// without `=` (`?user`) is a parameter without a value, `None` (`?user=` is the empty value).
fn url_param<'a>(req: &RequestView<'a>, name: &str) -> Option<Cow<'a, str>> {
    let query = req.query()?;
    let pairs = query.split('&').filter(|pair| !pair.is_empty()).take(MAX_QUERY_PAIRS);
    for pair in pairs {
        // One pair, decoded as `form_urlencoded` decodes it (split at the first `=`).
        let Some((key, value)) = form_urlencoded::parse(pair.as_bytes()).next() else { continue };
        if key == name {
            return pair.contains('=').then_some(value);
        }
    }
    None
}

/// The first cookie named `name` over every `Cookie` header, its surrounding double quotes removed, within
/// the first [`MAX_COOKIE_PAIRS`] cookies.
fn cookie<'a>(req: &RequestView<'a>, name: &str) -> Option<Cow<'a, str>> {
    let pairs =
        req.headers().get_all(http::header::COOKIE).iter().flat_map(|line| line.as_bytes().split(|&b| b == b';'));
    for pair in pairs.take(MAX_COOKIE_PAIRS) {
        let Some(eq) = pair.iter().position(|&b| b == b'=') else { continue };
        if pair[..eq].trim_ascii() != name.as_bytes() {
            continue;
        }
        let v = pair[eq + 1..].trim_ascii();
        let v = v.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(v);
        return Some(text(v));
    }
    None
}

/// The arguments a resource's converted hot-parameter rules read, taken from a request
/// ([`GatewayRuleSet::arguments`](super::GatewayRuleSet::arguments)).
///
/// Position `i` holds the value the rule converted with `param_idx` `i` counts; the constant
/// [`DEFAULT_PARAM`] sits at the position of the rules without a parameter item. Positions that belong to
/// rules of the other resource mode stay `None` (not limited by this entry).
#[derive(Clone, Debug, Default)]
pub struct GatewayArguments {
    pub(crate) len: usize,
    pub(crate) items: Vec<(usize, CompiledItem)>,
    pub(crate) constant: Option<usize>,
}

impl GatewayArguments {
    /// How many arguments the resource's rules read.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no rule reads an argument.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The arguments for `req`: one per position (see the type's docs); `None` where the request does not
    /// carry the value. `proxies` decides which `X-Forwarded-For` hops are believed for the client IP.
    pub fn extract<'a>(&self, req: &RequestView<'a>, proxies: &TrustedProxies) -> Vec<Option<Cow<'a, str>>> {
        self.extract_with(req, &|| proxies.client_ip_text_java(req))
    }

    /// [`extract`](Self::extract), with the client's address as text from `client_ip`.
    pub(crate) fn extract_with<'a>(
        &self,
        req: &RequestView<'a>,
        client_ip: &dyn Fn() -> Option<Cow<'a, str>>,
    ) -> Vec<Option<Cow<'a, str>>> {
        let mut args: Vec<Option<Cow<'a, str>>> = vec![None; self.len];
        self.fill(req, client_ip, &mut args);
        args
    }

    /// [`extract`](Self::extract) into `out` (at least [`len`](Self::len) long; the positions no rule of
    /// this mode reads are left as they are).
    /// `client_ip`: the client's address as text (see [`ClientIpOnce`](super::enter::ClientIpOnce)).
    pub(crate) fn fill<'a>(
        &self,
        req: &RequestView<'a>,
        client_ip: &dyn Fn() -> Option<Cow<'a, str>>,
        out: &mut [Option<Cow<'a, str>>],
    ) {
        for (idx, item) in &self.items {
            if let Some(slot) = out.get_mut(*idx) {
                *slot = item.value_with(req, client_ip);
            }
        }
        if let Some(slot) = self.constant.and_then(|idx| out.get_mut(idx)) {
            *slot = Some(Cow::Borrowed(DEFAULT_PARAM));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::PeerAddr;
    use http::Request;

    fn value(item: GatewayParamItem, req: &Request<()>, proxies: &TrustedProxies) -> Option<String> {
        CompiledItem::compile(&item).unwrap().value(&RequestView::new(req), proxies).map(Cow::into_owned)
    }
    fn plain(item: GatewayParamItem, req: &Request<()>) -> Option<String> {
        value(item, req, &TrustedProxies::none())
    }
    fn get(uri: &str) -> http::request::Builder {
        Request::get(uri)
    }

    #[test]
    fn client_ip_is_the_peer_unless_a_trusted_proxy_forwarded_it() {
        let mut req = get("/").header("x-forwarded-for", "203.0.113.9").body(()).unwrap();
        req.extensions_mut().insert(PeerAddr("10.0.0.5:4000".parse().unwrap()));
        assert_eq!(plain(GatewayParamItem::client_ip(), &req).as_deref(), Some("10.0.0.5"), "spoofed header ignored");
        let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        assert_eq!(value(GatewayParamItem::client_ip(), &req, &proxies).as_deref(), Some("203.0.113.9"));
        let bare = get("/").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::client_ip(), &bare), None, "no peer address: not limited");
    }

    #[test]
    fn client_ip_patterns_match_by_prefix_and_others_count_as_not_matched() {
        let mut req = get("/").body(()).unwrap();
        req.extensions_mut().insert(PeerAddr("192.168.1.20:1".parse().unwrap()));
        let lan = GatewayParamItem::client_ip().pattern("192.168.", ParamMatchStrategy::Prefix);
        assert_eq!(plain(lan.clone(), &req).as_deref(), Some("192.168.1.20"));
        req.extensions_mut().insert(PeerAddr("[2001:db8::1]:1".parse().unwrap()));
        assert_eq!(plain(lan, &req).as_deref(), Some(NOT_MATCHED_PARAM));
    }

    #[test]
    fn host_comes_from_the_authority_then_the_host_header() {
        let req = get("http://api.example:8080/x").header("host", "other").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::host(), &req).as_deref(), Some("api.example:8080"));
        let req = get("/x").header("host", "shop.example").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::host(), &req).as_deref(), Some("shop.example"));
        let exact = GatewayParamItem::host().pattern("shop.example", ParamMatchStrategy::Exact);
        assert_eq!(plain(exact.clone(), &req).as_deref(), Some("shop.example"));
        let req = get("/x").header("host", "shop.example.evil").body(()).unwrap();
        assert_eq!(plain(exact, &req).as_deref(), Some(NOT_MATCHED_PARAM));
        assert_eq!(plain(GatewayParamItem::host(), &get("/x").body(()).unwrap()), None);
    }

    #[test]
    fn headers_take_the_first_value_case_insensitively_and_survive_non_ascii_bytes() {
        let req = get("/").header("X-Tenant", "acme").header("x-tenant", "other").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::header("x-TENANT"), &req).as_deref(), Some("acme"));
        let raw = http::HeaderValue::from_bytes(b"caf\xe9").unwrap();
        let req = get("/").header("x-tenant", raw).body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::header("x-tenant"), &req).as_deref(), Some("caf\u{fffd}"));
        let empty = get("/").header("x-tenant", "").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::header("x-tenant"), &empty).as_deref(), Some(""), "present, empty");
    }

    #[test]
    fn a_huge_header_is_matched_whole_and_counted_under_a_bounded_key() {
        let long = format!("{}-vip", "é".repeat(MAX_PARAM_VALUE_LEN));
        let req = get("/").header("x-user", long.as_str()).body(()).unwrap();
        let v = plain(GatewayParamItem::header("x-user"), &req).unwrap();
        assert!(v.len() <= MAX_PARAM_VALUE_LEN && v.len() >= MAX_PARAM_VALUE_LEN - 1 && long.starts_with(&v));
        let vip = GatewayParamItem::header("x-user").pattern(".*-vip", ParamMatchStrategy::Regex);
        let v = plain(vip, &req).unwrap();
        assert_ne!(v, NOT_MATCHED_PARAM, "the pattern saw the whole value");
        assert!(v.len() <= MAX_PARAM_VALUE_LEN);
    }

    #[test]
    fn url_params_are_decoded_first_wins_and_the_scan_is_bounded() {
        let req = get("/s?q=a+b&user=ann%20lee&user=bob").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::url_param("user"), &req).as_deref(), Some("ann lee"));
        assert_eq!(plain(GatewayParamItem::url_param("q"), &req).as_deref(), Some("a b"));
        assert_eq!(plain(GatewayParamItem::url_param("none"), &req), None);
        let padded = format!("/s?{}user=late", "x=1&".repeat(MAX_QUERY_PAIRS));
        assert_eq!(plain(GatewayParamItem::url_param("user"), &get(&padded).body(()).unwrap()), None);
        let bare = get("/s?x=1&user&user=ann").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::url_param("user"), &bare), None, "the first has no value");
        let empty = get("/s?user=&user=ann").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::url_param("user"), &empty).as_deref(), Some(""));
        let eq_in_value = get("/s?us%65r=a=b").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::url_param("user"), &eq_in_value).as_deref(), Some("a=b"));
        let invalid = get("/s?user=%FF%FE").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::url_param("user"), &invalid).as_deref(), Some("\u{fffd}\u{fffd}"));
    }

    #[test]
    fn cookies_are_found_by_exact_name_over_every_cookie_header_and_unquoted() {
        let req = get("/")
            .header("cookie", "xsession=1; theme=dark")
            .header("cookie", "session=\"abc\"; session=second")
            .body(())
            .unwrap();
        assert_eq!(plain(GatewayParamItem::cookie("session"), &req).as_deref(), Some("abc"));
        assert_eq!(plain(GatewayParamItem::cookie("theme"), &req).as_deref(), Some("dark"));
        assert_eq!(plain(GatewayParamItem::cookie("sess"), &req), None);
        let junk = format!("{}session=late", "a=1;".repeat(MAX_COOKIE_PAIRS));
        let req = get("/").header("cookie", junk.as_str()).body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::cookie("session"), &req), None, "the scan stops at the bound");
        let req = get("/").header("cookie", "novalue; =x; session=ok").body(()).unwrap();
        assert_eq!(plain(GatewayParamItem::cookie("session"), &req).as_deref(), Some("ok"));
    }

    #[test]
    fn each_match_strategy_decides_which_values_are_limited_one_by_one() {
        let req = |v: &str| get("/").header("x-k", v).body(()).unwrap();
        let with = |p: &str, s| GatewayParamItem::header("x-k").pattern(p, s);
        let cases = [
            (with("gold", ParamMatchStrategy::Exact), "gold", true),
            (with("gold", ParamMatchStrategy::Exact), "golden", false),
            (with("gold", ParamMatchStrategy::Prefix), "golden", true),
            (with("gold", ParamMatchStrategy::Prefix), "rosegold", false),
            (with("gold", ParamMatchStrategy::Contains), "rosegold", true),
            (with("gold", ParamMatchStrategy::Contains), "silver", false),
            (with("g[a-z]+d", ParamMatchStrategy::Regex), "gold", true),
            (with("g[a-z]+d", ParamMatchStrategy::Regex), "xgoldx", false),
        ];
        for (item, v, limited) in cases {
            let got = plain(item.clone(), &req(v));
            let want = if limited { v } else { NOT_MATCHED_PARAM };
            assert_eq!(got.as_deref(), Some(want), "{item:?} on {v}");
        }
        let empty_pattern = with("", ParamMatchStrategy::Exact);
        assert_eq!(plain(empty_pattern, &req("any")).as_deref(), Some("any"), "an empty pattern is none");
    }

    /// Java's adapters give the client IP as `InetAddress.getHostAddress()` writes it (Spring Cloud Gateway's
    /// `ServerWebExchangeItemParser`, a servlet's `getRemoteAddr()`): an IPv6 address in full, uncompressed
    /// (`0:0:0:0:0:0:0:1`, `2001:db8:0:0:0:0:0:7`). Here it is Rust's compressed `Display` (`::1`), so a
    /// pattern written for Java (or shown by its dashboard) never matches: the client counts under `$NM`,
    /// whose budget makes it unlimited.
    #[test]
    fn an_ipv6_client_ip_is_matched_as_java_writes_it() {
        let mut req = get("/").body(()).unwrap();
        req.extensions_mut().insert(PeerAddr("[2001:db8::7]:1".parse().unwrap()));
        let java = GatewayParamItem::client_ip().pattern("2001:db8:0:0:0:0:0:7", ParamMatchStrategy::Exact);
        assert_eq!(plain(java, &req).as_deref(), Some("2001:db8:0:0:0:0:0:7"));
        req.extensions_mut().insert(PeerAddr("[::1]:1".parse().unwrap()));
        let local = GatewayParamItem::client_ip().pattern("0:0:0:0:0:0:0:1", ParamMatchStrategy::Exact);
        assert_eq!(plain(local, &req).as_deref(), Some("0:0:0:0:0:0:0:1"));
    }

    /// Java's `Pattern` classes `\d`, `\w`, `\s` (and their negations) are ASCII unless UNICODE_CHARACTER_CLASS
    /// is set; the regex crate's are Unicode. A pattern copied from a Java rule then sorts values differently:
    /// `\D+` (no digit) limits each of Java's non-ASCII-digit values one by one, here they go unlimited under
    /// `$NM`; `\d+` the other way round.
    #[test]
    fn regex_classes_are_ascii_as_in_java() {
        let req = get("/").header("x-k", "\u{661}\u{662}\u{663}").body(()).unwrap();
        let non_digits = GatewayParamItem::header("x-k").pattern(r"\D+", ParamMatchStrategy::Regex);
        assert_eq!(
            plain(non_digits, &req).as_deref(),
            Some("\u{661}\u{662}\u{663}"),
            "Java: no ASCII digit, so \\D+ matches"
        );
        let digits = GatewayParamItem::header("x-k").pattern(r"\d+", ParamMatchStrategy::Regex);
        assert_eq!(plain(digits, &req).as_deref(), Some(NOT_MATCHED_PARAM), "Java: \\d is [0-9]");
    }

    #[test]
    fn a_matched_value_spelling_the_not_matched_marker_is_counted_under_another_key() {
        let req = get("/").header("x-k", NOT_MATCHED_PARAM).body(()).unwrap();
        let any = GatewayParamItem::header("x-k").pattern(".*", ParamMatchStrategy::Regex);
        assert_eq!(plain(any, &req).as_deref(), Some(ESCAPED_NOT_MATCHED));
    }
}
