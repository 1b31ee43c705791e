//! Ready-made extractors: values taken from a request for the caller's origin and for hot parameters.
//!
//! Each returns a closure over a [`RequestView`] that gives `Some(value)` or `None` (absent: no origin, or a
//! hot-parameter value that always passes). Values are trimmed, and cut to [`MAX_VALUE_LEN`] bytes so that a
//! huge header cannot become a huge key; values borrowed from the request are not copied.

use std::borrow::Cow;

use http::HeaderName;

use super::client_ip::TrustedProxies;
use super::request::RequestView;

/// The longest value an extractor returns, in bytes (longer ones are cut at a character boundary).
pub const MAX_VALUE_LEN: usize = 256;

/// Takes the value of one request aspect: the shape of every origin and hot-parameter closure.
pub(crate) type ValueFn = std::sync::Arc<dyn for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Send + Sync>;

/// Pins a closure to the extractor shape (so its lifetimes are inferred as such).
fn value_fn<F>(f: F) -> F
where
    F: for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static,
{
    f
}

/// Trims `s`, cuts it to [`MAX_VALUE_LEN`] bytes; `None` when empty.
pub(crate) fn bounded(s: &str) -> Option<&str> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if s.len() <= MAX_VALUE_LEN {
        return Some(s);
    }
    let mut end = MAX_VALUE_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Some(&s[..end])
}

fn bounded_cow(c: Cow<'_, str>) -> Option<Cow<'_, str>> {
    match c {
        Cow::Borrowed(s) => bounded(s).map(Cow::Borrowed),
        Cow::Owned(s) => bounded(&s).map(|b| Cow::Owned(b.to_string())),
    }
}

/// The first value of the header `name` (visible ASCII only).
///
/// ```
/// use sentinel_runtime::web::{extract, RequestView};
/// use http::{HeaderName, Request};
/// let caller = extract::header(HeaderName::from_static("x-caller"));
/// let req = Request::get("/").header("x-caller", " shop-frontend ").body(()).unwrap();
/// assert_eq!(caller(&RequestView::new(&req)).as_deref(), Some("shop-frontend"));
/// ```
pub fn header(
    name: HeaderName,
) -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    value_fn(move |req| {
        let v = req.headers().get(&name)?.to_str().ok()?;
        bounded(v).map(Cow::Borrowed)
    })
}

/// The peer address of the connection, without the port (see [`RequestView::peer_addr`]).
pub fn peer_ip() -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    client_ip(TrustedProxies::none())
}

/// The client's address: the peer, or the one forwarded in `X-Forwarded-For` by a trusted proxy (see
/// [`TrustedProxies`]).
///
/// ```
/// use sentinel_runtime::web::{extract, PeerAddr, RequestView, TrustedProxies};
/// let ip = extract::client_ip(TrustedProxies::new(["10.0.0.0/8"]).unwrap());
/// let mut req = http::Request::get("/").header("x-forwarded-for", "203.0.113.7").body(()).unwrap();
/// req.extensions_mut().insert(PeerAddr("10.0.0.5:41000".parse().unwrap()));
/// assert_eq!(ip(&RequestView::new(&req)).as_deref(), Some("203.0.113.7"));
/// ```
pub fn client_ip(
    trusted: TrustedProxies,
) -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    value_fn(move |req| trusted.client_ip_text(req))
}

/// The client's network: its address (as [`client_ip`] finds it) with the host bits cleared, written as a
/// network (`2001:db8:7:1::/64`, `203.0.113.0/24`), so that a per-IP hot-parameter rule counts a whole
/// network as one client. One host commonly holds a whole IPv6 /64 (and can pick any of its 2⁶⁴
/// addresses), so a limit per IPv6 address is no limit per client: group IPv6 by `/64` (or a shorter prefix
/// for providers that hand out /56 or /48) and IPv4 by `/32` (or a shorter prefix). Prefixes longer than the
/// family's width are taken as the full width (32, 128).
///
/// ```
/// use sentinel_runtime::web::{extract, PeerAddr, RequestView, TrustedProxies};
/// let network = extract::client_network(TrustedProxies::none(), 32, 64);
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(PeerAddr("[2001:db8:7:1:aa:bb:cc:dd]:41000".parse().unwrap()));
/// assert_eq!(network(&RequestView::new(&req)).as_deref(), Some("2001:db8:7:1::/64"));
/// req.extensions_mut().insert(PeerAddr("203.0.113.7:41000".parse().unwrap()));
/// assert_eq!(network(&RequestView::new(&req)).as_deref(), Some("203.0.113.7/32"));
/// ```
pub fn client_network(
    trusted: TrustedProxies,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
) -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    let (v4, v6) = (ipv4_prefix.min(32), ipv6_prefix.min(128));
    value_fn(move |req| {
        let ip = trusted.client_ip(req)?;
        let prefix = if ip.is_ipv4() { v4 } else { v6 };
        let net = ipnet::IpNet::new(ip, prefix).ok()?.trunc();
        Some(Cow::Owned(net.to_string()))
    })
}

