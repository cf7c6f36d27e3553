//! Model layouts built from the one model this machine has (SmolLM2-135M-Instruct Q4_1
//! GGUF): MLX folders as mlx-community publishes them (the GGUF's own 4-bit, or
//! requantized to 4/8 bits, group 64), a Hugging Face hub-cache repo (blobs + relative
//! symlinks + refs/main), LM Studio's layout, and folders the engine must refuse. Also a
//! ~1.1B-parameter 4-bit MLX folder with seeded random weights (`scale_folder`), for
//! memory and speed figures at a size the 135M default cannot show.
//!
//! Conversions take seconds, so each is built once into cargo's per-target temp dir
//! (kept between runs; bump `FIXTURE_VERSION` when the conversion changes) and
//! hard-linked into a test's directory: replace those files, never write into them.
#![allow(dead_code)]
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use mlx_rs::{io::GgufFile, ops, Array, Device, Dtype};
use mlxbar::engine::{loader, WeightFormat};
use serde_json::json;
use sha2::{Digest, Sha256};

/// SmolLM2-135M's config.json (HF names), without quantization.
pub fn smollm2_config() -> serde_json::Value {
    json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": true, "max_position_embeddings": 8192,
        "eos_token_id": 2, "bos_token_id": 1,
    })
}

/// An MLX folder of the default model in `dir`: `None` keeps the GGUF's own Q4_1 (4-bit,
/// group 32; embedding Q8_0), `Some(bits)` requantizes every matrix to `bits`, group 64.
pub fn mlx_folder(dir: &Path, bits: Option<i32>) {
    let src = cached_mlx_folder(bits);
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let from = entry.unwrap().path();
        let to = dir.join(from.file_name().unwrap());
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
}

const FIXTURE_VERSION: u32 = 1;

fn cached_mlx_folder(bits: Option<i32>) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<Option<i32>, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(&bits) {
        return p.clone();
    }
    let name = match bits {
        None => format!("smollm2-mlx-q4_1-v{FIXTURE_VERSION}"),
        Some(b) => format!("smollm2-mlx-{b}bit-g64-v{FIXTURE_VERSION}"),
    };
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("library-fixtures");
    let dir = root.join(&name);
    if !dir.join("config.json").exists() {
        std::fs::create_dir_all(&root).unwrap();
        // Built aside and renamed: another test binary may be building it too.
        let tmp = tempfile::tempdir_in(&root).unwrap();
        gguf_to_mlx_folder(&super::model_path(), tmp.path(), bits);
        let kept = tmp.keep();
        if std::fs::rename(&kept, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&kept);
        }
    }
    built.insert(bits, dir.clone());
    dir
}

fn unpermute_rows(a: &Array, heads: i32) -> Array {
    let perm = mlxbar::engine::model::gguf::hf_row_order(a.shape()[0], heads);
    a.take_axis(Array::from_slice(&perm, &[perm.len() as i32]), 0).unwrap()
}

/// GGML tensor base name -> HF module path.
fn hf_name(base: &str) -> String {
    match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        _ => {
            let (layer, part) = base.strip_prefix("blk.").unwrap().split_once('.').unwrap();
            let hf = match part {
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                other => panic!("unexpected {other}"),
            };
            format!("model.layers.{layer}.{hf}")
        }
    }
}

