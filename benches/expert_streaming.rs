//! Expert streaming's trade-off on this machine: decode speed of a mixture-of-experts model
//! with every expert resident against the same model with its experts streamed through
//! caches of 100 %, 50 %, 25 % and 12.5 % of them, with the hit ratio and the bytes read
//! from the model's file per token against the floor (every expert a token needs read).
//!
//! `cargo bench --bench expert_streaming` writes a random-weight qwen3_moe in the default
//! format's shape (4-bit affine, group 32) to a temporary folder: 8 sparse layers of 64
//! experts, 8 a token, hidden 512, expert width 256 (Qwen3-30B-A3B's ratios, ~1/200 of its
//! size), then decodes 64 tokens greedily after a 16-token prompt in each mode.
//!
//! Random routers spread tokens nearly uniformly, so a cache holding a fraction f of the
//! experts hits about f of the time; trained routers are skewed and hit more. The file was
//! just written, so the warm rows' "disk" reads come from the page cache: they measure the
//! engine's cost of streaming (reads, copies, the per-layer sync). The cold rows (Linux) drop
//! the file's pages before every step, so each miss reads the disk itself.
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use mlx_rs::{ops, random, Array, Device};
use mlxbar::engine::batch_kv::BatchKv;
use mlxbar::engine::model::Model;
use mlxbar::engine::{loader, sampling::argmax, WeightFormat};

const HIDDEN: i32 = 512;
const LAYERS: i32 = 8;
const EXPERTS: i32 = 64;
const PER_TOKEN: i32 = 8;
const WIDTH: i32 = 256;
const VOCAB: i32 = 320;
const PROMPT: usize = 16;
const DECODE: usize = 64;

fn normal(shape: &[i32], scale: f32, seed: u64) -> Array {
    random::normal::<f32>(shape, None, scale, &random::key(seed).unwrap()).unwrap()
}

/// Writes the model folder: config.json, the tiny fixtures' tokenizer, model.safetensors.
fn write_model(dir: &Path) {
    let config = serde_json::json!({
        "model_type": "qwen3_moe", "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "intermediate_size": 1024,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 512, "tie_word_embeddings": true,
        "num_experts": EXPERTS, "num_experts_per_tok": PER_TOKEN, "moe_intermediate_size": WIDTH,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,
        "quantization": {"group_size": 32, "bits": 4}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny/qwen3-moe");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny.join(f), dir.join(f)).unwrap();
    }
    let mut t: HashMap<String, Array> = HashMap::new();
    let mut seed = 1;
    let quantized = |t: &mut HashMap<String, Array>, name: String, w: Array| {
        let (q, scales, biases) = ops::quantize(&w, 32, 4).unwrap();
        t.insert(format!("{name}.weight"), q);
        t.insert(format!("{name}.scales"), scales);
        t.insert(format!("{name}.biases"), biases);
    };
    t.insert("model.embed_tokens.weight".into(), normal(&[VOCAB, HIDDEN], 1.0, 0));
    t.insert("model.norm.weight".into(), Array::ones::<f32>(&[HIDDEN]).unwrap());
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        let mut next = || {
            seed += 1;
            seed
        };
        for (name, out, inp) in [("q_proj", 512, HIDDEN), ("k_proj", 256, HIDDEN), ("v_proj", 256, HIDDEN), ("o_proj", HIDDEN, 512)] {
            quantized(&mut t, format!("{p}.self_attn.{name}"), normal(&[out, inp], 0.05, next()));
        }
        for n in ["self_attn.q_norm", "self_attn.k_norm"] {
            t.insert(format!("{p}.{n}.weight"), Array::ones::<f32>(&[64]).unwrap());
        }
        for n in ["input_layernorm", "post_attention_layernorm"] {
            t.insert(format!("{p}.{n}.weight"), Array::ones::<f32>(&[HIDDEN]).unwrap());
        }
        t.insert(format!("{p}.mlp.gate.weight"), normal(&[EXPERTS, HIDDEN], 0.05, next()));
        for (name, out, inp) in [("gate_proj", WIDTH, HIDDEN), ("up_proj", WIDTH, HIDDEN), ("down_proj", HIDDEN, WIDTH)] {
            quantized(&mut t, format!("{p}.mlp.switch_mlp.{name}"), normal(&[EXPERTS, out, inp], 0.05, next()));
        }
    }
    Array::save_safetensors(t.iter().map(|(k, v)| (k.as_str(), v)), None, dir.join("model.safetensors")).unwrap();
}

struct Run {
    tok_s: f64,
    hit_ratio: Option<f64>,
    read_per_token: f64,
}

