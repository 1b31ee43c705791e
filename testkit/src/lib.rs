//! Test support for sentinel-rs: find the real external programs a test needs (`redis-server` alone, as a
//! cluster or behind Sentinel, `redis-cli`, `etcd`, ZooKeeper, `chromedriver`, `prometheus`, `promtool`,
//! `valgrind`), start them on a port and in a directory of the test's own, and stop them when the test ends.
//!
//! A program that is missing skips the test with a printed notice; with `CI=true` in the environment a
//! missing program is a failure instead (the project's test command, `scripts/test`, installs them).
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod etcd;
pub mod http;
pub mod logs;
pub mod redis;
pub mod redis_cluster;
pub mod relay;
pub mod zookeeper;

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the tests run in CI (`CI=true`): then every external program is required.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The path of the program `name` on `PATH` (or in `/usr/sbin`, `/usr/bin`), if installed.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The program `name`, which `test` needs. Missing: `None` after a printed notice (the caller returns and the
/// test counts as passed), or a panic when [`in_ci`] (CI must run every test).
pub fn require_program(name: &str, test: &str) -> Option<PathBuf> {
    match find_program(name) {
        Some(p) => Some(p),
        None if in_ci() => panic!("{test}: `{name}` is not installed, and CI=true requires it (run scripts/test)"),
        None => {
            eprintln!(
                "SKIPPED {test}: `{name}` is not installed (scripts/test installs it; CI=true makes this a failure)"
            );
            None
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server a test starts on it.
///
/// Taken from 10000–19999, below the kernel's ephemeral range (from which every `bind(0)` and outgoing
/// connection takes its port), in turn from a place that depends on the process: between this check and the
/// server's own bind, nothing else in this process takes it. (The kernel's own choice, released and then
/// bound by the server, could go to a listener another test bound on port 0 in between: the server then
/// failed to start while a connection to the port succeeded.) A Redis Cluster node's bus, 10000 above its
/// port, stays below the ephemeral range and out of this one. Falls back to the kernel's choice when none is
/// free.
pub fn free_port() -> u16 {
    const LOW: u32 = 10_000;
    const SPAN: u32 = 10_000;
    let span = SPAN.min(ephemeral_low().saturating_sub(LOW + SPAN)).max(1_000);
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        start,
        std::sync::atomic::Ordering::Relaxed,
        std::sync::atomic::Ordering::Relaxed,
    );
    for _ in 0..span {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span;
        let port = (LOW + n) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Waits until something accepts TCP connections at `addr`, polling every 10 ms; false after `timeout`.
/// (This waits for a server to start, never for time to pass.)
pub fn wait_for_tcp(addr: SocketAddr, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A child process that is killed (and reaped) when dropped, with a temporary directory of its own.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    /// The server's own directory (removed when the server is dropped).
    pub dir: tempfile::TempDir,
    /// The address it listens on.
    pub addr: SocketAddr,
    name: String,
}

impl Server {
    /// Starts `cmd` (whose working directory becomes a fresh temporary directory when `cwd` is not set) and
    /// waits until it accepts connections on `addr`. Panics with the program's output if it does not.
    pub fn start(name: &str, mut cmd: Command, dir: tempfile::TempDir, addr: SocketAddr) -> Server {
        cmd.current_dir(dir.path()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("could not start {name}: {e}"));
        let mut server = Server { child: Some(child), dir, addr, name: name.to_string() };
        if !wait_for_tcp(addr, Duration::from_secs(20)) {
            let out = server.kill_and_output();
            panic!("{name} did not listen on {addr} within 20 s; its output:\n{out}");
        }
        server
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends a signal to the process (`"STOP"`, `"CONT"`, `"KILL"`, ...), through `kill(1)`.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) the process, and waits until the kernel shows it stopped or
    /// running: the signal takes effect after `kill` returns, and a request already on its way could otherwise
    /// be answered after the pause. Panics, saying why, when the signal cannot be sent or does not take effect
    /// within 10 s.
    pub fn set_stopped(&self, stopped: bool) {
        let (sig, pid) = (if stopped { "STOP" } else { "CONT" }, self.pid());
        match Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status() {
            Ok(s) if s.success() => {}
            other => panic!("{}: `kill -{sig} {pid}` failed: {other:?}", self.name),
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = process_state(pid);
            if state.map(|c| c == 'T' || c == 't') == Some(stopped) {
                return;
            }
            assert!(Instant::now() < deadline, "{} (pid {pid}) is in state {state:?} 10 s after SIG{sig}", self.name);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills the process and returns what it printed.
    pub fn kill_and_output(&mut self) -> String {
        let Some(mut child) = self.child.take() else { return String::new() };
        self.signal("CONT");
        let _ = child.kill();
        let _ = child.wait();
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }

    /// The server's name (for messages).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_and_output();
    }
}

/// What differs between the kinds of [`LocalServer`]: the program, its arguments and its data.
pub trait Launch: std::fmt::Debug {
    /// The server's name, for messages.
    const NAME: &'static str;
    /// The command that starts the server listening on `127.0.0.1:port`.
    fn command(&self, port: u16) -> Command;
}

/// A server of kind `K` on a free port of its own, which a test can kill, freeze and start again on that
/// port; stopped when dropped. [`etcd::EtcdServer`], [`zookeeper::ZookeeperServer`] and
/// [`redis::RedisServer`] are such servers.
#[derive(Debug)]
pub struct LocalServer<K> {
    kind: K,
    port: u16,
    server: Option<Server>,
}

impl<K: Launch> LocalServer<K> {
    /// Starts a server of kind `kind` on a free port and waits until it accepts connections.
    pub fn launch(kind: K) -> Self {
        let mut s = LocalServer { kind, port: free_port(), server: None };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let cmd = self.kind.command(self.port);
        self.server = Some(Server::start(K::NAME, cmd, temp_dir(), self.addr()));
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Freezes the server (SIGSTOP; returned once it is stopped): connections stay open, nothing answers, as a
    /// hung server.
    pub fn pause(&self) {
        if let Some(s) = &self.server {
            s.set_stopped(true);
        }
    }

    /// Resumes a paused server (SIGCONT; returned once it runs).
    pub fn resume(&self) {
        if let Some(s) = &self.server {
            s.set_stopped(false);
        }
    }

    /// Kills the server (SIGKILL); [`restart`](Self::restart) starts it again on the same port. What it
    /// keeps is its kind's: etcd and ZooKeeper keep their data directory, Redis keeps nothing.
    pub fn kill(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill_and_output();
        }
    }

    /// Starts the server again on the same port (with the data its kind keeps, see [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The server's process id (0 when killed).
    pub fn pid(&self) -> u32 {
        self.server.as_ref().map_or(0, Server::pid)
    }
}

/// A fresh temporary directory.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("create a temporary directory")
}

/// The state letter of process `pid` (`R`, `S`, `T`, ...: `/proc/<pid>/stat`'s third field), if it can be read.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (second field) is in parentheses and may hold spaces: the state follows the last `)`.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}
