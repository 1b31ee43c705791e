//! Resource names for requests, and the bounded cache from a request's route to its resource handle.
//!
//! The default name is `METHOD:/route/{template}` from axum's matched route (whatever the request's content
//! type, but for a gRPC service mounted at `/{service}/{*rest}`, whose calls are named by their method), else
//! the full method path for a gRPC call to a gRPC method's path (`/pkg.Service/Method`), and
//! otherwise `METHOD:` and the path through a cleaner that folds identifiers (numbers, UUIDs, long hex or
//! opaque segments) into `{id}`. The content type is the client's to choose: it never takes a request away
//! from the route it matched, nor names one by a path that is no gRPC method's. A request's name is looked up by borrowed
//! key (no string is built per request once the route was seen).
//!
//! Nothing the client controls makes names without a bound:
//!
//! - **Methods.** Only `GET`, `POST`, `PUT`, `DELETE` and `PATCH` prefix a name of their own; `HEAD` is named
//!   `GET` (axum and most routers answer it with the `GET` handler, so a rule on `GET:/route` counts it).
//!   `OPTIONS`, `TRACE`, `CONNECT` and extension methods (any token is a valid method) share one resource per
//!   layer, [`OTHER_METHODS_RESOURCE`], unless a rule names `METHOD:/route` exactly. So a route template
//!   gives at most five names, and route templates are the application's own (bounded by its router): they
//!   are not counted.
//! - **Names from the request** (cleaned paths, gRPC paths, a custom namer's output): past
//!   [`DEFAULT_MAX_RESOURCES`] distinct names, a new name gets its own resource only when a rule names it
//!   exactly; one only regex rules match gets the resource the names matching the same patterns share past
//!   the engine's cap (which those rules check; past the bound on those,
//!   [`RESOURCE_PATTERNS_OVERFLOW`](crate::RESOURCE_PATTERNS_OVERFLOW), which every regex rule checks), and is
//!   not kept; the others share [`OVERFLOW_RESOURCE`].
//! - **The cache** from a request's route to its resource holds at most five entries per route template plus
//!   the bound on request-derived names (each about 100 bytes plus the name, besides the engine's resource).
//!   A name past a bound is never cached, so a rule loaded later for it applies to its next request, and a
//!   handle the engine gave as its overflow ([`RESOURCE_OVERFLOW`](crate::RESOURCE_OVERFLOW), past the
//!   engine's cap) is not cached either.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use http::Method;

use super::request::RequestView;
use crate::{EntryType, Resource, Sentinel};

/// How many distinct request-derived names (cleaned paths, gRPC paths, custom names) a layer gives their
/// own resources by default, besides route templates and names that rules target.
pub const DEFAULT_MAX_RESOURCES: usize = 1000;

/// The resource shared by request-derived names past the layer's bound that no rule names.
pub const OVERFLOW_RESOURCE: &str = "sentinel_web_overflow";

/// The resource shared by requests whose method is not one of `GET`, `HEAD`, `POST`, `PUT`, `DELETE`,
/// `PATCH` (with the method in names: `OPTIONS`, `TRACE`, `CONNECT`, extension methods), unless a rule
/// names `METHOD:/route` exactly. Checked by system rules and by rules on this name.
pub const OTHER_METHODS_RESOURCE: &str = "sentinel_web_other_methods";

/// A method that prefixes a resource name of its own (`HEAD` is named `GET`): compared as one byte where a
/// service's memo looks a route up.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verb {
    Get,
    Post,
    Put,
    Delete,
    Patch,
}

impl Verb {
    /// The method as it prefixes a resource name: `HEAD` as `GET`; `None` for the methods that share
    /// [`OTHER_METHODS_RESOURCE`].
    #[inline]
    fn of(m: &Method) -> Option<Verb> {
        if m == Method::GET || m == Method::HEAD {
            Some(Verb::Get)
        } else if m == Method::POST {
            Some(Verb::Post)
        } else if m == Method::PUT {
            Some(Verb::Put)
        } else if m == Method::DELETE {
            Some(Verb::Delete)
        } else if m == Method::PATCH {
            Some(Verb::Patch)
        } else {
            None
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Delete => "DELETE",
            Verb::Patch => "PATCH",
        }
    }
}

