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

#[cfg(not(target_os = "macos"))]
mod platform {
    pub fn chip() -> Option<String> {
        let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        super::field(&text, "model name", ':')
    }

    pub fn os() -> Option<String> {
        let text = std::fs::read_to_string("/etc/os-release").ok()?;
        super::field(&text, "PRETTY_NAME", '=').map(|v| v.trim_matches('"').to_string())
    }
}

/// The value of the first `key<sep>value` line.
#[cfg_attr(target_os = "macos", allow(dead_code))]
fn field(text: &str, key: &str, sep: char) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(sep)?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_and_this_machine() {
        assert_eq!(field("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n", "model name", ':').as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(field("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12\"", "PRETTY_NAME", '=').as_deref(), Some("\"Debian GNU/Linux 12\""));
        let m = Machine::this();
        assert!(m.cores >= 1 && m.memory_bytes > 0 && m.chip != "unknown", "{m:?}");
    }
}
