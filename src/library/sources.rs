//! TEMPORARY STUB (lead's tree, replaced by helper A's module at merge).
use std::path::PathBuf;

use super::entry::ModelEntry;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sources {
    pub paths: Vec<PathBuf>,
}

impl Sources {
    pub fn from_env(_models_dirs: Vec<PathBuf>, paths: Vec<PathBuf>) -> Sources {
        Sources { paths }
    }
}

pub fn scan(_sources: &Sources) -> Vec<ModelEntry> {
    vec![]
}
