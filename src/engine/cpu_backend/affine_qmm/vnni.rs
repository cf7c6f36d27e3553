//! VNNI's `vpdpbusd` for [`super::avx2`]'s kernel (and, with AVX-512, 512-bit loops, and a
//! path of its own for 4-bit weights, [`columns4`]): four unsigned-byte × int8
//! products summed into each int32 lane in one instruction, where AVX2 takes three
//! (`maddubs`, an add, `madd`). Unsigned 8-bit weights meet `x` as they are (no shift to
//! signed, no offset term), and 4-bit nibbles go straight in.
//!
//! Two encodings of the same instruction: AVX-VNNI (VEX, Alder Lake, Sapphire Rapids, Zen 5)
//! and AVX512-VNNI (EVEX, Cascade Lake, Ice Lake, Zen 4), which also gives 32 vector
//! registers, room for a tile of eight rows without spilling, and 512-bit registers: there
//! 4-bit weights go four blocks (128 values) a load and 8-bit two, so their unpacking,
//! scales and float work take half the instructions the 256-bit loop's would, and their
//! sums stay in sixteen lanes until one reduction of the tile's rows.
use std::arch::x86_64::*;
use std::ops::Range;

use super::activations::{self, Activations, BLOCK};
use super::avx2::{columns_with, each, Dot, PREFETCH};
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

/// `vpdpbusd` in its EVEX encoding (AVX512-VNNI) for 8-bit weights: pairs of blocks on
/// 512-bit registers, an odd last block on 256-bit ones (AVX512VL). Its 4-bit weights take
/// [`columns4`].
struct Avx512Vnni;

impl Dot for Avx512Vnni {
    const TILE: usize = 8;
    const SHIFTED_BYTES: bool = false;
    const NIBBLES: bool = false;
    type Bytes = __m256i;

    unsafe fn nibbles(_: __m256i, _: __m256i, _: __m256i, _: __m256i) -> __m256i {
        unreachable!("4-bit weights take columns4")
    }

    #[inline(always)]
    unsafe fn prepare_bytes(w: __m256i) -> __m256i {
        w
    }

    #[inline(always)]
    unsafe fn bytes(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
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
        let q: [*const i8; R] = each(|y| a.q_ptr(r0 + y));
        let ls: [*const f32; R] = each(|y| a.lane_scale.as_ptr().add((r0 + y) * blocks * 8));
        // Lane l: the pair's group (l / 8) >> shift: two groups of 32, else one.
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let group_of_lane = _mm512_srl_epi32(lanes, _mm_cvtsi32_si128(3 + group_shift as i32));
        let mask = if group_shift == 0 { 0b11 } else { 0b1 };
        let mut acc = [_mm512_setzero_ps(); R];
        for v in 0..blocks / 2 {
            _mm_prefetch::<_MM_HINT_T0>(wrow.wrapping_add(v * 64 + PREFETCH) as *const i8);
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

/// A quad of blocks a 64-byte load: low nibbles against the quad's 64 even values of
/// `x`, high against its odds; lane `l` of the sums belongs to block `l / 4`, so the
/// quad's four activation scales are one 16-lane load and its weight groups' scales
/// (one to four, by group size) one masked load spread over the lanes. A last pair
/// takes one product too, its low nibbles in one half of the register and its high in
/// the other against its 64 values of `x` as they are stored (evens, then odds), one
/// product a row where two 256-bit ones took two.
#[inline(always)]
unsafe fn quads16<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m512; R] {
    let (k, gs) = (w.k, w.group_size);
    let (groups, blocks) = (k / gs, k / BLOCK);
    let group_shift = (gs / BLOCK).trailing_zeros();
    let wrow = (w.packed.as_ptr() as *const u8).add(j * k / 2);
    let scales = w.scales.as_ptr().add(j * groups);
    let q: [*const i8; R] = each(|y| a.q_ptr(r0 + y));
    let ps: [*const f32; R] = each(|y| a.pair_scale.as_ptr().add((r0 + y) * (blocks / 2) * 8));
    let low = _mm512_set1_epi8(0x0F);
    // Lane l: the quad's group (l / 4) >> shift, of the `4 >> shift` groups it spans.
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let group_of_lane = _mm512_srl_epi32(lanes, _mm_cvtsi32_si128(2 + group_shift as i32));
    let mask = (1u8 << (4 >> group_shift)) - 1;
    let mut acc = [_mm512_setzero_ps(); R];
    for u in 0..blocks / 4 {
        _mm_prefetch::<_MM_HINT_T0>(wrow.wrapping_add(u * 64 + PREFETCH) as *const i8);
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
    if blocks % 4 >= 2 {
        // Blocks b and b + 1: lanes 0-7 their evens' sums (four lanes each), 8-15 their odds'.
        let (p, b) = (blocks / 4 * 2, blocks / 4 * 4);
        let v = _mm256_loadu_si256(wrow.add(p * 32) as *const __m256i);
        let l = _mm256_set1_epi8(0x0F);
        let lo = _mm256_and_si256(v, l);
        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), l);
        let wv = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        let half = _mm256_set_m128(
            _mm_set1_ps((*scales.add((b + 1) >> group_shift)).to_f32_f16c()),
            _mm_set1_ps((*scales.add(b >> group_shift)).to_f32_f16c()),
        );
        let s = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(half)));
        for y in 0..R {
            let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(q[y].add(p * 64) as *const __m512i));
            let t = _mm512_mul_ps(
                _mm512_cvtepi32_ps(d),
                _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(ps[y].add(p * 8) as *const f64))),
            );
            acc[y] = _mm512_fmadd_ps(t, s, acc[y]);
        }
    }
    acc
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
    if w.bits == 4 {
        columns4(w, a, out, columns)
    } else {
        columns_with::<Avx512Vnni, S>(w, a, out, columns)
    }
}

