//! Resource names for outbound calls, and the bounded cache from a name to its resource and the
//! downstream's back-off.
//!
//! A call's name is, in order: the request's [`ResourceName`](super::ResourceName) extension, the guard's
//! naming closure, the gRPC method path (`/pkg.Service/Method`), the first route template that matches
//! (`GET:inventory.svc/items/{id}`), or `METHOD:host/path` with the path cleaned by
//! [`clean_path`](crate::web::clean_path). Names are bounded as the inbound layer's are: past
//! [`max_resources`](super::OutboundGuard::max_resources) distinct names, a new name gets its own resource
//! only when a rule names it, and the others share [`OUTBOUND_OVERFLOW_RESOURCE`]. Templates that name
//! their host are the application's own and are not counted.

use std::borrow::Cow;
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

    /// Whether a call to `host` (and `port`) at `path` matches. A template's host without a port matches
    /// any port.
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
    pub(crate) cleaner: CleanFn,
    pub(crate) method_prefix: bool,
    pub(crate) max_resources: usize,
}

impl Default for Naming {
    fn default() -> Self {
        Naming {
            namer: None,
            templates: Vec::new(),
            cleaner: Arc::new(crate::web::clean_path),
            method_prefix: true,
            max_resources: crate::web::DEFAULT_MAX_RESOURCES,
        }
    }
}

impl Naming {
    /// The call's name, and whether it counts against the bound; `None`: the call is not guarded.
    pub(crate) fn name<'a>(&self, view: &CallView<'a>, grpc: bool) -> Option<(Cow<'a, str>, bool)> {
        if let Some(n) = view.resource_name() {
            return Some((Cow::Borrowed(&n.0), true));
        }
        if let Some(f) = &self.namer {
            return f(view).map(|n| (n, true));
        }
        if grpc {
            return Some((Cow::Borrowed(view.path()), true));
        }
        let path = view.path();
        let template = self.templates.iter().find(|t| t.matches(view.host(), view.port(), path));
        if let Some(Template { text, host: Some(_), .. }) = template {
            return Some((Cow::Owned(self.join(view, false, text)), false));
        }
        let rest = match template {
            Some(t) => Cow::Borrowed(&*t.text),
            None => (self.cleaner)(path)?,
        };
        Some((Cow::Owned(self.join(view, true, &rest)), true))
    }

    /// `METHOD:` (when the names have it), the call's `host[:port]` (with `authority`), and `rest`, in one
    /// allocation.
    fn join(&self, view: &CallView<'_>, authority: bool, rest: &str) -> String {
        let method = if self.method_prefix { view.method().as_str() } else { "" };
        let mut name = String::with_capacity(method.len() + 1 + view.host().len() + 6 + rest.len());
        if self.method_prefix {
            name.push_str(method);
            name.push(':');
        }
        if authority {
            name.push_str(view.host());
            if let Some(p) = view.port() {
                name.push(':');
                name.push_str(itoa::Buffer::new().format(p));
            }
        }
        name.push_str(rest);
        name
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

/// The names a guard has seen, bounded.
#[derive(Default)]
pub(crate) struct NameCache {
    map: papaya::HashMap<Box<str>, Arc<Target>, foldhash::fast::RandomState>,
    /// Counted names in `map`.
    counted: AtomicUsize,
    overflow: OnceLock<Arc<Target>>,
}

impl NameCache {
    /// The target named `name`.
    pub(crate) fn target(&self, naming: &Naming, engine: &Sentinel, name: &str, counted: bool) -> Arc<Target> {
        if let Some(t) = self.map.pin().get(name) {
            return t.clone();
        }
        self.insert(naming, engine, name, counted)
    }

    #[cold]
    fn insert(&self, naming: &Naming, engine: &Sentinel, name: &str, counted: bool) -> Arc<Target> {
        let full = counted && self.counted.load(Ordering::Relaxed) >= naming.max_resources;
        if full && !engine.has_rules_for(name) {
            return self
                .overflow
                .get_or_init(|| {
                    tracing::warn!(
                        max = naming.max_resources,
                        resource = %name,
                        "outbound guard: too many distinct resource names; names no rule targets now share `{OUTBOUND_OVERFLOW_RESOURCE}`"
                    );
                    Target::new(engine.resource_typed(OUTBOUND_OVERFLOW_RESOURCE, EntryType::Out), false)
                })
                .clone();
        }
        // A name a rule targets gets its own resource past the bound, and is not counted: rules bound them.
        let target = Target::new(engine.resource_typed(name, EntryType::Out), true);
        let map = self.map.pin();
        match map.try_insert(name.into(), target.clone()) {
            Ok(_) => {
                if counted && !full {
                    self.counted.fetch_add(1, Ordering::Relaxed);
                }
                target
            }
            Err(e) => e.current.clone(),
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
        naming.name(&CallView::new(req), false).map(|(n, _)| n.into_owned())
    }

    #[test]
    fn default_names_are_method_host_and_cleaned_path() {
        let req = Request::get("http://inventory.svc/items/42?page=3").body(()).unwrap();
        assert_eq!(name(&Naming::default(), &req).as_deref(), Some("GET:inventory.svc/items/{id}"));
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
        let get = |n: &str| cache.target(&naming, &engine, n, true).resource.name().to_owned();
        assert_eq!(get("a"), "a");
        assert_eq!(get("b"), "b");
        assert_eq!(get("c"), OUTBOUND_OVERFLOW_RESOURCE);
        assert_eq!(get("late"), "late");
        assert_eq!(get("a"), "a");
        assert_eq!(cache.len(), 3);
        // The overflow resource never records a downstream's back-off.
        let overflow = cache.target(&naming, &engine, "d", true);
        overflow.hold(u64::MAX);
        assert_eq!(overflow.held(&engine), None);
    }
}
