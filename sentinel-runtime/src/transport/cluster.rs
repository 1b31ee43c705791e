//! The cluster flow control commands, in one place.
//!
//! Cluster flow control is not set up in this application yet, so `getClusterMode` answers mode `-1` ("not
//! started"), which the dashboard's cluster page shows as such, and `setClusterMode` explains why it cannot
//! change it. The other cluster commands (`cluster/client/*`, `cluster/server/*`) are not registered: the
//! dashboard takes their `Unknown command` answer for "unsupported". When cluster flow control exists, its
//! commands are added to [`COMMANDS`] here.

use serde::Serialize;

use super::commands::{Center, Command, CommandError, Params, Reply};

/// Java's `ClusterStateManager.CLUSTER_NOT_STARTED`.
pub(crate) const CLUSTER_NOT_STARTED: i32 = -1;

pub(crate) const COMMANDS: &[Command] = &[
    Command { name: "getClusterMode", desc: "get cluster mode status", write: false, run: get_cluster_mode },
    Command {
        name: "setClusterMode",
        desc: "set cluster mode, accept param: mode={0|1} 0:client mode 1:server mode",
        write: true,
        run: set_cluster_mode,
    },
];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterMode {
    mode: i32,
    last_modified: i64,
    client_available: bool,
    server_available: bool,
}

fn get_cluster_mode(_: &Center, _: &Params) -> Result<Reply, CommandError> {
    Reply::json(&ClusterMode {
        mode: CLUSTER_NOT_STARTED,
        last_modified: -1,
        client_available: false,
        server_available: false,
    })
}

fn set_cluster_mode(_: &Center, p: &Params) -> Result<Reply, CommandError> {
    match p.get("mode").map(str::trim) {
        Some("0") => Err(CommandError(
            "token client mode not available: cluster flow control is not set up in this application".into(),
        )),
        Some("1") => Err(CommandError(
            "token server mode not available: cluster flow control is not set up in this application".into(),
        )),
        _ => Err(CommandError("invalid parameter: `mode` must be 0 (client) or 1 (server)".into())),
    }
}
