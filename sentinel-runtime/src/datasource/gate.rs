//! Test-only stopping points of a data source's session, shared by the remote sources (etcd, ZooKeeper, Redis).

use std::sync::Mutex;

/// Test-only stopping points of a source's session (its reads): an armed point stops the next one to reach it,
/// tells the test, and waits until the test lets it go (the source's runtime runs on meanwhile, so a write-back
/// can be answered while a read is stopped).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    pub(crate) armed: Mutex<Vec<&'static str>>,
    pub(crate) stopped: Mutex<Option<std::sync::mpsc::Sender<&'static str>>>,
    pub(crate) go: tokio::sync::Notify,
}

impl Gate {
    pub(crate) async fn stop(&self, point: &'static str) {
        let armed = {
            let mut armed = self.armed.lock().unwrap();
            armed.iter().position(|p| *p == point).map(|at| armed.remove(at)).is_some()
        };
        if armed {
            if let Some(tell) = &*self.stopped.lock().unwrap() {
                let _ = tell.send(point);
            }
            self.go.notified().await;
        }
    }
}
