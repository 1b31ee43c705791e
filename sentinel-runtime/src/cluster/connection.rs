//! How the client reaches Redis, whatever its deployment: one standalone server, a Redis Cluster (the
//! script of each rule routed to the shard that owns its hash tag), or a master found through Redis
//! Sentinel. The worker and the data source hold a [`Link`] and speak through the [`Conn`] it opens.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use super::error::{redact, ClusterError};

/// Where Redis runs: the deployment a cluster client or a data source talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One Redis server (or a proxy in front of several): `redis://[user:password@]host:port[/db]`.
    Standalone {
        /// The server's URL.
        url: String,
    },
    /// A Redis Cluster, reached through some of its nodes (the seeds: any of them will do, the client
    /// learns the others and which node owns which slot). Each rule's keys share one hash tag, so one
    /// shard serves a rule and different rules spread over the shards; `MOVED` and `ASK` redirections and
    /// topology changes (a resharding, a failover to a replica) are followed by the client.
    Cluster {
        /// Seed nodes: `redis://[user:password@]host:port` each (the credentials of the first one serve
        /// every node).
        nodes: Vec<String>,
    },
    /// A master and its replicas watched by Redis Sentinel: the client asks the sentinels for the master
    /// of `master_name`, and asks them again when the master stops answering or turns into a replica
    /// (a failover), so that it follows the new master by itself.
    Sentinel {
        /// The sentinels: `redis://[user:password@]host:port` each (their own credentials, if any).
        sentinels: Vec<String>,
        /// The name the sentinels monitor the master under (`sentinel monitor <name> ...`).
        master_name: String,
        /// The master's user, if it has ACLs.
        master_username: Option<String>,
        /// The master's password, if it has one.
        master_password: Option<String>,
    },
}

impl Topology {
    /// A Redis Cluster reached through `nodes`.
    pub fn cluster<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Topology {
        Topology::Cluster { nodes: nodes.into_iter().map(Into::into).collect() }
    }

    /// The master the `sentinels` monitor as `master_name` (no credentials for it).
    pub fn sentinel<S: Into<String>>(
        sentinels: impl IntoIterator<Item = S>,
        master_name: impl Into<String>,
    ) -> Topology {
        Topology::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master_name: master_name.into(),
            master_username: None,
            master_password: None,
        }
    }

    /// The addresses, for messages and logs (passwords hidden).
    pub fn describe(&self) -> String {
        match self {
            Topology::Standalone { url } => redact(url),
            Topology::Cluster { nodes } => {
                format!("cluster {}", nodes.iter().map(|n| redact(n)).collect::<Vec<_>>().join(","))
            }
            Topology::Sentinel { sentinels, master_name, .. } => format!(
                "master `{master_name}` through sentinels {}",
                sentinels.iter().map(|n| redact(n)).collect::<Vec<_>>().join(",")
            ),
        }
    }

    /// The kind, as the dashboard's cluster page shows it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Topology::Standalone { .. } => "redis",
            Topology::Cluster { .. } => "redis-cluster",
            Topology::Sentinel { .. } => "redis-sentinel",
        }
    }

    /// The clients for this deployment (no connection yet); a URL that does not parse is an error.
    pub(crate) fn link(&self) -> Result<Link, ClusterError> {
        let url_error = |url: &str, e: redis::RedisError| ClusterError::Url { url: redact(url), reason: e.to_string() };
        match self {
            Topology::Standalone { url } => {
                Ok(Link::Standalone(redis::Client::open(url.as_str()).map_err(|e| url_error(url, e))?))
            }
            Topology::Cluster { nodes } => {
                if nodes.is_empty() {
                    return Err(ClusterError::Option { field: "nodes", reason: "give at least one seed node".into() });
                }
                let mut infos = Vec::with_capacity(nodes.len());
                for n in nodes {
                    infos.push(n.as_str().into_connection_info().map_err(|e| url_error(n, e))?);
                }
                // The first seed's credentials serve every node: given to the seeds that name none (the
                // client refuses seeds whose credentials differ).
                let first = infos[0].redis_settings().clone();
                for info in infos.iter_mut().skip(1) {
                    let own = info.redis_settings();
                    if own.username().is_none() && own.password().is_none() {
                        let mut settings = own.clone();
                        if let Some(user) = first.username() {
                            settings = settings.set_username(user);
                        }
                        if let Some(password) = first.password() {
                            settings = settings.set_password(password);
                        }
                        *info = info.clone().set_redis_settings(settings);
                    }
                }
                let seeds = infos.clone();
                let client = redis::cluster::ClusterClientBuilder::new(infos)
                    // Our own timeouts bound every call; the client's retries follow redirections.
                    .retries(3)
                    .min_retry_wait(10)
                    .max_retry_wait(200)
                    .build()
                    .map_err(|e| url_error(&nodes[0], e))?;
                Ok(Link::Cluster { client: Box::new(client), seeds })
            }
            Topology::Sentinel { sentinels, master_name, master_username, master_password } => {
                if sentinels.is_empty() {
                    return Err(ClusterError::Option {
                        field: "sentinels",
                        reason: "give at least one sentinel address".into(),
                    });
                }
                if master_name.trim().is_empty() {
                    return Err(ClusterError::Option { field: "master_name", reason: "must not be blank".into() });
                }
                let mut addrs = Vec::with_capacity(sentinels.len());
                let mut auth = None;
                for s in sentinels {
                    let info = s.as_str().into_connection_info().map_err(|e| url_error(s, e))?;
                    let settings = info.redis_settings();
                    if auth.is_none() && settings.password().is_some() {
                        auth = Some((settings.username().map(str::to_string), settings.password().map(str::to_string)));
                    }
                    addrs.push(info.addr().clone());
                }
                let mut b = redis::sentinel::SentinelClientBuilder::new(
                    addrs,
                    master_name,
                    redis::sentinel::SentinelServerType::Master,
                )
                .map_err(|e| url_error(&sentinels[0], e))?;
                if let Some((user, pass)) = auth {
                    if let Some(u) = user {
                        b = b.set_client_to_sentinel_username(u);
                    }
                    if let Some(p) = pass {
                        b = b.set_client_to_sentinel_password(p);
                    }
                }
                if let Some(u) = master_username {
                    b = b.set_client_to_redis_username(u);
                }
                if let Some(p) = master_password {
                    b = b.set_client_to_redis_password(p);
                }
                let client = b.build().map_err(|e| url_error(&sentinels[0], e))?;
                Ok(Link::Sentinel(Box::new(client)))
            }
        }
    }
}

