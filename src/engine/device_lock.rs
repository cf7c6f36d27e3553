//! [`DeviceLock`]: the device the loaded models share. One engine computes at a time (one
//! device gains nothing from interleaving them, and MLX's streams are not meant to be
//! driven from several threads at once). Each engine holds it for its load and for each
//! scheduling step. Fair (first come, first served), so an engine decoding non-stop does
//! not starve another or a load. One per registry (a server), made by `registry::Models`.
//!
//! A thread stuck in a step (or a load) holds it for ever; the registry then gives up on
//! that engine and calls [`DeviceLock::abandon`]: every later `lock` takes a fresh mutex,
//! so the other models go on, and the stuck thread keeps the old one it holds.
use std::sync::Arc;

use parking_lot::{FairMutex, Mutex};

type Inner = Arc<FairMutex<()>>;

#[derive(Clone, Default)]
pub struct DeviceLock(Arc<Mutex<Inner>>);

/// Held while an engine computes; released when dropped.
pub struct DeviceGuard {
    _guard: parking_lot::lock_api::ArcMutexGuard<parking_lot::RawFairMutex, ()>,
}

impl DeviceLock {
    /// Waits (fairly) for the device.
    pub fn lock(&self) -> DeviceGuard {
        let current = self.0.lock().clone();
        DeviceGuard { _guard: current.lock_arc() }
    }

    /// Waits at most `timeout` for the device.
    pub fn try_lock_for(&self, timeout: std::time::Duration) -> Option<DeviceGuard> {
        let current = self.0.lock().clone();
        current.try_lock_arc_for(timeout).map(|g| DeviceGuard { _guard: g })
    }

    /// Leaves the current mutex to whoever holds it (a stuck thread): later `lock`s use a
    /// new one. Waiters already queued on the old one stay queued there until it is freed.
    pub fn abandon(&self) {
        *self.0.lock() = Inner::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_abandoned_holder_no_longer_blocks_the_others() {
        let lock = DeviceLock::default();
        let stuck = lock.lock();
        assert!(lock.try_lock_for(Duration::from_millis(10)).is_none(), "held");
        lock.abandon();
        let next = lock.try_lock_for(Duration::from_millis(10)).expect("a fresh device after abandon");
        assert!(lock.try_lock_for(Duration::from_millis(10)).is_none(), "the fresh one excludes as before");
        drop((next, stuck));
        assert!(lock.try_lock_for(Duration::from_millis(10)).is_some());
    }
}
