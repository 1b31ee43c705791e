//! Watching a rules file or directory (feature `file-watch`).
//!
//! The watcher watches directories, never files: the directory of the rules file, the directory of every
//! link on the way to the file's content (a symlinked rules file, a Kubernetes ConfigMap volume's `..data`
//! link) and, when one of them is gone, its nearest existing ancestor. After every burst of events it works
//! out that set again (a link re-pointed, a directory deleted or created) and re-arms the watches, then
//! reloads whenever an event touched a name on the way to the content or the set changed. A reload finds
//! nothing to do when the content is unchanged, so reloading once too often costs one read.
//!
//! A watch follows a directory's inode, not its path: a directory an event reports removed loses its place
//! in the set, and the set is compared by path *and* identity (device, inode and birth time, as the
//! platform gives them), so a directory deleted and created again under the same path is armed again even
//! when the file system hands it the same inode number.
//! Arming repeats until the set it arms is the set that exists (a directory that vanishes while it is being
//! armed is replaced by its nearest ancestor in the next round), so nothing on the way is ever left
//! unwatched; the reload comes after the arming, so a change made in between is either read by the reload
//! or reported by the new watch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify_debouncer_mini::notify::{self, RecommendedWatcher, RecursiveMode, Watcher as _};

use super::file::link_chain;
use super::FileDataSource;

/// The watcher could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {}: {source}", path.display())]
pub struct WatchError {
    /// The directory that could not be watched.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: notify::Error,
}

