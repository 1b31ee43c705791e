//! Resource names for outbound calls, and the bounded cache from a name to its resource and the
//! downstream's back-off.
//!
//! A call's name is, in order: the request's [`ResourceName`](super::ResourceName) extension, the guard's
//! naming closure, the gRPC method path (`/pkg.Service/Method`), the first route template that matches
//! (`GET:inventory.svc/items/{id}`), or `METHOD:host/path` (the host in lower case, its port left out when
//! it is the scheme's, as URLs write them) with the path cleaned by
//! [`clean_path`](crate::web::clean_path). Names are bounded as the inbound layer's are: past
//! [`max_resources`](super::OutboundGuard::max_resources) distinct names, a new name gets its own resource
//! only when a rule names it, and the others share [`OUTBOUND_OVERFLOW_RESOURCE`]. Templates that name
//! their host are the application's own and are not counted.

use std::borrow::Cow;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use super::request::CallView;
use crate::{EntryType, Resource, Sentinel};

/// The resource shared by outbound names past the guard's bound that no rule names.
pub const OUTBOUND_OVERFLOW_RESOURCE: &str = "sentinel_outbound_overflow";

/// Names a call's resource: `None` lets the call through unguarded.
pub(crate) type NameFn = Arc<dyn for<'a, 'b> Fn(&'b CallView<'a>) -> Option<Cow<'a, str>> + Send + Sync>;
/// Cleans a path: `None` lets the call through unguarded.
pub(crate) type CleanFn = Arc<dyn for<'a> Fn(&'a str) -> Option<Cow<'a, str>> + Send + Sync>;

/// A route template: `host/segments` or `/segments` (any host); `{name}` matches one non-empty segment.
#[derive(Clone, Debug)]
pub(crate) struct Template {
    text: Box<str>,
    host: Option<Box<str>>,
    segments: Box<[Segment]>,
}

#[derive(Clone, Debug)]
enum Segment {
    Literal(Box<str>),
    Param,
}

/// A route template the guard cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("route template `{template}` is invalid: {reason}")]
pub struct InvalidTemplate {
    /// The template given.
    pub template: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Template, InvalidTemplate> {
        let bad = |reason| InvalidTemplate { template: text.to_owned(), reason };
        let slash = text.find('/').ok_or_else(|| bad("it has no path (write `host/path` or `/path`)"))?;
        let (host, path) = text.split_at(slash);
        if host.contains(['{', '}', ' ']) {
            return Err(bad("the host must be literal"));
        }
        let mut segments = Vec::new();
        for seg in path.split('/').skip(1) {
            segments.push(match seg {
                s if s.starts_with('{') && s.ends_with('}') && s.len() > 2 => Segment::Param,
                s if s.contains(['{', '}']) => return Err(bad("a parameter must be a whole segment, as `{id}`")),
                s => Segment::Literal(s.into()),
            });
        }
        Ok(Template {
            text: text.into(),
            host: (!host.is_empty()).then(|| host.to_ascii_lowercase().into()),
            segments: segments.into(),
        })
    }

    /// Whether a call to `host` (and `port`, the URL's or its scheme's) at `path` matches. A template's host
    /// without a port matches any port.
    fn matches(&self, host: &str, port: Option<u16>, path: &str) -> bool {
        if let Some(h) = &self.host {
            let same = match (h.rsplit_once(':'), port) {
                (Some((th, tp)), Some(p)) if !tp.contains(']') => {
                    th.eq_ignore_ascii_case(host) && tp.parse::<u16>().is_ok_and(|tp| tp == p)
                }
                (Some((_, tp)), _) if !tp.contains(']') => false,
                _ => h.eq_ignore_ascii_case(host),
            };
            if !same {
                return false;
            }
        }
        let mut segs = path.split('/').skip(1);
        for s in self.segments.iter() {
            match (s, segs.next()) {
                (Segment::Literal(l), Some(seg)) if **l == *seg => {}
                (Segment::Param, Some(seg)) if !seg.is_empty() => {}
                _ => return false,
            }
        }
        segs.next().is_none()
    }
}

