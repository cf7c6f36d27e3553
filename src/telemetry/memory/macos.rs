//! macOS reader: thin FFI, no arithmetic (that is in `derive`).
use std::ffi::CStr;
use std::mem::size_of;

use anyhow::{bail, Result};

use super::derive::{from_mac, MacVmRaw};
use super::MemoryStats;

/// A value `sysctlbyname` may write: plain old data, for which all-zero and any bytes the
/// kernel writes are valid (no references, no niches such as `NonZero*` or enums).
///
/// # Safety
/// Implement only for `#[repr(C)]` integer structs and integers.
unsafe trait SysctlValue: Copy {
    fn zeroed() -> Self {
        // SAFETY: the trait's contract: all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}
// SAFETY: integers.
unsafe impl SysctlValue for u64 {}
// SAFETY: integers.
unsafe impl SysctlValue for i32 {}
// SAFETY: xsw_usage is a repr(C) struct of u64s, a u32 and a boolean_t (an i32).
unsafe impl SysctlValue for libc::xsw_usage {}

fn sysctl<T: SysctlValue>(name: &CStr) -> Option<T> {
    let mut value = T::zeroed();
    let mut len = size_of::<T>();
    // SAFETY: `name` is NUL-terminated; `value` is a live T of `len` bytes, and any bytes
    // the kernel writes there form a valid T (SysctlValue).
    let rc = unsafe { libc::sysctlbyname(name.as_ptr(), &mut value as *mut T as *mut libc::c_void, &mut len, std::ptr::null_mut(), 0) };
    (rc == 0 && len == size_of::<T>()).then_some(value)
}

pub fn read() -> Result<MemoryStats> {
    // SAFETY: vm_statistics64 is a repr(C) struct of integers; all-zero is valid.
    let mut vm: libc::vm_statistics64 = unsafe { std::mem::zeroed() };
    let mut count = (size_of::<libc::vm_statistics64>() / size_of::<libc::integer_t>()) as libc::mach_msg_type_number_t;
    // SAFETY: mach_host_self has no preconditions; it returns the host port.
    let host = unsafe { mach2::mach_init::mach_host_self() };
    // SAFETY: `vm` is live and `count` holds its size in integer_t units, as
    // host_statistics64(HOST_VM_INFO64) requires; it writes no further.
    let rc = unsafe { libc::host_statistics64(host, libc::HOST_VM_INFO64, &mut vm as *mut _ as libc::host_info64_t, &mut count) };
    if rc != 0 {
        bail!("host_statistics64 failed ({rc})");
    }
    let swap: libc::xsw_usage = sysctl(c"vm.swapusage").unwrap_or_else(SysctlValue::zeroed);
    // SAFETY: vm_page_size is a process-wide constant the C runtime sets before main.
    let page_size = unsafe { libc::vm_page_size } as u64;
    Ok(from_mac(&MacVmRaw {
        page_size,
        memsize: sysctl::<u64>(c"hw.memsize").unwrap_or(0),
        free_count: vm.free_count as u64,
        active_count: vm.active_count as u64,
        inactive_count: vm.inactive_count as u64,
        speculative_count: vm.speculative_count as u64,
        wire_count: vm.wire_count as u64,
        compressor_page_count: vm.compressor_page_count as u64,
        purgeable_count: vm.purgeable_count as u64,
        external_page_count: vm.external_page_count as u64,
        swapins: vm.swapins,
        swapouts: vm.swapouts,
        swap_total: swap.xsu_total,
        swap_used: swap.xsu_used,
        pressure_level: sysctl::<i32>(c"kern.memorystatus_vm_pressure_level"),
    }))
}
