//! Linux reader: /proc/meminfo, /proc/vmstat and PSI (/proc/pressure/memory) via procfs,
//! and this process's cgroup memory limit ([`super::cgroup`]).
use anyhow::Result;
use procfs::Current;

use super::derive::{from_linux, LinuxRaw};
use super::MemoryStats;

pub fn read() -> Result<MemoryStats> {
    let m = procfs::Meminfo::current()?;
    let vm = procfs::vmstat().unwrap_or_default();
    let counter = |k: &str| vm.get(k).copied().unwrap_or(0).max(0) as u64;
    // Kernels without CONFIG_PSI (or containers hiding it) have no file: pressure unknown.
    let psi = procfs::MemoryPressure::current().ok().map(|p| (p.some.avg10 as f64, p.full.avg10 as f64));
    Ok(from_linux(&LinuxRaw {
        mem_total: m.mem_total,
        mem_free: m.mem_free,
        mem_available: m.mem_available.unwrap_or(m.mem_free),
        active: m.active,
        inactive: m.inactive,
        cached: m.cached,
        buffers: m.buffers,
        anon_pages: m.anon_pages.unwrap_or(0),
        unevictable: m.unevictable.unwrap_or(0),
        swap_total: m.swap_total,
        swap_free: m.swap_free,
        pswpin: counter("pswpin"),
        pswpout: counter("pswpout"),
        psi,
        cgroup: super::cgroup::read(),
    }))
}
