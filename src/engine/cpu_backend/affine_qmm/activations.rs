//! The activations' side of the quantized matmul, prepared once per call for every output
//! column (rows split across the pool, each row transformed by the call's prologue first):
//! each row of `x` quantized to int8 in blocks of 32 (one scale per block, as
//! llama.cpp's Q8 activations), the sum of each weight group's quantized values (for the
//! groups' biases), and what the kernel that reads them needs besides ([`Layout`]: for
//! 8-bit weights the offset that makes their unsigned values signed, the scales spread
//! over lanes).
//!
//! The biases meet the same rounded `x` as the scaled values (as llama.cpp's Q8_1 sums
//! do): then each output is exactly `Σ w_i x̂_i` over the dequantized weights, off by at
//! most `Σ |w_i| · step / 2`. With the exact sum of `x` instead, the error would scale with
//! `|w_i - bias|`, which for affine groups is often several times `|w_i|`.
//!
//! For 4-bit weights the int8 values are stored by quads of blocks, evens first, odds
//! second ([`slot`]): a weight byte holds elements 2i (low nibble) and 2i+1 (high nibble),
//! so one 64-byte load of weights (four blocks) split into its low and high nibbles lines
//! up with the quad's evens and odds without shuffles, and so does a 32-byte load (two
//! blocks) with each half of them. Each pair of blocks' two scales are stored as one 8-lane
//! vector (four lanes each) to match, so a quad's are one 16-lane vector. AMX's tiles
//! read the values in order ([`Layout`]).

use super::Prologue;

/// Zeros after `group_sum` and `offset`: the 256-bit kernels read a row's group sums
/// eight at a time, its last few with the next row's (or these) beside them.
pub const PAD: usize = 8;

/// Elements per activation block (every supported group size is a multiple).
pub const BLOCK: usize = 32;

/// How the kernel that will read them wants a row's int8 values and scales.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    /// Against 4-bit weights: quads of blocks, evens then odds ([`slot`]), and `pair_scale`.
    Nibbles,
    /// Against 8-bit weights: in order, and `offset` and `lane_scale`.
    Bytes,
    /// In order and nothing more, the rows padded with zeros to a whole number of AMX's
    /// tiles ([`super::AMX_TILE`] rows): AMX's kernel, whatever the weights' bits.
    Tiles,
}

impl Layout {
    /// The layout the VNNI, AVX2 and scalar kernels read for `bits`-bit weights.
    pub fn for_bits(bits: u32) -> Layout {
        if bits == 4 {
            Layout::Nibbles
        } else {
            Layout::Bytes
        }
    }

    /// The [`slot`] order: 4-bit's, or in order.
    fn slot_bits(self) -> u32 {
        if self == Layout::Nibbles {
            4
        } else {
            8
        }
    }
}

/// `x` (`rows × k`, float32, after the call's prologue) as the kernels read it.
pub struct Activations {
    pub rows: usize,
    pub k: usize,
    /// Which kernel's order and arrays these are (each kernel asserts its own).
    pub layout: Layout,
    /// `rows × k` int8, block by block ([`Layout::Nibbles`]: evens, then odds; with
    /// [`Layout::Tiles`] `q`, `scale` and `group_sum` hold zero rows past `rows` up to a
    /// whole tile).
    pub q: Vec<i8>,
    /// `rows × k/BLOCK`: each block's scale (`x ≈ scale · q`).
    pub scale: Vec<f32>,
    /// `rows × k/group_size`: `Σ scale · q` over each weight group (the rounded `x`'s sum),
    /// then [`PAD`] zeros (a kernel reads a row's last groups eight at a time).
    pub group_sum: Vec<f32>,
    /// [`Layout::Bytes`] only, `rows × k/group_size`: `Σ_block scale · 128 · Σ q` over each
    /// group, what the weights' `-128` shift takes away, then [`PAD`] zeros.
    pub offset: Vec<f32>,
    /// [`Layout::Nibbles`] only, `rows × (k/BLOCK)/2 × 8`: per pair of blocks, the first
    /// block's scale in four lanes, the second's in four.
    pub pair_scale: Vec<f32>,
    /// [`Layout::Bytes`] only, `rows × k/BLOCK × 8`: each block's scale in eight lanes (a
    /// 512-bit kernel's two blocks are one load).
    pub lane_scale: Vec<f32>,
}

