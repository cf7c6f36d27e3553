//! One path -> a [`ModelEntry`]: a model folder from its `config.json` and safetensors
//! headers, a GGUF from its header. No tensor is read, so inspecting costs milliseconds
//! however large the model.
//!
//! "Runnable" is decided by the engine's own parsers (`Arch::parse`, `from_hf_config`,
//! `config_from_header`, the header checks in `validate`), so the library never offers a
//! model the loader would refuse for a reason visible in its files.
//!
//! Every file is opened through [`files`], so a FIFO or socket named like a model file is
//! refused rather than waited on.
use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::Path;

use anyhow::Context;

use crate::engine::model::config::{from_hf_config, Arch, ModelConfig, QuantMode, QuantizationConfig};
use crate::engine::model::gguf::config_from_header;
use crate::engine::model::validate::{self, GgufSummary, GgufTensorInfo};

use super::entry::{ExpertParts, ModelEntry, ModelFormat, ModelSource, Quantization, Shape, WeightPart};
use super::files;

/// A `.gguf` file or a folder with a `config.json`; None for anything else.
pub fn inspect(path: &Path) -> Option<ModelEntry> {
    if path.is_dir() {
        path.join("config.json").is_file().then(|| folder(path))
    } else if is_gguf(path) {
        Some(gguf(path))
    } else {
        None
    }
}

pub fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

fn blank(id: String, path: &Path, format: ModelFormat) -> ModelEntry {
    ModelEntry {
        id,
        path: path.to_path_buf(),
        format,
        source: ModelSource::Path,
        revision: None,
        architecture: None,
        parameters: None,
        quantization: None,
        size_bytes: 0,
        context_length: None,
        chat_template: false,
        shape: None,
        weight_parts: vec![],
        experts: None,
        runnable: true,
        unsupported_reason: None,
    }
}

fn name_of(path: &Path, stem: bool) -> String {
    let name = if stem { path.file_stem() } else { path.file_name() };
    name.map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

/// An MLX / Hugging Face folder.
pub fn folder(dir: &Path) -> ModelEntry {
    let mut e = blank(name_of(dir, false), dir, ModelFormat::Mlx);
    let weights = crate::engine::model::hf::safetensors_files(dir).unwrap_or_default();
    e.size_bytes = weights.iter().filter_map(|p| p.metadata().ok()).map(|m| m.len()).sum();
    e.chat_template = folder_has_chat_template(dir);

    let quant = match files::read_text(&dir.join("config.json")) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            e.refuse("no config.json");
            None
        }
        Err(err) => {
            e.refuse(format!("config.json: {err}"));
            None
        }
        Ok(text) => read_config(&mut e, &text),
    };
    if weights.is_empty() {
        e.refuse("no *.safetensors weights");
    }
    for missing in missing_shards(dir) {
        e.refuse(format!("missing weight shard {missing} (listed in model.safetensors.index.json)"));
    }
    let mut shapes = BTreeMap::new();
    for f in &weights {
        match check_safetensors(f) {
            Ok(summary) => shapes.extend(summary.ranges.into_iter().map(|(name, r)| {
                let shape = summary.shapes.get(&name).cloned().unwrap_or_default();
                (name, Tensor { shape, dtype: r.dtype })
            })),
            Err(err) => e.refuse(format!("{err:#}")),
        }
    }
    match folder_parts(&shapes, quant.as_ref()) {
        Ok(parts) => e.weight_parts = parts,
        Err(err) => e.refuse(format!("{err:#}")),
    }
    e.experts = expert_parts(&dir.join("config.json"), &shapes, quant.as_ref());
    if !dir.join("tokenizer.json").is_file() {
        e.refuse("no tokenizer.json");
    }
    e
}

/// `validate::safetensors_file`, opened without blocking.
fn check_safetensors(file: &Path) -> anyhow::Result<validate::SafetensorsSummary> {
    let (reader, len) = open_model_file(file)?;
    validate::safetensors(reader, len).with_context(|| file.display().to_string())
}

fn open_model_file(file: &Path) -> anyhow::Result<(BufReader<std::fs::File>, u64)> {
    let f = files::open_regular(file).with_context(|| format!("cannot open model file {}", file.display()))?;
    let len = f.metadata().with_context(|| format!("cannot stat {}", file.display()))?.len();
    Ok((BufReader::with_capacity(1 << 16, f), len))
}

