//! The open-files limit: raised at startup from the soft limit to the hard one, as other
//! servers do (macOS starts programs at 256). The connection cap holds either way; this
//! leaves room for model files, the library's scans and the watcher.

/// Raises the soft RLIMIT_NOFILE to the hard limit (macOS: at most OPEN_MAX, which it
/// refuses to exceed) and returns the soft limit now in force; None where unknown.
#[cfg(any(target_os = "macos", target_os = "linux"))]
pub fn raise() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one `rlimit` through the pointer, which points at a live,
    // properly aligned local of that type.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    // macOS refuses a soft limit above OPEN_MAX (10240) whatever the hard limit says.
    let ceiling = if cfg!(target_os = "macos") { lim.rlim_max.min(10240) } else { lim.rlim_max };
    if lim.rlim_cur < ceiling {
        let raised = libc::rlimit { rlim_cur: ceiling, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit only reads the `rlimit` behind the pointer, a live local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(ceiling);
        }
    }
    Some(lim.rlim_cur)
}

#[cfg(not(any(target_os = "macos", target_os = "linux")))]
pub fn raise() -> Option<u64> {
    None
}
