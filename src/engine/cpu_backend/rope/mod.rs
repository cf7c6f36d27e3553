//! Rotary position embedding on the CPU as one MLX op (primitive.cpp) instead of MLX's
//! composed fallback for `fast::rope` on the CPU (positions, frequencies, cos, sin, two
//! slices, four multiplies, two adds, a concatenate: about 28 ops per call, two calls a
//! layer). The arithmetic is the fallback's: positions `(t + offset) · scale` and inverse
//! frequencies `exp(-i · ln(base) / half)` (or `1 / periods[i]`) in float32, pairs `(i,
//! i + half)` rotated, or `(2i, 2i + 1)` when traditional; the dimensions past `dims` are
//! copied. LongRoPE's attention factor scales the rotated part in the same pass.
pub mod op;

use super::primitive_call::{self, count, elems};
use super::RopeParams;

/// The input's shape `[batch, heads, len, head_dim]`.
#[derive(Clone, Copy)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub len: usize,
    pub head_dim: usize,
}

/// `out` = `x` rotated: position `t` of batch row `b` sits at `offsets[b] + t` (one offset
/// for every row when `offsets` holds one).
///
/// # Panics
/// On inconsistent shapes (checked first).
pub fn rotate(s: Shape, p: RopeParams, x: &[f32], offsets: &[i32], periods: Option<&[f32]>, out: &mut [f32]) {
    let (hd, dims) = (s.head_dim, usize::try_from(p.dims).unwrap_or(0));
    assert!(dims % 2 == 0 && dims > 0 && dims <= hd, "rope: dims {dims} for head_dim {hd}");
    let half = dims / 2;
    assert!(x.len() == elems(&[s.batch, s.heads, s.len, hd]) && out.len() == x.len());
    assert!(offsets.len() == 1 || offsets.len() == s.batch, "rope: {} offsets for {} rows", offsets.len(), s.batch);
    assert!(periods.is_none_or(|f| f.len() == half), "rope: periods for {half} pairs");
    let inv_freqs = inv_freqs(p, periods);
    // cos and sin per (row, position, pair), shared by every head.
    let mut table = vec![(0f32, 0f32); s.batch * s.len * half];
    for (i, cs) in table.chunks_mut(half.max(1)).enumerate() {
        let (b, t) = (i / s.len.max(1), i % s.len.max(1));
        let offset = offsets[if offsets.len() == 1 { 0 } else { b }];
        angles((t as f32 + offset as f32) * p.position_scale, &inv_freqs, cs);
    }
    let work = s.len * hd;
    super::pool::for_each_chunk_mut(out, work, |bn, o| {
        let (b, x) = (bn / s.heads, &x[bn * work..][..o.len()]);
        for t in 0..s.len {
            let cs = &table[(b * s.len + t) * half..][..half];
            apply(p, cs, &x[t * hd..][..hd], &mut o[t * hd..][..hd]);
        }
    });
}

/// Each pair's inverse frequency: `exp(-i · ln(base) / half)`, or `1 / periods[i]`.
pub fn inv_freqs(p: RopeParams, periods: Option<&[f32]>) -> Vec<f32> {
    let half = usize::try_from(p.dims).unwrap_or(0) / 2;
    match periods {
        Some(f) => f.iter().map(|f| 1.0 / f).collect(),
        None => {
            let ln_base = p.base.ln() / half as f32;
            (0..half).map(|i| (-(i as f32) * ln_base).exp()).collect()
        }
    }
}

/// `(cos, sin)` of each pair's angle at position `pos` (already scaled).
pub fn angles(pos: f32, inv_freqs: &[f32], cs: &mut [(f32, f32)]) {
    for (c, f) in cs.iter_mut().zip(inv_freqs) {
        let (sin, cos) = (pos * f).sin_cos();
        *c = (cos, sin);
    }
}

/// One head vector `x` rotated into `out` by the pairs' `(cos, sin)`, the rotated part
/// times the input scale, the dimensions past `dims` copied.
pub fn apply(p: RopeParams, cs: &[(f32, f32)], x: &[f32], out: &mut [f32]) {
    let (half, k) = (cs.len(), p.input_scale);
    for (i, &(c, sn)) in cs.iter().enumerate() {
        let (a, b) = if p.traditional { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x1, x2) = (x[a] * k, x[b] * k);
        out[a] = x1 * c - x2 * sn;
        out[b] = x1 * sn + x2 * c;
    }
    out[2 * half..].copy_from_slice(&x[2 * half..]);
}

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays, each
/// pointer with the number of elements its buffer holds (`periods` null when absent).
///
/// # Safety
/// Each pointer is valid for reads (`out`: writes) of the stated number of elements, for
/// the call, and nothing else writes them meanwhile. Shapes are not trusted: every slice is
/// checked against its buffer's length first ([`primitive_call::input`]).
#[no_mangle]
pub unsafe extern "C" fn mlxbar_rope_run(
    shape: *const i64,
    dims: i64,
    traditional: bool,
    base: f32,
    position_scale: f32,
    input_scale: f32,
    x: *const f32,
    x_len: i64,
    offsets: *const i32,
    offsets_len: i64,
    periods: *const f32,
    periods_len: i64,
    out: *mut f32,
    out_len: i64,
) {
    let run = || {
        let dims4 = primitive_call::input(shape, 4, 4, "shape");
        let s = Shape { batch: count(dims4[0]), heads: count(dims4[1]), len: count(dims4[2]), head_dim: count(dims4[3]) };
        let p = RopeParams { dims: i32::try_from(dims).unwrap_or(-1), traditional, base, position_scale, input_scale };
        let n = elems(&[s.batch, s.heads, s.len, s.head_dim]);
        let offsets = primitive_call::input(offsets, offsets_len, count(offsets_len), "offsets");
        let periods = (!periods.is_null()).then(|| primitive_call::input(periods, periods_len, count(dims) / 2, "periods"));
        rotate(s, p, primitive_call::input(x, x_len, n, "x"), offsets, periods, primitive_call::output(out, out_len, n, "out"));
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the RoPE kernel panicked");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rotation by hand for one head vector at position 3, base 10000, both layouts.
    #[test]
    fn rotates_pairs_as_the_fallback_does() {
        let x: Vec<f32> = (0..6).map(|i| i as f32 + 1.0).collect();
        for traditional in [false, true] {
            let p = RopeParams { dims: 4, traditional, base: 10000.0, position_scale: 1.0, input_scale: 1.0 };
            let mut out = vec![0.0; 6];
            rotate(Shape { batch: 1, heads: 1, len: 1, head_dim: 6 }, p, &x, &[3], None, &mut out);
            let pairs: [(usize, usize); 2] = if traditional { [(0, 1), (2, 3)] } else { [(0, 2), (1, 3)] };
            for (i, (a, b)) in pairs.into_iter().enumerate() {
                let theta = 3.0 * (-(i as f32) * 10000f32.ln() / 2.0).exp();
                assert!((out[a] - (x[a] * theta.cos() - x[b] * theta.sin())).abs() < 1e-6);
                assert!((out[b] - (x[a] * theta.sin() + x[b] * theta.cos())).abs() < 1e-6);
            }
            assert_eq!(&out[4..], &x[4..], "past dims: copied");
        }
    }
}
