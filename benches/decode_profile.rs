//! Where a decode step of the default model spends its time on this machine.
//!
//! `cargo bench --bench decode_profile` prints, per decode step (batch 1):
//! - the full model step (embedding, 30 blocks, head, sampling copy);
//! - the same matmuls alone, with float32 weights of the same shapes (what BLAS costs);
//! - the head alone (vocab x hidden, the largest single matrix);
//! - the memory traffic floor: weight bytes / measured copy bandwidth.
//!
//! - batched decode steps (8 sequences of different lengths, continuous batching's
//!   path) and the matmuls alone at that batch size.
//!
//! The gap between the full step and its matmuls is MLX's per-op overhead and the
//! non-matmul ops.
use std::time::Instant;

use mlx_rs::{ops, random, Array, Device};
use mlxbar::engine::batch_kv::BatchKv;
use mlxbar::engine::{loader, WeightFormat};

fn time_ms(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e3 / iters as f64
}

fn main() -> anyhow::Result<()> {
    Device::set_default(&Device::cpu());
    let path = mlxbar::model_store::ensure_default_model()?;
    let formats = [WeightFormat::Float32, WeightFormat::Native];
    let mut float32_step = 0.0;
    let mut batched = vec![];
    for format in formats {
        let (model, codec, info) = loader::load(&path, format)?;
        let prompt = codec.encode("<|im_start|>user\nTell me a story about the sea.<|im_end|>\n<|im_start|>assistant\n")?;
        let mut cache = model.new_cache();
        let logits = model.forward(&prompt, &mut cache)?;
        let mut next = mlxbar::engine::sampling::argmax(logits.as_slice::<f32>());
        let iters = if format == WeightFormat::Float32 { 40 } else { 5 };
        let step = time_ms(iters, || {
            let l = model.forward(&[next], &mut cache).unwrap();
            next = mlxbar::engine::sampling::argmax(l.as_slice::<f32>());
        });
        if format == WeightFormat::Float32 {
            float32_step = step;
            // Batches of 1, 4 and 8 sequences with prompts of different lengths.
            for n in [1usize, 4, 8] {
                let mut kv = BatchKv::default();
                for i in 0..n {
                    let mut cache = model.new_cache();
                    model.forward(&prompt[..prompt.len() - i], &mut cache)?;
                    kv.join(i as u64, cache)?;
                }
                let tokens = vec![next; n];
                let ms = time_ms(20, || {
                    model.decode(&tokens, &mut kv).unwrap();
                });
                batched.push((n, ms));
            }
        }
        println!(
            "{:<8} weights ({:>4} MB): decode step {step:7.2} ms = {:6.1} tok/s",
            format!("{format:?}"),
            info.weight_bytes / 1_000_000,
            1e3 / step
        );
    }

    // The same matmuls with random float32 weights: q|k|v, o, gate|up, down per layer, then the head.
    let (h, kv, ff, vocab, layers) = (576, 192, 1536, 49152, 30);
    let w = |r: i32, c: i32| random::normal::<f32>(&[r, c][..], None, None, None).unwrap();
    let blocks: Vec<[Array; 4]> = (0..layers).map(|_| [w(h + 2 * kv, h), w(h, h), w(2 * ff, h), w(h, ff)]).collect();
    let head = w(vocab, h);
    mlx_rs::transforms::eval(blocks.iter().flatten().chain([&head]))?;
    // A step's matmuls for `rows` sequences (the weights as the model holds them, [out, in]).
    let step_matmuls = |rows: i32, iters: usize| {
        let x = random::normal::<f32>(&[rows, h][..], None, None, None).unwrap();
        let xf = random::normal::<f32>(&[rows, ff][..], None, None, None).unwrap();
        time_ms(iters, || {
            let mut outs = vec![];
            for b in &blocks {
                outs.push(ops::matmul(&x, b[0].t()).unwrap());
                outs.push(ops::matmul(&x, b[1].t()).unwrap());
                outs.push(ops::matmul(&x, b[2].t()).unwrap());
                outs.push(ops::matmul(&xf, b[3].t()).unwrap());
            }
            outs.push(ops::matmul(&x, head.t()).unwrap());
            mlx_rs::transforms::eval(&outs).unwrap();
        })
    };
    let matmuls = step_matmuls(1, 20);
    let matmuls8 = step_matmuls(8, 10);
    let x = random::normal::<f32>(&[1, h][..], None, None, None)?;
    let head_only = time_ms(20, || ops::matmul(&x, head.t()).unwrap().eval().unwrap());
    let bytes: usize = blocks.iter().flatten().chain([&head]).map(|a| a.nbytes()).sum();

    // Copy bandwidth: read + write of a 256 MB buffer.
    let big = vec![1u8; 256 << 20];
    let mut dst = vec![0u8; 256 << 20];
    let copy_ms = time_ms(5, || dst.copy_from_slice(&big));
    let gbps = 2.0 * big.len() as f64 / (copy_ms / 1e3) / 1e9;
    let floor = bytes as f64 / (gbps * 1e9) * 1e3;

    println!("matmuls alone (float32, same shapes, {} MB): {matmuls:7.2} ms", bytes / 1_000_000);
    println!("  of which the head ({vocab}x{h}):           {head_only:7.2} ms");
    println!("memory copy bandwidth: {gbps:.1} GB/s -> reading the weights once takes >= {floor:.2} ms");
    println!(
        "float32 step = {:.0}% matmuls, {:.0}% other ops and MLX overhead ({:.2} ms)",
        100.0 * matmuls / float32_step,
        100.0 * (float32_step - matmuls) / float32_step,
        float32_step - matmuls
    );
    for (n, ms) in batched {
        println!("batched decode step, {n} sequences: {ms:7.2} ms = {:6.1} tok/s aggregate", n as f64 * 1e3 / ms);
    }
    println!("matmuls alone at 8 rows (float32):            {matmuls8:7.2} ms");
    Ok(())
}
