//! The command center (feature `transport`): the HTTP protocol of the Sentinel Dashboard, heartbeats to it,
//! per-second history, and a built-in live console, on `127.0.0.1:8719`.
//!
//! ```no_run
//! use sentinel_runtime::{Sentinel, transport::CommandCenter};
//!
//! let engine = Sentinel::global();
//! // 127.0.0.1:8719 unless SENTINEL_COMMAND_BIND / SENTINEL_COMMAND_PORT say otherwise; heartbeats to
//! // SENTINEL_DASHBOARD_SERVER when it is set.
//! let center = CommandCenter::from_env(engine)?.start()?;
//! println!("console: http://{}/", center.local_addr());
//! // ... the application runs; dropping `center` stops the server.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it serves
//! The commands the dashboard calls, in its formats (Java's `sentinel-transport-common`): `metric`,
//! `jsonTree`, `clusterNode`, `getRules` / `setRules` (flow, degrade, system, authority),
//! `getParamFlowRules` / `setParamFlowRules`, `getClusterMode` and `cluster/client/fetchConfig` (mode 0, a
//! client of the shared limits, while `cluster::RedisCluster` runs; else -1, not started);
//! and for people with curl: `version`, `basicInfo`, `getSwitch` / `setSwitch`, `systemStatus`, `api`,
//! Java's node tables and call tree as text (`clusterNodeById?id=`, `cnode?id=`, `origin?id=`, `tree[?id=]`),
//! `diagnose?resource=`. A command is the path (`GET /getRules?type=flow`); parameters come from the query
//! string and a form-encoded body, each decoded once; a command that changes something is a `POST`
//! (`curl -d value=false http://127.0.0.1:8719/setSwitch`, see the security defaults), and a `POST` without a
//! body gets `411`, as in Java (its parameters are the body's). Answers are `200`
//! with the result, `400` with the reason (an unknown command: ``Unknown command `x` ``), and nothing
//! changes on an error.
//!
//! `GET /` is the console: every resource live (pass, block, success, exception per second, average rt,
//! concurrency), a 5-minute chart each, every adaptive limiter (its limit against the calls in flight over 5
//! minutes, min and sample RTT, partitions), breaker states and transitions, the rules of each kind
//! (editable, the server's error shown inline), the gateway's API groups and flow rules (feature `tower`:
//! added, edited and deleted through the `gateway/update*` commands, the server's error next to the field),
//! `diagnose` at a click and the global switch.
//!
//! # Rules pushed from the dashboard survive a restart
//! With [`CommandCenterBuilder::data_source`], a push is validated by the engine (a rejected push changes
//! neither the engine nor the file), put in force, and written back to the rules file atomically in the
//! file's own format ([`FileDataSource::write_rules`](crate::datasource::FileDataSource::write_rules)), or to
//! any other [`WritableDataSource`] (Redis, etcd, a store of your own). The answer is `success`, or
//! `partial success (write data source failed)` when the rules are in force but the store could not be
//! written, or did not answer in time: the request timeout less a quarter of it, at most a second less (9 s
//! by default; the write goes on; writes are made one at a time in push order, at most one waiting per kind
//! of rules). The reason is in the `X-Sentinel-Write-Error` header and the log.
//!
//! # Security defaults
//! - Bound to `127.0.0.1` (Java binds every interface). Requests must name a loopback host, which defeats
//!   DNS rebinding.
//! - Bound anywhere else, [`start`](CommandCenterBuilder::start) fails with [`StartError::TokenRequired`]
//!   unless a token is set; every write command then needs `Authorization: Bearer <token>` (compared in
//!   constant time), and every read too with [`CommandCenterBuilder::token_for_reads`]. Every request, reads
//!   included, must name the server by an IP address, `localhost`, the machine's host name or a name given
//!   to [`CommandCenterBuilder::allow_host`] (DNS rebinding again: a page of another domain that resolves to
//!   the server's address cannot read it through a visitor's browser).
//! - Write commands (`setRules`, `setParamFlowRules`, `setSwitch`, `setClusterMode`) are taken by `POST`
//!   only, as the dashboard sends them since 1.6 and the console does: a `GET`, which any page can make a
//!   browser send (an `<img>`), gets `405`. Dashboards older than 1.6 write by `GET`:
//!   [`CommandCenterBuilder::allow_get_writes`] (or `SENTINEL_COMMAND_GET_WRITES=true`) accepts it again.
//!   The Java dashboard's cluster page sends `setClusterMode` by `GET` whatever its version; here the mode
//!   follows the application (`cluster::RedisCluster`), so that button only ever confirmed it.
//! - Writes sent by a browser from another site (`Origin`, `Sec-Fetch-Site`) are refused.
//! - [`CommandCenterBuilder::allow_peer`] limits the peers that may connect at all: any other is answered
//!   `403` and closed as soon as it connects, before anything is read, so it takes no connection slot;
//!   [`CommandCenterBuilder::trust_peer`] lets the dashboard's address write without the token (the dashboard
//!   cannot send one) and keeps connection slots for it.
//! - Bodies are capped (`413`), headers must arrive within 5 s and a request complete within 10 s (a client
//!   that sends a byte a second is dropped), and the answer must be taken within 10 s of its first byte
//!   ([`CommandCenterBuilder::write_timeout`]; a client that does not read is dropped), so a connection
//!   lasts 25 s at most. At most 64 connections are served at once, 16 from one address (an IPv6 /64
//!   counts as one; every local process is one address on loopback), `503` past either cap; malformed input
//!   gets `400`.
//! - The server protects itself with a Sentinel flow rule: every request enters the resource
//!   [`COMMAND_RESOURCE`] of a private engine (so no dashboard push can remove the rule), limited to
//!   [`DEFAULT_COMMAND_QPS`] requests per second by default ([`CommandCenterBuilder::command_qps`]); past
//!   it the answer is `429`.
//!
//! # Memory
//! The history keeps every resource's last [`DEFAULT_HISTORY_SECONDS`] seconds at 1 s resolution: 32 bytes
//! a second, 9,600 bytes per resource that had traffic, at most the engine's resource cap; and each adaptive
//! limiter's limit and calls in flight, per resource and per partition, at 12 bytes a second (3,600 bytes for
//! 5 minutes), at most 1,024 such series. With the `logs`
//! feature, `metric` answers for older seconds from the metric log files (`log::MetricSearcher`), streamed
//! through the index: an answer holds at most 12,000 lines (`maxLines` without `endTime`) and 2 MiB of them
//! and reads at most an hour of log; at most four such searches run at once (another is refused, "busy").
//!
//! # Threads
//! The server runs on a thread of its own with a current-thread tokio runtime, so the application needs no
//! runtime, and never on the threads that call resources; [`CommandCenterBuilder::runtime`] runs it on the
//! application's runtime instead. It only reads the engine's statistics: it adds nothing to a call.

