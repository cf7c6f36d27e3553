//! Where the library looks, in the order that wins an id: paths given by the user,
//! mlxbar's own models dir, the config's `models_dirs`, the Hugging Face hub cache, LM
//! Studio's models folders. Scanning them yields entries with unique ids.
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::entry::{ModelEntry, ModelSource};
use super::inspector::Inspector;
use super::{files, hub_cache, inspect};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sources {
    pub hub_caches: Vec<PathBuf>,
    pub lmstudio: Vec<PathBuf>,
    pub mlxbar_models: PathBuf,
    pub models_dirs: Vec<PathBuf>,
    pub paths: Vec<PathBuf>,
}

/// LM Studio keeps `publisher/name/file.gguf` (or an MLX folder) this deep.
const MAX_DEPTH: usize = 4;

impl Sources {
    /// The hub cache from `HF_HUB_CACHE` / `HF_HOME`, LM Studio's default folders and
    /// mlxbar's models dir, plus the config's `models_dirs` and explicit `paths`.
    pub fn from_env(models_dirs: Vec<PathBuf>, paths: Vec<PathBuf>) -> Sources {
        Sources::from_vars(|k| std::env::var_os(k), dirs::home_dir(), models_dirs, paths)
    }

    /// [`Sources::from_env`] with the environment and home dir given (tests).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<OsString>,
        home: Option<PathBuf>,
        models_dirs: Vec<PathBuf>,
        paths: Vec<PathBuf>,
    ) -> Sources {
        let home = home.unwrap_or_else(|| PathBuf::from("."));
        let models_dirs = models_dirs.iter().map(|p| expand_home(p, &home)).collect();
        let paths = paths.iter().map(|p| expand_home(p, &home)).collect();
        Sources {
            hub_caches: vec![hub_cache_dir_from(&var, &home)],
            lmstudio: vec![home.join(".lmstudio").join("models"), home.join(".cache").join("lm-studio").join("models")],
            mlxbar_models: crate::model_store::cache_dir().join("models"),
            models_dirs,
            paths,
        }
    }

    /// Every directory (or file) a change under which can change the library.
    pub fn roots(&self) -> Vec<PathBuf> {
        let mut roots = self.paths.clone();
        roots.push(self.mlxbar_models.clone());
        roots.extend(self.models_dirs.iter().cloned());
        roots.extend(self.hub_caches.iter().cloned());
        roots.extend(self.lmstudio.iter().cloned());
        roots
    }
}

/// `~/x` -> `$HOME/x` (config files are written by hand).
fn expand_home(p: &Path, home: &Path) -> PathBuf {
    match p.strip_prefix("~") {
        Ok(rest) => home.join(rest),
        Err(_) => p.to_path_buf(),
    }
}

/// The hub cache huggingface_hub uses (and `mlxbar pull` writes): `$HF_HUB_CACHE`, else
/// `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> PathBuf {
    hub_cache_dir_from(&|k| std::env::var_os(k), &dirs::home_dir().unwrap_or_else(|| PathBuf::from(".")))
}

fn hub_cache_dir_from(var: &dyn Fn(&str) -> Option<OsString>, home: &Path) -> PathBuf {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return p;
    }
    if let Some(p) = set("HF_HOME") {
        return p.join("hub");
    }
    set("XDG_CACHE_HOME").unwrap_or_else(|| home.join(".cache")).join("huggingface").join("hub")
}

/// Every model the sources hold, each once (by canonical path), with unique ids: the
/// first source keeps the plain id; later ones get `@source`, then a path hash.
pub fn scan(sources: &Sources, inspector: &Inspector) -> Vec<ModelEntry> {
    let mut found = Vec::new();
    for p in &sources.paths {
        match inspector.inspect(p) {
            Some(e) => found.push(e),
            None if p.is_dir() => found.extend(scan_tree(p, ModelSource::Path, inspector)),
            None => tracing::warn!("--model {}: neither a .gguf file nor a model folder", p.display()),
        }
    }
    found.extend(scan_tree(&sources.mlxbar_models, ModelSource::Mlxbar, inspector));
    for d in &sources.models_dirs {
        found.extend(scan_tree(d, ModelSource::ModelsDir, inspector));
    }
    for d in &sources.hub_caches {
        found.extend(hub_cache::scan(d, ModelSource::HubCache, inspector));
    }
    for d in &sources.lmstudio {
        found.extend(scan_tree(d, ModelSource::LmStudio, inspector));
    }
    unique(found)
}

