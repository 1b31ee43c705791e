//! The breaker on Redis: after a failure the client stops asking Redis for tokens (rules fall back to their
//! local limits) and probes it again after a pause that doubles up to a bound; the first success closes it.

use std::time::{Duration, Instant};

/// Why a call to Redis failed, in words fit for a log line and for the rules' status: what happened and
/// what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No reply within the timeout (Redis hangs, is overloaded, or the network drops packets).
    Timeout(Duration),
    /// The connection failed or was refused.
    Connection(String),
    /// Redis refused the credentials (`NOAUTH`, `WRONGPASS`).
    Auth(String),
    /// `MOVED` or `ASK`: the server is a Redis Cluster node that does not own the rule's slot.
    WrongNode(String),
    /// `CLUSTERDOWN` (or `TRYAGAIN`, `MASTERDOWN`): the cluster cannot serve the rule's slot now.
    ClusterDown(String),
    /// `READONLY`: the server is a replica.
    ReadOnly(String),
    /// Redis answered with another error (a script error, a wrong key type...).
    Reply(String),
}

impl Failure {
    pub(crate) fn of(e: &redis::RedisError) -> Failure {
        let text = e.to_string();
        match e.code() {
            Some("MOVED" | "ASK") => return Failure::WrongNode(text),
            Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN") => return Failure::ClusterDown(text),
            Some("READONLY") => return Failure::ReadOnly(text),
            Some("NOAUTH" | "WRONGPASS") => return Failure::Auth(text),
            _ => {}
        }
        if e.kind() == redis::ErrorKind::AuthenticationFailed
            || text.contains("WRONGPASS")
            || text.contains("NOAUTH")
            || text.contains("invalid password")
        {
            Failure::Auth(text)
        } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() || e.is_timeout() {
            Failure::Connection(text)
        } else {
            Failure::Reply(text)
        }
    }

    /// Whether the connection should be made afresh before the next attempt (it may be unusable for good,
    /// e.g. after an authentication failure, which the connection manager does not retry; or point at a
    /// server that is no longer the master).
    pub(crate) fn needs_new_connection(&self) -> bool {
        !matches!(self, Failure::Timeout(_))
    }

    /// Whether `other` is the same kind of failure (a change of kind is reported again).
    pub(crate) fn same_kind(&self, other: &Failure) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout(d) => write!(f, "Redis did not answer within {} ms", d.as_millis()),
            Failure::Connection(e) => write!(f, "cannot reach Redis: {e}"),
            Failure::Auth(e) => {
                write!(f, "Redis refused the credentials (check the user and password in the URL): {e}")
            }
            Failure::WrongNode(e) => write!(
                f,
                "this node does not own the rule's slot (the server is a Redis Cluster node): give the cluster's \
                 seed nodes (`RedisCluster::cluster_builder`): {e}"
            ),
            Failure::ClusterDown(e) => write!(
                f,
                "the Redis Cluster cannot serve the rule's slot now (a shard has no reachable master; with \
                 `cluster-require-full-coverage yes`, the default, every shard refuses while one is down): {e}"
            ),
            Failure::ReadOnly(e) => write!(
                f,
                "the server is a read-only replica: give the master, or the sentinels and the master's name \
                 (`RedisCluster::sentinel_builder`) to follow failovers: {e}"
            ),
            Failure::Reply(e) => write!(f, "Redis answered with an error: {e}"),
        }
    }
}

/// What the breaker says about the next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Call freely.
    Closed,
    /// Make one probe call now.
    Probe,
    /// Do not call before this instant.
    OpenUntil(Instant),
}

/// The breaker's state.
#[derive(Debug)]
pub(crate) struct Breaker {
    first_pause: Duration,
    max_pause: Duration,
    /// `None`: closed. Else the pause in force and when it ends.
    open: Option<(Duration, Instant)>,
    /// The failure that opened it (or kept it open), for the status.
    pub(crate) last: Option<Failure>,
}

