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

/// The resource that new names only regex rules match share once both their cap and the bound on the
/// resources past it are reached (see [`Config::max_resources`](crate::Config::max_resources)): every regex
/// rule's pattern matches it, so every regex rule checks it. A name that lands here is limited by each rule
/// that matches it, together with every other name here, and by the other regex rules too (stricter than its
/// own rules, never looser): a flood of client-chosen names cannot make resources without bound, and no rule
/// stops applying to them. The one exception is the adaptive rules, which govern a resource one at a time: the
/// first adaptive pattern's rule governs this one, whichever the name matched.
pub const RESOURCE_PATTERNS_OVERFLOW: &str = "sentinel_resource_patterns_overflow";