/// The value of the query parameter `name` (percent-decoded; the first one when repeated).
///
/// ```
/// use sentinel_runtime::web::{extract, RequestView};
/// let user = extract::query("user");
/// let req = http::Request::get("/search?q=shoes&user=ann%20lee").body(()).unwrap();
/// assert_eq!(user(&RequestView::new(&req)).as_deref(), Some("ann lee"));
/// ```
pub fn query(
    name: impl Into<String>,
) -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    let name: std::sync::Arc<str> = name.into().into();
    value_fn(move |req| {
        let q = req.query()?;
        let (_, v) = form_urlencoded::parse(q.as_bytes()).find(|(k, _)| *k == *name)?;
        bounded_cow(v)
    })
}

/// The value of the cookie `name` (from every `Cookie` header; surrounding double quotes removed).
///
/// ```
/// use sentinel_runtime::web::{extract, RequestView};
/// let session = extract::cookie("session");
/// let req = http::Request::get("/").header("cookie", "theme=dark; session=\"abc123\"").body(()).unwrap();
/// assert_eq!(session(&RequestView::new(&req)).as_deref(), Some("abc123"));
/// ```
pub fn cookie(
    name: impl Into<String>,
) -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    let name: std::sync::Arc<str> = name.into().into();
    value_fn(move |req| {
        for line in req.headers().get_all(http::header::COOKIE) {
            let Ok(line) = line.to_str() else { continue };
            for pair in line.split(';') {
                if let Some((k, v)) = pair.split_once('=')
                    && k.trim() == &*name
                {
                    let v = v.trim();
                    let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
                    return bounded(v).map(Cow::Borrowed);
                }
            }
        }
        None
    })
}

/// The host the request was sent to: the URI's authority (HTTP/2, absolute URIs), else the `Host` header.
///
/// ```
/// use sentinel_runtime::web::{extract, RequestView};
/// let host = extract::host();
/// let req = http::Request::get("/").header("host", "shop.example.com").body(()).unwrap();
/// assert_eq!(host(&RequestView::new(&req)).as_deref(), Some("shop.example.com"));
/// ```
pub fn host() -> impl for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Clone + Send + Sync + 'static {
    value_fn(|req| {
        let h = match req.uri().authority() {
            Some(a) => a.as_str(),
            None => req.header("host")?,
        };
        bounded(h).map(Cow::Borrowed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    #[test]
    fn client_network_groups_the_addresses_of_one_ipv6_prefix_and_keeps_ipv4_hosts_apart() {
        let of = |extract: &dyn for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>>, peer: &str| {
            let mut req = Request::get("/").body(()).unwrap();
            req.extensions_mut().insert(super::super::PeerAddr(peer.parse().unwrap()));
            extract(&RequestView::new(&req)).map(Cow::into_owned)
        };
        let by_64 = client_network(TrustedProxies::none(), 32, 64);
        let a = of(&by_64, "[2001:db8:7:1::1]:1");
        assert_eq!(a, of(&by_64, "[2001:db8:7:1:ffff:1:2:3]:2"), "one /64, one value");
        assert_ne!(a, of(&by_64, "[2001:db8:7:2::1]:1"));
        assert_ne!(of(&by_64, "198.51.100.1:1"), of(&by_64, "198.51.100.2:1"));
        assert_eq!(of(&by_64, "[::ffff:198.51.100.1]:1").as_deref(), Some("198.51.100.1/32"), "mapped IPv4 is IPv4");
        let wide = client_network(TrustedProxies::none(), 24, 200);
        assert_eq!(of(&wide, "198.51.100.77:1").as_deref(), Some("198.51.100.0/24"));
        assert_eq!(of(&wide, "[2001:db8::5]:1").as_deref(), Some("2001:db8::5/128"), "clamped to 128");
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary_and_blank_ones_are_absent() {
        let v = "é".repeat(200); // 400 bytes
        let cut = bounded(&v).unwrap();
        assert!(cut.len() <= MAX_VALUE_LEN && cut.len() >= MAX_VALUE_LEN - 1);
        assert!(v.starts_with(cut));
        assert_eq!(bounded("   "), None);
    }

    #[test]
    fn absent_headers_queries_and_cookies_give_none() {
        let req = Request::get("/?a=1").header("cookie", "x=1").body(()).unwrap();
        let v = RequestView::new(&req);
        assert_eq!(header(HeaderName::from_static("x-caller"))(&v), None);
        assert_eq!(query("b")(&v), None);
        assert_eq!(cookie("y")(&v), None);
        assert_eq!(peer_ip()(&v), None, "no peer address recorded");
    }

    #[test]
    fn a_cookie_name_is_matched_exactly() {
        let req = Request::get("/").header("cookie", "xsession=1").header("cookie", "session=2").body(()).unwrap();
        assert_eq!(cookie("session")(&RequestView::new(&req)).as_deref(), Some("2"));
    }
}