/// Names a request's resource: `None` lets the request through unguarded.
pub(crate) type NameFn = Arc<dyn for<'a, 'b> Fn(&'b RequestView<'a>) -> Option<Cow<'a, str>> + Send + Sync>;
/// Cleans a path (no route template known): `None` lets the request through unguarded.
pub(crate) type CleanFn = Arc<dyn for<'a> Fn(&'a str) -> Option<Cow<'a, str>> + Send + Sync>;

/// The default path cleaner: each segment that looks like an identifier becomes `{id}`, so
/// `/users/42/orders/9f1c...` is `/users/{id}/orders/{id}`. A segment is an identifier when it is all
/// digits, a UUID, at least 16 hexadecimal digits, or longer than 32 bytes. Borrows the path when nothing
/// changes. A hostile client can still send many distinct words; the layer's bound on names covers that.
///
/// ```
/// use sentinel_runtime::web::clean_path;
/// assert_eq!(clean_path("/users/42/orders"), Some("/users/{id}/orders".into()));
/// assert_eq!(clean_path("/files/0f8fad5b-d9cb-469f-a165-70867728950e"), Some("/files/{id}".into()));
/// assert_eq!(clean_path("/health"), Some("/health".into()));
/// ```
pub fn clean_path(path: &str) -> Option<Cow<'_, str>> {
    // The common path has no identifier and is borrowed; the name is built only from the first identifier on.
    let mut out: Option<String> = None;
    let tail = clean_segments(path, |before| {
        let o = out.get_or_insert_with(|| String::with_capacity(path.len() + 4));
        o.push_str(before);
        o.push_str(ID_SEGMENT);
    });
    Some(match out {
        None => Cow::Borrowed(path),
        Some(mut o) => {
            o.push_str(&path[tail..]);
            Cow::Owned(o)
        }
    })
}

/// The path a request means, when it is spelled otherwise: percent-escapes of unreserved characters decoded
/// and `.` / `..` segments resolved (RFC 3986, 6.2.2 and 5.2.4), as Java's servlet filter names a request by
/// its decoded path with dot segments resolved (`FilterUtil.filterTarget`). An escape of any other character
/// (`%2F`, `%25`, non-ASCII) stays as it is, so decoding makes no new segment. `None` when the path is in that
/// form already (the common case: one scan of the bytes, no allocation).
pub(crate) fn normalize_path(path: &str) -> Option<String> {
    let b = path.as_bytes();
    let escaped = b.contains(&b'%');
    if !escaped && !has_dot_segment(path) {
        return None;
    }
    let decoded: Cow<'_, str> = if escaped { Cow::Owned(decode_unreserved(path)) } else { Cow::Borrowed(path) };
    let absolute = decoded.starts_with('/');
    let parts: Vec<&str> = decoded.split('/').collect();
    let first = usize::from(absolute);
    let mut kept: Vec<&str> = Vec::with_capacity(parts.len());
    for (i, seg) in parts.iter().enumerate().skip(first) {
        let last = i + 1 == parts.len();
        match *seg {
            "." => {}
            ".." => {
                kept.pop();
            }
            other => {
                kept.push(other);
                continue;
            }
        }
        // A path ending in a dot segment names a directory: it keeps its trailing slash.
        if last {
            kept.push("");
        }
    }
    let mut out = String::with_capacity(decoded.len());
    if absolute {
        out.push('/');
    }
    for (i, seg) in kept.iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(seg);
    }
    (out != path).then_some(out)
}

/// Whether a segment of `path` is `.` or `..`.
fn has_dot_segment(path: &str) -> bool {
    (path.starts_with('.') || path.contains("/.")) && path.split('/').any(|s| s == "." || s == "..")
}

/// `path` with each percent-escape of an unreserved character (letters, digits, `-`, `.`, `_`, `~`) decoded.
fn decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c as char);
                    i += 3;
                    continue;
                }
            }
        }
        // Copies up to the next `%` (at a character boundary: `%` is ASCII).
        let next = b[i + 1..].iter().position(|&c| c == b'%').map_or(b.len(), |p| i + 1 + p);
        out.push_str(&path[i..next]);
        i = next;
    }
    out
}

