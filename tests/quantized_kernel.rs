//! mlxbar's C++ MLX primitives for the CPU (engine::cpu_backend) against references.
//!
//! The quantized matmul (affine_qmm, as the MLX op the model runs), on random shapes: 4 and
//! 8 bits, groups of 32, 64 and 128, 1 to 16 rows, contiguous, strided and batched `x`,
//! float16, bfloat16 and float32 scales and biases;
//! and with the RMS norm, SwiGLU and residual add it fuses, against MLX's own ops for them.
//! Two checks on every random shape:
//! - the tight one: a float64 reference computed here from the packed weights and from `x`
//!   quantized to int8 the way the kernel documents (per block of 32 values, scale = the
//!   block's max |x| / 127 in float32, round half to even; engine/cpu_backend/affine_qmm/
//!   activations.rs), within 1e-5 of the magnitude of the terms summed: only float32
//!   summation separates the two. A seeded mutation (one weight's nibble flipped in what the
//!   kernel is fed) must break it;
//! - against MLX's own `quantized_matmul`, which multiplies float `x`: the int8 rounding
//!   moves each `x` by at most half a step, so an output may differ by at most
//!   `Σ |w_i| · step_i / 2` (the dequantized weights, each block's step), plus float
//!   summation error, bounded here by 1e-5 of `Σ |x_i w_i|`. That bound is the worst case
//!   (√k looser than typical), so it only says the kernel is MLX's product.
//!
//! The prefill attention op against MLX's own causal attention, on cached prefixes and
//! grouped heads.
//! The decode step's attention op (norms, RoPE, the in-place cache write, attention)
//! against a float64 reference, its q|k|v input a strided view (which the op gathers); refusing cache
//! buffers it cannot write in place. A dense block's decode step as one op against its five
//! ops apart, bit for bit. Both ops on shapes past int32's reach: a packed row of
//! 2^26 words (its bit count, 2^31, overflowed an `int` in the primitive) computed for
//! real, and a decode-attention output row of 2^31 values refused before anything is
//! allocated.
#![cfg(target_os = "linux")]

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, random, Array, Device, Dtype};
use mlxbar::engine::cpu_backend::{self, Prologue};

/// Host copies of the inputs, for the bound.
struct Case {
    x: Vec<f32>,
    w: Vec<f32>,
    rows: usize,
    n: usize,
    k: usize,
}

impl Case {
    /// The largest difference the int8 rounding of `x` allows at output (r, j).
    fn bound(&self, r: usize, j: usize) -> f32 {
        let x = &self.x[r * self.k..][..self.k];
        let w = &self.w[j * self.k..][..self.k];
        let mut bound = 0f64;
        let mut magnitude = 0f64;
        for (xb, wb) in x.chunks(32).zip(w.chunks(32)) {
            let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
            for (a, b) in xb.iter().zip(wb) {
                bound += b.abs() as f64 * step / 2.0;
                magnitude += (a * b).abs() as f64;
            }
        }
        (bound + 1e-5 * magnitude + 1e-6) as f32
    }
}

/// Host copies of MLX's packed weights (`n × k·bits/32` words, low bits first; one scale
/// and bias per group).
struct Packed {
    w: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
    n: usize,
    k: usize,
    group_size: usize,
    bits: u32,
}

impl Packed {
    fn of(w: &Array, scales: &Array, biases: &Array, n: usize, k: usize, group_size: usize, bits: u32) -> Packed {
        mlx_rs::transforms::eval([w, scales, biases]).unwrap();
        let (w, scales, biases) = (w.as_slice::<u32>().to_vec(), scales.as_slice::<f32>().to_vec(), biases.as_slice::<f32>().to_vec());
        Packed { w, scales, biases, n, k, group_size, bits }
    }

    /// Weight `i` of row `j`'s stored value (0..2^bits).
    fn value(&self, j: usize, i: usize) -> u32 {
        let per_word = (32 / self.bits) as usize;
        let word = self.w[j * self.k * self.bits as usize / 32 + i / per_word];
        (word >> ((i % per_word) as u32 * self.bits)) & ((1 << self.bits) - 1)
    }

    /// Weight `i` of row `j` dequantized (`scale · value + bias`, in float64), and the
    /// magnitude of the terms the kernel sums for it (`|scale| · 2^bits + |bias|`).
    fn weight(&self, j: usize, i: usize) -> (f64, f64) {
        let g = j * (self.k / self.group_size) + i / self.group_size;
        let (s, b) = (self.scales[g] as f64, self.biases[g] as f64);
        (s * self.value(j, i) as f64 + b, s.abs() * (1u32 << self.bits) as f64 + b.abs())
    }

    fn kernel(&self, x: &Array) -> Vec<f32> {
        let words = (self.k * self.bits as usize / 32) as i32;
        let groups = (self.k / self.group_size) as i32;
        let w = Array::from_slice(&self.w, &[self.n as i32, words]);
        let scales = Array::from_slice(&self.scales, &[self.n as i32, groups]);
        let biases = Array::from_slice(&self.biases, &[self.n as i32, groups]);
        let (gs, bits) = (self.group_size as i32, self.bits as i32);
        let y = cpu_backend::quantized_matmul(x, &w, &scales, &biases, gs, bits, false, Prologue::None, None).unwrap();
        y.eval().unwrap();
        y.as_slice::<f32>().to_vec()
    }
}

