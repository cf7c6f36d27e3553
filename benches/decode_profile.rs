//! Where a decode step of the default model spends its time on this machine.
//!
//! `cargo bench --bench decode_profile` prints the CPU, the quantized kernel in use, the
//! machine's copy bandwidth and what one MLX op costs, then for each weight format
//! (float32, and native: the GGUF's 4-bit weights through mlxbar's CPU kernel):
//! - decode steps through `Model::decode`, the server's path, for 1, 4 and 8 sequences of
//!   different lengths (continuous batching; the row counts timed in turns, best of six
//!   rounds each), the MLX ops a step runs (by kind, at one row), and batching's
//!   efficiency (8 rows' tokens per second over one row's);
//! - the physical limit at one row: bytes read per token / copy bandwidth, as ms and tok/s,
//!   and how far the step is from it;
//! - the step taken apart, at each row count: each projection's matmuls over the 30 layers
//!   (random weights of the same shapes and format), the head, the attention op (mlxbar's
//!   CPU op: RoPE, the cache write and attention, 30 layers), and what is left: the
//!   embedding (for the float32 format also the final norm and the q|k|v split) and MLX's
//!   graph building and dispatch for every op;
//! - sampling one token from the vocabulary's logits, greedy, at the API's defaults
//!   (temperature 1, top_p 1) and with a nucleus (top_p 0.9);
//! - a step's quantized projections through each kernel this CPU runs (AMX, AVX512-VNNI,
//!   AVX-VNNI, AVX2), called directly, at 1, 8 and 64 rows.
mod common;

use std::time::Instant;

use mlx_rs::{ops, random, Device, Dtype};
use mlxbar::engine::batch_kv::BatchKv;
use mlxbar::engine::cpu_backend::affine_qmm::{self, Kernel};
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

/// Default model shapes: hidden, kv width, intermediate, vocabulary, layers, heads, kv heads,
/// head_dim.
const H: i32 = 576;
const KV: i32 = 192;
const FF: i32 = 1536;
const VOCAB: i32 = 49152;
const LAYERS: usize = 30;
const HEADS: i32 = 9;
const KV_HEADS: i32 = 3;
const HEAD_DIM: i32 = 64;

impl StepMatmuls {
    fn new(format: WeightFormat) -> StepMatmuls {
        let w = |r: i32, c: i32, bits: i32| {
            let a = random::normal::<f32>(&[r, c][..], 0.0, 0.05, None).unwrap();
            let w = if format == WeightFormat::Native {
                // As the GGUF's Q4_1 (layers) and Q8_0 (the head) load: groups of 32,
                // float16 scales and biases.
                let (wq, scales, biases) = ops::quantize(&a, 32, bits).unwrap();
                let (scales, biases) = (scales.as_dtype(Dtype::Float16).unwrap(), biases.as_dtype(Dtype::Float16).unwrap());
                let w =
                    Weight::Quantized(Quantized::new(wq, scales, Some(biases), QuantSpec::affine(32, bits)).unwrap()).for_cpu().unwrap();
                // In strips where the server loads them so (AVX512-VNNI without AMX).
                match w {
                    Weight::Quantized(q) => Weight::Quantized(q.into_strips().unwrap()),
                    dense => dense,
                }
            } else {
                Weight::dense(a).unwrap()
            };
            mlx_rs::transforms::eval(w.arrays()).unwrap();
            w
        };
        let blocks = (0..LAYERS).map(|_| [w(H + 2 * KV, H, 4), w(H, H, 4), w(2 * FF, H, 4), w(H, FF, 4)]).collect();
        StepMatmuls { blocks, head: w(VOCAB, H, 8) }
    }

    /// Milliseconds for each projection over all layers at `rows` rows (q|k|v, o, gate|up,
    /// down), then the head.
    fn time(&self, rows: i32, iters: usize) -> [f64; 5] {
        let x = random::normal::<f32>(&[rows, H][..], None, None, None).unwrap();
        let xf = random::normal::<f32>(&[rows, FF][..], None, None, None).unwrap();
        let mut out = [0.0; 5];
        for (kind, ms) in out.iter_mut().take(4).enumerate() {
            let input = if kind == 3 { &xf } else { &x };
            *ms = time_ms(iters, || {
                let outs: Vec<_> = self.blocks.iter().map(|b| b[kind].apply(input).unwrap()).collect();
                mlx_rs::transforms::eval(&outs).unwrap();
            });
        }
        out[4] = time_ms(iters, || self.head.apply(&x).unwrap().eval().unwrap());
        out
    }
}

