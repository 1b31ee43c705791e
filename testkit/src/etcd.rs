//! A real `etcd` for a test: its own client and peer ports and data directory, stopped when dropped. A
//! restart keeps the data (the directory stays), as a real etcd that was down for a while.

use crate::{free_port, require_program, temp_dir, Launch, LocalServer};
use std::path::PathBuf;
use std::process::Command;

/// An `etcd` started by a test.
pub type EtcdServer = LocalServer<Etcd>;

/// The etcd kind of [`LocalServer`]: the program, the data directory and the peer port.
#[derive(Debug)]
pub struct Etcd {
    program: PathBuf,
    data: tempfile::TempDir,
    peer_port: u16,
}

impl Launch for Etcd {
    const NAME: &'static str = "etcd";

    fn command(&self, port: u16) -> Command {
        let client = format!("http://127.0.0.1:{port}");
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
        cmd
    }
}

impl EtcdServer {
    /// Starts `etcd` on free client and peer ports; `None` (after a printed notice) when it is not installed.
    pub fn start(test: &str) -> Option<EtcdServer> {
        let program = require_program("etcd", test)?;
        Some(LocalServer::launch(Etcd { program, data: temp_dir(), peer_port: free_port() }))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }
}
