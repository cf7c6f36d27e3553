//! TEMPORARY STUB.
use std::path::Path;

use super::entry::ModelEntry;

pub fn inspect(_path: &Path) -> Option<ModelEntry> {
    None
}