/// Writes the GGUF as an MLX folder (what mlx-community's converters produce): HF tensor
/// names, q/k rows in HF order (so NeoX RoPE), quantization in config.json.
pub fn gguf_to_mlx_folder(gguf: &Path, dir: &Path, bits: Option<i32>) {
    Device::set_default(&Device::cpu());
    let g = GgufFile::load(gguf).unwrap();
    let (_, codec, _) = loader::load(gguf, WeightFormat::Float32).unwrap();
    let keys = g.array_keys().unwrap();
    let mut out: HashMap<String, Array> = HashMap::new();
    for key in keys.iter().filter(|k| k.ends_with(".weight")) {
        let base = key.strip_suffix(".weight").unwrap();
        let heads = match base.rsplit('.').next().unwrap() {
            "attn_q" => Some(9),
            "attn_k" => Some(3),
            _ => None,
        };
        let get = |suffix: &str| {
            let a = g.get_array(&format!("{base}.{suffix}")).unwrap()?;
            Some(heads.map_or(a.clone(), |h| unpermute_rows(&a, h)))
        };
        let name = hf_name(base);
        let w = get("weight").unwrap();
        let quantized = get("scales").map(|s| (s, get("biases").unwrap()));
        let Some(bits) = bits else {
            out.insert(format!("{name}.weight"), w);
            if let Some((s, b)) = quantized {
                out.insert(format!("{name}.scales"), s);
                out.insert(format!("{name}.biases"), b);
            }
            continue;
        };
        let dense = match &quantized {
            Some((s, b)) => {
                let src_bits = w.shape()[w.ndim() - 1] * 32 / (s.shape()[s.ndim() - 1] * 32);
                ops::dequantize(&w, s, b, 32, src_bits).unwrap()
            }
            None => w,
        };
        if dense.ndim() == 2 {
            let (wq, s, b) = ops::quantize(&dense, 64, bits).unwrap();
            out.insert(format!("{name}.weight"), wq);
            out.insert(format!("{name}.scales"), s);
            out.insert(format!("{name}.biases"), b);
        } else {
            out.insert(format!("{name}.weight"), dense);
        }
    }
    Array::save_safetensors(out.iter().map(|(k, v)| (k.as_str(), v)), None, dir.join("model.safetensors")).unwrap();
    let mut config = smollm2_config();
    config["quantization"] = match bits {
        None => json!({"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}),
        Some(b) => json!({"group_size": 64, "bits": b}),
    };
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    codec.tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    let template = g.get_metadata_string("tokenizer.chat_template").unwrap().unwrap();
    let tc = json!({"chat_template": template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": false});
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
}

/// The commit a fixture repo's snapshot is named by (40 hex digits, like git's).
pub fn revision_of(repo: &str) -> String {
    hex::encode(Sha256::digest(repo.as_bytes()))[..40].to_string()
}

/// A hub-cache repo `models--org--name` under `root` whose snapshot `build` fills; the
/// files then move to `blobs/<sha256>` and the snapshot keeps relative symlinks, as
/// huggingface_hub lays them out; `refs/main` names the snapshot. Returns the snapshot dir.
pub fn hub_cache(root: &Path, repo: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let repo_dir = root.join(format!("models--{}", repo.replace('/', "--")));
    let rev = revision_of(repo);
    let snap = repo_dir.join("snapshots").join(&rev);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    build(&snap);
    for entry in std::fs::read_dir(&snap).unwrap() {
        let file = entry.unwrap().path();
        if !file.is_file() {
            continue;
        }
        let mut hasher = Sha256::new();
        std::io::copy(&mut std::fs::File::open(&file).unwrap(), &mut hasher).unwrap();
        let blob = hex::encode(hasher.finalize());
        std::fs::rename(&file, repo_dir.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), &file).unwrap();
    }
    std::fs::write(repo_dir.join("refs").join("main"), &rev).unwrap();
    snap
}

/// `<root>/<publisher>/<name>/<file>.gguf`, a symlink to the default GGUF (no copy).
pub fn lmstudio_gguf(root: &Path, publisher: &str, name: &str) -> PathBuf {
    let dir = root.join(publisher).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(mlxbar::model_store::DEFAULT_MODEL.file_name);
    std::os::unix::fs::symlink(super::model_path(), &file).unwrap();
    file
}

/// An empty but well-formed safetensors file (a header of `{}`).
fn empty_safetensors(path: &Path) {
    let mut b = 2u64.to_le_bytes().to_vec();
    b.extend(b"{}");
    std::fs::write(path, b).unwrap();
}

/// A folder complete but for its architecture (GPT-BigCode, which the engine lacks).
pub fn unknown_arch_folder(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({"model_type": "gpt_bigcode", "architectures": ["GPTBigCodeForCausalLM"], "n_embd": 768,
        "n_head": 12, "n_layer": 12, "n_positions": 8192, "vocab_size": 49152});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    empty_safetensors(&dir.join("model.safetensors"));
}

/// A vision-language model (LLaVA: a llama text tower plus a vision tower).
pub fn vision_folder(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
        "image_token_index": 32000, "text_config": smollm2_config(),
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24}});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    empty_safetensors(&dir.join("model.safetensors"));
}

/// A supported config with empty weights and tokenizer: cheap, and listed as runnable.
pub fn tiny_supported_folder(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), smollm2_config().to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    empty_safetensors(&dir.join("model.safetensors"));
}

/// The scale fixture's shape: TinyLlama-1.1B's (hidden 2048, MLP 5632, 22 layers, 32 query
/// heads over 4 KV heads) with the default's vocabulary and tokenizer, embeddings tied.
/// ~1.07B parameters: ~0.6 GB at 4 bits (group 64, float16 scales and biases, as
/// mlx-community publishes them), 4.3 GB as float32.
pub fn scale_config() -> serde_json::Value {
    let mut c = smollm2_config();
    for (k, v) in [("hidden_size", 2048), ("intermediate_size", 5632), ("num_hidden_layers", 22)] {
        c[k] = json!(v);
    }
    c["num_attention_heads"] = json!(32);
    c["num_key_value_heads"] = json!(4);
    c["rope_theta"] = json!(10000.0);
    c["max_position_embeddings"] = json!(2048);
    c["quantization"] = json!({"group_size": 64, "bits": 4});
    c
}