/// `x` (rows of `k`, a multiple of 32) as the kernel reads it, written here from
/// activations.rs's description, not its code: per block of 32 values, scale = the block's
/// max |x| / 127 in float32, each value round-half-to-even of `x · (1 / scale)` in float32,
/// read back as `scale · q` (exact in float64).
fn quantize_x(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|block| {
            let scale = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            block.iter().map(move |v| (v * inv).round_ties_even() as f64 * scale as f64)
        })
        .collect()
}

/// The outputs (`rows × n`) that miss the float64 product of the int8-quantized `x` and the
/// dequantized weights by more than 1e-5 of the magnitude of the terms summed.
fn tight_misses(x: &[f32], rows: usize, p: &Packed, got: &[f32]) -> Vec<String> {
    let xq = quantize_x(x);
    let w: Vec<(f64, f64)> = (0..p.n).flat_map(|j| (0..p.k).map(move |i| (j, i))).map(|(j, i)| p.weight(j, i)).collect();
    let mut misses = Vec::new();
    for r in 0..rows {
        let xr = &xq[r * p.k..][..p.k];
        for j in 0..p.n {
            let wj = &w[j * p.k..][..p.k];
            let want: f64 = xr.iter().zip(wj).map(|(x, (w, _))| x * w).sum();
            let magnitude: f64 = xr.iter().zip(wj).map(|(x, (_, m))| x.abs() * m).sum();
            let have = got[r * p.n + j] as f64;
            if (have - want).abs() > 1e-5 * magnitude {
                misses.push(format!("[{r},{j}] = {have}, float64 reference {want} (magnitude {magnitude})"));
            }
        }
    }
    misses
}

/// One random case; the kernel gets the scales and biases as `scale_type` (models store
/// float16 or bfloat16; the references use the same values widened to float32).
#[allow(clippy::too_many_arguments)]
fn check(bits: i32, group_size: i32, rows: i32, n: i32, k: i32, layout: &str, scale_type: Dtype, seed: u64) {
    let w = random::normal::<f32>(&[n, k][..], 0.0, 0.05, &random::key(seed).unwrap()).unwrap();
    let (wq, stored_scales, stored_biases) = ops::quantize(&w, group_size, bits).unwrap();
    let (kernel_scales, kernel_biases) = (stored_scales.as_dtype(scale_type).unwrap(), stored_biases.as_dtype(scale_type).unwrap());
    let (scales, biases) = (kernel_scales.as_dtype(Dtype::Float32).unwrap(), kernel_biases.as_dtype(Dtype::Float32).unwrap());
    let dense = ops::dequantize(&wq, &scales, &biases, group_size, bits).unwrap();
    let batch = if layout == "batched" { 2 } else { 1 };
    let all_rows = (batch * rows) as usize;
    // x row-major on the host (uniform in [-2, 2), a few larger outliers).
    let mut state = seed | 1;
    let host: Vec<f32> = (0..all_rows * k as usize)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0;
            if i % 97 == 0 {
                v * 8.0
            } else {
                v
            }
        })
        .collect();
    let x = match layout {
        // Stored as [k, rows], viewed transposed: a strided x the kernel gathers first.
        "strided" => {
            let (r, kk) = (rows as usize, k as usize);
            let t: Vec<f32> = (0..kk * r).map(|i| host[(i % r) * kk + i / r]).collect();
            mlx_rs::Array::from_slice(&t, &[k, rows]).t()
        }
        "batched" => mlx_rs::Array::from_slice(&host, &[2, rows, k]),
        _ => mlx_rs::Array::from_slice(&host, &[rows, k]),
    };
    mlx_rs::transforms::eval([&wq, &kernel_scales, &kernel_biases, &scales, &biases, &dense, &x]).unwrap();
    let mlx = ops::quantized_matmul(&x, &wq, &scales, &biases, true, group_size, bits).unwrap();
    let packed = Packed::of(&wq, &scales, &biases, n as usize, k as usize, group_size as usize, bits as u32);
    let case = Case { x: host, w: dense.as_slice::<f32>().to_vec(), rows: all_rows, n: n as usize, k: k as usize };
    // MLX's layout, and the same weights in strips where this machine's kernel reads those.
    let strips = cpu_backend::repack_in_strips(&wq, &kernel_scales, &kernel_biases, group_size, bits).unwrap();
    let runs = std::iter::once((&wq, &kernel_scales, &kernel_biases, false)).chain(strips.as_ref().map(|(w, s, b)| (w, s, b, true)));
    for (w, s, b, in_strips) in runs {
        let ours = cpu_backend::quantized_matmul(&x, w, s, b, group_size, bits, in_strips, Prologue::None, None).unwrap();
        mlx_rs::transforms::eval([&ours, &mlx]).unwrap();
        assert_eq!(ours.shape(), mlx.shape());
        let what =
            format!("{bits}-bit, groups of {group_size}, {rows}x{k} ({layout}) by {n}x{k}, {scale_type:?} scales, strips {in_strips}");
        if let Some(miss) = tight_misses(&case.x, all_rows, &packed, ours.as_slice::<f32>()).first() {
            panic!("{what}: {miss}");
        }
        let (o, m) = (ours.as_slice::<f32>(), mlx.as_slice::<f32>());
        for r in 0..case.rows {
            for j in 0..case.n {
                let (a, b) = (o[r * case.n + j], m[r * case.n + j]);
                let bound = case.bound(r, j);
                assert!((a - b).abs() <= bound, "{what}: [{r},{j}] = {a}, MLX {b}, bound {bound}");
            }
        }
    }
}