/// 4-bit columns with the sums in sixteen lanes to the end: the bias terms sixteen groups
/// a multiply-add and one reduction of eight rows' sixteen lanes (where halving every
/// row to eight lanes, then the 256-bit path's bias terms and transpose took a third of an
/// 8-row tile's time at k = 576). Tiles of rows and columns one ahead as
/// [`super::avx2::columns_with`] runs them.
#[inline(always)]
unsafe fn columns4<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    assert_eq!(a.layout, activations::Layout::Nibbles, "activations for another kernel");
    let mut r = 0;
    while r < a.rows {
        let n = (a.rows - r).min(Avx512Vnni::TILE);
        macro_rules! tile {
            ($($rows:literal)*) => {
                match n {
                    $($rows => tile4::<S, $rows>(w, a, out, columns.clone(), r),)*
                    _ => unreachable!("tiles have 1 to 8 rows"),
                }
            };
        }
        tile!(1 2 3 4 5 6 7 8);
        r += n;
    }
}

/// Rows `r0..r0 + R` against `columns`, each column's products issued before the
/// previous column's bias terms and sums (see [`super::avx2`]'s `tile`).
#[inline(always)]
unsafe fn tile4<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>, r0: usize) {
    let mut columns = columns;
    let Some(first) = columns.next() else { return };
    let (mut j, mut acc) = (first, products4::<S, R>(w, a, first, r0));
    for next in columns {
        let ahead = products4::<S, R>(w, a, next, r0);
        write4::<S, R>(w, a, out, j, r0, &acc);
        (j, acc) = (next, ahead);
    }
    write4::<S, R>(w, a, out, j, r0, &acc);
}

