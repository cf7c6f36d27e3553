//! Where bench runs live, under the data dir's `metrics/`:
//! `history/<id>.json` (one compact entry per finished run), `bench/runs/<id>.json` (full
//! record) and `<id>.html` (report), `bench/plans/` (user plans). Writes go to a temp file
//! in the same directory and are renamed into place, so a crash never leaves half a file;
//! a file that does not parse is skipped with a warning.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::record::{is_valid_run_id, HistoryEntry, RunRecord, RunState};

#[derive(Debug, Clone)]
pub struct BenchStore {
    root: PathBuf,
}

impl BenchStore {
    /// `data_dir` is the app's data dir; everything goes below its `metrics/`.
    pub fn new(data_dir: &Path) -> BenchStore {
        BenchStore { root: data_dir.join("metrics") }
    }

    pub fn plans_dir(&self) -> PathBuf {
        self.root.join("bench").join("plans")
    }

    fn runs_dir(&self) -> PathBuf {
        self.root.join("bench").join("runs")
    }

    fn history_dir(&self) -> PathBuf {
        self.root.join("history")
    }

    pub fn report_path(&self, id: &str) -> PathBuf {
        self.runs_dir().join(format!("{id}.html"))
    }

    /// Fails with the reason when a run's files could not be saved (checked before a run).
    pub fn check_writable(&self) -> Result<()> {
        crate::private_fs::check_writable(&self.runs_dir()).and_then(|()| crate::private_fs::check_writable(&self.history_dir()))
    }

    /// Saves the full record, its report, and (for a finished run) the history entry.
    pub fn save(&self, record: &RunRecord, report_html: &str) -> Result<()> {
        write_atomic(&self.runs_dir().join(format!("{}.json", record.id)), serde_json::to_vec_pretty(record)?.as_slice())?;
        write_atomic(&self.report_path(&record.id), report_html.as_bytes())?;
        if record.state == RunState::Done {
            write_atomic(&self.history_dir().join(format!("{}.json", record.id)), serde_json::to_vec(&record.history_entry())?.as_slice())?;
        }
        Ok(())
    }

    /// Finished runs, newest first, at most `limit`.
    pub fn history(&self, limit: usize) -> Vec<HistoryEntry> {
        let mut entries: Vec<HistoryEntry> = read_all(&self.history_dir());
        entries.sort_by(|a, b| (b.finished_unix, &b.id).cmp(&(a.finished_unix, &a.id)));
        entries.truncate(limit);
        entries
    }

    pub fn run(&self, id: &str) -> Option<RunRecord> {
        if !is_valid_run_id(id) {
            return None;
        }
        read_json(&self.runs_dir().join(format!("{id}.json"))).ok()
    }
}

use crate::private_fs::write_atomic;

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}

/// Every `*.json` in `dir` that parses as `T`; the rest are skipped with a warning.
fn read_all<T: DeserializeOwned + Serialize>(dir: &Path) -> Vec<T> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| match read_json::<T>(&p) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!("skipping bench history file: {e:#}");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::machine::Machine;
    use crate::bench::plan::Plan;

    fn record(id: &str, finished: u64, state: RunState) -> RunRecord {
        RunRecord {
            id: id.into(),
            profile: "quick".into(),
            plan: Plan::builtins().remove(0),
            state,
            started_unix: finished - 10,
            finished_unix: Some(finished),
            mlxbar_version: "0".into(),
            machine: Machine::default(),
            targets: vec![],
            cells: vec![],
            error: None,
        }
    }

    #[test]
    fn history_is_newest_first_limited_and_skips_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = BenchStore::new(dir.path());
        store.save(&record("a", 100, RunState::Done), "<html>").unwrap();
        store.save(&record("b", 300, RunState::Done), "<html>").unwrap();
        store.save(&record("c", 200, RunState::Done), "<html>").unwrap();
        store.save(&record("d", 400, RunState::Cancelled), "<html>").unwrap();
        std::fs::write(store.history_dir().join("corrupt.json"), "{\"id\": ").unwrap();
        std::fs::write(store.history_dir().join("foreign.json"), "{\"hello\": 1}").unwrap();
        let ids = |v: Vec<HistoryEntry>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(store.history(10)), ["b", "c", "a"], "cancelled runs are not history");
        assert_eq!(ids(store.history(2)), ["b", "c"]);
        assert_eq!(store.run("d").unwrap().state, RunState::Cancelled);
        assert!(store.run("../d").is_none());
        assert!(store.report_path("a").exists());
        let leftovers: Vec<_> = std::fs::read_dir(store.history_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
