//! Where a decode step of the default model spends its time on this machine.
//!
//! `cargo bench --bench decode_profile` prints the CPU, the quantized kernel in use, the
//! machine's copy bandwidth and what one MLX op costs, then for each weight format
//! (float32, and native: the GGUF's 4-bit weights through mlxbar's CPU kernel):
//! - the full model step at batch 1 (embedding, 30 blocks, head, sampling copy);
//! - the physical limit: bytes read per token / copy bandwidth, as ms and tok/s, and how
//!   far the step is from it;
//! - the same matmuls alone with random weights of the same shapes and format, and the head
//!   alone (vocab x hidden, the largest single matrix);
//! - batched decode steps (1, 4, 8 sequences of different lengths, continuous batching's
//!   path) and the matmuls alone at 8 rows.
//!
//! The gap between the full step and its matmuls is MLX's per-op overhead and the
//! non-matmul ops.
mod common;

use std::time::Instant;

use mlx_rs::{ops, random, Device};
use mlxbar::engine::batch_kv::BatchKv;
use mlxbar::engine::model::linear::{Quantized, Weight};
use mlxbar::engine::model::quantized::QuantSpec;
use mlxbar::engine::{loader, WeightFormat};

fn time_ms(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e3 / iters as f64
}

/// A decode step's projections for `rows` sequences, with weights of the default model's
/// shapes held as `format` holds them: q|k|v, o, gate|up, down per layer, then the head.
struct StepMatmuls {
    blocks: Vec<[Weight; 4]>,
    head: Weight,
}

impl StepMatmuls {
    const SHAPE: (i32, i32, i32, i32, usize) = (576, 192, 1536, 49152, 30);

    fn new(format: WeightFormat) -> StepMatmuls {
        let (h, kv, ff, vocab, layers) = Self::SHAPE;
        let w = |r: i32, c: i32| {
            let a = random::normal::<f32>(&[r, c][..], 0.0, 0.05, None).unwrap();
            let w = if format == WeightFormat::Native {
                // As the GGUF's Q4_1 loads: 4 bits in groups of 32.
                let (wq, scales, biases) = ops::quantize(&a, 32, 4).unwrap();
                Weight::Quantized(Quantized::new(wq, scales, Some(biases), QuantSpec::affine(32, 4)).unwrap()).for_cpu().unwrap()
            } else {
                Weight::dense(a).unwrap()
            };
            mlx_rs::transforms::eval(w.arrays()).unwrap();
            w
        };
        let blocks = (0..layers).map(|_| [w(h + 2 * kv, h), w(h, h), w(2 * ff, h), w(h, ff)]).collect();
        StepMatmuls { blocks, head: w(vocab, h) }
    }

    fn time(&self, rows: i32, iters: usize) -> f64 {
        let (h, _, ff, _, _) = Self::SHAPE;
        let x = random::normal::<f32>(&[rows, h][..], None, None, None).unwrap();
        let xf = random::normal::<f32>(&[rows, ff][..], None, None, None).unwrap();
        time_ms(iters, || {
            let mut outs = vec![];
            for b in &self.blocks {
                outs.push(b[0].apply(&x).unwrap());
                outs.push(b[1].apply(&x).unwrap());
                outs.push(b[2].apply(&x).unwrap());
                outs.push(b[3].apply(&xf).unwrap());
            }
            outs.push(self.head.apply(&x).unwrap());
            mlx_rs::transforms::eval(&outs).unwrap();
        })
    }

    fn head_alone(&self) -> f64 {
        let x = random::normal::<f32>(&[1, Self::SHAPE.0][..], None, None, None).unwrap();
        time_ms(20, || self.head.apply(&x).unwrap().eval().unwrap())
    }
}

/// What one MLX op costs on the CPU stream: a chain of 200 small adds, evaluated at once.
fn per_op_us() -> f64 {
    let x = random::normal::<f32>(&[1, 576][..], None, None, None).unwrap();
    x.eval().unwrap();
    let one = mlx_rs::array!(1e-3f32);
    time_ms(10, || {
        let mut y = x.clone();
        for _ in 0..200 {
            y = y.add(&one).unwrap();
        }
        y.eval().unwrap();
    }) * 1e3
        / 200.0
}

fn main() -> anyhow::Result<()> {
    Device::set_default(&Device::cpu());
    let path = mlxbar::model_store::ensure_default_model()?;
    let bandwidth = common::copy_bandwidth();
    let machine = mlxbar::bench::machine::Machine::this();
    println!("CPU: {}, {} cores", machine.chip, machine.cores);
    println!(
        "quantized kernel: {}; memory copy bandwidth {:.1} GB/s; one MLX op on the CPU stream ~{:.1} us",
        mlxbar::engine::cpu_backend::quantized_kernel(4, 32).unwrap_or("none"),
        bandwidth / 1e9,
        per_op_us()
    );
    for format in [WeightFormat::Float32, WeightFormat::Native] {
        let (model, codec, info) = loader::load(&path, format)?;
        let prompt = codec.encode("<|im_start|>user\nTell me a story about the sea.<|im_end|>\n<|im_start|>assistant\n")?;
        let mut cache = model.new_cache();
        let logits = model.forward(&prompt, &mut cache)?;
        let mut next = mlxbar::engine::sampling::argmax(logits.as_slice::<f32>());
        let step = time_ms(30, || {
            let l = model.forward(&[next], &mut cache).unwrap();
            next = mlxbar::engine::sampling::argmax(l.as_slice::<f32>());
        });
        // Batches of 1, 4 and 8 sequences with prompts of different lengths.
        let mut batched = vec![];
        for n in [1usize, 4, 8] {
            let mut kv = BatchKv::default();
            for i in 0..n {
                let mut cache = model.new_cache();
                model.forward(&prompt[..prompt.len() - i], &mut cache)?;
                kv.join(i as u64, cache)?;
            }
            let tokens = vec![next; n];
            batched.push((n, time_ms(20, || drop(model.decode(&tokens, &mut kv).unwrap()))));
        }
        drop(model);
        let matmuls = StepMatmuls::new(format);
        let (alone, alone8, head) = (matmuls.time(1, 20), matmuls.time(8, 10), matmuls.head_alone());
        // A decode step reads every weight once (the tied head reads the whole embedding).
        let bytes = info.weight_bytes as f64;
        let floor = bytes / bandwidth * 1e3;
        println!("\n{format:?} weights, {:.0} MB held = bytes read per token:", bytes / 1e6);
        println!("  decode step, 1 sequence   {step:7.2} ms = {:6.1} tok/s", 1e3 / step);
        println!("  bandwidth floor           {floor:7.2} ms = {:6.1} tok/s (bytes read per token / copy bandwidth); the step is {:.1}x the floor", 1e3 / floor, step / floor);
        println!(
            "  its matmuls alone         {alone:7.2} ms (head {vocab}x{h}: {head:.2} ms)",
            vocab = StepMatmuls::SHAPE.3,
            h = StepMatmuls::SHAPE.0
        );
        println!("  other ops + MLX overhead  {:7.2} ms ({:.0}% of the step)", step - alone, 100.0 * (step - alone) / step);
        for (n, ms) in batched {
            println!("  batched step, {n} sequences {ms:7.2} ms = {:6.1} tok/s aggregate", n as f64 * 1e3 / ms);
        }
        println!("  matmuls alone at 8 rows   {alone8:7.2} ms");
    }
    Ok(())
}
