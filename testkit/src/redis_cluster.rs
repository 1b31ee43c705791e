//! A real three-master Redis Cluster for a test (three `redis-server --cluster-enabled yes` on free ports,
//! joined by `redis-cli --cluster create`), and a real Redis Sentinel setup (a master, a replica, three
//! `redis-server --sentinel`). Each process has its own port and directory; all stop when dropped.

use crate::redis::RedisServer;
use crate::{free_port, require_program, temp_dir, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `redis-cli -p PORT args...` and returns what it printed (stdout), trimmed.
fn run_cli(program: &PathBuf, port: u16, args: &[&str]) -> String {
    run_cli_as(program, port, None, args)
}

/// [`run_cli`] with the default user's password, if any.
fn run_cli_as(program: &PathBuf, port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new(program);
    if let Some(p) = password {
        cmd.env("REDISCLI_AUTH", p);
    }
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Polls `cond` every 50 ms until it holds, at most `timeout` (waiting for servers to reach a state,
/// never for time to pass).
fn poll(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A three-master Redis Cluster (no replicas) started by a test. Every node runs with
/// `cluster-require-full-coverage no` (a shard down leaves the others serving) and a node timeout of one
/// second.
#[derive(Debug)]
pub struct RedisClusterServers {
    cli: PathBuf,
    /// The nodes (their cluster state files live in `state`, so that a restarted node rejoins).
    nodes: Vec<RedisServer>,
    _state: tempfile::TempDir,
}

impl RedisClusterServers {
    /// Starts the three nodes and creates the cluster; `None` (after a printed notice) when `redis-server`
    /// or `redis-cli` is not installed. Panics if the cluster does not form within 30 s.
    pub fn start(test: &str) -> Option<RedisClusterServers> {
        Self::start_with_replicas(test, 0)
    }

    /// Starts three masters (nodes 0, 1, 2: `redis-cli --cluster create` makes the first nodes the masters)
    /// and `replicas` replicas of each (the nodes after them); a replica is promoted when its master fails
    /// to answer for a node timeout (one second).
    pub fn start_with_replicas(test: &str, replicas: usize) -> Option<RedisClusterServers> {
        require_program("redis-server", test)?;
        let cli = require_program("redis-cli", test)?;
        let state = temp_dir();
        let mut nodes = Vec::new();
        for i in 0..3 * (1 + replicas) {
            let conf = state.path().join(format!("nodes-{i}.conf"));
            let conf = conf.to_string_lossy().to_string();
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                conf.as_str(),
                "--cluster-node-timeout",
                "1000",
                "--cluster-require-full-coverage",
                "no",
                "--repl-diskless-sync-delay",
                "0",
            ];
            nodes.push(RedisServer::start_with(test, &args)?);
        }
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        let replicas = replicas.to_string();
        args.extend(["--cluster-replicas", replicas.as_str(), "--cluster-yes"]);
        let out = run_cli(&cli, nodes[0].addr().port(), &args);
        let cluster = RedisClusterServers { cli, nodes, _state: state };
        assert!(cluster.wait_ok(Duration::from_secs(30)), "the Redis Cluster did not form: {out}");
        // Replicas in sync with their masters (one that never synced cannot be promoted).
        let synced = poll(Duration::from_secs(30), || {
            cluster.nodes.iter().all(|n| {
                let info = run_cli(&cluster.cli, n.addr().port(), &["info", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
        assert!(synced, "the replicas did not sync with their masters");
        Some(cluster)
    }

    /// Waits until every running node says `cluster_state:ok` and knows every slot's owner.
    pub fn wait_ok(&self, timeout: Duration) -> bool {
        poll(timeout, || {
            self.nodes.iter().filter(|n| n.pid() != 0).all(|n| {
                let info = run_cli(&self.cli, n.addr().port(), &["cluster", "info"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384")
            })
        })
    }

    /// The nodes' URLs (`redis://127.0.0.1:PORT`), in creation order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// The index of the node that owns `key`'s slot (asked of the cluster: `CLUSTER KEYSLOT` and each
    /// node's own slots).
    pub fn owner_of(&self, key: &str) -> Option<usize> {
        let port = self.nodes.iter().find(|n| n.pid() != 0)?.addr().port();
        let slot: u16 = run_cli(&self.cli, port, &["cluster", "keyslot", key]).parse().ok()?;
        let nodes = run_cli(&self.cli, port, &["cluster", "nodes"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges...>
            let Some(addr) = fields.get(1).and_then(|a| a.split('@').next()) else { continue };
            let owns = fields.iter().skip(8).any(|range| {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
            });
            if owns {
                return self.nodes.iter().position(|n| n.addr().to_string() == addr);
            }
        }
        None
    }

    /// Whether node `i` is a master now (`ROLE`, asked of the node itself).
    pub fn is_master(&self, i: usize) -> bool {
        run_cli(&self.cli, self.nodes[i].addr().port(), &["role"]).starts_with("master")
    }

    /// Freezes node `i` (SIGSTOP): its connections stay open and nothing answers, as a hung server.
    pub fn pause(&self, i: usize) {
        self.nodes[i].pause();
    }

    /// Kills node `i` (SIGKILL): its shard has no master until [`restart`](Self::restart).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again on its port with its cluster state (its id and slots; its data is gone) and
    /// waits until the cluster is whole again.
    pub fn restart(&mut self, i: usize) -> bool {
        self.nodes[i].restart();
        self.wait_ok(Duration::from_secs(30))
    }
}

/// A master, a replica and three sentinels that monitor the master as [`MASTER_NAME`], with a failure
/// detected after [`DOWN_AFTER_MS`] and a failover timeout of three seconds.
#[derive(Debug)]
pub struct RedisSentinelServers {
    cli: PathBuf,
    /// The master at start.
    pub master: RedisServer,
    /// Its replica at start.
    pub replica: RedisServer,
    sentinels: Vec<Server>,
    /// The password of the master and the replica (their default user), if any.
    password: Option<String>,
}

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "testmaster";
/// How long a master must fail to answer before the sentinels consider it down (ms).
pub const DOWN_AFTER_MS: u64 = 1000;

impl RedisSentinelServers {
    /// Starts the master, its replica (waiting until it is in sync) and three sentinels (waiting until they
    /// know each other and can reach their quorum of two); `None` (after a printed notice) when
    /// `redis-server` or `redis-cli` is not installed.
    pub fn start(test: &str) -> Option<RedisSentinelServers> {
        Self::start_with(test, None, &[])
    }

    /// As [`start`](Self::start), the master and the replica requiring `password` of their default user
    /// (`requirepass`; the replica and the sentinels are given it: `masterauth`, `sentinel auth-pass`), and
    /// both started with the `extra` arguments too (an ACL user: `["--user", "app", "on", ">pw", "~*", "&*",
    /// "+@all"]`).
    pub fn start_with_password(test: &str, password: &str, extra: &[&str]) -> Option<RedisSentinelServers> {
        Self::start_with(test, Some(password), extra)
    }

    fn start_with(test: &str, password: Option<&str>, extra: &[&str]) -> Option<RedisSentinelServers> {
        let program = require_program("redis-server", test)?;
        let cli = require_program("redis-cli", test)?;
        let mut auth: Vec<&str> = Vec::new();
        if let Some(p) = password {
            auth.extend(["--requirepass", p, "--masterauth", p]);
        }
        auth.extend(extra);
        let master = RedisServer::start_with(test, &auth)?;
        let mport = master.addr().port().to_string();
        let mut args = auth.clone();
        args.extend(["--replicaof", "127.0.0.1", &mport]);
        let replica = RedisServer::start_with(test, &args)?;
        let synced = poll(Duration::from_secs(20), || {
            run_cli_as(&cli, replica.addr().port(), password, &["info", "replication"])
                .contains("master_link_status:up")
        });
        assert!(synced, "the replica did not sync with its master");
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = temp_dir();
            let conf = dir.path().join("sentinel.conf");
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {mport} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n"
            );
            if let Some(p) = password {
                text.push_str(&format!("sentinel auth-pass {MASTER_NAME} {p}\n"));
            }
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let mut cmd = Command::new(&program);
            cmd.arg(&conf).arg("--sentinel");
            sentinels.push(Server::start("redis-sentinel", cmd, dir, SocketAddr::from(([127, 0, 0, 1], port))));
        }
        let setup = RedisSentinelServers { cli, master, replica, sentinels, password: password.map(str::to_string) };
        let ready = poll(Duration::from_secs(30), || {
            setup.sentinels.iter().all(|s| {
                let port = s.addr.port();
                run_cli(&setup.cli, port, &["sentinel", "ckquorum", MASTER_NAME]).starts_with("OK 3")
                    && run_cli(&setup.cli, port, &["sentinel", "replicas", MASTER_NAME]).contains("slave")
            })
        });
        assert!(ready, "the sentinels did not find each other and the replica within 30 s");
        Some(setup)
    }

    /// The sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| format!("redis://{}", s.addr)).collect()
    }

    /// The port of the master the sentinels name now.
    pub fn master_port(&self) -> Option<u16> {
        let port = self.sentinels.first()?.addr.port();
        let out = run_cli(&self.cli, port, &["sentinel", "get-master-addr-by-name", MASTER_NAME]);
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until the sentinels name the replica as the master (after the master was killed), at most
    /// `timeout`; returns whether they did.
    pub fn wait_failover(&self, timeout: Duration) -> bool {
        let replica = self.replica.addr().port();
        poll(timeout, || self.master_port() == Some(replica))
            && poll(timeout, || {
                run_cli_as(&self.cli, replica, self.password.as_deref(), &["info", "replication"])
                    .contains("role:master")
            })
    }
}
