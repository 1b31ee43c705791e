//! What the data sources on a server (etcd, ZooKeeper) share: their builders' settings (the entries to watch,
//! the credentials, the reconnection pause) and methods, their own thread and runtime, stop on drop, reports
//! to listeners with a counter tests and start-up checks can wait on, the last error and the time of the last
//! load, and a blocking call into their runtime for the command center's write-back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::entry::{entries_for, Holds};
use super::{now_ms, RuleSet, WriteBackError};

type Listener<R> = dyn Fn(&R) + Send + Sync;

/// A user name and password.
pub(crate) type Credentials = (String, String);

/// Splits `user:password@hosts` into the credentials (if any) and the hosts.
pub(crate) fn split_credentials(address: &str) -> (Option<Credentials>, &str) {
    match address.rsplit_once('@') {
        Some((info, hosts)) => {
            let (u, p) = info.split_once(':').unwrap_or((info, ""));
            (Some((u.to_string(), p.to_string())), hosts)
        }
        None => (None, address),
    }
}

/// One entry a server-backed source watches: an etcd key or a ZooKeeper node.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// What it holds.
    pub(crate) holds: Holds,
    /// The key, or the node's path.
    pub(crate) name: String,
}

/// What the builders of the server-backed sources share: the entries to watch, the credentials, and the
/// longest pause between reconnection attempts.
#[derive(Clone, Debug)]
pub(crate) struct SourceSettings {
    pub(crate) entries: Vec<Entry>,
    pub(crate) user: Option<Credentials>,
    pub(crate) retry_max: Duration,
}

impl SourceSettings {
    /// No entry yet, `user` (from the address, if any), a longest pause of 2 s.
    pub(crate) fn new(user: Option<Credentials>) -> Self {
        SourceSettings { entries: Vec::new(), user, retry_max: Duration::from_secs(2) }
    }

    /// What `start` checks before it connects: an entry at least (`entry` names what one is: "key",
    /// "node"), no entry that `invalid` rejects (its message), a pause above zero.
    pub(crate) fn check(&self, entry: &str, invalid: impl Fn(&Entry) -> Option<String>) -> Result<(), String> {
        if self.entries.is_empty() {
            return Err(format!("no {entry}: add one with `rules`, `rule_set`, `gateway_rules` or `api_definitions`"));
        }
        if let Some(reason) = self.entries.iter().find_map(invalid) {
            return Err(reason);
        }
        if self.retry_max.is_zero() {
            return Err("`retry_max` must be > 0".into());
        }
        Ok(())
    }
}

/// The builder methods every server-backed source offers over its [`SourceSettings`] (the builder's
/// `settings` field): `rules`, `rule_set`, `retry_max`. `$java` is Java's data source, `$name` the name of an
/// entry's parameter and `$where` where the rules are read, in words.
macro_rules! settings_methods {
    ($builder:ty, $java:literal, $name:ident, $where:literal) => {
        impl $builder {
            #[doc = concat!("One kind's rules (a JSON list, as Java's `", $java, "` reads) in ", $where, ".")]
            pub fn rules(mut self, kind: RuleKind, $name: impl Into<String>) -> Self {
                let holds = super::entry::Holds::Kind(kind);
                self.settings.entries.push(super::remote::Entry { holds, name: $name.into() });
                self
            }

            #[doc = concat!(
                        "A combined document (`{\"flowRules\": [...], \"degradeRules\": [...]}`, with the gateway's ",
                        "`gwFlowRules` and `gwApiDefinitions`) in ", $where, "."
                    )]
            pub fn rule_set(mut self, $name: impl Into<String>) -> Self {
                let holds = super::entry::Holds::Combined;
                self.settings.entries.push(super::remote::Entry { holds, name: $name.into() });
                self
            }

            #[doc = concat!(
                        "The gateway's flow rules (a JSON list, Java's `gw-flow-rules` document) in ", $where,
                        " (feature `tower`)."
                    )]
            #[cfg(feature = "tower")]
            pub fn gateway_rules(mut self, $name: impl Into<String>) -> Self {
                let holds = super::entry::Holds::GatewayRules;
                self.settings.entries.push(super::remote::Entry { holds, name: $name.into() });
                self
            }

            #[doc = concat!(
                        "The gateway's API definitions (a JSON list, Java's `gw-api-definitions` document) in ",
                        $where, " (feature `tower`)."
                    )]
            #[cfg(feature = "tower")]
            pub fn api_definitions(mut self, $name: impl Into<String>) -> Self {
                let holds = super::entry::Holds::ApiDefinitions;
                self.settings.entries.push(super::remote::Entry { holds, name: $name.into() });
                self
            }

            /// The longest pause between reconnection attempts (default 2 s; the first is 100 ms, then doubling).
            pub fn retry_max(mut self, d: std::time::Duration) -> Self {
                self.settings.retry_max = d;
                self
            }
        }
    };
}
pub(crate) use settings_methods;