/// Round to nearest (ties to even) for |x| <= 127.5: adding and taking away 1.5·2²³ leaves
/// no fraction bits. `f32::round` is a libm call per value, a third of a small product's time.
#[inline]
fn round(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// Where value `i` of block `b` (of `blocks` in a row) sits in the row's int8 values.
/// 4-bit: quads of blocks as `[evens b..b+3 | odds b..b+3]` (16 values each), then a last
/// pair as `[evens b | evens b+1 | odds b | odds b+1]` and an odd last block as
/// `[evens | odds]`; 8-bit: in order.
#[inline]
pub fn slot(bits: u32, blocks: usize, b: usize, i: usize) -> usize {
    if bits != 4 {
        return b * BLOCK + i;
    }
    let (odd, half) = (i % 2, i / 2);
    let half_block = BLOCK / 2;
    if b / 4 < blocks / 4 {
        b / 4 * 4 * BLOCK + odd * 2 * BLOCK + (b % 4) * half_block + half
    } else if b / 2 * 2 + 1 < blocks {
        b / 2 * 2 * BLOCK + odd * BLOCK + (b % 2) * half_block + half
    } else {
        b * BLOCK + odd * half_block + half
    }
}

/// Values per row in each of [`Activations`]' per-row arrays (0 where a format has none).
#[derive(Clone, Copy)]
struct Widths {
    q: usize,
    scale: usize,
    group_sum: usize,
    offset: usize,
    pair_scale: usize,
    lane_scale: usize,
}

/// Some consecutive rows of each per-row array, which one task fills.
struct Rows<'a> {
    q: &'a mut [i8],
    scale: &'a mut [f32],
    group_sum: &'a mut [f32],
    offset: &'a mut [f32],
    pair_scale: &'a mut [f32],
    lane_scale: &'a mut [f32],
}

impl<'a> Rows<'a> {
    /// The first `n` rows, and the rest.
    fn split(self, w: Widths, n: usize) -> (Rows<'a>, Rows<'a>) {
        let (q, q2) = self.q.split_at_mut(n * w.q);
        let (scale, scale2) = self.scale.split_at_mut(n * w.scale);
        let (group_sum, group_sum2) = self.group_sum.split_at_mut(n * w.group_sum);
        let (offset, offset2) = self.offset.split_at_mut(n * w.offset);
        let (pair_scale, pair_scale2) = self.pair_scale.split_at_mut(n * w.pair_scale);
        let (lane_scale, lane_scale2) = self.lane_scale.split_at_mut(n * w.lane_scale);
        (
            Rows { q, scale, group_sum, offset, pair_scale, lane_scale },
            Rows { q: q2, scale: scale2, group_sum: group_sum2, offset: offset2, pair_scale: pair_scale2, lane_scale: lane_scale2 },
        )
    }
}

/// Rows per task at least: a decode step's few rows are not worth the pool's wake-up.
const MIN_ROWS_PER_TASK: usize = 4;

