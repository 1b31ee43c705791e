//! A real `redis-server` for a test: its own port and directory, no persistence, stopped when dropped.

use crate::{free_port, require_program, temp_dir, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

/// A `redis-server` started by a test.
#[derive(Debug)]
pub struct RedisServer {
    program: PathBuf,
    server: Option<Server>,
    port: u16,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts `redis-server` on a free port; `None` (after a printed notice) when it is not installed.
    pub fn start(test: &str) -> Option<RedisServer> {
        Self::start_with(test, &[])
    }

    /// Starts it with extra arguments (`["--requirepass", "secret"]`, ...).
    pub fn start_with(test: &str, args: &[&str]) -> Option<RedisServer> {
        let program = require_program("redis-server", test)?;
        let mut r = RedisServer {
            program,
            server: None,
            port: free_port(),
            extra: args.iter().map(|a| a.to_string()).collect(),
        };
        r.launch();
        Some(r)
    }

    fn launch(&mut self) {
        let mut cmd = Command::new(&self.program);
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(&self.extra);
        let addr = self.addr();
        self.server = Some(Server::start("redis-server", cmd, temp_dir(), addr));
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers, as a hung server.
    pub fn pause(&self) {
        if let Some(s) = &self.server {
            s.signal("STOP");
        }
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        if let Some(s) = &self.server {
            s.signal("CONT");
        }
    }

    /// Kills the server (SIGKILL); [`restart`](Self::restart) starts a fresh one on the same port.
    pub fn kill(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill_and_output();
        }
    }

    /// Starts the server again on the same port (empty: it keeps no data).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// The server's process id (0 when killed).
    pub fn pid(&self) -> u32 {
        self.server.as_ref().map_or(0, Server::pid)
    }
}
