//! The portable kernel: the same arithmetic as [`super::avx2`] (int8 activations, integer
//! block sums, float scales) one element at a time, for CPUs without AVX2 and as the
//! reference the SIMD kernel is tested against.
use std::ops::Range;

use super::activations::{slot, Activations, Layout, BLOCK};
use super::{Out, Scale, Weights};

/// Value `i` of a packed weight row.
pub(super) fn value(row: &[u32], i: usize, bits: u32) -> i32 {
    let per_word = (32 / bits) as usize;
    ((row[i / per_word] >> ((i % per_word) as u32 * bits)) & ((1 << bits) - 1)) as i32
}

/// Output columns `columns` of every row.
pub fn columns<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    assert_eq!(a.layout, Layout::for_bits(w.bits), "activations for another kernel");
    let (k, gs) = (w.k, w.group_size);
    let groups = k / gs;
    let words = k * w.bits as usize / 32;
    let blocks = k / BLOCK;
    for j in columns {
        let row = &w.packed[j * words..][..words];
        let (scales, biases) = (&w.scales[j * groups..][..groups], &w.biases[j * groups..][..groups]);
        for r in 0..a.rows {
            let (q, xs) = (a.row_q(r), a.row_scale(r));
            let mut total = 0f32;
            for g in 0..groups {
                let mut acc = 0f32;
                for b in g * gs / BLOCK..(g + 1) * gs / BLOCK {
                    let mut isum = 0i32;
                    for i in 0..BLOCK {
                        let wv = value(row, b * BLOCK + i, w.bits) - if w.bits == 8 { 128 } else { 0 };
                        isum += wv * q[slot(w.bits, blocks, b, i)] as i32;
                    }
                    acc += isum as f32 * xs[b];
                }
                total += scales[g].to_f32() * acc + biases[g].to_f32() * a.group_sum[r * groups + g];
                if w.bits == 8 {
                    total += scales[g].to_f32() * a.offset[r * groups + g];
                }
            }
            // SAFETY: (r, j) is inside `out`, and only this task writes column j.
            unsafe { out.write(r, j, total) };
        }
    }
}
