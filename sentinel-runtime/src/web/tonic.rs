//! tonic glue (feature `tonic`): blocks and timeouts as `tonic::Status`.

use tonic::{Code, Status};

use super::block_response::{grpc_code, GRPC_RETRY_PUSHBACK_MS};
use crate::{BlockError, Timeout};

impl From<BlockError> for Status {
    /// `RESOURCE_EXHAUSTED` for flow, hot-parameter, system and custom-slot blocks, `UNAVAILABLE` for an open
    /// circuit breaker, `PERMISSION_DENIED` for an authority rule; the message is the block's description, and
    /// `grpc-retry-pushback-ms` is set when the rule knows when a retry can pass. The block is the status's
    /// `source()`, so [`BlockError::find_in`] finds it behind the status.
    fn from(err: BlockError) -> Status {
        let code = Code::from_i32(grpc_code(&err).as_i32());
        let mut status = Status::new(code, err.to_string());
        if let Some(d) = err.retry_after() {
            let ms = d.as_nanos().div_ceil(1_000_000).min(u64::MAX as u128) as u64;
            status.metadata_mut().insert(GRPC_RETRY_PUSHBACK_MS, ms.into());
        }
        status.set_source(std::sync::Arc::new(err));
        status
    }
}

impl From<Timeout> for Status {
    /// `DEADLINE_EXCEEDED`, with the timeout's description.
    fn from(t: Timeout) -> Status {
        Status::deadline_exceeded(t.to_string())
    }
}