/// Room on the stack for a path [`clean_path_in`] cleans (a longer one goes to the heap).
pub(crate) type CleanBuf = smallvec::SmallVec<[u8; 128]>;

/// [`clean_path`], written in `buf` when it folds an identifier (the path itself otherwise): no allocation
/// for a cleaned path of up to 128 bytes.
pub(crate) fn clean_path_in<'a>(path: &'a str, buf: &'a mut CleanBuf) -> Cow<'a, str> {
    let tail = clean_segments(path, |before| {
        buf.extend_from_slice(before.as_bytes());
        buf.extend_from_slice(ID_SEGMENT.as_bytes());
    });
    if tail == 0 {
        return Cow::Borrowed(path);
    }
    buf.extend_from_slice(&path.as_bytes()[tail..]);
    let buf: &'a CleanBuf = buf;
    // Pieces of a string cut at ASCII bytes, and ASCII: always UTF-8.
    match std::str::from_utf8(buf) {
        Ok(cleaned) => Cow::Borrowed(cleaned),
        Err(_) => Cow::Owned(String::from_utf8_lossy(buf).into_owned()),
    }
}

/// What [`clean_path`] puts in place of an identifier segment.
pub(crate) const ID_SEGMENT: &str = "{id}";

/// [`clean_path`]'s pass, segment by segment over the bytes: `id` gets the text before each identifier
/// segment (since the previous one), which the cleaned path follows with [`ID_SEGMENT`]; returns where the text after
/// the last identifier starts (0 when there is none), which ends the cleaned path.
#[inline(always)]
pub(crate) fn clean_segments<'a>(path: &'a str, mut id: impl FnMut(&'a str)) -> usize {
    let b = path.as_bytes();
    // What of `path` went to `id` already.
    let mut copied = 0;
    let mut start = 0;
    while start <= b.len() {
        let end = b[start..].iter().position(|&c| c == b'/').map_or(b.len(), |p| start + p);
        if is_identifier(&b[start..end]) {
            // `/` is ASCII: `copied`, `start` and `end` are character boundaries.
            id(&path[copied..start]);
            copied = end;
        }
        start = end + 1;
    }
    copied
}

/// The classes of a byte: [`DIGIT`] and [`HEX`] bits.
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_digit() {
            t[c] |= DIGIT;
        }
        if b.is_ascii_hexdigit() {
            t[c] |= HEX;
        }
        c += 1;
    }
    t
};
const DIGIT: u8 = 1;
const HEX: u8 = 2;

/// Whether a path segment is an identifier: all digits, 16 or more hex digits, or longer than 32 bytes (which
/// takes in a UUID's 36). One table lookup per byte.
fn is_identifier(seg: &[u8]) -> bool {
    if seg.is_empty() {
        return false;
    }
    if seg.len() > 32 {
        return true;
    }
    let all = seg.iter().fold(DIGIT | HEX, |all, &c| all & CLASS[c as usize]);
    all & DIGIT != 0 || (all & HEX != 0 && seg.len() >= 16)
}

/// A resource of the layer's own (its overflow, the other methods' bucket): a fixed name, so never counted
/// against the engine's cap.
fn fixed_resource(engine: &Sentinel, name: &str) -> Resource {
    engine.site_resource_typed(name, EntryType::In)
}

/// A cached route: the method prefix (when the name has one) and the rest of the name.
struct RouteKey {
    method: Option<Verb>,
    name: Box<str>,
}

/// The borrowed form of [`RouteKey`], hashed the same way.
struct RouteRef<'a> {
    method: Option<Verb>,
    name: &'a str,
}

fn hash_route<H: Hasher>(method: Option<Verb>, name: &str, h: &mut H) {
    h.write_u8(method.map_or(0, |m| m as u8 + 1));
    name.hash(h);
}

impl Hash for RouteKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_route(self.method, &self.name, h)
    }
}
impl Hash for RouteRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_route(self.method, self.name, h)
    }
}
impl PartialEq for RouteKey {
    fn eq(&self, o: &Self) -> bool {
        self.method == o.method && self.name == o.name
    }
}
impl Eq for RouteKey {}
impl papaya::Equivalent<RouteKey> for RouteRef<'_> {
    fn equivalent(&self, key: &RouteKey) -> bool {
        self.method == key.method && self.name == &*key.name
    }
}

