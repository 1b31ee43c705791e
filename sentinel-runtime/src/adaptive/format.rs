//! Adaptive rules as JSON (and YAML or TOML, through the same serde shape).
//!
//! A rule is an object with camelCase keys; every key but `resource` may be left out and takes its default:
//!
//! ```json
//! {
//!   "resource": "GET:/orders",
//!   "regex": false,
//!   "algorithm": "gradient2",
//!   "minLimit": 4, "initialLimit": 10, "maxLimit": 200,
//!   "gradient2": { "smoothing": 0.2, "rttTolerance": 1.5, "queueSize": 4, "longWindow": 600 },
//!   "vegas": { "smoothing": 1.0, "alpha": 3, "beta": 6, "probeMultiplier": 30 },
//!   "aimd": { "backoffRatio": 0.9, "timeoutMs": 5000 },
//!   "maxWaitMs": 0, "maxWaiters": 0,
//!   "partitions": { "mobile": 0.6, "default": 0.4 },
//!   "window": { "windowMs": 1000, "minSamples": 10, "maxWindowMs": 5000, "ignoreRttUnderUs": 0 },
//!   "probe": { "intervalMs": 0, "jitter": 0.15, "concurrency": 3, "samples": 50 }
//! }
//! ```
//!
//! `algorithm` is `gradient2`, `vegas` or `aimd`; left out, inbound resources use Gradient2 and outbound ones
//! AIMD. An unknown key is an error (a typo never silently falls back to a default).

use super::rule::{validate_all, AdaptiveRule, AdaptiveRuleError};

/// Reads a JSON array of adaptive rules and validates the set: a parse error names the path of the bad
/// value, an invalid rule names its index and field.
pub fn parse_json(text: &str) -> Result<Vec<AdaptiveRule>, AdaptiveRuleError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let rules: Vec<AdaptiveRule> = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| AdaptiveRuleError::Parse(format!("at `{}`: {}", e.path(), e.inner())))?;
    de.end().map_err(|e| AdaptiveRuleError::Parse(e.to_string()))?;
    validate_all(&rules)?;
    Ok(rules)
}

/// Writes adaptive rules as a JSON array (the shape [`parse_json`] reads).
pub fn to_json(rules: &[AdaptiveRule]) -> String {
    // Serializing plain data with string keys cannot fail.
    serde_json::to_string(rules).unwrap_or_else(|_| "[]".into())
}