/// Fills `e` from config.json; returns its quantization (with per-module overrides).
fn read_config(e: &mut ModelEntry, text: &str) -> Option<QuantizationConfig> {
    let json: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(err) => {
            e.refuse(format!("config.json: {err}"));
            return None;
        }
    };
    e.architecture = json.get("model_type").and_then(|v| v.as_str()).map(str::to_string);
    // A vision model's config may name a supported text tower; refuse it for what it is,
    // except Gemma 3's, whose text model the engine runs alone (its vision tower unread).
    let gemma3 = json.get("model_type").and_then(|v| v.as_str()) == Some("gemma3");
    if let Some(why) = vision_parts(&json).filter(|_| !gemma3) {
        e.refuse(why);
        return None;
    }
    let Some(arch) = e.architecture.clone() else {
        e.refuse("config.json has no model_type");
        return None;
    };
    if let Err(err) = Arch::parse(&arch) {
        e.refuse(err.to_string());
        return None;
    }
    match from_hf_config(text) {
        Ok((cfg, quant)) => {
            fill_from_config(e, &cfg);
            e.parameters = Some(parameter_count(&cfg));
            e.quantization = quant.as_ref().map(|q| Quantization {
                bits: q.default.bits as u32,
                group_size: q.default.group_size as u32,
                mode: q.default.mode,
            });
            quant
        }
        Err(err) => {
            e.refuse(format!("{err:#}"));
            None
        }
    }
}

/// A safetensors tensor's shape and dtype (as the header names it).
struct Tensor {
    shape: Vec<u64>,
    dtype: String,
}

/// An MLX folder's weights by width, from its safetensors headers: a module with `.scales`
/// holds `scales × group_size` values packed as config.json and its scales say (as the
/// loader reads it; a mixture-of-experts router's as float), OpenAI's MXFP4 `*_blocks`
/// two values a byte; every other tensor is float.
fn folder_parts(tensors: &BTreeMap<String, Tensor>, quant: Option<&QuantizationConfig>) -> anyhow::Result<Vec<WeightPart>> {
    let count = |shape: &Vec<u64>| shape.iter().product::<u64>();
    let cols = |t: &Tensor| t.shape.last().copied().unwrap_or(0) as i32;
    // By width and scale bytes.
    let mut by_width: BTreeMap<(Option<Quantization>, u64), u64> = BTreeMap::new();
    for (name, t) in tensors {
        let scales = |module: &str| tensors.get(&format!("{module}.scales"));
        if let Some(module) = name.strip_suffix(".scales").or(name.strip_suffix(".biases")) {
            if scales(module).is_some() {
                continue;
            }
        }
        if name.ends_with("_blocks") {
            *by_width.entry((Some(MXFP4), 1)).or_default() += count(&t.shape) * 2;
            continue;
        }
        if name.strip_suffix("_scales").is_some_and(|base| tensors.contains_key(&format!("{base}_blocks"))) {
            continue;
        }
        let Some((module, s)) = name.strip_suffix(".weight").and_then(|m| Some((m, scales(m)?))) else {
            *by_width.entry((None, 0)).or_default() += count(&t.shape);
            continue;
        };
        let q = quant.with_context(|| format!("{module} is quantized but config.json has no quantization"))?;
        let spec = q.spec(module, safetensors_dtype(&s.dtype), cols(t), cols(s))?;
        let elements = count(&s.shape) * spec.group_size as u64;
        // A mixture-of-experts router is held float32 on the CPU whatever its file width
        // (engine::model: its choice is discrete).
        let router = name.ends_with(".mlp.gate.weight") || name.ends_with(".block_sparse_moe.gate.weight");
        let width = (!router).then_some(Quantization { bits: spec.bits as u32, group_size: spec.group_size as u32, mode: spec.mode });
        let scale_bytes = if s.dtype == "F32" { 4 } else { 2 };
        *by_width.entry((width, scale_bytes)).or_default() += elements;
    }
    Ok(by_width.into_iter().map(|((quantization, scale_bytes), elements)| WeightPart { quantization, elements, scale_bytes }).collect())
}

