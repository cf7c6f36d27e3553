//! The 256-bit x86 kernel against the int8 activations of a tile of rows of `x` at once
//! (the weights are unpacked once for all of them), generic over how a vector of bytes
//! meets a vector of int8 activations ([`Dot`]: AVX2's `maddubs` here, VNNI's `vpdpbusd`
//! in [`super::vnni`]):
//! - 4-bit, two blocks (64 values) at a time: one 32-byte load split into low and high
//!   nibbles (the pair's even and odd values, the order [`super::activations`] stores `x`
//!   in), the integer sums scaled per lane by the two blocks' activation scales and
//!   weight-group scales (the AVX512-VNNI kernel runs 4-bit weights four blocks at a time
//!   on a path of its own, [`super::vnni`]);
//! - 8-bit, a block at a time: the integer sums scaled by the block's scale, then the
//!   group's at the group's end ([`Dot::bytes_all`] may take two blocks at a time).
//!
//! The groups' biases meet the sums of the rounded `x` afterwards. Arithmetic as in
//! [`super::scalar`], up to float summation order. Every function here is inlined into a
//! `#[target_feature]` entry point ([`columns_avx2`], and [`super::vnni`]'s), so each
//! instruction set gets its own compiled copy.
use std::arch::x86_64::*;
use std::ops::Range;

use super::super::simd::hsum;
use super::activations::{self, Activations, BLOCK};
use super::{Out, Scale, Weights};

/// Bytes ahead of the weights being read that are asked for early (the rows of the next
/// columns follow in memory: one step streams every matrix once). Past a matrix's end the
/// address is computed with `wrapping_add` (a prefetch reads nothing and cannot fault).
pub(super) const PREFETCH: usize = 4096;

/// The widest tile of rows any [`Dot`] takes.
pub(super) const MAX_TILE: usize = 8;

/// Integer dot products of unsigned weight bytes against int8 activations, per 32-bit lane.
pub(super) trait Dot {
    /// Rows of `x` sharing one unpacking of the weights (accumulators must fit the
    /// registers).
    const TILE: usize;
    /// Whether [`Dot::bytes`] sums `(w - 128) · x` (so the 8-bit offset term is added
    /// afterwards) rather than `w · x`.
    const SHIFTED_BYTES: bool;
    /// Whether 4-bit weights go through [`columns_with`] ([`Dot::nibbles`]); the
    /// AVX512-VNNI kernel runs them on a path of its own.
    const NIBBLES: bool = true;
    /// 8-bit weights as [`Dot::bytes`] takes them, prepared once for every row.
    type Bytes: Copy;
    /// Each lane: `Σ lo·xe + hi·xo` over its four bytes (nibbles of 0..15 against int8).
    unsafe fn nibbles(lo: __m256i, xe: __m256i, hi: __m256i, xo: __m256i) -> __m256i;
    unsafe fn prepare_bytes(w: __m256i) -> Self::Bytes;
    /// Each lane: the sum over its four bytes of the weight (shifted, see
    /// [`Dot::SHIFTED_BYTES`]) times `x`.
    unsafe fn bytes(w: Self::Bytes, x: __m256i) -> __m256i;

