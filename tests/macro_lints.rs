//! The expansion is clean under `#![deny(warnings, clippy::all)]`: `cargo clippy --all-targets -- -D warnings`
//! checks this file with every argument of the macro in use, sync and async.
#![deny(warnings, clippy::all)]

use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug, Clone, PartialEq)]
pub enum LintError {
    Timeout,
    NotFound(u64),
}

impl From<BlockError> for LintError {
    fn from(_: BlockError) -> Self {
        LintError::Timeout
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Key(u64);

impl sentinel_runtime::param_flow::HotParam for Key {
    fn visit_values(&self, f: &mut dyn FnMut(sentinel_runtime::param_flow::ParamValue<'_>)) {
        f(sentinel_runtime::param_flow::ParamValue::Int(self.0 as i64))
    }
}

fn is_transient(e: &LintError) -> bool {
    matches!(e, LintError::Timeout)
}

#[sentinel_resource(
    name = "lints.find",
    entry_type = In,
    fallback = find_fallback,
    exceptions_to_ignore = [LintError::NotFound(_)],
    exceptions_to_trace = is_transient,
    params = [Key(id)],
    origin = "app",
    context = "lints"
)]
fn find(id: u64, label: String, mut scratch: Vec<u8>) -> Result<String, LintError> {
    scratch.push(1);
    if id == 0 {
        return Err(LintError::NotFound(id));
    }
    Ok(format!("{label}{id}{}", scratch.len()))
}

fn find_fallback(id: u64, label: String, scratch: Vec<u8>, e: LintError) -> Result<String, LintError> {
    Ok(format!("{label}{id}{}{e:?}", scratch.len()))
}

#[sentinel_resource(block_handler = unit_blocked)]
fn unit(flag: bool) {
    let _ = flag;
}

fn unit_blocked(_flag: bool, _b: BlockError) {}

#[sentinel_resource(default_fallback = async_default)]
async fn fetch(id: u64, name: &str) -> Result<u64, LintError> {
    futures::future::ready(()).await;
    Ok(id + name.len() as u64)
}

async fn async_default(e: LintError) -> Result<u64, LintError> {
    Err(e)
}

#[sentinel_resource]
fn plain_result(x: u8) -> Result<u8, LintError> {
    Ok(x)
}

struct Svc {
    hits: u64,
}

impl Svc {
    #[sentinel_resource(fallback = Self::bump_fallback)]
    fn bump(&mut self, by: u64) -> Result<u64, LintError> {
        self.hits += by;
        Ok(self.hits)
    }

    fn bump_fallback(&mut self, _by: u64, e: LintError) -> Result<u64, LintError> {
        Err(e)
    }

    #[sentinel_resource(block_handler = Self::name_blocked)]
    fn name(&self) -> &str {
        "svc"
    }

    fn name_blocked(&self, _b: BlockError) -> &str {
        "blocked"
    }
}

/// An error type that says which of its values is a block (the nested block's paths are generated), and `Copy`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CopyError {
    Busy,
    Gone,
}

impl From<BlockError> for CopyError {
    fn from(_: BlockError) -> Self {
        CopyError::Busy
    }
}

impl sentinel_runtime::AsBlockError for CopyError {
    fn block_error(&self) -> Option<&BlockError> {
        None
    }
}

#[sentinel_resource(block_handler = by_ref_blocked)]
fn by_ref(name: &str, id: &u64) -> Result<u64, CopyError> {
    if name.is_empty() {
        return Err(CopyError::Gone);
    }
    Ok(*id)
}

fn by_ref_blocked(_name: &str, _id: &u64, _b: BlockError) -> Result<u64, CopyError> {
    Err(CopyError::Busy)
}

#[sentinel_resource(block_handler = by_value_blocked, fallback = by_value_fallback)]
async fn by_value(label: String) -> Result<usize, CopyError> {
    futures::future::ready(()).await;
    Ok(label.len())
}

async fn by_value_blocked(_label: String, _b: BlockError) -> Result<usize, CopyError> {
    Err(CopyError::Busy)
}

fn by_value_fallback(_label: String, e: CopyError) -> Result<usize, CopyError> {
    Err(e)
}

#[sentinel_resource(block_handler = consumed_blocked)]
fn consumed(label: String) -> Result<usize, CopyError> {
    Ok(label.len())
}

fn consumed_blocked(_label: String, _b: BlockError) -> Result<usize, CopyError> {
    Err(CopyError::Busy)
}

#[test]
fn expansion_compiles_without_lints_and_runs() {
    assert_eq!(by_ref("a", &3), Ok(3));
    assert_eq!(by_ref("", &3), Err(CopyError::Gone));
    assert_eq!(futures::executor::block_on(by_value("ab".into())), Ok(2));
    assert_eq!(consumed("abc".into()), Ok(3));
    assert_eq!(find(1, "x".into(), Vec::new()), Ok("x11".to_string()));
    assert_eq!(find(0, "x".into(), Vec::new()), Err(LintError::NotFound(0)));
    unit(true);
    assert_eq!(futures::executor::block_on(fetch(3, "ab")), Ok(5));
    assert_eq!(plain_result(2), Ok(2));
    let mut s = Svc { hits: 0 };
    assert_eq!(s.bump(2), Ok(2));
    assert_eq!(s.name(), "svc");
}
