//! How a response ended, and which endings count as errors for statistics and circuit breakers.

use http::{HeaderMap, StatusCode};

/// A gRPC status code (the `grpc-status` of a response).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(i32)]
pub enum GrpcCode {
    /// Not an error.
    Ok = 0,
    /// The operation was cancelled.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The client specified an invalid argument.
    InvalidArgument = 3,
    /// The deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// Some requested entity was not found.
    NotFound = 5,
    /// The entity the client tried to create already exists.
    AlreadyExists = 6,
    /// The caller may not execute the operation.
    PermissionDenied = 7,
    /// A resource has been exhausted (a quota, a rate limit).
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// The operation was attempted past the valid range.
    OutOfRange = 11,
    /// The operation is not implemented.
    Unimplemented = 12,
    /// Internal error.
    Internal = 13,
    /// The service is currently unavailable.
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// The request lacks valid authentication credentials.
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code for a number (`Unknown` for numbers outside the 17 codes, as gRPC specifies).
    pub fn from_i32(n: i32) -> GrpcCode {
        use GrpcCode::*;
        const ALL: [GrpcCode; 17] = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        usize::try_from(n).ok().and_then(|i| ALL.get(i)).copied().unwrap_or(Unknown)
    }
    /// The code's number.
    pub fn as_i32(self) -> i32 {
        self as i32
    }
    /// The `grpc-status` of `headers` (or trailers), if there is one; a malformed one is `Unknown`.
    pub fn from_headers(headers: &HeaderMap) -> Option<GrpcCode> {
        let v = headers.get("grpc-status")?;
        Some(
            std::str::from_utf8(v.as_bytes())
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map_or(GrpcCode::Unknown, GrpcCode::from_i32),
        )
    }
    /// The status a gRPC call ended with, from the trailers at the end of its body (`None`: the body ended
    /// without trailers). A call that ends without a `grpc-status` broke the protocol: its client reports
    /// `UNKNOWN` (tonic 0.14's `infer_grpc_status`, as grpc-go), and so is it judged, by the web layer and the
    /// outbound guards alike.
    pub(crate) fn at_end(trailers: Option<&HeaderMap>) -> GrpcCode {
        trailers.and_then(GrpcCode::from_headers).unwrap_or(GrpcCode::Unknown)
    }
}

/// How a guarded request ended, as the error predicate sees it ([`SentinelLayer::trace_if`](super::SentinelLayer::trace_if)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// An HTTP response with this status (for gRPC calls through the web layer: a response whose HTTP status
    /// is not 200; the outbound guards judge such an answer as the gRPC status its client reports).
    Http(StatusCode),
    /// A gRPC call that ended with this status (from the response headers, or the trailers at its end).
    Grpc(GrpcCode),
}

/// The default error predicate: HTTP 5xx and every gRPC status but `OK` are errors.
///
/// ```
/// use sentinel_runtime::web::{is_error_by_default, GrpcCode, Outcome};
/// use http::StatusCode;
/// assert!(is_error_by_default(Outcome::Http(StatusCode::BAD_GATEWAY)));
/// assert!(!is_error_by_default(Outcome::Http(StatusCode::NOT_FOUND)));
/// assert!(is_error_by_default(Outcome::Grpc(GrpcCode::Internal)));
/// assert!(!is_error_by_default(Outcome::Grpc(GrpcCode::Ok)));
/// ```
pub fn is_error_by_default(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Http(s) => s.is_server_error(),
        Outcome::Grpc(c) => c != GrpcCode::Ok,
    }
}

/// Whether an answer says the service is overloaded: HTTP 429 or 503, gRPC `RESOURCE_EXHAUSTED` or
/// `UNAVAILABLE`, or that the call ran past its deadline (gRPC `DEADLINE_EXCEEDED`, a drop as for Netflix's
/// gRPC limiter and as any time limit hit). The outbound guards mark such a call with
/// [`Entry::set_overload`](crate::Entry::set_overload) (an error and a drop), and a call answered HTTP 502 or
/// 504 too (gRPC maps them to `UNAVAILABLE`); the web layer marks its own service's such answer as a drop for
/// adaptive rules, and as an error only when its predicate
/// ([`SentinelLayer::trace_if`](super::SentinelLayer::trace_if), default [`is_error_by_default`]) counts it.
///
/// ```
/// use sentinel_runtime::web::{is_overload, GrpcCode, Outcome};
/// use http::StatusCode;
/// assert!(is_overload(Outcome::Http(StatusCode::SERVICE_UNAVAILABLE)));
/// assert!(!is_overload(Outcome::Http(StatusCode::INTERNAL_SERVER_ERROR)));
/// assert!(is_overload(Outcome::Grpc(GrpcCode::ResourceExhausted)));
/// assert!(is_overload(Outcome::Grpc(GrpcCode::DeadlineExceeded)));
/// ```
pub fn is_overload(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Http(s) => s == http::StatusCode::TOO_MANY_REQUESTS || s == http::StatusCode::SERVICE_UNAVAILABLE,
        Outcome::Grpc(c) => {
            matches!(c, GrpcCode::ResourceExhausted | GrpcCode::Unavailable | GrpcCode::DeadlineExceeded)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_status_headers_parse_and_malformed_ones_are_unknown() {
        let mut h = HeaderMap::new();
        assert_eq!(GrpcCode::from_headers(&h), None);
        h.insert("grpc-status", "14".parse().unwrap());
        assert_eq!(GrpcCode::from_headers(&h), Some(GrpcCode::Unavailable));
        h.insert("grpc-status", "99".parse().unwrap());
        assert_eq!(GrpcCode::from_headers(&h), Some(GrpcCode::Unknown));
        h.insert("grpc-status", "x".parse().unwrap());
        assert_eq!(GrpcCode::from_headers(&h), Some(GrpcCode::Unknown));
        for n in 0..17 {
            assert_eq!(GrpcCode::from_i32(n).as_i32(), n);
        }
    }
}