#[test]
fn matches_mlx_quantized_matmul_on_random_shapes() {
    Device::set_default(&Device::cpu());
    let mut seed = 0x5eed_u64;
    let mut next = |m: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    let mut cases = 0;
    for bits in [4, 8] {
        for group_size in [32, 64, 128] {
            for rows in [1, 2, 3, 4, 5, 7, 8, 13, 16] {
                // Every other case whole strips of 16 columns (the layout AVX512-VNNI reads).
                let n = if cases % 2 == 0 { 16 * (1 + next(18) as i32) } else { 1 + next(300) as i32 };
                let k = group_size * (1 + next(8) as i32);
                let layout = ["contiguous", "contiguous", "strided", "batched"][next(4) as usize];
                let scale_type = [Dtype::Float16, Dtype::Bfloat16, Dtype::Float32][cases % 3];
                check(bits, group_size, rows, n, k, layout, scale_type, next(1 << 30));
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 54);
}

/// The tight check sees one weight changed: a nibble (4-bit) or the top bit (8-bit) of one
/// weight flipped in what the kernel is fed, at a seeded place, makes that output column
/// miss the reference of the true weights, and only that column.
#[test]
fn the_tight_check_catches_one_flipped_weight() {
    Device::set_default(&Device::cpu());
    let (rows, n, k, gs) = (3usize, 64usize, 256usize, 64usize);
    let mut seed = 0x0dd5_u64;
    let mut next = |m: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as usize % m
    };
    let x: Vec<f32> = (0..rows * k).map(|_| next(4001) as f32 / 1000.0 - 2.0).collect();
    let xa = Array::from_slice(&x, &[rows as i32, k as i32]);
    for bits in [4u32, 8] {
        let w = random::normal::<f32>(&[n as i32, k as i32][..], 0.0, 0.05, &random::key(21).unwrap()).unwrap();
        let (wq, scales, biases) = ops::quantize(&w, gs as i32, bits as i32).unwrap();
        let mut p = Packed::of(&wq, &scales, &biases, n, k, gs, bits);
        assert!(tight_misses(&x, rows, &p, &p.kernel(&xa)).is_empty(), "{bits}-bit: the true weights pass");
        // A weight the first row's x does not round to zero.
        let (j, i) = loop {
            let (j, i) = (next(n), next(k));
            if x[i].abs() > 0.5 {
                break (j, i);
            }
        };
        let per_word = (32 / bits) as usize;
        let flip = 1u32 << ((i % per_word) as u32 * bits + bits - 1);
        let at = j * k * bits as usize / 32 + i / per_word;
        let truth = p.w[at];
        p.w[at] ^= flip;
        let mutated = p.kernel(&xa);
        p.w[at] = truth;
        let misses = tight_misses(&x, rows, &p, &mutated);
        assert!(!misses.is_empty(), "{bits}-bit: weight ({j}, {i}) flipped went unnoticed");
        assert!(misses.iter().all(|m| m.contains(&format!(",{j}]"))), "{bits}-bit: only column {j} moves: {misses:?}");
    }
}

/// A packed weight row of 2^26 words (8-bit, k = 2^28): its width in bits, 2^31, used to be
/// computed in an `int` in the primitive. Computed for real here (about 1.6 GiB: x 1 GiB,
/// its int8 copy and the weights 256 MiB each) on values whose sums are exact in float32:
/// zero scales, so each output is `Σ bias · x̂`, every partial sum a multiple of 2^-21.
#[test]
fn a_packed_row_of_2_pow_26_words_multiplies() {
    Device::set_default(&Device::cpu());
    let (words, gs) = (1i32 << 26, 128);
    let k = words * 4;
    // Each block of 32: 127/128 (its max, so the scale is 2^-7), sixteen 1/128 and zeros:
    // x̂ = x exactly, 64/128 per group of 128.
    let mut block = vec![0f32; 32];
    block[0] = 127.0 / 128.0;
    block[1] = -127.0 / 128.0;
    block[2..18].fill(1.0 / 128.0);
    let pattern = Array::from_slice(&block, &[1, 1, 32]);
    let x = ops::broadcast_to(&pattern, &[1, k / 32, 32]).unwrap().reshape(&[1, k]).unwrap();
    let w = ops::zeros::<u32>(&[1, words]).unwrap();
    let scales = ops::zeros::<f32>(&[1, k / gs]).unwrap();
    // 2^21 groups, each adding 2^-20 · 0.5.
    let biases = ops::full::<f32>(&[1, k / gs], Array::from_f32(1.0 / (1u32 << 20) as f32)).unwrap();
    let y = cpu_backend::quantized_matmul(&x, &w, &scales, &biases, gs, 8, false, Prologue::None, None).unwrap();
    y.eval().unwrap();
    assert_eq!(y.shape(), &[1, 1]);
    assert_eq!(y.as_slice::<f32>(), &[1.0]);
}

/// A seeded generator of values in [-1, 1).
fn uniform(seed: u64) -> impl FnMut(usize) -> Vec<f32> {
    let mut state = seed;
    move |len| {
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }
}

/// `x` normed by weight `w` (RMS, eps 1e-6) when given, then rotated at `pos` (base 10000,
/// half-split pairs over the first `dims`), in float64.
fn norm_rope_f64(x: &[f32], w: Option<&[f32]>, pos: usize, dims: usize) -> Vec<f64> {
    let mut v: Vec<f64> = x.iter().map(|&a| a as f64).collect();
    if let Some(w) = w {
        let inv = 1.0 / (v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64 + 1e-6).sqrt();
        v.iter_mut().zip(w).for_each(|(a, &w)| *a *= inv * w as f64);
    }
    let half = dims / 2;
    let mut out = v.clone();
    for i in 0..half {
        let theta = pos as f64 * (-(i as f64) * 10000f64.ln() / half as f64).exp();
        let (s, c) = theta.sin_cos();
        out[i] = v[i] * c - v[i + half] * s;
        out[i + half] = v[i] * s + v[i + half] * c;
    }
    out
}

/// The decode step's attention op, as the model calls it: q, k and v are columns of one
/// q|k|v projection output (strided views), qwen3-style per-head norms, RoPE over part of
/// each head (partial rotation), rows at different positions of their caches, grouped
/// query heads. Against a float64 reference: the output, and each row's new k (normed,
/// rotated) and v written at its position of the cache buffers, which change in place
/// there and nowhere else. A positions array that is a column of a larger one reads as
/// the column.
/// The prefill attention op against MLX's own causal `scaled_dot_product_attention`
/// (materialized scores, libm's `exp`): chunks of 1 to 37 new positions after cached
/// prefixes of 0 to 300, grouped heads, q as the model gives it (a transposed view) and
/// the keys as a slice of larger buffers. Float32 both, with the same products; only the
/// summation order and the `exp` polynomial's last bits differ: 2e-5 of the values' scale.
#[test]
fn prefill_attention_matches_mlx_causal_attention() {
    Device::set_default(&Device::cpu());
    let mut worst = 0f32;
    for (seed, heads, kv_heads, len, cached, hd) in
        [(1u64, 9, 3, 1, 0, 64), (2, 9, 3, 37, 0, 64), (3, 9, 3, 13, 300, 64), (4, 4, 1, 6, 9, 32), (5, 2, 2, 5, 1, 72)]
    {
        let keys_n = len + cached;
        let key = |i: u64| random::key(seed * 10 + i).unwrap();
        // q as the projection gives it, [1, len, heads, hd], viewed [1, heads, len, hd].
        let q = random::normal::<f32>(&[1, len, heads, hd][..], 0.0, 1.0, &key(0)).unwrap().transpose_axes(&[0, 2, 1, 3]).unwrap();
        // Keys and values in buffers 8 positions longer than what is used.
        let buffer = |i| random::normal::<f32>(&[1, kv_heads, keys_n + 8, hd][..], 0.0, 1.5, &key(i)).unwrap();
        let (kb, vb) = (buffer(1), buffer(2));
        let (k, v) = (kb.index((.., .., ..keys_n, ..)), vb.index((.., .., ..keys_n, ..)));
        let scale = 1.0 / (hd as f32).sqrt();
        let ours = cpu_backend::prefill_attention(&q, &k, &v, scale).unwrap();
        let mlx = mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, scale, mlx_rs::fast::ScaledDotProductAttentionMask::Causal, None)
            .unwrap();
        mlx_rs::transforms::eval([&ours, &mlx]).unwrap();
        assert_eq!(ours.shape(), mlx.shape());
        let what = format!("{heads} heads over {kv_heads}, {len} new after {cached}, head_dim {hd}");
        for (i, (a, b)) in ours.as_slice::<f32>().iter().zip(mlx.as_slice::<f32>()).enumerate() {
            assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{what} [{i}]: {a} vs MLX {b}");
            worst = worst.max((a - b).abs());
        }
    }
    println!("largest |difference| from MLX: {worst:e}");
    // Shapes it cannot attend: more queries than keys, heads not a multiple of kv_heads.
    let q = Array::zeros::<f32>(&[1, 4, 6, 8]).unwrap();
    let err =
        cpu_backend::prefill_attention(&q, &Array::zeros::<f32>(&[1, 2, 5, 8]).unwrap(), &Array::zeros::<f32>(&[1, 2, 5, 8]).unwrap(), 1.0);
    assert!(err.is_err_and(|e| e.to_string().contains("prefill_attention")));
    let err =
        cpu_backend::prefill_attention(&q, &Array::zeros::<f32>(&[1, 3, 6, 8]).unwrap(), &Array::zeros::<f32>(&[1, 3, 6, 8]).unwrap(), 1.0);
    assert!(err.is_err_and(|e| e.to_string().contains("prefill_attention")));
}

