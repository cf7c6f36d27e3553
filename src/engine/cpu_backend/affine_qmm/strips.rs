//! 4- and 8-bit weights repacked at load into strips of sixteen output columns, and the
//! AVX-512 kernel that reads them with the columns in the lanes: one `vpdpbusd` takes four
//! values of `x` (broadcast) against four values of each of sixteen columns, so the int8
//! sums, their conversion and the block and group scales are each one instruction for
//! sixteen columns, and no column ends in a sum across lanes.
//!
//! Why: [`super::vnni`]'s layout puts one column's values in the lanes, and each block's
//! int32 sums must be converted and scaled per column and row: four instructions a row for
//! 128 values of one column, where this layout takes about twelve for 512 (sixteen
//! columns of 32). On Zen 4 (`decode_profile`, a step's projections and head called
//! directly) eight rows took 9.48 ms in MLX's layout against 6.30 ms with the 4-bit
//! projections in strips, and 9.19 against 5.53 ms in a run with the head in strips too;
//! one row about the same (it reads the same bytes; README's performance section). Used
//! where [`applies`] (AVX512-VNNI without AMX, whose tiles read MLX's layout).
//!
//! The layout: strip `s` holds columns `16s..16s+16`; per block of 32 values, one chunk of
//! 64 bytes per packed word of a column's block (4 at 4 bits, 8 at 8), chunk `m`'s lane `c`
//! word `m` of column `16s+c`'s block: at 4 bits values `8m..8m+8` (the low nibbles the
//! even ones, the high the odd ones, as [`super::activations::slot`] stores `x`'s evens and
//! odds), at 8 bits values `4m..4m+4`; scales and biases per strip and group, sixteen
//! columns in a row. Same bytes as MLX's layout, in another order.
use std::ops::Range;

use super::{Scale, Weights};

/// Output columns a strip holds.
pub const STRIP: usize = 16;

/// Whether weights of this format are repacked into strips on this machine.
pub fn applies(bits: i32, group_size: i32, n: i64) -> bool {
    super::kernel() == super::Kernel::Avx512Vnni && super::supports(bits, group_size) && n > 0 && n % STRIP as i64 == 0
}

/// Where word `m` of column `j`'s block `b` sits in strips (`words` a block: its bits).
#[inline]
pub fn word_at(j: usize, b: usize, m: usize, blocks: usize, words: usize) -> usize {
    (((j / STRIP) * blocks + b) * words + m) * STRIP + j % STRIP
}

/// Where column `j`'s group `g` sits among the scales (and biases) in strips.
#[inline]
pub fn group_at(j: usize, g: usize, groups: usize) -> usize {
    ((j / STRIP) * groups + g) * STRIP + j % STRIP
}

/// MLX's `[n, k·bits/32]` packed weights and `[n, k/group_size]` scales and biases in
/// strips (the same lengths).
///
/// # Panics
/// If `n` is not a multiple of [`STRIP`] or the lengths do not match `n` and `k`.
pub fn repack<S: Copy>(
    packed: &[u32],
    scales: &[S],
    biases: &[S],
    (n, k, group_size, bits): (usize, usize, usize, usize),
) -> (Vec<u32>, Vec<S>, Vec<S>) {
    let (blocks, groups, words) = (k / 32, k / group_size, bits);
    assert!(matches!(bits, 4 | 8) && n.is_multiple_of(STRIP) && k.is_multiple_of(group_size) && group_size.is_multiple_of(32));
    assert!(packed.len() == n * k * bits / 32 && scales.len() == n * groups && biases.len() == scales.len());
    // Strips across the pool, 64 a task: a multi-GB model's load would otherwise wait
    // seconds on one core here.
    let (row_words, strip_words) = (blocks * words, STRIP * blocks * words);
    let mut out = vec![0u32; packed.len()];
    super::super::pool::for_each_chunk_mut(&mut out, 64 * strip_words, |t, strips| {
        for (i, strip) in strips.chunks_exact_mut(strip_words).enumerate() {
            let first = (t * 64 + i) * STRIP;
            for (c, row) in packed[first * row_words..][..STRIP * row_words].chunks_exact(row_words).enumerate() {
                for (b, block) in row.chunks_exact(words).enumerate() {
                    for (m, word) in block.iter().enumerate() {
                        // word_at(first + c, b, m, ..) less the strip's start.
                        strip[(b * words + m) * STRIP + c] = *word;
                    }
                }
            }
        }
    });
    let by_strip = |v: &[S]| -> Vec<S> {
        let mut out = v.to_vec();
        for (i, x) in v.iter().enumerate() {
            out[group_at(i / groups, i % groups, groups)] = *x;
        }
        out
    };
    (out, by_strip(scales), by_strip(biases))
}