/// The MLX dtype of a safetensors dtype name, as far as telling scales apart needs.
fn safetensors_dtype(name: &str) -> mlx_rs::Dtype {
    match name {
        "U8" => mlx_rs::Dtype::Uint8,
        "F16" => mlx_rs::Dtype::Float16,
        "BF16" => mlx_rs::Dtype::Bfloat16,
        _ => mlx_rs::Dtype::Float32,
    }
}

/// A mixture-of-experts folder's expert tensors, as [`folder_parts`] counts them.
fn expert_parts(config: &Path, tensors: &BTreeMap<String, Tensor>, quant: Option<&QuantizationConfig>) -> Option<ExpertParts> {
    let (cfg, _) = from_hf_config(&files::read_text(config).ok()?).ok()?;
    let moe = cfg.moe.as_ref()?;
    let experts: BTreeMap<String, Tensor> = tensors
        .iter()
        .filter(|(name, _)| crate::engine::experts::locate::is_expert_tensor(name, cfg.arch))
        .map(|(n, t)| (n.clone(), Tensor { shape: t.shape.clone(), dtype: t.dtype.clone() }))
        .collect();
    let sparse = (0..cfg.num_layers).filter(|&l| moe.is_sparse(l)).count() as u64;
    if experts.is_empty() {
        return None;
    }
    Some(ExpertParts {
        parts: folder_parts(&experts, quant).ok()?,
        count: sparse * moe.num_experts as u64,
        per_token: sparse * moe.experts_per_token as u64,
    })
}

/// Why a config.json describes a vision (image + text) model, if it does.
fn vision_parts(json: &serde_json::Value) -> Option<String> {
    const VISION_KEYS: [&str; 6] = ["vision_config", "vision_tower", "mm_vision_tower", "image_token_index", "image_token_id", "visual"];
    let key = VISION_KEYS.iter().find(|k| json.get(**k).is_some_and(|v| !v.is_null()))?;
    let class = json
        .get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.iter().filter_map(|v| v.as_str()).find(|s| s.ends_with("ForConditionalGeneration")))
        .or_else(|| json.get("model_type").and_then(|v| v.as_str()))
        .unwrap_or("unknown");
    Some(format!("vision model ({class}, with {key}): mlxbar serves text-only models"))
}

fn fill_from_config(e: &mut ModelEntry, cfg: &ModelConfig) {
    e.architecture = Some(cfg.arch.name().to_string());
    e.context_length = Some(cfg.max_position_embeddings);
    e.shape = Some(Shape {
        layers: cfg.num_layers,
        hidden_size: cfg.hidden_size as usize,
        num_heads: cfg.num_heads as usize,
        num_kv_heads: cfg.num_kv_heads as usize,
        head_dim: cfg.head_dim as usize,
        vocab_size: cfg.vocab_size as usize,
        intermediate_size: cfg.intermediate_size as usize,
        tie_word_embeddings: cfg.tie_word_embeddings,
    });
}

/// Parameters of the llama-family block layout `cfg` describes (qwen2's q/k/v biases,
/// qwen3's q/k norms, and every expert and router of a sparse layer included: the float32
/// memory estimate is this times 4).
pub fn parameter_count(cfg: &ModelConfig) -> u64 {
    let (h, v, i) = (cfg.hidden_size as u64, cfg.vocab_size as u64, cfg.intermediate_size as u64);
    let q = (cfg.num_heads * cfg.head_dim) as u64;
    let kv = (cfg.num_kv_heads * cfg.head_dim) as u64;
    let extra = match cfg.arch {
        Arch::Qwen2 => q + 2 * kv,
        Arch::Qwen3 | Arch::Qwen3Moe => 2 * cfg.head_dim as u64,
        // q/k norms and the norms after attention and the MLP.
        Arch::Gemma3 => 2 * cfg.head_dim as u64 + 2 * h,
        // q/k/v/o biases and the sinks.
        Arch::GptOss => q + 2 * kv + h + cfg.num_heads as u64,
        Arch::Llama | Arch::Mistral | Arch::Mixtral | Arch::Phi3 => 0,
    };
    let attention = h * q + 2 * h * kv + q * h + 2 * h + extra;
    let mlps: u64 = (0..cfg.num_layers)
        .map(|l| match cfg.moe.as_ref().filter(|m| m.is_sparse(l)) {
            // gpt-oss's experts and router carry biases too.
            Some(m) if cfg.arch == Arch::GptOss => {
                m.num_experts as u64 * (3 * h * m.expert_intermediate_size as u64 + h + 2 * m.expert_intermediate_size as u64 + h + 1)
            }
            Some(m) => m.num_experts as u64 * (3 * h * m.expert_intermediate_size as u64 + h),
            None => 3 * h * i,
        })
        .sum();
    let head = if cfg.tie_word_embeddings { 0 } else { v * h };
    v * h + cfg.num_layers as u64 * attention + mlps + h + head
}

