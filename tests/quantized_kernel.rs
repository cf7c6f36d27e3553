//! mlxbar's CPU kernel for affine-quantized weights (engine::cpu_backend::affine_qmm, as
//! the MLX op the model runs) computes what MLX's own `quantized_matmul` does, on random
//! shapes: 4 and 8 bits, groups of 32, 64 and 128, 1 to 16 rows, contiguous, strided and
//! batched `x`; and with the RMS norm, SwiGLU and residual add it fuses, against MLX's
//! own ops for them.
//!
//! The one deliberate difference: the kernel quantizes `x` to int8 per block of 32 values
//! (scale = the block's max |x| / 127), as llama.cpp does, where MLX multiplies float `x`.
//! Rounding moves each `x` by at most half a step, so an output may differ by at most
//! `Σ |w_i| · step_i / 2` (the dequantized weights, each block's step), plus float
//! summation error, bounded here by 1e-5 of `Σ |x_i w_i|`. That bound is checked exactly;
//! a wrong nibble, group or bias breaks it by orders of magnitude.
#![cfg(target_os = "linux")]

use mlx_rs::{ops, random, Device};
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

fn check(bits: i32, group_size: i32, rows: i32, n: i32, k: i32, layout: &str, seed: u64) {
    let w = random::normal::<f32>(&[n, k][..], 0.0, 0.05, &random::key(seed).unwrap()).unwrap();
    let (wq, scales, biases) = ops::quantize(&w, group_size, bits).unwrap();
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
    mlx_rs::transforms::eval([&wq, &scales, &biases, &dense, &x]).unwrap();
    let ours = cpu_backend::quantized_matmul(&x, &wq, &scales, &biases, group_size, bits, Prologue::None, None).unwrap();
    let mlx = ops::quantized_matmul(&x, &wq, &scales, &biases, true, group_size, bits).unwrap();
    mlx_rs::transforms::eval([&ours, &mlx]).unwrap();
    assert_eq!(ours.shape(), mlx.shape());
    let case = Case { x: host, w: dense.as_slice::<f32>().to_vec(), rows: all_rows, n: n as usize, k: k as usize };
    let (o, m) = (ours.as_slice::<f32>(), mlx.as_slice::<f32>());
    for r in 0..case.rows {
        for j in 0..case.n {
            let (a, b) = (o[r * case.n + j], m[r * case.n + j]);
            let bound = case.bound(r, j);
            assert!(
                (a - b).abs() <= bound,
                "{bits}-bit, groups of {group_size}, {rows}x{k} ({layout}) by {n}x{k}: [{r},{j}] = {a}, MLX {b}, bound {bound}"
            );
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
                let n = 1 + next(300) as i32;
                let k = group_size * (1 + next(8) as i32);
                let layout = ["contiguous", "contiguous", "strided", "batched"][next(4) as usize];
                check(bits, group_size, rows, n, k, layout, next(1 << 30));
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 54);
}

#[test]
fn refuses_unsupported_formats_with_a_reason() {
    Device::set_default(&Device::cpu());
    let w = random::normal::<f32>(&[8, 64][..], None, None, None).unwrap();
    let (wq, scales, biases) = ops::quantize(&w, 64, 3).unwrap();
    let x = random::normal::<f32>(&[1, 64][..], None, None, None).unwrap();
    let err = cpu_backend::quantized_matmul(&x, &wq, &scales, &biases, 64, 3, Prologue::None, None).unwrap_err();
    assert!(err.to_string().contains("3-bit"), "{err}");
    let (wq, scales, biases) = ops::quantize(&w, 64, 4).unwrap();
    let wrong_k = random::normal::<f32>(&[1, 32][..], None, None, None).unwrap();
    let err = cpu_backend::quantized_matmul(&wrong_k, &wq, &scales, &biases, 64, 4, Prologue::None, None).unwrap_err();
    assert!(err.to_string().contains("disagree"), "{err}");
}

/// The fused forms equal MLX's ops: `r + qmm(fast::rms_norm(x, w))` and
/// `r + qmm(silu(gate) · up)`, within the int8 bound taken on the transformed `x`.
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
        let fused = cpu_backend::quantized_matmul(input, &wq, &scales, &biases, gs, bits, prologue, Some(&residual)).unwrap();
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
                assert!((a - b).abs() <= case.bound(r, j) + 1e-5 * b.abs(), "{name} [{r},{j}]: {a} vs MLX {b}");
            }
        }
    }
}

/// `mlxbar doctor` names the kernel this machine runs and what auto picks.
#[cfg(target_arch = "x86_64")]
#[test]
fn doctor_names_the_kernels() {
    let line = mlxbar::doctor::report().lines().find(|l| l.starts_with("kernels")).unwrap().to_string();
    let simd = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    assert!(line.contains(if simd { "AVX2+FMA" } else { "portable scalar" }), "{line}");
    assert!(line.contains("decode attention: mlxbar's"), "{line}");
}