/// Output columns `columns` (whole strips) of every row.
///
/// # Safety
/// AVX512F, AVX512VL, AVX512BW, AVX512-VNNI, AVX2, FMA and F16C are available; `w` is in
/// strips, `a` describes the same `k` in `Layout::for_bits` (asserted).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn columns<S: Scale>(w: &Weights<S>, a: &super::Activations, out: super::Out, columns: Range<usize>) {
    use super::activations::{slot, Layout};
    assert!(w.strips && a.layout == Layout::for_bits(w.bits) && a.k == w.k, "weights or activations for another kernel");
    assert!(columns.start.is_multiple_of(STRIP) && columns.end.is_multiple_of(STRIP) && columns.end <= w.n);
    let blocks = w.k / 32;
    // Where each block's 16 even and 16 odd values of x sit in a row (8 bits: in order).
    let at: Vec<(usize, usize)> = (0..blocks).map(|b| (slot(w.bits, blocks, b, 0), slot(w.bits, blocks, b, 1))).collect();
    let four = w.bits == 4;
    for s in columns.step_by(STRIP).map(|c| c / STRIP) {
        let mut r = 0;
        while r < a.rows {
            let n = (a.rows - r).min(8);
            macro_rules! tile {
                ($($rows:literal)*) => {
                    match n {
                        $($rows if four => strip::<S, $rows, 4>(w, a, &at, out, s, r),)*
                        $($rows => strip::<S, $rows, 8>(w, a, &at, out, s, r),)*
                        _ => unreachable!("tiles have 1 to 8 rows"),
                    }
                };
            }
            tile!(1 2 3 4 5 6 7 8);
            r += n;
        }
    }
}

