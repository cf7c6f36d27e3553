//! A loaded model's weights on huge pages (Linux, the CPU backend).
//!
//! A decode step streams every weight once: ~98 MB for the default model, ~24,000 pages of
//! 4 KiB, each a TLB miss, and on a virtual machine each miss walks two page tables. A
//! step's projections called directly ran 0.75× the time with their weights on 2 MiB pages
//! (AMD EPYC VM, `decode_profile`'s shapes). `MADV_COLLAPSE` (Linux 6.1) moves pages already
//! written onto the kernel's transparent huge pages in place: the weights' buffers stay
//! MLX's own (its allocator's accounting unchanged, the resident size too), only their
//! backing moves, and nothing is flagged for later (no `MADV_HUGEPAGE`: the heap those
//! buffers return to when the model unloads faults and trims in small pages as before).
//! Skipped where the administrator turned transparent huge pages off (`never`: the collapse
//! itself would ignore that); where the kernel refuses (older, no free huge page), the
//! weights stay as they were.
use std::time::{Duration, Instant};

use mlx_rs::Array;

/// `madvise`'s advice to collapse a range onto huge pages now (Linux's uapi value, on every
/// architecture; not in every libc's bindings).
const MADV_COLLAPSE: libc::c_int = 25;

/// Bytes of the given arrays' buffers now on huge pages, out of their total, and the time
/// that took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub huge: usize,
    pub total: usize,
    pub took: Duration,
}

/// The transparent huge page's size, None where they are off (`never`) or not offered.
fn huge_page_size() -> Option<usize> {
    let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    if enabled.contains("[never]") {
        return None;
    }
    let size = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").ok()?;
    size.trim().parse().ok().filter(|s: &usize| s.is_power_of_two())
}

/// Moves the backing of `arrays`' buffers (evaluated; their data is not moved) onto huge
/// pages: the whole huge pages their buffers cover, counting buffers a few KiB apart as one
/// run (the allocator's headers between consecutive buffers are all that separates them).
pub fn place(arrays: &[&Array]) -> Placed {
    let started = Instant::now();
    let mut ranges: Vec<(usize, usize)> = arrays
        .iter()
        .filter_map(|a| {
            // SAFETY: `a` is a live, evaluated array; the pointer is only used as an address.
            let start = unsafe { mlx_sys::mlx_array_data_uint8(a.as_ptr()) } as usize;
            (start != 0 && a.nbytes() > 0).then(|| (start, start + a.nbytes()))
        })
        .collect();
    let total = ranges.iter().map(|(s, e)| e - s).sum();
    let Some(page) = huge_page_size() else { return Placed { huge: 0, total, took: started.elapsed() } };
    ranges.sort_unstable();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (s, e) in ranges {
        match runs.last_mut() {
            // 4 KiB: the gap glibc leaves between consecutive chunks is 16 bytes.
            Some(last) if s <= last.1 + 4096 => last.1 = last.1.max(e),
            _ => runs.push((s, e)),
        }
    }
    let huge = runs.iter().map(|&(s, e)| collapse(s.next_multiple_of(page), e / page * page, page)).sum();
    Placed { huge, total, took: started.elapsed() }
}

/// Collapses each whole huge page (`page` bytes) of `start..end` (multiples of it) that the
/// kernel lets it; returns the bytes it did.
fn collapse(start: usize, end: usize, page: usize) -> usize {
    (start..end)
        .step_by(page.max(1))
        .filter(|&at| {
            // SAFETY: MADV_COLLAPSE changes only how memory is backed, never its contents or
            // its mapping, whatever the range holds (the caller's buffers and the
            // allocator's headers between them); a range not mapped is refused with an error.
            unsafe { libc::madvise(at as *mut libc::c_void, page, MADV_COLLAPSE) == 0 }
        })
        .count()
        * page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this machine's kernel collapses anonymous memory onto huge pages, tried on a
    /// mapping of this test's own (none where they are off, or before Linux 6.1).
    fn collapse_works() -> bool {
        let Some(page) = huge_page_size() else { return false };
        // SAFETY: a fresh private anonymous mapping of 2 pages, written, advised and unmapped
        // here only.
        unsafe {
            let len = 2 * page;
            let p =
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            assert_ne!(p, libc::MAP_FAILED);
            let at = (p as usize).next_multiple_of(page);
            let end = p as usize + len;
            std::ptr::write_bytes(p as *mut u8, 1, len);
            let ok = at + page <= end && libc::madvise(at as *mut libc::c_void, page, MADV_COLLAPSE) == 0;
            libc::munmap(p, len);
            ok
        }
    }

    /// An 8 MiB weight-sized buffer (MLX's own, from its allocator) is moved onto huge pages
    /// with its values unchanged: its whole 2 MiB pages (at least three of its four, as it
    /// may start anywhere in a page) where the kernel collapses pages, as `/proc/self/smaps`
    /// then shows them; none where transparent huge pages are off.
    #[test]
    fn a_weight_buffer_moves_onto_huge_pages_unchanged() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let values: Vec<u32> = (0..(2u32 << 20)).map(|i| i.wrapping_mul(2654435761)).collect();
        let a = Array::from_slice(&values, &[values.len() as i32]);
        a.eval().unwrap();
        let placed = place(&[&a]);
        assert_eq!(placed.total, values.len() * 4);
        assert_eq!(a.as_slice::<u32>(), &values[..], "the values moved with their pages");
        if huge_page_size() != Some(2 << 20) || !collapse_works() {
            eprintln!("this kernel does not collapse onto 2 MiB pages: only the values were checked");
            assert!(huge_page_size().is_some() || placed.huge == 0, "collapsed with huge pages off: {placed:?}");
            return;
        }
        assert!(placed.huge >= 3 * (2 << 20), "{placed:?}");
        // The mappings that hold the buffer (madvise splits one at the advised range's
        // edges) report at least that much on huge pages.
        let (start, end) = (a.as_slice::<u32>().as_ptr() as usize, a.as_slice::<u32>().as_ptr() as usize + placed.total);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut anon_huge_kb = 0;
        for line in smaps.lines() {
            let first = line.split(' ').next().unwrap_or("");
            if let Some((lo, hi)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
                let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap_or(0), usize::from_str_radix(hi, 16).unwrap_or(0));
                inside = lo < end && start < hi;
            } else if inside && line.starts_with("AnonHugePages:") {
                anon_huge_kb += line.split_whitespace().nth(1).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
            }
        }
        assert!(anon_huge_kb * 1024 >= placed.huge, "smaps: {anon_huge_kb} KB on huge pages, placed {placed:?}");
    }
}
