//! Attention for one decode step of a batch, on the CPU: each row's one query against its
//! own cached keys and values, as one MLX op (primitive.cpp) instead of MLX's composed
//! fallback for `fast::scaled_dot_product_attention` on the CPU (scale, two matmuls, mask,
//! softmax, slices of the cache, transpose and reshape: about ten ops a layer).
//!
//! Float32 throughout, softmax with the running max subtracted, as MLX's own; grouped
//! query heads read their KV head. Rows × heads are split across the cores with rayon.
pub mod op;

use rayon::prelude::*;

use super::primitive_call::{self, count, elems};

/// The step's shapes.
#[derive(Clone, Copy)]
pub struct Shape {
    pub rows: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Positions each row's cache buffer holds (the buffers are padded to it).
    pub capacity: usize,
    pub head_dim: usize,
}

/// `out[row, head·head_dim + d]` = softmax(q · kᵀ · scale) · v over positions
/// `0..=positions[row]` of the row's cache.
///
/// `q` is `[rows, heads, head_dim]`, `keys`/`values` `[rows, kv_heads, capacity, head_dim]`.
///
/// # Panics
/// On inconsistent shapes or a position outside the cache (checked first).
pub fn attend(s: Shape, q: &[f32], keys: &[f32], values: &[f32], positions: &[i32], scale: f32, out: &mut [f32]) {
    let hd = s.head_dim;
    assert!(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && hd > 0);
    assert!(q.len() == s.rows * s.heads * hd && out.len() == q.len() && positions.len() == s.rows);
    assert!(keys.len() == s.rows * s.kv_heads * s.capacity * hd && values.len() == keys.len());
    assert!(positions.iter().all(|&p| p >= 0 && (p as usize) < s.capacity), "a position outside the cache");
    let group = s.heads / s.kv_heads;
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (row, head) = (i / s.heads, i % s.heads);
        let q = &q[i * hd..][..hd];
        let base = (row * s.kv_heads + head / group) * s.capacity * hd;
        let len = positions[row] as usize + 1;
        let (k, v) = (&keys[base..][..len * hd], &values[base..][..len * hd]);
        let scores: Vec<f32> = k.chunks_exact(hd).map(|kt| kt.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        o.fill(0.0);
        let mut total = 0f32;
        for (p, vt) in scores.iter().zip(v.chunks_exact(hd)) {
            let e = (p - max).exp();
            total += e;
            for (acc, x) in o.iter_mut().zip(vt) {
                *acc += e * x;
            }
        }
        o.iter_mut().for_each(|x| *x /= total);
    });
}

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays, each
/// pointer with the number of elements its buffer holds.
///
/// # Safety
/// Each pointer is valid for reads (`out`: writes) of the stated number of elements, for
/// the call, and nothing else writes them meanwhile. Shapes are not trusted: every slice is
/// checked against its buffer's length first ([`primitive_call::input`]).
#[no_mangle]
pub unsafe extern "C" fn mlxbar_decode_attention_run(
    rows: i64,
    heads: i64,
    kv_heads: i64,
    capacity: i64,
    head_dim: i64,
    q: *const f32,
    q_len: i64,
    keys: *const f32,
    keys_len: i64,
    values: *const f32,
    values_len: i64,
    positions: *const i32,
    positions_len: i64,
    scale: f32,
    out: *mut f32,
    out_len: i64,
) {
    let run = || {
        let s = Shape {
            rows: count(rows),
            heads: count(heads),
            kv_heads: count(kv_heads),
            capacity: count(capacity),
            head_dim: count(head_dim),
        };
        let n = elems(&[s.rows, s.heads, s.head_dim]);
        let kv = elems(&[s.rows, s.kv_heads, s.capacity, s.head_dim]);
        attend(
            s,
            primitive_call::input(q, q_len, n, "q"),
            primitive_call::input(keys, keys_len, kv, "keys"),
            primitive_call::input(values, values_len, kv, "values"),
            primitive_call::input(positions, positions_len, s.rows, "positions"),
            scale,
            primitive_call::output(out, out_len, n, "out"),
        );
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the decode attention kernel panicked");
        std::process::abort();
    }
}
