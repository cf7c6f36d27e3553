//! What the API sets that must survive a restart: alert snoozes, model pins, the
//! keep-alives set through `POST /api/models/{id}/load` and the menu bar's Ollama port switch. One small JSON file,
//! `state.json` in the data dir, written whole on every change (atomically, user-only,
//! the directory synced: see `private_fs`). A file that is not such a JSON is reported,
//! renamed aside (`state.json.corrupt-<unix seconds>`, kept for the user to look at) and
//! the server starts with nothing restored. A data dir that cannot be written costs the
//! persistence (logged), never the server.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::registry::KeepAlive;

pub const FILE_NAME: &str = "state.json";

/// The file's content. Unknown fields are ignored (a newer mlxbar's file still loads).
#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq)]
#[serde(default)]
pub struct Persisted {
    /// Alert id -> snoozed until (unix seconds).
    pub snoozes: BTreeMap<String, u64>,
    /// Model id -> pinned (true) or unpinned (false) through the API; over the config's `pinned`.
    pub pins: BTreeMap<String, bool>,
    /// Model id -> its keep-alive, set through the API.
    pub keep_alive: BTreeMap<String, KeepAlive>,
    /// The Ollama port turned on or off from the menu bar; over the config's `ollama_port`.
    pub ollama_port: Option<bool>,
}

pub struct StateStore {
    /// None: kept in memory only.
    path: Option<PathBuf>,
    state: Mutex<Persisted>,
}

impl StateStore {
    /// The state in `data_dir`, read now (a corrupt file set aside, see the module doc).
    pub fn open(data_dir: &Path) -> Arc<StateStore> {
        let path = data_dir.join(FILE_NAME);
        let state = read(&path);
        Arc::new(StateStore { path: Some(path), state: Mutex::new(state) })
    }

    /// A store that writes nothing (tools and tests that do not persist).
    pub fn in_memory() -> Arc<StateStore> {
        Arc::new(StateStore { path: None, state: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, Persisted> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self) -> Persisted {
        self.lock().clone()
    }

    /// Changes the state and, if it changed, writes it (under the lock, so writes land in
    /// the order of the changes). A failed write is logged; the change holds in memory.
    pub fn update(&self, change: impl FnOnce(&mut Persisted)) {
        let mut state = self.lock();
        let before = state.clone();
        change(&mut state);
        if *state == before {
            return;
        }
        let Some(path) = &self.path else { return };
        let written =
            serde_json::to_vec_pretty(&*state).map_err(anyhow::Error::from).and_then(|bytes| crate::private_fs::write_atomic(path, &bytes));
        if let Err(e) = written {
            tracing::warn!("the server's state (snoozes, pins, keep-alives) is not saved: {e:#}");
        }
    }
}

/// The state in `path`: empty when there is none; a corrupt one renamed aside.
fn read(path: &Path) -> Persisted {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Persisted::default(),
        Err(e) => {
            tracing::warn!("cannot read {} ({e}); starting without the saved snoozes, pins and keep-alives", path.display());
            return Persisted::default();
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(state) => state,
        Err(e) => {
            let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let mut aside = path.as_os_str().to_owned();
            aside.push(format!(".corrupt-{unix}"));
            let aside = PathBuf::from(aside);
            match std::fs::rename(path, &aside) {
                Ok(()) => tracing::error!(
                    "{} is corrupt ({e}); moved to {} and starting without the saved snoozes, pins and keep-alives",
                    path.display(),
                    aside.display()
                ),
                Err(re) => tracing::error!("{} is corrupt ({e}) and cannot be moved aside ({re}); it will be overwritten", path.display()),
            }
            Persisted::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_survive_a_reopen_and_a_corrupt_file_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path());
        assert_eq!(store.get(), Persisted::default());
        store.update(|p| {
            p.snoozes.insert("queue_backlog".into(), 4_000_000_000);
            p.pins.insert("org/m".into(), true);
            p.keep_alive.insert("org/m".into(), KeepAlive::Forever);
        });
        let again = StateStore::open(dir.path()).get();
        assert_eq!(again.snoozes["queue_backlog"], 4_000_000_000);
        assert_eq!((again.pins["org/m"], again.keep_alive["org/m"]), (true, KeepAlive::Forever));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }

        std::fs::write(dir.path().join(FILE_NAME), "{\"pins\": {\"org/m\": tru").unwrap();
        let store = StateStore::open(dir.path());
        assert_eq!(store.get(), Persisted::default());
        let aside: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("state.json.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(!dir.path().join(FILE_NAME).exists());
        store.update(|p| {
            p.pins.insert("org/n".into(), false);
        });
        assert!(!StateStore::open(dir.path()).get().pins["org/n"], "written afresh");
    }

    #[test]
    fn an_unwritable_data_dir_keeps_the_state_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, "x").unwrap();
        let store = StateStore::open(&file.join("data"));
        store.update(|p| {
            p.pins.insert("org/m".into(), true);
        });
        assert!(store.get().pins["org/m"]);
    }
}
