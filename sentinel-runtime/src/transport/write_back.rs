//! Pushed rules written back to the data source on a thread of its own, in push order, each waited for at
//! most a deadline below the request's timeout.
//!
//! A push puts its rules in force, then writes them back. A store that does not answer in time would have
//! made the request time out (`408`, a failure to the dashboard) with the rules already in force. Instead the
//! push waits for its write until [`WriteBack::deadline`] after its request began (a wait for an earlier
//! push included) and then answers `partial success` (the rules are in force, the store is not written yet);
//! the write goes on, and the writes of later pushes follow it in order. A write not yet begun is replaced
//! by a later push's write of the same rules (the same kind, gateway rules, API definitions): that one holds
//! what is in force then, and the pushes of both wait for it. So at most one write per kind waits however
//! long the store hangs, and the store ends with the last push of each kind once it answers. A write that
//! panics fails its own push only.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::datasource::{WritableDataSource, WriteBackError};
use crate::error::RuleKind;

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

/// A write of a push, made on the writer thread.
pub(crate) type Write = Box<dyn FnOnce(&dyn WritableDataSource) -> Result<(), WriteBackError> + Send>;

/// What a write stores: a later write of the same replaces one that has not begun.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The rules of one kind.
    Rules(RuleKind),
    /// The gateway's flow rules.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    GatewayRules,
    /// The gateway's API definitions.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    ApiDefinitions,
}

/// Where the pushes a write stores the rules of wait for its outcome (the text to tell them if it failed).
#[derive(Default)]
struct Outcome {
    result: Mutex<Option<Result<(), String>>>,
    told: Condvar,
}

/// A write that has not begun: what it stores, how, the runtime of the push that asked for it last (entered
/// while it runs, as the push's own task was), and where its pushes wait.
struct Pending {
    stored: Stored,
    write: Write,
    runtime: Option<tokio::runtime::Handle>,
    outcome: Arc<Outcome>,
}

/// The writes that have not begun, in push order (one per [`Stored`] at most), and whether the command
/// center is gone.
#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    closed: bool,
}

#[derive(Default)]
struct Writes {
    queue: Mutex<Queue>,
    queued: Condvar,
}

impl Writes {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer of a command center's data source.
pub(crate) struct WriteBack {
    writes: Arc<Writes>,
    /// The writer thread (never joined but by tests: a store that hangs would hang the caller).
    #[cfg_attr(not(test), allow(dead_code))]
    thread: Option<std::thread::JoinHandle<()>>,
    /// How long a push waits for its write.
    deadline: Duration,
}

impl WriteBack {
    /// Starts the writer of `source`; `request_timeout` is the command server's (a push waits that less a
    /// quarter of it, at most a second less: 9 s of the default 10 s).
    pub(crate) fn start(source: Arc<dyn WritableDataSource>, request_timeout: Duration) -> std::io::Result<Self> {
        let writes = Arc::new(Writes::default());
        let queue = writes.clone();
        let thread = std::thread::Builder::new().name("sentinel-write-back".into()).spawn(move || {
            // Ends when the command center is gone and no write is left.
            while let Some(job) = next(&queue) {
                let _in_runtime = job.runtime.as_ref().map(|r| r.enter());
                let result = made(&*source, job.write);
                *job.outcome.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                job.outcome.told.notify_all();
            }
        })?;
        let margin = (request_timeout / 4).min(Duration::from_secs(1));
        Ok(WriteBack { writes, thread: Some(thread), deadline: request_timeout.saturating_sub(margin) })
    }

    /// Stops taking writes and waits for those queued (tests).
    #[cfg(test)]
    fn finish(mut self) {
        self.close();
        self.thread.take().unwrap().join().unwrap();
    }

    fn close(&self) {
        self.writes.queue().closed = true;
        self.writes.queued.notify_all();
    }

    /// Writes `stored` with `write` after the writes queued before (replacing a write of the same not begun
    /// yet), waiting at most the deadline: `Err` with what to tell the client when the write failed, or did
    /// not end in time (it goes on).
    pub(crate) fn write(&self, stored: Stored, write: Write) -> Result<(), String> {
        let runtime = tokio::runtime::Handle::try_current().ok();
        let outcome = {
            let mut queue = self.writes.queue();
            match queue.pending.iter_mut().find(|p| p.stored == stored) {
                // What is in force now holds what the earlier push put in force, or what replaced it since.
                Some(p) => {
                    p.write = write;
                    p.runtime = runtime;
                    p.outcome.clone()
                }
                None => {
                    let outcome = Arc::new(Outcome::default());
                    queue.pending.push_back(Pending { stored, write, runtime, outcome: outcome.clone() });
                    self.writes.queued.notify_one();
                    outcome
                }
            }
        };
        // From the request's start (a push may have waited for an earlier one's write), or from now.
        let started = REQUEST_STARTED.with(|s| s.get()).unwrap_or_else(Instant::now);
        let until = started + self.deadline;
        let mut result = outcome.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(result) = result.as_ref() {
                return result.clone();
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the data source did not answer within {} ms; the write goes on, in push order",
                    self.deadline.as_millis()
                ));
            }
            result = outcome.told.wait_timeout(result, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        self.close();
    }
}

/// The next write to make, waiting for one; `None` once the command center is gone and none is left.
fn next(writes: &Writes) -> Option<Pending> {
    let mut queue = writes.queue();
    loop {
        if let Some(job) = queue.pending.pop_front() {
            return Some(job);
        }
        if queue.closed {
            return None;
        }
        queue = writes.queued.wait(queue).unwrap_or_else(|e| e.into_inner());
    }
}