/// How a guard names calls.
#[derive(Clone)]
pub(crate) struct Naming {
    pub(crate) namer: Option<NameFn>,
    pub(crate) templates: Vec<Template>,
    /// The path cleaner; `None`: [`clean_path`](crate::web::clean_path), applied as the name is written.
    pub(crate) cleaner: Option<CleanFn>,
    pub(crate) method_prefix: bool,
    pub(crate) max_resources: usize,
}

impl Default for Naming {
    fn default() -> Self {
        Naming {
            namer: None,
            templates: Vec::new(),
            cleaner: None,
            method_prefix: true,
            max_resources: crate::web::DEFAULT_MAX_RESOURCES,
        }
    }
}

/// Room for a call's name on the stack (a longer name goes to the heap): a name written from its parts is
/// looked up without an allocation.
pub(crate) type NameBuf = smallvec::SmallVec<[u8; 192]>;

/// The rest of a name after `METHOD:host[:port]`.
enum Rest<'a> {
    /// As it is (a route template's text, a path a custom cleaner cleaned).
    Text(&'a str),
    /// A path, cleaned by [`clean_path`](crate::web::clean_path) as it is written.
    Cleaned(&'a str),
}

impl Naming {
    /// The call's name, and whether it counts against the bound; `None`: the call is not guarded. A name
    /// joined from the call's parts is written in `buf`.
    pub(crate) fn name<'a: 'b, 'b>(
        &self,
        view: &CallView<'a>,
        grpc: bool,
        buf: &'b mut NameBuf,
    ) -> Option<(Cow<'b, [u8]>, bool)> {
        if let Some(n) = view.resource_name() {
            return Some((Cow::Borrowed(n.0.as_bytes()), true));
        }
        if let Some(f) = &self.namer {
            let bytes = |n: Cow<'a, str>| match n {
                Cow::Borrowed(n) => Cow::Borrowed(n.as_bytes()),
                Cow::Owned(n) => Cow::Owned(n.into_bytes()),
            };
            return f(view).map(|n| (bytes(n), true));
        }
        if grpc {
            return Some((Cow::Borrowed(view.path().as_bytes()), true));
        }
        let path = view.path();
        let template = self.templates.iter().find(|t| t.matches(view.host(), view.known_port(), path));
        if let Some(Template { text, host: Some(_), .. }) = template {
            return Some((Cow::Borrowed(self.join(view, false, Rest::Text(text), buf)), false));
        }
        let cleaned;
        let rest = match (template, &self.cleaner) {
            (Some(t), _) => Rest::Text(&t.text),
            (None, None) => Rest::Cleaned(path),
            (None, Some(clean)) => {
                cleaned = clean(path)?;
                Rest::Text(&cleaned)
            }
        };
        Some((Cow::Borrowed(self.join(view, true, rest, buf)), true))
    }

    /// `METHOD:` (when the names have it), the call's `host[:port]` (with `authority`), and `rest`, written
    /// in `buf` (whole strings, and ASCII cut at ASCII bytes: UTF-8, which the cache checks only when it
    /// keeps a new name).
    fn join<'b>(&self, view: &CallView<'_>, authority: bool, rest: Rest<'_>, buf: &'b mut NameBuf) -> &'b [u8] {
        buf.clear();
        if self.method_prefix {
            buf.extend_from_slice(view.method().as_str().as_bytes());
            buf.push(b':');
        }
        if authority {
            // Host names are case-insensitive: one downstream, one name (as a URL writes it).
            let host = view.host().as_bytes();
            if host.iter().any(u8::is_ascii_uppercase) {
                buf.extend(host.iter().map(u8::to_ascii_lowercase));
            } else {
                buf.extend_from_slice(host);
            }
            if let Some(p) = view.port() {
                buf.push(b':');
                buf.extend_from_slice(itoa::Buffer::new().format(p).as_bytes());
            }
        }
        match rest {
            Rest::Text(text) => buf.extend_from_slice(text.as_bytes()),
            Rest::Cleaned(path) => {
                let tail = crate::web::clean_segments(path, |before| {
                    buf.extend_from_slice(before.as_bytes());
                    buf.extend_from_slice(crate::web::ID_SEGMENT.as_bytes());
                });
                buf.extend_from_slice(&path.as_bytes()[tail..]);
            }
        }
        buf
    }
}