/// The clients of one deployment (no connection until [`Link::connect`]).
pub(crate) enum Link {
    Standalone(redis::Client),
    Cluster {
        client: Box<redis::cluster::ClusterClient>,
        /// The seed nodes (the data source subscribes on one of them).
        seeds: Vec<redis::ConnectionInfo>,
    },
    Sentinel(Box<redis::sentinel::SentinelClient>),
}

impl Link {
    /// Whether the server is found anew with each connection (behind Sentinel: a master that stops
    /// answering may have been replaced, so a timeout is reason enough to ask the sentinels again).
    pub(crate) fn finds_master(&self) -> bool {
        matches!(self, Link::Sentinel(_))
    }

    /// Whether rules may be served by different servers (then each rule falls back on its own).
    pub(crate) fn is_sharded(&self) -> bool {
        matches!(self, Link::Cluster { .. })
    }

    /// Opens a connection. Standalone: a connection manager made lazily (it reconnects in the
    /// background). Cluster: the cluster's map of slots, learnt from a seed node. Sentinel: the master the
    /// sentinels name now, checked to be a master. Must run inside the tokio runtime; the caller bounds it
    /// with a timeout.
    pub(crate) async fn connect(&mut self, timeout: Duration, retry_max: Duration) -> redis::RedisResult<Conn> {
        match self {
            Link::Standalone(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(20))
                    .set_max_delay(retry_max);
                Ok(Conn::Standalone(ConnectionManager::new_lazy_with_config(client.clone(), config)?))
            }
            Link::Cluster { client, .. } => {
                let config =
                    redis::cluster::ClusterConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
                Ok(Conn::Cluster(client.get_async_connection_with_config(config).await?))
            }
            Link::Sentinel(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None);
                // The master the sentinels name now (checked to say it is one), and its address for the
                // dashboard (`cluster/client/fetchConfig` names the server that keeps the limits).
                let master = client.async_get_client().await?;
                let addr = master.get_connection_info().addr().clone();
                let conn = master.get_multiplexed_async_connection_with_config(&config).await?;
                Ok(Conn::Master { conn, addr })
            }
        }
    }

    /// A Redis Cluster: a fresh connection being made (its own map of slots, learnt from the nodes that
    /// answer), to run in the background. A connection whose node stops answering keeps routing a shard's
    /// slots to it (the client learns a new map only from a redirection or a dropped connection), so a
    /// replica the cluster promotes in place of a hung master is found by a fresh one. `None` for the other
    /// deployments.
    pub(crate) fn fresh_cluster_connection(
        &self,
        timeout: Duration,
    ) -> Option<impl std::future::Future<Output = redis::RedisResult<Conn>> + Send + 'static + use<>> {
        let Link::Cluster { client, .. } = self else { return None };
        let client = client.clone();
        let config = redis::cluster::ClusterConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
        Some(async move { client.get_async_connection_with_config(config).await.map(Conn::Cluster) })
    }

    /// Plain clients to subscribe with, to try in turn: the server itself, the master the sentinels name
    /// now, or the cluster's seed nodes (classic pub/sub reaches every node of a cluster: a `PUBLISH` on
    /// any node is forwarded to all of them over the cluster bus, so any reachable node will do).
    pub(crate) async fn subscribers(&mut self) -> redis::RedisResult<Vec<redis::Client>> {
        match self {
            Link::Standalone(client) => Ok(vec![client.clone()]),
            Link::Sentinel(client) => Ok(vec![client.async_get_client().await?]),
            Link::Cluster { seeds, .. } => seeds.iter().map(|s| redis::Client::open(s.clone())).collect(),
        }
    }

    /// A plain client for the server that holds `key` (the data source's transactions): the server
    /// itself, the master the sentinels name now, or the cluster node that holds the key's slot (found by
    /// following a seed node's `MOVED` and `ASK` redirections). `true` with it: the key's slot is being
    /// migrated to that node, so each command there must follow an `ASKING` (see [`owner_of`]).
    pub(crate) async fn client_for_key(
        &mut self,
        key: &str,
        timeout: Duration,
    ) -> redis::RedisResult<(redis::Client, bool)> {
        match self {
            Link::Standalone(client) => Ok((client.clone(), false)),
            Link::Sentinel(client) => Ok((client.async_get_client().await?, false)),
            Link::Cluster { seeds, .. } => {
                let mut last = None;
                for seed in seeds.iter() {
                    match owner_of(seed, key, timeout).await {
                        Ok(route) => return Ok(route),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "no seed node"))))
            }
        }
    }
}

