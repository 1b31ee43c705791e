//! What a downstream's answer says: whether it counts as an error, and whether it asks callers to back off.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::web::{GrpcCode, Outcome};

/// The outbound guard's default error predicate: HTTP 5xx and 429, and the gRPC statuses that say the
/// downstream is failing or overloaded (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`,
/// `INTERNAL`, `UNKNOWN`, `DATA_LOSS`). A client's own mistakes (4xx but 429, `NOT_FOUND`, `INVALID_ARGUMENT`)
/// are not the downstream's failures (Java's gRPC adapter traces every status but `OK`: `trace_if` with
/// `|o| !matches!(o, Outcome::Grpc(GrpcCode::Ok))` for gRPC does the same). Transport errors and time limits
/// always count.
///
/// ```
/// use sentinel_runtime::outbound::is_downstream_error;
/// use sentinel_runtime::web::{GrpcCode, Outcome};
/// use http::StatusCode;
/// assert!(is_downstream_error(Outcome::Http(StatusCode::TOO_MANY_REQUESTS)));
/// assert!(!is_downstream_error(Outcome::Http(StatusCode::NOT_FOUND)));
/// assert!(is_downstream_error(Outcome::Grpc(GrpcCode::Unavailable)));
/// assert!(is_downstream_error(Outcome::Grpc(GrpcCode::DataLoss)));
/// assert!(!is_downstream_error(Outcome::Grpc(GrpcCode::NotFound)));
/// ```
pub fn is_downstream_error(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Http(s) => s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS,
        Outcome::Grpc(c) => matches!(
            c,
            GrpcCode::Unavailable
                | GrpcCode::DeadlineExceeded
                | GrpcCode::ResourceExhausted
                | GrpcCode::Internal
                | GrpcCode::Unknown
                | GrpcCode::DataLoss
        ),
    }
}

/// Whether a downstream's answer is a drop for adaptive rules ([`Entry::set_overload`](crate::Entry::set_overload)):
/// an overload ([`is_overload`](crate::web::is_overload): gRPC `RESOURCE_EXHAUSTED`, `UNAVAILABLE`,
/// `DEADLINE_EXCEEDED`), and an HTTP answer that gRPC maps to `UNAVAILABLE` ([`grpc_code_of_http`]: 429, 502,
/// 503, 504), as the same answer to a gRPC call is judged and as Netflix's gRPC client interceptor counts
/// `UNAVAILABLE` (`onDropped`): a 504 is a gateway's time limit run out on the downstream, a 502 the gateway's
/// failure to reach it (a transport error, which is a drop here too).
pub(crate) fn is_drop(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Http(s) => crate::web::is_overload(Outcome::Grpc(grpc_code_of_http(s))),
        other => crate::web::is_overload(other),
    }
}

/// The gRPC status a client reports for an answer with HTTP status `status` and no `grpc-status`, as gRPC's
/// HTTP-to-gRPC status mapping gives it (`doc/http-grpc-status-mapping.md` of grpc/grpc; tonic and grpc-java
/// follow it): 400 `INTERNAL`, 401 `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, 404 `UNIMPLEMENTED`, 429,
/// 502, 503 and 504 `UNAVAILABLE`, any other `UNKNOWN`.
pub(crate) fn grpc_code_of_http(status: StatusCode) -> GrpcCode {
    match status.as_u16() {
        400 => GrpcCode::Internal,
        401 => GrpcCode::Unauthenticated,
        403 => GrpcCode::PermissionDenied,
        404 => GrpcCode::Unimplemented,
        429 | 502 | 503 | 504 => GrpcCode::Unavailable,
        _ => GrpcCode::Unknown,
    }
}

/// The back-off a 429 or 503 asks for with `Retry-After` (seconds, or an HTTP-date read against the wall
/// clock `wall_now`). Malformed values and dates in the past ask for nothing.
pub(crate) fn retry_after(status: StatusCode, headers: &HeaderMap, wall_now: SystemTime) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let v = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() {
        // Past u64 (a hostile number), the cap applies anyway.
        return Some(Duration::from_secs(v.parse().unwrap_or(u64::MAX)));
    }
    httpdate::parse_http_date(v).ok()?.duration_since(wall_now).ok()
}

/// The back-off a gRPC answer asks for with `grpc-retry-pushback-ms` (in the headers of a trailers-only
/// answer, or in the trailers). A negative or malformed value (gRPC: "do not retry") asks for nothing here.
pub(crate) fn grpc_pushback(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(crate::web::block::GRPC_RETRY_PUSHBACK_MS)?.to_str().ok()?.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_millis(v.parse().unwrap_or(u64::MAX)))
}

/// The wall clock, for HTTP-dates.
pub(crate) fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(ms: u64) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn headers(name: &'static str, v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, v.parse().unwrap());
        h
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates_on_429_and_503_only() {
        let now = epoch(1_445_412_480_000); // Wed, 21 Oct 2015 07:28:00 GMT
        let s =
            |status: u16, v: &str| retry_after(StatusCode::from_u16(status).unwrap(), &headers("retry-after", v), now);
        assert_eq!(s(429, "2"), Some(Duration::from_secs(2)));
        assert_eq!(s(503, " 120 "), Some(Duration::from_secs(120)));
        assert_eq!(s(500, "2"), None);
        assert_eq!(s(429, "Wed, 21 Oct 2015 07:28:30 GMT"), Some(Duration::from_secs(30)));
        assert_eq!(s(429, "Wed, 21 Oct 2015 07:27:00 GMT"), None, "a date in the past");
        assert_eq!(s(429, "-3"), None);
        assert_eq!(s(429, "soon"), None);
        assert_eq!(s(429, "99999999999999999999999"), Some(Duration::from_secs(u64::MAX)), "capped by the guard");
    }

    #[test]
    fn grpc_pushback_reads_milliseconds_and_ignores_negative_values() {
        assert_eq!(grpc_pushback(&headers("grpc-retry-pushback-ms", "250")), Some(Duration::from_millis(250)));
        assert_eq!(grpc_pushback(&headers("grpc-retry-pushback-ms", "-1")), None);
        assert_eq!(grpc_pushback(&HeaderMap::new()), None);
    }
}
