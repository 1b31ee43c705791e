//! Pushed rules written back to the data source on a thread of its own, in push order, each waited for at
//! most a deadline below the request's timeout.
//!
//! A push puts its rules in force, then writes them back. A store that does not answer in time would have
//! made the request time out (`408`, a failure to the dashboard) with the rules already in force. Instead the
//! push waits for its write until [`WriteBack::deadline`] after its request began (a wait for an earlier
//! push included) and then answers `partial success` (the rules are in force, the store is not written yet);
//! the write goes on, and the writes of later pushes follow it in order. At most [`QUEUED`] writes wait: past
//! them a push is answered `partial success` at once and its write is not made, so the store may keep an
//! earlier push until the next one is written. A write that panics fails its own push only.

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::datasource::{WritableDataSource, WriteBackError};

thread_local! {
    /// When the request of the command running on this thread began ([`within_request`]).
    static REQUEST_STARTED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Runs the command `f` of a request that began at `started`: a write it asks for is waited for until the
/// deadline counted from then (the time the push waited for an earlier one included).
pub(crate) fn within_request<R>(started: Instant, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            REQUEST_STARTED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(REQUEST_STARTED.with(|s| s.replace(Some(started))));
    f()
}

/// Writes waiting for the store at most, the one being made included.
pub(crate) const QUEUED: usize = 4;

/// A write of a push, made on the writer thread.
pub(crate) type Write = Box<dyn FnOnce(&dyn WritableDataSource) -> Result<(), WriteBackError> + Send>;
/// A write, the runtime of the push that asked for it (entered while it runs, as the push's own task
/// was), and where to answer.
type Job = (Write, Option<tokio::runtime::Handle>, SyncSender<Result<(), WriteBackError>>);

/// The writer of a command center's data source.
pub(crate) struct WriteBack {
    jobs: SyncSender<Job>,
    /// The writer thread (never joined but by tests: a store that hangs would hang the caller).
    #[cfg_attr(not(test), allow(dead_code))]
    thread: std::thread::JoinHandle<()>,
    /// How long a push waits for its write.
    deadline: Duration,
}

impl WriteBack {
    /// Starts the writer of `source`; `request_timeout` is the command server's (a push waits three quarters
    /// of it, at most a second less).
    pub(crate) fn start(source: Arc<dyn WritableDataSource>, request_timeout: Duration) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::sync_channel::<Job>(QUEUED - 1);
        let thread = std::thread::Builder::new().name("sentinel-write-back".into()).spawn(move || {
            // Ends when the command center (the sender) is gone and the queue is empty.
            for (write, runtime, answer) in queue {
                let _in_runtime = runtime.as_ref().map(|r| r.enter());
                // A store that panics fails its own push, not the writes of later ones.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&*source))).unwrap_or_else(
                    |panic| {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Err(WriteBackError::Store {
                            target: "the data source".to_string(),
                            reason: format!("its write panicked: {what}"),
                        })
                    },
                );
                if let Err(e) = &result {
                    tracing::warn!(error = %e, "pushed rules could not be written back to the data source");
                }
                // The push may have stopped waiting: nobody to tell.
                let _ = answer.send(result);
            }
        })?;
        let margin = (request_timeout / 4).min(Duration::from_secs(1));
        Ok(WriteBack { jobs, thread, deadline: request_timeout.saturating_sub(margin) })
    }

    /// Stops taking writes and waits for those queued (tests).
    #[cfg(test)]
    fn finish(self) {
        drop(self.jobs);
        self.thread.join().unwrap();
    }

    /// Writes with `write` after the writes queued before, waiting at most the deadline: `Err` with what to
    /// tell the client when the write failed, or did not end in time (it goes on), or could not be queued.
    pub(crate) fn write(&self, write: Write) -> Result<(), String> {
        let (answer, result) = mpsc::sync_channel(1);
        match self.jobs.try_send((write, tokio::runtime::Handle::try_current().ok(), answer)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(format!(
                    "{QUEUED} writes are waiting for the data source, which does not answer; this one is not made"
                ))
            }
            Err(TrySendError::Disconnected(_)) => return Err("the data source's writer stopped".to_string()),
        }
        // From the request's start (a push may have waited for an earlier one's write), or from now.
        let started = REQUEST_STARTED.with(|s| s.get()).unwrap_or_else(Instant::now);
        let left = (started + self.deadline).saturating_duration_since(Instant::now());
        match result.recv_timeout(left) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "the data source did not answer within {} ms; the write goes on, in push order",
                self.deadline.as_millis()
            )),
            Err(RecvTimeoutError::Disconnected) => Err("the data source's writer stopped".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasource::{RuleSet, SourceStatus};
    use std::sync::Mutex;

    /// A store whose writes wait for the test to let each go, and that records the order they ended in.
    struct Gated {
        entered: Mutex<mpsc::Sender<()>>,
        go: Mutex<mpsc::Receiver<()>>,
        done: Mutex<Vec<usize>>,
    }

    impl WritableDataSource for Gated {
        fn write_rules(&self, set: &RuleSet) -> Result<(), WriteBackError> {
            let _ = self.entered.lock().unwrap().send(());
            let _ = self.go.lock().unwrap().recv();
            self.done.lock().unwrap().push(set.flow.as_ref().map_or(0, Vec::len));
            Ok(())
        }
        fn status(&self) -> SourceStatus {
            SourceStatus::new("gated", "gated")
        }
    }

    fn flows(n: usize) -> RuleSet {
        RuleSet { flow: Some(vec![crate::flow::FlowRule::new("r"); n]), ..RuleSet::default() }
    }

    #[test]
    fn a_write_that_outlasts_the_deadline_is_answered_goes_on_and_later_ones_follow_it_in_order() {
        let (go, gate) = mpsc::channel();
        let (entered, writing) = mpsc::channel();
        let store = Arc::new(Gated { entered: Mutex::new(entered), go: Mutex::new(gate), done: Mutex::default() });
        // A request timeout of 40 ms: a push waits 30.
        let writer = WriteBack::start(store.clone(), Duration::from_millis(40)).unwrap();
        assert_eq!(writer.deadline, Duration::from_millis(30));
        let write = |n: usize| -> Write { Box::new(move |s| s.write_rules(&flows(n))) };
        let late = writer.write(write(1)).unwrap_err();
        assert!(late.contains("did not answer within 30 ms"), "{late}");
        writing.recv().unwrap();
        // The first is being written: three more wait behind it, and the fifth finds no room.
        for n in 2..=4 {
            assert!(writer.write(write(n)).is_err());
        }
        let full = writer.write(write(5)).unwrap_err();
        assert!(full.contains("this one is not made"), "{full}");
        for _ in 1..=4 {
            go.send(()).unwrap();
        }
        writer.finish();
        assert_eq!(*store.done.lock().unwrap(), [1, 2, 3, 4], "in push order, the refused one not made");
    }

    #[test]
    fn a_write_answered_in_time_or_failing_is_told_as_it_is() {
        struct Failing;
        impl WritableDataSource for Failing {
            fn write_rules(&self, _: &RuleSet) -> Result<(), WriteBackError> {
                Err(WriteBackError::Store { target: "here".into(), reason: "disk full".into() })
            }
            fn status(&self) -> SourceStatus {
                SourceStatus::new("failing", "failing")
            }
        }
        let writer = WriteBack::start(Arc::new(Failing), Duration::from_secs(3600)).unwrap();
        let e = writer.write(Box::new(|s| s.write_rules(&flows(1)))).unwrap_err();
        assert!(e.contains("disk full"), "{e}");
        assert_eq!(writer.write(Box::new(|_| Ok(()))), Ok(()));
    }

    #[test]
    fn a_write_that_panics_does_not_stop_the_writes_of_later_pushes() {
        struct PanicsOnce(std::sync::atomic::AtomicBool);
        impl WritableDataSource for PanicsOnce {
            fn write_rules(&self, _: &RuleSet) -> Result<(), WriteBackError> {
                if !self.0.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    panic!("a store of the user's own panics once");
                }
                Ok(())
            }
            fn status(&self) -> SourceStatus {
                SourceStatus::new("panics-once", "panics-once")
            }
        }
        let writer = WriteBack::start(Arc::new(PanicsOnce(Default::default())), Duration::from_secs(3600)).unwrap();
        assert!(writer.write(Box::new(|s| s.write_rules(&flows(1)))).is_err());
        // Before the writer thread, a push's write ran on the request's own blocking task: a panic failed that
        // push alone.
        assert_eq!(writer.write(Box::new(|s| s.write_rules(&flows(2)))), Ok(()), "the next push is written");
    }
}