impl RouteRef<'_> {
    fn resource_name(&self) -> String {
        match self.method {
            Some(m) => format!("{}:{}", m.as_str(), self.name),
            None => self.name.to_string(),
        }
    }
}

/// Where a request's name came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A route template of the application: bounded by its routes, never counted.
    Route,
    /// The request itself: counted against the bound.
    Request,
}

/// How a layer names requests, and the resources it has named.
pub(crate) struct Naming {
    pub(crate) namer: Option<NameFn>,
    /// The path cleaner; `None`: [`clean_path`], written on the stack ([`clean_path_in`]).
    pub(crate) cleaner: Option<CleanFn>,
    pub(crate) method_prefix: bool,
    pub(crate) max_resources: usize,
}

impl Clone for Naming {
    fn clone(&self) -> Self {
        Naming {
            namer: self.namer.clone(),
            cleaner: self.cleaner.clone(),
            method_prefix: self.method_prefix,
            max_resources: self.max_resources,
        }
    }
}

impl Default for Naming {
    fn default() -> Self {
        Naming { namer: None, cleaner: None, method_prefix: true, max_resources: DEFAULT_MAX_RESOURCES }
    }
}

/// Slots of a [`RouteMemo`].
const MEMO_SLOTS: usize = 4;

/// The route template a router gives every request of one route: axum's `MatchedPath`, one `Arc<str>` per
/// route, shared by its requests. A memo slot holds a clone, so the address of a request's route text
/// identifies the route.
#[cfg(feature = "axum")]
type RouteText = axum::extract::MatchedPath;
/// No router hands out route templates without feature `axum`.
#[cfg(not(feature = "axum"))]
#[derive(Clone)]
enum RouteText {}

#[inline]
fn route_text(t: &RouteText) -> &str {
    #[cfg(feature = "axum")]
    return t.as_str();
    #[cfg(not(feature = "axum"))]
    match *t {}
}

/// The router's text of `req`'s route (feature `axum`).
#[inline]
fn matched_route<'a>(req: &RequestView<'a>) -> Option<&'a RouteText> {
    #[cfg(feature = "axum")]
    return req.matched_route();
    #[cfg(not(feature = "axum"))]
    {
        let _ = req;
        None
    }
}

/// The last few routes one service saw, with their resources: with `route_layer`, axum wraps each route in a
/// service of its own, which then sees one route template (one per method). Found here by the method and the
/// address of the route's text, without hashing, the shared map or a comparison of the text (which serves
/// only a route text the router built for this request, as for a nested router). Only names the cache holds
/// are remembered (they never change); a service that sees more routes than slots uses the cache for the
/// others.
#[derive(Default)]
pub(crate) struct RouteMemo {
    slots: [OnceLock<Remembered>; MEMO_SLOTS],
}

/// A remembered route.
struct Remembered {
    method: Option<Verb>,
    /// The rest of the name.
    name: Box<str>,
    resource: Resource,
    /// The address of `_held`'s text (0 without it). While `_held` lives no other text has this address, and a
    /// `str` never changes, so a request's route text at this address with this length is `name`.
    text_at: usize,
    _held: Option<RouteText>,
}

impl RouteMemo {
    #[inline]
    fn get(&self, key: &RouteRef<'_>) -> Option<&Resource> {
        let at = key.name.as_ptr() as usize;
        for slot in &self.slots {
            let r = slot.get()?;
            if r.method == key.method && r.name.len() == key.name.len() && (r.text_at == at || *r.name == *key.name) {
                return Some(&r.resource);
            }
        }
        None
    }
    /// Remembers `key`'s resource, with the router's text of the route when `key.name` is that text.
    #[cold]
    fn remember(&self, key: &RouteRef<'_>, resource: &Resource, text: Option<&RouteText>) {
        let held = text.filter(|t| std::ptr::eq(route_text(t), key.name)).cloned();
        let text_at = held.as_ref().map_or(0, |t| route_text(t).as_ptr() as usize);
        for slot in &self.slots {
            if slot.get().is_none() {
                let remembered = Remembered {
                    method: key.method,
                    name: key.name.into(),
                    resource: resource.clone(),
                    text_at,
                    _held: held,
                };
                let _ = slot.set(remembered);
                return;
            }
        }
    }
}

