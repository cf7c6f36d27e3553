//! Loads an MLX / Hugging Face model folder: `config.json` + `*.safetensors`, including
//! mlx-community quantized folders (`.weight`/`.scales`/`.biases` per module) and
//! mixture-of-experts folders in either layout (experts one by one, stacked at load, or
//! stacked as mlx-community ships them), and the families whose checkpoints need more
//! (phi3's fused projections, gemma3's multimodal names and `1 + weight` norms, gpt-oss's
//! MXFP4 experts in OpenAI's layout).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use mlx_rs::Array;

use super::config::{self, ModelConfig};
use super::linear::{Quantized, Weight};
use super::TensorMap;
use crate::engine::experts::{locate, ExpertFiles, StreamSpec};

/// Loads the folder `dir`; with `expert_cache` (bytes), a mixture-of-experts model's
/// experts are left on disk for an expert cache of that size ([`crate::engine::experts`]).
pub fn load(dir: &Path, expert_cache: Option<u64>) -> Result<(ModelConfig, TensorMap)> {
    let config_text = std::fs::read_to_string(dir.join("config.json")).with_context(|| format!("{}/config.json", dir.display()))?;
    let (mut config, quant) = config::from_hf_config(&config_text)?;
    let files = safetensors_files(dir)?;
    if files.is_empty() {
        bail!("no *.safetensors in {}", dir.display());
    }
    let mut raw = std::collections::HashMap::new();
    for f in &files {
        // MLX's reader trusts the header; one lying about sizes must not reach it.
        super::validate::safetensors_file(f)?;
        raw.extend(Array::load_safetensors(f).with_context(|| format!("reading {}", f.display()))?);
    }

    let openai_layout = config.arch == config::Arch::GptOss && raw.keys().any(|k| super::gpt_oss::is_openai_expert_tensor(k));
    match config.arch {
        config::Arch::Phi3 => super::phi3::split_fused(&mut raw, &config)?,
        config::Arch::Gemma3 => super::gemma3::text_weights(&mut raw),
        config::Arch::GptOss if openai_layout && expert_cache.is_none() => super::gpt_oss::openai_experts(&mut raw)?,
        _ => {}
    }
    let streamed = match (expert_cache, &config.moe) {
        (Some(_), Some(_)) if openai_layout => bail!(
            "{}: gpt-oss in OpenAI's checkpoint layout (gate and up rows interleaved in gate_up_proj_blocks) cannot stream \
             its experts yet; it needs the memory to load them all, or mlx_lm.convert's layout (mlx-community's), which streams",
            dir.display()
        ),
        (Some(budget), Some(moe)) => {
            let files = ExpertFiles::index(&files, config.arch, moe.num_experts, quant.as_ref())?;
            // MLX reads a tensor when it is first evaluated: dropped now, experts are never read.
            raw.retain(|k, _| !locate::is_expert_tensor(k, config.arch));
            Some(StreamSpec { files, budget })
        }
        (Some(_), None) => bail!("an expert cache for {}, which has no experts", dir.display()),
        _ => None,
    };
    if let (Some(moe), None) = (&config.moe, &streamed) {
        match config.arch {
            config::Arch::Mixtral => super::mixtral::stack_experts(&mut raw, moe)?,
            // Stacked as mlx-lm saves it (mlp.experts.{gate,up,down}_proj).
            config::Arch::GptOss => {}
            _ => super::qwen3_moe::stack_experts(&mut raw, moe)?,
        }
    }

    let mut t = TensorMap { streamed, ..TensorMap::default() };
    let modules: Vec<String> = raw.keys().filter_map(|k| k.strip_suffix(".weight").map(str::to_string)).collect();
    for module in modules {
        let Some(name) = canonical_name(&module, config.arch) else {
            tracing::debug!("ignoring tensor {module}.weight");
            continue;
        };
        let w = raw.remove(&format!("{module}.weight")).unwrap();
        if let Some(scales) = raw.remove(&format!("{module}.scales")) {
            let q = quant.as_ref().with_context(|| format!("{module} is quantized but config.json has no quantization"))?;
            let cols = |a: &Array| a.shape().last().copied().unwrap_or(0);
            let spec = q.spec(&module, scales.dtype(), cols(&w), cols(&scales))?;
            let biases = raw.remove(&format!("{module}.biases"));
            let quantized = Quantized::new(w, scales, biases, spec).with_context(|| module.clone())?;
            t.weights.insert(name.clone(), Weight::Quantized(quantized));
        } else if name.ends_with("norm") {
            t.vectors.insert(name.clone(), w);
        } else {
            t.weights.insert(name.clone(), Weight::dense(w)?);
        }
        if let Some(b) = raw.remove(&format!("{module}.bias")) {
            t.vectors.insert(format!("{name}.bias"), b);
        }
    }
    // gpt-oss's per-head attention sinks: a bare tensor, not a module's weight.
    for key in raw.keys().filter(|k| k.ends_with(".self_attn.sinks")).cloned().collect::<Vec<_>>() {
        if let Some(layer) = key.strip_prefix("model.layers.").and_then(|r| r.split_once('.')).map(|(l, _)| l.to_string()) {
            t.vectors.insert(format!("layers.{layer}.sinks"), raw.remove(&key).unwrap());
        }
    }
    if !t.weights.contains_key("lm_head") {
        config.tie_word_embeddings = true;
    }
    if config.arch == config::Arch::Gemma3 {
        super::gemma3::shift_norms(&mut t)?;
    }
    Ok((config, t))
}

