//! This process: resident memory and CPU time.
use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct ProcessStats {
    pub resident_bytes: u64,
    pub cpu_seconds: f64,
}

#[cfg(target_os = "linux")]
pub fn read() -> anyhow::Result<ProcessStats> {
    use procfs::WithCurrentSystemInfo;
    let me = procfs::process::Process::myself()?;
    let stat = me.stat()?;
    let ticks = procfs::ticks_per_second() as f64;
    Ok(ProcessStats {
        resident_bytes: stat.rss_bytes().get(),
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
    })
}

#[cfg(target_os = "macos")]
pub fn read() -> anyhow::Result<ProcessStats> {
    let mut info: libc::mach_task_basic_info = unsafe { std::mem::zeroed() };
    let mut count = (std::mem::size_of::<libc::mach_task_basic_info>() / std::mem::size_of::<libc::natural_t>()) as libc::mach_msg_type_number_t;
    let task = unsafe { mach2::traps::mach_task_self() };
    let rc = unsafe { libc::task_info(task, libc::MACH_TASK_BASIC_INFO, &mut info as *mut _ as libc::task_info_t, &mut count) };
    anyhow::ensure!(rc == 0, "task_info failed ({rc})");
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(ProcessStats { resident_bytes: info.resident_size, cpu_seconds: secs(usage.ru_utime) + secs(usage.ru_stime) })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn read() -> anyhow::Result<ProcessStats> {
    anyhow::bail!("no process sampler for this OS")
}
