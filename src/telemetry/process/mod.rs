//! This process: resident memory and CPU time.
//!
//! One reader per platform behind one cfg switch (as in `memory/`), each returning
//! [`ProcessStats`].
use serde::Serialize;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as platform;
#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as platform;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    pub fn read() -> anyhow::Result<super::ProcessStats> {
        anyhow::bail!("no process sampler for this OS")
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct ProcessStats {
    pub resident_bytes: u64,
    pub cpu_seconds: f64,
}

pub fn read() -> anyhow::Result<ProcessStats> {
    platform::read()
}
