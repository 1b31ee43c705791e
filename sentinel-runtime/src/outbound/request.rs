//! What the guard's closures see of an outbound request, whatever the client: its method, host, path,
//! headers and extensions, borrowed.

use std::borrow::Cow;

use http::{Extensions, HeaderMap, Method, Request};

/// Names one outbound call's resource explicitly, overriding every other naming rule: insert it in the
/// request's extensions (for reqwest-middleware, with `RequestBuilder::with_extension`).
///
/// ```
/// use sentinel_runtime::outbound::ResourceName;
/// let mut req = http::Request::get("http://inventory.svc/items/7").body(()).unwrap();
/// req.extensions_mut().insert(ResourceName::new("inventory:get-item"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResourceName(pub Cow<'static, str>);

impl ResourceName {
    /// The resource `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        ResourceName(name.into())
    }
}

/// The head of an outbound request, borrowed from it: what the guard's closures (resource name, fallback)
/// take, for a tower client's `http::Request` and a reqwest `Request` alike.
#[derive(Clone, Copy, Debug)]
pub struct CallView<'a> {
    method: &'a Method,
    host: &'a str,
    port: Option<u16>,
    /// The port of the URL's scheme (80 for `http`, 443 for `https`), when it has a known one.
    default_port: Option<u16>,
    path: &'a str,
    query: Option<&'a str>,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> CallView<'a> {
    /// The view of `req`. The host is the URI's authority host, or else the `Host` header's.
    pub fn new<B>(req: &'a Request<B>) -> Self {
        let uri = req.uri();
        let (host, port) = match uri.authority() {
            Some(a) => host_and_port(a.as_str()),
            None => match req.headers().get(http::header::HOST).and_then(|v| v.to_str().ok()) {
                Some(h) => split_host(h),
                None => ("", None),
            },
        };
        let default_port = uri.scheme_str().and_then(scheme_port);
        CallView {
            method: req.method(),
            host,
            // As a URL gives it (and reqwest's `Url::port`): the scheme's own port is no port.
            port: port.filter(|p| Some(*p) != default_port),
            default_port,
            path: uri.path(),
            query: uri.query(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// The view of a reqwest request, with reqwest-middleware's per-request extensions (reqwest keeps its
    /// own private).
    #[cfg(feature = "reqwest")]
    pub(crate) fn reqwest(req: &'a reqwest::Request, more: &'a Extensions) -> Self {
        let url = req.url();
        CallView {
            method: req.method(),
            host: url.host_str().unwrap_or(""),
            port: url.port(),
            default_port: scheme_port(url.scheme()),
            path: url.path(),
            query: url.query(),
            headers: req.headers(),
            extensions: more,
        }
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }
    /// The host the request goes to (empty when the request names none).
    pub fn host(&self) -> &'a str {
        self.host
    }
    /// The port, when the URL gives one other than its scheme's (`http://h:80/` has none, as `http://h/`).
    pub fn port(&self) -> Option<u16> {
        self.port
    }
    /// The port the call goes to when the URL says: its own, or its scheme's (80 for `http`, 443 for `https`).
    pub(crate) fn known_port(&self) -> Option<u16> {
        self.port.or(self.default_port)
    }
    /// The path (`/` at least).
    pub fn path(&self) -> &'a str {
        if self.path.is_empty() {
            "/"
        } else {
            self.path
        }
    }
    /// The query string, without `?`.
    pub fn query(&self) -> Option<&'a str> {
        self.query
    }
    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }
    /// An extension of the request (for reqwest, reqwest-middleware's per-request extensions).
    pub fn extension<T: Send + Sync + 'static>(&self) -> Option<&'a T> {
        self.extensions.get::<T>()
    }
    /// Whether this is a gRPC call: a `POST` with `content-type: application/grpc` (with or without a
    /// `+format` suffix).
    pub fn is_grpc(&self) -> bool {
        const GRPC: &[u8] = b"application/grpc";
        *self.method == Method::POST
            && self.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| {
                let v = v.as_bytes();
                v.len() >= GRPC.len()
                    && v[..GRPC.len()].eq_ignore_ascii_case(GRPC)
                    && matches!(v.get(GRPC.len()), None | Some(b'+') | Some(b';'))
            })
    }
    /// The per-request override, when the request carries one.
    pub(crate) fn resource_name(&self) -> Option<&'a ResourceName> {
        self.extension::<ResourceName>()
    }
}