#[test]
fn decode_attention_matches_float64_and_writes_the_cache_in_place() {
    Device::set_default(&Device::cpu());
    // Query heads go four of a KV head's group at a time: groups of 2, 3 (the default
    // model's 9 heads over 3) and 6 (a task of four and one of two); head_dim 20 leaves the
    // vectorized loops a tail.
    decode_attention_case((3, 4, 2, 8, 16, 12), &[5, 2, 7]);
    decode_attention_case((2, 9, 3, 40, 64, 64), &[39, 3]);
    decode_attention_case((2, 12, 2, 24, 20, 20), &[0, 17]);
}

/// One step of `rows` sequences at `positions`, `(rows, heads, kv_heads, capacity,
/// head_dim, rope dims)`, against float64.
fn decode_attention_case((rows, heads, kv_heads, capacity, hd, dims): (usize, usize, usize, usize, usize, usize), positions: &[i32]) {
    let mut values = uniform(0x5eed);
    let width = (heads + 2 * kv_heads) * hd;
    let qkv = values(rows * width);
    let keys = values(rows * kv_heads * capacity * hd);
    let vals = values(rows * kv_heads * capacity * hd);
    let (q_norm, k_norm): (Vec<f32>, Vec<f32>) =
        (values(hd).iter().map(|w| 1.0 + w / 2.0).collect(), values(hd).iter().map(|w| 1.0 + w / 2.0).collect());
    assert_eq!(positions.len(), rows);
    let scale = 0.25f32;
    let dim = |d: &[usize]| d.iter().map(|&v| v as i32).collect::<Vec<_>>();
    let kv_shape = dim(&[rows, kv_heads, capacity, hd]);
    let (ka, va) = (Array::from_slice(&keys, &kv_shape), Array::from_slice(&vals, &kv_shape));
    mlx_rs::transforms::eval([&ka, &va]).unwrap();
    // The projection's output as a strided view (every other row of a wider matrix), which
    // the op gathers before it reads.
    let wider: Vec<f32> = qkv.chunks_exact(width).flat_map(|r| r.iter().chain(r.iter()).copied()).collect();
    let projected = Array::from_slice(&wider, &dim(&[1, rows, 2, width])).index((.., .., 0, ..));
    // positions as column 0 of [rows, 2] (the other column holds 0, a valid position that
    // reading the buffer raw would take).
    let pairs: Vec<i32> = positions.iter().flat_map(|&p| [p, 0]).collect();
    let p_view = Array::from_slice(&pairs, &[rows as i32, 2]).t().index(0);
    let (qn, kn) = (Array::from_slice(&q_norm, &[hd as i32]), Array::from_slice(&k_norm, &[hd as i32]));
    let rope = cpu_backend::RopeParams { dims: dims as i32, traditional: false, base: 10000.0, position_scale: 1.0, input_scale: 1.0 };
    let out = cpu_backend::decode_attention(&cpu_backend::DecodeAttention {
        qkv: &projected,
        step: cpu_backend::AttentionStep {
            keys: &ka,
            values: &va,
            positions: &p_view,
            heads: heads as i32,
            q_norm: Some(&qn),
            k_norm: Some(&kn),
            eps: 1e-6,
            rope,
            periods: None,
            scale,
        },
    })
    .unwrap();
    out.eval().unwrap();
    assert_eq!(out.shape(), &[1, rows as i32, (heads * hd) as i32]);
    let (got_keys, got_vals) = (ka.as_slice::<f32>(), va.as_slice::<f32>());
    // The reference cache: each row's new k and v at its position.
    let (mut want_keys, mut want_vals): (Vec<f64>, Vec<f64>) =
        (keys.iter().map(|&x| x as f64).collect(), vals.iter().map(|&x| x as f64).collect());
    for (row, &pos) in positions.iter().enumerate() {
        let pos = pos as usize;
        for h in 0..kv_heads {
            let src = row * width + (heads + h) * hd;
            let slot = ((row * kv_heads + h) * capacity + pos) * hd;
            want_keys[slot..][..hd].copy_from_slice(&norm_rope_f64(&qkv[src..][..hd], Some(&k_norm), pos, dims));
            let v = &qkv[src + kv_heads * hd..][..hd];
            want_vals[slot..][..hd].iter_mut().zip(v).for_each(|(a, &b)| *a = b as f64);
        }
    }
    for (i, ((gk, wk), (gv, wv))) in got_keys.iter().zip(&want_keys).zip(got_vals.iter().zip(&want_vals)).enumerate() {
        assert!((*gk as f64 - wk).abs() <= 1e-5 && (*gv as f64 - wv).abs() <= 1e-6, "cache element {i}: {gk}, {gv} vs {wk}, {wv}");
    }
    let group = heads / kv_heads;
    for (row, &pos) in positions.iter().enumerate() {
        let pos = pos as usize;
        for head in 0..heads {
            let qv = norm_rope_f64(&qkv[row * width + head * hd..][..hd], Some(&q_norm), pos, dims);
            let base = (row * kv_heads + head / group) * capacity * hd;
            let scores: Vec<f64> = (0..=pos)
                .map(|t| want_keys[base + t * hd..][..hd].iter().zip(&qv).map(|(a, b)| a * b).sum::<f64>() * scale as f64)
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..hd {
                let want: f64 = (0..=pos).map(|t| weights[t] * want_vals[base + t * hd + d]).sum::<f64>() / total;
                let have = out.as_slice::<f32>()[(row * heads + head) * hd + d] as f64;
                assert!((have - want).abs() <= 1e-5, "row {row} head {head} [{d}]: {have} vs float64 {want}");
            }
        }
    }
}