/// Watches a rules file or directory while it lives; dropping it stops watching (and waits for a reload
/// under way to finish).
#[must_use = "dropping the watcher stops watching"]
pub struct Watcher {
    stop: mpsc::Sender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watcher")
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.stop.send(Message::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Message {
    Event(notify::Result<notify::Event>),
    Stop,
}

/// A burst of events lasts at most this many debounce periods before it is acted on.
const MAX_BURST_PERIODS: u32 = 10;

impl FileDataSource {
    /// Reloads whenever the content of the file (or of a rules file of the directory) may have changed.
    /// Bursts of events within `debounce` are coalesced into one reload. A JSON file caught half-written
    /// fails to parse; so does a YAML or TOML file cut before a rule's required field (see the
    /// [module docs](crate::datasource)); either is reported (through [`on_reload`](FileDataSource::on_reload)
    /// and [`last_error`](FileDataSource::last_error)), the rules in force stay, and the next write reloads
    /// again. Call [`reload_now`](FileDataSource::reload_now) once for the initial load.
    ///
    /// Directories are watched, not the file itself, so all of these are followed: editors that save by
    /// rename; a file deleted and created again; a rules file that is a symbolic link (or a chain of them)
    /// whose target changes or is re-pointed; a Kubernetes ConfigMap update (the `..data` link swapped to a
    /// new directory); the directory itself deleted and created again (its nearest existing ancestor is
    /// watched meanwhile, and the rules are loaded when it returns).
    pub fn watch(&self, debounce: Duration) -> Result<Watcher, WatchError> {
        let (tx, rx) = mpsc::channel();
        let events = tx.clone();
        let mut watcher = notify::recommended_watcher(move |e| {
            let _ = events.send(Message::Event(e));
        })
        .map_err(|source| WatchError { path: self.path().to_path_buf(), source })?;
        let mut armed = Armed::new();
        // The first arming must succeed (later ones are retried at the next event).
        for dir in self.watch_dirs() {
            let id = identity(&dir);
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|source| WatchError { path: dir.clone(), source })?;
            armed.insert(dir, id);
        }
        let source = self.clone();
        let thread = std::thread::Builder::new()
            .name("sentinel-rules-watch".into())
            .spawn(move || source.watch_loop(watcher, armed, &rx, debounce))
            .map_err(|e| WatchError { path: self.path().to_path_buf(), source: notify::Error::io(e) })?;
        Ok(Watcher { stop: tx, thread: Some(thread) })
    }

    fn watch_loop(
        &self,
        mut watcher: RecommendedWatcher,
        mut armed: Armed,
        rx: &mpsc::Receiver<Message>,
        debounce: Duration,
    ) {
        loop {
            let Ok(Message::Event(first)) = rx.recv() else { return };
            let names = self.watched_names();
            let mut relevant = concerns(&names, &first);
            forget_removed(&mut armed, &first);
            // Wait for the burst to end (no event for `debounce`), within a bound.
            let deadline = Instant::now() + debounce * MAX_BURST_PERIODS;
            loop {
                let wait = debounce.min(deadline.saturating_duration_since(Instant::now()));
                match rx.recv_timeout(wait) {
                    Ok(Message::Event(e)) => {
                        relevant |= concerns(&names, &e);
                        forget_removed(&mut armed, &e);
                    }
                    Ok(Message::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            let moved = arm(&mut watcher, &mut armed, || self.watch_dirs());
            if relevant || moved {
                // The outcome reaches the listeners (`on_reload`) and `last_error`.
                let _ = self.reload_now();
            }
        }
    }

    /// The directories to watch: for each path on the way to the rules (each link of the chain, and each
    /// link among their ancestors), the directory holding it, or its nearest existing ancestor; canonical, so
    /// that a directory reached through a re-pointed link shows up as a different one.
    fn watch_dirs(&self) -> BTreeSet<PathBuf> {
        let mut dirs = BTreeSet::new();
        for hop in self.watch_targets().iter().flat_map(|t| chain_of(t)) {
            let mut at = hop.as_path();
            while let Some(parent) = at.parent() {
                if at == hop.as_path() || is_symlink(at) {
                    dirs.insert(nearest_dir(parent));
                }
                at = parent;
            }
        }
        dirs
    }

    /// Every name on the way to the rules: an event on one of them may change what the file reads.
    fn watched_names(&self) -> BTreeSet<std::ffi::OsString> {
        let mut names = BTreeSet::new();
        for hop in self.watch_targets().iter().flat_map(|t| chain_of(t)) {
            for c in hop.components() {
                if let Component::Normal(n) = c {
                    names.insert(n.to_os_string());
                }
            }
        }
        names
    }
}

/// Whether an event (or a watcher error, after which events may have been lost) may concern the rules.
fn concerns(names: &BTreeSet<std::ffi::OsString>, event: &notify::Result<notify::Event>) -> bool {
    match event {
        Ok(e) => e.need_rescan() || e.paths.iter().any(|p| p.file_name().is_some_and(|n| names.contains(n))),
        Err(e) => {
            tracing::warn!(error = %e, "rules file watcher error");
            true
        }
    }
}

/// A directory's device, inode and birth time.
type Identity = (u64, u64, Option<std::time::SystemTime>);

/// The directories watched, each with the identity it had when its watch was added.
type Armed = BTreeMap<PathBuf, Option<Identity>>;

/// Rounds of arming after one burst; each round follows a directory that vanished or was replaced while the
/// previous one armed it, which takes a writer racing the watcher, so a few rounds always suffice.
const MAX_ARM_ROUNDS: usize = 8;

/// Makes the watches match `wanted()` by path and identity: unwatches what is gone or was replaced, watches
/// what is new or replaced, and repeats while what is wanted changes under it. Whether anything changed.
fn arm(watcher: &mut impl notify::Watcher, armed: &mut Armed, wanted: impl Fn() -> BTreeSet<PathBuf>) -> bool {
    let mut changed = false;
    for _ in 0..MAX_ARM_ROUNDS {
        let want: Armed = wanted()
            .into_iter()
            .map(|d| {
                let id = identity(&d);
                (d, id)
            })
            .collect();
        if want == *armed {
            break;
        }
        changed = true;
        armed.retain(|dir, id| {
            let keep = want.get(dir) == Some(id);
            if !keep {
                let _ = watcher.unwatch(dir); // a deleted directory's watch is already gone
            }
            keep
        });
        for (dir, id) in want {
            if armed.contains_key(&dir) {
                continue;
            }
            match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    armed.insert(dir, id);
                }
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a rules directory"),
            }
        }
    }
    changed
}

/// A directory's identity: device, inode and birth time where the platform gives them (none where it
/// cannot be read).
fn identity(dir: &Path) -> Option<Identity> {
    let m = std::fs::metadata(dir).ok()?;
    let born = m.created().ok();
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((m.dev(), m.ino(), born))
    }
    #[cfg(not(unix))]
    {
        Some((0, 0, born))
    }
}

/// Forgets the watch of a directory that an event reports removed: its watch is dead, and a directory made
/// again under its path may even get the same inode number.
fn forget_removed(armed: &mut Armed, event: &notify::Result<notify::Event>) {
    if let Ok(e) = event
        && matches!(e.kind, notify::EventKind::Remove(_))
    {
        for p in &e.paths {
            armed.remove(p);
        }
    }
}

fn chain_of(path: &Path) -> Vec<PathBuf> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    link_chain(&absolute).unwrap_or_else(|_| vec![absolute])
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// `dir` if it exists, else its nearest existing ancestor; canonical.
fn nearest_dir(dir: &Path) -> PathBuf {
    let mut at = dir;
    loop {
        if let Ok(c) = std::fs::canonicalize(at)
            && c.is_dir()
        {
            return c;
        }
        match at.parent() {
            Some(p) => at = p,
            None => return dir.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    type Events = mpsc::Receiver<notify::Result<notify::Event>>;

    fn watcher() -> (RecommendedWatcher, Events) {
        let (tx, rx) = mpsc::channel();
        let w = notify::recommended_watcher(move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        (w, rx)
    }

    /// Whether an event naming `name` arrives (within 10 s, for a loaded machine: the wait ends at the event).
    fn event_naming(rx: &Events, name: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(e)) if e.paths.iter().any(|p| p.file_name().is_some_and(|n| n == name)) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    /// The event that reports `dir` removed (within 10 s, for a loaded machine: the wait ends at the event).
    fn removal_of(rx: &Events, dir: &Path) -> Option<notify::Result<notify::Event>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let e = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).ok()?;
            if let Ok(ev) = &e
                && matches!(ev.kind, notify::EventKind::Remove(_))
                && ev.paths.iter().any(|p| p == dir)
            {
                return Some(e);
            }
        }
    }

    #[test]
    fn a_directory_replaced_under_the_same_path_is_armed_again() {
        let tmp = tempfile::tempdir().unwrap();
        let d = fs::canonicalize(tmp.path()).unwrap().join("rules.d");
        fs::create_dir(&d).unwrap();
        let (mut w, rx) = watcher();
        let mut armed = Armed::new();
        let want = || BTreeSet::from([d.clone()]);
        assert!(arm(&mut w, &mut armed, want));
        assert!(!arm(&mut w, &mut armed, want), "nothing changed, nothing is armed again");
        // Deleted and created again between two looks: same path, another directory, and the old watch is dead.
        fs::remove_dir(&d).unwrap();
        let removed = removal_of(&rx, &d).expect("the removal is reported");
        forget_removed(&mut armed, &removed);
        fs::create_dir(&d).unwrap();
        assert!(arm(&mut w, &mut armed, want), "the replaced directory is armed again");
        assert_eq!(armed.get(&d), Some(&identity(&d)));
        while rx.try_recv().is_ok() {}
        fs::write(d.join("flow-rules.json"), "[]").unwrap();
        assert!(event_naming(&rx, "flow-rules.json"), "a write in the new directory is seen");
    }

    #[test]
    fn a_directory_that_vanishes_while_it_is_armed_gives_way_to_what_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let gone = root.join("gone");
        let looks = std::cell::Cell::new(0);
        // The first look still names the directory; by the time it is armed it is gone, and the next look
        // names its parent.
        let want = || {
            looks.set(looks.get() + 1);
            BTreeSet::from([if looks.get() == 1 { gone.clone() } else { root.clone() }])
        };
        let (mut w, rx) = watcher();
        let mut armed = Armed::new();
        assert!(arm(&mut w, &mut armed, want));
        assert_eq!(armed.keys().collect::<Vec<_>>(), vec![&root], "the parent is watched");
        fs::create_dir(&gone).unwrap();
        assert!(event_naming(&rx, "gone"), "its return is seen");
    }
}