/// The host and port of a URI's authority (`[userinfo@]host[:port]`), as `Authority::host` and
/// `Authority::port_u16` give them, in one pass each way over a few bytes (their string searches cost more
/// than the rest of naming a call): the host follows the last `@`, and ends at its first `:` unless it is an
/// IPv6 literal (`[...]`, kept with its brackets); the port is what follows the authority's last `:`, when
/// it is a number.
fn host_and_port(authority: &str) -> (&str, Option<u16>) {
    let b = authority.as_bytes();
    let (mut at, mut colon) = (None, None);
    for (i, &c) in b.iter().enumerate().rev() {
        match c {
            b':' if colon.is_none() => colon = Some(i),
            b'@' => {
                at = Some(i);
                break;
            }
            _ => {}
        }
    }
    let start = at.map_or(0, |i| i + 1);
    let rest = &b[start..];
    let len = match (rest.first(), colon) {
        (Some(b'['), _) => rest.iter().position(|&c| c == b']').map_or(rest.len(), |i| i + 1),
        // A `:` after the last `@` (the backward pass stopped there): the host ends at the first.
        (_, Some(_)) => rest.iter().position(|&c| c == b':').unwrap_or(rest.len()),
        (_, None) => rest.len(),
    };
    // `@`, `:`, `[` and `]` are ASCII: the cuts fall on character boundaries.
    let host = &authority[start..start + len];
    let port = colon.and_then(|i| authority[i + 1..].parse::<u16>().ok());
    (host, port)
}

/// The port of a URL scheme, when it has a known one.
fn scheme_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("ws") {
        Some(80)
    } else if scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("wss") {
        Some(443)
    } else {
        None
    }
}

fn split_host(h: &str) -> (&str, Option<u16>) {
    match h.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => match port.parse() {
            Ok(p) => (host, Some(p)),
            Err(_) => (h, None),
        },
        _ => (h, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_takes_the_host_from_the_uri_or_the_host_header() {
        let req = Request::get("http://inventory.svc:8080/items/7?x=1").body(()).unwrap();
        let v = CallView::new(&req);
        assert_eq!((v.host(), v.port(), v.path(), v.query()), ("inventory.svc", Some(8080), "/items/7", Some("x=1")));
        let req = Request::get("/items/7").header("host", "stock:81").body(()).unwrap();
        let v = CallView::new(&req);
        assert_eq!((v.host(), v.port()), ("stock", Some(81)));
    }

    /// Every authority `http` accepts: the same host and port as its own accessors.
    #[test]
    fn host_and_port_agree_with_the_http_crate_on_every_authority_it_parses() {
        let mut cases: Vec<String> = [
            "inventory.svc",
            "inventory.svc:8080",
            "user:pw@inventory.svc:8080",
            "user@host",
            "a@b@c:1",
            "[::1]",
            "[::1]:443",
            "u:p@[fe80::1%25eth0]:80",
            "127.0.0.1:65535",
            "127.0.0.1:65536",
            "host:",
            "host:+80",
            "host:0080",
            "h:1:2",
            "@host",
            ":80",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every string of up to four characters over an alphabet that holds the separators.
        let alphabet = ['a', '1', ':', '@', '[', ']', '.', '%'];
        let mut frontier = vec![String::new()];
        for _ in 0..4 {
            frontier = frontier.iter().flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}"))).collect();
            cases.extend(frontier.iter().cloned());
        }
        let mut parsed = 0;
        for case in &cases {
            let Ok(a) = case.parse::<http::uri::Authority>() else { continue };
            parsed += 1;
            assert_eq!(host_and_port(a.as_str()), (a.host(), a.port_u16()), "authority `{case}`");
        }
        assert!(parsed > 500, "{parsed} of {} parsed", cases.len());
    }
}