/// A named downstream: its resource, and until when the downstream asked callers to back off.
pub(crate) struct Target {
    pub(crate) resource: Resource,
    /// Engine-clock milliseconds; 0: no back-off.
    hold_until: AtomicU64,
    /// Whether the downstream's signals are recorded here (not on the shared overflow resource, which
    /// one downstream's signal must not hold back for all).
    listens: bool,
}

impl Target {
    fn new(resource: Resource, listens: bool) -> Arc<Target> {
        Arc::new(Target { resource, hold_until: AtomicU64::new(0), listens })
    }
    /// The back-off left now, if any (the clock is read only when a back-off was ever asked for).
    pub(crate) fn held(&self, engine: &Sentinel) -> Option<u64> {
        let until = self.hold_until.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let now_ms = engine.now_millis();
        (until > now_ms).then(|| until - now_ms)
    }
    /// Holds calls back until `until_ms` (a later back-off already recorded stays).
    pub(crate) fn hold(&self, until_ms: u64) {
        if self.listens {
            self.hold_until.fetch_max(until_ms, Ordering::Relaxed);
        }
    }
}

/// A target of a [`NameCache`], by address. A cache never lets go of a target before it is dropped itself (its
/// map only grows and its overflow targets are set once), so a call that keeps the guard's state, and with it the
/// cache, alive can keep its target without a reference count: a count on one downstream's record is a word
/// every thread calling that downstream would write twice per call.
#[derive(Clone, Copy)]
pub(crate) struct TargetRef(NonNull<Target>);

// SAFETY: a `TargetRef` only ever gives out `&Target`, and `Target` is `Sync` (asserted below): sending the
// address to another thread or sharing it is sharing a `&Target`.
unsafe impl Send for TargetRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for TargetRef {}

const _: () = {
    const fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<Target>();
};

impl TargetRef {
    fn of(target: &Arc<Target>) -> TargetRef {
        TargetRef(NonNull::from(&**target))
    }

    /// The target.
    ///
    /// # Safety
    /// The [`NameCache`] this target came from is alive while the returned reference is used.
    #[inline]
    pub(crate) unsafe fn get(&self) -> &Target {
        // SAFETY: the cache holds an `Arc` of the target until it is dropped (see the type's docs), and it is
        // alive (the caller's contract).
        unsafe { self.0.as_ref() }
    }
}

/// A name in the cache, hashed as its bytes (so that [`NameBytes`], a name written in a buffer, finds it).
struct NameKey(Box<str>);

/// The borrowed form of [`NameKey`]: the bytes of a name, hashed and compared the same way.
struct NameBytes<'a>(&'a [u8]);

impl std::hash::Hash for NameKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write(self.0.as_bytes());
    }
}
impl std::hash::Hash for NameBytes<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write(self.0);
    }
}
impl PartialEq for NameKey {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl Eq for NameKey {}
impl papaya::Equivalent<NameKey> for NameBytes<'_> {
    fn equivalent(&self, key: &NameKey) -> bool {
        self.0 == key.0.as_bytes()
    }
}

