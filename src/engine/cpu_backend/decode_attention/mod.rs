//! One decode step's attention on the CPU, as one MLX op (primitive.cpp): for each row of
//! the batch its new token's q, k and v (the q|k|v projection's output as it is), the per-head
//! norms when the family has them, RoPE at the row's position, k and v written into the
//! row's slot of the layer's cache buffers, and the one query attending over the row's
//! cached keys and values. MLX's composed ops for the same (three slices, three reshapes,
//! three transposes, two RoPEs, two scatters, then scale, two matmuls, mask, softmax: about
//! twenty ops a layer) each cost a dispatch that at one row outweighs the arithmetic.
//!
//! The cache is written in place: the op's inputs are the buffers the batch holds (dense
//! and evaluated, `BatchKv` keeps them so), and each row's write goes to the slot at its
//! position, which every reader of those buffers treats as padding until the step is done.
//! Float32 throughout; the norm, RoPE and softmax are MLX's arithmetic (see `rope`,
//! `affine_qmm::rms_norm`); grouped query heads read their KV head. The attention itself is
//! [`prefill_attention::queries`]'s (a vectorized `exp`, each key loaded once for up to
//! four query heads of a KV head); rows × KV heads are split across the cores
//! ([`pool`]).
pub mod op;

use super::affine_qmm::rms_norm;
use super::pool;
use super::prefill_attention::{self, QUERIES};
use super::primitive_call::{count, elems, Buffer};
use super::rope;
use super::RopeParams;

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

/// What happens to q and k before attention: per-head RMS norms (qwen3's `q_norm`,
/// `k_norm`), then RoPE.
#[derive(Clone, Copy)]
pub struct Prep<'a> {
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub eps: f32,
    pub rope: RopeParams,
    /// Per-pair periods replacing the base (Llama 3's scaled frequencies).
    pub periods: Option<&'a [f32]>,
}

/// The cache buffers of one layer, `[rows, kv_heads, capacity, head_dim]`, written at each
/// row's position.
pub struct Cache<'a> {
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
}

/// `out[row, head·head_dim + d]` = softmax(q · kᵀ · scale) · v over positions
/// `0..=positions[row]` of the row's cache, after the row's new k and v (norm and RoPE
/// applied to k, as to q) are written at `positions[row]`.
///
/// `qkv` is `[rows, (heads + 2·kv_heads)·head_dim]`: each row's q, then k, then v.
///
/// # Panics
/// On inconsistent shapes or a position outside the cache (checked first).
#[allow(clippy::too_many_arguments)]
pub fn step(s: Shape, prep: Prep, qkv: &[f32], positions: &[i32], scale: f32, cache: Cache, out: &mut [f32]) {
    let hd = s.head_dim;
    let dims = usize::try_from(prep.rope.dims).unwrap_or(0);
    assert!(s.kv_heads > 0 && s.heads.is_multiple_of(s.kv_heads) && hd > 0);
    assert!(dims % 2 == 0 && dims > 0 && dims <= hd, "rope: dims {dims} for head_dim {hd}");
    let (qw, kw) = (s.heads * hd, s.kv_heads * hd);
    let width = qw + 2 * kw;
    assert!(qkv.len() == s.rows * width && out.len() == s.rows * qw && positions.len() == s.rows);
    assert!(cache.keys.len() == s.rows * s.kv_heads * s.capacity * hd && cache.values.len() == cache.keys.len());
    assert!(positions.iter().all(|&p| p >= 0 && (p as usize) < s.capacity), "a position outside the cache");
    assert!(prep.q_norm.is_none_or(|w| w.len() == hd) && prep.k_norm.is_none_or(|w| w.len() == hd), "a norm of head_dim values");
    assert!(prep.periods.is_none_or(|f| f.len() == dims / 2), "rope: periods for {} pairs", dims / 2);
    let inv_freqs = rope::inv_freqs(prep.rope, prep.periods);
    let (mut cs, mut normed) = (vec![(0f32, 0f32); dims / 2], vec![0f32; hd]);
    // norm (when there is one), then RoPE, into `out`.
    let mut prepare = |x: &[f32], norm: Option<&[f32]>, cs: &[(f32, f32)], out: &mut [f32]| match norm {
        Some(w) => {
            rms_norm(x, w, prep.eps, &mut normed);
            rope::apply(prep.rope, cs, &normed, out);
        }
        None => rope::apply(prep.rope, cs, x, out),
    };
    let mut q_rot = vec![0f32; out.len()];
    for row in 0..s.rows {
        let pos = positions[row] as usize;
        let (q, kv) = qkv[row * width..][..width].split_at(qw);
        let (k, v) = kv.split_at(kw);
        rope::angles(positions[row] as f32 * prep.rope.position_scale, &inv_freqs, &mut cs);
        for (x, o) in q.chunks_exact(hd).zip(q_rot[row * qw..].chunks_exact_mut(hd)) {
            prepare(x, prep.q_norm, &cs, o);
        }
        for h in 0..s.kv_heads {
            let slot = ((row * s.kv_heads + h) * s.capacity + pos) * hd;
            prepare(&k[h * hd..][..hd], prep.k_norm, &cs, &mut cache.keys[slot..][..hd]);
            cache.values[slot..][..hd].copy_from_slice(&v[h * hd..][..hd]);
        }
    }
    let (keys, values) = (&*cache.keys, &*cache.values);
    let group = s.heads / s.kv_heads;
    let simd = prefill_attention::simd();
    // A task: up to four query heads of one KV head's group in one row, so each key and
    // value is loaded once for all of them.
    pool::for_each_row_chunk_mut(out, group * hd, QUERIES * hd, |row_kv, b, o| {
        let (row, kv) = (row_kv / s.kv_heads, row_kv % s.kv_heads);
        let n = o.len() / hd;
        let first = (row * s.heads + kv * group + b * QUERIES) * hd;
        let base = (row * s.kv_heads + kv) * s.capacity * hd;
        let len = positions[row] as usize + 1;
        let (k, v) = (&keys[base..][..len * hd], &values[base..][..len * hd]);
        prefill_attention::queries(simd, &q_rot[first..][..n * hd], n, k, v, &[len; QUERIES], hd, scale, o);
    });
}