fn unique(found: Vec<ModelEntry>) -> Vec<ModelEntry> {
    let mut seen_paths = HashSet::new();
    let mut ids: HashMap<String, ()> = HashMap::new();
    let mut out = Vec::with_capacity(found.len());
    for mut e in found {
        let canonical = std::fs::canonicalize(&e.path).unwrap_or_else(|_| e.path.clone());
        if !seen_paths.insert(canonical) {
            continue;
        }
        if ids.contains_key(&e.id) {
            let with_source = format!("{}@{}", e.id, e.source.as_str());
            e.id = if ids.contains_key(&with_source) { format!("{}@{:08x}", e.id, path_hash(&e.path)) } else { with_source };
        }
        ids.insert(e.id.clone(), ());
        out.push(e);
    }
    out
}

/// Stable across runs and builds, so an id does not move between restarts.
fn path_hash(p: &Path) -> u32 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(p.as_os_str().as_encoded_bytes());
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// A directory walked for model folders (a `config.json` ends the descent), .gguf files
/// and hub-cache repos, to [`MAX_DEPTH`]; hidden entries, and what is neither a directory
/// nor a regular file (a FIFO, a socket), skipped.
pub fn scan_tree(root: &Path, source: ModelSource, inspector: &Inspector) -> Vec<ModelEntry> {
    let mut out = Vec::new();
    walk(root, source, 0, &mut out, inspector);
    for e in &mut out {
        e.source = source;
    }
    out
}

fn walk(dir: &Path, source: ModelSource, depth: usize, out: &mut Vec<ModelEntry>, inspector: &Inspector) {
    if let Some(e) = inspector.inspect(dir) {
        return out.push(e);
    }
    if depth >= MAX_DEPTH {
        return;
    }
    let mut children: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    children.sort();
    for c in children {
        let name = c.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if c.is_dir() && hub_cache::repo_id(name).is_some() {
            out.extend(hub_cache::scan_repo(&c, source, inspector));
        } else if c.is_dir() {
            walk(&c, source, depth + 1, out, inspector);
        } else if inspect::is_gguf(&c) && !hub_cache::is_projector(&c) && !files::is_special(&c) {
            out.push(inspector.gguf(&c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).map(OsString::from)
    }

    #[test]
    fn the_hub_cache_follows_huggingface_hubs_precedence() {
        let home = PathBuf::from("/home/u");
        let hub = |pairs: &[(&str, &str)]| Sources::from_vars(env(pairs), Some(home.clone()), vec![], vec![]).hub_caches;
        assert_eq!(hub(&[]), vec![PathBuf::from("/home/u/.cache/huggingface/hub")]);
        assert_eq!(hub(&[("XDG_CACHE_HOME", "/x")]), vec![PathBuf::from("/x/huggingface/hub")]);
        assert_eq!(hub(&[("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/x")]), vec![PathBuf::from("/hf/hub")]);
        assert_eq!(hub(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/hf")]), vec![PathBuf::from("/c")]);
        assert_eq!(hub(&[("HF_HUB_CACHE", ""), ("HF_HOME", "/hf")]), vec![PathBuf::from("/hf/hub")], "empty is unset");
        let s = Sources::from_vars(env(&[]), Some(home), vec!["~/models".into(), "/abs".into()], vec![]);
        assert_eq!(s.models_dirs, vec![PathBuf::from("/home/u/models"), PathBuf::from("/abs")]);
        assert_eq!(s.lmstudio, vec![PathBuf::from("/home/u/.lmstudio/models"), PathBuf::from("/home/u/.cache/lm-studio/models")]);
    }

    fn entry(id: &str, path: &str, source: ModelSource) -> ModelEntry {
        let mut e = inspect::folder(Path::new(path));
        (e.id, e.source) = (id.into(), source);
        e
    }

    #[test]
    fn clashing_ids_get_the_source_then_a_hash() {
        let out = unique(vec![
            entry("m", "/nonexistent/a/m", ModelSource::Mlxbar),
            entry("m", "/nonexistent/b/m", ModelSource::LmStudio),
            entry("m", "/nonexistent/c/m", ModelSource::LmStudio),
            entry("m", "/nonexistent/a/m", ModelSource::Path),
        ]);
        let ids: Vec<&str> = out.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids.len(), 3, "the same path twice is one model: {ids:?}");
        assert_eq!(&ids[..2], ["m", "m@lm-studio"]);
        assert!(ids[2].starts_with("m@") && ids[2].len() == "m@".len() + 8, "{ids:?}");
        assert_eq!(unique(vec![entry("m", "/nonexistent/c/m", ModelSource::LmStudio)])[0].id, "m");
    }
}
