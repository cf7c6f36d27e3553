//! Fault injection for tests, compiled only with the `test-hooks` cargo feature (the
//! integration tests turn it on through a dev-dependency on this crate; release builds
//! carry none of it). A prompt that contains a fault's marker triggers the fault on the
//! engine thread, so a test reaches every failure path through the real HTTP API.
use std::sync::{Condvar, Mutex};

/// Panics inside the per-request guard: only this request fails (500), the engine goes on.
pub const PANIC_IN_REQUEST: &str = "__mlxbar_fault_panic_request__";
/// Panics outside every guard: the engine thread dies (the state turns `failed`).
pub const KILL_ENGINE: &str = "__mlxbar_fault_kill_engine__";
/// Blocks the engine's step until [`release_stalls`]: the stall watchdog's case.
pub const STALL: &str = "__mlxbar_fault_stall__";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    PanicInRequest,
    KillEngine,
    Stall,
}

/// The fault a prompt asks for, if any.
pub fn for_prompt(text: &str) -> Option<Fault> {
    [(PANIC_IN_REQUEST, Fault::PanicInRequest), (KILL_ENGINE, Fault::KillEngine), (STALL, Fault::Stall)]
        .into_iter()
        .find_map(|(marker, fault)| text.contains(marker).then_some(fault))
}

/// Generation of released stalls: a stall waits until it changes.
static RELEASED: (Mutex<u64>, Condvar) = (Mutex::new(0), Condvar::new());

/// Blocks the calling (engine) thread until the next [`release_stalls`].
pub fn stall() {
    let (lock, cv) = &RELEASED;
    let seen = *lock.lock().unwrap();
    let _unblocked = cv.wait_while(lock.lock().unwrap(), |gen| *gen == seen).unwrap();
}

/// Lets every stalled step go on.
pub fn release_stalls() {
    let (lock, cv) = &RELEASED;
    *lock.lock().unwrap() += 1;
    cv.notify_all();
}
