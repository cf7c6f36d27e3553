//! Files mlxbar writes are the user's alone: directories 0700, files 0600 (bench runs,
//! history, reports, the model cache). Writes are atomic: a temp file in the same
//! directory, synced, then renamed (and the directory synced), so a crash never leaves
//! half a file.
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// Creates `dir` and any missing parents as user-only directories.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Writes `bytes` to `path` (user-only, 0600) through a temp file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("no parent dir")?;
    create_dir_all(dir)?;
    // tempfile creates its files 0600 on Unix; the rename keeps the mode.
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir).with_context(|| format!("writing in {}", dir.display()))?;
    tmp.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).with_context(|| format!("writing {}", path.display()))?;
    sync_dir(dir);
    Ok(())
}

/// Makes a rename in `dir` durable (without it a crash may bring back the old file). Best
/// effort: some file systems refuse fsync on a directory, and the file itself is whole either way.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// Creates (or truncates) `path` as a user-only file.
pub fn create_file(path: &Path) -> Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).with_context(|| format!("creating {}", path.display()))
}

/// Fails with the reason when `dir` cannot take a new file (missing and not creatable,
/// read-only, full): checked before work whose result would be lost.
pub fn check_writable(dir: &Path) -> Result<()> {
    create_dir_all(dir)?;
    let mut probe =
        tempfile::Builder::new().prefix(".probe-").tempfile_in(dir).with_context(|| format!("{} is not writable", dir.display()))?;
    probe
        .write_all(&[0u8; 4096])
        .and_then(|()| probe.as_file().sync_all())
        .with_context(|| format!("{} is full or not writable", dir.display()))?;
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_files_are_user_only() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("a/b/run.json");
        write_atomic(&file, b"{}").unwrap();
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert_eq!(mode(&root.path().join("a/b")), 0o700);
        assert_eq!(mode(&file), 0o600);
        write_atomic(&file, b"{\"again\": 1}").unwrap();
        assert_eq!((mode(&file), std::fs::read_to_string(&file).unwrap().as_str()), (0o600, "{\"again\": 1}"));
    }

    #[test]
    fn an_unwritable_place_says_why() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("plain-file");
        std::fs::write(&file, "x").unwrap();
        // Root ignores permission bits, so use a path below a regular file.
        let err = check_writable(&file.join("metrics")).unwrap_err();
        assert!(format!("{err:#}").contains("plain-file"), "{err:#}");
        check_writable(root.path()).unwrap();
    }
}
