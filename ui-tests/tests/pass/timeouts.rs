//! `timeout_ms` on async fns, async methods, `#[async_trait]` methods, with a literal or a constant.
use async_trait::async_trait;
use sentinel_runtime::{sentinel_resource, BlockError, Timeout};

#[derive(Debug)]
enum AppError {
    Blocked,
    TimedOut(Timeout),
}

impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError::Blocked
    }
}

impl From<Timeout> for AppError {
    fn from(t: Timeout) -> Self {
        AppError::TimedOut(t)
    }
}

const LIMIT_MS: u64 = 250;

#[sentinel_resource(timeout_ms = 200)]
async fn literal(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[sentinel_resource(timeout_ms = LIMIT_MS, fallback = with_fallback_fb)]
async fn with_fallback(id: u64, tag: String) -> Result<String, AppError> {
    Ok(format!("{tag}{id}"))
}

async fn with_fallback_fb(id: u64, tag: String, e: AppError) -> Result<String, AppError> {
    Ok(format!("{tag}{id} {e:?}"))
}

struct Service;

impl Service {
    const LIMIT: u64 = 10;

    #[sentinel_resource(timeout_ms = Self::LIMIT)]
    async fn get(&self, id: &str) -> Result<usize, AppError> {
        Ok(id.len())
    }
}

#[async_trait]
trait Fetch {
    async fn fetch(&self, id: u64) -> Result<u64, AppError>;
}

#[async_trait]
impl Fetch for Service {
    #[sentinel_resource(timeout_ms = 50)]
    async fn fetch(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    let f = literal(1);
    assert_send(&f);
    assert_eq!(futures::executor::block_on(f).unwrap(), 1);
    assert_eq!(futures::executor::block_on(with_fallback(2, "x".into())).unwrap(), "x2");
    assert_eq!(futures::executor::block_on(Service.get("abc")).unwrap(), 3);
    assert_eq!(futures::executor::block_on(Service.fetch(4)).unwrap(), 4);
    let _ = AppError::Blocked;
    // A time limit's error converts into the caller's error type, and keeps what it says.
    let limit = std::time::Duration::from_millis(200);
    let timed_out = AppError::from(Timeout { resource: "literal".into(), limit });
    assert!(matches!(&timed_out, AppError::TimedOut(t) if t.limit == limit), "{timed_out:?}");
}
