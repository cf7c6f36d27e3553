//! gpt_oss (gpt-oss-20b, gpt-oss-120b), as mlx-lm's `models/gpt_oss.py` defines it: q/k/v/o
//! biases, a learned per-head attention sink in every softmax, layers alternating between
//! a local window (`sliding_window`) and global attention (`layer_types`), YaRN RoPE on all
//! of them, and in every layer a mixture of experts with a biased router (top-k logits,
//! then a softmax over those k), biased experts and gpt-oss's clamped SwiGLU. Weights load
//! from MLX folders as mlx-lm saves them (experts stacked: `mlp.experts.{gate,up,down}_proj`).
//! Experts quantized as gpt-oss ships them (MXFP4, MLX's `mxfp4` mode) load in both
//! checkpoint layouts: mlx-community's (`mlp.experts.*_proj.{weight,scales}`) and OpenAI's
//! (`mlp.experts.gate_up_proj_blocks`, gate and up rows interleaved: [`openai_experts`]),
//! and from GGUF files in llama.cpp's layout ([`config_from_gguf`]; tensors in `gguf_read`).
use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::config::{Activation, Arch, LayerStyle, LocalAttention, ModelConfig, QuantizationConfig, RopeConfig};
use super::rope::{yarn, YarnScaling};
use super::switch::{MoeConfig, Routing};
use super::validate::GgufSummary;

#[derive(Deserialize)]
struct Keys {
    #[serde(default = "d::layers")]
    num_hidden_layers: usize,
    #[serde(default = "d::experts")]
    num_local_experts: i32,
    #[serde(default = "d::per_token")]
    num_experts_per_tok: i32,
    #[serde(default = "d::vocab")]
    vocab_size: i32,
    #[serde(default = "d::eps")]
    rms_norm_eps: f32,
    #[serde(default = "d::hidden")]
    hidden_size: i32,
    #[serde(default = "d::hidden")]
    intermediate_size: i32,
    #[serde(default = "d::head_dim")]
    head_dim: i32,
    #[serde(default = "d::heads")]
    num_attention_heads: i32,
    #[serde(default = "d::kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "d::window")]
    sliding_window: i32,
    #[serde(default = "d::theta")]
    rope_theta: f32,
    rope_scaling: Option<serde_json::Value>,
    layer_types: Option<Vec<String>>,
    #[serde(default = "d::ctx")]
    max_position_embeddings: usize,
}

/// mlx-lm's `gpt_oss.ModelArgs` defaults.
mod d {
    pub fn layers() -> usize {
        36
    }
    pub fn experts() -> i32 {
        128
    }
    pub fn per_token() -> i32 {
        4
    }
    pub fn vocab() -> i32 {
        201088
    }
    pub fn eps() -> f32 {
        1e-5
    }
    pub fn hidden() -> i32 {
        2880
    }
    pub fn head_dim() -> i32 {
        64
    }
    pub fn heads() -> i32 {
        64
    }
    pub fn kv_heads() -> i32 {
        8
    }
    pub fn window() -> i32 {
        128
    }
    pub fn theta() -> f32 {
        150000.0
    }
    pub fn ctx() -> usize {
        131072
    }
}

/// The model config of a gpt_oss config.json, and its quantization.
pub fn config(json: &str) -> Result<(ModelConfig, Option<QuantizationConfig>)> {
    let outer: serde_json::Value = serde_json::from_str(json).context("config.json")?;
    let k: Keys = serde_json::from_value(outer.clone()).context("config.json (gpt_oss keys)")?;
    let mut rope = RopeConfig::plain(k.rope_theta, false);
    if let Some(s) = k.rope_scaling.as_ref().filter(|s| !s.is_null()) {
        match s.get("rope_type").or_else(|| s.get("type")).and_then(|t| t.as_str()).unwrap_or("default") {
            "yarn" => {
                let y: YarnScaling = serde_json::from_value(s.clone()).context("rope_scaling (yarn)")?;
                let (periods, scale) = yarn(k.head_dim, k.rope_theta, &y);
                rope.periods = Some(periods);
                rope.input_scale = scale;
            }
            "default" => {}
            other => bail!("unsupported gpt_oss rope_scaling type '{other}' (supported: yarn)"),
        }
    }
    let layers = match k.layer_types {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => bail!("unknown layer type '{other}'"),
            })
            .collect::<Result<Vec<bool>>>()?,
        None => (0..k.num_hidden_layers).map(|i| i % 2 == 0).collect(),
    };
    let quant = super::config::quantization(&outer)?;
    let cfg = ModelConfig {
        arch: Arch::GptOss,
        hidden_size: k.hidden_size,
        num_layers: k.num_hidden_layers,
        num_heads: k.num_attention_heads,
        num_kv_heads: k.num_key_value_heads,
        head_dim: k.head_dim,
        intermediate_size: k.intermediate_size,
        vocab_size: k.vocab_size,
        rms_norm_eps: k.rms_norm_eps,
        rope,
        tie_word_embeddings: false,
        max_position_embeddings: k.max_position_embeddings,
        moe: Some(MoeConfig {
            num_experts: k.num_local_experts,
            experts_per_token: k.num_experts_per_tok,
            expert_intermediate_size: k.intermediate_size,
            routing: Routing::TopKSoftmax,
            activation: Activation::SwigluOai,
            sparse_layers: vec![true; k.num_hidden_layers],
        }),
        style: LayerStyle {
            local: Some(LocalAttention { window: k.sliding_window, rope_theta: None, layers }),
            attention_sinks: true,
            ..LayerStyle::llama()
        },
    };
    cfg.validate()?;
    Ok((cfg, quant))
}