/// The op's shapes and constants as the primitives pass them (`StepParams` in primitive.h;
/// decode_block's op too).
#[repr(C)]
pub struct StepParams {
    pub rows: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub capacity: i64,
    pub head_dim: i64,
    pub rope_dims: i64,
    pub traditional: bool,
    pub base: f32,
    pub position_scale: f32,
    pub input_scale: f32,
    pub eps: f32,
    pub scale: f32,
}

impl StepParams {
    /// The step's shapes, what happens to q and k, and the layer's cache, from the buffers
    /// a primitive hands over (each checked against the shapes here).
    ///
    /// # Safety
    /// Each buffer is valid for reads of its stated length for `'a` (`keys` and `values` for
    /// writes too, and nothing else uses them meanwhile).
    pub unsafe fn parts<'a>(
        &self,
        periods: &Buffer<f32>,
        q_norm: &Buffer<f32>,
        k_norm: &Buffer<f32>,
        keys: &Buffer<f32>,
        values: &Buffer<f32>,
    ) -> (Shape, Prep<'a>, Cache<'a>) {
        let s = Shape {
            rows: count(self.rows),
            heads: count(self.heads),
            kv_heads: count(self.kv_heads),
            capacity: count(self.capacity),
            head_dim: count(self.head_dim),
        };
        let hd = s.head_dim;
        let rope = RopeParams {
            dims: i32::try_from(self.rope_dims).unwrap_or(-1),
            traditional: self.traditional,
            base: self.base,
            position_scale: self.position_scale,
            input_scale: self.input_scale,
        };
        let prep = Prep {
            q_norm: q_norm.optional(hd, "q_norm"),
            k_norm: k_norm.optional(hd, "k_norm"),
            eps: self.eps,
            rope,
            periods: periods.optional(count(self.rope_dims) / 2, "periods"),
        };
        let kv = elems(&[s.rows, s.kv_heads, s.capacity, hd]);
        let cache = Cache { keys: keys.output(kv, "keys"), values: values.output(kv, "values") };
        (s, prep, cache)
    }
}

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays.
///
/// # Safety
/// Each buffer is valid for reads of its stated length for the call (`keys`, `values` and
/// `out` for writes too), and nothing else reads or writes `keys`, `values` or `out`
/// meanwhile. Shapes are not trusted: every slice is checked against its buffer's length
/// first ([`primitive_call::input`]).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxbar_decode_attention_run(
    p: &StepParams,
    qkv: Buffer<f32>,
    positions: Buffer<i32>,
    periods: Buffer<f32>,
    q_norm: Buffer<f32>,
    k_norm: Buffer<f32>,
    keys: Buffer<f32>,
    values: Buffer<f32>,
    out: Buffer<f32>,
) {
    let run = || {
        let (s, prep, cache) = p.parts(&periods, &q_norm, &k_norm, &keys, &values);
        let nqkv = elems(&[s.rows, s.heads + 2 * s.kv_heads, s.head_dim]);
        step(
            s,
            prep,
            qkv.input(nqkv, "qkv"),
            positions.input(s.rows, "positions"),
            p.scale,
            cache,
            out.output(elems(&[s.rows, s.heads, s.head_dim]), "out"),
        );
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the decode attention kernel panicked");
        std::process::abort();
    }
}
