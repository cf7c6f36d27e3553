//! The Hugging Face hub cache layout, as huggingface_hub writes it, so every tool shares
//! one copy: `<cache>/models--org--name/blobs/<etag>` holds the bytes,
//! `snapshots/<commit>/<file>` is a relative symlink to the blob, `refs/<revision>` holds
//! the commit a branch or tag pointed at. Directories are 0700, files 0600 (private_fs).
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface` (on macOS too).
pub fn hf_home() -> PathBuf {
    if let Some(home) = std::env::var_os("HF_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("huggingface")
}

/// `HF_HUB_CACHE` (or the older `HUGGINGFACE_HUB_CACHE`), else `<hf_home>/hub`.
pub fn hub_cache_dir() -> PathBuf {
    ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"]
        .iter()
        .find_map(|name| std::env::var_os(name).filter(|v| !v.is_empty()))
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// `<cache>/models--org--name`.
pub fn repo_dir(cache_dir: &Path, repo: &str) -> PathBuf {
    cache_dir.join(format!("models--{}", repo.replace('/', "--")))
}

pub fn blob_path(repo_dir: &Path, etag: &str) -> PathBuf {
    repo_dir.join("blobs").join(etag)
}

/// Where a download in progress lives: resumed from its length next time.
pub fn partial_path(blob: &Path) -> PathBuf {
    let mut name = blob.as_os_str().to_owned();
    name.push(".incomplete");
    PathBuf::from(name)
}

pub fn snapshot_dir(repo_dir: &Path, commit: &str) -> PathBuf {
    repo_dir.join("snapshots").join(commit)
}

/// Bytes of this blob already here: all of it when the blob is complete, else the partial's
/// length (at most `size`). A blob of the wrong size counts as absent (it is fetched again).
pub fn bytes_on_disk(repo_dir: &Path, etag: &str, size: u64) -> u64 {
    let blob = blob_path(repo_dir, etag);
    if std::fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == size) {
        return size;
    }
    std::fs::metadata(partial_path(&blob)).map(|m| m.len()).unwrap_or(0).min(size)
}

/// The symlink's target, relative so the cache can move: `../../blobs/<etag>`, one more
/// `..` per folder inside the repo.
pub fn link_target(file: &str, etag: &str) -> PathBuf {
    let depth = file.split('/').count() - 1;
    let mut target = PathBuf::from("../..");
    for _ in 0..depth {
        target.push("..");
    }
    target.join("blobs").join(etag)
}

/// Points `snapshots/<commit>/<file>` at its blob (replacing what was there).
pub fn link(repo_dir: &Path, commit: &str, file: &str, etag: &str) -> Result<()> {
    let snapshot = snapshot_dir(repo_dir, commit);
    let path = snapshot.join(file);
    // The names were checked; this holds whatever a future caller passes: only plain
    // components below the snapshot (no `..`, no root that would replace the join).
    let inside = Path::new(file).components().all(|c| matches!(c, std::path::Component::Normal(_)));
    anyhow::ensure!(inside && path.starts_with(&snapshot), "'{file}' would land outside {}", snapshot.display());
    let parent = path.parent().context("a snapshot file has a folder")?;
    crate::private_fs::create_dir_all(parent)?;
    if std::fs::symlink_metadata(&path).is_ok() {
        std::fs::remove_file(&path).with_context(|| format!("replacing {}", path.display()))?;
    }
    #[cfg(unix)]
    std::os::unix::fs::symlink(link_target(file, etag), &path).with_context(|| format!("linking {}", path.display()))?;
    // Without symlinks (as huggingface_hub does on Windows without developer mode): a copy.
    #[cfg(not(unix))]
    std::fs::copy(blob_path(repo_dir, etag), &path).with_context(|| format!("copying to {}", path.display()))?;
    Ok(())
}

/// `refs/<revision>` = the commit (no newline, as huggingface_hub writes it).
pub fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<()> {
    crate::private_fs::write_atomic(&repo_dir.join("refs").join(revision), commit.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_and_reach_the_blob() {
        assert_eq!(link_target("config.json", "abc"), PathBuf::from("../../blobs/abc"));
        assert_eq!(link_target("q/m.gguf", "abc"), PathBuf::from("../../../blobs/abc"));
        let root = tempfile::tempdir().unwrap();
        let repo = repo_dir(root.path(), "org/name");
        assert!(repo.ends_with("models--org--name"));
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(blob_path(&repo, "abc"), "hello").unwrap();
        for file in ["config.json", "q/m.gguf"] {
            link(&repo, "c0ffee1", file, "abc").unwrap();
            link(&repo, "c0ffee1", file, "abc").unwrap(); // again: replaced, not an error
            assert_eq!(std::fs::read_to_string(snapshot_dir(&repo, "c0ffee1").join(file)).unwrap(), "hello");
        }
        for outside in ["../escape", "/tmp/escape", "a/../../escape"] {
            let err = link(&repo, "c0ffee1", outside, "abc").unwrap_err();
            assert!(err.to_string().contains("outside"), "{outside}: {err}");
        }
        assert!(!repo.join("snapshots/escape").exists() && !repo.join("escape").exists());
        assert_eq!(bytes_on_disk(&repo, "abc", 5), 5);
        assert_eq!(bytes_on_disk(&repo, "abc", 9), 0, "a blob of the wrong size is not counted");
        std::fs::write(partial_path(&blob_path(&repo, "def")), "hel").unwrap();
        assert_eq!(bytes_on_disk(&repo, "def", 5), 3);
    }
}