/// Whether `path` is a gRPC method's path, `/Service/Method` (`/pkg.Service/Method`): a service name of
/// dot-separated identifiers and a method identifier, as protobuf names them. A gRPC call is named by this
/// path only when it has this shape: any other path is an HTTP route's (`/orders/7/cancel`), however the client
/// labels its content, and is named as HTTP requests are.
fn is_grpc_method_path(path: &str) -> bool {
    fn identifier(s: &[u8]) -> bool {
        matches!(s.first(), Some(c) if c.is_ascii_alphabetic() || *c == b'_')
            && s.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
    }
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return false;
    };
    identifier(method.as_bytes()) && service.split('.').all(|part| identifier(part.as_bytes()))
}

/// Whether `route` is the route a gRPC service is mounted at in a router (`/{service}/{*rest}`, as tonic's
/// `Routes` mount it) and `path` a method's path of that service: such a call is named by its method. Any
/// other route names its calls, whatever content type a client sends.
fn is_service_route(route: &str, path: &str) -> bool {
    let service = route.strip_prefix('/').and_then(|r| r.strip_suffix("/{*rest}"));
    is_grpc_method_path(path) && service.is_some_and(|s| path[1..].split_once('/').is_some_and(|(p, _)| p == s))
}

/// Takes one of `max` places in `counted`: `false` when all are taken.
pub(crate) fn reserve(counted: &AtomicUsize, max: usize) -> bool {
    counted.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1)).is_ok()
}

/// The resources a layer (and every service it made) has named, by route.
///
/// Keys are hashed with foldhash, seeded per process (a route key is short and the map is bounded, so the
/// cost of SipHash buys nothing here).
#[derive(Default)]
pub(crate) struct ResourceCache {
    map: papaya::HashMap<RouteKey, Resource, foldhash::fast::RandomState>,
    /// Request-derived names in `map`.
    counted: AtomicUsize,
    overflow: OnceLock<Resource>,
    other_methods: OnceLock<Resource>,
}

impl ResourceCache {
    /// The resource for `req`, or `None` when the namer or cleaner lets it through unguarded.
    #[cfg(test)]
    pub(crate) fn resolve(
        &self,
        naming: &Naming,
        engine: &Sentinel,
        req: &RequestView<'_>,
        grpc: bool,
    ) -> Option<Resource> {
        self.with_resource(naming, engine, req, grpc, None, Resource::clone)
    }

