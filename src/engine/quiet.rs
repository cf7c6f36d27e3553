//! Memory at rest: once no engine of the process has had work for `mlx_cache_idle_seconds`,
//! MLX's buffer cache (freed buffers kept for reuse, process-wide) goes back to the system,
//! once per quiet spell. Each engine thread keeps a [`QuietRelease`]; the last activity is
//! process-wide, because the cache is: an engine idle while another decodes must not empty
//! the cache from under it.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::telemetry::mlx_memory::{release, ClearReason};

/// When any engine last had work, in microseconds since [`base`] (+1, so 0 means never).
static LAST_BUSY: AtomicU64 = AtomicU64::new(0);
/// The `LAST_BUSY` value the last release was made for: the same quiet spell is not
/// counted twice when several idle engines reach its end together.
static RELEASED_FOR: AtomicU64 = AtomicU64::new(u64::MAX);

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now() -> u64 {
    base().elapsed().as_micros() as u64 + 1
}

pub struct QuietRelease {
    quiet: Duration,
    /// This engine has seen the current quiet spell released (it blocks until new work).
    released: bool,
}

impl QuietRelease {
    pub fn new(quiet: Duration) -> QuietRelease {
        let q = QuietRelease { quiet, released: false };
        // A load leaves its temporaries in the cache: the first quiet spell starts now.
        mark_busy();
        q
    }

    /// The engine has work this iteration.
    pub fn busy(&mut self) {
        self.released = false;
        mark_busy();
    }

    /// How long an idle engine may block before the quiet spell ends; None once it has been
    /// released (block until work comes).
    pub fn wait(&self) -> Option<Duration> {
        if self.released {
            return None;
        }
        let last = LAST_BUSY.load(Ordering::Relaxed);
        if RELEASED_FOR.load(Ordering::Relaxed) == last {
            return None; // another engine already released this spell
        }
        let quiet_for = Duration::from_micros(now().saturating_sub(last));
        Some(self.quiet.saturating_sub(quiet_for))
    }

    /// Called when [`QuietRelease::wait`]'s time ran out: releases the cache if the whole
    /// process is still quiet (an engine may have started work meanwhile: then waits again).
    pub fn maybe_release(&mut self, device_lock: &super::DeviceLock) {
        let last = LAST_BUSY.load(Ordering::Relaxed);
        if Duration::from_micros(now().saturating_sub(last)) < self.quiet {
            return;
        }
        let _device = device_lock.lock();
        // One engine per spell: the first to swap the marker releases.
        let previous = RELEASED_FOR.swap(last, Ordering::AcqRel);
        if previous != last && LAST_BUSY.load(Ordering::Relaxed) == last {
            release(ClearReason::Idle);
            tracing::debug!("quiet for {:.0} s: gave MLX's buffer cache back", self.quiet.as_secs_f64());
        }
        self.released = true;
    }
}

fn mark_busy() {
    LAST_BUSY.store(now(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the spell state is process-wide.
    #[test]
    fn a_quiet_spell_is_released_once_and_work_starts_a_new_one() {
        let lock: super::super::DeviceLock = Default::default();
        let before = ClearReason::Idle.count();
        let mut a = QuietRelease::new(Duration::from_millis(30));
        let mut b = QuietRelease::new(Duration::from_millis(30));
        assert!(a.wait().unwrap() > Duration::from_millis(20), "the spell has just begun");
        a.maybe_release(&lock);
        assert_eq!(ClearReason::Idle.count(), before, "too early: nothing released");
        assert!(a.wait().is_some());
        let start = Instant::now();
        while a.wait().is_some_and(|w| w > Duration::ZERO) {
            assert!(start.elapsed() < Duration::from_secs(5));
            std::thread::yield_now();
        }
        a.maybe_release(&lock);
        b.maybe_release(&lock);
        assert_eq!(ClearReason::Idle.count(), before + 1, "two idle engines, one release");
        assert_eq!((a.wait(), b.wait()), (None, None), "both block until work comes");
        b.busy();
        assert!(b.wait().is_some(), "work starts a new spell, which the engine that worked ends");
        assert_eq!(a.wait(), None, "an engine with no work of its own stays blocked");
    }
}
