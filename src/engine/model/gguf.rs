//! Loads a GGUF file: hyper-parameters from `{arch}.*` metadata, tensors from GGML names,
//! mixture-of-experts ones (qwen3moe, mixtral as llama with experts, gpt-oss) with their
//! stacked experts, and gemma3 (its sandwich norms, already 1 + weight in the file). MLX
//! returns Q4_0/Q4_1/Q8_0 tensors as affine-quantized triplets (`.weight` packed u32,
//! `.scales`, `.biases`; group 32); a file with MXFP4 experts (gpt-oss), which MLX's reader
//! cannot take, or a model whose experts stream, is read by [`gguf_read`] into the same shapes.
//!
//! llama.cpp's converter permutes the rows of attn_q/attn_k of llama-arch models for GGML's
//! interleaved RoPE. Those rows are put back in HF order here and the model runs NeoX
//! (rotate-half) RoPE like every other format: MLX's traditional RoPE is equivalent in
//! float32 but loses the argmax in float16 (measured on this model). Rows are output
//! features, so permuting them leaves quantized packing intact. qwen2/qwen3 GGUFs are not
//! permuted; mixtral's (written as llama) are. phi3's fused `attn_qkv` and `ffn_up` (gate|up)
//! are split here into the parts every family has.
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use mlx_rs::{io::GgufFile, Array, Dtype};

use super::config::{Activation, Arch, LayerStyle, ModelConfig, RopeConfig};
use super::gguf_read::{self, Tensor};
use super::linear::{Quantized, Weight};
use super::quantized::QuantSpec;
use super::switch::{MoeConfig, Routing};
use super::validate::GgufSummary;
use super::{rope, TensorMap};
use crate::engine::experts::{ExpertFiles, StreamSpec};

pub struct LoadedGguf {
    /// The checked header, with the vocabulary's arrays ([`crate::engine::tokenizer::from_gguf`]).
    pub header: GgufSummary,
    pub config: ModelConfig,
    pub tensors: TensorMap,
}

/// Loads the GGUF at `path`. With `expert_cache` (bytes), a mixture-of-experts model's
/// experts are left in the file for an expert cache of that size ([`crate::engine::experts`]):
/// every other tensor is read by [`gguf_read`] (MLX's reader would read the experts too).
pub fn load(path: &Path, expert_cache: Option<u64>) -> Result<LoadedGguf> {
    // MLX's reader trusts the file; a truncated or lying one must not reach it.
    let header = super::validate::gguf_file_keeping(path, &crate::engine::tokenizer::is_vocabulary_key)?;
    let mut config = config_from_header(&header)?;
    let rope_dims = config.rope.dims.unwrap_or(config.head_dim);
    let streamed = match (expert_cache, &config.moe) {
        (Some(budget), Some(moe)) => {
            Some(StreamSpec { files: ExpertFiles::index_gguf(path, &header, config.arch, moe.num_experts)?, budget })
        }
        (Some(_), None) => bail!("an expert cache for {}, which has no experts", path.display()),
        _ => None,
    };
    let tensors = if streamed.is_some() {
        gguf_read::read_where(path, &header, &|name| !is_expert_tensor(name, config.arch))?
    } else if gguf_read::needed(&header) {
        gguf_read::read_where(path, &header, &|_| true)?
    } else {
        mlx_tensors(&GgufFile::load(path).with_context(|| format!("reading GGUF {}", path.display()))?)?
    };

    let mut t = TensorMap { streamed, ..TensorMap::default() };
    for (key, tensor) in tensors {
        let (base, suffix) = key.rsplit_once('.').unwrap_or((key.as_str(), ""));
        let Some(name) = canonical_name(base, config.arch) else {
            tracing::debug!("ignoring GGUF tensor {key}");
            continue;
        };
        match (suffix, tensor) {
            ("weight", Tensor::Quantized(q)) => {
                t.weights.insert(name, Weight::Quantized(q));
            }
            ("weight", Tensor::Plain(w)) if is_matrix(&name) => {
                t.weights.insert(name, Weight::dense(w)?);
            }
            ("weight", Tensor::Plain(w)) if name == "rope_periods" => {
                let factors = w.as_dtype(Dtype::Float32)?;
                factors.eval()?;
                let p = rope::gguf_periods(rope_dims, config.rope.theta, factors.as_slice::<f32>());
                t.vectors.insert(name, Array::from_slice(&p, &[p.len() as i32]));
            }
            ("weight", Tensor::Plain(w)) => {
                t.vectors.insert(name, w);
            }
            ("bias", Tensor::Plain(b)) => {
                t.vectors.insert(format!("{name}.bias"), b);
            }
            _ => bail!("GGUF tensor {key}: not a weight or a float bias"),
        }
    }
    if !t.weights.contains_key("lm_head") {
        config.tie_word_embeddings = true;
    }
    config.validate()?;
    if config.arch == Arch::Phi3 {
        let (q, kv) = (config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim);
        for i in 0..config.num_layers {
            for (fused, parts, sizes) in
                [("qkv", &["q", "k", "v"][..], vec![q, kv, kv]), ("up", &["gate", "up"][..], vec![config.intermediate_size; 2])]
            {
                let name = format!("layers.{i}.{fused}");
                let w = t
                    .weights
                    .remove(&name)
                    .with_context(|| format!("phi3 GGUF lacks blk.{i}.{}", if fused == "qkv" { "attn_qkv" } else { "ffn_up" }))?;
                for (part, w) in parts.iter().zip(w.split_outputs(&sizes).with_context(|| name.clone())?) {
                    t.weights.insert(format!("layers.{i}.{part}"), w);
                }
            }
        }
    }
    if matches!(config.arch, Arch::Llama | Arch::Mistral | Arch::Mixtral) {
        for i in 0..config.num_layers {
            for (part, heads) in [("q", config.num_heads), ("k", config.num_kv_heads)] {
                let name = format!("layers.{i}.{part}");
                if let Some(w) = t.weights.remove(&name) {
                    let perm = hf_row_order(w.out_features(), heads);
                    let perm = Array::from_slice(&perm, &[perm.len() as i32]);
                    t.weights.insert(name.clone(), w.take_outputs(&perm)?);
                    if let Some(b) = t.vectors.remove(&format!("{name}.bias")) {
                        t.vectors.insert(format!("{name}.bias"), b.take_axis(&perm, 0)?);
                    }
                }
            }
        }
    }
    Ok(LoadedGguf { header, config, tensors: t })
}

