//! A real ZooKeeper server for a test, from Debian's `zookeeperd` package: its jar run directly by `java`
//! (not the system service) with a configuration of its own in a temporary directory, on a free port. A
//! restart keeps the data (the directory stays), as a real server that was down for a while.

use crate::{free_port, require_program, temp_dir, Server};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's `zookeeper` package puts the server's jar.
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A ZooKeeper server started by a test.
#[derive(Debug)]
pub struct ZookeeperServer {
    java: PathBuf,
    server: Option<Server>,
    data: tempfile::TempDir,
    port: u16,
}

impl ZookeeperServer {
    /// Starts ZooKeeper on a free port; `None` (after a printed notice) when `java` or the jar is missing.
    pub fn start(test: &str) -> Option<ZookeeperServer> {
        let java = require_program("java", test)?;
        if !Path::new(ZOOKEEPER_JAR).is_file() {
            if crate::in_ci() {
                panic!("{test}: {ZOOKEEPER_JAR} is missing, and CI=true requires it (run scripts/test)");
            }
            eprintln!("SKIPPED {test}: {ZOOKEEPER_JAR} is missing (package zookeeperd; scripts/test installs it)");
            return None;
        }
        let mut z = ZookeeperServer { java, server: None, data: temp_dir(), port: free_port() };
        z.launch();
        Some(z)
    }

    fn launch(&mut self) {
        let dir = self.data.path();
        // tickTime 200 ms: sessions may be as short as 400 ms, so a test can see one expire quickly.
        let config = format!(
            "tickTime=200\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxClientCnxns=0\n",
            dir.join("data").display(),
            self.port
        );
        let cfg = dir.join("zoo.cfg");
        std::fs::write(&cfg, config).expect("write zoo.cfg");
        let mut cmd = Command::new(&self.java);
        cmd.args(["-Xmx128m", "-XX:+UseSerialGC", "-cp", ZOOKEEPER_JAR])
            .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&cfg);
        let addr = self.addr();
        self.server = Some(Server::start("zookeeper", cmd, temp_dir(), addr));
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `127.0.0.1:PORT`, as ZooKeeper clients take it.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL); its data stays for [`restart`](Self::restart).
    pub fn kill(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill_and_output();
        }
    }

    /// Starts the server again on the same port with the same data.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}