/// Listeners, the last error, the count of handled documents and the time of the last load.
pub(crate) struct Reports<R, E> {
    listeners: Mutex<Vec<Arc<Listener<R>>>>,
    last_error: Mutex<Option<E>>,
    last_load_ms: AtomicU64,
    connected: AtomicBool,
    events: Mutex<u64>,
    events_changed: Condvar,
    stop: AtomicBool,
    pub(crate) stop_notify: tokio::sync::Notify,
}

impl<R, E: Clone> Reports<R, E> {
    pub(crate) fn new() -> Self {
        Reports {
            listeners: Mutex::new(Vec::new()),
            last_error: Mutex::new(None),
            last_load_ms: AtomicU64::new(0),
            connected: AtomicBool::new(false),
            events: Mutex::new(0),
            events_changed: Condvar::new(),
            stop: AtomicBool::new(false),
            stop_notify: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn listen(&self, f: Arc<Listener<R>>) {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner()).push(f);
    }

    /// Gives `r` to the listeners; `error` becomes the last error; a `document` (not a connection event)
    /// counts for [`wait_for`](Self::wait_for).
    pub(crate) fn report(&self, r: &R, error: Option<&E>, document: bool) {
        if let Some(e) = error {
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.clone());
        }
        let listeners: Vec<Arc<Listener<R>>> = self.listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for l in listeners {
            l(r);
        }
        if document {
            *self.events.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            self.events_changed.notify_all();
        }
    }

