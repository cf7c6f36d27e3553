//! VNNI's `vpdpbusd` for [`super::avx2`]'s kernel (and, with AVX-512, its 512-bit loops): four unsigned-byte × int8
//! products summed into each int32 lane in one instruction, where AVX2 takes three
//! (`maddubs`, an add, `madd`). Unsigned 8-bit weights meet `x` as they are (no shift to
//! signed, no offset term), and 4-bit nibbles go straight in.
//!
//! Two encodings of the same instruction: AVX-VNNI (VEX, Alder Lake, Sapphire Rapids, Zen 5)
//! and AVX512-VNNI (EVEX, Cascade Lake, Ice Lake, Zen 4), which also gives 32 vector
//! registers, room for a tile of eight rows without spilling, and 512-bit registers: there
//! 4-bit weights go four blocks (128 values) a load and 8-bit two, so their unpacking,
//! scales and float work take half the instructions the 256-bit loop's would.
use std::arch::x86_64::*;
use std::ops::Range;

use super::activations::{Activations, BLOCK};
use super::avx2::{columns_with, Dot, PREFETCH};
use super::{Out, Scale, Weights};

/// `vpdpbusd` in its VEX encoding (AVX-VNNI).
struct AvxVnni;

impl Dot for AvxVnni {
    const TILE: usize = 8;
    const SHIFTED_BYTES: bool = false;
    type Bytes = __m256i;

    #[inline(always)]
    unsafe fn nibbles(lo: __m256i, xe: __m256i, hi: __m256i, xo: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xe), hi, xo)
    }

    #[inline(always)]
    unsafe fn prepare_bytes(w: __m256i) -> __m256i {
        w
    }

    #[inline(always)]
    unsafe fn bytes(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x)
    }
}

/// `vpdpbusd` in its EVEX encoding (AVX512-VNNI): 4-bit quads and 8-bit pairs of blocks
/// on 512-bit registers, the rest (a 4-bit last pair, an odd last block) on 256-bit ones
/// (AVX512VL).
struct Avx512Vnni;

impl Dot for Avx512Vnni {
    const TILE: usize = 8;
    const SHIFTED_BYTES: bool = false;
    type Bytes = __m256i;