mod adaptive_history;
mod breakers;
mod cluster;
mod commands;
mod console;
#[cfg(feature = "tower")]
mod gateway;
mod handler;
mod heartbeat;
mod history;
mod security;
mod write_back;

pub use commands::WRITE_DATA_SOURCE_FAILED;
pub use heartbeat::{DashboardAddressError, HeartbeatStatus, DEFAULT_HEARTBEAT_INTERVAL, HEARTBEAT_PATH};
pub use history::{DEFAULT_HISTORY_SECONDS, MIN_HISTORY_SECONDS};
pub use security::TOKEN_HEADER;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::Router;
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, StatusCode, Uri};

use crate::datasource::WritableDataSource;
use crate::flow::FlowRule;
use crate::http_server::{plain, HttpServer, Limits, PeerPolicy, Runtime};
use crate::{Resource, Sentinel};
use handler::{version, Center, Command, CommandError, MachineInfo, Params, Reply};
use security::Access;

/// Every command the server knows, in the order the `api` command lists them: a command is the request's
/// path without the leading `/`. The handlers live in `commands` (the dashboard's and the ones for people),
/// `cluster` and `console`.
const COMMANDS: &[Command] = &[
    Command {
        name: "metric",
        desc: "per-second metric lines of complete seconds, accept param: startTime={ms}&endTime={ms}&maxLines={n}&identity={resource}",
        write: false,
        run: commands::metric,
    },
    Command { name: "jsonTree", desc: "get tree node VO start from root node", write: false, run: commands::json_tree },
    Command {
        name: "clusterNode",
        desc: "get all clusterNode VO, use type=notZero to ignore those nodes with totalRequest <=0",
        write: false,
        run: commands::cluster_node,
    },
    Command {
        name: "getRules",
        desc: "get all active rules by type, request param: type={flow|degrade|system|authority}",
        write: false,
        run: commands::get_rules,
    },
    Command {
        name: "setRules",
        desc: "modify the rules, accept param: type={flow|degrade|system|authority}&data={ruleJson}",
        write: true,
        run: commands::set_rules,
    },
    Command {
        name: "getParamFlowRules",
        desc: "get all active param flow rules",
        write: false,
        run: commands::get_param_rules,
    },
    Command {
        name: "setParamFlowRules",
        desc: "set param flow rules, accept param: data={paramFlowRuleJson}",
        write: true,
        run: commands::set_param_rules,
    },
    Command {
        name: "clusterNodeById",
        desc: "get clusterNode VO by id, request param: id={resourceName}",
        write: false,
        run: commands::cluster_node_by_id,
    },
    Command {
        name: "cnode",
        desc: "get clusterNode metrics by id, request param: id={resourceName}",
        write: false,
        run: commands::cnode,
    },
    Command {
        name: "tree",
        desc: "get metrics in tree mode, use id to specify detailed tree root",
        write: false,
        run: commands::tree,
    },
    Command {
        name: "origin",
        desc: "get origin clusterNode by id, request param: id={resourceName}",
        write: false,
        run: commands::origin,
    },
    Command { name: "version", desc: "get sentinel version", write: false, run: |_, _| Ok(Reply::text(version())) },
    Command { name: "basicInfo", desc: "get sentinel config info", write: false, run: commands::basic_info },
    Command { name: "getSwitch", desc: "get sentinel switch status", write: false, run: commands::get_switch },
    Command {
        name: "setSwitch",
        desc: "set sentinel switch, accept param: value={true|false}",
        write: true,
        run: commands::set_switch,
    },
    Command { name: "systemStatus", desc: "get system status", write: false, run: commands::system_status },
    Command { name: "api", desc: "get all available command handlers", write: false, run: api },
    Command {
        name: "diagnose",
        desc: "explain what the rules of a resource do and why they fire or not, accept param: resource={name}",
        write: false,
        run: commands::diagnose,
    },
    Command {
        name: "getClusterMode",
        desc: "get cluster mode status",
        write: false,
        run: cluster::get_cluster_mode,
    },
    Command {
        name: "setClusterMode",
        desc: "set cluster mode, accept param: mode={0|1} 0:client mode 1:server mode",
        write: true,
        run: cluster::set_cluster_mode,
    },
    Command {
        name: "cluster/client/fetchConfig",
        desc: "get cluster client config",
        write: false,
        run: cluster::fetch_client_config,
    },
    Command {
        name: "console/overview",
        desc: "the console's live view: every resource's last complete second, concurrency, breakers and the switch",
        write: false,
        run: console::overview,
    },
    Command {
        name: "console/history",
        desc: "per-second series of every resource for the console's charts, accept param: after={ms}",
        write: false,
        run: console::history,
    },
    Command {
        name: "console/adaptive",
        desc: "every adaptive limiter: its limit, calls in flight, RTTs and partitions now, and its limit and calls in flight per second over the history, accept param: after={ms}",
        write: false,
        run: console::adaptive,
    },
];

