//! A real `redis-server` for a test: its own port and directory, no persistence, stopped when dropped.

use crate::{require_program, Launch, LocalServer};
use std::path::PathBuf;
use std::process::Command;

/// A `redis-server` started by a test. A restart starts a fresh, empty one on the same port.
pub type RedisServer = LocalServer<Redis>;

/// The Redis kind of [`LocalServer`]: the program and the test's extra arguments.
#[derive(Debug)]
pub struct Redis {
    program: PathBuf,
    extra: Vec<String>,
}

impl Launch for Redis {
    const NAME: &'static str = "redis-server";

    fn command(&self, port: u16) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(&self.extra);
        cmd
    }
}

impl RedisServer {
    /// Starts `redis-server` on a free port; `None` (after a printed notice) when it is not installed.
    pub fn start(test: &str) -> Option<RedisServer> {
        Self::start_with(test, &[])
    }

    /// Starts it with extra arguments (`["--requirepass", "secret"]`, ...).
    pub fn start_with(test: &str, args: &[&str]) -> Option<RedisServer> {
        let program = require_program("redis-server", test)?;
        Some(LocalServer::launch(Redis { program, extra: args.iter().map(|a| a.to_string()).collect() }))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }
}