/// Milliseconds for a step's projections (30 layers of 4-bit q|k|v, o, gate|up and down,
/// the 8-bit head; groups of 32, float16 scales) at `rows` rows through each quantized
/// kernel this CPU runs, called directly (no MLX graph): the instruction sets side by side,
/// and AVX512-VNNI with the weights in strips (as the server loads them there).
fn kernels_ms(rows: usize, iters: usize) -> Vec<(String, f64)> {
    let mut state = 0x9e37_79b9_u32;
    let mut words = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state
            })
            .collect()
    };
    let (h, kv, ff, vocab) = (H as usize, KV as usize, FF as usize, VOCAB as usize);
    let shapes: Vec<(usize, usize, u32)> =
        (0..LAYERS).flat_map(|_| [(h + 2 * kv, h, 4), (h, h, 4), (2 * ff, h, 4), (h, ff, 4)]).chain([(vocab, h, 8)]).collect();
    let held: Vec<(Vec<u32>, Vec<half::f16>)> =
        shapes.iter().map(|&(n, k, bits)| (words(n * k * bits as usize / 32), vec![half::f16::from_f32(0.01); n * k / 32])).collect();
    let x: Vec<f32> = (0..rows * ff).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
    let mut out = vec![0f32; rows * vocab];
    let in_strips: Vec<(Vec<u32>, Vec<half::f16>)> = shapes
        .iter()
        .zip(&held)
        .map(|(&(n, k, bits), (packed, scales))| {
            let (p, s, _) = affine_qmm::strips::repack(packed, scales, scales, (n, k, 32, bits as usize));
            (p, s)
        })
        .collect();
    let mut run = |kernel: Kernel, strips: bool| {
        time_ms(iters, || {
            for ((&(n, k, bits), as_mlx), repacked) in shapes.iter().zip(&held).zip(&in_strips) {
                let (packed, scales) = if strips { repacked } else { as_mlx };
                let w = affine_qmm::Weights { packed, scales, biases: scales, n, k, group_size: 32, bits, strips };
                affine_qmm::matmul(kernel, &x[..rows * k], rows, &w, affine_qmm::Fusion::default(), &mut out[..rows * n]);
            }
        })
    };
    let mut all: Vec<(String, f64)> = affine_qmm::Kernel::available()
        .iter()
        .filter(|k| **k != affine_qmm::Kernel::Scalar)
        .map(|&kernel| (format!("{kernel:?}"), run(kernel, false)))
        .collect();
    if affine_qmm::Kernel::available().contains(&Kernel::Avx512Vnni) {
        all.push(("Avx512Vnni in strips".into(), run(Kernel::Avx512Vnni, true)));
    }
    all
}

/// Milliseconds for a step's attention through mlxbar's CPU op (one per layer: RoPE, the
/// cache write and attention, each row at `position` of its cache); None where it does not
/// run.
fn attention_ms(rows: i32, position: i32, iters: usize) -> Option<f64> {
    use mlxbar::engine::cpu_backend::{self as cpu, DecodeAttention, RopeParams};
    if !cpu::has_decode_attention() {
        return None;
    }
    let normal = |shape: &[i32]| {
        let a = random::normal::<f32>(shape, None, None, None).unwrap();
        a.eval().unwrap();
        a
    };
    let qkv = normal(&[1, rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM]);
    let caches: Vec<_> = (0..LAYERS)
        .map(|_| (normal(&[rows, KV_HEADS, position + 1, HEAD_DIM]), normal(&[rows, KV_HEADS, position + 1, HEAD_DIM])))
        .collect();
    let positions = mlx_rs::Array::from_slice(&vec![position; rows as usize], &[rows]);
    let rope = RopeParams { dims: HEAD_DIM, traditional: false, base: 100000.0, position_scale: 1.0, input_scale: 1.0 };
    Some(time_ms(iters, || {
        let outs: Vec<_> = caches
            .iter()
            .map(|(keys, values)| {
                let a = DecodeAttention {
                    qkv: &qkv,
                    step: cpu::AttentionStep {
                        keys,
                        values,
                        positions: &positions,
                        heads: HEADS,
                        q_norm: None,
                        k_norm: None,
                        eps: 1e-5,
                        rope,
                        periods: None,
                        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    },
                };
                cpu::decode_attention(&a).unwrap()
            })
            .collect();
        mlx_rs::transforms::eval(&outs).unwrap();
    }))
}