impl Breaker {
    pub(crate) fn new(max_pause: Duration) -> Self {
        Breaker { first_pause: Duration::from_millis(100).min(max_pause), max_pause, open: None, last: None }
    }

    pub(crate) fn gate(&self, now: Instant) -> Gate {
        match self.open {
            None => Gate::Closed,
            Some((_, until)) if now >= until => Gate::Probe,
            Some((_, until)) => Gate::OpenUntil(until),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.open.is_none()
    }

    /// A call failed: opens (or keeps open, with a longer pause). Returns whether it was closed before.
    pub(crate) fn failure(&mut self, now: Instant, why: Failure) -> bool {
        let was_closed = self.open.is_none();
        let pause = match self.open {
            None => self.first_pause,
            Some((p, _)) => (p * 2).min(self.max_pause),
        };
        self.open = Some((pause, now + pause));
        self.last = Some(why);
        was_closed
    }

    /// A call succeeded: closes. Returns whether it was open before.
    pub(crate) fn success(&mut self) -> bool {
        let was_open = self.open.is_some();
        self.open = None;
        self.last = None;
        was_open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_up_to_its_bound_and_one_success_closes() {
        let t0 = Instant::now();
        let mut b = Breaker::new(Duration::from_millis(350));
        assert_eq!(b.gate(t0), Gate::Closed);
        assert!(b.failure(t0, Failure::Timeout(Duration::from_millis(20))));
        assert_eq!(b.gate(t0), Gate::OpenUntil(t0 + Duration::from_millis(100)));
        assert_eq!(b.gate(t0 + Duration::from_millis(100)), Gate::Probe);
        assert!(!b.failure(t0, Failure::Connection("refused".into())));
        assert_eq!(b.gate(t0), Gate::OpenUntil(t0 + Duration::from_millis(200)));
        b.failure(t0, Failure::Connection("refused".into()));
        assert_eq!(b.gate(t0), Gate::OpenUntil(t0 + Duration::from_millis(350)), "bounded");
        assert!(b.success());
        assert_eq!(b.gate(t0), Gate::Closed);
        assert!(b.failure(t0, Failure::Reply("ERR".into())));
        assert_eq!(b.gate(t0), Gate::OpenUntil(t0 + Duration::from_millis(100)), "starts over after closing");
    }

    #[test]
    fn failures_read_as_what_to_check() {
        assert!(Failure::Auth("WRONGPASS".into()).to_string().contains("password in the URL"));
        assert!(Failure::Timeout(Duration::from_millis(20)).to_string().contains("within 20 ms"));
        assert!(!Failure::Timeout(Duration::from_millis(20)).needs_new_connection());
        assert!(Failure::Auth(String::new()).needs_new_connection());
    }

    #[test]
    fn cluster_and_replica_replies_say_what_to_do() {
        let reply = |text: &str| {
            let v = redis::parse_redis_value(text.as_bytes()).unwrap();
            match v {
                redis::Value::ServerError(e) => redis::RedisError::from(e),
                other => panic!("{other:?}"),
            }
        };
        let moved = Failure::of(&reply("-MOVED 3999 127.0.0.1:6381\r\n"));
        assert!(matches!(moved, Failure::WrongNode(_)), "{moved:?}");
        assert!(moved.to_string().contains("give the cluster's seed nodes"), "{moved}");
        let ask = Failure::of(&reply("-ASK 3999 127.0.0.1:6381\r\n"));
        assert!(ask.same_kind(&moved));
        let down = Failure::of(&reply("-CLUSTERDOWN The cluster is down\r\n"));
        assert!(matches!(down, Failure::ClusterDown(_)) && down.to_string().contains("full-coverage"), "{down}");
        let replica = Failure::of(&reply("-READONLY You can't write against a read only replica.\r\n"));
        assert!(replica.to_string().contains("sentinel_builder"), "{replica}");
        let noauth = Failure::of(&reply("-NOAUTH Authentication required.\r\n"));
        assert!(matches!(noauth, Failure::Auth(_)) && noauth.to_string().contains("password"), "{noauth}");
        assert!(!noauth.same_kind(&replica));
    }
}
