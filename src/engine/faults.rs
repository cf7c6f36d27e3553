//! Fault injection for tests. Two locks keep it out of what people run: it is compiled only
//! with the `test-hooks` cargo feature (the integration tests turn it on through a
//! dev-dependency on this crate; `make build`/`make run` build without it), and even then
//! it does nothing until the test harness calls [`arm`] in its own process, or sets
//! [`ARM_VARIABLE`] for a child `mlxbar` process it starts (process tests); a server a user
//! starts from a test build is not armed. Armed, a prompt that contains a fault's
//! marker triggers the fault on the engine thread, so a test reaches every failure path
//! through the real HTTP API; a model path containing [`STALL_LOAD`] hangs its load.
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

/// Panics inside the per-request guard: only this request fails (500), the engine goes on.
pub const PANIC_IN_REQUEST: &str = "__mlxbar_fault_panic_request__";
/// Panics outside every guard: the engine thread dies (the state turns `failed`).
pub const KILL_ENGINE: &str = "__mlxbar_fault_kill_engine__";
/// Blocks the engine's step until [`release_stalls`]: the stall watchdog's case.
pub const STALL: &str = "__mlxbar_fault_stall__";
/// In a model's path: its load blocks (holding the device) until [`release_stalls`].
pub const STALL_LOAD: &str = "__mlxbar_fault_stall_load__";
/// In a prompt, around a text: the model answers that text's tokens instead of what it samples
/// (then samples again if the text ends before a stop token). A random-weight fixture then
/// gives, through the real engine, parser and dialects, the exact output a trained model
/// gives (gpt-oss's harmony channels).
pub const SCRIPT: &str = "__mlxbar_fault_script__";
pub const SCRIPT_END: &str = "__mlxbar_fault_script_end__";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    PanicInRequest,
    KillEngine,
    Stall,
    StallLoad,
}

static ARMED: AtomicBool = AtomicBool::new(false);

/// Turns the hooks on for this process: only test harnesses call it.
pub fn arm() {
    ARMED.store(true, Ordering::Relaxed);
}

/// Set (to `1`) by process tests in the environment of the `mlxbar` they start, whose
/// `main` then calls [`arm`]. Nothing else sets it; a build without `test-hooks` ignores it.
pub const ARM_VARIABLE: &str = "MLXBAR_TEST_ARM_FAULT_HOOKS";

/// [`arm`] when the test harness asked for it through [`ARM_VARIABLE`].
pub fn arm_from_env() {
    if std::env::var_os(ARM_VARIABLE).is_some_and(|v| v == "1") {
        tracing::warn!("fault-injection test hooks armed ({ARM_VARIABLE}=1): this process is a test's");
        arm();
    }
}

pub fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// The fault a prompt asks for, if any (none unless armed).
pub fn for_prompt(text: &str) -> Option<Fault> {
    if !armed() {
        return None;
    }
    [(PANIC_IN_REQUEST, Fault::PanicInRequest), (KILL_ENGINE, Fault::KillEngine), (STALL, Fault::Stall)]
        .into_iter()
        .find_map(|(marker, fault)| text.contains(marker).then_some(fault))
}

/// The answer a prompt scripts ([`SCRIPT`] text [`SCRIPT_END`]), if any (none unless armed).
/// `prompt` is the prompt's text with its special tokens spelled out.
pub fn script_for_prompt(prompt: &str) -> Option<&str> {
    if !armed() {
        return None;
    }
    let from = prompt.find(SCRIPT)? + SCRIPT.len();
    let to = from + prompt[from..].find(SCRIPT_END)?;
    Some(&prompt[from..to])
}

/// The fault a model's path asks for, if any (none unless armed).
pub fn for_path(path: &Path) -> Option<Fault> {
    (armed() && path.to_string_lossy().contains(STALL_LOAD)).then_some(Fault::StallLoad)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_do_nothing_until_the_harness_arms_the_hooks() {
        // Unit tests share this process: check disarmed first, then arm (never disarmed).
        if !armed() {
            assert_eq!(for_prompt(KILL_ENGINE), None);
            assert_eq!(for_path(Path::new(STALL_LOAD)), None);
        }
        arm();
        assert_eq!(for_prompt(&format!("x {KILL_ENGINE} y")), Some(Fault::KillEngine));
        assert_eq!(for_path(&Path::new("/m").join(STALL_LOAD)), Some(Fault::StallLoad));
        assert_eq!(for_prompt("hello"), None);
        assert_eq!(
            script_for_prompt(&format!("ask {SCRIPT}<|channel|>final<|message|>Hi{SCRIPT_END} end")),
            Some("<|channel|>final<|message|>Hi")
        );
        assert_eq!(script_for_prompt(&format!("unclosed {SCRIPT} x")), None);
    }
}