/// The op writes the cache buffers in place, so it refuses ones it cannot: a buffer not yet
/// evaluated, or a broadcast scalar; and an output row
/// of heads × head_dim = 2^31 values, past MLX's int32 dimensions, before anything is
/// allocated.
#[test]
fn decode_attention_refuses_what_it_cannot_write_or_shape() {
    Device::set_default(&Device::cpu());
    let call = |q: &Array, kv: &Array, heads: i32, hd: i32| {
        let positions = Array::from_slice(&[0i32], &[1]);
        let rope = cpu_backend::RopeParams { dims: hd.min(64), traditional: false, base: 10000.0, position_scale: 1.0, input_scale: 1.0 };
        cpu_backend::decode_attention(&cpu_backend::DecodeAttention {
            qkv: q,
            step: cpu_backend::AttentionStep {
                keys: kv,
                values: kv,
                positions: &positions,
                heads,
                q_norm: None,
                k_norm: None,
                eps: 1e-6,
                rope,
                periods: None,
                scale: 1.0,
            },
        })
        .unwrap_err()
        .to_string()
    };
    let q = Array::from_slice(&[0.5f32; 24], &[1, 1, 24]);
    let lazy = Array::from_slice(&[0.5f32; 16], &[1, 1, 2, 8]).multiply(Array::from_f32(2.0)).unwrap();
    assert!(call(&q, &lazy, 1, 8).contains("must be evaluated and dense"));
    let zero = Array::from_f32(0.0);
    let broadcast = ops::broadcast_to(&zero, &[1, 1, 2, 8]).unwrap();
    broadcast.eval().unwrap();
    assert!(call(&q, &broadcast, 1, 8).contains("must be evaluated and dense"));
    let wide = ops::broadcast_to(&zero, &[1, 1, 1, 1 << 15]).unwrap();
    let err = call(&q, &wide, 1 << 16, 1 << 15);
    assert!(err.contains("2147483648 does not fit in int32"), "{err}");
}