/// The dashboard's gateway commands (feature `tower`, which holds gateway flow control).
#[cfg(feature = "tower")]
const GATEWAY_COMMANDS: &[Command] = &[
    Command {
        name: "gateway/getApiDefinitions",
        desc: "get the API definitions of the gateway",
        write: false,
        run: gateway::get_api_definitions,
    },
    Command {
        name: "gateway/updateApiDefinitions",
        desc: "replace the API definitions of the gateway, accept param: data={apiDefinitionsJson}",
        write: true,
        run: gateway::update_api_definitions,
    },
    Command { name: "gateway/getRules", desc: "get the gateway flow rules", write: false, run: gateway::get_rules },
    Command {
        name: "gateway/updateRules",
        desc: "replace the gateway flow rules, accept param: data={gatewayFlowRulesJson}",
        write: true,
        run: gateway::update_rules,
    },
];
#[cfg(not(feature = "tower"))]
const GATEWAY_COMMANDS: &[Command] = &[];

/// Every command, the table's then the gateway's.
fn all_commands() -> impl Iterator<Item = &'static Command> {
    COMMANDS.iter().chain(GATEWAY_COMMANDS)
}

/// The command named `name`.
fn find_command(name: &str) -> Option<&'static Command> {
    all_commands().find(|c| c.name == name)
}

/// `api`: every command with what it does.
fn api(_: &Center, _: &Params) -> Result<Reply, CommandError> {
    #[derive(serde::Serialize)]
    struct Api {
        url: String,
        desc: &'static str,
    }
    let list: Vec<Api> = all_commands().map(|c| Api { url: format!("/{}", c.name), desc: c.desc }).collect();
    Reply::json(&list)
}

/// The default command port (Java's `csp.sentinel.api.port`).
pub const DEFAULT_PORT: u16 = 8719;
/// How many ports from the configured one are tried when it is busy (Java also moves on).
pub const PORT_TRIES: u16 = 10;
/// The resource every request to the command server enters (in the server's own engine).
pub const COMMAND_RESOURCE: &str = "sentinel-command-center";
/// Requests per second the command server answers by default; past it, `429`.
pub const DEFAULT_COMMAND_QPS: f64 = 200.0;
/// The default body cap of a request (a large rule push fits).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// The default cap on connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// A setting from the environment that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {var}={value:?} is invalid: {reason}")]
pub struct EnvError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is expected.
    pub reason: String,
}