    /// 8-bit column `j`'s sums over every block, per row of the tile (eight lanes to add
    /// up), scaled by the blocks' activation scales and the groups' scales: a block at a
    /// time here, two where 512-bit registers hold them ([`super::vnni`]).
    #[inline(always)]
    unsafe fn bytes_all<S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m256; R]
    where
        Self: Sized,
    {
        let (k, gs) = (w.k, w.group_size);
        let groups = k / gs;
        let wrow = (w.packed.as_ptr() as *const u8).add(j * k);
        let scales = &w.scales[j * groups..][..groups];
        let q: [*const i8; R] = each(|y| a.q_ptr(r0 + y));
        let xs: [*const f32; R] = each(|y| a.scale_ptr(r0 + y));
        let mut acc = [_mm256_setzero_ps(); R];
        let per_group = gs / BLOCK;
        for (g, scale) in scales.iter().enumerate() {
            let mut group = [_mm256_setzero_ps(); R];
            for b in g * per_group..(g + 1) * per_group {
                _mm_prefetch::<_MM_HINT_T0>(wrow.wrapping_add(b * 32 + PREFETCH) as *const i8);
                let v = Self::prepare_bytes(_mm256_loadu_si256(wrow.add(b * 32) as *const __m256i));
                for y in 0..R {
                    let p = Self::bytes(v, _mm256_loadu_si256(q[y].add(b * BLOCK) as *const __m256i));
                    group[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&*xs[y].add(b)), group[y]);
                }
            }
            let s = _mm256_set1_ps(scale.to_f32_f16c());
            for y in 0..R {
                acc[y] = _mm256_fmadd_ps(group[y], s, acc[y]);
            }
        }
        acc
    }
}

/// AVX2: `maddubs` to int16 pairs, `madd` against ones to int32.
pub(super) struct Maddubs;

impl Dot for Maddubs {
    const TILE: usize = 4;
    const SHIFTED_BYTES: bool = true;
    /// `(|w - 128|, w - 128)`.
    type Bytes = (__m256i, __m256i);