#[test]
fn refuses_unsupported_formats_with_a_reason() {
    Device::set_default(&Device::cpu());
    let w = random::normal::<f32>(&[8, 64][..], None, None, None).unwrap();
    let (wq, scales, biases) = ops::quantize(&w, 64, 3).unwrap();
    let x = random::normal::<f32>(&[1, 64][..], None, None, None).unwrap();
    let err = cpu_backend::quantized_matmul(&x, &wq, &scales, &biases, 64, 3, false, Prologue::None, None).unwrap_err();
    assert!(err.to_string().contains("3-bit"), "{err}");
    let (wq, scales, biases) = ops::quantize(&w, 64, 4).unwrap();
    let wrong_k = random::normal::<f32>(&[1, 32][..], None, None, None).unwrap();
    let err = cpu_backend::quantized_matmul(&wrong_k, &wq, &scales, &biases, 64, 4, false, Prologue::None, None).unwrap_err();
    assert!(err.to_string().contains("disagree"), "{err}");
}

/// The fused forms equal MLX's ops: `r + qmm(fast::rms_norm(x, w))` and
/// `r + qmm(silu(gate) · up)`, within the int8 bound taken on the transformed `x`; with the
/// weights in strips too where this machine's kernel reads them.
#[test]
fn fusions_equal_the_ops_they_replace() {
    Device::set_default(&Device::cpu());
    let (rows, n, k, gs, bits) = (3, 96, 256, 64, 4);
    let key = random::key(11).unwrap();
    let w = random::normal::<f32>(&[n, k][..], 0.0, 0.05, &key).unwrap();
    let (wq, scales, biases) = ops::quantize(&w, gs, bits).unwrap();
    let dense = ops::dequantize(&wq, &scales, &biases, gs, bits).unwrap();
    let norm = random::uniform::<_, f32>(0.5, 1.5, &[k][..], &random::key(12).unwrap()).unwrap();
    let residual = random::normal::<f32>(&[rows, n][..], None, None, &random::key(13).unwrap()).unwrap();
    let x = random::normal::<f32>(&[rows, k][..], None, None, &random::key(14).unwrap()).unwrap();
    let gate_up = random::normal::<f32>(&[rows, 2 * k][..], None, None, &random::key(15).unwrap()).unwrap();
    mlx_rs::transforms::eval([&wq, &scales, &biases, &dense, &norm, &residual, &x, &gate_up]).unwrap();
    let halves = ops::split_at_indices(&gate_up, &[k], -1).unwrap();
    for (name, input, prologue, transformed) in [
        ("rms_norm", &x, Prologue::RmsNorm(&norm, 1e-5), mlx_rs::fast::rms_norm(&x, Some(&norm), 1e-5).unwrap()),
        ("swiglu", &gate_up, Prologue::SwiGlu, mlx_rs::nn::silu(&halves[0]).unwrap().multiply(&halves[1]).unwrap()),
    ] {
        let strips = cpu_backend::repack_in_strips(&wq, &scales, &biases, gs, bits).unwrap();
        let runs = std::iter::once((&wq, &scales, &biases, false)).chain(strips.as_ref().map(|(w, s, b)| (w, s, b, true)));
        for (w, s, b, in_strips) in runs {
            let fused = cpu_backend::quantized_matmul(input, w, s, b, gs, bits, in_strips, prologue, Some(&residual)).unwrap();
            let want = residual.add(ops::quantized_matmul(&transformed, &wq, &scales, &biases, true, gs, bits).unwrap()).unwrap();
            mlx_rs::transforms::eval([&fused, &want, &transformed]).unwrap();
            let case = Case {
                x: transformed.as_slice::<f32>().to_vec(),
                w: dense.as_slice::<f32>().to_vec(),
                rows: rows as usize,
                n: n as usize,
                k: k as usize,
            };
            for r in 0..case.rows {
                for j in 0..case.n {
                    let (a, b) = (fused.as_slice::<f32>()[r * case.n + j], want.as_slice::<f32>()[r * case.n + j]);
                    assert!((a - b).abs() <= case.bound(r, j) + 1e-5 * b.abs(), "{name} (strips {in_strips}) [{r},{j}]: {a} vs MLX {b}");
                }
            }
        }
    }
}

