//! `--on-rank-lost rejoin`: a rank that loses the cluster (a rank died or hung, the join
//! timed out, rank 0 stopped) starts itself afresh and waits for every rank to join again,
//! instead of exiting. A fresh process, because MLX keeps the first group a process makes
//! (and its sockets) for the process's life: the only way to join a new ring is a new
//! process. So the rank re-executes its own binary with its own arguments, in place (the
//! same pid, so `mlxbar cluster launch` and service managers keep watching it).
//!
//! Everything open is closed on the way (MLX's listening sockets take SO_REUSEPORT, so one
//! carried over would share the new ring's port and take its connections). The new process
//! learns why from the environment ([`take_reason`]), for `/health` and the logs, and how
//! many times in a row it has found no cluster, to wait longer between tries.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Why the last process of this rank restarted (for the new one).
const WHY: &str = "MLXBAR_REJOIN_WHY";
/// Restarts in a row without a cluster formed (for the new one).
const TRIES: &str = "MLXBAR_REJOIN_TRIES";
/// The longest pause before a restart (a rank failing at once does not spin).
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Set once this process is asked to stop (SIGTERM, Ctrl-C): it stops, never restarts; a
/// restart's pause wakes on it.
static STOPPING: Mutex<bool> = Mutex::new(false);
static STOPPED: Condvar = Condvar::new();
/// Set by the first restart: one at a time (the watch thread and the main thread of a
/// follower can both find the cluster lost).
static RESTARTING: AtomicBool = AtomicBool::new(false);

/// A failure to form the cluster that a restart can cure (a rank not started yet, a link
/// that failed while joining), as opposed to one that would fail again (no such backend,
/// another model, a refusal): only these restart a rank that never formed the cluster.
#[derive(Debug)]
pub struct NotFormed(pub String);

impl std::fmt::Display for NotFormed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFormed {}

/// `e` as a [`NotFormed`] failure.
pub fn not_formed(e: anyhow::Error) -> anyhow::Error {
    NotFormed(format!("{e:#}")).into()
}

/// Whether a restart can cure `e` ([`NotFormed`]).
pub fn curable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<NotFormed>())
}

/// This process is asked to stop: a restart due now or later does not happen.
pub fn stop() {
    *STOPPING.lock().unwrap_or_else(|e| e.into_inner()) = true;
    STOPPED.notify_all();
}

/// Whether this process was asked to stop (a join under way gives up).
pub fn stopping() -> bool {
    *STOPPING.lock().unwrap_or_else(|e| e.into_inner())
}

/// What to do once the cluster is lost (`--on-rank-lost`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnRankLost {
    /// Exit (rank 0 keeps serving HTTP, answering 503 with the rank lost).
    #[default]
    Exit,
    /// Restart this rank's process and wait for every rank to join again.
    Rejoin,
}

/// Why this process was started by [`restart`], and how many restarts in a row found no
/// cluster; removed from the environment (call before threads start).
pub fn take_reason() -> (Option<String>, u32) {
    let why = std::env::var(WHY).ok().filter(|w| !w.is_empty());
    let tries = std::env::var(TRIES).ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    std::env::remove_var(WHY);
    std::env::remove_var(TRIES);
    (why, tries)
}

/// Restarts this process in place to join the cluster again, saying `why`; `joined`:
/// whether this process had formed the cluster (else the pause grows with each try).
/// Returns only if it does not restart (asked to stop, or the restart failed, after saying
/// so): the caller exits. A second caller while one restarts waits for it.
pub fn restart(why: &str, joined: bool, tries: u32) {
    if stopping() {
        return;
    }
    if RESTARTING.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    let tries = if joined { 1 } else { tries.saturating_add(1) };
    // A moment for the requests just ended to tell their clients, and more each time the
    // cluster did not form (a rank not back yet, or a failure that repeats).
    let pause = Duration::from_secs(u64::from(tries)).min(MAX_PAUSE);
    tracing::warn!("{why}; restarting this rank in {} s to join the cluster again (--on-rank-lost rejoin)", pause.as_secs());
    // Woken early by a stop, which then wins.
    let stop = STOPPING.lock().unwrap_or_else(|e| e.into_inner());
    let (stop, _) = STOPPED.wait_timeout_while(stop, pause, |stop| !*stop).unwrap_or_else(|e| e.into_inner());
    if *stop {
        return;
    }
    drop(stop);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => return tracing::error!("cannot restart: this binary's path: {e}"),
        };
        for_inherited(|fd| {
            // SAFETY: fcntl on a descriptor number only reads and sets its flags; one that
            // is not open (the listing's own, closed since) answers EBADF, which is ignored.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        });
        let err = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(WHY, why.replace('\0', " "))
            .env(TRIES, tries.to_string())
            .exec();
        tracing::error!("cannot restart this rank: {err}");
    }
}

/// In a process [`restart`] started, while it has one thread: closes every descriptor past
/// stderr that is not close-on-exec. The sweep before the restart marked them all, but a
/// thread of the old process (MLX's accept, joining) could open one after it; held here and
/// never read, it would leave a neighbour waiting on it for ever.
pub fn close_inherited() {
    if std::env::var_os(WHY).is_none() {
        return;
    }
    #[cfg(unix)]
    for_inherited(|fd| {
        // SAFETY: main's first line, before this process's own code opened anything or
        // started a thread. What is open here without close-on-exec came through the exec:
        // a descriptor this process made itself (a library's, at load) or that the system
        // guards carries the flag and is left alone; only the old process's are closed.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::close(fd);
            }
        }
    });
}

/// Calls `f` with every open descriptor past stderr (listed first, so `f` may close them).
#[cfg(unix)]
fn for_inherited(f: impl Fn(i32)) {
    // /dev/fd lists this process's descriptors on Linux and macOS.
    let fds: Vec<i32> = match std::fs::read_dir("/dev/fd") {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&fd| fd > 2).collect(),
        Err(_) => (3..4096).collect(),
    };
    fds.into_iter().for_each(f);
}
