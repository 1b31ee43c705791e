use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug, PartialEq)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[async_trait::async_trait]
trait Repo {
    async fn get(&self, id: u64) -> Result<String, AppError>;
    async fn put(&mut self, id: u64, value: String) -> usize;
}

struct Mem {
    values: Vec<(u64, String)>,
}

#[async_trait::async_trait]
impl Repo for Mem {
    #[sentinel_resource(name = "repo.get", fallback = Self::get_fallback)]
    async fn get(&self, id: u64) -> Result<String, AppError> {
        self.values.iter().find(|(k, _)| *k == id).map(|(_, v)| v.clone()).ok_or(AppError)
    }

    #[sentinel_resource(name = "repo.put", block_handler = Self::put_blocked)]
    async fn put(&mut self, id: u64, value: String) -> usize {
        self.values.push((id, value));
        self.values.len()
    }
}

impl Mem {
    fn get_fallback(&self, _id: u64, _e: AppError) -> Result<String, AppError> {
        Ok("none".to_string())
    }
    fn put_blocked(&mut self, _id: u64, _value: String, _b: BlockError) -> usize {
        0
    }
}

fn main() {
    let mut m = Mem { values: Vec::new() };
    futures::executor::block_on(async {
        assert_eq!(m.put(1, "one".into()).await, 1);
        assert_eq!(m.get(1).await, Ok("one".to_string()));
        assert_eq!(m.get(2).await, Ok("none".to_string()));
    });
}