    /// Rules were applied: the last error is cleared and the time kept.
    pub(crate) fn loaded(&self) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.last_load_ms.store(now_ms(), Ordering::Release);
    }

    pub(crate) fn last_error(&self) -> Option<E> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn last_load_ms(&self) -> Option<u64> {
        let at = self.last_load_ms.load(Ordering::Acquire);
        (at != 0).then_some(at)
    }

    /// Sets whether connected; returns what it was.
    pub(crate) fn set_connected(&self, now: bool) -> bool {
        self.connected.swap(now, Ordering::AcqRel)
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub(crate) fn events(&self) -> u64 {
        *self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn wait_for(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        while *events < n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            events = self.events_changed.wait_timeout(events, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Asks the source's loop to end.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.stop_notify.notify_one();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps `pause` unless the source stops first (then `false`).
    pub(crate) async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(pause) => true,
            _ = self.stop_notify.notified() => false,
        }
    }
}

/// A source's thread, with a current-thread runtime of its own; stopped and joined on drop.
pub(crate) struct Background {
    handle: tokio::runtime::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Box<dyn Fn() + Send + Sync>,
}

impl Background {
    /// Runs `run` on a new thread named `name`; `stop` asks it to end.
    pub(crate) fn spawn<F>(name: &str, stop: impl Fn() + Send + Sync + 'static, run: F) -> std::io::Result<Self>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.handle().clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || rt.block_on(run))?;
        Ok(Background { handle, thread: Some(thread), stop: Box::new(stop) })
    }

    /// Runs `fut` on the source's runtime and waits for it (at most `timeout`), from any thread.
    ///
    /// Past `timeout`, `fut` is cancelled and has ended before the caller is answered, so nothing it would
    /// still send reaches the store after the caller was told it failed (a request the store had already
    /// received may still be applied, which the error says). An answer that came in meanwhile is the answer.
    pub(crate) fn call<F>(&self, target: &str, timeout: Duration, fut: F) -> Result<(), WriteBackError>
    where
        F: std::future::Future<Output = Result<(), WriteBackError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let task = self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        let store = |reason: String| WriteBackError::Store { target: target.to_string(), reason };
        match rx.recv_timeout(timeout) {
            Ok(answer) => answer,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                task.abort();
                // Until the task has ended, a poll running now could still send something. (On the source's
                // own thread, where the runtime cannot run while this waits, a poll cannot be running.)
                let on_runtime = self.thread.as_ref().is_some_and(|t| t.thread().id() == std::thread::current().id());
                if !on_runtime {
                    let _ = futures::executor::block_on(task);
                }
                rx.try_recv().unwrap_or_else(|_| {
                    Err(store(format!(
                        "no answer within {timeout:?}: the write was cancelled (the store may have applied a \
                         request it had already received)"
                    )))
                })
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(store("the write ended without an answer (the source stopped, or the write panicked)".to_string()))
            }
        }
    }

    /// The command center's write-back of `set` to a source on `store` (`target` names it in errors): on
    /// this runtime, with the source's `client` (`None`: not connected), `write` puts each entry (by index)
    /// that [`entries_for`] finds among `entries`, in order; at most 10 s in all, logged either way.
    pub(crate) fn write_back<C, W, F>(
        &self,
        store: &str,
        target: String,
        entries: impl Iterator<Item = Holds> + Clone,
        client: &Mutex<Option<C>>,
        set: &RuleSet,
        write: W,
    ) -> Result<(), WriteBackError>
    where
        C: Clone + Send + 'static,
        W: Fn(C, usize, RuleSet) -> F + Send + 'static,
        F: std::future::Future<Output = Result<(), WriteBackError>> + Send,
    {
        let targets = entries_for(entries, set, &target)?;
        let client = client.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(client) = client else {
            return Err(WriteBackError::Store { target, reason: "not connected (reconnecting)".into() });
        };
        let parts = Holds::parts_of(set);
        let set = set.clone();
        let result = self.call(&target, Duration::from_secs(10), async move {
            for i in targets {
                write(client.clone(), i, set.clone()).await?;
            }
            Ok(())
        });
        match &result {
            Ok(()) => tracing::info!(?parts, "rules written back to {store}"),
            Err(e) => tracing::warn!(error = %e, "rules could not be written back to {store}"),
        }
        result
    }

    pub(crate) fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            (self.stop)();
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The accessors every server-backed source offers over its [`Reports`] and [`Background`]: `on_reload`,
/// `last_error`, `is_connected`, `wait_for`, `events`, `stop`.
macro_rules! source_accessors {
    ($source:ty, $reload:ty, $error:ty) => {
        impl $source {
            /// Calls `f` after every document (applied, unchanged, missing, rejected, deleted) and every lost
            /// connection.
            pub fn on_reload(&self, f: impl Fn(&$reload) + Send + Sync + 'static) {
                self.inner.reports.listen(std::sync::Arc::new(f));
            }

            /// The last failure, until a document is applied again.
            pub fn last_error(&self) -> Option<$error> {
                self.inner.reports.last_error()
            }

            /// Whether the data source is connected (watching) now.
            pub fn is_connected(&self) -> bool {
                self.inner.reports.is_connected()
            }

            /// Waits (at most `timeout`) until `n` documents in all were handled (applied, unchanged,
            /// missing, rejected, deleted) since the start; returns whether that happened. For tests and
            /// start-up checks.
            pub fn wait_for(&self, n: u64, timeout: std::time::Duration) -> bool {
                self.inner.reports.wait_for(n, timeout)
            }

            /// The number of documents handled so far (see [`wait_for`](Self::wait_for)).
            pub fn events(&self) -> u64 {
                self.inner.reports.events()
            }

            /// Stops the data source (as dropping it does).
            pub fn stop(mut self) {
                self.background.stop();
            }
        }
    };
}
pub(crate) use source_accessors;

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends on drop: tells the test that the future holding it was dropped.
    struct Dropped(std::sync::mpsc::Sender<()>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    fn background() -> (Background, Arc<tokio::sync::Notify>) {
        let stop = Arc::new(tokio::sync::Notify::new());
        let (wait, ask) = (stop.clone(), stop.clone());
        let bg = Background::spawn("write-back-test", move || ask.notify_one(), async move { wait.notified().await })
            .expect("a runtime");
        (bg, stop)
    }

    #[test]
    fn a_write_past_its_time_is_cancelled_and_has_ended_when_its_caller_is_answered() {
        let (bg, _stop) = background();
        let (tx, dropped) = std::sync::mpsc::channel();
        let guard = Dropped(tx);
        let never = async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok(())
        };
        let e = bg.call("store `x`", Duration::ZERO, never).expect_err("no answer");
        assert!(e.to_string().contains("cancelled"), "{e}");
        assert!(dropped.try_recv().is_ok(), "the write had ended when its caller was answered");
    }

    #[test]
    fn a_write_that_answers_in_time_gives_its_answer() {
        let (bg, _stop) = background();
        assert!(bg.call("store `x`", Duration::from_secs(60), async { Ok(()) }).is_ok());
        let refused = WriteBackError::Conflict { target: "x".into(), detail: "changed".into() };
        let e = bg.call("store `x`", Duration::from_secs(60), async move { Err(refused) }).expect_err("refused");
        assert!(matches!(e, WriteBackError::Conflict { .. }), "{e}");
    }
}
