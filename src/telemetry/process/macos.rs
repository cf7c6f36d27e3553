//! macOS reader: Mach `task_info` for resident memory, `getrusage` for CPU time.
use super::ProcessStats;

pub fn read() -> anyhow::Result<ProcessStats> {
    // SAFETY: mach_task_basic_info is a plain C struct of integers; all-zero is valid.
    let mut info: libc::mach_task_basic_info = unsafe { std::mem::zeroed() };
    let mut count =
        (std::mem::size_of::<libc::mach_task_basic_info>() / std::mem::size_of::<libc::natural_t>()) as libc::mach_msg_type_number_t;
    // SAFETY: mach_task_self has no preconditions; it returns this task's port.
    let task = unsafe { mach2::traps::mach_task_self() };
    // SAFETY: `info` is a live mach_task_basic_info and `count` holds its size in
    // natural_t units, as task_info(MACH_TASK_BASIC_INFO) requires; it writes no further.
    let rc = unsafe { libc::task_info(task, libc::MACH_TASK_BASIC_INFO, &mut info as *mut _ as libc::task_info_t, &mut count) };
    anyhow::ensure!(rc == 0, "task_info failed ({rc})");
    // SAFETY: rusage is a plain C struct of integers and timevals; all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live rusage for getrusage to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    anyhow::ensure!(rc == 0, "getrusage failed ({rc})");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(ProcessStats { resident_bytes: info.resident_size, cpu_seconds: secs(usage.ru_utime) + secs(usage.ru_stime) })
}
