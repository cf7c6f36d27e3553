//! The Hugging Face hub cache: `models--{org}--{name}/` with `blobs/` (content-addressed
//! files, `.incomplete` while downloading), `snapshots/{commit}/` (relative symlinks into
//! the blobs) and `refs/main` (the commit `main` pointed at).
use std::path::{Path, PathBuf};

use super::entry::{ModelEntry, ModelSource};
use super::inspector::Inspector;
use super::{files, inspect};

/// `models--org--name` -> `org/name` (`models--gpt2` -> `gpt2`); None for datasets,
/// spaces and anything else.
pub fn repo_id(dir_name: &str) -> Option<String> {
    let rest = dir_name.strip_prefix("models--")?;
    if rest.is_empty() {
        return None;
    }
    Some(match rest.split_once("--") {
        Some((org, name)) => format!("{org}/{name}"),
        None => rest.to_string(),
    })
}

/// Every model repo under `root`, sorted by directory name.
pub fn scan(root: &Path, source: ModelSource, inspector: &Inspector) -> Vec<ModelEntry> {
    let mut repos: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && p.file_name().and_then(|n| n.to_str()).and_then(repo_id).is_some())
        .collect();
    repos.sort();
    repos.iter().flat_map(|r| scan_repo(r, source, inspector)).collect()
}

/// The snapshot `refs/main` names, else the newest one; with its commit.
pub fn snapshot(repo: &Path) -> Option<(String, PathBuf)> {
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = files::read_text(&repo.join("refs").join("main")) {
        let rev = rev.trim().to_string();
        let dir = snapshots.join(&rev);
        if !rev.is_empty() && dir.is_dir() {
            return Some((rev, dir));
        }
    }
    let newest = std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| (e.metadata().and_then(|m| m.modified()).ok(), e.file_name()))?;
    Some((newest.file_name().to_string_lossy().into_owned(), newest.path()))
}

/// One repo's entries: its snapshot as a folder, or each .gguf in it.
pub fn scan_repo(repo: &Path, source: ModelSource, inspector: &Inspector) -> Vec<ModelEntry> {
    let Some(id) = repo.file_name().and_then(|n| n.to_str()).and_then(repo_id) else { return vec![] };
    let downloading = has_incomplete_blob(repo);
    let Some((rev, snap)) = snapshot(repo) else {
        // Nothing finished yet: say so rather than hide a download in progress.
        if !downloading {
            return vec![];
        }
        let mut e = inspect::folder(repo);
        (e.id, e.source, e.size_bytes) = (id, source, 0);
        e.runnable = false;
        e.unsupported_reason = Some("incomplete download (no snapshot yet)".into());
        return vec![e];
    };
    let mut entries = Vec::new();
    if snap.join("config.json").exists() {
        let mut e = inspector.folder(&snap);
        if let Some(why) = incomplete(&snap, downloading) {
            e.runnable = false;
            e.unsupported_reason = Some(why);
        }
        e.id = id.clone();
        entries.push(e);
    } else {
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(&snap)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| inspect::is_gguf(p) && !is_projector(p))
            .collect();
        ggufs.sort();
        let several = ggufs.len() > 1;
        for g in ggufs {
            let mut e = inspector.gguf(&g);
            if !g.exists() {
                (e.runnable, e.unsupported_reason) = (false, Some("incomplete download (the .gguf blob is missing)".into()));
            }
            // One repo often offers several quantizations: each is its own model.
            e.id = if several { format!("{id}/{}", e.id) } else { id.clone() };
            entries.push(e);
        }
        if entries.is_empty() && downloading {
            let mut e = inspect::folder(&snap);
            e.id = id.clone();
            (e.runnable, e.unsupported_reason) = (false, Some("incomplete download (no config.json or .gguf yet)".into()));
            entries.push(e);
        }
    }
    for e in &mut entries {
        e.source = source;
        e.revision = Some(rev.clone());
    }
    entries
}

/// LM Studio and llama.cpp ship a vision model's image projector as `mmproj-*.gguf`: a
/// part of a model, not one.
pub fn is_projector(p: &Path) -> bool {
    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.to_ascii_lowercase().starts_with("mmproj"))
}

fn has_incomplete_blob(repo: &Path) -> bool {
    std::fs::read_dir(repo.join("blobs"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .any(|e| e.path().extension().is_some_and(|x| x == "incomplete"))
}

/// Why a folder snapshot is not all there: a blob still downloading, a link to a blob
/// that is gone, or no weights yet.
fn incomplete(snap: &Path, downloading: bool) -> Option<String> {
    let dangling: Vec<String> = std::fs::read_dir(snap)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().symlink_metadata().is_ok() && !e.path().exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if let Some(f) = dangling.first() {
        return Some(format!("incomplete download ({f} links to a missing blob)"));
    }
    if let Some(f) = inspect::missing_shards(snap).first() {
        return Some(format!("incomplete download ({f} is missing)"));
    }
    if crate::engine::model::hf::safetensors_files(snap).unwrap_or_default().is_empty() {
        return Some("incomplete download (no *.safetensors yet)".into());
    }
    downloading.then(|| "incomplete download (a file is still downloading)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::library::ModelFormat;

    #[test]
    fn repo_ids_from_dir_names() {
        assert_eq!(
            repo_id("models--mlx-community--SmolLM2-135M-Instruct-8bit").as_deref(),
            Some("mlx-community/SmolLM2-135M-Instruct-8bit")
        );
        assert_eq!(repo_id("models--gpt2").as_deref(), Some("gpt2"));
        assert_eq!(repo_id("datasets--org--x"), None);
        assert_eq!(repo_id("models--"), None);
    }

    #[test]
    fn refs_main_picks_the_snapshot_else_the_newest() {
        let repo = tempfile::tempdir().unwrap();
        let snaps = repo.path().join("snapshots");
        std::fs::create_dir_all(snaps.join("aaa")).unwrap();
        std::fs::create_dir_all(snaps.join("bbb")).unwrap();
        std::fs::create_dir_all(repo.path().join("refs")).unwrap();
        std::fs::write(repo.path().join("refs/main"), "aaa\n").unwrap();
        assert_eq!(snapshot(repo.path()).unwrap().0, "aaa");
        std::fs::write(repo.path().join("refs/main"), "gone").unwrap();
        assert!(["aaa", "bbb"].contains(&snapshot(repo.path()).unwrap().0.as_str()));
    }

    #[test]
    fn a_download_with_no_snapshot_yet_is_listed_as_incomplete() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("models--org--m");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        assert!(scan(root.path(), ModelSource::HubCache, &Inspector::default()).is_empty(), "an empty repo dir is nothing");
        std::fs::write(repo.join("blobs/abc.incomplete"), "x").unwrap();
        let e = scan(root.path(), ModelSource::HubCache, &Inspector::default()).pop().unwrap();
        assert_eq!((e.id.as_str(), e.format, e.runnable), ("org/m", ModelFormat::Mlx, false));
        assert!(e.unsupported_reason.unwrap().starts_with("incomplete download"));
    }
}