/// `mlxbar doctor` names the kernel this machine runs and what auto picks.
#[cfg(target_arch = "x86_64")]
#[test]
fn doctor_names_the_kernels() {
    let line = mlxbar::doctor::report().lines().find(|l| l.starts_with("kernels")).unwrap().to_string();
    use std::arch::is_x86_feature_detected as has;
    // The widest instruction set the CPU has, as cpuid reports it.
    let want = match () {
        _ if !(has!("avx2") && has!("fma") && has!("f16c")) => "portable scalar",
        _ if has!("avx512vnni") && has!("avx512vl") && has!("avx512bw") && has!("avx512f") => "AVX512-VNNI",
        _ if has!("avxvnni") => "AVX-VNNI",
        _ => "AVX2+FMA",
    };
    assert!(line.contains(want), "{line}");
    // AMX's tiles where the kernel lists the CPU's AMX flags (Linux grants the tile state
    // to any process that asks since 5.16; std cannot detect AMX on stable Rust yet).
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap_or_default();
    let amx = ["amx_tile", "amx_int8"].iter().all(|f| flags.split_whitespace().any(|w| w == *f));
    assert_eq!(line.contains("AMX int8 tiles"), amx && want == "AVX512-VNNI", "AMX flags {amx}: {line}");
    assert!(line.contains("decode attention: mlxbar's"), "{line}");
}