/// The names a guard has seen, bounded.
#[derive(Default)]
pub(crate) struct NameCache {
    map: papaya::HashMap<NameKey, Arc<Target>, foldhash::fast::RandomState>,
    /// Counted names in `map`.
    counted: AtomicUsize,
    /// The resources names only regex rules match share past the engine's cap, by the resource's name (as
    /// many as the rules make): apart from `map`, so that the one name of them with a target of its own
    /// (the first, which names the resource) keeps recording its back-offs, and the others record none.
    shared: papaya::HashMap<NameKey, Arc<Target>, foldhash::fast::RandomState>,
    /// The guard's overflow, [`OUTBOUND_OVERFLOW_RESOURCE`].
    overflow: OnceLock<Arc<Target>>,
    /// The engine's overflow ([`RESOURCE_OVERFLOW`](crate::RESOURCE_OVERFLOW)), the answer for a name the
    /// engine gave no resource of its own (its cap is reached): kept here, never under the name, so the
    /// name is looked up again at its next call and gets its own resource once a rule names it.
    engine_overflow: OnceLock<Arc<Target>>,
}

impl NameCache {
    /// The target named `name` (valid while this cache is: see [`TargetRef`]).
    pub(crate) fn target(&self, naming: &Naming, engine: &Sentinel, name: &[u8], counted: bool) -> TargetRef {
        if let Some(t) = self.map.pin().get(&NameBytes(name)) {
            return TargetRef::of(t);
        }
        self.insert(naming, engine, &String::from_utf8_lossy(name), counted)
    }

    #[cold]
    fn insert(&self, naming: &Naming, engine: &Sentinel, name: &str, counted: bool) -> TargetRef {
        // A name takes its room in the count before it is inserted (given back if it is not), so that threads
        // inserting at once never pass the bound.
        let reserved = counted && crate::web::reserve(&self.counted, naming.max_resources);
        let full = counted && !reserved;
        // Past the bound: a name a rule names gets its own resource (rules bound those), one only regex rules
        // match the resource it shares with the names matching the same patterns, any other the overflow.
        let beyond = if full { engine.resource_beyond_bound(name, EntryType::Out) } else { None };
        if full && beyond.is_none() {
            return TargetRef::of(self.overflow.get_or_init(|| {
                tracing::warn!(
                    max = naming.max_resources,
                    resource = %name,
                    "outbound guard: too many distinct resource names; names no rule targets now share `{OUTBOUND_OVERFLOW_RESOURCE}`"
                );
                // A fixed name of the guard's own: never counted against the engine's cap (nor answered by
                // the engine's overflow, which would leave a rule on it without effect).
                Target::new(engine.site_resource_typed(OUTBOUND_OVERFLOW_RESOURCE, EntryType::Out), false)
            }));
        }
        let resource = match beyond {
            Some(resource) => resource,
            None => engine.resource_typed(name, EntryType::Out),
        };
        if resource.name() != name && resource.name() != crate::RESOURCE_OVERFLOW {
            if reserved {
                self.counted.fetch_sub(1, Ordering::Relaxed);
            }
            // The resource the names matching the same regex patterns share: kept apart, under its own name (as
            // many as the rules make), so the name is looked up again at each call, never kept.
            let shared = Target::new(resource.clone(), false);
            return match self.shared.pin().try_insert(NameKey(resource.name().into()), shared) {
                Ok(t) => TargetRef::of(t),
                Err(e) => TargetRef::of(e.current),
            };
        }
        if resource.name() != name {
            if reserved {
                self.counted.fetch_sub(1, Ordering::Relaxed);
            }
            // The engine's overflow (its cap is reached): not cached under the name, so a rule loaded later on
            // the name applies at its next call. Shared, like the guard's overflow, so it records no back-off.
            return TargetRef::of(self.engine_overflow.get_or_init(|| Target::new(resource, false)));
        }
        // A name a rule targets gets its own resource past the bound, and is not counted: rules bound them.
        let target = Target::new(resource, true);
        let map = self.map.pin();
        match map.try_insert(NameKey(name.into()), target) {
            Ok(inserted) => TargetRef::of(inserted),
            Err(e) => {
                if reserved {
                    self.counted.fetch_sub(1, Ordering::Relaxed);
                }
                TargetRef::of(e.current)
            }
        }
    }