    /// Runs `f` on the resource for `req` (borrowed from the cache or the service's memo: no reference count
    /// is taken), or gives `None` when the namer or cleaner lets the request through unguarded.
    pub(crate) fn with_resource<R>(
        &self,
        naming: &Naming,
        engine: &Sentinel,
        req: &RequestView<'_>,
        grpc: bool,
        memo: Option<&RouteMemo>,
        f: impl FnOnce(&Resource) -> R,
    ) -> Option<R> {
        // `text`: the router's text of the route, when the name is that text.
        let mut normalized: Option<String> = None;
        let mut cleaned = CleanBuf::new();
        let (name, method, source, text) = match &naming.namer {
            Some(f) => (f(req)?, None, Source::Request, None),
            None => {
                let method = naming.method_prefix.then(|| req.method());
                match matched_route(req) {
                    // A gRPC service in a router (tonic's `Routes` mount each at `/{service}/{*rest}`): the
                    // method called.
                    Some(route) if grpc && is_service_route(route_text(route), req.path()) => {
                        (Cow::Borrowed(req.path()), None, Source::Request, None)
                    }
                    // The router's route, whatever the content type the client sent.
                    Some(route) => (Cow::Borrowed(route_text(route)), method, Source::Route, Some(route)),
                    None if grpc && is_grpc_method_path(req.path()) => {
                        (Cow::Borrowed(req.path()), None, Source::Request, None)
                    }
                    None => {
                        // The path the request means (escapes decoded, dot segments resolved), so that another
                        // spelling of a path does not take the request out of the path's resource.
                        let path = match normalize_path(req.path()) {
                            Some(p) => &*normalized.insert(p),
                            None => req.path(),
                        };
                        let cleaned = match &naming.cleaner {
                            None => clean_path_in(path, &mut cleaned),
                            Some(clean) => clean(path)?,
                        };
                        (cleaned, method, Source::Request, None)
                    }
                }
            }
        };
        // An empty name (a namer's or a cleaner's) leaves the request unguarded, as Java's web adapters do
        // with an empty resource name (`UrlCleaner` returning ""), rather than guarding it as `METHOD:` or ``.
        if name.is_empty() {
            return None;
        }
        let method = match method {
            None => None,
            Some(m) => match Verb::of(m) {
                Some(verb) => Some(verb),
                None => return Some(self.with_other_method(engine, m, &name, f)),
            },
        };
        let key = RouteRef { method, name: &name };
        // One call of `f` (so it is inlined once); the map is pinned only when the memo does not know the route.
        let (map, inserted);
        let resource = match memo.and_then(|m| m.get(&key)) {
            Some(r) => r,
            None => {
                map = self.map.pin();
                match map.get(&key) {
                    Some(r) => {
                        if let Some(m) = memo {
                            m.remember(&key, r, text);
                        }
                        r
                    }
                    None => {
                        inserted = self.insert(naming, engine, key, source);
                        &inserted
                    }
                }
            }
        };
        Some(f(resource))
    }

    /// A request whose method shares [`OTHER_METHODS_RESOURCE`]: its own resource only when a rule names
    /// `METHOD:name` (not cached, so a rule loaded later applies at once).
    #[cold]
    #[inline(never)]
    fn with_other_method<R>(
        &self,
        engine: &Sentinel,
        method: &Method,
        name: &str,
        f: impl FnOnce(&Resource) -> R,
    ) -> R {
        let full = format!("{method}:{name}");
        if engine.has_rules_for(&full) {
            return f(&engine.resource_typed(&full, EntryType::In));
        }
        f(self.other_methods.get_or_init(|| fixed_resource(engine, OTHER_METHODS_RESOURCE)))
    }

    #[cold]
    fn insert(&self, naming: &Naming, engine: &Sentinel, key: RouteRef<'_>, source: Source) -> Resource {
        let name = key.resource_name();
        // A request's name takes its room in the count before it is inserted (given back if it is not), so
        // that threads inserting at once never pass the bound.
        let reserved = source == Source::Request && reserve(&self.counted, naming.max_resources);
        if source == Source::Request && !reserved {
            // A name a rule names gets its own resource, one only regex rules match the resource it shares
            // with the names matching the same patterns: not cached past the bound.
            if let Some(resource) = engine.resource_beyond_bound(&name, EntryType::In) {
                return resource;
            }
            if self.overflow.get().is_none() {
                tracing::warn!(
                    max = naming.max_resources,
                    resource = %name,
                    "web layer: too many distinct request-derived resource names; names no rule targets now share `{OVERFLOW_RESOURCE}`"
                );
            }
            return self.overflow.get_or_init(|| fixed_resource(engine, OVERFLOW_RESOURCE)).clone();
        }
        let resource = engine.resource_typed(&name, EntryType::In);
        // The engine's overflow (its cap is reached) is not cached, so the name gets its own resource once a
        // rule names it.
        let inserted = resource.name() == name && {
            let owned = RouteKey { method: key.method, name: key.name.into() };
            self.map.pin().try_insert(owned, resource.clone()).is_ok()
        };
        if reserved && !inserted {
            self.counted.fetch_sub(1, Ordering::Relaxed);
        }
        resource
    }