    #[inline(always)]
    unsafe fn nibbles(lo: __m256i, xe: __m256i, hi: __m256i, xo: __m256i) -> __m256i {
        let d = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
        _mm256_madd_epi16(d, _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn prepare_bytes(w: __m256i) -> Self::Bytes {
        // Unsigned bytes shifted to signed; |w| against sign-moved x keeps maddubs's pair
        // sums within int16 (128·127·2 < 32768).
        let v = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
        (_mm256_abs_epi8(v), v)
    }

    #[inline(always)]
    unsafe fn bytes((abs, signed): Self::Bytes, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(abs, _mm256_sign_epi8(x, signed)), _mm256_set1_epi16(1))
    }
}

/// Output columns `columns` of every row with AVX2 + FMA.
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` and `a` describe the same `k` (the caller's checks),
/// `a` in `Layout::for_bits(w.bits)` (asserted: the arrays this reads by pointer exist only
/// there).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn columns_avx2<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    columns_with::<Maddubs, S>(w, a, out, columns)
}

/// Output columns `columns` of every row, `D::TILE` rows at a time: each tile of rows
/// (a few KB of int8 activations, held in L1) meets every column of the range in turn, so
/// a long prefill streams the task's weights (from L2) once per tile rather than every
/// row's activations once per column.
///
/// # Safety
/// As [`columns_avx2`], with the instructions `D` uses.
#[inline(always)]
pub(super) unsafe fn columns_with<D: Dot, S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    assert_eq!(a.layout, activations::Layout::for_bits(w.bits), "activations for another kernel");
    let mut r = 0;
    while r < a.rows {
        let n = (a.rows - r).min(D::TILE);
        macro_rules! tile {
            ($($rows:literal)*) => {
                match (w.bits, n) {
                    (4, _) if !D::NIBBLES => unreachable!("4-bit weights take this kernel's own path"),
                    $((4, $rows) => tile::<D, S, $rows, true>(w, a, out, columns.clone(), r),)*
                    $((_, $rows) => tile::<D, S, $rows, false>(w, a, out, columns.clone(), r),)*
                    _ => unreachable!("tiles have 1 to {MAX_TILE} rows"),
                }
            };
        }
        tile!(1 2 3 4 5 6 7 8);
        r += n;
    }
}

/// Rows `r0..r0 + R` against columns `columns` (4-bit weights when `FOUR`, else 8-bit),
/// one column's products ahead of the sums: the next column's products are issued before
/// this one's bias terms and horizontal sums, a chain of dependent adds that would
/// otherwise leave the core waiting at every column's end (k = 576 is only 4.5 quads of
/// products a column).
#[inline(always)]
unsafe fn tile<D: Dot, S: Scale, const R: usize, const FOUR: bool>(
    w: &Weights<S>,
    a: &Activations,
    out: Out,
    columns: Range<usize>,
    r0: usize,
) {
    let mut columns = columns;
    let Some(first) = columns.next() else { return };
    let (mut j, mut acc) = (first, products::<D, S, R, FOUR>(w, a, first, r0));
    for next in columns {
        let ahead = products::<D, S, R, FOUR>(w, a, next, r0);
        write::<D, S, R, FOUR>(w, a, out, j, r0, &acc);
        (j, acc) = (next, ahead);
    }
    write::<D, S, R, FOUR>(w, a, out, j, r0, &acc);
}

/// Column `j`'s sums against rows `r0..r0 + R`, before the bias terms. (Functions, not
/// closures: a closure here was left uninlined, without the kernel's target features.)
#[inline(always)]
unsafe fn products<D: Dot, S: Scale, const R: usize, const FOUR: bool>(
    w: &Weights<S>,
    a: &Activations,
    j: usize,
    r0: usize,
) -> [__m256; R] {
    if FOUR {
        products4::<D, S, R>(w, a, j, r0)
    } else {
        D::bytes_all::<S, R>(w, a, j, r0)
    }
}

/// Column `j`'s results from its sums: the bias terms, the rows' horizontal sums, into `out`.
#[inline(always)]
unsafe fn write<D: Dot, S: Scale, const R: usize, const FOUR: bool>(
    w: &Weights<S>,
    a: &Activations,
    out: Out,
    j: usize,
    r0: usize,
    acc: &[__m256; R],
) {
    let mut sums = [0f32; MAX_TILE];
    finish::<S, R>(w, a, j, r0, acc, !FOUR && D::SHIFTED_BYTES, &mut sums);
    for (y, s) in sums[..R].iter().enumerate() {
        // SAFETY: (r0 + y, j) is inside `out`, and only this task writes column j.
        out.write(r0 + y, j, *s);
    }
}

/// `[f(0), f(1), …]`, inlined into the kernels: `std::array::from_fn`'s machinery was left
/// as calls inside them (a tenth of an 8-row decode step's kernel time went to building
/// each column's sixteen row pointers).
#[inline(always)]
pub(super) fn each<T: Copy, const R: usize>(mut f: impl FnMut(usize) -> T) -> [T; R] {
    let mut out = [f(0); R];
    for (i, v) in out.iter_mut().enumerate().skip(1) {
        *v = f(i);
    }
    out
}

/// Where a pair of blocks' int8 activations sit ([`super::activations::slot`]).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Layout {
    /// Inside a quad: this pair's evens, 64 bytes on its odds.
    Quads,
    /// A last pair after the quads: its evens, then its odds.
    Pair,
}

/// 4-bit column `j`'s sums over the row's whole pairs of blocks (its quads, then a last
/// pair if any), per row of the tile (eight lanes to add up, scaled), a pair of blocks at
/// a time.
#[inline(always)]
unsafe fn quads<D: Dot, S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m256; R] {
    let blocks = w.k / BLOCK;
    let mut acc = [_mm256_setzero_ps(); R];
    pairs::<D, S, R>(w, a, j, r0, 0..blocks / 4 * 2, Layout::Quads, &mut acc);
    if blocks % 4 >= 2 {
        let p = blocks / 4 * 2;
        pairs::<D, S, R>(w, a, j, r0, p..p + 1, Layout::Pair, &mut acc);
    }
    acc
}

/// Pairs `pairs` of 4-bit column `j` against rows `r0..r0 + R`, added to `acc`.
#[inline(always)]
pub(super) unsafe fn pairs<D: Dot, S: Scale, const R: usize>(
    w: &Weights<S>,
    a: &Activations,
    j: usize,
    r0: usize,
    pairs: Range<usize>,
    layout: Layout,
    acc: &mut [__m256; R],
) {
    let (k, gs) = (w.k, w.group_size);
    let (groups, blocks) = (k / gs, k / BLOCK);
    // Blocks per group: 1, 2 or 4, so a shift (a division per pair costs more than the pair).
    let group_shift = (gs / BLOCK).trailing_zeros();
    let wrow = (w.packed.as_ptr() as *const u8).add(j * k / 2);
    let scales = &w.scales[j * groups..][..groups];
    let q: [*const i8; R] = each(|y| a.q_ptr(r0 + y));
    let ps: [*const f32; R] = each(|y| a.pair_scale.as_ptr().add((r0 + y) * (blocks / 2) * 8));
    let low = _mm256_set1_epi8(0x0F);
    for p in pairs {
        let (xe, xo) = match layout {
            Layout::Quads => ((p >> 1) * 128 + (p & 1) * 32, (p >> 1) * 128 + (p & 1) * 32 + 64),
            Layout::Pair => (p * 64, p * 64 + 32),
        };
        // 32 bytes = blocks 2p and 2p+1; low nibbles are their even values, high the odd.
        _mm_prefetch::<_MM_HINT_T0>(wrow.wrapping_add(p * 32 + PREFETCH) as *const i8);
        let v = _mm256_loadu_si256(wrow.add(p * 32) as *const __m256i);
        let lo = _mm256_and_si256(v, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        // SAFETY: both blocks of a pair lie in the row, so their groups index `scales`.
        let s = _mm256_set_m128(
            _mm_set1_ps(scales.get_unchecked((2 * p + 1) >> group_shift).to_f32_f16c()),
            _mm_set1_ps(scales.get_unchecked((2 * p) >> group_shift).to_f32_f16c()),
        );
        for y in 0..R {
            let xe = _mm256_loadu_si256(q[y].add(xe) as *const __m256i);
            let xo = _mm256_loadu_si256(q[y].add(xo) as *const __m256i);
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(D::nibbles(lo, xe, hi, xo)), _mm256_loadu_ps(ps[y].add(p * 8)));
            acc[y] = _mm256_fmadd_ps(t, s, acc[y]);
        }
    }
}

/// 4-bit column `j`'s sums against rows `r0..r0 + R`, before the bias terms.
#[inline(always)]
unsafe fn products4<D: Dot, S: Scale, const R: usize>(w: &Weights<S>, a: &Activations, j: usize, r0: usize) -> [__m256; R] {
    let (k, gs) = (w.k, w.group_size);
    let blocks = k / BLOCK;
    let mut acc = quads::<D, S, R>(w, a, j, r0);
    if blocks % 2 == 1 {
        // An odd last block: 16 bytes, its x stored [evens | odds]; the two halves of one
        // register hold the evens' and the odds' products.
        let b = blocks - 1;
        let group_shift = (gs / BLOCK).trailing_zeros();
        let scales = &w.scales[j * (k / gs)..][..k / gs];
        let wrow = (w.packed.as_ptr() as *const u8).add(j * k / 2);
        let v = _mm_loadu_si128(wrow.add(b * 16) as *const __m128i);
        let l = _mm_set1_epi8(0x0F);
        let wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), l), _mm_and_si128(v, l));
        let zero = _mm256_setzero_si256();
        for (y, acc) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(a.row_q(r0 + y).as_ptr().add(b * BLOCK) as *const __m256i);
            let p = D::nibbles(wv, x, zero, zero);
            let m = _mm256_set1_ps(a.row_scale(r0 + y)[b] * scales[b >> group_shift].to_f32_f16c());
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), m, *acc);
        }
    }
    acc
}

/// The row sums plus the groups' bias terms, and the 8-bit offset when the sums were of
/// shifted weights: dot products over the groups, eight at a time (with k in the hundreds,
/// a column's few pairs of blocks make this a third of its work).
///
/// A row's result is the same bit for bit whatever tile it was in (a batched decode step
/// must give each sequence what it would get alone): lane `i` of the row's accumulator
/// takes groups `i`, `i + 8`, … in order, bias then offset, each with one rounding, and the
/// eight lanes are added as [`hsum`] adds them, for 4 rows or more all at once
/// ([`hsum_rows`]).
#[inline(always)]
unsafe fn finish<S: Scale, const R: usize>(
    w: &Weights<S>,
    a: &Activations,
    j: usize,
    r0: usize,
    acc: &[__m256; R],
    shifted: bool,
    sums: &mut [f32; MAX_TILE],
) {
    let groups = w.k / w.group_size;
    let at = j * groups;
    // Eight groups' sums a load: the arrays end in eight padding values.
    let sums_g: [*const f32; R] = each(|y| a.group_sum.as_ptr().add((r0 + y) * groups));
    let off: [*const f32; R] = each(|y| a.offset.as_ptr().add(if shifted { (r0 + y) * groups } else { 0 }));
    let mut v = *acc;
    let mut g = 0;
    while g < groups {
        let n = (groups - g).min(8);
        let b8 = eight(w.biases, at + g, n);
        let s8 = if shifted { eight(w.scales, at + g, n) } else { b8 };
        for y in 0..R {
            let mut t = _mm256_fmadd_ps(b8, _mm256_loadu_ps(sums_g[y].add(g)), v[y]);
            if shifted {
                t = _mm256_fmadd_ps(s8, _mm256_loadu_ps(off[y].add(g)), t);
            }
            // A last few groups go into the first lanes.
            v[y] = if n == 8 { t } else { _mm256_blendv_ps(v[y], t, first_lanes(n)) };
        }
        g += 8;
    }
    if R >= 4 {
        let total = hsum_rows(each(|y| if y < R { v[y] } else { _mm256_setzero_ps() }));
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), total);
        sums[..R].copy_from_slice(&out[..R]);
    } else {
        for y in 0..R {
            sums[y] = hsum(v[y]);
        }
    }
}

/// Lanes `0..n` of a scale or bias row's eight values from `at` as float32; the others
/// are any value. Read as one load except where eight would run past the matrix's end
/// (its last column's last groups), one value at a time there.
#[inline(always)]
unsafe fn eight<S: Scale>(all: &[S], at: usize, n: usize) -> __m256 {
    if at + 8 <= all.len() {
        return S::load8(all.as_ptr().add(at));
    }
    let mut v = [0f32; 8];
    for (i, v) in v.iter_mut().enumerate().take(n) {
        *v = all[at + i].to_f32_f16c();
    }
    _mm256_loadu_ps(v.as_ptr())
}

/// A blend mask of lanes `0..n`.
#[inline(always)]
unsafe fn first_lanes(n: usize) -> __m256 {
    let i = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), i))
}

/// Lane `y` of the result: the sum of `m[y]`'s eight lanes, added in [`hsum`]'s order
/// (lanes i and i + 4, then (0, 2) and (1, 3), then the two), for eight rows at once: a
/// transpose (24 shuffles), then seven adds, where each row alone takes three shuffles
/// and three adds.
#[inline(always)]
unsafe fn hsum_rows(m: [__m256; 8]) -> __m256 {
    let lanes = transpose8(m);
    let u: [__m256; 4] = each(|i| _mm256_add_ps(lanes[i], lanes[i + 4]));
    _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3]))
}

/// An 8×8 transpose: lane `y` of result `i` is lane `i` of `m[y]`.
#[inline(always)]
unsafe fn transpose8(m: [__m256; 8]) -> [__m256; 8] {
    let t: [__m256; 8] = each(|i| {
        let (a, b) = (m[i / 2 * 2], m[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[0..4] from rows 0-3: lanes 0|4, 1|5, 2|6, 3|7 of each half; u[4..8] from rows 4-7.
    let u: [__m256; 8] = each(|i| {
        let base = i / 4 * 4;
        let (a, b) = (t[base + (i % 4) / 2], t[base + 2 + (i % 4) / 2]);
        if i % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    each(|i| {
        let (a, b) = (u[i % 4], u[4 + i % 4]);
        if i < 4 {
            _mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            _mm256_permute2f128_ps::<0x31>(a, b)
        }
    })
}