/// Asks `seed` about `key` (`TYPE`, which a node answers for a key it holds and redirects otherwise) and
/// follows the redirections: `MOVED` to the slot's owner; `ASK` (the slot is migrating and the key has
/// already left) to the node importing it, which answers for the key only to a command that follows an
/// `ASKING` (then `true`). A few hops at most (a resharding may redirect twice).
async fn owner_of(
    seed: &redis::ConnectionInfo,
    key: &str,
    timeout: Duration,
) -> redis::RedisResult<(redis::Client, bool)> {
    let config =
        redis::AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
    let mut node = seed.clone();
    let mut asking = false;
    for _ in 0..4 {
        let client = redis::Client::open(node.clone())?;
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
        if asking {
            // One connection, one client: the flag holds for the next command.
            redis::cmd("ASKING").query_async::<()>(&mut conn).await?;
        }
        match redis::cmd("TYPE").arg(key).query_async::<String>(&mut conn).await {
            Ok(_) => return Ok((client, asking)),
            Err(e) if matches!(e.code(), Some("MOVED") | Some("ASK")) => {
                asking = e.code() == Some("ASK");
                // "<slot> <host>:<port>": the same credentials, the other node's address.
                let addr = e.redirect_node().map(|(addr, _)| addr.to_string()).unwrap_or_default();
                let (host, port) = addr.rsplit_once(':').unwrap_or((addr.as_str(), ""));
                let port: u16 = port.parse().map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a redirection without an address",
                        e.to_string(),
                    ))
                })?;
                let host = if host.is_empty() { seed_host(seed) } else { host.to_string() };
                node = seed.clone().set_addr(redis::ConnectionAddr::Tcp(host, port));
            }
            Err(e) => return Err(e),
        }
    }
    Err(redis::RedisError::from((redis::ErrorKind::Client, "redirected too many times", key.to_string())))
}

fn seed_host(seed: &redis::ConnectionInfo) -> String {
    match seed.addr() {
        redis::ConnectionAddr::Tcp(h, _) => h.clone(),
        _ => "127.0.0.1".to_string(),
    }
}

/// An open connection to one deployment; cheap to clone (all clones share one multiplexed connection).
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
    Master {
        conn: MultiplexedConnection,
        /// The master's address when the sentinels named it.
        addr: redis::ConnectionAddr,
    },
}

impl Conn {
    /// Behind Sentinel, the address of the master this connection reaches (it changes with a failover).
    pub(crate) fn master_addr(&self) -> Option<&redis::ConnectionAddr> {
        match self {
            Conn::Master { addr, .. } => Some(addr),
            _ => None,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Master { conn: c, .. } => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Master { conn: c, .. } => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Master { conn: c, .. } => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_that_does_not_parse_is_refused_with_its_password_hidden() {
        let e = Topology::Standalone { url: "http://:pw@x".into() }.link().map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(":***@") && !e.to_string().contains("pw"), "{e}");
    }
}