/// The parameter count of `scale_config()`.
pub fn scale_params() -> u64 {
    let c = scale_config();
    let n = |k: &str| c[k].as_u64().unwrap();
    let (h, i, heads, kv) = (n("hidden_size"), n("intermediate_size"), n("num_attention_heads"), n("num_key_value_heads"));
    let kv_dim = h / heads * kv;
    let layer = 2 * h * h + 2 * h * kv_dim + 3 * h * i + 2 * h;
    n("vocab_size") * h + n("num_hidden_layers") * layer + h
}

/// Bytes of an MLX folder's safetensors files (their JSON headers included).
pub fn safetensors_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| p.metadata().unwrap().len())
        .sum()
}

/// The scale fixture in cargo's per-target temp dir (built once, ~0.6 GB), returned in place:
/// read it, never write into it.
pub fn scale_folder() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("library-fixtures");
            let dir = root.join("scale-1b-4bit-g64-v2");
            if !dir.join("config.json").exists() {
                std::fs::create_dir_all(&root).unwrap();
                let tmp = tempfile::tempdir_in(&root).unwrap();
                build_scale_folder(tmp.path());
                let kept = tmp.keep();
                if std::fs::rename(&kept, &dir).is_err() {
                    let _ = std::fs::remove_dir_all(&kept);
                }
            }
            dir
        })
        .clone()
}

/// splitmix64: a seeded, portable stream of random words (the fixture's bytes must not
/// depend on the platform or a crate's version).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Random weights already in MLX's affine 4-bit layout (group 64): uniform 4-bit codes
/// packed 8 to a u32, and per group a float16 scale of 0.005..0.007 with bias -7.5 x scale,
/// so values spread over about +-0.05 around 0, as `quantize` makes of std-0.02 normal
/// weights. Generating the codes directly takes ~1 s; MLX's normal + quantize of 1.07B
/// values took ~100 s on 2 busy cores. One seed per tensor, so order does not matter. Shards
/// are written one per layer so at most one layer is in memory; config.json goes last:
/// its presence marks a whole folder.
fn build_scale_folder(dir: &Path) {
    Device::set_default(&Device::cpu());
    let c = scale_config();
    let n = |k: &str| c[k].as_i64().unwrap() as i32;
    let (h, i, layers) = (n("hidden_size"), n("intermediate_size"), n("num_hidden_layers"));
    let kv_dim = h / n("num_attention_heads") * n("num_key_value_heads");
    let mut seed = 0u64;
    let mut matrix = |rows: i32, cols: i32| -> (Array, Array, Array) {
        seed += 1;
        let mut rng = SplitMix(seed);
        let words = (rows * cols / 8) as usize;
        let packed = (0..words.div_ceil(2)).flat_map(|_| {
            let x = rng.next();
            [x as u32, (x >> 32) as u32]
        });
        let packed: Vec<u32> = packed.take(words).collect();
        let groups = (rows * cols / 64) as usize;
        let scales: Vec<f32> = (0..groups).map(|_| 0.005 + 0.002 * (rng.next() >> 11) as f32 / (1u64 << 53) as f32).collect();
        let biases: Vec<f32> = scales.iter().map(|s| -7.5 * s).collect();
        let f16 = |v: &[f32]| Array::from_slice(v, &[rows, cols / 64]).as_dtype(Dtype::Float16).unwrap();
        (Array::from_slice(&packed, &[rows, cols / 8]), f16(&scales), f16(&biases))
    };
    let ones = || Array::ones::<f32>(&[h]).unwrap().as_dtype(Dtype::Float16).unwrap();
    let write = |shard: &str, tensors: Vec<(String, Array)>| {
        let arrays: Vec<&Array> = tensors.iter().map(|(_, a)| a).collect();
        mlx_rs::transforms::eval(arrays).unwrap();
        Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, dir.join(shard)).unwrap();
        mlx_rs::memory::clear_cache().unwrap();
    };
    let quantized = |name: &str, (w, s, b): (Array, Array, Array)| {
        [(format!("{name}.weight"), w), (format!("{name}.scales"), s), (format!("{name}.biases"), b)]
    };
    let mut top = quantized("model.embed_tokens", matrix(n("vocab_size"), h)).to_vec();
    top.push(("model.norm.weight".into(), ones()));
    write("model-embed.safetensors", top);
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let mut t = vec![];
        for (name, rows, cols) in [
            ("self_attn.q_proj", h, h),
            ("self_attn.k_proj", kv_dim, h),
            ("self_attn.v_proj", kv_dim, h),
            ("self_attn.o_proj", h, h),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ] {
            t.extend(quantized(&format!("{p}.{name}"), matrix(rows, cols)));
        }
        t.push((format!("{p}.input_layernorm.weight"), ones()));
        t.push((format!("{p}.post_attention_layernorm.weight"), ones()));
        write(&format!("model-layer-{l:02}.safetensors"), t);
    }
    // The default's tokenizer files, as the 4-bit fixture has them.
    let small = cached_mlx_folder(Some(4));
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(small.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
}
