use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug)]
struct AppError;
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError
    }
}

struct Parser<'src> {
    src: &'src str,
}

impl<'src> Parser<'src> {
    #[sentinel_resource(fallback = Self::word_fallback)]
    fn word<'p>(&'p self, n: usize) -> Result<&'src str, AppError> {
        self.src.split(' ').nth(n).ok_or(AppError)
    }
    fn word_fallback(&self, _n: usize, _e: AppError) -> Result<&'src str, AppError> {
        Ok("")
    }
}

#[sentinel_resource(block_handler = longest_blocked)]
fn longest<'a, 'b: 'a>(a: &'a str, b: &'b str) -> &'a str {
    if a.len() >= b.len() {
        a
    } else {
        b
    }
}

fn longest_blocked<'a, 'b: 'a>(a: &'a str, _b: &'b str, _e: BlockError) -> &'a str {
    a
}

#[sentinel_resource]
fn elided(s: &str) -> Result<&str, AppError> {
    Ok(s.trim())
}

#[sentinel_resource(block_handler = static_blocked)]
fn static_str() -> &'static str {
    "static"
}

fn static_blocked(_b: BlockError) -> &'static str {
    "blocked"
}

fn main() {
    let text = String::from("a bb ccc");
    let p = Parser { src: &text };
    assert_eq!(p.word(1).unwrap(), "bb");
    assert_eq!(p.word(9).unwrap(), "");
    assert_eq!(longest("x", "yy"), "yy");
    assert_eq!(elided(" z ").unwrap(), "z");
    assert_eq!(static_str(), "static");
}