/// The command center could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Bound to a non-loopback address without a token: anyone who reaches the port could change the rules.
    #[error(
        "refusing to serve commands on {addr} without a token: set one with CommandCenterBuilder::token (or \
         SENTINEL_COMMAND_TOKEN), or bind to 127.0.0.1"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// No port could be bound.
    #[error("cannot bind the command server to {addr} (tried {tries} ports from there): {source}")]
    Bind {
        /// The first address tried.
        addr: SocketAddr,
        /// Ports tried.
        tries: u16,
        /// The last error.
        #[source]
        source: std::io::Error,
    },
    /// A dashboard address is unusable.
    #[error(transparent)]
    Dashboard(#[from] DashboardAddressError),
    /// The server's thread or runtime could not be created.
    #[error("cannot start the command server: {0}")]
    Io(#[from] std::io::Error),
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Configures a [`CommandCenter`]. See the [module docs](self).
#[derive(Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct CommandCenterBuilder {
    engine: Sentinel,
    bind: IpAddr,
    port: u16,
    token: Option<String>,
    token_for_reads: bool,
    allowed_peers: Vec<IpAddr>,
    trusted_peers: Vec<IpAddr>,
    allowed_hosts: Vec<String>,
    get_writes: bool,
    dashboards: String,
    advertise_ip: Option<IpAddr>,
    heartbeat_interval: Duration,
    app_type: u8,
    source: Option<Arc<dyn WritableDataSource>>,
    history_seconds: usize,
    command_qps: f64,
    limits: Limits,
    runtime: Option<tokio::runtime::Handle>,
}

impl CommandCenterBuilder {
    fn new(engine: &Sentinel) -> Self {
        CommandCenterBuilder {
            engine: engine.clone(),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: DEFAULT_PORT,
            token: None,
            token_for_reads: false,
            allowed_peers: Vec::new(),
            trusted_peers: Vec::new(),
            allowed_hosts: Vec::new(),
            get_writes: false,
            dashboards: String::new(),
            advertise_ip: None,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            app_type: 0,
            source: None,
            history_seconds: DEFAULT_HISTORY_SECONDS,
            command_qps: DEFAULT_COMMAND_QPS,
            limits: Limits {
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                max_connections: DEFAULT_MAX_CONNECTIONS,
                ..Limits::default()
            },
            runtime: None,
        }
    }

    /// Reads the environment over the current settings:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `SENTINEL_COMMAND_BIND` | address to bind (`0.0.0.0`, `10.1.2.3`, or with a port: `10.1.2.3:8719`) |
    /// | `SENTINEL_COMMAND_PORT` | port (0: any free port) |
    /// | `SENTINEL_COMMAND_TOKEN` | the token writes need |
    /// | `SENTINEL_COMMAND_ALLOW` | the only peers (IPs, comma-separated) that may connect |
    /// | `SENTINEL_COMMAND_TRUSTED` | peers (IPs, comma-separated) that need no token: the dashboard's address |
    /// | `SENTINEL_COMMAND_HOSTS` | host names (comma-separated) a server bound beyond loopback answers for |
    /// | `SENTINEL_COMMAND_GET_WRITES` | `true`: write commands by `GET` too (dashboards older than 1.6) |
    /// | `SENTINEL_COMMAND_WRITE_TIMEOUT_MS` | time a client has to take its answer |
    /// | `SENTINEL_DASHBOARD_SERVER` | dashboards to send heartbeats to: `host[:port]`, comma-separated, `http://` optional |
    /// | `SENTINEL_HEARTBEAT_CLIENT_IP` | the IP reported to the dashboard (containers, several interfaces) |
    /// | `SENTINEL_HEARTBEAT_INTERVAL_MS` | time between heartbeats |
    pub fn env(self) -> Result<Self, EnvError> {
        self.env_from(|var| std::env::var(var).ok())
    }

    /// [`env`](Self::env) with the variables from `get` (a test's own, say).
    fn env_from(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let env = |var: &'static str| get(var).filter(|v| !v.trim().is_empty());
        let bad = |var: &'static str, value: &str, reason: &str| EnvError {
            var,
            value: value.to_string(),
            reason: reason.to_string(),
        };
        if let Some(v) = env("SENTINEL_COMMAND_BIND") {
            if let Ok(addr) = v.trim().parse::<SocketAddr>() {
                self.bind = addr.ip();
                self.port = addr.port();
            } else {
                let ip = v.trim().trim_start_matches('[').trim_end_matches(']');
                self.bind = ip
                    .parse()
                    .map_err(|_| bad("SENTINEL_COMMAND_BIND", &v, "expected an IP address, optionally with :port"))?;
            }
        }
        if let Some(v) = env("SENTINEL_COMMAND_PORT") {
            self.port = v
                .trim()
                .parse()
                .map_err(|_| bad("SENTINEL_COMMAND_PORT", &v, "expected a port number (0 to 65535)"))?;
        }
        if let Some(v) = env("SENTINEL_COMMAND_TOKEN") {
            self.token = Some(v.trim().to_string());
        }
        let ips = |var: &'static str, v: &str| -> Result<Vec<IpAddr>, EnvError> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().map_err(|_| bad(var, v, "expected IP addresses, comma-separated")))
                .collect()
        };
        if let Some(v) = env("SENTINEL_COMMAND_ALLOW") {
            self.allowed_peers = ips("SENTINEL_COMMAND_ALLOW", &v)?;
        }
        if let Some(v) = env("SENTINEL_COMMAND_TRUSTED") {
            self.trusted_peers = ips("SENTINEL_COMMAND_TRUSTED", &v)?;
        }
        if let Some(v) = env("SENTINEL_COMMAND_HOSTS") {
            self.allowed_hosts = v.split(',').map(str::trim).filter(|h| !h.is_empty()).map(String::from).collect();
        }
        if let Some(v) = env("SENTINEL_COMMAND_GET_WRITES") {
            self.get_writes = match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => true,
                "false" | "0" | "no" | "off" => false,
                _ => return Err(bad("SENTINEL_COMMAND_GET_WRITES", &v, "expected true or false")),
            };
        }
        if let Some(v) = env("SENTINEL_COMMAND_WRITE_TIMEOUT_MS") {
            let ms: u64 = v.trim().parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                bad("SENTINEL_COMMAND_WRITE_TIMEOUT_MS", &v, "expected a number of milliseconds above 0")
            })?;
            self.limits.write_timeout = Duration::from_millis(ms);
        }
        if let Some(v) = env("SENTINEL_DASHBOARD_SERVER") {
            heartbeat::parse_dashboards(&v).map_err(|e| bad("SENTINEL_DASHBOARD_SERVER", &v, &e.reason))?;
            self.dashboards = v;
        }
        if let Some(v) = env("SENTINEL_HEARTBEAT_CLIENT_IP") {
            self.advertise_ip =
                Some(v.trim().parse().map_err(|_| bad("SENTINEL_HEARTBEAT_CLIENT_IP", &v, "expected an IP address"))?);
        }
        if let Some(v) = env("SENTINEL_HEARTBEAT_INTERVAL_MS") {
            let ms: u64 = v.trim().parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                bad("SENTINEL_HEARTBEAT_INTERVAL_MS", &v, "expected a number of milliseconds above 0")
            })?;
            self.heartbeat_interval = Duration::from_millis(ms);
        }
        Ok(self)
    }

    /// The address to listen on (default `127.0.0.1`). Anything but loopback needs a [`token`](Self::token).
    pub fn bind(mut self, ip: IpAddr) -> Self {
        self.bind = ip;
        self
    }

    /// The port (default 8719; 0 for any free port). If it is busy, the next ports are tried
    /// ([`PORT_TRIES`] in all); [`CommandCenter::local_addr`] tells the one bound.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// The token write commands need (`Authorization: Bearer <token>`); required off loopback.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Requires the token for every command and the console too, not only for writes.
    pub fn token_for_reads(mut self, on: bool) -> Self {
        self.token_for_reads = on;
        self
    }

    /// Lets `ip` connect; once one peer is allowed, every other is refused with `403` (list `127.0.0.1` too
    /// if local tools should still reach the server).
    pub fn allow_peer(mut self, ip: IpAddr) -> Self {
        self.allowed_peers.push(ip);
        self
    }

    /// Lets requests from `ip` run write commands without the token: the Sentinel Dashboard's address, since
    /// the dashboard cannot send one. Trust an address only where it cannot be spoofed (a private network).
    /// A quarter of the connection slots ([`max_connections_per_peer`](Self::max_connections_per_peer)) is
    /// then kept for trusted peers, so other peers cannot take every slot.
    pub fn trust_peer(mut self, ip: IpAddr) -> Self {
        self.trusted_peers.push(ip);
        self
    }

    /// A host name the server answers for when bound beyond loopback (the `Host` of a request), besides IP
    /// addresses, `localhost` and the machine's host name: a DNS name the server is reached by. Any other
    /// name gets `403`, reads included, which defeats DNS rebinding. On loopback only loopback names are
    /// answered, whatever is listed.
    pub fn allow_host(mut self, name: impl Into<String>) -> Self {
        self.allowed_hosts.push(name.into());
        self
    }

    /// Takes write commands by `GET` too (default: `POST` only; a `GET` write gets `405`). Only for
    /// Sentinel Dashboards older than 1.6, which put a push in the query string: any web page can make a
    /// browser send a `GET` to this address, and browsers without Fetch Metadata send no `Origin` with it,
    /// so turn it on only with a token (and the dashboard as a trusted peer) or on a machine without one.
    pub fn allow_get_writes(mut self, on: bool) -> Self {
        self.get_writes = on;
        self
    }

    /// Sends heartbeats to these dashboards: `host[:port]`, comma-separated, `http://` optional
    /// (Java's `csp.sentinel.dashboard.server`). Checked by [`start`](Self::start).
    pub fn dashboard(mut self, addresses: impl Into<String>) -> Self {
        self.dashboards = addresses.into();
        self
    }

    /// The IP reported to the dashboard, which it sends commands to. By default: the address bound if it
    /// is a specific one, else the address of the interface that routes to the dashboard.
    pub fn advertise_ip(mut self, ip: IpAddr) -> Self {
        self.advertise_ip = Some(ip);
        self
    }

    /// Time between heartbeats (default 10 s).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The application type reported to the dashboard (0, the default: common; 1: gateway).
    pub fn app_type(mut self, app_type: u8) -> Self {
        self.app_type = app_type;
        self
    }

    /// Writes rules pushed through `setRules` / `setParamFlowRules` back to this store: a rules file or
    /// directory ([`FileDataSource`](crate::datasource::FileDataSource)), Redis, ZooKeeper, etcd, or any
    /// [`WritableDataSource`] of your own.
    pub fn data_source(mut self, source: impl WritableDataSource) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Seconds of per-second history kept per resource (default [`DEFAULT_HISTORY_SECONDS`], at least
    /// [`MIN_HISTORY_SECONDS`]).
    pub fn history_seconds(mut self, seconds: usize) -> Self {
        self.history_seconds = seconds.max(MIN_HISTORY_SECONDS);
        self
    }

    /// Requests per second the server answers (its own flow rule on [`COMMAND_RESOURCE`]).
    pub fn command_qps(mut self, qps: f64) -> Self {
        self.command_qps = qps;
        self
    }

    /// The largest request body accepted (default 1 MiB).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_body_bytes = bytes;
        self
    }

    /// The most connections served at once (default 64).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.limits.max_connections = n.max(1);
        self
    }

    /// The most connections served at once for one peer address (an IPv6 /64 counts as one); default a
    /// quarter of [`max_connections`](Self::max_connections). Past it, that peer gets `503` while others are
    /// served. On loopback every local process is the same peer.
    pub fn max_connections_per_peer(mut self, n: usize) -> Self {
        self.limits.max_connections_per_peer = Some(n.max(1));
        self
    }

    /// The time a client has to send its request headers (default 5 s).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.limits.header_read_timeout = timeout;
        self
    }

    /// The time a request, its body included, may take (default 10 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.limits.request_timeout = timeout;
        self
    }

    /// The time a client has to take the whole answer, from its first byte (default 10 s, the Java
    /// dashboard's own read timeout): a client that stops reading is dropped and its connection slot freed.
    /// A connection lasts at most the header, request and write timeouts added up.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.limits.write_timeout = timeout;
        self
    }

    /// Runs the server on the application's tokio runtime instead of a thread of its own.
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Binds and starts serving (and sending heartbeats, if a dashboard is set).
    pub fn start(self) -> Result<CommandCenter, StartError> {
        let first = SocketAddr::new(self.bind, self.port);
        if !self.bind.is_loopback() && self.token.is_none() {
            return Err(StartError::TokenRequired { addr: first });
        }
        if let Some(t) = &self.token
            && t.len() < 16
        {
            tracing::warn!("the command center's token is shorter than 16 characters: it is easy to guess");
        }
        let dashboards = heartbeat::parse_dashboards(&self.dashboards)?;
        let listener = bind(first)?;
        let local = listener.local_addr()?;
        let ip = self
            .advertise_ip
            .or((!self.bind.is_unspecified()).then_some(self.bind))
            .unwrap_or_else(|| route_ip(dashboards.first()));
        let machine = MachineInfo {
            app: self.engine.config().app_name.clone(),
            app_type: self.app_type,
            hostname: gethostname::gethostname().to_string_lossy().into_owned(),
            ip: ip.to_string(),
            port: local.port(),
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let observer = format!("sentinel-command-center-{id}");
        let transitions = breakers::Transitions::attach(&self.engine, &observer);
        let write_back = match &self.source {
            Some(source) => Some(write_back::WriteBack::start(source.clone(), self.limits.request_timeout)?),
            None => None,
        };
        let center = Arc::new(Center {
            engine: self.engine.clone(),
            history: history::History::new(self.history_seconds, self.engine.config().max_resources),
            transitions,
            source: self.source,
            write_back,
            machine: machine.clone(),
            writes: Mutex::new(()),
        });
        let guard_engine = Sentinel::builder().clock_of(&self.engine).app_name("sentinel-command-center").build();
        if let Err(e) = guard_engine.load_flow_rules([FlowRule::new(COMMAND_RESOURCE).count(self.command_qps)]) {
            tracing::warn!(error = %e, "the command server's own flow rule is invalid; it is served unlimited");
        }
        let mut limits = self.limits;
        if !self.trusted_peers.is_empty() {
            limits.reserved_for_trusted = limits.per_peer();
        }
        let access = Arc::new(
            Access::new(self.token, self.token_for_reads, self.bind.is_loopback())
                .with_peers(self.allowed_peers, self.trusted_peers)
                .with_hosts(self.allowed_hosts)
                .with_get_writes(self.get_writes),
        );
        let classify = access.clone();
        limits.peers = PeerPolicy::new(move |peer| classify.classify(peer));
        let state = Arc::new(ServerState {
            center: center.clone(),
            access,
            guard: guard_engine.resource(COMMAND_RESOURCE),
            max_body_bytes: limits.max_body_bytes,
        });
        let router = Router::new().fallback(dispatch).with_state(state);

        let status = Arc::new(Mutex::new(HeartbeatStatus::default()));
        let mut tasks: Vec<crate::http_server::Task> = Vec::new();
        let sampled = center.clone();
        tasks.push(Box::pin(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // Reading every resource's seconds takes a while with thousands of them: off the event loop.
                let center = sampled.clone();
                let _ = tokio::task::spawn_blocking(move || center.history.sample(&center.engine)).await;
            }
        }));
        if !dashboards.is_empty() {
            let beat = heartbeat::Heartbeat {
                dashboards,
                interval: self.heartbeat_interval,
                machine,
                status: status.clone(),
                engine: self.engine.clone(),
            };
            tasks.push(Box::pin(beat.run()));
        }
        let runtime = match self.runtime {
            Some(h) => Runtime::Handle(h),
            None => Runtime::OwnThread("sentinel-command-center".into()),
        };
        let server = HttpServer::start(listener, router, limits, runtime, tasks)?;
        tracing::info!(addr = %server.local_addr(), "Sentinel command center listening");
        Ok(CommandCenter { server, center, observer, heartbeat: status })
    }
}

