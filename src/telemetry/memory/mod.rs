//! System memory as the user knows it: Activity Monitor's breakdown and the kernel's
//! pressure level on macOS; /proc/meminfo and PSI on Linux, bounded by this process's
//! control group's memory limit when one is set (a container, a systemd unit: [`cgroup`]).
//!
//! One reader per platform behind one cfg switch, each returning [`MemoryStats`]; the
//! arithmetic lives in [`derive`] as pure functions that unit tests feed recorded values.
pub mod derive;

#[cfg(target_os = "linux")]
pub mod cgroup;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default, schemars::JsonSchema)]
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
    /// The control group's memory limit that bounds this process, when one is set below
    /// the machine's memory (Linux): `total` is then the limit and `available` at most the
    /// limit less the group's working set; the other figures stay the machine's.
    pub cgroup: Option<CgroupLimit>,
}

/// A cgroup memory limit (v1 `memory.limit_in_bytes`, v2 `memory.max`) and what is charged
/// against it, of the tightest group from this process's own up to its hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct CgroupLimit {
    /// 1 or 2.
    pub version: u8,
    /// The group's directory, e.g. `/sys/fs/cgroup/memory/docker/<id>`.
    pub path: String,
    pub limit: u64,
    /// What the group uses that the kernel cannot simply drop: usage less inactive file
    /// pages (docker's and cAdvisor's working set).
    pub working_set: u64,
}

impl CgroupLimit {
    /// What is left under the limit.
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.working_set)
    }
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