/// A dense block's decode step as one op (`decode_block`) gives what its five ops apart
/// give (the q|k|v, o, gate|up and down projections with their fusions, and the decode
/// attention), bit for bit, in its output and in the cache it writes; with and without the
/// per-head q and k norms, projections of mixed formats (4 and 8 bits, groups of 32 and
/// 64, float16, bfloat16 and float32 scales), rows at different positions; the weights in
/// MLX's layout, and in strips where this machine's kernel reads those. Refused when a
/// projection does not fit the block.
#[test]
fn decode_block_equals_its_five_ops() {
    Device::set_default(&Device::cpu());
    let (rows, heads, kv_heads, hd, capacity, hidden, ff) = (3i32, 4i32, 2i32, 32i32, 8i32, 128i32, 96i32);
    let width = heads * hd;
    let mut draw = uniform(21);
    let mut array = |shape: &[i32]| Array::from_slice(&draw(shape.iter().product::<i32>() as usize), shape);
    // (rows out, columns in, bits, group size, scale type) of q|k|v, o, gate|up, down.
    let formats = [
        (width + 2 * kv_heads * hd, hidden, 4, 64, Dtype::Float16),
        (hidden, width, 8, 32, Dtype::Bfloat16),
        (2 * ff, hidden, 4, 32, Dtype::Float16),
        (hidden, ff, 4, 32, Dtype::Float32),
    ];
    let rows_layout: Vec<(Array, Array, Array, i32, i32, bool)> = formats
        .iter()
        .map(|&(n, k, bits, gs, dtype)| {
            let (w, s, b) = ops::quantize(array(&[n, k]).multiply(Array::from_f32(0.1)).unwrap(), gs, bits).unwrap();
            let (s, b) = (s.as_dtype(dtype).unwrap(), b.as_dtype(dtype).unwrap());
            mlx_rs::transforms::eval([&w, &s, &b]).unwrap();
            (w, s, b, gs, bits, false)
        })
        .collect();
    let in_strips: Option<Vec<_>> = rows_layout
        .iter()
        .map(|(w, s, b, gs, bits, _)| {
            cpu_backend::repack_in_strips(w, s, b, *gs, *bits).unwrap().map(|(w, s, b)| (w, s, b, *gs, *bits, true))
        })
        .collect();
    let (attn_norm, mlp_norm) = (array(&[hidden]).add(Array::from_f32(1.5)).unwrap(), array(&[hidden]).add(Array::from_f32(1.5)).unwrap());
    let (q_norm, k_norm) = (array(&[hd]).add(Array::from_f32(1.5)).unwrap(), array(&[hd]).add(Array::from_f32(1.5)).unwrap());
    let h = array(&[1, rows, hidden]);
    let positions = Array::from_slice(&[0i32, 5, 7], &[rows]);
    let cache_data = draw((rows * kv_heads * capacity * hd * 2) as usize);
    let cache = |half: usize| {
        let n = cache_data.len() / 2;
        let a = Array::from_slice(&cache_data[half * n..][..n], &[rows, kv_heads, capacity, hd]);
        a.eval().unwrap();
        a
    };
    mlx_rs::transforms::eval([&attn_norm, &mlp_norm, &q_norm, &k_norm, &h]).unwrap();
    let rope = cpu_backend::RopeParams { dims: hd, traditional: false, base: 10000.0, position_scale: 1.0, input_scale: 1.0 };
    for weights in std::iter::once(&rows_layout).chain(in_strips.as_ref()) {
        let arrays = |i: usize| {
            let (w, s, b, group_size, bits, strips) = &weights[i];
            cpu_backend::QuantizedArrays { weight: w, scales: s, biases: b, group_size: *group_size, bits: *bits, strips: *strips }
        };
        for norms in [false, true] {
            let (fused_keys, fused_values, apart_keys, apart_values) = (cache(0), cache(1), cache(0), cache(1));
            let step = |keys, values| cpu_backend::AttentionStep {
                keys,
                values,
                positions: &positions,
                heads,
                q_norm: norms.then_some(&q_norm),
                k_norm: norms.then_some(&k_norm),
                eps: 1e-5,
                rope,
                periods: None,
                scale: 0.2,
            };
            let fused = cpu_backend::decode_block(&cpu_backend::DecodeBlock {
                h: &h,
                attn_norm: &attn_norm,
                mlp_norm: &mlp_norm,
                qkv: arrays(0),
                o: arrays(1),
                gate_up: arrays(2),
                down: arrays(3),
                attention: step(&fused_keys, &fused_values),
            })
            .unwrap();
            fused.eval().unwrap();
            let qmm = |x: &Array, i: usize, prologue, residual| {
                let (w, s, b, gs, bits, strips) = &weights[i];
                cpu_backend::quantized_matmul(x, w, s, b, *gs, *bits, *strips, prologue, residual).unwrap()
            };
            let qkv = qmm(&h, 0, Prologue::RmsNorm(&attn_norm, 1e-5), None);
            let attention =
                cpu_backend::decode_attention(&cpu_backend::DecodeAttention { qkv: &qkv, step: step(&apart_keys, &apart_values) }).unwrap();
            let h1 = qmm(&attention, 1, Prologue::None, Some(&h));
            let gate_up = qmm(&h1, 2, Prologue::RmsNorm(&mlp_norm, 1e-5), None);
            let apart = qmm(&gate_up, 3, Prologue::SwiGlu, Some(&h1));
            apart.eval().unwrap();
            assert_eq!(fused.shape(), &[1, rows, hidden]);
            // The first element whose bits differ, if any.
            let differ =
                |a: &Array, b: &Array| a.as_slice::<f32>().iter().zip(b.as_slice::<f32>()).position(|(x, y)| x.to_bits() != y.to_bits());
            assert_eq!(differ(&fused, &apart), None, "the block's output (q and k norms: {norms})");
            assert_eq!(differ(&fused_keys, &apart_keys), None, "the keys written (q and k norms: {norms})");
            assert_eq!(differ(&fused_values, &apart_values), None, "the values written (q and k norms: {norms})");
            assert!(differ(&fused_keys, &cache(0)).is_some(), "the step wrote its keys");
        }
    }
    let arrays = |i: usize| {
        let (w, s, b, group_size, bits, strips) = &rows_layout[i];
        cpu_backend::QuantizedArrays { weight: w, scales: s, biases: b, group_size: *group_size, bits: *bits, strips: *strips }
    };
    // o with the MLP's width where the attention's goes.
    let (keys, values) = (cache(0), cache(1));
    let err = cpu_backend::decode_block(&cpu_backend::DecodeBlock {
        h: &h,
        attn_norm: &attn_norm,
        mlp_norm: &mlp_norm,
        qkv: arrays(0),
        o: arrays(3),
        gate_up: arrays(2),
        down: arrays(3),
        attention: cpu_backend::AttentionStep {
            keys: &keys,
            values: &values,
            positions: &positions,
            heads,
            q_norm: None,
            k_norm: None,
            eps: 1e-5,
            rope,
            periods: None,
            scale: 0.2,
        },
    })
    .unwrap_err();
    assert!(err.to_string().contains("the o projection's weight"), "{err}");
}