    /// Distinct names cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn name(naming: &Naming, req: &Request<()>) -> Option<String> {
        naming
            .name(&CallView::new(req), false, &mut NameBuf::new())
            .map(|(n, _)| String::from_utf8(n.into_owned()).unwrap())
    }

    #[test]
    fn default_names_are_method_host_and_cleaned_path() {
        let req = Request::get("http://inventory.svc/items/42?page=3").body(()).unwrap();
        assert_eq!(name(&Naming::default(), &req).as_deref(), Some("GET:inventory.svc/items/{id}"));
    }

    #[test]
    fn the_default_cleaner_written_in_place_names_calls_as_clean_path_does() {
        let explicit = Naming { cleaner: Some(Arc::new(crate::web::clean_path)), ..Naming::default() };
        // Longer than the name's room on the stack.
        let long = format!("http://h:8080{}/7/end", "/segment".repeat(30));
        let urls = [
            "http://inventory.svc/items/42",
            "http://inventory.svc:8080/items/42/stock/0f8fad5b-d9cb-469f-a165-70867728950e",
            "http://h/",
            "http://h",
            "http://h/a//b/",
            "http://h/1/2/3",
            "http://h/%E2%82%AC/12",
            "http://[::1]:81/x/99999999999999999999999999999999999999",
            long.as_str(),
        ];
        for url in urls {
            let req = Request::post(url).body(()).unwrap();
            let in_place = name(&Naming::default(), &req);
            assert_eq!(in_place, name(&explicit, &req), "{url}");
            let path = CallView::new(&req).path().to_string();
            let cleaned = crate::web::clean_path(&path).unwrap();
            assert!(in_place.as_deref().is_some_and(|n| n.starts_with("POST:") && n.ends_with(&*cleaned)), "{url}");
        }
        let req = Request::get(long.as_str()).body(()).unwrap();
        assert_eq!(name(&Naming::default(), &req).unwrap(), format!("GET:h:8080{}/{{id}}/end", "/segment".repeat(30)));
    }

    #[test]
    fn route_templates_name_matching_calls_and_leave_the_rest_to_the_cleaner() {
        let naming = Naming {
            templates: vec![
                Template::parse("inventory.svc/items/{sku}/stock").unwrap(),
                Template::parse("/users/{name}").unwrap(),
            ],
            ..Naming::default()
        };
        let get = |u: &str| name(&naming, &Request::get(u).body(()).unwrap());
        assert_eq!(
            get("http://inventory.svc/items/ab-c/stock").as_deref(),
            Some("GET:inventory.svc/items/{sku}/stock")
        );
        assert_eq!(get("http://INVENTORY.svc/items/x/stock").as_deref(), Some("GET:inventory.svc/items/{sku}/stock"));
        assert_eq!(
            get("http://inventory.svc:81/items/x/stock").as_deref(),
            Some("GET:inventory.svc/items/{sku}/stock")
        );
        assert_eq!(get("http://other/items/x/stock").as_deref(), Some("GET:other/items/x/stock"));
        assert_eq!(get("http://accounts/users/bob").as_deref(), Some("GET:accounts/users/{name}"));
        assert_eq!(get("http://accounts:81/users/bob").as_deref(), Some("GET:accounts:81/users/{name}"));
        assert_eq!(get("http://accounts/users/bob/x").as_deref(), Some("GET:accounts/users/bob/x"));
    }

    #[test]
    fn a_template_with_the_schemes_port_matches_urls_with_and_without_it() {
        let naming =
            Naming { templates: vec![Template::parse("stock.svc:80/items/{id}").unwrap()], ..Naming::default() };
        let get = |u: &str| name(&naming, &Request::get(u).body(()).unwrap());
        for url in ["http://stock.svc/items/1", "http://Stock.svc:80/items/1"] {
            assert_eq!(get(url).as_deref(), Some("GET:stock.svc:80/items/{id}"), "{url}");
        }
        assert_eq!(get("https://stock.svc/items/1").as_deref(), Some("GET:stock.svc/items/{id}"));
    }

    #[test]
    fn malformed_templates_are_rejected_with_the_reason() {
        for bad in ["no-path", "h{x}/a", "/a/b{c}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn past_the_bound_names_share_the_overflow_resource_unless_a_rule_names_them() {
        let engine = Sentinel::builder().build();
        engine.load_flow_rules([crate::flow::FlowRule::new("late").count(5.0)]).unwrap();
        let cache = NameCache::default();
        let naming = Naming { max_resources: 2, ..Naming::default() };
        let get = |n: &str| {
            let at = cache.target(&naming, &engine, n.as_bytes(), true);
            // SAFETY: `cache` outlives the test's every use of its targets.
            unsafe { at.get() }.resource.name().to_owned()
        };
        assert_eq!(get("a"), "a");
        assert_eq!(get("b"), "b");
        assert_eq!(get("c"), OUTBOUND_OVERFLOW_RESOURCE);
        assert_eq!(get("late"), "late");
        assert_eq!(get("a"), "a");
        assert_eq!(cache.len(), 3);
        // The overflow resource never records a downstream's back-off.
        let at = cache.target(&naming, &engine, b"d", true);
        // SAFETY: as above.
        let overflow = unsafe { at.get() };
        overflow.hold(u64::MAX);
        assert_eq!(overflow.held(&engine), None);
    }

    #[test]
    fn the_engines_overflow_is_not_kept_under_a_name_so_a_rule_loaded_later_applies() {
        let engine = Sentinel::builder().max_resources(1).build();
        let _first = engine.resource("first");
        let cache = NameCache::default();
        let naming = Naming::default();
        let get = |n: &str| cache.target(&naming, &engine, n.as_bytes(), true);
        // SAFETY: `cache` outlives the test's every use of its targets.
        let get = |n: &str| unsafe { &*(get(n).get() as *const Target) };
        assert_eq!(get("late").resource.name(), crate::RESOURCE_OVERFLOW);
        assert_eq!(get("other").resource.name(), crate::RESOURCE_OVERFLOW);
        assert_eq!(cache.len(), 0, "the engine's answer for a name is not kept under it");
        // The engine's overflow is shared: one downstream's back-off is not recorded on it.
        get("late").hold(u64::MAX);
        assert_eq!(get("other").held(&engine), None);
        engine.load_flow_rules([crate::flow::FlowRule::new("late").count(5.0)]).unwrap();
        assert_eq!(get("late").resource.name(), "late");
        assert_eq!(get("other").resource.name(), crate::RESOURCE_OVERFLOW);
        assert_eq!(cache.len(), 1);
    }
}

