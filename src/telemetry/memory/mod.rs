//! System memory as the user knows it: Activity Monitor's breakdown and the kernel's
//! pressure level on macOS; /proc/meminfo and PSI on Linux.
//!
//! One reader per platform behind one cfg switch, each returning [`MemoryStats`]; the
//! arithmetic lives in [`derive`] as pure functions that unit tests feed recorded values.
pub mod derive;

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
    pub fn read() -> anyhow::Result<super::MemoryStats> {
        anyhow::bail!("no memory sampler for this OS")
    }
}

use serde::Serialize;

/// Memory pressure as the kernel judges it (macOS) or as PSI stall time says (Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PressureLevel {
    Normal,
    Warn,
    Critical,
    /// The kernel gave no level (or one we do not know): never guessed from free pages.
    #[default]
    Unknown,
}

impl PressureLevel {
    /// 0 normal, 1 warn, 2 critical; None when unknown.
    pub fn as_number(self) -> Option<u8> {
        match self {
            PressureLevel::Normal => Some(0),
            PressureLevel::Warn => Some(1),
            PressureLevel::Critical => Some(2),
            PressureLevel::Unknown => None,
        }
    }

    /// As the API spells it: normal, warn, critical, unknown.
    pub fn as_str(self) -> &'static str {
        match self {
            PressureLevel::Normal => "normal",
            PressureLevel::Warn => "warn",
            PressureLevel::Critical => "critical",
            PressureLevel::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PressureSource {
    /// macOS `kern.memorystatus_vm_pressure_level`.
    Kernel,
    /// Linux `/proc/pressure/memory`.
    Psi,
    #[default]
    Unknown,
}

impl PressureSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PressureSource::Kernel => "kernel",
            PressureSource::Psi => "psi",
            PressureSource::Unknown => "unknown",
        }
    }
}

/// One reading, in bytes (swap in/out in pages, cumulative since boot).
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct MemoryStats {
    pub total: u64,
    pub free: u64,
    pub available: u64,
    pub used: u64,
    pub active: u64,
    pub inactive: u64,
    pub wired: u64,
    pub compressed: u64,
    /// Activity Monitor's "App Memory" (Linux: anonymous memory).
    pub app: u64,
    /// Activity Monitor's "Cached Files" (Linux: page cache).
    pub cached_files: u64,
    pub swap_total: u64,
    pub swap_used: u64,
    pub swap_ins: u64,
    pub swap_outs: u64,
    pub pressure: PressureLevel,
    /// The raw signal: the kernel's level (1, 2, 4) or PSI `some avg10` in percent.
    pub pressure_raw: Option<f64>,
    pub pressure_source: PressureSource,
}

impl MemoryStats {
    pub fn used_ratio(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.used as f64 / self.total as f64
        }
    }
}

/// Reads the system's memory now.
pub fn read() -> anyhow::Result<MemoryStats> {
    platform::read()
}
