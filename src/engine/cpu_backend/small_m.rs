//! `c = a · bᵀ` for a few rows of `a` (a batched decode step: one row per sequence) against
//! a large row-major `b` (a weight matrix, `[out, in]`), streaming each row of `b` once for
//! all rows of `a`; Debian's OpenBLAS instead packs the whole of `b` on every call. AVX2 +
//! FMA on x86_64, chosen at run time; the rows of `b` are split across the cores
//! ([`super::pool`]). [`super::gemv_forward`] routes MLX's small sgemm calls here.
/// Rows of `a` handled here; more go to BLAS (prefill chunks are larger).
pub const MAX_ROWS: usize = 16;
/// Rows of `b` (output columns) per parallel task.
const COLUMNS_PER_TASK: usize = 96;

pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Raw pointers into the pool's tasks; each task writes its own columns of `c`.
#[derive(Clone, Copy)]
struct Ptr<T>(T);
// SAFETY: the pointers are only dereferenced inside `matmul_bt`, whose caller keeps the
// matrices alive for the call; tasks read `a` and `b` and write disjoint columns of `c`.
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as for Send: shared reads, disjoint writes.
unsafe impl<T> Sync for Ptr<T> {}

/// # Safety
/// `a` is `m × k` with row stride `lda`, `b` is `n × k` with row stride `ldb`, `c` is
/// `m × n` with row stride `ldc`, all valid; `available()` is true.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_bt(a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, m: usize, n: usize, k: usize) {
    let (a, b, c) = (Ptr(a), Ptr(b), Ptr(c));
    super::pool::for_each(n.div_ceil(COLUMNS_PER_TASK), move |task| {
        let (a, b, c) = (a, b, c);
        let columns = task * COLUMNS_PER_TASK..((task + 1) * COLUMNS_PER_TASK).min(n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's matrices; this task's `columns` are its own; AVX2+FMA are
        // available (the caller's contract).
        columns_avx2(a.0, lda, b.0, ldb, c.0, ldc, m, columns, k);
    });
}

/// Columns `columns` of `c`, three rows of `b` against four rows of `a` at a time: twelve
/// accumulators in registers, so each 8-float chunk of `b` is loaded once per four rows
/// of `a` (the three rows of `b` stay in L1 while the row groups of `a` go by).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn columns_avx2(
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    m: usize,
    columns: std::ops::Range<usize>,
    k: usize,
) {
    use super::simd::hsum;
    use std::arch::x86_64::*;
    let body = k - k % 8;
    let mut j = columns.start;
    while j < columns.end {
        let nb = (columns.end - j).min(3);
        // Fewer than three left: repeat the last row (its results are not stored twice).
        let w: [*const f32; 3] = std::array::from_fn(|x| b.add((j + x.min(nb - 1)) * ldb));
        let mut i = 0;
        while i < m {
            let na = (m - i).min(4);
            let r: [*const f32; 4] = std::array::from_fn(|y| a.add((i + y.min(na - 1)) * lda));
            let mut acc = [[_mm256_setzero_ps(); 3]; 4];
            let mut t = 0;
            while t < body {
                let w0 = _mm256_loadu_ps(w[0].add(t));
                let w1 = _mm256_loadu_ps(w[1].add(t));
                let w2 = _mm256_loadu_ps(w[2].add(t));
                for y in 0..4 {
                    let x = _mm256_loadu_ps(r[y].add(t));
                    acc[y][0] = _mm256_fmadd_ps(x, w0, acc[y][0]);
                    acc[y][1] = _mm256_fmadd_ps(x, w1, acc[y][1]);
                    acc[y][2] = _mm256_fmadd_ps(x, w2, acc[y][2]);
                }
                t += 8;
            }
            for y in 0..na {
                for x in 0..nb {
                    let mut s = hsum(acc[y][x]);
                    for t in body..k {
                        s = (*r[y].add(t)).mul_add(*w[x].add(t), s);
                    }
                    *c.add((i + y) * ldc + j + x) = s;
                }
            }
            i += na;
        }
        j += nb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_triple_loop() {
        if !available() {
            return;
        }
        for (m, n, k) in [(5, 131, 579), (2, 3, 8), (16, 200, 64), (3, 1, 17)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
            let b: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5).collect();
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: the vectors have exactly the shapes passed, and AVX2+FMA were checked.
            unsafe { matmul_bt(a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), n, m, n, k) };
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|t| a[i * k + t] as f64 * b[j * k + t] as f64).sum();
                    assert!((c[i * n + j] as f64 - want).abs() < 1e-3, "{m}x{n}x{k}: c[{i},{j}] = {} vs {want}", c[i * n + j]);
                }
            }
        }
    }
}
