//! The activations' side of the quantized matmul, prepared once per call for every output
//! column: each row of `x` quantized to int8 in blocks of 32 (one scale per block, as
//! llama.cpp's Q8 activations), the sum of each weight group's quantized values (for the
//! groups' biases), and for 8-bit weights the offset that makes their unsigned values
//! signed.
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
//! vector (four lanes each) to match, so a quad's are one 16-lane vector.

/// Elements per activation block (every supported group size is a multiple).
pub const BLOCK: usize = 32;

/// `x` (`rows × k`, float32) as the kernels read it.
pub struct Activations {
    pub rows: usize,
    pub k: usize,
    /// `rows × k` int8, block by block (4-bit order: evens, then odds).
    pub q: Vec<i8>,
    /// `rows × k/BLOCK`: each block's scale (`x ≈ scale · q`).
    pub scale: Vec<f32>,
    /// `rows × k/group_size`: `Σ scale · q` over each weight group (the rounded `x`'s sum).
    pub group_sum: Vec<f32>,
    /// 8-bit only, `rows × k/group_size`: `Σ_block scale · 128 · Σ q` over each group, what
    /// the weights' `-128` shift takes away.
    pub offset: Vec<f32>,
    /// 4-bit only, `rows × (k/BLOCK)/2 × 8`: per pair of blocks, the first block's scale in
    /// four lanes, the second's in four.
    pub pair_scale: Vec<f32>,
    /// 8-bit only, `rows × k/BLOCK × 8`: each block's scale in eight lanes (a 512-bit
    /// kernel's two blocks are one load).
    pub lane_scale: Vec<f32>,
    /// `group_sum` with the rows in lanes: per block of eight rows, per group, the eight
    /// rows' sums (a tile of rows takes a group's bias terms in one multiply-add), then
    /// eight values of padding (a tile starting mid-block reads past its block).
    pub group_sum_t: Vec<f32>,
    /// `offset` the same way (8-bit only).
    pub offset_t: Vec<f32>,
}

/// `rows × groups` values as blocks of eight rows, groups, then the rows' lanes, padded.
fn rows_in_lanes(v: &[f32], rows: usize, groups: usize) -> Vec<f32> {
    let mut t = vec![0.0; rows.div_ceil(8) * groups * 8 + 8];
    for r in 0..rows {
        for g in 0..groups {
            t[(r / 8 * groups + g) * 8 + r % 8] = v[r * groups + g];
        }
    }
    t
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

impl Activations {
    /// # Panics
    /// If `x.len() != rows * k` or `k` is not a multiple of `group_size`, itself a multiple
    /// of [`BLOCK`] (the caller checks shapes first).
    pub fn new(x: &[f32], rows: usize, k: usize, group_size: usize, bits: u32) -> Activations {
        assert!(x.len() == rows * k && group_size.is_multiple_of(BLOCK) && k.is_multiple_of(group_size));
        let (blocks, groups) = (k / BLOCK, k / group_size);
        let per_group = group_size / BLOCK;
        let mut a = Activations {
            rows,
            k,
            q: vec![0; rows * k],
            scale: vec![0.0; rows * blocks],
            group_sum: vec![0.0; rows * groups],
            offset: if bits == 8 { vec![0.0; rows * groups] } else { Vec::new() },
            pair_scale: if bits == 4 { vec![0.0; rows * (blocks / 2) * 8] } else { Vec::new() },
            lane_scale: if bits == 8 { vec![0.0; rows * blocks * 8] } else { Vec::new() },
            group_sum_t: Vec::new(),
            offset_t: Vec::new(),
        };
        for r in 0..rows {
            for b in 0..blocks {
                let src = &x[r * k + b * BLOCK..][..BLOCK];
                let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = amax / 127.0;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                let mut qsum = 0i32;
                // The block's evens and odds each go to a run of 16 (4-bit), or in order.
                let (even, odd) = (r * k + slot(bits, blocks, b, 0), r * k + slot(bits, blocks, b, 1));
                for (i, v) in src.iter().enumerate() {
                    let q = round(v * inv) as i8;
                    qsum += q as i32;
                    a.q[if bits == 4 { [even, odd][i % 2] + i / 2 } else { even + i }] = q;
                }
                a.scale[r * blocks + b] = scale;
                if bits == 4 && b / 2 < blocks / 2 {
                    let at = (r * (blocks / 2) + b / 2) * 8 + (b % 2) * 4;
                    a.pair_scale[at..at + 4].fill(scale);
                }
                if bits == 8 {
                    a.lane_scale[(r * blocks + b) * 8..][..8].fill(scale);
                }
                let g = r * groups + b / per_group;
                a.group_sum[g] += scale * qsum as f32;
                if bits == 8 {
                    a.offset[g] += scale * 128.0 * qsum as f32;
                }
            }
        }
        a.group_sum_t = rows_in_lanes(&a.group_sum, rows, groups);
        if bits == 8 {
            a.offset_t = rows_in_lanes(&a.offset, rows, groups);
        }
        a
    }

    pub fn row_q(&self, r: usize) -> &[i8] {
        &self.q[r * self.k..][..self.k]
    }
    pub fn row_scale(&self, r: usize) -> &[f32] {
        let blocks = self.k / BLOCK;
        &self.scale[r * blocks..][..blocks]
    }
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

    #[test]
    fn blocks_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..128).map(|i| ((i * 37) % 23) as f32 - 11.0 + 0.25 * (i % 3) as f32).collect();
        for bits in [4, 8] {
            let a = Activations::new(&x, 2, 64, 32, bits);
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
