//! The model library: every local model mlxbar can find (hub cache, LM Studio, its own
//! models dir, the config's `models_dirs`, paths given), what each is, and whether the
//! engine can run it. Rescanned on request and, with [`Library::watch`], on a
//! file-system change; [`pull`] downloads more from Hugging Face.
pub mod cli;
pub mod entry;
pub mod hub_cache;
pub mod inspect;
pub mod pull;
pub mod sources;
pub mod watch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub use entry::{ModelEntry, ModelFormat, ModelSource, Quantization, Shape};
pub use sources::Sources;
pub use watch::Watcher;

type Listener = Arc<dyn Fn(u64) + Send + Sync>;

pub struct Library {
    sources: Sources,
    /// Sorted by id.
    entries: RwLock<Vec<ModelEntry>>,
    generation: AtomicU64,
    /// One scan at a time: two racing scans could publish an older result last.
    scanning: Mutex<()>,
    listeners: Mutex<Vec<Listener>>,
}

impl Library {
    /// Scans once (blocking: call it in `spawn_blocking` or at start).
    pub fn new(sources: Sources) -> Library {
        let lib = Library {
            sources,
            entries: RwLock::new(Vec::new()),
            generation: AtomicU64::new(0),
            scanning: Mutex::new(()),
            listeners: Mutex::new(Vec::new()),
        };
        lib.refresh();
        lib
    }

    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// Rescans; returns the generation after it (unchanged when nothing changed).
    pub fn refresh(&self) -> u64 {
        let _one = self.scanning.lock().unwrap_or_else(|e| e.into_inner());
        let mut found = sources::scan(&self.sources);
        found.sort_by(|a, b| a.id.cmp(&b.id));
        {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            if *entries == found && self.generation.load(Ordering::SeqCst) > 0 {
                return self.generation();
            }
            *entries = found;
        }
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::debug!(generation, "model library changed");
        let listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for l in listeners {
            l(generation);
        }
        generation
    }

    /// Every model found, sorted by id.
    pub fn entries(&self) -> Vec<ModelEntry> {
        self.entries.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The model with exactly this id.
    pub fn get(&self, id: &str) -> Option<ModelEntry> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.binary_search_by(|e| e.id.as_str().cmp(id)).ok().map(|i| entries[i].clone())
    }

    /// Bumps on every change of the entries (1 after the first scan).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Calls `f(generation)` after every change (on the thread that refreshed).
    pub fn on_change(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(f));
    }

    /// Refreshes on file-system changes under the sources (debounced) until the returned
    /// watcher is dropped.
    pub fn watch(self: &Arc<Self>) -> anyhow::Result<Watcher> {
        Watcher::start(self, watch::DEBOUNCE)
    }
}
