//! The web layer's gateway mode, per request: the route's resource and each matching API's, with the
//! gateway rules' arguments taken from the request.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::sync::Arc;

use crate::param_flow::HotParam;
use crate::web::client_ip::ClientIpText;
use crate::web::scope::ApiEntries;
use crate::web::{RequestView, TrustedProxies};
use crate::{BlockError, Entry, Resource, Sentinel};

use super::loading::GatewayState;
use super::params::GatewayArguments;
use super::rule::ResourceMode;

/// What a layer in gateway mode holds: the engine's gateway state and the proxies it believes.
#[derive(Clone)]
pub(crate) struct GatewayMode {
    pub(crate) state: Arc<GatewayState>,
    pub(crate) proxies: TrustedProxies,
}

impl GatewayMode {
    pub(crate) fn new(engine: &Sentinel, proxies: TrustedProxies) -> Self {
        let state = engine.gateway();
        state.mark_in_use();
        GatewayMode { state, proxies }
    }
}

/// Arguments kept on the stack up to this many (a resource's gateway rules read one each, plus one
/// constant): more take a vector.
const INLINE_ARGS: usize = 8;

/// The request's client address as text, found once for all the request's resources (the route's and its
/// API groups' rules may each read it): the walk of `X-Forwarded-For` and the address's text, once, on the
/// stack.
pub(super) struct ClientIpOnce<'a, 'p> {
    view: RequestView<'a>,
    proxies: &'p TrustedProxies,
    text: OnceCell<Option<ClientIpText<'a>>>,
}

impl<'a, 'p> ClientIpOnce<'a, 'p> {
    fn new(view: &RequestView<'a>, proxies: &'p TrustedProxies) -> Self {
        ClientIpOnce { view: *view, proxies, text: OnceCell::new() }
    }
    /// The text, borrowed from the first reading.
    fn get(&self) -> Option<Cow<'_, str>> {
        let text = self.text.get_or_init(|| self.proxies.client_ip_text_java_in_place(&self.view));
        text.as_ref().map(|t| Cow::Borrowed(t.as_str()))
    }
}

/// Runs `f` with the arguments `args` takes from the request (none when no gateway rule names the
/// resource in that mode).
fn with_arguments<R>(
    args: Option<&GatewayArguments>,
    client: &ClientIpOnce<'_, '_>,
    f: impl FnOnce(&[&dyn HotParam]) -> R,
) -> R {
    let Some(args) = args.filter(|a| !a.is_empty()) else { return f(&[]) };
    let client_ip = || client.get();
    if args.len() <= INLINE_ARGS {
        let mut values: [Option<Cow<'_, str>>; INLINE_ARGS] = Default::default();
        args.fill(&client.view, &client_ip, &mut values[..args.len()]);
        let refs: [&dyn HotParam; INLINE_ARGS] = std::array::from_fn(|i| &values[i] as &dyn HotParam);
        return f(&refs[..args.len()]);
    }
    let values = args.extract_with(&client.view, &client_ip);
    let refs: Vec<&dyn HotParam> = values.iter().map(|v| v as &dyn HotParam).collect();
    f(&refs)
}

/// Enters `route` (the request's route resource) and then the resource of every API whose definition
/// matches the request's path, in definition order, each with the arguments its gateway rules read.
/// `enter` runs one entry's checks (origin, priority, context as the layer sets them). When one blocks,
/// the entries taken before it exit (as passed calls) and the block is returned.
pub(crate) fn enter_all(
    mode: &GatewayMode,
    engine: &Sentinel,
    route: &Resource,
    view: &RequestView<'_>,
    enter: impl Fn(&Resource, &[&dyn HotParam]) -> Result<Entry<'static>, BlockError>,
) -> Result<(Entry<'static>, ApiEntries), BlockError> {
    let now = mode.state.in_force();
    let (rules, apis) = (&now.rules, &now.apis);
    let client = ClientIpOnce::new(view, &mode.proxies);
    let args = rules.arguments(ResourceMode::RouteId, route.name());
    let first = with_arguments(args, &client, |a| enter(route, a))?;
    let mut more = ApiEntries::new();
    // The path the client sent, as Java's gateways match it (not the one a nested router left its routes).
    let path = if apis.matcher.is_empty() { "" } else { view.sent_path() };
    for (at, name) in apis.matcher.matching_at(path) {
        let args = rules.arguments(ResourceMode::CustomApiName, name);
        let entered = apis.with_resource(engine, at, name, |r| with_arguments(args, &client, |a| enter(r, a)));
        // On a block, `more` and `first` drop here: their entries exit, the later one first.
        more.push(entered?);
    }
    Ok((first, more))
}
