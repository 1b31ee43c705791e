// The wrapper future is `Send` whenever the body's is, and so is the future of a method holding `&self`.
use std::sync::Arc;

use sentinel_runtime::{sentinel_resource, BlockError};

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

struct Client {
    base: Arc<String>,
}

impl Client {
    #[sentinel_resource(fallback = Self::get_fallback, params = [])]
    async fn get(&self, path: String) -> Result<String, AppError> {
        std::future::ready(()).await;
        Ok(format!("{}{path}", self.base))
    }
    async fn get_fallback(&self, path: String, _e: AppError) -> Result<String, AppError> {
        Ok(path)
    }
}

#[sentinel_resource(origin = origin.as_str())]
async fn with_origin(origin: String) -> Result<usize, AppError> {
    std::future::ready(()).await;
    Ok(origin.len())
}

fn main() {
    let c = Client { base: Arc::new("http://x/".into()) };
    let f = assert_send(c.get("a".into()));
    assert_eq!(futures::executor::block_on(f).unwrap(), "http://x/a");
    let g = assert_send(with_origin("app".into()));
    assert_eq!(futures::executor::block_on(g).unwrap(), 3);
}