/// Decodes `DECODE` tokens after a prompt made from `seed`; figures over the decode steps only.
/// `before_step` runs ahead of each decode step, outside the timing.
fn run(model: &Model, seed: u32, before_step: &dyn Fn()) -> Run {
    let ids: Vec<u32> = (0..PROMPT as u32).map(|i| (i * 37 + 11 * seed) % VOCAB as u32).collect();
    let mut cache = model.new_cache();
    let mut next = argmax(model.forward(&ids, &mut cache).unwrap().as_slice::<f32>());
    let mut batch = BatchKv::default();
    batch.join(0, cache).unwrap();
    let before = model.expert_stats().map(|s| s.view());
    let mut secs = 0.0;
    for _ in 0..DECODE {
        before_step();
        let started = Instant::now();
        next = argmax(model.decode(&[next], &mut batch).unwrap().as_slice::<f32>());
        secs += started.elapsed().as_secs_f64();
    }
    let after = model.expert_stats().map(|s| s.view());
    let (hit_ratio, read_per_token) = match (before, after) {
        (Some(b), Some(a)) => {
            let (hits, misses) = ((a.hits - b.hits) as f64, (a.misses - b.misses) as f64);
            (Some(hits / (hits + misses)), (a.read_bytes - b.read_bytes) as f64 / DECODE as f64)
        }
        _ => (None, 0.0),
    };
    Run { tok_s: DECODE as f64 / secs, hit_ratio, read_per_token }
}

fn main() {
    Device::set_default(&Device::cpu());
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let file_bytes = std::fs::metadata(dir.path().join("model.safetensors")).unwrap().len();
    let machine = mlxbar::bench::machine::Machine::this();
    println!("CPU: {}, {} cores", machine.chip, machine.cores);
    println!(
        "model: qwen3_moe, {LAYERS} sparse layers x {EXPERTS} experts ({PER_TOKEN} a token), hidden {HIDDEN}, expert width {WIDTH}, 4-bit; file {:.0} MB",
        file_bytes as f64 / 1e6
    );
    let load = |cache: Option<u64>| loader::load_reporting(dir.path(), "bench", WeightFormat::Auto, cache, &|_| {}).unwrap().0;

    let resident = load(None);
    let resident_bytes = resident.nbytes();
    let base = run(&resident, 1, &|| {});
    drop(resident);
    let probe = load(Some(u64::MAX));
    let x = probe.expert_stats().unwrap().view();
    drop(probe);
    let all = x.expert_bytes * x.total_experts;
    let disk_per_expert = (file_bytes as f64 * 0.98) / x.total_experts as f64;
    let floor = PER_TOKEN as f64 * LAYERS as f64 * disk_per_expert;
    println!(
        "resident: {:.1} MB of weights, {:.1} tok/s; experts: {} of {:.0} KB in memory ({:.1} MB together), floor {:.2} MB read a token ({PER_TOKEN} x {LAYERS} experts)",
        resident_bytes as f64 / 1e6,
        base.tok_s,
        x.total_experts,
        x.expert_bytes as f64 / 1e3,
        all as f64 / 1e6,
        floor / 1e6
    );
    // A resident decode step reads every non-expert weight and the experts its token routes to.
    let bandwidth = common::copy_bandwidth();
    let step_bytes = resident_bytes as f64 - all as f64 + (PER_TOKEN * LAYERS) as f64 * x.expert_bytes as f64;
    let floor_ms = step_bytes / bandwidth * 1e3;
    println!(
        "resident step: {:.2} ms against a floor of {:.2} ms ({:.1} MB read a step at {:.1} GB/s copy bandwidth): {:.1}x the floor",
        1e3 / base.tok_s,
        floor_ms,
        step_bytes / 1e6,
        bandwidth / 1e9,
        1e3 / base.tok_s / floor_ms
    );
    println!("{:>8}  {:>9}  {:>8}  {:>9}  {:>13}  {:>9}", "cache", "MB", "tok/s", "x resident", "read MB/token", "x floor");
    let row = |label: &str, budget: u64, r: &Run| {
        println!(
            "{label:>8}  {:>9.1}  {:>8.1}  {:>9.2}  {:>13.2}  {:>9.2}   hit ratio {:.2}",
            budget as f64 / 1e6,
            r.tok_s,
            r.tok_s / base.tok_s,
            r.read_per_token / 1e6,
            r.read_per_token / floor,
            r.hit_ratio.unwrap_or(0.0)
        );
    };
    for share in [1.0, 0.5, 0.25, 0.125] {
        let budget = (all as f64 * share) as u64;
        let model = load(Some(budget));
        // A pass on another prompt warms the cache as a running server's would be; the
        // measured one does not repeat its routing.
        run(&model, 2, &|| {});
        row(&format!("{:>7.1}%", share * 100.0), budget, &run(&model, 1, &|| {}));
    }
    // The same reads from the disk itself: the file's pages dropped from the page cache
    // before every step, as for a model far larger than memory.
    let file = dir.path().join("model.safetensors");
    if evict(&file) {
        for share in [0.25, 0.125] {
            let budget = (all as f64 * share) as u64;
            let model = load(Some(budget));
            run(&model, 2, &|| {});
            row(&format!("{:>6.1}%c", share * 100.0), budget, &run(&model, 1, &|| assert!(evict(&file))));
        }
        println!("(c: cold, every expert read from the disk: the file's pages dropped before each step)");
    } else {
        println!("(no cold rows: the page cache cannot be dropped for one file on this system)");
    }
}

/// Drops `path`'s pages from the page cache (Linux's `posix_fadvise`), so that the next read
/// of any expert comes from the disk; false where that cannot be done.
fn evict(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::File::open(path) else { return false };
        // Written pages must reach the disk before they can be dropped.
        if file.sync_all().is_err() {
            return false;
        }
        // SAFETY: `file` is open for the whole call; offset 0 and length 0 name the whole
        // file, and the advice only drops clean cached pages, which later reads fetch again.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}
