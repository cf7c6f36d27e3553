//! Linux reader: /proc/self/stat through procfs.
use procfs::WithCurrentSystemInfo;

use super::ProcessStats;

pub fn read() -> anyhow::Result<ProcessStats> {
    let me = procfs::process::Process::myself()?;
    let stat = me.stat()?;
    let ticks = procfs::ticks_per_second() as f64;
    Ok(ProcessStats { resident_bytes: stat.rss_bytes().get(), cpu_seconds: (stat.utime + stat.stime) as f64 / ticks })
}