    /// Distinct names cached (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    #[test]
    fn other_spellings_of_a_path_normalize_to_it_and_other_escapes_stay() {
        let n = |p: &str| normalize_path(p);
        assert_eq!(n("/users/12"), None);
        assert_eq!(n("/static/app.js"), None);
        assert_eq!(n("/users/%31%32").as_deref(), Some("/users/12"));
        assert_eq!(n("/%75sers/7/../12").as_deref(), Some("/users/12"));
        assert_eq!(n("/a/./b/.").as_deref(), Some("/a/b/"));
        assert_eq!(n("/a/..").as_deref(), Some("/"));
        assert_eq!(n("/../..").as_deref(), Some("/"));
        assert_eq!(n("/a/%2E%2E/b").as_deref(), Some("/b"));
        assert_eq!(n("/a%2Fb/%25/%C3%A9"), None, "escapes of reserved and non-ASCII bytes stay");
        assert_eq!(n("/a%2fb/%7e%").as_deref(), Some("/a%2fb/~%"));
    }

    #[test]
    fn identifiers_are_folded_and_words_kept() {
        fn c(p: &str) -> Option<String> {
            clean_path(p).map(|s| s.into_owned())
        }
        assert_eq!(c("/").as_deref(), Some("/"));
        assert_eq!(c("/users/123").as_deref(), Some("/users/{id}"));
        assert_eq!(c("/a/507f1f77bcf86cd799439011/b").as_deref(), Some("/a/{id}/b"));
        assert_eq!(c("/blog/my-first-post").as_deref(), Some("/blog/my-first-post"));
        assert_eq!(c(&format!("/t/{}", "x".repeat(33))).as_deref(), Some("/t/{id}"));
        assert_eq!(c("/v2/deadbeef").as_deref(), Some("/v2/deadbeef"), "short hex words stay");
        assert_eq!(c("/files/0f8fad5b-d9cb-469f-a165-70867728950e").as_deref(), Some("/files/{id}"));
        for p in ["", "/", "//", "/a/", "/a//b/"] {
            assert!(matches!(clean_path(p), Some(Cow::Borrowed(b)) if b == p), "{p:?} is borrowed as it is");
        }
    }

    /// The cleaner's rule, segment by segment, written plainly: what the one-pass cleaner must agree with.
    fn reference(path: &str) -> String {
        let id = |s: &str| {
            !s.is_empty()
                && (s.len() > 32
                    || s.bytes().all(|c| c.is_ascii_digit())
                    || (s.len() >= 16 && s.bytes().all(|c| c.is_ascii_hexdigit())))
        };
        path.split('/').map(|s| if id(s) { "{id}" } else { s }).collect::<Vec<_>>().join("/")
    }

    /// A segment longer than 32 bytes.
    const LONG: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

    proptest::proptest! {
        #[test]
        fn the_one_pass_cleaner_agrees_with_the_plain_reading(
            parts in proptest::collection::vec(
                proptest::sample::select(vec!["/", "1", "42", "a", "f", "Z", "-", "é", "deadbeefdeadbeef", LONG]),
                0..12,
            )
        ) {
            let path = parts.concat();
            let cleaned = clean_path(&path).map(Cow::into_owned);
            let want = reference(&path);
            proptest::prop_assert_eq!(cleaned.as_deref(), Some(want.as_str()), "{:?}", path);
        }
    }

    #[test]
    fn a_service_memo_answers_its_routes_and_leaves_the_rest_to_the_cache() {
        let engine = Sentinel::builder().build();
        let cache = ResourceCache::default();
        let memo = RouteMemo::default();
        let naming = Naming::default();
        let name = |path: &str| {
            let req = Request::get(path).body(()).unwrap();
            cache.with_resource(&naming, &engine, &RequestView::new(&req), false, Some(&memo), |r| r.name().to_string())
        };
        for p in ["/a", "/b", "/c", "/d", "/e", "/f", "/a", "/f"] {
            assert_eq!(name(p).as_deref(), Some(format!("GET:{p}").as_str()));
        }
        let held: Vec<_> = memo.slots.iter().filter_map(|s| s.get()).map(|r| r.name.to_string()).collect();
        // The first routes seen are remembered (a miss in the cache inserts; the next sight remembers).
        assert_eq!(held, ["/a", "/f"]);
        // The method tells routes with the same text apart.
        for (method, path) in [("POST", "/a"), ("POST", "/a"), ("GET", "/a"), ("POST", "/a")] {
            let req = Request::builder().method(method).uri(path).body(()).unwrap();
            let named = cache
                .with_resource(&naming, &engine, &RequestView::new(&req), false, Some(&memo), |r| r.name().to_string());
            assert_eq!(named.as_deref(), Some(format!("{method}:{path}").as_str()));
        }
        assert_eq!(memo.slots.iter().filter(|s| s.get().is_some()).count(), 3);
    }