/// 4-bit column `j`'s sums against rows `r0..r0 + R` in sixteen lanes, before the bias
/// terms: its quads and last pair ([`quads16`]), then an odd last block into the first
/// eight lanes.
#[inline(always)]
unsafe fn products4<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m512; R] {
    let (k, gs) = (w.k, w.group_size);
    let blocks = k / BLOCK;
    let mut acc = quads16::<S, R>(w, a, j, r0);
    if blocks % 2 == 1 {
        // 16 bytes, its x stored [evens | odds]; the two halves of one register hold the
        // evens' and the odds' products.
        let b = blocks - 1;
        let group_shift = (gs / BLOCK).trailing_zeros();
        let s = (*w.scales.as_ptr().add(j * (k / gs) + (b >> group_shift))).to_f32_f16c();
        let v = _mm_loadu_si128((w.packed.as_ptr() as *const u8).add(j * k / 2 + b * 16) as *const __m128i);
        let l = _mm_set1_epi8(0x0F);
        let wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), l), _mm_and_si128(v, l));
        for (y, acc) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(a.q_ptr(r0 + y).add(b * BLOCK) as *const __m256i);
            let p = _mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wv, x)));
            let m = _mm512_set1_ps(*a.scale_ptr(r0 + y).add(b) * s);
            *acc = _mm512_mask3_fmadd_ps(p, m, *acc, 0x00FF);
        }
    }
    acc
}

/// Column `j`'s results from its sums: each group's bias times the row's group sum (lane
/// `i` takes groups `i`, `i + 16`, … in order), the sixteen lanes added up in
/// [`sum16`]'s order (for four rows or more all at once, [`sum16_rows`]: a row's result
/// is the same bit for bit in any tile), into `out`.
#[inline(always)]
unsafe fn write4<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, out: Out, j: usize, r0: usize, acc: &[__m512; R]) {
    let groups = w.k / w.group_size;
    let biases = w.biases.as_ptr().add(j * groups);
    let sums_g: [*const f32; R] = each(|y| a.group_sum.as_ptr().add((r0 + y) * groups));
    let mut v = *acc;
    let mut g = 0;
    while g < groups {
        // Masked loads read only this column's groups and this row's sums.
        let mask = if groups - g >= 16 { u16::MAX } else { (1u16 << (groups - g)) - 1 };
        let b = S::load16_masked(biases.add(g), mask);
        for y in 0..R {
            v[y] = _mm512_mask3_fmadd_ps(b, _mm512_maskz_loadu_ps(mask, sums_g[y].add(g)), v[y], mask);
        }
        g += 16;
    }
    let mut sums = [0f32; 8];
    if R >= 4 {
        let all = sum16_rows(each(|y| if y < R { v[y] } else { _mm512_setzero_ps() }));
        _mm256_storeu_ps(sums.as_mut_ptr(), all);
    } else {
        for y in 0..R {
            sums[y] = sum16(v[y]);
        }
    }
    for (y, s) in sums[..R].iter().enumerate() {
        // SAFETY: (r0 + y, j) is inside `out`, and only this task writes column j.
        out.write(r0 + y, j, *s);
    }
}

/// The sum of `v`'s sixteen lanes: in each 128-bit block lanes (0 + 2) + (1 + 3), then
/// blocks (0 + 2) + (1 + 3).
#[inline(always)]
unsafe fn sum16(v: __m512) -> f32 {
    let s = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
    let u = _mm512_add_ps(s, _mm512_shuffle_f32x4::<0b01_00_11_10>(s, s));
    _mm512_cvtss_f32(_mm512_add_ps(u, _mm512_shuffle_f32x4::<0b10_11_00_01>(u, u)))
}

/// Lane `y` of the result: [`sum16`] of `m[y]`, the same additions for eight rows at once
/// (24 instructions where eight [`sum16`] take 64).
#[inline(always)]
unsafe fn sum16_rows(m: [__m512; 8]) -> __m256 {
    // Rows in pairs: per block [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
    let p: [__m512; 4] = each(|i| _mm512_add_ps(_mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]), _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1])));
    // Pairs in pairs: per block each of four rows' (0 + 2) + (1 + 3).
    let q: [__m512; 2] = each(|i| {
        let (a, b) = (_mm512_castps_pd(p[2 * i]), _mm512_castps_pd(p[2 * i + 1]));
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)))
    });
    // Blocks 0 + 2 and 1 + 3 of rows 0-3, then of rows 4-7; then those two added.
    let u = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(q[0], q[1]), _mm512_shuffle_f32x4::<0b11_10_11_10>(q[0], q[1]));
    let r = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(u, u), _mm512_shuffle_f32x4::<0b11_01_11_01>(u, u));
    _mm512_castps512_ps256(r)
}
