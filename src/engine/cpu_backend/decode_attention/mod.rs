//! Attention for one decode step of a batch, on the CPU: each row's one query against its
//! own cached keys and values, as one MLX op (primitive.cpp) instead of MLX's composed
//! fallback for `fast::scaled_dot_product_attention` on the CPU (scale, two matmuls, mask,
//! softmax, slices of the cache, transpose and reshape: about ten ops a layer).
//!
//! Float32 throughout, softmax with the running max subtracted, as MLX's own; grouped
//! query heads read their KV head. Rows × heads are split across the cores with rayon.
pub mod op;

use rayon::prelude::*;

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

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays.
///
/// # Safety
/// The pointers are valid, contiguous arrays of the shapes `s` gives; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn mlxbar_decode_attention_run(
    rows: i64,
    heads: i64,
    kv_heads: i64,
    capacity: i64,
    head_dim: i64,
    q: *const f32,
    keys: *const f32,
    values: *const f32,
    positions: *const i32,
    scale: f32,
    out: *mut f32,
) {
    let s = Shape {
        rows: rows as usize,
        heads: heads as usize,
        kv_heads: kv_heads as usize,
        capacity: capacity as usize,
        head_dim: head_dim as usize,
    };
    let run = || {
        let n = s.rows * s.heads * s.head_dim;
        let kv = s.rows * s.kv_heads * s.capacity * s.head_dim;
        attend(
            s,
            std::slice::from_raw_parts(q, n),
            std::slice::from_raw_parts(keys, kv),
            std::slice::from_raw_parts(values, kv),
            std::slice::from_raw_parts(positions, s.rows),
            scale,
            std::slice::from_raw_parts_mut(out, n),
        );
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the decode attention kernel panicked");
        std::process::abort();
    }
}