fn bind(first: SocketAddr) -> Result<std::net::TcpListener, StartError> {
    let tries = if first.port() == 0 { 1 } else { PORT_TRIES };
    let mut last = None;
    for k in 0..tries {
        let Some(port) = first.port().checked_add(k) else { break };
        match std::net::TcpListener::bind(SocketAddr::new(first.ip(), port)) {
            Ok(l) => {
                if k > 0 {
                    tracing::warn!(wanted = first.port(), bound = port, "command port busy: bound the next free one");
                }
                return Ok(l);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(StartError::Bind { addr: first, tries: k + 1, source: e }),
        }
    }
    let source = last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::AddrInUse, "no port left"));
    Err(StartError::Bind { addr: first, tries, source })
}

/// The local address of the interface that routes to the dashboard (a UDP socket is "connected", which sends
/// nothing), or to a public address; loopback when there is no route.
fn route_ip(dashboard: Option<&heartbeat::Dashboard>) -> IpAddr {
    let target = dashboard
        .and_then(|d| d.authority.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| SocketAddr::from(([8, 8, 8, 8], 80)));
    let probe = || -> std::io::Result<IpAddr> {
        let any: SocketAddr =
            if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        let socket = std::net::UdpSocket::bind(any)?;
        socket.connect(target)?;
        Ok(socket.local_addr()?.ip())
    };
    probe().ok().filter(|ip| !ip.is_unspecified()).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A running command center; dropping it stops the server and the heartbeats.
#[must_use = "dropping the command center stops it"]
pub struct CommandCenter {
    server: HttpServer,
    center: Arc<Center>,
    observer: String,
    heartbeat: Arc<Mutex<HeartbeatStatus>>,
}

impl std::fmt::Debug for CommandCenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandCenter").field("addr", &self.server.local_addr()).finish_non_exhaustive()
    }
}

