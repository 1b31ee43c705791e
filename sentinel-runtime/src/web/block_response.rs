//! The responses the layer gives instead of calling the service: blocked calls and timeouts.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use super::outcome::GrpcCode;
use super::request::RequestView;
use crate::BlockError;

/// The header that tells a gRPC client when to retry, in milliseconds (gRPC's retry design, A6).
pub const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// The HTTP status for a block: 429 for flow, hot-parameter, system and custom-slot blocks, 503 for an open
/// circuit breaker and an adaptive concurrency limit (the service is saturated, not the caller over a quota),
/// 403 for an authority rule.
pub fn http_status(err: &BlockError) -> StatusCode {
    match err {
        BlockError::Degrade { .. } | BlockError::Adaptive { .. } => StatusCode::SERVICE_UNAVAILABLE,
        BlockError::Authority { .. } => StatusCode::FORBIDDEN,
        _ => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// The gRPC status for a block: `RESOURCE_EXHAUSTED` for flow, hot-parameter, system, adaptive and
/// custom-slot blocks, `UNAVAILABLE` for an open circuit breaker, `PERMISSION_DENIED` for an authority rule.
pub fn grpc_code(err: &BlockError) -> GrpcCode {
    match err {
        BlockError::Degrade { .. } => GrpcCode::Unavailable,
        BlockError::Authority { .. } => GrpcCode::PermissionDenied,
        _ => GrpcCode::ResourceExhausted,
    }
}

/// A short text naming the block (no request data in it): the gRPC message.
fn reason(err: &BlockError) -> &'static str {
    match err {
        BlockError::Flow { .. } => "blocked by a Sentinel flow rule",
        BlockError::ParamFlow { .. } => "blocked by a Sentinel hot-parameter rule",
        BlockError::System { .. } => "blocked by Sentinel system protection",
        BlockError::Degrade { .. } => "blocked by an open Sentinel circuit breaker",
        BlockError::Authority { .. } => "blocked by a Sentinel authority rule",
        BlockError::Pushback { .. } => "held back by Sentinel: the downstream asked to retry later",
        BlockError::Adaptive { .. } => "blocked by a Sentinel adaptive concurrency limit",
        _ => "blocked by a Sentinel slot",
    }
}

/// The HTTP body: the status and [`reason`], one line.
fn http_body(err: &BlockError) -> &'static str {
    match err {
        BlockError::Flow { .. } => "Too Many Requests: blocked by a Sentinel flow rule\n",
        BlockError::ParamFlow { .. } => "Too Many Requests: blocked by a Sentinel hot-parameter rule\n",
        BlockError::System { .. } => "Too Many Requests: blocked by Sentinel system protection\n",
        BlockError::Degrade { .. } => "Service Unavailable: blocked by an open Sentinel circuit breaker\n",
        BlockError::Authority { .. } => "Forbidden: blocked by a Sentinel authority rule\n",
        BlockError::Pushback { .. } => {
            "Too Many Requests: held back by Sentinel, the downstream asked to retry later\n"
        }
        BlockError::Adaptive { .. } => "Service Unavailable: blocked by a Sentinel adaptive concurrency limit\n",
        _ => "Too Many Requests: blocked by a Sentinel slot\n",
    }
}

/// `Retry-After` in whole seconds, rounded up from the nanosecond (a retry time a nanosecond past a second is
/// the next second: a client retrying at the second would be blocked again), at least 1.
fn retry_after_secs(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000).max(1).min(u64::MAX as u128) as u64
}

/// `grpc-retry-pushback-ms`, rounded up.
fn pushback_ms(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000).min(u64::MAX as u128) as u64
}

/// The HTTP response for a block: [`http_status`], `Retry-After` (seconds, rounded up) when the rule knows
/// when a retry can pass ([`BlockError::retry_after`]), and a one-line plain-text body naming the block.
///
/// ```
/// use sentinel_runtime::{Sentinel, flow::FlowRule, web::block};
/// let engine = Sentinel::builder().build();
/// engine.load_flow_rules([FlowRule::new("GET:/").count(0.0)]).unwrap();
/// let err = engine.resource("GET:/").enter().unwrap_err();
/// let res = block::http_response(&err);
/// assert_eq!(res.status(), 429);
/// ```
pub fn http_response(err: &BlockError) -> Response<Bytes> {
    let mut res = Response::new(Bytes::from_static(http_body(err).as_bytes()));
    *res.status_mut() = http_status(err);
    res.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Some(d) = err.retry_after() {
        res.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
    }
    res
}

/// The gRPC response for a block: a trailers-only response (HTTP 200, the status in the headers) with
/// [`grpc_code`], a `grpc-message` naming the block, and [`GRPC_RETRY_PUSHBACK_MS`] when the rule knows when a
/// retry can pass.
pub fn grpc_response(err: &BlockError) -> Response<Bytes> {
    let mut res = grpc_status_response(grpc_code(err), reason(err));
    if let Some(d) = err.retry_after() {
        res.headers_mut().insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback_ms(d)));
    }
    res
}

/// The default response for a block: [`grpc_response`] for a gRPC call, else [`http_response`].
pub fn default_response(err: &BlockError, req: &RequestView<'_>) -> Response<Bytes> {
    if req.is_grpc() {
        grpc_response(err)
    } else {
        http_response(err)
    }
}

/// A trailers-only gRPC response with `code` and `message` (a static text: printable ASCII needs no
/// percent-encoding in `grpc-message`).
pub(crate) fn grpc_status_response(code: GrpcCode, message: &'static str) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code.as_i32()));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

/// The response for a request that ran past the layer's timeout: 504, or `DEADLINE_EXCEEDED` for gRPC.
pub(crate) fn timeout_response(grpc: bool) -> Response<Bytes> {
    if grpc {
        return grpc_status_response(GrpcCode::DeadlineExceeded, "Sentinel timeout: the call took too long");
    }
    let mut res = Response::new(Bytes::from_static(b"Gateway Timeout: the request took longer than its time limit\n"));
    *res.status_mut() = StatusCode::GATEWAY_TIMEOUT;
    res.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_http_body_starts_with_its_status_reason() {
        let engine = crate::Sentinel::builder().build();
        engine.load_flow_rules([crate::flow::FlowRule::new("r").count(0.0)]).unwrap();
        let err = engine.resource("r").enter().unwrap_err();
        assert_eq!(http_body(&err), format!("Too Many Requests: {}\n", reason(&err)));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_pushback_to_ms() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1) + Duration::from_nanos(1)), 2);
        assert_eq!(pushback_ms(Duration::from_micros(1500)), 2);
        assert_eq!(pushback_ms(Duration::from_millis(900)), 900);
    }
}
