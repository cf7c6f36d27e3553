//! Keeps the library current: a `notify` watch on every source (recursive where it
//! exists, on the nearest existing parent where it does not yet), events debounced into
//! one rescan. A source that appears later (LM Studio installed, the first hub download)
//! gets its own watch on the next rescan. The rescan is asked for, not waited on: this
//! thread never blocks on a folder that does not answer. Writes into a download's
//! `.incomplete` blob are not changes (a pull writes thousands of chunks).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};

use super::Library;

/// Quiet time after the last event before rescanning: a download or a copy is a burst.
pub const DEBOUNCE: Duration = Duration::from_millis(300);
/// A steady stream of events (a long download) still rescans this often.
const MAX_DELAY_FACTOR: u32 = 10;

enum Msg {
    Fs(notify::Result<Event>),
    Stop,
}

/// Watching until dropped.
pub struct Watcher {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    pub(crate) fn start(lib: &Arc<Library>, debounce: Duration) -> Result<Watcher> {
        let (tx, rx) = mpsc::channel();
        let events = tx.clone();
        let mut inner = notify::recommended_watcher(move |ev| {
            let _ = events.send(Msg::Fs(ev));
        })
        .context("starting the file-system watch")?;
        let roots = lib.sources().roots();
        let mut watched = HashMap::new();
        sync_watches(&mut inner, &roots, &mut watched);
        let lib: Weak<Library> = Arc::downgrade(lib);
        let thread = std::thread::Builder::new().name("mlxbar-library-watch".into()).spawn(move || loop {
            match rx.recv() {
                Ok(Msg::Fs(ev)) if relevant(&ev, &roots) => {}
                Ok(Msg::Fs(_)) => continue,
                Ok(Msg::Stop) | Err(_) => return,
            }
            let until = Instant::now() + debounce * MAX_DELAY_FACTOR;
            loop {
                match rx.recv_timeout(debounce) {
                    Ok(Msg::Fs(_)) if Instant::now() < until => continue,
                    Ok(Msg::Fs(_)) | Err(RecvTimeoutError::Timeout) => break,
                    Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            let Some(lib) = lib.upgrade() else { return };
            // Watch what appeared first, then scan: nothing falls between the two.
            sync_watches(&mut inner, &roots, &mut watched);
            lib.request_refresh();
        })?;
        Ok(Watcher { tx, thread: Some(thread) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// Adds a recursive watch on each root that exists, else a flat one on its nearest
/// existing ancestor (to see it appear). `watched`: path -> recursive.
fn sync_watches(inner: &mut RecommendedWatcher, roots: &[PathBuf], watched: &mut HashMap<PathBuf, bool>) {
    for root in roots {
        let (path, recursive) = if root.exists() {
            (root.clone(), root.is_dir())
        } else {
            match root.ancestors().skip(1).find(|a| a.is_dir()) {
                Some(a) => (a.to_path_buf(), false),
                None => continue,
            }
        };
        if watched.get(&path).is_some_and(|&r| r || !recursive) {
            continue;
        }
        let mode = if recursive { RecursiveMode::Recursive } else { RecursiveMode::NonRecursive };
        match inner.watch(&path, mode) {
            Ok(()) => {
                watched.insert(path, recursive);
            }
            Err(e) => tracing::warn!("cannot watch {} for models: {e}", path.display()),
        }
    }
}

/// A change that can change the library: not a read (scanning opens files), not lock
/// files, not bytes landing in a download's `.incomplete` blob (its creation, removal
/// and rename into place are changes), and on or toward a source (an ancestor watch sees
/// its siblings too).
fn relevant(ev: &notify::Result<Event>, roots: &[PathBuf]) -> bool {
    let Ok(ev) = ev else { return true };
    let write = match ev.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => return false,
        EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any | ModifyKind::Metadata(_)) => true,
        _ => false,
    };
    ev.paths.iter().any(|p| !(is_lock(p) || write && is_partial(p)) && roots.iter().any(|r| p.starts_with(r) || r.starts_with(p)))
}

/// A blob still downloading (`blobs/<etag>.incomplete`).
fn is_partial(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "incomplete")
}

/// huggingface_hub's `.locks/` beside the repos.
fn is_lock(p: &Path) -> bool {
    p.components().any(|c| c.as_os_str() == ".locks")
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, RenameMode};

    #[test]
    fn reads_and_unrelated_paths_are_not_changes() {
        let roots = vec![PathBuf::from("/home/u/.lmstudio/models"), PathBuf::from("/hub")];
        let ev = |kind, p: &str| Ok(Event::new(kind).add_path(PathBuf::from(p)));
        assert!(relevant(&ev(EventKind::Create(CreateKind::Folder), "/hub/models--a--b"), &roots));
        assert!(relevant(&ev(EventKind::Create(CreateKind::Folder), "/home/u/.lmstudio"), &roots), "a source appearing");
        assert!(!relevant(&ev(EventKind::Modify(ModifyKind::Any), "/home/u/.bash_history"), &roots));
        assert!(!relevant(&ev(EventKind::Access(AccessKind::Open(AccessMode::Any)), "/hub/models--a--b/x"), &roots));
        assert!(relevant(&ev(EventKind::Access(AccessKind::Close(AccessMode::Write)), "/hub/models--a--b/x"), &roots));
        assert!(!relevant(&ev(EventKind::Create(CreateKind::File), "/hub/.locks/models--a--b/x.lock"), &roots));
        // A download's chunks are not changes; its start and its end are.
        let partial = "/hub/models--a--b/blobs/abc.incomplete";
        for write in [
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
        ] {
            assert!(!relevant(&ev(write, partial), &roots), "{write:?}");
        }
        assert!(relevant(&ev(EventKind::Create(CreateKind::File), partial), &roots));
        assert!(relevant(&ev(EventKind::Modify(ModifyKind::Data(DataChange::Any)), "/hub/models--a--b/blobs/abc"), &roots));
        let renamed = Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(PathBuf::from(partial))
            .add_path(PathBuf::from("/hub/models--a--b/blobs/abc"));
        assert!(relevant(&Ok(renamed), &roots), "the blob moved into place");
    }
}