/// Shards `model.safetensors.index.json` names that are not in `dir`.
pub fn missing_shards(dir: &Path) -> Vec<String> {
    let Ok(text) = files::read_text(&dir.join("model.safetensors.index.json")) else { return vec![] };
    let Ok(index) = serde_json::from_str::<serde_json::Value>(&text) else { return vec![] };
    let mut shards: Vec<String> = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .into_iter()
        .flatten()
        .filter_map(|(_, f)| f.as_str().map(str::to_string))
        .collect();
    shards.sort();
    shards.dedup();
    shards.retain(|f| !dir.join(f).is_file());
    shards
}

/// What the loader's tokenizer reads: `chat_template` in tokenizer_config.json, else
/// chat_template.jinja.
fn folder_has_chat_template(dir: &Path) -> bool {
    let in_config = files::read_text(&dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|tc| tc.get("chat_template").is_some_and(|t| t.is_string() || t.is_array()));
    in_config || dir.join("chat_template.jinja").is_file()
}

/// A .gguf file.
pub fn gguf(file: &Path) -> ModelEntry {
    let mut e = blank(name_of(file, true), file, ModelFormat::Gguf);
    e.size_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let header =
        match open_model_file(file).and_then(|(reader, len)| validate::gguf(reader, len).with_context(|| file.display().to_string())) {
            Ok(h) => h,
            Err(err) => {
                e.refuse(format!("{err:#}"));
                return e;
            }
        };
    e.architecture = header.string("general.architecture").map(str::to_string);
    e.parameters = Some(header.tensor_infos.iter().map(|t| t.dims.iter().product::<u64>()).sum());
    e.quantization = gguf_quantization(&header);
    e.weight_parts = gguf_parts(&header.tensor_infos);
    e.chat_template = header.string("tokenizer.chat_template").is_some();
    if let Some(arch) = &e.architecture {
        e.context_length = header.number(&format!("{arch}.context_length")).map(|v| v as usize);
    }
    // llama.cpp's architecture names (qwen3moe, gpt-oss, llama with experts) are the
    // loader's to read: what it calls runnable is what loads.
    match (&e.architecture, config_from_header(&header)) {
        (None, _) => e.refuse("GGUF has no general.architecture"),
        (Some(_), Ok(cfg)) => {
            fill_from_config(&mut e, &cfg);
            e.experts = gguf_expert_parts(&header, &cfg);
        }
        (Some(_), Err(err)) => e.refuse(format!("{err:#}")),
    }
    // What the GGUF tokenizer builder needs (engine::tokenizer::from_gguf).
    let needs: &[&str] = match header.string("tokenizer.ggml.model").unwrap_or_default() {
        "gpt2" => &["tokenizer.ggml.tokens", "tokenizer.ggml.merges"],
        "llama" => &["tokenizer.ggml.tokens", "tokenizer.ggml.scores"],
        other => {
            e.refuse(format!("GGUF tokenizer '{other}' is not supported (byte-level BPE 'gpt2' and SentencePiece 'llama' are)"));
            &[]
        }
    };
    for key in needs {
        if header.array_len(key).is_none() {
            e.refuse(format!("no {key}"));
        }
    }
    // One score and one type per token, as the tokenizer builder takes them.
    let tokens = header.array_len("tokenizer.ggml.tokens");
    for key in ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"] {
        if let (Some(n), Some(t)) = (header.array_len(key), tokens) {
            if n != t {
                e.refuse(format!("{t} tokens but {n} entries in {key}"));
            }
        }
    }
    e
}

