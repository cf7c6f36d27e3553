//! The free-disk check before a pull: refused up front, with both figures, rather than
//! failing at 90% of a 5 GB download with the disk full.
use std::path::Path;

/// Left free after a pull, so the disk is never filled to the last byte.
pub const DISK_HEADROOM: u64 = 256 << 20;

/// `Err` with the figures when `needed` more bytes (plus the headroom) do not fit in `free`.
pub fn check_space(needed: u64, free: u64) -> Result<(), String> {
    if needed.saturating_add(DISK_HEADROOM) <= free {
        return Ok(());
    }
    Err(format!(
        "not enough disk: the download needs {} more and {} is free (keeping {} spare)",
        human(needed),
        human(free),
        human(DISK_HEADROOM)
    ))
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
    let existing = path.ancestors().find(|p| p.exists())?;
    available(existing)
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
        check_space(1_000, 1_000 + DISK_HEADROOM).unwrap();
        check_space(0, DISK_HEADROOM).unwrap();
        let err = check_space(5_100_000_000, 3_200_000_000).unwrap_err();
        assert!(err.contains("5.1 GB") && err.contains("3.2 GB"), "{err}");
        // Fits the free space but not the headroom: still refused.
        assert!(check_space(1_000, 1_000 + DISK_HEADROOM - 1).is_err());
        assert!(check_space(u64::MAX, u64::MAX).is_err(), "no overflow");
    }

    #[cfg(any(target_os = "linux", target_os = "macos"))]
    #[test]
    fn free_space_is_read_for_paths_not_yet_made() {
        let root = tempfile::tempdir().unwrap();
        let free = free_space(&root.path().join("hub/models--a--b")).expect("statvfs here");
        assert!(free > 0);
    }
}