impl Activations {
    /// `x` (`rows × prologue.input_columns(k)`) transformed by `prologue` and quantized,
    /// rows split across the pool's threads (with the prologue, a long prefill's fifth on
    /// one thread otherwise). Each row's values depend on that row alone.
    ///
    /// # Panics
    /// If `x` does not hold `rows` rows or `k` is not a multiple of `group_size`, itself a
    /// multiple of [`BLOCK`] (the caller checks shapes first).
    pub fn new(x: &[f32], rows: usize, k: usize, group_size: usize, layout: Layout, prologue: Prologue) -> Activations {
        let columns = prologue.input_columns(k);
        assert!(x.len() == rows * columns && group_size.is_multiple_of(BLOCK) && k.is_multiple_of(group_size));
        let (blocks, groups) = (k / BLOCK, k / group_size);
        let (four, eight) = (layout == Layout::Nibbles, layout == Layout::Bytes);
        let w = Widths {
            q: k,
            scale: blocks,
            group_sum: groups,
            offset: if eight { groups } else { 0 },
            pair_scale: if four { blocks / 2 * 8 } else { 0 },
            lane_scale: if eight { blocks * 8 } else { 0 },
        };
        // AMX's kernel loads 16 rows at a time; the padding rows stay zero (the split below
        // hands tasks only the first `rows`).
        let padded = if layout == Layout::Tiles { rows.next_multiple_of(super::AMX_TILE) } else { rows };
        let mut a = Activations {
            rows,
            k,
            layout,
            q: vec![0; padded * w.q],
            scale: vec![0.0; padded * w.scale],
            group_sum: vec![0.0; padded * w.group_sum + PAD],
            offset: vec![0.0; rows * w.offset + PAD],
            pair_scale: vec![0.0; rows * w.pair_scale],
            lane_scale: vec![0.0; rows * w.lane_scale],
        };
        let per_task = rows.div_ceil(super::super::pool::threads()).max(MIN_ROWS_PER_TASK);
        let mut tasks = Vec::with_capacity(rows.div_ceil(per_task));
        let mut rest = Rows {
            q: &mut a.q,
            scale: &mut a.scale,
            group_sum: &mut a.group_sum,
            offset: &mut a.offset,
            pair_scale: &mut a.pair_scale,
            lane_scale: &mut a.lane_scale,
        };
        for r0 in (0..rows).step_by(per_task) {
            let n = per_task.min(rows - r0);
            let (these, more) = rest.split(w, n);
            tasks.push(std::sync::Mutex::new((r0, n, these)));
            rest = more;
        }
        super::super::pool::for_each(tasks.len(), |t| {
            let mut task = tasks[t].lock().unwrap_or_else(|e| e.into_inner());
            let (r0, n, ref mut out) = *task;
            let mut transformed = vec![0f32; if matches!(prologue, Prologue::None) { 0 } else { k }];
            for i in 0..n {
                let src = prologue.row(&x[(r0 + i) * columns..][..columns], &mut transformed);
                quantize_row(src, layout, group_size, w, i, out);
            }
        });
        a
    }

    /// Row `r`'s int8 values, for the kernels' loops.
    ///
    /// # Safety
    /// `r < rows` (the pointer is then valid for `k` reads).
    #[inline(always)]
    pub unsafe fn q_ptr(&self, r: usize) -> *const i8 {
        self.q.as_ptr().add(r * self.k)
    }
    /// Row `r`'s block scales, for the kernels' loops.
    ///
    /// # Safety
    /// As [`Activations::q_ptr`] (valid for `k / BLOCK` reads).
    #[inline(always)]
    pub unsafe fn scale_ptr(&self, r: usize) -> *const f32 {
        self.scale.as_ptr().add(r * (self.k / BLOCK))
    }
    #[inline(always)]
    pub fn row_q(&self, r: usize) -> &[i8] {
        &self.q[r * self.k..][..self.k]
    }
    #[inline(always)]
    pub fn row_scale(&self, r: usize) -> &[f32] {
        let blocks = self.k / BLOCK;
        &self.scale[r * blocks..][..blocks]
    }
}