    #[inline(always)]
    unsafe fn nibbles(lo: __m256i, xe: __m256i, hi: __m256i, xo: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xe), hi, xo)
    }

    #[inline(always)]
    unsafe fn prepare_bytes(w: __m256i) -> __m256i {
        w
    }

    #[inline(always)]
    unsafe fn bytes(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
    }

    /// A quad of blocks a 64-byte load: low nibbles against the quad's 64 even values of
    /// `x`, high against its odds; lane `l` of the sums belongs to block `l / 4`, so the
    /// quad's four activation scales are one 16-lane load and its weight groups' scales
    /// (one to four, by group size) one masked load spread over the lanes.
    #[inline(always)]
    unsafe fn quads<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m256; R] {
        let (k, gs) = (w.k, w.group_size);
        let (groups, blocks) = (k / gs, k / BLOCK);
        let group_shift = (gs / BLOCK).trailing_zeros();
        let wrow = (w.packed.as_ptr() as *const u8).add(j * k / 2);
        let scales = w.scales.as_ptr().add(j * groups);
        let q: [*const i8; R] = std::array::from_fn(|y| a.row_q(r0 + y).as_ptr());
        let ps: [*const f32; R] = std::array::from_fn(|y| a.pair_scale.as_ptr().add((r0 + y) * (blocks / 2) * 8));
        let low = _mm512_set1_epi8(0x0F);
        // Lane l: the quad's group (l / 4) >> shift, of the `4 >> shift` groups it spans.
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let group_of_lane = _mm512_srl_epi32(lanes, _mm_cvtsi32_si128(2 + group_shift as i32));
        let mask = (1u8 << (4 >> group_shift)) - 1;
        let mut acc = [_mm512_setzero_ps(); R];
        for u in 0..blocks / 4 {
            _mm_prefetch::<_MM_HINT_T0>(wrow.add(u * 64 + PREFETCH) as *const i8);
            let v = _mm512_loadu_si512(wrow.add(u * 64) as *const __m512i);
            let lo = _mm512_and_si512(v, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            // The quad's groups lie in column j's scales; the mask reads no others.
            let g = S::load4_masked(scales.add((4 * u) >> group_shift), mask);
            let s = _mm512_permutexvar_ps(group_of_lane, _mm512_castps128_ps512(g));
            for y in 0..R {
                let xe = _mm512_loadu_si512(q[y].add(u * 128) as *const __m512i);
                let xo = _mm512_loadu_si512(q[y].add(u * 128 + 64) as *const __m512i);
                let d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe), hi, xo);
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(ps[y].add(u * 16)));
                acc[y] = _mm512_fmadd_ps(t, s, acc[y]);
            }
        }
        halves(&acc)
    }

    /// Two blocks a 64-byte load (`x` is in order for 8-bit weights): lane `l` of the sums
    /// belongs to block `l / 8`, so the blocks' activation scales are one 16-lane load
    /// ([`Activations::lane_scale`]) and their groups' scales one masked load spread over
    /// the lanes; an odd last block goes on 256-bit registers.
    #[inline(always)]
    unsafe fn bytes_all<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m256; R] {
        let (k, gs) = (w.k, w.group_size);
        let (groups, blocks) = (k / gs, k / BLOCK);
        let group_shift = (gs / BLOCK).trailing_zeros();
        let wrow = (w.packed.as_ptr() as *const u8).add(j * k);
        let scales = w.scales.as_ptr().add(j * groups);
        let q: [*const i8; R] = std::array::from_fn(|y| a.row_q(r0 + y).as_ptr());
        let ls: [*const f32; R] = std::array::from_fn(|y| a.lane_scale.as_ptr().add((r0 + y) * blocks * 8));
        // Lane l: the pair's group (l / 8) >> shift: two groups of 32, else one.
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let group_of_lane = _mm512_srl_epi32(lanes, _mm_cvtsi32_si128(3 + group_shift as i32));
        let mask = if group_shift == 0 { 0b11 } else { 0b1 };
        let mut acc = [_mm512_setzero_ps(); R];
        for v in 0..blocks / 2 {
            _mm_prefetch::<_MM_HINT_T0>(wrow.add(v * 64 + PREFETCH) as *const i8);
            let wv = _mm512_loadu_si512(wrow.add(v * 64) as *const __m512i);
            // The pair's groups lie in column j's scales; the mask reads no others.
            let g = S::load4_masked(scales.add((2 * v) >> group_shift), mask);
            let s = _mm512_permutexvar_ps(group_of_lane, _mm512_castps128_ps512(g));
            for y in 0..R {
                let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(q[y].add(v * 64) as *const __m512i));
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(ls[y].add(v * 16)));
                acc[y] = _mm512_fmadd_ps(t, s, acc[y]);
            }
        }
        let mut acc = halves(&acc);
        if blocks % 2 == 1 {
            let b = blocks - 1;
            let wv = _mm256_loadu_si256(wrow.add(b * BLOCK) as *const __m256i);
            let s = (*scales.add(b >> group_shift)).to_f32_f16c();
            for y in 0..R {
                let d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wv, _mm256_loadu_si256(q[y].add(b * BLOCK) as *const __m256i));
                acc[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(a.row_scale(r0 + y)[b] * s), acc[y]);
            }
        }
        acc
    }
}

/// Each row's 16 lanes added into 8.
#[inline(always)]
unsafe fn halves<const R: usize>(acc: &[__m512; R]) -> [__m256; R] {
    let mut out = [_mm256_setzero_ps(); R];
    for y in 0..R {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[y]), 1));
        out[y] = _mm256_add_ps(_mm512_castps512_ps256(acc[y]), high);
    }
    out
}

/// Output columns `columns` of every row with AVX-VNNI.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI are available; `w` and `a` describe the same `k`, `a` in
/// `Layout::for_bits(w.bits)` (asserted).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn columns_avx_vnni<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    columns_with::<AvxVnni, S>(w, a, out, columns)
}

/// Output columns `columns` of every row with AVX512-VNNI.
///
/// # Safety
/// AVX2, FMA, F16C, AVX512F, AVX512VL, AVX512BW and AVX512-VNNI are available; `w` and `a`
/// describe the same `k`, `a` in `Layout::for_bits(w.bits)` (asserted).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn columns_avx512_vnni<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    columns_with::<Avx512Vnni, S>(w, a, out, columns)
}