/// Strip `s` against rows `r0..r0 + R`: per block, its chunks against each row's broadcast
/// values of `x` in two chains (4 bits: the four chunks' low nibbles against the evens,
/// high against the odds; 8 bits: chunks 0-3 and 4-7 against the values in order), the
/// sums converted and scaled by the columns' group scale and the row's block scale; at
/// each group's end its biases times the row's group sum. A row's order does not depend
/// on `R`, so its bits do not depend on the rows beside it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn strip<S: Scale, const R: usize, const BITS: usize>(
    w: &Weights<S>,
    a: &super::Activations,
    at: &[(usize, usize)],
    out: super::Out,
    s: usize,
    r0: usize,
) {
    use std::arch::x86_64::*;
    let (k, blocks, groups) = (w.k, w.k / 32, w.k / w.group_size);
    let per_group = w.group_size / 32;
    // A block's chunks: one of 64 bytes per word of a column's block.
    let chunk_bytes = BITS * STRIP * 4;
    let base = (w.packed.as_ptr() as *const u8).add(s * blocks * chunk_bytes);
    let scales = w.scales.as_ptr().add(s * groups * STRIP);
    let biases = w.biases.as_ptr().add(s * groups * STRIP);
    let q: [*const i8; R] = std::array::from_fn(|y| a.q_ptr(r0 + y));
    let xs: [*const f32; R] = std::array::from_fn(|y| a.scale_ptr(r0 + y));
    let sums: [*const f32; R] = std::array::from_fn(|y| a.group_sum.as_ptr().add((r0 + y) * groups));
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, &(even, odd)) in at.iter().enumerate() {
        let chunks = base.add(b * chunk_bytes);
        for line in 0..BITS {
            _mm_prefetch::<_MM_HINT_T0>(chunks.wrapping_add(super::avx2::PREFETCH + 64 * line) as *const i8);
        }
        // Eight operand registers either way: the nibbles of four chunks, or eight chunks.
        let v: [__m512i; 8] = std::array::from_fn(|m| {
            let chunk = _mm512_loadu_si512(chunks.add(64 * (m % BITS)) as *const __m512i);
            match (BITS, m < 4) {
                (4, true) => _mm512_and_si512(chunk, low),
                (4, false) => _mm512_and_si512(_mm512_srli_epi16(chunk, 4), low),
                _ => chunk,
            }
        });
        let g = b / per_group;
        let scale = S::load16_masked(scales.add(g * STRIP), u16::MAX);
        for y in 0..R {
            // The two chains' values of x: evens and odds (4 bits), or the block's two halves.
            let (e, o) = if BITS == 4 { (q[y].add(even), q[y].add(odd)) } else { (q[y].add(even), q[y].add(even + 16)) };
            let (e, o) = (e as *const i32, o as *const i32);
            let mut d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], _mm512_set1_epi32(e.read_unaligned()));
            let mut d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[4], _mm512_set1_epi32(o.read_unaligned()));
            for m in 1..4 {
                d0 = _mm512_dpbusd_epi32(d0, v[m], _mm512_set1_epi32(e.add(m).read_unaligned()));
                d1 = _mm512_dpbusd_epi32(d1, v[4 + m], _mm512_set1_epi32(o.add(m).read_unaligned()));
            }
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), scale);
            acc[y] = _mm512_fmadd_ps(t, _mm512_set1_ps(*xs[y].add(b)), acc[y]);
        }
        if (b + 1) % per_group == 0 {
            let bias = S::load16_masked(biases.add(g * STRIP), u16::MAX);
            for y in 0..R {
                acc[y] = _mm512_fmadd_ps(bias, _mm512_set1_ps(*sums[y].add(g)), acc[y]);
            }
        }
    }
    debug_assert_eq!(blocks * 32, k);
    let mut lanes = [0f32; STRIP];
    for (y, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
        for (c, v) in lanes.iter().enumerate() {
            // SAFETY: (r0 + y, 16s + c) is inside `out` (columns checked above), and only
            // this task writes strip s.
            out.write(r0 + y, s * STRIP + c, *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each strip's chunk lanes are the columns' words in order, and the scales follow
    /// their columns: unpacked by hand from the strips (the layout as the module's note
    /// states it, not through `word_at`), every value is where MLX had it.
    #[test]
    fn repacking_moves_every_value_to_its_strip_lane() {
        for bits in [4usize, 8] {
            let (n, k, gs) = (32usize, 128usize, 64usize);
            let per_word = 32 / bits;
            let packed: Vec<u32> = (0..n * k / per_word).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect();
            let scales: Vec<u32> = (0..n * k / gs).map(|i| i as u32).collect();
            let biases: Vec<u32> = scales.iter().map(|v| v + 1000).collect();
            let (p, s, b) = repack(&packed, &scales, &biases, (n, k, gs, bits));
            let mask = (1u32 << bits) - 1;
            let value = |word: u32, i: usize| (word >> (bits * (i % per_word))) & mask;
            for j in 0..n {
                for i in 0..k {
                    let (strip, c, block, m) = (j / STRIP, j % STRIP, i / 32, i % 32 / per_word);
                    // Chunks of 16 words (64 bytes), `bits` of them a block.
                    let word = p[((strip * (k / 32) + block) * bits + m) * STRIP + c];
                    assert_eq!(value(word, i), value(packed[j * k / per_word + i / per_word], i), "{bits} bits: column {j} value {i}");
                }
                for g in 0..k / gs {
                    assert_eq!(s[(j / STRIP * (k / gs) + g) * STRIP + j % STRIP], scales[j * (k / gs) + g]);
                    assert_eq!(b[(j / STRIP * (k / gs) + g) * STRIP + j % STRIP], biases[j * (k / gs) + g]);
                }
            }
        }
    }
}