/// The tensors MLX's reader returns, by GGUF name: quantized ones come back as
/// `{base}.weight` (packed), `.scales` and `.biases`, put together here.
fn mlx_tensors(g: &GgufFile) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for key in g.array_keys()? {
        if key.ends_with(".scales") || key.ends_with(".biases") {
            continue;
        }
        let w = g.get_array(&key)?.context(key.clone())?;
        let base = key.strip_suffix(".weight");
        let tensor = match base.map(|b| g.get_array(&format!("{b}.scales"))).transpose()?.flatten() {
            Some(scales) => {
                let base = base.expect("scales found beside a weight");
                let biases = g.get_array(&format!("{base}.biases"))?.with_context(|| format!("{base}.biases"))?;
                let group_size = 32;
                let in_features = scales.shape()[scales.ndim() - 1] * group_size;
                let bits = w.shape()[w.ndim() - 1] * 32 / in_features;
                Tensor::Quantized(Quantized::new(w, scales, Some(biases), QuantSpec::affine(group_size, bits))?)
            }
            None => Tensor::Plain(w),
        };
        out.push((key, tensor));
    }
    Ok(out)
}

/// The hyper-parameters from a checked GGUF header (`{arch}.*` metadata), without
/// reading any tensor: the loader and the model library share this, so what the library
/// calls runnable is what loads.
pub fn config_from_header(h: &GgufSummary) -> Result<ModelConfig> {
    let arch_name = h.string("general.architecture").context("no general.architecture")?;
    let has_experts = h.number(&format!("{arch_name}.expert_count")).is_some_and(|n| n > 0.0);
    let arch = match arch_name {
        // llama.cpp's names: qwen3_moe is `qwen3moe`, mixtral a llama with experts.
        "qwen3moe" => Arch::Qwen3Moe,
        "llama" if has_experts => Arch::Mixtral,
        "gpt-oss" => return super::gpt_oss::config_from_gguf(h),
        "gemma3" => return super::gemma3::config_from_gguf(h),
        other => Arch::parse(other)?,
    };
    let m = |k: &str| h.number(&format!("{arch_name}.{k}")).map(|v| v as f32);
    let req = |k: &str| -> Result<f32> { m(k).with_context(|| format!("GGUF lacks {arch_name}.{k}")) };
    let hidden = req("embedding_length")? as i32;
    let heads = req("attention.head_count")? as i32;
    let tokens = h.array_len("tokenizer.ggml.tokens").unwrap_or(0);
    let vocab = m("vocab_size").map(|v| v as i32).unwrap_or(tokens as i32);
    let head_dim = match m("attention.key_length") {
        Some(k) => k as i32,
        None => m("rope.dimension_count").map(|d| d as i32).unwrap_or(hidden / heads.max(1)),
    };
    if let Some(kind) = h.string(&format!("{arch_name}.rope.scaling.type")) {
        if kind != "linear" && kind != "none" {
            bail!("unsupported GGUF rope scaling '{kind}'");
        }
    }
    let mut config = ModelConfig {
        arch,
        hidden_size: hidden,
        num_layers: req("block_count")? as usize,
        num_heads: heads,
        num_kv_heads: m("attention.head_count_kv").map(|v| v as i32).unwrap_or(heads),
        head_dim,
        intermediate_size: m("feed_forward_length")
            .or(m("expert_feed_forward_length"))
            .with_context(|| format!("GGUF lacks {arch_name}.feed_forward_length"))? as i32,
        vocab_size: vocab,
        rms_norm_eps: m("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        rope: RopeConfig {
            position_scale: 1.0 / m("rope.scaling.factor").filter(|f| *f > 0.0).unwrap_or(1.0),
            ..RopeConfig::plain(m("rope.freq_base").unwrap_or(10000.0), false)
        },
        // No output head: the embedding doubles as it.
        tie_word_embeddings: !h.tensor_infos.iter().any(|t| t.name == "output.weight"),
        max_position_embeddings: m("context_length").map(|v| v as usize).unwrap_or(4096),
        moe: match arch {
            Arch::Qwen3Moe | Arch::Mixtral => Some(experts(h, arch_name, arch, req("block_count")? as usize)?),
            _ => None,
        },
        style: LayerStyle::llama(),
    };
    if arch == Arch::Phi3 {
        super::phi3::adjust_gguf(&mut config, h)?;
    }
    config.validate()?;
    Ok(config)
}