#[cfg(test)]
mod review4_tests {
    use super::*;

    #[test]
    fn a_downstreams_back_off_is_not_recorded_on_the_target_other_names_share() {
        let engine = Sentinel::builder().max_resources(1).build();
        engine.load_flow_rules([crate::flow::FlowRule::new("d.*").regex(true).count(1_000_000.0)]).unwrap();
        // The engine's cap on names only regex rules match is reached.
        let _d0 = engine.resource("d0");
        let cache = NameCache::default();
        let naming = Naming::default();
        let get = |n: &str| cache.target(&naming, &engine, n.as_bytes(), true);
        // SAFETY: `cache` outlives the test's every use of its targets.
        let get = |n: &str| unsafe { &*(get(n).get() as *const Target) };
        assert_eq!(get("d1").resource.name(), "d1", "the first past the cap: the shared resource");
        assert_eq!(get("d2").resource.name(), "d1");
        assert_eq!(get("d3").resource.name(), "d1");
        // Downstream d2 asks callers to back off: its signal must not hold back d1 and d3.
        get("d2").hold(u64::MAX);
        assert_eq!(get("d3").held(&engine), None, "d2's back-off holds d3's calls");
        assert_eq!(get("d1").held(&engine), None, "d2's back-off holds d1's calls");
    }
}