/// The model config of a gpt-oss GGUF, as llama.cpp's converter writes its header
/// (`gpt-oss.*`: `expert_feed_forward_length`, `attention.sliding_window`, the YaRN keys
/// `rope.scaling.{type,factor,original_context_length,yarn_beta_fast,yarn_beta_slow}`), put
/// back into the config.json keys [`config`] reads, so both formats share one reading. Layers
/// alternate local and global as llama.cpp's `load_swa_pattern(2)` has it (even layers local)
/// unless `attention.sliding_window_pattern` gives another period.
pub fn config_from_gguf(h: &GgufSummary) -> Result<ModelConfig> {
    let m = |k: &str| h.number(&format!("gpt-oss.{k}"));
    let req = |k: &str| m(k).with_context(|| format!("GGUF lacks gpt-oss.{k}"));
    let layers = req("block_count")? as usize;
    let period = match h.metadata.get("gpt-oss.attention.sliding_window_pattern") {
        None => 2,
        Some(v) => v.as_f64().context("a per-layer gpt-oss.attention.sliding_window_pattern array is not read: only a period")? as usize,
    };
    // llama.cpp's set_swa_pattern: layer il is local when il % period < period - 1 (0: all).
    let layer_types: Vec<&str> =
        (0..layers).map(|i| if period == 0 || i % period < period - 1 { "sliding_attention" } else { "full_attention" }).collect();
    let rope_scaling = match h.string("gpt-oss.rope.scaling.type") {
        None | Some("none") => serde_json::Value::Null,
        Some("yarn") => serde_json::json!({
            "rope_type": "yarn",
            "factor": req("rope.scaling.factor")?,
            "original_max_position_embeddings": req("rope.scaling.original_context_length")?,
            "beta_fast": m("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
            "beta_slow": m("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
        }),
        Some(other) => bail!("unsupported gpt-oss GGUF rope scaling '{other}' (supported: yarn)"),
    };
    // Counts as integers (metadata numbers arrive as f64), so serde reads them into config.json's integer fields.
    let count = |k: &str| req(k).map(|v| v as u64);
    let hidden = count("embedding_length")?;
    let heads = count("attention.head_count")?;
    let json = serde_json::json!({
        "model_type": "gpt_oss",
        "num_hidden_layers": layers,
        "num_local_experts": count("expert_count")?,
        "num_experts_per_tok": count("expert_used_count")?,
        "vocab_size": h.array_len("tokenizer.ggml.tokens").context("GGUF lacks tokenizer.ggml.tokens")?,
        "rms_norm_eps": req("attention.layer_norm_rms_epsilon")?,
        "hidden_size": hidden,
        "intermediate_size": m("expert_feed_forward_length").or(m("feed_forward_length")).context("GGUF lacks gpt-oss.expert_feed_forward_length")? as u64,
        "head_dim": m("attention.key_length").map_or(hidden / heads, |d| d as u64),
        "num_attention_heads": heads,
        "num_key_value_heads": m("attention.head_count_kv").map_or(heads, |n| n as u64),
        "sliding_window": count("attention.sliding_window")?,
        "rope_theta": req("rope.freq_base")?,
        "rope_scaling": rope_scaling,
        "layer_types": layer_types,
        "max_position_embeddings": count("context_length")?,
    });
    let (config, _) = config(&json.to_string())?;
    Ok(config)
}

/// Whether `name` is an expert tensor in OpenAI's checkpoint layout
/// (`mlp.experts.gate_up_proj_blocks`, `_scales`, `_bias`, and `down_proj_*` alike).
pub fn is_openai_expert_tensor(name: &str) -> bool {
    name.contains(".mlp.experts.") && ["_blocks", "_scales", "_bias"].iter().any(|s| name.ends_with(s))
}

/// OpenAI's expert tensors in mlx-lm's layout, as mlx-lm's `gpt_oss.sanitize` turns them:
/// `*_blocks` (`[experts, out, in/32, 16]` bytes, two E2M1 values each) become `u32` words
/// `[experts, out, in/8]` (`.weight`), `*_scales` `.scales`, `*_bias` `.bias`; and the fused
/// `gate_up_proj`, whose even rows are gate's and odd rows up's, splits into the two.
pub fn openai_experts(raw: &mut HashMap<String, Array>) -> Result<()> {
    let keys: Vec<String> = raw.keys().filter(|k| is_openai_expert_tensor(k)).cloned().collect();
    for key in keys {
        let v = raw.remove(&key).expect("listed from the map");
        let (base, kind) = key.rsplit_once('_').expect("ends with _blocks, _scales or _bias");
        let (v, suffix) = match kind {
            "blocks" => {
                ensure!(
                    v.dtype() == Dtype::Uint8 && v.ndim() == 4,
                    "{key}: {:?} {:?}, not [experts, out, groups, 16] bytes",
                    v.dtype(),
                    v.shape()
                );
                let s = v.shape().to_vec();
                (v.view_dtype(Dtype::Uint32)?.reshape(&[s[0], s[1], -1])?, "weight")
            }
            "scales" => (v, "scales"),
            _ => (v, "bias"),
        };
        if let Some(prefix) = base.strip_suffix("gate_up_proj") {
            // Rows (the last axis of a bias) alternate gate, up.
            let axis = if suffix == "bias" { v.ndim() - 1 } else { v.ndim() - 2 } as i32;
            let mut pairs = v.shape().to_vec();
            let rows = pairs[axis as usize];
            ensure!(rows % 2 == 0, "{key}: {rows} rows, not gate and up pairs");
            pairs.splice(axis as usize..=axis as usize, [rows / 2, 2]);
            let v = v.reshape(&pairs)?;
            for (i, proj) in ["gate_proj", "up_proj"].into_iter().enumerate() {
                raw.insert(format!("{prefix}{proj}.{suffix}"), v.take_axis(Array::from_int(i as i32), axis + 1)?);
            }
        } else if base.ends_with("down_proj") {
            raw.insert(format!("{base}.{suffix}"), v);
        } else {
            bail!("unknown expert tensor {key}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::quantized::QuantSpec;

    /// gpt-oss-20b's config.json, trimmed to what it sets.
    const GPT_OSS_20B: &str = r#"{"model_type":"gpt_oss","num_hidden_layers":24,"num_local_experts":32,
        "num_experts_per_tok":4,"vocab_size":201088,"hidden_size":2880,"intermediate_size":2880,"head_dim":64,
        "num_attention_heads":64,"num_key_value_heads":8,"sliding_window":128,"rope_theta":150000,
        "rope_scaling":{"beta_fast":32.0,"beta_slow":1.0,"factor":32.0,"original_max_position_embeddings":4096,
        "rope_type":"yarn","truncate":false}}"#;

    #[test]
    fn gpt_oss_20b_alternates_local_and_global_layers_with_yarn() {
        let (c, q) = config(GPT_OSS_20B).unwrap();
        assert!(q.is_none());
        let local = c.style.local.as_ref().unwrap();
        assert_eq!((local.window, local.rope_theta, &local.layers[..4]), (128, None, &[true, false, true, false][..]));
        // YaRN at factor 32: the attention factor 0.1 ln 32 + 1, the shortest period kept,
        // the longest interpolated 32x.
        assert!((c.rope.input_scale - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
        let p = c.rope.periods.as_ref().unwrap();
        assert_eq!((p.len(), p[0]), (32, 1.0));
        assert!((p[31] / 150000f32.powf(62.0 / 64.0) - 32.0).abs() < 1e-3);
        let moe = c.moe.unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.activation), (32, 4, Activation::SwigluOai));
    }

    /// MXFP4 as mlx-community's config.json says it, as OpenAI's does, and a quantization
    /// method mlxbar does not run, refused by name.
    #[test]
    fn reads_mxfp4_quantization_both_ways() {
        let with = |extra: &str| config(&GPT_OSS_20B.replace(r#""truncate":false}"#, &format!(r#""truncate":false}},{extra}"#)));
        let mxfp4 = QuantSpec::MXFP4;
        let mlx =
            with(r#""quantization":{"group_size":32,"bits":4,"mode":"mxfp4","model.layers.0.mlp.router":{"group_size":64,"bits":8}}"#);
        let q = mlx.unwrap().1.unwrap();
        assert_eq!(q.default, mxfp4);
        assert_eq!(q.overrides["model.layers.0.mlp.router"], QuantSpec::affine(64, 8));
        let openai = with(r#""quantization_config":{"modules_to_not_convert":["model.layers.*.self_attn"],"quant_method":"mxfp4"}"#);
        assert_eq!(openai.unwrap().1.unwrap().default, mxfp4);
        let err = format!("{:#}", with(r#""quantization_config":{"quant_method":"gptq","bits":4}"#).unwrap_err());
        assert!(err.contains("gptq"), "{err}");
        let err = format!("{:#}", with(r#""quantization":{"group_size":16,"bits":4,"mode":"nvfp4"}"#).unwrap_err());
        assert!(err.contains("nvfp4"), "{err}");
    }
}
