//! The cluster flow control commands' handlers, in one place (the table that names them is in
//! [`transport`](super)).
//!
//! While a cluster token service runs on the engine (`cluster::RedisCluster`, feature `cluster-redis`),
//! `getClusterMode` answers mode `0` (Java's "client": the application asks a shared limit) with
//! `clientAvailable`, and `cluster/client/fetchConfig` tells where the shared limits are kept (the Redis host
//! and port as `serverHost` and `serverPort`, the timeout as `requestTimeout`, and `clientState` 2 while Redis
//! answers, 1 while it does not): the dashboard's cluster pages show it as a connected client. There is no
//! token server to run (`serverAvailable` is false; `setClusterMode?mode=1` explains why). Without a service,
//! `getClusterMode` answers mode `-1` ("not started"). `setClusterMode` answers `success` for the mode the
//! application is in, as Java does (`0` while the service runs; `-1`, the dashboard's unbind, while none
//! does), and explains why it cannot switch to another. The other cluster commands (`cluster/server/*`, and
//! changing the client's server) are not registered: the dashboard takes their `Unknown command` answer for
//! "unsupported". Each rule's cluster state is `Sentinel::cluster_status`.

use serde::Serialize;

use super::handler::{Center, CommandError, Params, Reply};

/// Java's `ClusterStateManager.CLUSTER_NOT_STARTED`.
pub(crate) const CLUSTER_NOT_STARTED: i32 = -1;
/// Java's `ClusterStateManager.CLUSTER_CLIENT`.
pub(crate) const CLUSTER_CLIENT: i32 = 0;
/// Java's `ClusterStateManager.CLUSTER_SERVER`.
pub(crate) const CLUSTER_SERVER: i32 = 1;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterMode {
    mode: i32,
    last_modified: i64,
    client_available: bool,
    server_available: bool,
}

pub(crate) fn get_cluster_mode(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    let mode = match c.engine.cluster_service_info() {
        Some(info) => ClusterMode {
            mode: CLUSTER_CLIENT,
            last_modified: i64::try_from(info.since_ms).unwrap_or(i64::MAX),
            client_available: true,
            server_available: false,
        },
        None => ClusterMode {
            mode: CLUSTER_NOT_STARTED,
            last_modified: -1,
            client_available: false,
            server_available: false,
        },
    };
    Reply::json(&mode)
}

/// Java's `ClusterClientStateEntity`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClientConfig {
    server_host: String,
    server_port: u16,
    /// `ClientConstants`: 0 off, 1 pending, 2 started.
    client_state: i32,
    request_timeout: u64,
}

pub(crate) fn fetch_client_config(c: &Center, _: &Params) -> Result<Reply, CommandError> {
    match c.engine.cluster_service_info() {
        Some(info) => Reply::json(&ClientConfig {
            server_host: info.host,
            server_port: info.port,
            client_state: if info.connected { 2 } else { 1 },
            request_timeout: info.timeout_ms,
        }),
        None => Reply::json(&ClientConfig {
            server_host: String::new(),
            server_port: 0,
            client_state: 0,
            request_timeout: 0,
        }),
    }
}

pub(crate) fn set_cluster_mode(c: &Center, p: &Params) -> Result<Reply, CommandError> {
    let running = c.engine.has_cluster_service();
    // Java: `Integer.valueOf(mode)`, so `-1` (the dashboard's unbind) is a mode too.
    match p.get("mode").and_then(|m| m.trim().parse::<i32>().ok()) {
        // Already a client of the shared limit on Redis.
        Some(CLUSTER_CLIENT) if running => Ok(Reply::text("success")),
        Some(CLUSTER_CLIENT) => Err(CommandError(
            "token client mode not available: start cluster::RedisCluster in the application (feature \
             cluster-redis) to use cluster flow control"
                .into(),
        )),
        Some(CLUSTER_SERVER) => Err(CommandError(
            "token server mode not available: cluster flow control runs on Redis, there is no token server to \
             start"
                .into(),
        )),
        // Not started: what it is without a service (Java answers `success` for the mode it is in).
        Some(CLUSTER_NOT_STARTED) if !running => Ok(Reply::text("success")),
        Some(CLUSTER_NOT_STARTED) => Err(CommandError(
            "cannot stop cluster flow control from here: it runs while the application runs \
             cluster::RedisCluster; stop it in the application"
                .into(),
        )),
        _ => Err(CommandError("invalid parameter: `mode` must be 0 (client), 1 (server) or -1 (not started)".into())),
    }
}