/// Milliseconds to pick one token from a vocabulary's logits: greedy, at the API's defaults
/// (temperature 1, top_p 1, no top_k), and with a nucleus (top_p 0.9).
fn sampling_ms() -> [f64; 3] {
    use mlxbar::engine::sampling::{argmax, Sampler, SamplingParams};
    let logits: Vec<f32> = (0..VOCAB).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let greedy = time_ms(200, || {
        std::hint::black_box(argmax(&logits));
    });
    let timed = |top_p: f32| {
        let mut sampler = Sampler::new(SamplingParams { seed: Some(1), top_p, ..Default::default() });
        time_ms(50, || {
            std::hint::black_box(sampler.sample(&logits));
        })
    };
    [greedy, timed(1.0), timed(0.9)]
}

/// The ops MLX runs for the lazy `output` (from `mlx_print_graph`), by primitive: the
/// total and each name's count, most frequent first.
fn ops_of(output: &mlx_rs::Array) -> (usize, Vec<(String, usize)>) {
    let path = std::env::temp_dir().join(format!("mlxbar-graph-{}.txt", std::process::id()));
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: the file is opened, written by MLX and closed here; the namer and the vector
    // are made and freed here; `output` is alive for the call.
    unsafe {
        let f = libc::fopen(c_path.as_ptr(), c"w".as_ptr());
        assert!(!f.is_null(), "cannot write {}", path.display());
        let namer = mlx_sys::mlx_node_namer_new();
        let outputs = mlx_sys::mlx_vector_array_new_data(&output.as_ptr(), 1);
        let rc = mlx_sys::mlx_print_graph(f.cast(), namer, outputs);
        mlx_sys::mlx_vector_array_free(outputs);
        mlx_sys::mlx_node_namer_free(namer);
        libc::fclose(f);
        assert_eq!(rc, 0, "mlx_print_graph failed");
    }
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    // After the "Inputs:" and "Outputs:" lines, one line per op: its primitive's name first.
    for line in text.lines().skip(2) {
        *counts.entry(line.split_whitespace().next().unwrap_or("").to_string()).or_default() += 1;
    }
    let mut by_name: Vec<(String, usize)> = counts.into_iter().collect();
    by_name.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    (by_name.iter().map(|(_, n)| n).sum(), by_name)
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
    // 64 rows: a prefill chunk's shape, where AMX's tiles take over (1 and 8 rows are
    // decode's, where Amx hands the product to the AVX512-VNNI kernel).
    println!("a step's quantized projections by kernel, called directly (ms; 1 row / 8 rows / 64 rows):");
    let (one, eight, many) = (kernels_ms(1, 20), kernels_ms(8, 10), kernels_ms(64, 3));
    let avx2 = |set: &[(String, f64)]| set.iter().find(|(k, _)| k == "Avx2").map_or(f64::NAN, |(_, ms)| *ms);
    for (((kernel, a), (_, b)), (_, c)) in one.iter().zip(&eight).zip(&many) {
        println!(
            "  {kernel:<21}{a:>8.2}{b:>8.2}{c:>8.2}   ({:.2}x / {:.2}x / {:.2}x AVX2's speed)",
            avx2(&one) / a,
            avx2(&eight) / b,
            avx2(&many) / c
        );
    }
    let [greedy, sampled, nucleus] = sampling_ms();
    println!("sampling from {VOCAB} logits: greedy {greedy:.3} ms, temperature 1 / top_p 1 {sampled:.3} ms, top_p 0.9 {nucleus:.3} ms");
    const ROWS: [usize; 3] = [1, 4, 8];
    for format in [WeightFormat::Float32, WeightFormat::Native] {
        let (model, codec, info) = loader::load(&path, format)?;
        let prompt = codec.encode("<|im_start|>user\nTell me a story about the sea.<|im_end|>\n<|im_start|>assistant\n")?;
        // Decode steps of 1, 4 and 8 sequences with prompts of different lengths, and the
        // ops one step runs.
        let mut batches = vec![];
        for n in ROWS {
            let mut kv = BatchKv::default();
            for i in 0..n {
                let mut cache = model.new_cache();
                model.forward(&prompt[..prompt.len() - i], &mut cache)?;
                kv.join(i as u64, cache)?;
            }
            batches.push((vec![prompt[0]; n], kv));
        }
        // The row counts take turns, best of the rounds for each: batching's efficiency is
        // a ratio of two of them, and this machine's speed moves from minute to minute.
        let mut steps = vec![f64::MAX; ROWS.len()];
        for _ in 0..6 {
            for ((tokens, kv), best) in batches.iter_mut().zip(&mut steps) {
                *best = best.min(time_ms(5, || drop(model.decode(tokens, kv).unwrap())));
            }
        }
        let mut ops = vec![];
        for (tokens, kv) in &mut batches {
            let graph = model.decode_graph(tokens, kv)?;
            ops.push(ops_of(&graph));
            graph.eval()?;
        }
        drop(model);
        let matmuls = StepMatmuls::new(format);
        // A decode step reads every weight once (the tied head reads the whole embedding).
        let bytes = info.weight_bytes as f64;
        let floor = bytes / bandwidth * 1e3;
        println!("\n{format:?} weights, {:.0} MB held = bytes read per token:", bytes / 1e6);
        println!("  bandwidth floor, 1 row: {floor:.2} ms = {:.1} tok/s (bytes read per token / copy bandwidth)", 1e3 / floor);
        println!("  {:<28}{:>10}{:>10}{:>10}", "ms per decode step", "1 row", "4 rows", "8 rows");
        let rows_of = |name: &str, cells: &[f64]| {
            print!("  {name:<28}");
            cells.iter().for_each(|c| print!("{c:>10.2}"));
            println!();
        };
        rows_of("step (Model::decode)", &steps);
        print!("  {:<28}", "  MLX ops in the step");
        ops.iter().for_each(|o| print!("{:>10}", o.0));
        println!();
        let parts: Vec<[f64; 5]> = ROWS.iter().map(|&n| matmuls.time(n as i32, 10)).collect();
        let names = ["  q|k|v matmuls (30 layers)", "  o matmuls", "  gate|up matmuls", "  down matmuls", "  head matmul"];
        for (i, name) in names.iter().enumerate() {
            rows_of(name, &parts.iter().map(|p| p[i]).collect::<Vec<_>>());
        }
        let at = prompt.len() as i32 + 32;
        let attention: Vec<Option<f64>> = ROWS.iter().map(|&n| attention_ms(n as i32, at, 10)).collect();
        if attention.iter().all(Option::is_some) {
            let attention: Vec<f64> = attention.into_iter().flatten().collect();
            rows_of(&format!("  attention op ({at} positions)"), &attention);
            let rest: Vec<f64> = (0..ROWS.len()).map(|i| steps[i] - parts[i].iter().sum::<f64>() - attention[i]).collect();
            rows_of("  the rest (ops + dispatch)", &rest);
        }
        let kinds: Vec<String> = ops[0].1.iter().map(|(name, n)| format!("{name} {n}")).collect();
        println!("  a 1-row step's ops by kind: {}", kinds.join(", "));
        println!(
            "  1 row: {:.1} tok/s, {:.1}x the floor; 8 rows: {:.1} tok/s aggregate, {:.2}x one row's rate (batching efficiency)",
            1e3 / steps[0],
            steps[0] / floor,
            8e3 / steps[2],
            steps[0] * 8.0 / steps[2]
        );
    }
    Ok(())
}