    #[test]
    fn a_thousand_ids_on_one_path_share_one_cached_resource() {
        let engine = Sentinel::builder().build();
        let cache = ResourceCache::default();
        let naming = Naming::default();
        for id in 0..1000 {
            let req = Request::get(format!("/users/{id}?page={id}")).body(()).unwrap();
            let r = cache.resolve(&naming, &engine, &RequestView::new(&req), false).unwrap();
            assert_eq!(r.name(), "GET:/users/{id}");
        }
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn past_the_bound_unnamed_paths_share_the_overflow_resource_and_ruled_ones_do_not() {
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([crate::flow::FlowRule::new("GET:/late").count(5.0)]).unwrap();
        let cache = ResourceCache::default();
        let naming = Naming { max_resources: 3, ..Naming::default() };
        let name = |path: &str| {
            let req = Request::get(path).body(()).unwrap();
            cache.resolve(&naming, &engine, &RequestView::new(&req), false).unwrap().name().to_string()
        };
        for w in ["a", "b", "c"] {
            assert_eq!(name(&format!("/{w}")), format!("GET:/{w}"));
        }
        assert_eq!(name("/d"), OVERFLOW_RESOURCE);
        assert_eq!(name("/late"), "GET:/late", "a rule targets it");
        assert_eq!(name("/a"), "GET:/a", "names seen before the bound keep their resource");
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn grpc_calls_are_named_by_their_full_method_path() {
        let engine = Sentinel::builder().build();
        let cache = ResourceCache::default();
        let req = Request::post("/shop.Orders/Get").header("content-type", "application/grpc").body(()).unwrap();
        let v = RequestView::new(&req);
        assert_eq!(cache.resolve(&Naming::default(), &engine, &v, v.is_grpc()).unwrap().name(), "/shop.Orders/Get");
    }

    #[test]
    fn threads_naming_at_once_never_pass_the_bound() {
        let engine = Sentinel::builder().build();
        let cache = ResourceCache::default();
        let naming = Naming { max_resources: 10, ..Naming::default() };
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for t in 0..8 {
                let (engine, cache, naming, barrier) = (&engine, &cache, &naming, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..50 {
                        let req = Request::get(format!("/t{t}/n{i}")).body(()).unwrap();
                        let v = RequestView::new(&req);
                        cache.resolve(naming, engine, &v, false).unwrap();
                    }
                });
            }
        });
        assert_eq!(cache.len(), 10, "ten names cached, the others share the overflow");
        assert_eq!(cache.counted.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn only_a_grpc_method_path_takes_the_grpc_name_whatever_the_content_type() {
        let engine = Sentinel::builder().build();
        let cache = ResourceCache::default();
        let name = |path: &str| {
            let req = Request::post(path).header("content-type", "application/grpc+proto").body(()).unwrap();
            let v = RequestView::new(&req);
            cache.resolve(&Naming::default(), &engine, &v, v.is_grpc()).unwrap().name().to_owned()
        };
        for grpc in ["/shop.Orders/Get", "/Greeter/SayHello", "/a.b_c.D2/_m"] {
            assert_eq!(name(grpc), grpc);
        }
        for (path, http) in [
            ("/orders/7/cancel", "POST:/orders/{id}/cancel"),
            ("/orders/7", "POST:/orders/{id}"),
            ("/files/0f8fad5b-d9cb-469f-a165-70867728950e", "POST:/files/{id}"),
            ("/shop.Orders/Get/", "POST:/shop.Orders/Get/"),
            ("/shop..Orders/Get", "POST:/shop..Orders/Get"),
            ("/.Orders/Get", "POST:/.Orders/Get"),
            ("/user-profile/get", "POST:/user-profile/get"),
            ("/shop.Orders/", "POST:/shop.Orders/"),
            ("/shop.Orders", "POST:/shop.Orders"),
            ("/", "POST:/"),
        ] {
            assert_eq!(name(path), http, "{path}");
        }
    }
}
