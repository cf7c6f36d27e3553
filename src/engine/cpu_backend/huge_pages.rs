//! A loaded model's weights on 2 MiB pages (Linux, the CPU backend).
//!
//! A decode step streams every weight once: ~98 MB for the default model, ~24,000 pages of
//! 4 KiB, each a TLB miss, and on a virtual machine each miss walks two page tables. A
//! step's projections called directly ran 0.75× the time with their weights on 2 MiB pages
//! (AMD EPYC VM, `decode_profile`'s shapes). Linux gives anonymous memory huge pages where
//! a range asks for them (`transparent_hugepage` set to `madvise`, the common default), and
//! `MADV_COLLAPSE` (Linux 6.1) moves pages already written onto them in place: the weights'
//! buffers stay MLX's own (its allocator's accounting unchanged), only their backing moves.
//! Where the kernel refuses (older, THP off, no free huge pages), the weights stay as they
//! were: nothing else changes.
use mlx_rs::Array;

/// 2 MiB, x86_64's and aarch64's (4 KiB base pages) transparent huge page.
const HUGE: usize = 2 << 20;

/// `madvise`'s advice to collapse a range onto huge pages now (Linux's uapi value, on every
/// architecture; not in every libc's bindings).
const MADV_COLLAPSE: libc::c_int = 25;

/// Bytes of the given arrays' buffers now on huge pages, out of their total.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub huge: usize,
    pub total: usize,
}

/// Asks for the huge pages under `arrays`' buffers (evaluated; their data is not moved):
/// the whole 2 MiB pages that their buffers cover, counting buffers a few KiB apart as one
/// run (the allocator's headers between consecutive buffers are all that separates them).
pub fn place(arrays: &[&Array]) -> Placed {
    let mut ranges: Vec<(usize, usize)> = arrays
        .iter()
        .filter_map(|a| {
            // SAFETY: `a` is a live, evaluated array; the pointer is only used as an address.
            let start = unsafe { mlx_sys::mlx_array_data_uint8(a.as_ptr()) } as usize;
            (start != 0 && a.nbytes() > 0).then(|| (start, start + a.nbytes()))
        })
        .collect();
    let total = ranges.iter().map(|(s, e)| e - s).sum();
    ranges.sort_unstable();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (s, e) in ranges {
        match runs.last_mut() {
            // 4 KiB: the gap glibc leaves between consecutive chunks is 16 bytes.
            Some(last) if s <= last.1 + 4096 => last.1 = last.1.max(e),
            _ => runs.push((s, e)),
        }
    }
    let huge = runs.iter().map(|&(s, e)| collapse(s.next_multiple_of(HUGE), e / HUGE * HUGE)).sum();
    Placed { huge, total }
}

/// Collapses the whole 2 MiB pages of `start..end` (both multiples of [`HUGE`]) that the
/// kernel lets it; returns the bytes it did.
fn collapse(start: usize, end: usize) -> usize {
    let mut done = 0;
    let mut at = start;
    while at < end {
        let p = at as *mut libc::c_void;
        // SAFETY: madvise with these two advices changes only how memory is backed, never
        // its contents or mapping, whatever the range holds (the caller's buffers and the
        // allocator's headers between them); a range not mapped is refused with an error.
        let ok = unsafe { libc::madvise(p, HUGE, libc::MADV_HUGEPAGE) == 0 && libc::madvise(p, HUGE, MADV_COLLAPSE) == 0 };
        if ok {
            done += HUGE;
        }
        at += HUGE;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this machine's kernel gives anonymous memory huge pages where asked
    /// (`transparent_hugepage` not `never`).
    fn huge_pages_allowed() -> bool {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").is_ok_and(|s| !s.contains("[never]"))
    }

    /// An 8 MiB weight-sized buffer (MLX's own, from its allocator) is moved onto huge pages
    /// with its values unchanged: its whole 2 MiB pages (at least three of its four, as it
    /// may start anywhere in a page) where the kernel allows, as `/proc/self/smaps` then
    /// shows them; none where it does not.
    #[test]
    fn a_weight_buffer_moves_onto_huge_pages_unchanged() {
        mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
        let values: Vec<u32> = (0..(2u32 << 20)).map(|i| i.wrapping_mul(2654435761)).collect();
        let a = Array::from_slice(&values, &[values.len() as i32]);
        a.eval().unwrap();
        let placed = place(&[&a]);
        assert_eq!(placed.total, values.len() * 4);
        assert_eq!(a.as_slice::<u32>(), &values[..], "the values moved with their pages");
        if !huge_pages_allowed() {
            assert_eq!(placed.huge, 0);
            return;
        }
        assert!(placed.huge >= 3 * HUGE, "{placed:?}");
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
