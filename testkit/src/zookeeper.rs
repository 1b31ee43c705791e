//! A real ZooKeeper server for a test, from Debian's `zookeeperd` package: its jar run directly by `java`
//! (not the system service) with a configuration of its own in a temporary directory, on a free port. A
//! restart keeps the data (the directory stays), as a real server that was down for a while.

use crate::{require_program, temp_dir, Launch, LocalServer};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's `zookeeper` package puts the server's jar.
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A ZooKeeper server started by a test.
pub type ZookeeperServer = LocalServer<Zookeeper>;

/// The ZooKeeper kind of [`LocalServer`]: `java` and the data directory.
#[derive(Debug)]
pub struct Zookeeper {
    java: PathBuf,
    data: tempfile::TempDir,
}

impl Launch for Zookeeper {
    const NAME: &'static str = "zookeeper";

    fn command(&self, port: u16) -> Command {
        let dir = self.data.path();
        // tickTime 200 ms: sessions may be as short as 400 ms, so a test can see one expire quickly.
        let config = format!(
            "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxClientCnxns=0\n",
            dir.join("data").display(),
        );
        let cfg = dir.join("zoo.cfg");
        std::fs::write(&cfg, config).expect("write zoo.cfg");
        let mut cmd = Command::new(&self.java);
        cmd.args(["-Xmx128m", "-XX:+UseSerialGC", "-cp", ZOOKEEPER_JAR])
            .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&cfg);
        cmd
    }
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
        Some(LocalServer::launch(Zookeeper { java, data: temp_dir() }))
    }

    /// `127.0.0.1:PORT`, as ZooKeeper clients take it.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }
}
