//! Watching a rules file or directory (feature `file-watch`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify_debouncer_mini::notify::{self, RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{new_debouncer, DebounceEventResult, Debouncer};

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

/// Watches a rules file or directory while it lives; dropping it stops watching.
pub struct Watcher {
    _debouncer: Debouncer<RecommendedWatcher>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watcher")
    }
}

impl FileDataSource {
    /// Reloads whenever the file (or a rules file of the directory) changes. Bursts of writes within
    /// `debounce` are coalesced into one reload; a file caught half-written fails to parse, is reported, and
    /// the next write reloads again. Call [`reload_now`](FileDataSource::reload_now) once for the initial load.
    ///
    /// The parent directory is watched (not the file itself), so editors that save by rename, and a file
    /// deleted and created again, keep being followed.
    pub fn watch(&self, debounce: Duration) -> Result<Watcher, WatchError> {
        let dir: PathBuf = if self.is_dir() {
            self.path().to_path_buf()
        } else {
            match self.path().parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => Path::new(".").to_path_buf(),
            }
        };
        let source = self.clone();
        let mut debouncer = new_debouncer(debounce, move |res: DebounceEventResult| match res {
            Ok(events) => {
                if events.iter().any(|e| source.concerns(&e.path)) {
                    // The outcome reaches the listeners (`on_reload`) and `last_error`.
                    let _ = source.reload_now();
                }
            }
            Err(e) => tracing::warn!(error = %e, "rules file watcher error"),
        })
        .map_err(|source| WatchError { path: dir.clone(), source })?;
        debouncer
            .watcher()
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError { path: dir.clone(), source })?;
        Ok(Watcher { _debouncer: debouncer })
    }
}
