//! Watching a file an operator drops in with an atomic rename: an adapter component file (the
//! broker swaps to each new version), or a broker URL file (the broker migrates to each new
//! URL). A file still being written is left alone until it stops changing.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, SwapReport, owned_options};
use crate::migrate::{MigrateOptions, MigrationReport};

/// How often the file is looked at.
pub const POLL: Duration = Duration::from_millis(250);

/// What identifies a version of the file: inode, size and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    inode: u64,
    len: u64,
    modified: Option<SystemTime>,
}

fn version(path: &Path) -> Option<Version> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Version {
        inode,
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// What the watcher did last.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// Watching; nothing swapped yet.
    Watching,
    /// Swapped to a new version of the file.
    Swapped(SwapReport),
    /// Migrated to the broker the new version of the file names.
    Migrated(MigrationReport),
    /// A new version could not be loaded or started; the running adapter stays.
    Refused(String),
}

/// A running file watch; dropping it stops watching.
#[derive(Debug)]
pub struct Watcher {
    events: watch::Receiver<(u64, WatchEvent)>,
    stop: CancellationToken,
}

impl Watcher {
    /// The number of events so far and the last one.
    pub fn last(&self) -> (u64, WatchEvent) {
        self.events.borrow().clone()
    }

    /// Wait for the next event.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.events.changed().await.ok()?;
        Some(self.events.borrow().1.clone())
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Broker {
    /// Swap to the component at `path` whenever a new, complete version of the file appears
    /// (options as given here). The version present now counts as the running one.
    pub fn watch<K: Into<String>, V: Into<String>>(
        &self,
        path: impl Into<PathBuf>,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Watcher {
        let options = owned_options(options);
        let broker = self.clone();
        watch_file(path.into(), move |path| {
            let (broker, options) = (broker.clone(), options.clone());
            async move {
                match broker.swap(&path, options).await {
                    Ok(report) => {
                        tracing::info!(path = %path.display(), generation = report.generation, "swapped to a new adapter file");
                        WatchEvent::Swapped(report)
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "a new adapter file was refused: {e}");
                        WatchEvent::Refused(e.to_string())
                    }
                }
            }
        })
    }

    /// Migrate to the broker whose URL (`redis://…`, `nats://…`, `memory://`) a new, complete
    /// version of the file at `path` holds, with the adapter embedded for it and `options`.
    /// The version present now counts as the running one; a URL that cannot be opened is
    /// refused and the host stays where it is.
    pub fn watch_broker_url<K: Into<String>, V: Into<String>>(
        &self,
        path: impl Into<PathBuf>,
        options: impl IntoIterator<Item = (K, V)>,
        migrate: MigrateOptions,
    ) -> Watcher {
        let options = owned_options(options);
        let broker = self.clone();
        watch_file(path.into(), move |path| {
            let (broker, options, migrate) = (broker.clone(), options.clone(), migrate.clone());
            async move {
                let url = match std::fs::read_to_string(&path) {
                    Ok(text) => text.trim().to_string(),
                    Err(e) => {
                        return WatchEvent::Refused(format!("reading {}: {e}", path.display()));
                    }
                };
                let to = match Broker::builder().url(&url) {
                    Ok(to) => to.options(options),
                    Err(e) => return WatchEvent::Refused(format!("{url}: {e}")),
                };
                match broker.migrate(to, migrate).await {
                    Ok(report) => {
                        tracing::info!(%url, total = ?report.total, "migrated to the broker the watched file names");
                        WatchEvent::Migrated(report)
                    }
                    Err(e) => {
                        tracing::warn!(%url, "the broker the watched file names was refused: {e}");
                        WatchEvent::Refused(format!("{url}: {e}"))
                    }
                }
            }
        })
    }
}

/// Run `act` on each new, complete version of the file at `path` (one that held still for one
/// poll); the version present now counts as the running one.
fn watch_file<F, Fut>(path: PathBuf, act: F) -> Watcher
where
    F: Fn(PathBuf) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = WatchEvent> + Send,
{
    let (tx, events) = watch::channel((0, WatchEvent::Watching));
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    // Read now, not in the task: a file dropped in before the task first runs is a new version.
    let mut running = version(&path);
    tokio::spawn(async move {
        let mut seen = running.clone();
        let mut count = 0;
        loop {
            tokio::select! {
                _ = stopped.cancelled() => return,
                _ = tokio::time::sleep(POLL) => {}
            }
            let now = version(&path);
            // Act on a version only once it held still for one poll, and only once.
            let settled = now.is_some() && now == seen && now != running;
            seen = now.clone();
            if !settled {
                continue;
            }
            running = now;
            let event = act(path.clone()).await;
            count += 1;
            if tx.send((count, event)).is_err() {
                return;
            }
        }
    });
    Watcher { events, stop }
}
