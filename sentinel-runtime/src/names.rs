//! Names with a meaning of their own, shared by the rules' data and the engine: the `limit_app` values, the
//! origin of untracked callers, the default context.

/// `limit_app` meaning every caller.
pub const LIMIT_APP_DEFAULT: &str = "default";
/// `limit_app` meaning each origin not named by another rule of the resource.
pub const LIMIT_APP_OTHER: &str = "other";

/// The origin of calls whose origin is past a cap (a name no rule may use): it is not named by any rule, so
/// white lists block it, black lists and origin-specific rules never match it, and `other` rules count it
/// on one shared node.
pub const UNTRACKED_ORIGIN: &str = "(untracked)";
/// Name of the context used when none was entered.
pub const DEFAULT_CONTEXT_NAME: &str = "sentinel_default_context";
