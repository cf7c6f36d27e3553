//! Pure arithmetic from raw kernel counters to [`MemoryStats`].
use super::{CgroupLimit, MemoryStats, PressureLevel, PressureSource};

/// Raw macOS readings: `host_statistics64(HOST_VM_INFO64)` page counts, `hw.memsize`,
/// `vm.swapusage` and `kern.memorystatus_vm_pressure_level`.
#[derive(Debug, Clone, Default)]
pub struct MacVmRaw {
    pub page_size: u64,
    pub memsize: u64,
    pub free_count: u64,
    pub active_count: u64,
    pub inactive_count: u64,
    pub speculative_count: u64,
    pub wire_count: u64,
    pub compressor_page_count: u64,
    pub purgeable_count: u64,
    pub external_page_count: u64,
    pub swapins: u64,
    pub swapouts: u64,
    pub swap_total: u64,
    pub swap_used: u64,
    pub pressure_level: Option<i32>,
}

/// The kernel's level: 1 normal, 2 warn, 4 critical; anything else is unknown.
pub fn mac_pressure(level: Option<i32>) -> PressureLevel {
    match level {
        Some(1) => PressureLevel::Normal,
        Some(2) => PressureLevel::Warn,
        Some(4) => PressureLevel::Critical,
        _ => PressureLevel::Unknown,
    }
}

/// Activity Monitor's arithmetic: used = active + inactive + speculative + wired +
/// compressed − purgeable − external; app = used − wired − compressed; cached files =
/// purgeable + external.
pub fn from_mac(r: &MacVmRaw) -> MemoryStats {
    let p = r.page_size;
    let used_pages = (r.active_count + r.inactive_count + r.speculative_count + r.wire_count + r.compressor_page_count)
        .saturating_sub(r.purgeable_count + r.external_page_count);
    let used = used_pages * p;
    let wired = r.wire_count * p;
    let compressed = r.compressor_page_count * p;
    MemoryStats {
        total: r.memsize,
        free: r.free_count * p,
        available: r.memsize.saturating_sub(used),
        used,
        active: r.active_count * p,
        inactive: r.inactive_count * p,
        wired,
        compressed,
        app: used.saturating_sub(wired + compressed),
        cached_files: (r.purgeable_count + r.external_page_count) * p,
        swap_total: r.swap_total,
        swap_used: r.swap_used,
        swap_ins: r.swapins,
        swap_outs: r.swapouts,
        pressure: mac_pressure(r.pressure_level),
        pressure_raw: r.pressure_level.map(f64::from),
        pressure_source: if r.pressure_level.is_some() { PressureSource::Kernel } else { PressureSource::Unknown },
        cgroup: None,
    }
}

/// PSI thresholds (percent of the last 10 s in which some / all tasks stalled on memory).
/// `some` >= 10 % means reclaim is slowing work down: warn. `full` >= 5 % means the whole
/// machine stalls: critical. These mirror what systemd-oomd and Android's lmkd treat as
/// pressure (their defaults sit at 10-60 %; the lower edge warns early on a laptop).
pub const PSI_WARN_SOME_AVG10: f64 = 10.0;
pub const PSI_CRITICAL_FULL_AVG10: f64 = 5.0;

pub fn psi_pressure(some_avg10: f64, full_avg10: f64) -> PressureLevel {
    if full_avg10 >= PSI_CRITICAL_FULL_AVG10 {
        PressureLevel::Critical
    } else if some_avg10 >= PSI_WARN_SOME_AVG10 {
        PressureLevel::Warn
    } else {
        PressureLevel::Normal
    }
}

/// Raw Linux readings (bytes), from /proc/meminfo, /proc/vmstat and /proc/pressure/memory.
#[derive(Debug, Clone, Default)]
pub struct LinuxRaw {
    pub mem_total: u64,
    pub mem_free: u64,
    pub mem_available: u64,
    pub active: u64,
    pub inactive: u64,
    pub cached: u64,
    pub buffers: u64,
    pub anon_pages: u64,
    pub unevictable: u64,
    pub swap_total: u64,
    pub swap_free: u64,
    pub pswpin: u64,
    pub pswpout: u64,
    /// (some avg10, full avg10) in percent; None without PSI.
    pub psi: Option<(f64, f64)>,
    /// This process's cgroup limit, if any (see [`super::cgroup`]).
    pub cgroup: Option<CgroupLimit>,
}