impl CommandCenter {
    /// A builder for `engine`'s command center (defaults: `127.0.0.1:8719`, no token, no dashboard).
    pub fn builder(engine: &Sentinel) -> CommandCenterBuilder {
        CommandCenterBuilder::new(engine)
    }

    /// A builder configured from the environment (see [`CommandCenterBuilder::env`]).
    pub fn from_env(engine: &Sentinel) -> Result<CommandCenterBuilder, EnvError> {
        CommandCenterBuilder::new(engine).env()
    }

    /// The address and port the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The console's address.
    pub fn console_url(&self) -> String {
        format!("http://{}/", self.server.local_addr())
    }

    /// The IP reported to the dashboard.
    pub fn advertised_ip(&self) -> &str {
        &self.center.machine.ip
    }

    /// What the heartbeat sender has done so far.
    pub fn heartbeat_status(&self) -> HeartbeatStatus {
        self.heartbeat.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for CommandCenter {
    fn drop(&mut self) {
        self.center.engine.unregister_state_observer(&self.observer);
    }
}

struct ServerState {
    center: Arc<Center>,
    access: Arc<Access>,
    guard: Resource,
    max_body_bytes: usize,
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = plain(status, body);
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    respond(status, "text/plain; charset=utf-8", body.into())
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Every request: the server's own flow rule, then the console's files or a command.
async fn dispatch(
    State(s): State<Arc<ServerState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    started: Option<axum::Extension<crate::http_server::RequestStarted>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if s.guard.enter().is_err() {
        let mut r = text(
            StatusCode::TOO_MANY_REQUESTS,
            format!("Too many requests: the command server answers at most its flow rule's count per second (resource `{COMMAND_RESOURCE}`)"),
        );
        r.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    }
    let name = uri.path().strip_prefix('/').unwrap_or(uri.path());
    if (method == Method::GET || method == Method::HEAD)
        && let Some((content_type, content)) = console::asset(name)
    {
        // The page's own files hold no data and need no token (a browser cannot send one when it opens
        // a page): the page asks for the token when a command needs it. The host check still applies.
        if let Err(denied) = s.access.check_peer(peer.ip()).and_then(|()| s.access.check_host(&headers)) {
            return denied_response(&denied);
        }
        let mut r = respond(StatusCode::OK, content_type, content.to_string());
        let h = r.headers_mut();
        h.insert(HeaderName::from_static("content-security-policy"), HeaderValue::from_static(CSP));
        h.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
        h.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
        return r;
    }
    #[cfg(feature = "prometheus")]
    if name == "metrics" && (method == Method::GET || method == Method::HEAD) {
        // Prometheus scrapes the command port too: a read, with the same access rules as the other reads.
        if let Err(denied) = s.access.check(&headers, peer.ip(), &method, false) {
            return denied_response(&denied);
        }
        let engine = s.center.engine.clone();
        return match tokio::task::spawn_blocking(move || crate::exporter::render(&engine)).await {
            Ok(body) => respond(StatusCode::OK, crate::exporter::CONTENT_TYPE, body),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("rendering failed: {e}")),
        };
    }
    if name.trim().is_empty() {
        return text(StatusCode::BAD_REQUEST, "Invalid command");
    }
    let Some(command) = find_command(name) else {
        let shown: String = name.chars().take(200).collect();
        return text(StatusCode::BAD_REQUEST, format!("Unknown command `{shown}`"));
    };
    if let Err(denied) = s.access.check(&headers, peer.ip(), &method, command.write) {
        return denied_response(&denied);
    }
    let mut params = Params::default();
    if let Some(q) = uri.query() {
        params.add_form(q);
    }
    let body = match body {
        Ok(b) => b,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, crate::http_server::too_large(s.max_body_bytes));
        }
        Err(rejection) => {
            return text(StatusCode::BAD_REQUEST, format!("Could not read the request body: {rejection}"))
        }
    };
    let post = method == Method::POST;
    // Java's `HttpEventTask`: a POST's content type is checked first (415), then its length: a POST without a
    // body (no Content-Length, or 0) gets 411, whatever the command. A chunked body is taken too.
    if (post || !body.is_empty())
        && let Some(ct) = headers.get(CONTENT_TYPE)
    {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        if !ct.contains("application/x-www-form-urlencoded") {
            return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Only form-encoded post request is supported");
        }
    }
    if post && body.is_empty() {
        return text(StatusCode::LENGTH_REQUIRED, "No legal Content-Length");
    }
    if !body.is_empty() {
        match std::str::from_utf8(&body) {
            Ok(form) => params.add_form(form),
            Err(_) => return text(StatusCode::BAD_REQUEST, "The request body is not UTF-8"),
        }
    }
    let center = s.center.clone();
    let run = command.run;
    // Commands read and write files (the metric log, the rules file): off the server's event loop.
    // A push's write-back waits within the request's own time, from its start.
    let started = started.map_or_else(std::time::Instant::now, |e| e.0 .0);
    match tokio::task::spawn_blocking(move || write_back::within_request(started, || run(&center, &params))).await {
        Ok(Ok(reply)) => {
            let content_type = if reply.json { "application/json; charset=utf-8" } else { "text/plain; charset=utf-8" };
            let mut r = respond(StatusCode::OK, content_type, reply.body);
            if let Some(e) = reply.write_error.and_then(|e| HeaderValue::from_str(&e.replace(['\r', '\n'], " ")).ok()) {
                r.headers_mut().insert(HeaderName::from_static("x-sentinel-write-error"), e);
            }
            r
        }
        Ok(Err(CommandError(message))) => text(StatusCode::BAD_REQUEST, message),
        Err(e) => {
            tracing::error!(command = command.name, error = %e, "command failed unexpectedly");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error: the command failed unexpectedly; see the application's log",
            )
        }
    }
}

