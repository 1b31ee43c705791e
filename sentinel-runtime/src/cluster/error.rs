//! The cluster client's errors (shared by the client, its connection and the Redis data source), and the
//! URL redaction their messages use.

/// Why the cluster client (or the Redis data source) could not start, or is not ready.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The Redis URL does not parse.
    #[error("invalid Redis URL `{url}`: {reason} (expected redis://[user:password@]host:port[/db])")]
    Url {
        /// The URL given (with any password replaced by `***`).
        url: String,
        /// Why.
        reason: String,
    },
    /// A setting is out of range.
    #[error("invalid cluster option `{field}`: {reason}")]
    Option {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The background thread could not be started.
    #[error("could not start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Redis was not reached in time (the client keeps trying in the background; rules fall back meanwhile).
    #[error("Redis is not available: {reason}")]
    Unavailable {
        /// The last failure.
        reason: String,
    },
    /// A data source key or channel is blank.
    #[error("invalid Redis data source: {reason}")]
    Source {
        /// Why.
        reason: String,
    },
}

/// The URL with its password hidden (for messages and logs).
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    match rest.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_in_messages() {
        assert_eq!(redact("redis://:secret@127.0.0.1:6379"), "redis://:***@127.0.0.1:6379");
        assert_eq!(redact("redis://app:secret@h:1/2"), "redis://app:***@h:1/2");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