pub fn from_linux(r: &LinuxRaw) -> MemoryStats {
    let (pressure, pressure_raw, pressure_source) = match r.psi {
        Some((some, full)) => (psi_pressure(some, full), Some(some), PressureSource::Psi),
        None => (PressureLevel::Unknown, None, PressureSource::Unknown),
    };
    // A limit at or above the machine's memory binds nothing (v1 says "unlimited" with
    // 2^63 rounded down to a page).
    let cgroup = r.cgroup.clone().filter(|c| c.limit < r.mem_total);
    let (total, available) = match &cgroup {
        Some(c) => (c.limit, r.mem_available.min(c.headroom())),
        None => (r.mem_total, r.mem_available),
    };
    MemoryStats {
        total,
        free: r.mem_free.min(available),
        available,
        used: total.saturating_sub(available),
        active: r.active,
        inactive: r.inactive,
        wired: r.unevictable,
        compressed: 0,
        app: r.anon_pages,
        cached_files: r.cached + r.buffers,
        swap_total: r.swap_total,
        swap_used: r.swap_total.saturating_sub(r.swap_free),
        swap_ins: r.pswpin,
        swap_outs: r.pswpout,
        pressure,
        pressure_raw,
        pressure_source,
        cgroup,
    }
}

/// Per-second rate of a cumulative counter between two readings (0 after a reset).
pub fn rate(prev: u64, now: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 || now < prev {
        0.0
    } else {
        (now - prev) as f64 / seconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded on an Intel Mac (page size 4096), `vm_stat` as posted in wazuh/wazuh#22113
    /// (macOS 14, 32 GiB: `hw.memsize` 34359738368); no swap in use, pressure normal.
    fn intel_mac() -> MacVmRaw {
        MacVmRaw {
            page_size: 4096,
            memsize: 34_359_738_368,
            free_count: 6_127_229,
            active_count: 485_320,
            inactive_count: 628_646,
            speculative_count: 430_715,
            wire_count: 715_958,
            compressor_page_count: 0,
            purgeable_count: 11_820,
            external_page_count: 1_080_348,
            swapins: 0,
            swapouts: 0,
            swap_total: 0,
            swap_used: 0,
            pressure_level: Some(1),
        }
    }

    #[test]
    fn activity_monitor_arithmetic_on_a_recorded_mac() {
        let m = from_mac(&intel_mac());
        // used = (485320 + 628646 + 430715 + 715958 + 0 - 11820 - 1080348) pages
        assert_eq!(m.used, 1_168_471 * 4096);
        assert_eq!(m.wired, 715_958 * 4096);
        assert_eq!(m.app, (1_168_471 - 715_958) * 4096);
        assert_eq!(m.cached_files, (11_820 + 1_080_348) * 4096);
        assert_eq!(m.free, 6_127_229 * 4096);
        assert_eq!(m.available, 34_359_738_368 - 1_168_471 * 4096);
        assert_eq!((m.pressure, m.pressure_source), (PressureLevel::Normal, PressureSource::Kernel));
        assert!((m.used_ratio() - 0.1393).abs() < 1e-3);
    }

    /// Recorded on an 8 GiB Apple Silicon Mac under heavy load (16 KiB pages, 10 GiB squeezed
    /// into the compressor, millions of swap-ins): a `vm_stat` capture published as a test
    /// fixture (`parseMacMemoryFromVmStat`'s tests in a public repository). `vm.swapusage`
    /// and the pressure level were not recorded.
    fn apple_silicon_under_load() -> MacVmRaw {
        MacVmRaw {
            page_size: 16384,
            memsize: 8 << 30,
            free_count: 5_076,
            active_count: 107_971,
            inactive_count: 106_508,
            speculative_count: 844,
            wire_count: 111_522,
            compressor_page_count: 148_632,
            purgeable_count: 429,
            external_page_count: 70_018,
            swapins: 10_554_789,
            swapouts: 11_137_186,
            swap_total: 0,
            swap_used: 0,
            pressure_level: None,
        }
    }

    #[test]
    fn apple_silicon_pages_are_16k_and_compressed_memory_is_not_app_memory() {
        let m = from_mac(&apple_silicon_under_load());
        // used = (107971 + 106508 + 844 + 111522 + 148632 - 429 - 70018) pages
        assert_eq!(m.used, 405_030 * 16384);
        assert_eq!(m.compressed, 148_632 * 16384);
        // App memory is what Activity Monitor shows: anonymous pages (145305) less purgeable.
        assert_eq!(m.app, (145_305 - 429) * 16384);
        assert_eq!(m.app + m.wired + m.compressed, m.used);
        assert_eq!(m.cached_files, (429 + 70_018) * 16384);
        // Free pages say 1 %; the machine is 77 % used.
        assert!(m.free * 100 / m.total < 2);
        assert!((m.used_ratio() - 0.7726).abs() < 1e-3, "{}", m.used_ratio());
        assert_eq!((m.swap_ins, m.swap_outs), (10_554_789, 11_137_186));
        assert_eq!((m.pressure, m.pressure_source), (PressureLevel::Unknown, PressureSource::Unknown));
    }

    #[test]
    fn kernel_levels_map_and_unknown_values_never_crash() {
        assert_eq!(mac_pressure(Some(2)), PressureLevel::Warn);
        assert_eq!(mac_pressure(Some(4)), PressureLevel::Critical);
        assert_eq!(mac_pressure(Some(3)), PressureLevel::Unknown);
        assert_eq!(mac_pressure(None), PressureLevel::Unknown);
        let m = from_mac(&MacVmRaw { pressure_level: None, ..intel_mac() });
        assert_eq!(m.pressure_source, PressureSource::Unknown);
    }

    #[test]
    fn psi_levels() {
        assert_eq!(psi_pressure(0.0, 0.0), PressureLevel::Normal);
        assert_eq!(psi_pressure(12.5, 1.0), PressureLevel::Warn);
        assert_eq!(psi_pressure(30.0, 6.0), PressureLevel::Critical);
    }

    #[test]
    fn linux_figures_from_recorded_meminfo() {
        // /proc/meminfo of this project's build machine, read on 2026-11-30 (kB x 1024), PSI idle.
        let r = LinuxRaw {
            mem_total: 24_683_656 * 1024,
            mem_free: 21_401_884 * 1024,
            mem_available: 23_760_080 * 1024,
            active: 1_224_416 * 1024,
            inactive: 1_630_840 * 1024,
            cached: 2_458_664 * 1024,
            buffers: 15_052 * 1024,
            anon_pages: 216_244 * 1024,
            unevictable: 9_912 * 1024,
            swap_total: 0,
            swap_free: 0,
            pswpin: 0,
            pswpout: 0,
            psi: Some((0.0, 0.0)),
            cgroup: None,
        };
        let m = from_linux(&r);
        assert_eq!(m.used, (24_683_656 - 23_760_080) * 1024);
        assert_eq!(m.cached_files, (2_458_664 + 15_052) * 1024);
        assert_eq!(m.wired, 9_912 * 1024);
        assert_eq!((m.pressure, m.pressure_source), (PressureLevel::Normal, PressureSource::Psi));
        let none = from_linux(&LinuxRaw { psi: None, ..r });
        assert_eq!((none.pressure, none.pressure_source), (PressureLevel::Unknown, PressureSource::Unknown));
    }

    #[test]
    fn a_cgroup_limit_is_the_total_and_bounds_what_is_available() {
        let machine = LinuxRaw { mem_total: 24 << 30, mem_free: 20 << 30, mem_available: 22 << 30, ..Default::default() };
        let limit = |limit: u64, working_set: u64| CgroupLimit { version: 1, path: "/sys/fs/cgroup/memory/t".into(), limit, working_set };
        // 400 MiB limit, 150 MiB charged: 250 MiB left, whatever the machine has free.
        let m = from_linux(&LinuxRaw { cgroup: Some(limit(400 << 20, 150 << 20)), ..machine.clone() });
        assert_eq!((m.total, m.available, m.used, m.free), (400 << 20, 250 << 20, 150 << 20, 250 << 20));
        assert_eq!(m.cgroup.as_ref().map(|c| c.limit), Some(400 << 20));
        // The machine is the tighter one: its available memory binds.
        let m = from_linux(&LinuxRaw { mem_available: 100 << 20, cgroup: Some(limit(400 << 20, 150 << 20)), ..machine.clone() });
        assert_eq!(m.available, 100 << 20);
        // Charged past the limit (the kernel lets usage touch it): nothing left, not a wrap.
        let m = from_linux(&LinuxRaw { cgroup: Some(limit(400 << 20, 500 << 20)), ..machine.clone() });
        assert_eq!((m.available, m.used), (0, 400 << 20));
        // v1's "unlimited" (2^63 less a page) is no limit: the machine's figures, no cgroup.
        let m = from_linux(&LinuxRaw { cgroup: Some(limit(9_223_372_036_854_771_712, 1 << 30)), ..machine.clone() });
        assert_eq!((m.total, m.available, m.cgroup), (24 << 30, 22 << 30, None));
    }

    #[test]
    fn counter_rates() {
        assert_eq!(rate(100, 160, 2.0), 30.0);
        assert_eq!(rate(160, 100, 2.0), 0.0);
        assert_eq!(rate(1, 2, 0.0), 0.0);
    }
}