fn denied_response(denied: &security::Denied) -> Response {
    match denied {
        security::Denied::Unauthorized { .. } => {
            let mut r = text(StatusCode::UNAUTHORIZED, denied.message());
            r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
        security::Denied::WriteNeedsPost { get_allowed, .. } => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, denied.message());
            let allow = if *get_allowed { "GET, POST" } else { "POST" };
            r.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static(allow));
            r
        }
        _ => text(StatusCode::FORBIDDEN, denied.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<CommandCenterBuilder, EnvError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        CommandCenterBuilder::new(&Sentinel::builder().build())
            .env_from(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_environment_configures_bind_port_token_dashboards_and_heartbeats() {
        let b = from(&[
            ("SENTINEL_COMMAND_BIND", "0.0.0.0"),
            ("SENTINEL_COMMAND_PORT", "9000"),
            ("SENTINEL_COMMAND_TOKEN", " secret-token-123456 "),
            ("SENTINEL_DASHBOARD_SERVER", "http://10.0.0.5:8080,dash:8081"),
            ("SENTINEL_HEARTBEAT_CLIENT_IP", "10.1.2.3"),
            ("SENTINEL_HEARTBEAT_INTERVAL_MS", "2500"),
            ("SENTINEL_COMMAND_ALLOW", "10.0.0.5, 127.0.0.1"),
            ("SENTINEL_COMMAND_TRUSTED", "10.0.0.5"),
            ("SENTINEL_COMMAND_HOSTS", "sentinel.internal, app-1.svc"),
            ("SENTINEL_COMMAND_GET_WRITES", "TRUE"),
            ("SENTINEL_COMMAND_WRITE_TIMEOUT_MS", "1500"),
        ])
        .unwrap();
        assert_eq!((b.bind, b.port), ("0.0.0.0".parse::<IpAddr>().unwrap(), 9000));
        assert_eq!(b.token.as_deref(), Some("secret-token-123456"));
        assert_eq!(b.dashboards, "http://10.0.0.5:8080,dash:8081");
        assert_eq!(b.advertise_ip, Some("10.1.2.3".parse().unwrap()));
        assert_eq!(b.heartbeat_interval, Duration::from_millis(2500));
        assert_eq!(b.allowed_peers, ["10.0.0.5".parse::<IpAddr>().unwrap(), "127.0.0.1".parse().unwrap()]);
        assert_eq!(b.trusted_peers, ["10.0.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(b.allowed_hosts, ["sentinel.internal", "app-1.svc"]);
        assert!(b.get_writes);
        assert_eq!(b.limits.write_timeout, Duration::from_millis(1500));
        let b = from(&[("SENTINEL_COMMAND_BIND", "[::1]:7000")]).unwrap();
        assert_eq!((b.bind, b.port), ("::1".parse::<IpAddr>().unwrap(), 7000));
        let b = from(&[]).unwrap();
        assert_eq!((b.bind, b.port), (IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT));
        assert!(!b.get_writes, "writes by POST only unless asked");
        assert_eq!(b.limits.write_timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_bad_variable_is_a_typed_error_naming_it() {
        for (var, value) in [
            ("SENTINEL_COMMAND_BIND", "localhost"),
            ("SENTINEL_COMMAND_PORT", "99999"),
            ("SENTINEL_DASHBOARD_SERVER", "https://dash:8080"),
            ("SENTINEL_HEARTBEAT_CLIENT_IP", "my-host"),
            ("SENTINEL_HEARTBEAT_INTERVAL_MS", "0"),
            ("SENTINEL_COMMAND_TRUSTED", "10.0.0.5,dashboard"),
            ("SENTINEL_COMMAND_GET_WRITES", "sometimes"),
            ("SENTINEL_COMMAND_WRITE_TIMEOUT_MS", "0"),
        ] {
            let e = from(&[(var, value)]).unwrap_err();
            assert_eq!((e.var, e.value.as_str()), (var, value), "{e}");
            assert!(e.to_string().contains(var), "{e}");
        }
    }
}