/// The quantization most of the matrices' elements carry, as bits and block (group) size.
fn gguf_quantization(h: &GgufSummary) -> Option<Quantization> {
    let mut elements: BTreeMap<&str, u64> = BTreeMap::new();
    for t in h.tensor_infos.iter().filter(|t| t.dims.len() >= 2) {
        *elements.entry(t.ggml_type.name).or_default() += t.dims.iter().product::<u64>();
    }
    let (name, _) = elements.into_iter().max_by_key(|&(name, n)| (n, std::cmp::Reverse(name)))?;
    if name == "MXFP4" {
        return Some(MXFP4);
    }
    ggml_bits(name).map(|(bits, group_size)| Quantization::affine(bits, group_size))
}

/// gpt-oss's experts: E2M1 values in groups of 32 under one E8M0 scale (MLX's `mxfp4`).
const MXFP4: Quantization = Quantization { bits: 4, group_size: 32, mode: QuantMode::Mxfp4 };

/// A GGUF's tensors by width as the loader holds them: Q4_0, Q4_1 and Q8_0 as affine-quantized
/// triplets (group 32), MXFP4 in MLX's mxfp4 mode, every other type as float (MLX casts other
/// quantizations to float16).
fn gguf_parts(tensors: &[GgufTensorInfo]) -> Vec<WeightPart> {
    let mut by_width: BTreeMap<Option<Quantization>, u64> = BTreeMap::new();
    for t in tensors {
        let width = match t.ggml_type.name {
            "MXFP4" => Some(MXFP4),
            "Q4_0" | "Q4_1" | "Q8_0" => ggml_bits(t.ggml_type.name).map(|(bits, group_size)| Quantization::affine(bits, group_size)),
            _ => None,
        };
        *by_width.entry(width).or_default() += t.dims.iter().product::<u64>();
    }
    by_width.into_iter().map(|(quantization, elements)| WeightPart::new(quantization, elements)).collect()
}

/// A mixture-of-experts GGUF's stacked experts, as [`gguf_parts`] counts them, when they can
/// stream: mlxbar's own GGUF reader reads every tensor of the file (the loader reads a
/// streamed model's other tensors with it, and its experts an expert at a time).
fn gguf_expert_parts(h: &GgufSummary, cfg: &ModelConfig) -> Option<ExpertParts> {
    let moe = cfg.moe.as_ref()?;
    if !h.tensor_infos.iter().all(|t| crate::engine::model::gguf_read::reads(t.ggml_type.name)) {
        return None;
    }
    let experts: Vec<GgufTensorInfo> =
        h.tensor_infos.iter().filter(|t| crate::engine::model::gguf::expert_tensor(&t.name, cfg.arch).is_some()).cloned().collect();
    if experts.is_empty() {
        return None;
    }
    let sparse = (0..cfg.num_layers).filter(|&l| moe.is_sparse(l)).count() as u64;
    Some(ExpertParts {
        parts: gguf_parts(&experts),
        count: sparse * moe.num_experts as u64,
        per_token: sparse * moe.experts_per_token as u64,
    })
}