/// A mixture-of-experts GGUF's experts (`{arch}.expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`; llama.cpp's qwen3moe renormalizes the top k, mixtral takes a
/// softmax over the k largest logits). A layer is sparse when it has a router
/// (`blk.{l}.ffn_gate_inp`); its experts are stacked (`ffn_{gate,up,down}_exps`), as
/// current converters write them.
fn experts(h: &GgufSummary, arch_name: &str, arch: Arch, layers: usize) -> Result<MoeConfig> {
    let m = |k: &str| h.number(&format!("{arch_name}.{k}"));
    let req = |k: &str| m(k).with_context(|| format!("GGUF lacks {arch_name}.{k}"));
    let has = |name: String| h.tensor_infos.iter().any(|t| t.name == name);
    if has("blk.0.ffn_gate.0.weight".into()) {
        bail!("one tensor per expert (blk.N.ffn_gate.E.weight, older llama.cpp converters) is not supported: reconvert with a current convert_hf_to_gguf.py");
    }
    let sparse_layers: Vec<bool> = (0..layers).map(|l| has(format!("blk.{l}.ffn_gate_inp.weight"))).collect();
    ensure!(sparse_layers.iter().any(|s| *s), "{arch_name}.expert_count is set but no layer has a router (ffn_gate_inp)");
    Ok(MoeConfig {
        num_experts: req("expert_count")? as i32,
        experts_per_token: req("expert_used_count")? as i32,
        expert_intermediate_size: m("expert_feed_forward_length").or(m("feed_forward_length")).context("GGUF lacks the experts' width")?
            as i32,
        routing: match arch {
            Arch::Mixtral => Routing::TopKSoftmax,
            _ => Routing::Softmax { renormalize: true },
        },
        activation: Activation::Silu,
        sparse_layers,
    })
}

/// For each HF row, the GGUF row holding it: llama.cpp stores head h's row (half, i) at
/// (i, half), i.e. HF row h*d + half*d/2 + i sits at GGUF row h*d + 2i + half.
pub fn hf_row_order(rows: i32, heads: i32) -> Vec<i32> {
    let d = rows / heads;
    (0..rows)
        .map(|r| {
            let (h, within) = (r / d, r % d);
            let (half, i) = (within / (d / 2), within % (d / 2));
            h * d + 2 * i + half
        })
        .collect()
}