/// The `*.safetensors` files directly in `dir`, sorted (dangling links included: they are
/// missing weights, which the header check reports).
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// HF module path -> canonical name (see [`TensorMap`]). Gemma's
/// `post_attention_layernorm` norms the attention's output; llama's the MLP's input.
pub(crate) fn canonical_name(module: &str, arch: config::Arch) -> Option<String> {
    match module {
        "model.embed_tokens" => return Some("embed".into()),
        "model.norm" => return Some("norm".into()),
        "lm_head" => return Some("lm_head".into()),
        _ => {}
    }
    let rest = module.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let part = match part {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if arch == config::Arch::Gemma3 => "post_attn_norm",
        "post_attention_layernorm" => "mlp_norm",
        "pre_feedforward_layernorm" => "mlp_norm",
        "post_feedforward_layernorm" => "post_mlp_norm",
        "self_attn.q_proj" => "q",
        "self_attn.k_proj" => "k",
        "self_attn.v_proj" => "v",
        "self_attn.o_proj" => "o",
        "self_attn.q_norm" => "q_norm",
        "self_attn.k_norm" => "k_norm",
        "mlp.gate_proj" => "gate",
        "mlp.up_proj" => "up",
        "mlp.down_proj" => "down",
        // Mixture of experts: the router and the stacked experts.
        "mlp.gate" => "router",
        "mlp.switch_mlp.gate_proj" => "experts.gate",
        "mlp.switch_mlp.up_proj" => "experts.up",
        "mlp.switch_mlp.down_proj" => "experts.down",
        // gpt-oss's.
        "mlp.router" => "router",
        "mlp.experts.gate_proj" => "experts.gate",
        "mlp.experts.up_proj" => "experts.up",
        "mlp.experts.down_proj" => "experts.down",
        // mixtral's names for the same.
        "block_sparse_moe.gate" => "router",
        "block_sparse_moe.switch_mlp.gate_proj" => "experts.gate",
        "block_sparse_moe.switch_mlp.up_proj" => "experts.up",
        "block_sparse_moe.switch_mlp.down_proj" => "experts.down",
        _ => return None,
    };
    Some(format!("layers.{layer}.{part}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn maps_hf_names() {
        use crate::engine::model::config::Arch;
        let c = |m: &str| super::canonical_name(m, Arch::Llama);
        assert_eq!(c("model.layers.3.self_attn.k_proj").as_deref(), Some("layers.3.k"));
        assert_eq!(c("model.layers.3.post_attention_layernorm").as_deref(), Some("layers.3.mlp_norm"));
        assert_eq!(c("lm_head").as_deref(), Some("lm_head"));
        assert_eq!(c("model.layers.2.mlp.gate").as_deref(), Some("layers.2.router"));
        assert_eq!(c("model.layers.2.mlp.switch_mlp.down_proj").as_deref(), Some("layers.2.experts.down"));
        assert_eq!(c("model.layers.1.block_sparse_moe.gate").as_deref(), Some("layers.1.router"));
        assert_eq!(c("model.layers.1.block_sparse_moe.switch_mlp.up_proj").as_deref(), Some("layers.1.experts.up"));
        assert_eq!(c("model.layers.3.self_attn.rotary_emb.inv_freq"), None);
        let g = |m: &str| super::canonical_name(m, Arch::Gemma3);
        assert_eq!(g("model.layers.3.post_attention_layernorm").as_deref(), Some("layers.3.post_attn_norm"));
        assert_eq!(g("model.layers.3.pre_feedforward_layernorm").as_deref(), Some("layers.3.mlp_norm"));
        assert_eq!(g("model.layers.3.post_feedforward_layernorm").as_deref(), Some("layers.3.post_mlp_norm"));
    }
}
