//! The AVX2 + FMA kernel, against the int8 activations of up to four rows of `x` at once
//! (the weights are unpacked once for all of them):
//! - 4-bit, two blocks (64 values) at a time: one 32-byte load split into low and high
//!   nibbles (the pair's even and odd values, the order [`super::activations`] stores `x`
//!   in), two `maddubs`, the integer sums scaled per lane by the two blocks' activation
//!   scales and weight-group scales;
//! - 8-bit, a block at a time: the bytes shifted to signed, `maddubs` of |w| against `x`
//!   with w's sign, scaled by the block's scale, then the group's at the group's end.
//!
//! The groups' biases meet the sums of the rounded `x` afterwards. Arithmetic as in
//! [`super::scalar`], up to float summation order.
use std::arch::x86_64::*;
use std::ops::Range;

use super::activations::{Activations, BLOCK};
use super::{Out, Weights};

/// Rows of `x` sharing one unpacking of the weights.
const TILE: usize = 4;

/// Output columns `columns` of every row.
///
/// # Safety
/// AVX2 and FMA are available; `w` and `a` describe the same `k` (the caller's checks).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn columns(w: &Weights, a: &Activations, out: Out, columns: Range<usize>) {
    for j in columns {
        let mut r = 0;
        while r < a.rows {
            let n = (a.rows - r).min(TILE);
            let mut sums = [0f32; TILE];
            match (w.bits, n) {
                (4, 4) => tile4::<4>(w, a, j, r, &mut sums),
                (4, 3) => tile4::<3>(w, a, j, r, &mut sums),
                (4, 2) => tile4::<2>(w, a, j, r, &mut sums),
                (4, _) => tile4::<1>(w, a, j, r, &mut sums),
                (_, 4) => tile8::<4>(w, a, j, r, &mut sums),
                (_, 3) => tile8::<3>(w, a, j, r, &mut sums),
                (_, 2) => tile8::<2>(w, a, j, r, &mut sums),
                (_, _) => tile8::<1>(w, a, j, r, &mut sums),
            }
            for (y, s) in sums[..n].iter().enumerate() {
                // SAFETY: (r + y, j) is inside `out`, and only this task writes column j.
                out.write(r + y, j, *s);
            }
            r += n;
        }
    }
}

/// 4-bit column `j` against rows `r0..r0 + R`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile4<const R: usize>(w: &Weights, a: &Activations, j: usize, r0: usize, sums: &mut [f32; TILE]) {
    let (k, gs) = (w.k, w.group_size);
    let (groups, blocks) = (k / gs, k / BLOCK);
    // Blocks per group: 1, 2 or 4, so a shift (a division per pair costs more than the pair).
    let group_shift = (gs / BLOCK).trailing_zeros();
    let wrow = (w.packed.as_ptr() as *const u8).add(j * k / 2);
    let scales = &w.scales[j * groups..][..groups];
    let q: [*const i8; R] = std::array::from_fn(|y| a.row_q(r0 + y).as_ptr());
    let ps: [*const f32; R] = std::array::from_fn(|y| a.pair_scale.as_ptr().add((r0 + y) * (blocks / 2) * 8));
    let ones = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); R];
    for p in 0..blocks / 2 {
        // 32 bytes = blocks 2p and 2p+1; low nibbles are their even values, high the odd.
        let v = _mm256_loadu_si256(wrow.add(p * 32) as *const __m256i);
        let lo = _mm256_and_si256(v, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        // SAFETY: both blocks of a pair lie in the row, so their groups index `scales`.
        let s = _mm256_set_m128(
            _mm_set1_ps(*scales.get_unchecked((2 * p + 1) >> group_shift)),
            _mm_set1_ps(*scales.get_unchecked((2 * p) >> group_shift)),
        );
        for y in 0..R {
            let xe = _mm256_loadu_si256(q[y].add(p * 64) as *const __m256i);
            let xo = _mm256_loadu_si256(q[y].add(p * 64 + 32) as *const __m256i);
            let d = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d, ones)), _mm256_loadu_ps(ps[y].add(p * 8)));
            acc[y] = _mm256_fmadd_ps(t, s, acc[y]);
        }
    }
    if blocks % 2 == 1 {
        // An odd last block: 16 bytes, its x stored [evens | odds].
        let b = blocks - 1;
        let v = _mm_loadu_si128(wrow.add(b * 16) as *const __m128i);
        let l = _mm_set1_epi8(0x0F);
        let wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), l), _mm_and_si128(v, l));
        for y in 0..R {
            let x = _mm256_loadu_si256(q[y].add(b * BLOCK) as *const __m256i);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, x), ones);
            let m = _mm256_set1_ps(a.row_scale(r0 + y)[b] * scales[b >> group_shift]);
            acc[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), m, acc[y]);
        }
    }
    finish::<R, 4>(w, a, j, r0, &acc, sums);
}

/// The row sums plus the groups' bias (and 8-bit offset) terms.
#[target_feature(enable = "avx2,fma")]
unsafe fn finish<const R: usize, const BITS: u32>(
    w: &Weights,
    a: &Activations,
    j: usize,
    r0: usize,
    acc: &[__m256; R],
    sums: &mut [f32; TILE],
) {
    let groups = w.k / w.group_size;
    let (scales, biases) = (&w.scales[j * groups..][..groups], &w.biases[j * groups..][..groups]);
    for y in 0..R {
        let r = r0 + y;
        let mut t = hsum(acc[y]);
        let sums_g = &a.group_sum[r * groups..][..groups];
        for g in 0..groups {
            t += biases[g] * sums_g[g];
        }
        if BITS == 8 {
            let off = &a.offset[r * groups..][..groups];
            for g in 0..groups {
                t += scales[g] * off[g];
            }
        }
        sums[y] = t;
    }
}

/// 8-bit column `j` against rows `r0..r0 + R`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile8<const R: usize>(w: &Weights, a: &Activations, j: usize, r0: usize, sums: &mut [f32; TILE]) {
    let (k, gs) = (w.k, w.group_size);
    let groups = k / gs;
    let wrow = (w.packed.as_ptr() as *const u8).add(j * k);
    let scales = &w.scales[j * groups..][..groups];
    let q: [*const i8; R] = std::array::from_fn(|y| a.row_q(r0 + y).as_ptr());
    let xs: [*const f32; R] = std::array::from_fn(|y| a.row_scale(r0 + y).as_ptr());
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [_mm256_setzero_ps(); R];
    let per_group = gs / BLOCK;
    for (g, &scale) in scales.iter().enumerate() {
        let mut group = [_mm256_setzero_ps(); R];
        for b in g * per_group..(g + 1) * per_group {
            // Unsigned bytes shifted to signed (w - 128); |w| against sign-moved x keeps
            // maddubs's pair sums within int16 (128·127·2 < 32768).
            let v = _mm256_xor_si256(_mm256_loadu_si256(wrow.add(b * 32) as *const __m256i), flip);
            let av = _mm256_abs_epi8(v);
            for y in 0..R {
                let x = _mm256_sign_epi8(_mm256_loadu_si256(q[y].add(b * BLOCK) as *const __m256i), v);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, x), ones);
                group[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&*xs[y].add(b)), group[y]);
            }
        }
        let s = _mm256_set1_ps(scale);
        for y in 0..R {
            acc[y] = _mm256_fmadd_ps(group[y], s, acc[y]);
        }
    }
    finish::<R, 8>(w, a, j, r0, &acc, sums);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
