use sentinel_runtime::param_flow::{HotParam, ParamValue};
use sentinel_runtime::{sentinel_resource, BlockError};

#[derive(Debug, PartialEq)]
enum AppError {
    Timeout,
    NotFound { id: u64 },
    Io(std::io::ErrorKind),
}
impl From<BlockError> for AppError {
    fn from(_: BlockError) -> Self {
        AppError::Timeout
    }
}

struct UserId(u64);
impl HotParam for UserId {
    fn visit_values(&self, f: &mut dyn FnMut(ParamValue<'_>)) {
        f(ParamValue::Int(self.0 as i64))
    }
}

mod checks {
    pub fn retryable(e: &super::AppError) -> bool {
        matches!(e, super::AppError::Timeout | super::AppError::Io(_))
    }
}

#[sentinel_resource(
    exceptions_to_ignore = [AppError::NotFound { .. }, AppError::Io(std::io::ErrorKind::NotFound)],
    exceptions_to_trace = checks::retryable,
    params = [*user, UserId(*user_raw)],
    origin = format!("tenant-{tenant}"),
    context = "api"
)]
fn lookup(user: &UserId, user_raw: &u64, tenant: u8, fail: Option<AppError>) -> Result<u64, AppError> {
    match fail {
        Some(e) => Err(e),
        None => Ok(user.0 + *user_raw + tenant as u64),
    }
}

fn main() {
    assert_eq!(lookup(&UserId(1), &2, 3, None), Ok(6));
    assert_eq!(lookup(&UserId(1), &2, 3, Some(AppError::NotFound { id: 1 })), Err(AppError::NotFound { id: 1 }));
    let io = AppError::Io(std::io::ErrorKind::NotFound);
    assert!(checks::retryable(&io));
    assert_eq!(lookup(&UserId(1), &2, 3, Some(io)), Err(AppError::Io(std::io::ErrorKind::NotFound)));
}
