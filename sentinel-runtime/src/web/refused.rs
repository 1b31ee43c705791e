//! A request its checks did not let through at once: blocked (the layer's response) or queued (a check asked
//! it to wait, and it is decided again after the wait).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use super::block_response as block;
use super::config::{LayerConfig, LayerState};
use super::rate_limit;
use super::request::RequestView;
use super::scope::RequestEntry;
use crate::entry::QueuedEntry;
use crate::param_flow::HotParam;
use crate::{BlockError, Resource};

/// The layer's response to a blocked request: the layer's `on_blocked` or the default, with the RateLimit
/// header fields when the layer writes them.
pub(crate) fn blocked_response(
    config: &LayerConfig,
    blocked: &BlockError,
    view: &RequestView<'_>,
    grpc: bool,
) -> Response<Bytes> {
    let mut response = match &config.on_blocked {
        Some(f) => f(blocked, view),
        None => block::default_response(blocked, view),
    };
    if let Some(h) = config.rate_limit.filter(|h| h.applies(grpc)) {
        h.write_blocked(response.headers_mut(), blocked);
    }
    response
}

/// A request its checks did not let through now.
pub(crate) enum Refused {
    Blocked(BlockError),
    /// A check asked it to wait (an adaptive rule's `maxWaitMs`, a cluster lease): decided again after.
    Queued(Queued),
}

/// A request waiting to be decided again: its entry's wait, and its resource and hot-parameter values (for
/// the RateLimit fields; no values when the layer writes none).
pub(crate) struct Queued {
    pub(crate) waiting: QueuedEntry<'static>,
    pub(crate) resource: Resource,
    pub(crate) args: Vec<Option<String>>,
}

/// The decision of a queued request: its entry (with the RateLimit fields when the layer writes them), or
/// its block. Dropping it gives back whatever the wait got.
pub(crate) type QueuedRequest = Pin<Box<dyn Future<Output = Result<RequestEntry, BlockError>> + Send>>;

impl Queued {
    pub(crate) fn into_admission(self, layer: Arc<LayerState>, grpc: bool) -> (QueuedRequest, Arc<LayerState>) {
        let shared = layer.clone();
        let decided = Box::pin(async move {
            let layer = shared;
            let Queued { waiting, resource, args } = self;
            let mut entry = RequestEntry::with(waiting.await?, Default::default());
            if let Some(h) = layer.config.rate_limit.filter(|h| h.applies(grpc)) {
                let mut fields = h.passed_fields();
                let args: Vec<&dyn HotParam> = args.iter().map(|a| a as &dyn HotParam).collect();
                rate_limit::passed(&resource, &args, layer.config.engine.shared.now_ms(), &mut fields);
                entry.set_headers(fields.finish());
            }
            Ok(entry)
        });
        (decided, layer)
    }
}
