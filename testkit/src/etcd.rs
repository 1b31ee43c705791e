//! A real `etcd` for a test: its own client and peer ports and data directory, stopped when dropped. A
//! restart keeps the data (the directory stays), as a real etcd that was down for a while.

use crate::{free_port, require_program, temp_dir, Server};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

/// An `etcd` started by a test.
#[derive(Debug)]
pub struct EtcdServer {
    program: PathBuf,
    server: Option<Server>,
    data: tempfile::TempDir,
    port: u16,
    peer_port: u16,
}

impl EtcdServer {
    /// Starts `etcd` on free client and peer ports; `None` (after a printed notice) when it is not installed.
    pub fn start(test: &str) -> Option<EtcdServer> {
        let program = require_program("etcd", test)?;
        let mut e = EtcdServer { program, server: None, data: temp_dir(), port: free_port(), peer_port: free_port() };
        e.launch();
        Some(e)
    }

    fn launch(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&self.program);
        cmd.arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(self.data.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}"), "--initial-cluster-state", "new"])
            .args(["--log-level", "warn"])
            // The Debian package reads settings from ETCD_* variables: keep the test's own.
            .env_remove("ETCD_DATA_DIR")
            .env_remove("ETCD_NAME");
        let addr = self.addr();
        self.server = Some(Server::start("etcd", cmd, temp_dir(), addr));
    }

    /// Its client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL); its data stays for [`restart`](Self::restart).
    pub fn kill(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill_and_output();
        }
    }

    /// Starts the server again on the same ports with the same data.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}
