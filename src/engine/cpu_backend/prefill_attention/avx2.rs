//! The AVX2 + FMA form of [`super::portable_block`]: each key loaded once for up to four
//! queries' dot products (their sums reduced together), the softmax's `exp` eight values
//! at a time ([`exp`], shared with SwiGLU), each value row loaded once for all the
//! queries' weighted sums.
use std::arch::x86_64::*;

use super::super::simd::{exp, hsum};
use super::QUERIES;

/// See [`super::portable_block`], for `N` rows of `q` (1 to [`QUERIES`]: a decode step's
/// group of three query heads, the default model's, takes three rows' work, not four);
/// `hd` a multiple of 8 or not (a scalar tail).
///
/// # Safety
/// AVX2 and FMA are available; `q` holds `N` rows of `hd`, `k` and `v` at least
/// `seen[N - 1]` rows, `p` `QUERIES × seen[N - 1]` values, `o` `N` rows.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn block<const N: usize>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seen: &[usize; QUERIES],
    hd: usize,
    scale: f32,
    p: &mut [f32],
    o: &mut [f32],
) {
    let n = N;
    let width = seen[n - 1];
    let body = hd - hd % 8;
    let mut qr = [q.as_ptr(); N];
    for (r, p) in qr.iter_mut().enumerate() {
        *p = q.as_ptr().add(r * hd);
    }
    let (kp, vp, pp) = (k.as_ptr(), v.as_ptr(), p.as_mut_ptr());
    // Scores: every key the last row sees, for every row (a row's later keys are masked
    // below).
    for t in 0..width {
        let kt = kp.add(t * hd);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut c = 0;
        while c < body {
            let kv = _mm256_loadu_ps(kt.add(c));
            for r in 0..N {
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r].add(c)), kv, acc[r]);
            }
            c += 8;
        }
        // Up to four rows' sums in one reduction: lane r of the halves' sum is row r's (a
        // missing row's lane repeats the last row, and is not kept).
        let (a1, a2, a3) = (acc[1.min(N - 1)], acc[2.min(N - 1)], acc[3.min(N - 1)]);
        let h = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], a1), _mm256_hadd_ps(a2, a3));
        let mut s = [0f32; QUERIES];
        _mm_storeu_ps(s.as_mut_ptr(), _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        for (r, mut s) in s.into_iter().take(N).enumerate() {
            for c in body..hd {
                s += *qr[r].add(c) * *kt.add(c);
            }
            *pp.add(r * width + t) = s * scale;
        }
    }
    // Softmax per row over the keys it sees; zero weight for the rest.
    let mut inv = [0f32; QUERIES];
    for r in 0..n {
        let row = std::slice::from_raw_parts_mut(pp.add(r * width), width);
        let (seen_r, masked) = row.split_at_mut(seen[r]);
        masked.fill(0.0);
        let max = seen_r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let (mx, mut total) = (_mm256_set1_ps(max), _mm256_setzero_ps());
        let mut chunks = seen_r.chunks_exact_mut(8);
        for c in &mut chunks {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mx));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            total = _mm256_add_ps(total, e);
        }
        let mut total = hsum(total);
        for x in chunks.into_remainder() {
            *x = (*x - max).exp();
            total += *x;
        }
        inv[r] = 1.0 / total;
    }
    // Values: sixteen columns at a time (up to eight chains of multiply-adds), every key
    // once for all the rows; then eight, then the rest.
    let mut c = 0;
    while c + 16 <= hd {
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
        for t in 0..width {
            let vt = vp.add(t * hd + c);
            let (x0, x1) = (_mm256_loadu_ps(vt), _mm256_loadu_ps(vt.add(8)));
            for r in 0..N {
                let w = _mm256_set1_ps(*pp.add(r * width + t));
                lo[r] = _mm256_fmadd_ps(w, x0, lo[r]);
                hi[r] = _mm256_fmadd_ps(w, x1, hi[r]);
            }
        }
        store(&lo, &inv, hd, c, 8, o);
        store(&hi, &inv, hd, c + 8, 8, o);
        c += 16;
    }
    while c < hd {
        let lanes = (hd - c).min(8);
        let mut acc = [_mm256_setzero_ps(); N];
        for t in 0..width {
            let vt = vp.add(t * hd + c);
            let x = if lanes == 8 { _mm256_loadu_ps(vt) } else { load_partial(vt, lanes) };
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_set1_ps(*pp.add(r * width + t)), x, *a);
            }
        }
        store(&acc, &inv, hd, c, lanes, o);
        c += lanes;
    }
}

/// Each row's weighted values in columns `c..c + lanes` (`acc[r]`, its first `lanes`
/// lanes) scaled by the row's softmax denominator `inv[r]` into `o`. A function, not a
/// closure: a closure here would keep its intrinsics out of line.
#[inline(always)]
unsafe fn store<const N: usize>(acc: &[__m256; N], inv: &[f32; QUERIES], hd: usize, c: usize, lanes: usize, o: &mut [f32]) {
    for r in 0..N {
        let mut lane = [0f32; 8];
        _mm256_storeu_ps(lane.as_mut_ptr(), _mm256_mul_ps(acc[r], _mm256_set1_ps(inv[r])));
        o[r * hd + c..][..lanes].copy_from_slice(&lane[..lanes]);
    }
}

/// The first `lanes` (< 8) floats at `p`, zeros after.
#[inline(always)]
unsafe fn load_partial(p: *const f32, lanes: usize) -> __m256 {
    let mut buf = [0f32; 8];
    std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), lanes);
    _mm256_loadu_ps(buf.as_ptr())
}
