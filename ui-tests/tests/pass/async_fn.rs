use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug, PartialEq)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

#[sentinel_resource(block_handler = blocked)]
async fn fetch(id: u64, label: &str) -> Result<String, AppError> {
    std::future::ready(()).await;
    let n = parse(label).await?;
    Ok(format!("{id}:{n}"))
}

async fn blocked(_id: u64, _label: &str, _b: BlockError) -> Result<String, AppError> {
    Err(AppError)
}

#[sentinel_resource(fallback = parse_fallback)]
async fn parse(s: &str) -> Result<u32, AppError> {
    s.parse().map_err(|_| AppError)
}

fn parse_fallback(_s: &str, _e: AppError) -> Result<u32, AppError> {
    Ok(0)
}

#[sentinel_resource(block_handler = unit_blocked)]
async fn fire_and_forget(x: u8) {
    let _ = x;
}

fn unit_blocked(_x: u8, _b: BlockError) {}

fn main() {
    let out = futures::executor::block_on(fetch(1, "7"));
    assert_eq!(out, Ok("1:7".to_string()));
    assert_eq!(futures::executor::block_on(parse("x")), Ok(0));
    futures::executor::block_on(fire_and_forget(1));
}
