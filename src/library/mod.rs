//! The model library: every local model mlxbar can find (hub cache, LM Studio, its own
//! models dir, the config's `models_dirs`, paths given), what each is, and whether the
//! engine can run it. Rescanned on request and, with [`Library::watch`], on a
//! file-system change; [`pull`] downloads more from Hugging Face.
//!
//! Scans run on a thread of their own, never on an async worker (a folder on a hung mount
//! blocks even `stat`), and coalesce: however many ask, one scan runs and at most one more
//! waits to start after it, which serves everyone who asked meanwhile. Callers wait with a
//! deadline. What a scan inspected is remembered by file stamps (`inspector`), so a
//! rescan re-reads only models that changed.
pub mod cli;
pub mod entry;
mod files;
pub mod hub_cache;
pub mod inspect;
pub mod inspector;
pub mod pull;
pub mod sources;
pub mod watch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

pub use entry::{ModelEntry, ModelFormat, ModelSource, Quantization, Shape};
pub use sources::Sources;
pub use watch::Watcher;

type Listener = Arc<dyn Fn(u64) + Send + Sync>;

/// How long [`Library::new`] and [`Library::refresh`] wait for their scan.
pub const SCAN_WAIT: Duration = Duration::from_secs(60);

pub struct Library {
    inner: Arc<Inner>,
}

struct Inner {
    sources: Sources,
    /// Sorted by id.
    entries: RwLock<Vec<ModelEntry>>,
    generation: AtomicU64,
    scans: Mutex<Scans>,
    /// Signalled when a scan ends (blocking waiters).
    scanned: Condvar,
    /// The number of the last scan finished (async waiters).
    finished: tokio::sync::watch::Sender<u64>,
    /// The last scan's inspections, for the next one.
    remembered: Mutex<inspector::Remembered>,
    listeners: Mutex<Vec<Listener>>,
}

/// Scans are numbered from 1; `wanted` is the highest number someone waits for, never more
/// than one past `started`.
#[derive(Default)]
struct Scans {
    started: u64,
    finished: u64,
    wanted: u64,
    /// A scan thread runs (it goes on while `started < wanted`).
    running: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Library {
    /// Scans once, waiting for it up to [`SCAN_WAIT`] (blocking: call it in
    /// `spawn_blocking` or at start); past that the library starts empty and fills when the
    /// scan ends.
    pub fn new(sources: Sources) -> Library {
        let (finished, _) = tokio::sync::watch::channel(0);
        let lib = Library {
            inner: Arc::new(Inner {
                sources,
                entries: RwLock::new(Vec::new()),
                generation: AtomicU64::new(0),
                scans: Mutex::default(),
                scanned: Condvar::new(),
                finished,
                remembered: Mutex::default(),
                listeners: Mutex::new(Vec::new()),
            }),
        };
        lib.refresh();
        lib
    }

    pub fn sources(&self) -> &Sources {
        &self.inner.sources
    }

    /// Rescans and waits for it (blocking, up to [`SCAN_WAIT`]); returns the generation
    /// after it (unchanged when nothing changed).
    pub fn refresh(&self) -> u64 {
        let target = self.request_refresh();
        let deadline = Instant::now() + SCAN_WAIT;
        let mut scans = lock(&self.inner.scans);
        while scans.finished < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("the model library scan has not ended after {} s (a models folder does not answer?)", SCAN_WAIT.as_secs());
                break;
            }
            scans = self.inner.scanned.wait_timeout(scans, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(scans);
        self.generation()
    }

    /// Asks for a scan that starts after now, without waiting for it; returns its number.
    pub fn request_refresh(&self) -> u64 {
        let (target, start) = {
            let mut scans = lock(&self.inner.scans);
            let target = scans.started + 1;
            scans.wanted = scans.wanted.max(target);
            let start = !scans.running;
            scans.running = true;
            (target, start)
        };
        if start {
            let inner = self.inner.clone();
            if let Err(e) = std::thread::Builder::new().name("mlxbar-library-scan".into()).spawn(move || inner.run_scans()) {
                tracing::error!("cannot start the model library scan: {e}");
                lock(&self.inner.scans).running = false;
            }
        }
        target
    }

    /// Rescans and waits for it, on the async runtime without blocking it, for at most
    /// `wait`: Some(generation) after the scan, None when it did not end in time.
    pub async fn refresh_async(&self, wait: Duration) -> Option<u64> {
        let mut finished = self.inner.finished.subscribe();
        let target = self.request_refresh();
        tokio::time::timeout(wait, finished.wait_for(|&n| n >= target)).await.ok()?.ok()?;
        Some(self.generation())
    }

    /// Waits (async, at most `wait`) for the scan running now, if one is; true once none runs.
    pub async fn settled(&self, wait: Duration) -> bool {
        let mut finished = self.inner.finished.subscribe();
        let target = {
            let scans = lock(&self.inner.scans);
            if !scans.running {
                return true;
            }
            scans.started
        };
        let ended = matches!(tokio::time::timeout(wait, finished.wait_for(|&n| n >= target)).await, Ok(Ok(_)));
        ended
    }

    /// Every model found, sorted by id.
    pub fn entries(&self) -> Vec<ModelEntry> {
        self.inner.entries.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The model with exactly this id.
    pub fn get(&self, id: &str) -> Option<ModelEntry> {
        let entries = self.inner.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.binary_search_by(|e| e.id.as_str().cmp(id)).ok().map(|i| entries[i].clone())
    }

    /// Bumps on every change of the entries (1 after the first scan).
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::SeqCst)
    }

    /// Calls `f(generation)` after every change (on the scan thread).
    pub fn on_change(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        lock(&self.inner.listeners).push(Arc::new(f));
    }

    /// Refreshes on file-system changes under the sources (debounced) until the returned
    /// watcher is dropped.
    pub fn watch(self: &Arc<Self>) -> anyhow::Result<Watcher> {
        Watcher::start(self, watch::DEBOUNCE)
    }
}

impl Inner {
    /// The scan thread: scans while someone waits for a scan not yet started.
    fn run_scans(&self) {
        // A panicking scan must not leave `running` set: no scan would ever start again.
        struct OnPanic<'a>(&'a Inner);
        impl Drop for OnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut scans = lock(&self.0.scans);
                    (scans.running, scans.finished) = (false, scans.started);
                    let n = scans.finished;
                    drop(scans);
                    self.0.finished.send_replace(n);
                    self.0.scanned.notify_all();
                }
            }
        }
        let _on_panic = OnPanic(self);
        loop {
            let n = {
                let mut scans = lock(&self.scans);
                if scans.started >= scans.wanted {
                    // Decided under the lock: a request after this starts a new thread.
                    scans.running = false;
                    return;
                }
                scans.started += 1;
                scans.started
            };
            self.scan();
            lock(&self.scans).finished = n;
            self.finished.send_replace(n);
            self.scanned.notify_all();
        }
    }

    fn scan(&self) {
        let inspector = inspector::Inspector::new(std::mem::take(&mut *lock(&self.remembered)));
        let mut found = sources::scan(&self.sources, &inspector);
        *lock(&self.remembered) = inspector.into_remembered();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            if *entries == found && self.generation.load(Ordering::SeqCst) > 0 {
                return;
            }
            *entries = found;
        }
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::debug!(generation, "model library changed");
        let listeners = lock(&self.listeners).clone();
        for l in listeners {
            l(generation);
        }
    }
}
