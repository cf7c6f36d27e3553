//! The machine a run measured, so history entries from different Macs (or OS updates)
//! are not compared as if they were one.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// "Apple M3 Pro", "AMD EPYC 7B13", ...
    pub chip: String,
    pub cores: usize,
    pub memory_bytes: u64,
    /// "macOS 15.1", "Debian GNU/Linux 12 (bookworm)", ...
    pub os: String,
    pub arch: String,
}

impl Machine {
    pub fn this() -> Machine {
        Machine {
            chip: platform::chip().unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_bytes: crate::telemetry::memory::read().map(|m| m.total).unwrap_or(0),
            os: platform::os().unwrap_or_else(|| std::env::consts::OS.into()),
            arch: std::env::consts::ARCH.into(),
        }
    }
}

#[cfg(target_os = "macos")]
mod platform {
    fn sysctl_string(name: &str) -> Option<String> {
        let name = std::ffi::CString::new(name).ok()?;
        let mut len = 0usize;
        // SAFETY: sysctlbyname with a null buffer reports the size; the second call fills a
        // buffer of that size.
        unsafe {
            if libc::sysctlbyname(name.as_ptr(), std::ptr::null_mut(), &mut len, std::ptr::null_mut(), 0) != 0 || len == 0 {
                return None;
            }
            let mut buf = vec![0u8; len];
            if libc::sysctlbyname(name.as_ptr(), buf.as_mut_ptr().cast(), &mut len, std::ptr::null_mut(), 0) != 0 {
                return None;
            }
            buf.truncate(len);
            Some(String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string())
        }
    }

    pub fn chip() -> Option<String> {
        sysctl_string("machdep.cpu.brand_string")
    }

    pub fn os() -> Option<String> {
        sysctl_string("kern.osproductversion").map(|v| format!("macOS {v}"))
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use procfs::Current;

    pub fn chip() -> Option<String> {
        super::chip_of(&procfs::CpuInfo::current().ok()?)
    }

    pub fn os() -> Option<String> {
        // /etc/os-release, else /usr/lib/os-release, as os-release(5) says.
        Some(etc_os_release::OsRelease::open().ok()?.pretty_name().to_string())
    }
}

#[cfg(not(any(target_os = "macos", target_os = "linux")))]
mod platform {
    pub fn chip() -> Option<String> {
        None
    }

    pub fn os() -> Option<String> {
        None
    }
}

/// The CPU's name: x86's "model name"; ARM Linux has none, so its implementer and part ids
/// (the numbers lscpu maps to names), else the architecture.
#[cfg(target_os = "linux")]
fn chip_of(info: &procfs::CpuInfo) -> Option<String> {
    if let Some(name) = info.model_name(0).filter(|n| !n.is_empty()) {
        return Some(name.to_string());
    }
    let field = |k| info.get_field(0, k).filter(|v| !v.is_empty());
    match (field("CPU implementer"), field("CPU part")) {
        (Some(implementer), Some(part)) => Some(format!("{} CPU implementer {implementer} part {part}", std::env::consts::ARCH)),
        _ => (info.num_cores() > 0).then(|| std::env::consts::ARCH.to_string()),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use procfs::{Current, FromBufRead};

    use super::*;

    #[test]
    fn names_x86_and_arm_cpus() {
        let x86 = procfs::CpuInfo::from_buf_read(
            "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n"
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(chip_of(&x86).as_deref(), Some("AMD EPYC 7B13"));
        // An arm64 kernel's /proc/cpuinfo (Graviton 2): no "model name" line.
        let arm = "processor\t: 0\nBogoMIPS\t: 243.75\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n";
        let arm = procfs::CpuInfo::from_buf_read(arm.as_bytes()).unwrap();
        assert_eq!(chip_of(&arm), Some(format!("{} CPU implementer 0x41 part 0xd0c", std::env::consts::ARCH)));
    }

    #[test]
    fn reads_os_release() {
        let os =
            etc_os_release::OsRelease::from_reader("NAME=\"Debian GNU/Linux\"\nPRETTY_NAME='Debian GNU/Linux 12 (bookworm)'\n".as_bytes())
                .unwrap();
        assert_eq!(os.pretty_name(), "Debian GNU/Linux 12 (bookworm)");
    }

    #[test]
    fn describes_this_machine() {
        let m = Machine::this();
        let online = procfs::CpuInfo::current().unwrap().num_cores();
        // The cores this process may use: at least one, at most the CPUs the kernel lists.
        assert!(m.cores >= 1 && m.cores <= online, "{m:?}, {online} CPUs online");
        assert!(!m.chip.is_empty() && m.chip != "unknown", "{m:?}");
        assert!(m.memory_bytes > 0 && !m.os.is_empty() && m.os != "linux", "{m:?}");
    }
}