/// Makes `write` on `source`: a store that panics fails its own push, not the writes of later ones.
fn made(source: &dyn WritableDataSource, write: Write) -> Result<(), String> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(source))).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(WriteBackError::Store {
            target: "the data source".to_string(),
            reason: format!("its write panicked: {what}"),
        })
    });
    result.map_err(|e| {
        // A subscriber that panics does not stop the writer either.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            || tracing::warn!(error = %e, "pushed rules could not be written back to the data source"),
        ));
        e.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasource::{RuleSet, SourceStatus};
    use std::sync::{mpsc, Mutex};

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

    const FLOW: Stored = Stored::Rules(RuleKind::Flow);

    #[test]
    fn a_write_that_outlasts_the_deadline_is_answered_goes_on_and_later_ones_follow_it_in_order() {
        let (go, gate) = mpsc::channel();
        let (entered, writing) = mpsc::channel();
        let store = Arc::new(Gated { entered: Mutex::new(entered), go: Mutex::new(gate), done: Mutex::default() });
        // A request timeout of 40 ms: a push waits 30.
        let writer = WriteBack::start(store.clone(), Duration::from_millis(40)).unwrap();
        assert_eq!(writer.deadline, Duration::from_millis(30));
        let write = |n: usize| -> Write { Box::new(move |s| s.write_rules(&flows(n))) };
        let late = writer.write(FLOW, write(1)).unwrap_err();
        assert!(late.contains("did not answer within 30 ms"), "{late}");
        writing.recv().unwrap();
        // The first is being written; the next of each kind waits behind it, in push order.
        assert!(writer.write(Stored::Rules(RuleKind::Degrade), write(2)).is_err());
        assert!(writer.write(FLOW, write(3)).is_err());
        assert!(writer.write(Stored::Rules(RuleKind::System), write(4)).is_err());
        for _ in 1..=4 {
            go.send(()).unwrap();
        }
        writer.finish();
        assert_eq!(*store.done.lock().unwrap(), [1, 2, 3, 4], "in push order");
    }

    #[test]
    fn however_long_the_store_hangs_one_write_per_kind_waits_and_the_store_ends_with_the_last_push() {
        let (go, gate) = mpsc::channel();
        let (entered, writing) = mpsc::channel();
        let store = Arc::new(Gated { entered: Mutex::new(entered), go: Mutex::new(gate), done: Mutex::default() });
        let writer = WriteBack::start(store.clone(), Duration::from_millis(4)).unwrap();
        let write = |n: usize| -> Write { Box::new(move |s| s.write_rules(&flows(n))) };
        assert!(writer.write(FLOW, write(1)).is_err());
        writing.recv().unwrap();
        // A hundred pushes while the store hangs: each replaces the write of the one before, not begun.
        for n in 2..=101 {
            assert!(writer.write(FLOW, write(n)).is_err());
            assert!(writer.write(Stored::GatewayRules, write(1000 + n)).is_err());
            assert_eq!(writer.writes.queue().pending.len(), 2, "one write per kind waits");
        }
        for _ in 1..=3 {
            go.send(()).unwrap();
        }
        writer.finish();
        assert_eq!(*store.done.lock().unwrap(), [1, 101, 1101], "the last push of each kind is stored");
    }

    #[test]
    fn pushes_whose_writes_were_replaced_are_told_the_outcome_of_the_write_that_replaced_them() {
        let (go, gate) = mpsc::channel();
        let (entered, writing) = mpsc::channel();
        let store = Arc::new(Gated { entered: Mutex::new(entered), go: Mutex::new(gate), done: Mutex::default() });
        let writer = Arc::new(WriteBack::start(store.clone(), Duration::from_secs(3600)).unwrap());
        let write = |n: usize| -> Write { Box::new(move |s| s.write_rules(&flows(n))) };
        let first = std::thread::spawn({
            let writer = writer.clone();
            move || writer.write(FLOW, write(1))
        });
        writing.recv().unwrap();
        // Two pushes behind the first, the second replacing the write of the other: both wait for it.
        let behind: Vec<_> = (2..=3)
            .map(|n| {
                let waiting = std::thread::spawn({
                    let writer = writer.clone();
                    move || writer.write(FLOW, write(n))
                });
                // Queued (the first behind the write being made), then joined by the second.
                while writer.writes.queue().pending.front().map(|p| Arc::strong_count(&p.outcome)) != Some(n) {
                    std::thread::yield_now();
                }
                waiting
            })
            .collect();
        for _ in 1..=2 {
            go.send(()).unwrap();
        }
        assert_eq!(first.join().unwrap(), Ok(()));
        for waiting in behind {
            assert_eq!(waiting.join().unwrap(), Ok(()));
        }
        assert_eq!(*store.done.lock().unwrap(), [1, 3]);
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
        let e = writer.write(FLOW, Box::new(|s| s.write_rules(&flows(1)))).unwrap_err();
        assert!(e.contains("disk full"), "{e}");
        assert_eq!(writer.write(FLOW, Box::new(|_| Ok(()))), Ok(()));
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
        assert!(writer.write(FLOW, Box::new(|s| s.write_rules(&flows(1)))).is_err());
        // Before the writer thread, a push's write ran on the request's own blocking task: a panic failed that
        // push alone.
        assert_eq!(writer.write(FLOW, Box::new(|s| s.write_rules(&flows(2)))), Ok(()), "the next push is written");
    }
}