/// Row `i` of `out` from `src` (`k` values): each block's scale and int8 values (in
/// [`slot`] order), the group sums, and whichever of the per-layout arrays `w` gives room.
fn quantize_row(src: &[f32], layout: Layout, group_size: usize, w: Widths, i: usize, out: &mut Rows) {
    let bits = layout.slot_bits();
    let blocks = src.len() / BLOCK;
    let per_group = group_size / BLOCK;
    let q = &mut out.q[i * w.q..][..w.q];
    let group_sum = &mut out.group_sum[i * w.group_sum..][..w.group_sum];
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    for b in 0..blocks {
        let block: &[f32; BLOCK] = src[b * BLOCK..][..BLOCK].try_into().unwrap();
        // The block's evens and odds each go to a run of 16 (4-bit), or in order.
        let (even, odd) = (slot(bits, blocks, b, 0), slot(bits, blocks, b, 1));
        #[cfg(target_arch = "x86_64")]
        let (scale, qsum) = if avx2 {
            // SAFETY: AVX2 was detected.
            unsafe { quantize_block_avx2(block, bits == 4, q, even, odd) }
        } else {
            quantize_block(block, bits == 4, q, even, odd)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (scale, qsum) = quantize_block(block, bits == 4, q, even, odd);
        out.scale[i * w.scale + b] = scale;
        if w.pair_scale > 0 && b / 2 < blocks / 2 {
            let at = i * w.pair_scale + (b / 2) * 8 + (b % 2) * 4;
            out.pair_scale[at..at + 4].fill(scale);
        }
        if w.lane_scale > 0 {
            out.lane_scale[i * w.lane_scale + b * 8..][..8].fill(scale);
        }
        group_sum[b / per_group] += scale * qsum as f32;
        if w.offset > 0 {
            out.offset[i * w.offset + b / per_group] += scale * 128.0 * qsum as f32;
        }
    }
}

/// One block to int8 at `q[even..]` (and `q[odd..]`: `split`, evens and odds apart, as
/// 4-bit weights meet them): its scale and the sum of its int8 values.
fn quantize_block(block: &[f32; BLOCK], split: bool, q: &mut [i8], even: usize, odd: usize) -> (f32, i32) {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut qsum = 0i32;
    for (j, v) in block.iter().enumerate() {
        let v = round(v * inv) as i8;
        qsum += v as i32;
        q[if split { [even, odd][j % 2] + j / 2 } else { even + j }] = v;
    }
    (scale, qsum)
}

/// [`quantize_block`] on 256-bit registers, the same values bit for bit (the maximum, the
/// product and the rounding are each exact or singly rounded, as there): one value at a
/// time, a decode step's 8 rows spent a tenth of their kernel time here.
///
/// # Safety
/// AVX2 is available.
///
/// # Panics
/// If `q[even..even + 32]` (`q[even..even + 16]` and `q[odd..odd + 16]` when `split`) is
/// not inside `q`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_avx2(block: &[f32; BLOCK], split: bool, q: &mut [i8], even: usize, odd: usize) -> (f32, i32) {
    use std::arch::x86_64::*;
    assert!(if split { even.max(odd) + BLOCK / 2 <= q.len() } else { even + BLOCK <= q.len() });
    let v: [__m256; 4] = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(block.as_ptr().add(i)));
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    // A NaN is passed over, as f32::max does: max_ps returns its second operand then.
    let mut m = _mm256_setzero_ps();
    for v in v {
        m = _mm256_max_ps(_mm256_and_ps(v, abs), m);
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let scale = amax / 127.0;
    let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
    let magic = _mm256_set1_ps(12_582_912.0);
    let (low, high) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    // As `round`: the product, then 1.5·2²³ added and taken away; then as `as i8`: NaN
    // (an infinite value times a zero inverse) to 0, beyond the range to its ends (a
    // subnormal scale's infinite inverse).
    let i = v.map(|v| {
        let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, inv), magic), magic);
        let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
        _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, low), high))
    });
    let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    let sum = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
    let qsum = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum)));
    // Packed within each 128-bit lane: [0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31].
    let bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let dst = q.as_mut_ptr();
    // SAFETY (the stores): inside `q`, asserted above.
    if split {
        // Each lane's evens, then its odds; then the two lanes' evens together.
        let pick =
            _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        let parted = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(bytes, pick));
        _mm_storeu_si128(dst.add(even) as *mut __m128i, _mm256_castsi256_si128(parted));
        _mm_storeu_si128(dst.add(odd) as *mut __m128i, _mm256_extracti128_si256::<1>(parted));
    } else {
        _mm256_storeu_si256(dst.add(even) as *mut __m256i, bytes);
    }
    (scale, qsum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout places a row's values on distinct slots inside the row, and a quad's
    /// (or pair's) evens of one block next to the same block's odds' offset.
    #[test]
    fn slots_are_a_permutation() {
        for bits in [4, 8] {
            for blocks in 1..=11 {
                let mut seen = vec![false; blocks * BLOCK];
                for b in 0..blocks {
                    for i in 0..BLOCK {
                        let at = slot(bits, blocks, b, i);
                        assert!(!std::mem::replace(&mut seen[at], true), "bits {bits} blocks {blocks}: ({b}, {i}) reuses {at}");
                    }
                }
            }
        }
        // Block 1's element 3 (odd, the second of its odds) in a quad: odds start 64 in.
        assert_eq!(slot(4, 4, 1, 3), 2 * BLOCK + BLOCK / 2 + 1);
        // The same in a last pair (blocks 4 and 5 of 6): odds start 32 into the pair.
        assert_eq!(slot(4, 6, 5, 3), 4 * BLOCK + BLOCK + BLOCK / 2 + 1);
    }

    /// The vector block quantizer gives the scalar one's values, scale and sum bit for bit,
    /// in both layouts, on blocks with ties, zeros, negative zeros, subnormal, huge, infinite
    /// and NaN values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_block_quantizer_equals_the_scalar() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut seed = 5u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for case in 0..2000 {
            let block: [f32; BLOCK] = std::array::from_fn(|i| match (case % 8, i) {
                (0, _) => 0.0,
                // Negative zeros beside halves.
                (1, i) if i % 2 == 0 => -0.0,
                (1, i) => (i as f32 - 16.0) * 0.5,
                // Ties: 127 steps over 254, x.5 values.
                (2, 0) => 254.0,
                (2, i) => (next() % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32,
                // Subnormal values: a subnormal scale with an infinite inverse.
                (3, _) => f32::from_bits(next() & 0x807f_ffff),
                // The smallest normal values.
                (4, _) => f32::from_bits(next() & 0x807f_ffff | 0x0080_0000),
                // A subnormal scale with a finite inverse (amax / 127 above 2⁻¹²⁸).
                (5, i) => (i as f32 - 16.0) * 5e-38,
                (6, i) => [f32::INFINITY, f32::NAN, -1.0, f32::NEG_INFINITY][i % 4],
                _ => (next() as f32 / u32::MAX as f32 - 0.5) * 1e4,
            });
            for split in [false, true] {
                let (mut a, mut b) = ([0i8; 64], [0i8; 64]);
                let plain = quantize_block(&block, split, &mut a, 0, 32);
                // SAFETY: AVX2 detected above; 0..32 and 32..48 lie inside the 64 values.
                let vector = unsafe { quantize_block_avx2(&block, split, &mut b, 0, 32) };
                assert_eq!((plain.0.to_bits(), plain.1), (vector.0.to_bits(), vector.1), "case {case}");
                assert_eq!(a, b, "case {case} split {split}");
            }
        }
    }

    #[test]
    fn blocks_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..128).map(|i| ((i * 37) % 23) as f32 - 11.0 + 0.25 * (i % 3) as f32).collect();
        for bits in [4, 8] {
            let a = Activations::new(&x, 2, 64, 32, Layout::for_bits(bits), Prologue::None);
            for r in 0..2 {
                for i in 0..64 {
                    let (b, j) = (i / BLOCK, i % BLOCK);
                    let back = a.row_scale(r)[b] * a.row_q(r)[slot(bits, 2, b, j)] as f32;
                    assert!((back - x[r * 64 + i]).abs() <= a.row_scale(r)[b] / 2.0 + 1e-6, "bits {bits} r {r} i {i}");
                }
            }
            let sum: f32 = x[..32].iter().sum();
            assert!((a.group_sum[0] - sum).abs() <= 16.0 * a.row_scale(0)[0], "bits {bits}: {} vs {sum}", a.group_sum[0]);
        }
    }
}