/// (bits, group size) of a GGML quantized type: the scale block (K-quants: the sub-block
/// that carries its own scale). None for float types.
pub fn ggml_bits(name: &str) -> Option<(u32, u32)> {
    Some(match name {
        "Q4_0" | "Q4_1" | "IQ4_NL" | "Q4_K" | "IQ4_XS" => (4, 32),
        "Q5_0" | "Q5_1" | "Q5_K" => (5, 32),
        "Q8_0" => (8, 32),
        "Q8_K" => (8, 256),
        "Q6_K" => (6, 16),
        "Q3_K" | "IQ3_XXS" | "IQ3_S" => (3, 16),
        "Q2_K" | "IQ2_XXS" | "IQ2_XS" | "IQ2_S" => (2, 16),
        "IQ1_S" | "IQ1_M" => (1, 32),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = r#"{"model_type":"llama","hidden_size":576,"num_hidden_layers":30,"intermediate_size":1536,
        "num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,"rms_norm_eps":1e-5,
        "rope_theta":100000.0,"tie_word_embeddings":true,"max_position_embeddings":8192,
        "quantization":{"group_size":64,"bits":8}}"#;

    #[test]
    fn counts_smollm2_135m_parameters() {
        let (cfg, _) = from_hf_config(SMOLLM2).unwrap();
        // 49152*576 embedding + 30 layers of 3,540,096 + the final norm.
        assert_eq!(parameter_count(&cfg), 134_515_008);
        let untied = SMOLLM2.replace(r#""tie_word_embeddings":true"#, r#""tie_word_embeddings":false"#);
        assert_eq!(parameter_count(&from_hf_config(&untied).unwrap().0), 134_515_008 + 49152 * 576);
        let qwen2 = SMOLLM2.replace(r#""llama""#, r#""qwen2""#);
        assert_eq!(parameter_count(&from_hf_config(&qwen2).unwrap().0), 134_515_008 + 30 * (576 + 2 * 192));
    }

    #[test]
    fn counts_every_expert_of_qwen3_30b_a3b() {
        // Qwen/Qwen3-30B-A3B's config.json (the keys that count).
        let json = r#"{"model_type":"qwen3_moe","hidden_size":2048,"num_hidden_layers":48,"intermediate_size":6144,
            "num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"vocab_size":151936,
            "num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"decoder_sparse_step":1,
            "mlp_only_layers":[],"norm_topk_prob":true,"tie_word_embeddings":false,"rms_norm_eps":1e-6}"#;
        let (cfg, _) = from_hf_config(json).unwrap();
        // 30.5B, as the model card says: 48 layers of 128 experts dominate.
        assert_eq!(parameter_count(&cfg), 30_532_122_624);
        let with_dense = json.replace(r#""mlp_only_layers":[]"#, r#""mlp_only_layers":[0]"#);
        let (dense0, _) = from_hf_config(&with_dense).unwrap();
        assert_eq!(parameter_count(&cfg) - parameter_count(&dense0), 128 * (3 * 2048 * 768 + 2048) - 3 * 2048 * 6144);
    }

    /// The estimate's two counts (parameters from config.json, parts from the safetensors
    /// shapes) agree on the tiny qwen3_moe fixtures, each expert counted once, in either
    /// layout and packed; the 4-bit router counts as float (the CPU holds it so).
    #[test]
    fn expert_weights_are_counted_in_both_layouts() {
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
        let stacked = folder(&tiny.join("qwen3-moe"));
        assert!(stacked.runnable, "{:?}", stacked.unsupported_reason);
        // 8 experts x (gate, up, down) of 64 x 32 in the one sparse layer, its router, and a
        // dense MLP of 3 x 64 x 128 in the other.
        let params = stacked.parameters.unwrap();
        let attention = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 64 + 2 * 16;
        assert_eq!(params, 320 * 64 + 2 * attention + 8 * (3 * 64 * 32 + 64) + 3 * 64 * 128 + 64);
        let total = |e: &ModelEntry| e.weight_parts.iter().map(|p| p.elements).sum::<u64>();
        assert_eq!(total(&stacked), params);
        let per_expert = folder(&tiny.join("qwen3-moe-hf"));
        assert!(per_expert.runnable, "{:?}", per_expert.unsupported_reason);
        assert_eq!((per_expert.parameters, total(&per_expert)), (Some(params), params));
        let packed = folder(&tiny.join("qwen3-moe-4bit"));
        assert!(packed.runnable, "{:?}", packed.unsupported_reason);
        assert_eq!(total(&packed), params);
        let float: u64 = packed.weight_parts.iter().filter(|p| p.quantization.is_none()).map(|p| p.elements).sum();
        assert_eq!(float, 8 * 64 + 2 * (2 * 64 + 2 * 16) + 64, "the router and the norms");
    }

    /// gpt-oss with MXFP4 experts in both layouts: every parameter counted once, the experts
    /// as mxfp4 (OpenAI's `_blocks` two values a byte), and held packed on the CPU.
    #[test]
    fn mxfp4_experts_are_counted_packed_in_both_layouts() {
        use crate::engine::WeightFormat;
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
        let float = folder(&tiny.join("gpt-oss"));
        let params = float.parameters.unwrap();
        let total = |e: &ModelEntry| e.weight_parts.iter().map(|p| p.elements).sum::<u64>();
        assert_eq!(total(&float), params);
        // 2 sparse layers x 8 experts x (gate, up, down) of 64 x 32.
        let experts = 2 * 8 * 3 * 64 * 32;
        let mxfp4 = |e: &ModelEntry| {
            e.weight_parts.iter().filter(|p| p.quantization.is_some_and(|q| q.mode == QuantMode::Mxfp4)).map(|p| p.elements).sum::<u64>()
        };
        for name in ["gpt-oss-openai", "gpt-oss-mxfp4-q8"] {
            let e = folder(&tiny.join(name));
            assert!(e.runnable, "{name}: {:?}", e.unsupported_reason);
            assert_eq!((total(&e), mxfp4(&e)), (params, experts), "{name}: {:?}", e.weight_parts);
            assert_eq!(e.quantization.map(|q| q.mode), Some(QuantMode::Mxfp4), "{name}");
            // On the CPU the experts stay packed: half a byte a value and a byte a group.
            let held = crate::registry::budget::weights_as_held(&e, WeightFormat::Native, false);
            let others: u64 = e
                .weight_parts
                .iter()
                .filter(|p| p.quantization.is_none_or(|q| q.mode != QuantMode::Mxfp4))
                .map(|p| crate::registry::budget::parts_as_held(std::slice::from_ref(p), WeightFormat::Native, false))
                .sum();
            assert_eq!(held, others + experts / 2 + experts / 32, "{name}");
        }
    }

    fn folder_with(config: &str, files: &[&str]) -> (tempfile::TempDir, ModelEntry) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        for f in files {
            std::fs::write(dir.path().join(f), "{}").unwrap();
        }
        let e = folder(dir.path());
        (dir, e)
    }

    #[test]
    fn folder_reasons_name_what_is_wrong() {
        let (_d, e) = folder_with(SMOLLM2, &["tokenizer.json"]);
        assert_eq!(e.unsupported_reason.as_deref(), Some("no *.safetensors weights"));
        assert_eq!(e.quantization, Some(Quantization::affine(8, 64)));
        assert_eq!((e.context_length, e.parameters), (Some(8192), Some(134_515_008)));

        let (_d, e) = folder_with(&SMOLLM2.replace(r#""llama""#, r#""gpt_bigcode""#), &[]);
        let why = e.unsupported_reason.unwrap();
        assert!(why.starts_with("unsupported architecture 'gpt_bigcode' (supported: llama"), "{why}");
        assert_eq!(e.architecture.as_deref(), Some("gpt_bigcode"));

        let vlm = r#"{"model_type":"qwen2_vl","architectures":["Qwen2VLForConditionalGeneration"],"vision_config":{"depth":32}}"#;
        let (_d, e) = folder_with(vlm, &[]);
        assert!(!e.runnable);
        assert!(e.unsupported_reason.unwrap().starts_with("vision model (Qwen2VLForConditionalGeneration, with vision_config)"));

        let (_d, e) = folder_with("{not json", &[]);
        assert!(e.unsupported_reason.unwrap().starts_with("config.json: "));
        let (_d, e) = folder_with(r#"{"hidden_size": 4}"#, &[]);
        assert_eq!(e.unsupported_reason.as_deref(), Some("config.json has no model_type"));
    }

    #[test]
    fn gguf_quantization_names_map_to_bits_and_groups() {
        assert_eq!(ggml_bits("Q4_1"), Some((4, 32)));
        assert_eq!(ggml_bits("Q8_0"), Some((8, 32)));
        assert_eq!(ggml_bits("Q6_K"), Some((6, 16)));
        assert_eq!(ggml_bits("F16"), None);
    }

    #[test]
    fn an_index_names_the_missing_shard() {
        let dir = tempfile::tempdir().unwrap();
        let index = r#"{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
        std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
        std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), "").unwrap();
        assert_eq!(missing_shards(dir.path()), vec!["model-00002-of-00002.safetensors".to_string()]);
    }

    #[test]
    fn a_bad_gguf_is_listed_with_the_header_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("broken.gguf");
        std::fs::write(&p, b"GGUF\x03\x00\x00\x00").unwrap();
        let e = inspect(&p).unwrap();
        assert_eq!((e.id.as_str(), e.format, e.runnable), ("broken", ModelFormat::Gguf, false));
        assert!(e.unsupported_reason.unwrap().contains("truncated"));
        assert!(inspect(&dir.path().join("notes.txt")).is_none());
    }
}
