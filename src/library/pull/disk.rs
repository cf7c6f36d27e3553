//! The free-disk check before a pull: refused up front, with both figures, rather than
//! failing at 90% of a 5 GB download with the disk full. Pulls in flight in this process
//! hold a [`Reservation`] of the bytes they have still to write, which the check of every
//! later pull on the same file system subtracts from the free space: two pulls that each
//! fit but not together are not both started.
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Left free after a pull, so the disk is never filled to the last byte.
pub const DISK_HEADROOM: u64 = 256 << 20;

/// `Err` with the figures when `needed` more bytes (plus the headroom) do not fit in `free`
/// less what pulls in flight have `reserved`.
pub fn check_space(needed: u64, free: u64, reserved: u64) -> Result<(), String> {
    if needed.checked_add(DISK_HEADROOM).and_then(|n| n.checked_add(reserved)).is_some_and(|n| n <= free) {
        return Ok(());
    }
    let others = if reserved > 0 { format!(", of which pulls in flight still need {}", human(reserved)) } else { String::new() };
    Err(format!(
        "not enough disk: the download needs {} more and {} is free{others} (keeping {} spare)",
        human(needed),
        human(free),
        human(DISK_HEADROOM)
    ))
}

/// One pull's claim on its file system's free space: the bytes it has still to write.
/// Released when dropped (the pull ended, however).
pub struct Reservation {
    held: Arc<Held>,
}

struct Held {
    file_system: u64,
    bytes: AtomicU64,
}

static RESERVED: Mutex<Vec<Arc<Held>>> = Mutex::new(Vec::new());

fn reserved() -> MutexGuard<'static, Vec<Arc<Held>>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reservation {
    /// The pull wrote some: what it still needs shrinks (the free space shows the rest).
    pub fn set_remaining(&self, bytes: u64) {
        self.held.bytes.store(bytes, Ordering::Relaxed);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        reserved().retain(|h| !Arc::ptr_eq(h, &self.held));
    }
}

/// Checks that `needed` more bytes fit in `dir`'s file system besides what other pulls in
/// flight reserved, and reserves them; checked and reserved under one lock, so two pulls
/// starting together cannot both take the same space. Where the free space is unknown,
/// nothing is refused.
pub fn reserve(dir: &Path, needed: u64) -> Result<Reservation, String> {
    let file_system = file_system_of(dir);
    let mut held = reserved();
    let others: u64 = held.iter().filter(|h| h.file_system == file_system).map(|h| h.bytes.load(Ordering::Relaxed)).sum();
    if let Some(free) = free_space(dir) {
        check_space(needed, free, others)?;
    }
    let mine = Arc::new(Held { file_system, bytes: AtomicU64::new(needed) });
    held.push(mine.clone());
    Ok(Reservation { held: mine })
}

/// The device of `dir`'s nearest existing ancestor.
fn file_system_of(dir: &Path) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        dir.ancestors().find_map(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.dev())
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        0
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GB", 1_000_000_000), ("MB", 1_000_000), ("KB", 1_000)];
    for (unit, size) in UNITS {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// Bytes an unprivileged user may still write on the file system holding `path` (its
/// nearest existing ancestor: the cache may not exist yet); None where unknown.
pub fn free_space(path: &Path) -> Option<u64> {
    #[cfg(feature = "test-hooks")]
    if let Some(bytes) = pretended(path) {
        return Some(bytes);
    }
    let existing = path.ancestors().find(|p| p.exists())?;
    available(existing)
}

#[cfg(feature = "test-hooks")]
static PRETEND: Mutex<Vec<(std::path::PathBuf, u64)>> = Mutex::new(Vec::new());

/// Test hook (with the `test-hooks` feature, once `engine::faults::arm` ran): the file
/// system holding `dir` has `bytes` free, for paths below `dir`.
#[cfg(feature = "test-hooks")]
pub fn pretend_free_space(dir: &Path, bytes: u64) {
    PRETEND.lock().unwrap_or_else(|e| e.into_inner()).push((dir.to_path_buf(), bytes));
}

#[cfg(feature = "test-hooks")]
fn pretended(path: &Path) -> Option<u64> {
    if !crate::engine::faults::armed() {
        return None;
    }
    let pretend = PRETEND.lock().unwrap_or_else(|e| e.into_inner());
    pretend.iter().rev().find(|(dir, _)| path.starts_with(dir)).map(|&(_, bytes)| bytes)
}

#[cfg(target_os = "linux")]
fn available(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a NUL-terminated string that outlives the call; statvfs writes a
    // whole statvfs struct into the pointer, which points at space for exactly one.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

// macOS: statfs, whose block counts are 64-bit (statvfs's are 32-bit there and wrap on big disks).
#[cfg(target_os = "macos")]
fn available(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: c_path is a NUL-terminated string that outlives the call; statfs writes a
    // whole statfs struct into the pointer, which points at space for exactly one.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statfs returned 0, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    Some(stat.f_bavail.saturating_mul(u64::from(stat.f_bsize)))
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn available(_path: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_that_does_not_fit_is_refused_with_both_figures() {
        check_space(1_000, 1_000 + DISK_HEADROOM, 0).unwrap();
        check_space(0, DISK_HEADROOM, 0).unwrap();
        let err = check_space(5_100_000_000, 3_200_000_000, 0).unwrap_err();
        assert!(err.contains("5.1 GB") && err.contains("3.2 GB"), "{err}");
        // Fits the free space but not the headroom: still refused.
        assert!(check_space(1_000, 1_000 + DISK_HEADROOM - 1, 0).is_err());
        assert!(check_space(u64::MAX, u64::MAX, 0).is_err(), "no overflow");
        assert!(check_space(1, u64::MAX, u64::MAX).is_err(), "no overflow");
        // Fits alone, not beside what pulls in flight still need.
        let err = check_space(2_000_000_000, 3_000_000_000 + DISK_HEADROOM, 1_500_000_000).unwrap_err();
        assert!(err.contains("pulls in flight still need 1.5 GB"), "{err}");
    }

    #[test]
    fn reservations_are_counted_until_released() {
        let root = tempfile::tempdir().unwrap();
        let free = free_space(root.path()).unwrap();
        // Three quarters of what is free: one fits, two do not (with room for other writers).
        let Some(most) = free.checked_sub(DISK_HEADROOM).map(|f| f / 4 * 3) else { return };
        let first = reserve(root.path(), most).unwrap();
        let err = reserve(&root.path().join("hub"), most).err().expect("two do not fit");
        assert!(err.contains("pulls in flight"), "{err}");
        first.set_remaining(0);
        let second = reserve(root.path(), most).unwrap();
        drop((first, second));
        drop(reserve(root.path(), most).unwrap());
    }

    #[cfg(any(target_os = "linux", target_os = "macos"))]
    #[test]
    fn free_space_is_read_for_paths_not_yet_made() {
        let root = tempfile::tempdir().unwrap();
        let free = free_space(&root.path().join("hub/models--a--b")).expect("statvfs here");
        assert!(free > 0);
    }
}