/// Whether GGUF tensor `name` holds the stacked experts of a sparse layer (weights, or
/// gpt-oss's biases): which projection ([`crate::engine::experts`]'s gate, up, down order)
/// of which layer.
pub fn expert_tensor(name: &str, arch: Arch) -> Option<(u32, usize, &'static str)> {
    let (base, kind) = name.rsplit_once('.')?;
    let kind = ["weight", "bias"].into_iter().find(|k| *k == kind)?;
    let canonical = canonical_name(base, arch)?;
    let (layer, part) = canonical.strip_prefix("layers.")?.split_once('.')?;
    let projection = ["experts.gate", "experts.up", "experts.down"].iter().position(|p| *p == part)?;
    Some((layer.parse().ok()?, projection, kind))
}

fn is_expert_tensor(name: &str, arch: Arch) -> bool {
    expert_tensor(name, arch).is_some()
}

fn is_matrix(name: &str) -> bool {
    !(name.ends_with("norm") || name.ends_with("sinks") || name == "rope_periods")
}

/// GGML tensor base name -> canonical name (see [`TensorMap`]).
fn canonical_name(base: &str, arch: Arch) -> Option<String> {
    let fixed = match base {
        "token_embd" => Some("embed"),
        "output_norm" => Some("norm"),
        "output" => Some("lm_head"),
        "rope_freqs" => Some("rope_periods"),
        // phi3's LongRoPE: mlx-lm applies the long factors at every length, and so does
        // llama.cpp at the file's own context length; the short ones are not used.
        "rope_factors_long" => Some("rope_periods"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = base.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let part = match part {
        "attn_norm" => "attn_norm",
        "ffn_norm" => "mlp_norm",
        "attn_q" => "q",
        "attn_k" => "k",
        "attn_v" => "v",
        "attn_output" => "o",
        "attn_qkv" => "qkv",
        "attn_q_norm" => "q_norm",
        "attn_k_norm" => "k_norm",
        // gpt-oss: a learned sink per head; the norm before its experts.
        "attn_sinks" => "sinks",
        "post_attention_norm" if arch == Arch::GptOss => "mlp_norm",
        // gemma3's sandwich: norms after attention and after the MLP as well.
        "post_attention_norm" if arch == Arch::Gemma3 => "post_attn_norm",
        "post_ffw_norm" if arch == Arch::Gemma3 => "post_mlp_norm",
        "ffn_gate" => "gate",
        "ffn_up" => "up",
        "ffn_down" => "down",
        // Mixture of experts: the router and the stacked experts.
        "ffn_gate_inp" => "router",
        "ffn_gate_exps" => "experts.gate",
        "ffn_up_exps" => "experts.up",
        "ffn_down_exps" => "experts.down",
        _ => return None,
    };
    Some(format!("layers.{layer}.{part}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hf_row_order_inverts_the_ggml_interleave() {
        // one head of 4 rows: GGUF rows are [x0, y0, x1, y1] for HF [x0, x1, y0, y1]
        assert_eq!(super::hf_row_order(4, 1), vec![0, 2, 1, 3]);
        let p = super::hf_row_order(128, 2);
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, (0..128).collect::<Vec<_>>(), "a permutation");
        assert_eq!(&p[64..68], &[64, 66, 68, 70], "second head starts at its own rows");
    }

    #[test]
    fn maps_ggml_names() {
        use super::super::config::Arch;
        let c = |base| super::canonical_name(base, Arch::Llama);
        assert_eq!(c("blk.12.attn_q").as_deref(), Some("layers.12.q"));
        assert_eq!(c("blk.0.ffn_norm").as_deref(), Some("layers.0.mlp_norm"));
        assert_eq!(c("token_embd").as_deref(), Some("embed"));
        assert_eq!(c("blk.0.attn_rot_embd"), None);
        // gpt-oss's norm before the experts is llama.cpp's ATTN_POST_NORM; other families'
        // post-attention norm is a norm of its own, which no llama-family layer has.
        assert_eq!(super::canonical_name("blk.3.post_attention_norm", Arch::GptOss).as_deref(), Some("layers.3.mlp_norm"));
        assert_eq!(c("blk.3.post_attention_norm"), None);
        assert_eq!(c("blk.3.attn_sinks").as_deref(), Some("layers.3.sinks"));
    }
}
