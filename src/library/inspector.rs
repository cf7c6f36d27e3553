//! A scan's inspections, remembered to the next scan by what they read: a folder by the
//! name, size, times and inode of every file in it (links followed, so a hub snapshot's
//! blobs count), a GGUF by its own. A rescan then re-reads only what changed; a large
//! library costs a `stat` per file, not a header parse per model.
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::entry::ModelEntry;
use super::inspect;

/// What a file looked like: size, modified and changed times, inode. None: unreadable or
/// a dangling link.
type Stamp = Option<(u64, Option<SystemTime>, i64, u64)>;

/// One model's inputs: `(file name, stamp)` of each file it is made of.
type Fingerprint = Vec<(OsString, Stamp)>;

pub type Remembered = HashMap<PathBuf, (Fingerprint, ModelEntry)>;

/// Inspects for one scan: reuses what `before` holds when its fingerprint still matches,
/// and keeps this scan's results for the next one ([`Inspector::into_remembered`]).
#[derive(Default)]
pub struct Inspector {
    before: Remembered,
    now: RefCell<Remembered>,
}

impl Inspector {
    pub fn new(before: Remembered) -> Inspector {
        Inspector { before, now: RefCell::default() }
    }

    /// What this scan inspected (what the next one may reuse).
    pub fn into_remembered(self) -> Remembered {
        self.now.into_inner()
    }

    /// [`inspect::inspect`], remembered.
    pub fn inspect(&self, path: &Path) -> Option<ModelEntry> {
        if path.is_dir() {
            path.join("config.json").is_file().then(|| self.folder(path))
        } else if inspect::is_gguf(path) {
            Some(self.gguf(path))
        } else {
            None
        }
    }

    /// [`inspect::folder`], remembered.
    pub fn folder(&self, dir: &Path) -> ModelEntry {
        self.remembered(dir, folder_fingerprint(dir), inspect::folder)
    }

    /// [`inspect::gguf`], remembered.
    pub fn gguf(&self, file: &Path) -> ModelEntry {
        self.remembered(file, vec![(OsString::new(), stamp(file))], inspect::gguf)
    }

    fn remembered(&self, path: &Path, fingerprint: Fingerprint, inspect: fn(&Path) -> ModelEntry) -> ModelEntry {
        let entry = match self.before.get(path) {
            Some((seen, entry)) if *seen == fingerprint => entry.clone(),
            _ => inspect(path),
        };
        self.now.borrow_mut().insert(path.to_path_buf(), (fingerprint, entry.clone()));
        entry
    }
}

fn folder_fingerprint(dir: &Path) -> Fingerprint {
    let mut files: Fingerprint =
        std::fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()).map(|e| (e.file_name(), stamp(&e.path()))).collect();
    files.sort();
    files
}

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let (changed, inode) = {
        use std::os::unix::fs::MetadataExt;
        (m.ctime().wrapping_mul(1_000_000_000).wrapping_add(m.ctime_nsec()), m.ino())
    };
    #[cfg(not(unix))]
    let (changed, inode) = (0, 0);
    Some((m.len(), m.modified().ok(), changed, inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_model_is_not_read_again_and_a_changed_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{not json").unwrap();
        let first = Inspector::default();
        assert!(first.inspect(&model).unwrap().unsupported_reason.unwrap().starts_with("config.json: "));
        // Tell a reuse from a re-read: doctor the remembered entry.
        let doctored = |i: Inspector| {
            let mut r = i.into_remembered();
            r.get_mut(&model).unwrap().1.unsupported_reason = Some("remembered".into());
            Inspector::new(r)
        };
        let second = doctored(first);
        assert_eq!(second.inspect(&model).unwrap().unsupported_reason.as_deref(), Some("remembered"), "unchanged: reused");
        let third = doctored(second);
        std::fs::write(model.join("config.json"), r#"{"hidden_size": 4}"#).unwrap();
        assert_eq!(third.inspect(&model).unwrap().unsupported_reason.as_deref(), Some("config.json has no model_type"), "changed: read");
        let fourth = doctored(third);
        std::fs::write(model.join("tokenizer.json"), "{}").unwrap();
        assert_ne!(fourth.inspect(&model).unwrap().unsupported_reason.as_deref(), Some("remembered"), "a file added: read");
        assert_eq!(fourth.into_remembered().len(), 1);
        assert!(Inspector::default().into_remembered().is_empty(), "only what a scan saw is kept");
    }
}
