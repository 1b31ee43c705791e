//! What the layer's closures see of a request: its head, borrowed, whatever the body type.

use std::net::SocketAddr;

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// The head of a request (method, URI, headers, extensions), borrowed from it without moving or copying
/// anything. The layer's closures (resource name, origin, hot parameters, blocked response) take a
/// `&RequestView`, so they work the same for axum, tonic and hyper whatever their body types.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

/// The peer address of a connection, for servers whose stack does not record one (plain hyper): insert it in
/// the request's extensions and the layer's peer-address extractors find it.
///
/// axum's `ConnectInfo<SocketAddr>` (feature `axum`) and tonic's `TcpConnectInfo` (feature `tonic`) are
/// found without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

impl<'a> RequestView<'a> {
    /// The view of `req`.
    pub fn new<B>(req: &'a Request<B>) -> Self {
        RequestView {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }
    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }
    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }
    /// The path of the URI (never empty: `/` at least).
    pub fn path(&self) -> &'a str {
        self.uri.path()
    }
    /// The path as the client sent it: under a nested axum router, which takes the nesting prefix off the
    /// URI its routes see, the one axum keeps in `OriginalUri` (feature `axum`); else [`path`](Self::path).
    pub(crate) fn sent_path(&self) -> &'a str {
        #[cfg(feature = "axum")]
        if let Some(axum::extract::OriginalUri(uri)) = self.extensions.get::<axum::extract::OriginalUri>() {
            return uri.path();
        }
        self.uri.path()
    }
    /// The query string, without `?`.
    pub fn query(&self) -> Option<&'a str> {
        self.uri.query()
    }
    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }
    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }
    /// The first value of header `name`, when it is visible ASCII.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// The request extensions (where servers put the peer address, and axum the matched route).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
    /// Whether this is a gRPC call: a `POST` (the only method gRPC uses) with `content-type:
    /// application/grpc`, with or without a `+format` suffix.
    pub fn is_grpc(&self) -> bool {
        *self.method == Method::POST
            && self.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| is_grpc_content_type(v.as_bytes()))
    }
    /// The route template axum matched (`/users/{id}`), when the layer runs inside an axum router
    /// (feature `axum`).
    pub fn matched_path(&self) -> Option<&'a str> {
        #[cfg(feature = "axum")]
        if let Some(m) = self.matched_route() {
            return Some(m.as_str());
        }
        None
    }
    /// axum's `MatchedPath`: the router's text of the route (one `Arc<str>` per route, which its requests
    /// share unless the router built the text for the request, as for a nested router).
    #[cfg(feature = "axum")]
    #[inline]
    pub(crate) fn matched_route(&self) -> Option<&'a axum::extract::MatchedPath> {
        self.extensions.get::<axum::extract::MatchedPath>()
    }
    /// The address of the connection's peer: a [`PeerAddr`] extension, axum's `ConnectInfo<SocketAddr>`
    /// (feature `axum`) or tonic's `TcpConnectInfo` (feature `tonic`), in that order.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        if let Some(PeerAddr(a)) = self.extensions.get::<PeerAddr>() {
            return Some(*a);
        }
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(a)) = self.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(*a);
        }
        #[cfg(feature = "tonic")]
        if let Some(a) = self.extensions.get::<tonic::transport::server::TcpConnectInfo>().and_then(|c| c.remote_addr())
        {
            return Some(a);
        }
        None
    }
}

fn is_grpc_content_type(v: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    v.len() >= GRPC.len()
        && v[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(v.get(GRPC.len()), None | Some(b'+') | Some(b';'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_recognized_with_suffixes_and_nothing_else() {
        for yes in ["application/grpc", "application/grpc+proto", "Application/GRPC+json", "application/grpc;x=1"] {
            assert!(is_grpc_content_type(yes.as_bytes()), "{yes}");
        }
        for no in ["application/grpc-web", "application/json", "application/grp", ""] {
            assert!(!is_grpc_content_type(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn the_view_borrows_the_head_and_finds_a_peer_addr_extension() {
        let mut req = Request::builder().uri("/a/b?x=1").header("x-app", "shop").body(()).unwrap();
        let addr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        req.extensions_mut().insert(PeerAddr(addr));
        let v = RequestView::new(&req);
        assert_eq!((v.path(), v.query(), v.header("x-app")), ("/a/b", Some("x=1"), Some("shop")));
        assert_eq!(v.peer_addr(), Some(addr));
        assert!(!v.is_grpc());
    }

    #[test]
    fn only_a_post_with_a_grpc_content_type_is_a_grpc_call() {
        let call = |method: Method| Request::builder().method(method).header("content-type", "application/grpc");
        let post = call(Method::POST).body(()).unwrap();
        assert!(RequestView::new(&post).is_grpc());
        for method in [Method::GET, Method::PUT, Method::HEAD] {
            let req = call(method.clone()).body(()).unwrap();
            assert!(!RequestView::new(&req).is_grpc(), "{method}");
        }
    }
}
