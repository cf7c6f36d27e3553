//! The AVX2 + FMA form of [`super::portable_block`]: each key loaded once for the four
//! queries' dot products (their sums reduced together), the softmax's `exp` eight values
//! at a time ([`exp`]), each value row loaded once for the four queries' weighted sums.
use std::arch::x86_64::*;

use super::super::simd::hsum;
use super::QUERIES;

/// See [`super::portable_block`]; `hd` a multiple of 8 or not (a scalar tail).
///
/// # Safety
/// AVX2 and FMA are available; `q` holds `n` rows of `hd`, `k` and `v` at least
/// `seen[n - 1]` rows, `p` `QUERIES × seen[n - 1]` values, `o` `n` rows.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn block(
    q: &[f32],
    n: usize,
    k: &[f32],
    v: &[f32],
    seen: &[usize; QUERIES],
    hd: usize,
    scale: f32,
    p: &mut [f32],
    o: &mut [f32],
) {
    let width = seen[n - 1];
    let body = hd - hd % 8;
    // A missing row repeats the last one (its results are not kept).
    let qr: [*const f32; QUERIES] = std::array::from_fn(|r| q.as_ptr().add(r.min(n - 1) * hd));
    let (kp, vp, pp) = (k.as_ptr(), v.as_ptr(), p.as_mut_ptr());
    // Scores: every key the last row sees, for all four rows (a row's later keys are
    // masked below).
    for t in 0..width {
        let kt = kp.add(t * hd);
        let mut acc = [_mm256_setzero_ps(); QUERIES];
        let mut c = 0;
        while c < body {
            let kv = _mm256_loadu_ps(kt.add(c));
            for r in 0..QUERIES {
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r].add(c)), kv, acc[r]);
            }
            c += 8;
        }
        // The four rows' sums in one reduction: lane r of the halves' sum is row r's.
        let h = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        let mut s = [0f32; QUERIES];
        _mm_storeu_ps(s.as_mut_ptr(), _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        for (r, mut s) in s.into_iter().enumerate() {
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
    // Values: sixteen columns at a time (eight chains of multiply-adds), every key once
    // for the four rows; then eight, then the rest.
    let rows = |r: usize| r.min(n - 1) * width;
    let store = |acc: &[__m256; QUERIES], c: usize, lanes: usize, o: &mut [f32]| {
        for r in 0..n {
            let mut lane = [0f32; 8];
            _mm256_storeu_ps(lane.as_mut_ptr(), _mm256_mul_ps(acc[r], _mm256_set1_ps(inv[r])));
            o[r * hd + c..][..lanes].copy_from_slice(&lane[..lanes]);
        }
    };
    let mut c = 0;
    while c + 16 <= hd {
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); QUERIES], [_mm256_setzero_ps(); QUERIES]);
        for t in 0..width {
            let vt = vp.add(t * hd + c);
            let (x0, x1) = (_mm256_loadu_ps(vt), _mm256_loadu_ps(vt.add(8)));
            for r in 0..QUERIES {
                let w = _mm256_set1_ps(*pp.add(rows(r) + t));
                lo[r] = _mm256_fmadd_ps(w, x0, lo[r]);
                hi[r] = _mm256_fmadd_ps(w, x1, hi[r]);
            }
        }
        store(&lo, c, 8, o);
        store(&hi, c + 8, 8, o);
        c += 16;
    }
    while c < hd {
        let lanes = (hd - c).min(8);
        let mut acc = [_mm256_setzero_ps(); QUERIES];
        for t in 0..width {
            let vt = vp.add(t * hd + c);
            let x = if lanes == 8 { _mm256_loadu_ps(vt) } else { load_partial(vt, lanes) };
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_set1_ps(*pp.add(rows(r) + t)), x, *a);
            }
        }
        store(&acc, c, lanes, o);
        c += lanes;
    }
}

/// The first `lanes` (< 8) floats at `p`, zeros after.
#[inline(always)]
unsafe fn load_partial(p: *const f32, lanes: usize) -> __m256 {
    let mut buf = [0f32; 8];
    std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), lanes);
    _mm256_loadu_ps(buf.as_ptr())
}

/// `e^x` per lane for `x <= 0` (softmax's shifted scores), Cephes' `expf`: `x = n·ln 2 + f`
/// with |f| <= ln 2 / 2, a degree-5 polynomial for `e^f`, `2^n` built in the exponent bits.
/// Within 2 ulp of libm's; below -87.3 (where float32's normal range ends) it gives
/// `e^-87.3`, ~1e-38: nothing beside the row's largest weight of 1.
#[inline(always)]
unsafe fn exp(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.3));
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), f);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(f, f), f), _mm256_set1_ps(1.0));
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
}
