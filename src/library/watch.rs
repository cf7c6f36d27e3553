//! TEMPORARY STUB.
pub struct Watcher;
