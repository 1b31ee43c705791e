use std::sync::Arc;

use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Clone, Debug, PartialEq)]
struct AppError(String);
impl From<BlockError> for AppError {
    fn from(b: BlockError) -> Self {
        AppError(b.to_string())
    }
}

#[derive(Clone)]
struct Service {
    name: String,
    hits: u32,
}

impl Service {
    #[sentinel_resource(block_handler = Self::name_blocked)]
    fn name(&self) -> &str {
        &self.name
    }
    fn name_blocked(&self, _b: BlockError) -> &str {
        "blocked"
    }

    // Returning a borrow of `&mut self`.
    #[sentinel_resource]
    fn hit(&mut self, by: u32) -> Result<&mut u32, AppError> {
        self.hits += by;
        Ok(&mut self.hits)
    }

    // `&mut self` handed to the fallback again after the body.
    #[sentinel_resource(fallback = Self::reset_fallback)]
    fn reset(&mut self, to: u32) -> Result<u32, AppError> {
        self.hits = to;
        Err(AppError("reset failed".into()))
    }
    fn reset_fallback(&mut self, to: u32, _e: AppError) -> Result<u32, AppError> {
        self.hits = to + 1;
        Ok(self.hits)
    }

    #[sentinel_resource(fallback = Self::consume_fallback)]
    fn consume(self, suffix: String) -> Result<String, AppError> {
        Ok(self.name + &suffix)
    }
    fn consume_fallback(self, suffix: String, e: AppError) -> Result<String, AppError> {
        Ok(format!("{}{suffix}{e:?}", self.name))
    }

    #[sentinel_resource(default_fallback = Self::shared_default)]
    fn shared(self: Arc<Self>) -> Result<usize, AppError> {
        Ok(Arc::strong_count(&self))
    }
    fn shared_default(e: AppError) -> Result<usize, AppError> {
        Err(e)
    }

    #[sentinel_resource(block_handler = Self::new_blocked)]
    fn new(name: &str) -> Self {
        Service { name: name.to_string(), hits: 0 }
    }
    fn new_blocked(name: &str, _b: BlockError) -> Self {
        Service { name: format!("blocked {name}"), hits: 0 }
    }
}

trait Greeter {
    fn greet(&self, who: &str) -> Result<String, AppError>;
}

impl Greeter for Service {
    #[sentinel_resource(name = "greet")]
    fn greet(&self, who: &str) -> Result<String, AppError> {
        Ok(format!("{} greets {who}", self.name))
    }
}

fn main() {
    let mut s = Service::new("svc");
    assert_eq!(s.name(), "svc");
    *s.hit(2).unwrap() += 1;
    assert_eq!(s.hits, 3);
    assert_eq!(s.reset(5), Ok(6));
    assert_eq!(s.hits, 6);
    assert_eq!(s.greet("you").unwrap(), "svc greets you");
    assert_eq!(Arc::new(s.clone()).shared(), Ok(1));
    assert_eq!(s.consume("!".into()), Ok("svc!".to_string()));
}
