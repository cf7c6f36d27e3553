//! phi3 (Phi-3, Phi-3.5, Phi-4-mini), as mlx-lm's `models/phi3.py` defines it: llama's
//! block with q|k|v and gate|up each stored as one fused projection (split here at load, so
//! the shared pieces fuse them again as they do for every family), `head_dim = hidden_size /
//! num_attention_heads`, RoPE over the first `partial_rotary_factor` of each head, and
//! LongRoPE (`rope_scaling.type` `longrope` / `su`): per-pair `long_factor`s stretch the
//! periods and the rotated part of q and k is scaled by the attention factor first. As in
//! mlx-lm, the long factors apply at every length (`short_factor` is not used). GGUFs
//! (llama.cpp's `Phi3MiniModel`) store the same: see [`adjust_gguf`].
use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};
use mlx_rs::{ops, Array};
use serde::Deserialize;

use super::config::ModelConfig;
use super::validate::GgufSummary;

#[derive(Deserialize)]
struct Keys {
    #[serde(default = "one")]
    partial_rotary_factor: f32,
    rope_scaling: Option<Scaling>,
    #[serde(default = "long_ctx")]
    max_position_embeddings: f32,
    #[serde(default = "four_k")]
    original_max_position_embeddings: f32,
}

#[derive(Deserialize)]
struct Scaling {
    #[serde(alias = "rope_type")]
    r#type: String,
    factor: Option<f32>,
    long_factor: Option<Vec<f32>>,
    long_mscale: Option<f32>,
}
fn one() -> f32 {
    1.0
}
fn long_ctx() -> f32 {
    131072.0
}
fn four_k() -> f32 {
    4096.0
}

/// What phi3 computes from a config the llama reader filled: its head size, partial
/// rotation and RoPE scaling.
pub fn adjust(cfg: &mut ModelConfig, json: &str) -> Result<()> {
    let k: Keys = serde_json::from_str(json).context("config.json (phi3 keys)")?;
    cfg.head_dim = cfg.hidden_size / cfg.num_heads.max(1);
    let dims = (cfg.head_dim as f32 * k.partial_rotary_factor) as i32;
    if dims != cfg.head_dim {
        cfg.rope.dims = Some(dims);
    }
    match k.rope_scaling {
        None => {}
        Some(s) if s.r#type == "linear" => cfg.rope.position_scale = 1.0 / s.factor.context("rope_scaling.factor")?,
        Some(s) if s.r#type == "longrope" || s.r#type == "su" => {
            let long = s.long_factor.context("rope_scaling.long_factor")?;
            ensure!(long.len() as i32 == dims / 2, "rope_scaling.long_factor has {} values for {} rotated dims", long.len(), dims);
            cfg.rope.periods = Some(long.iter().enumerate().map(|(i, f)| f * cfg.rope.theta.powf(2.0 * i as f32 / dims as f32)).collect());
            let factor = k.max_position_embeddings / k.original_max_position_embeddings;
            cfg.rope.input_scale = s.long_mscale.unwrap_or(if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / k.original_max_position_embeddings.ln()).sqrt()
            });
        }
        Some(s) => bail!("unsupported phi3 rope_scaling type '{}' (supported: linear, longrope, su)", s.r#type),
    }
    Ok(())
}

/// What llama.cpp's converter writes for phi3 beyond llama's keys: the rotated dims
/// (`phi3.rope.dimension_count`), LongRoPE's attention factor (`rope.scaling.attn_factor`,
/// beside the `rope_factors_long` tensor the loader turns into periods) and the sliding
/// window (0 for Phi-4, which has none). The head size is `hidden / heads`, as for folders.
pub fn adjust_gguf(cfg: &mut ModelConfig, h: &GgufSummary) -> Result<()> {
    cfg.head_dim = cfg.hidden_size / cfg.num_heads.max(1);
    let m = |k: &str| h.number(&format!("phi3.{k}"));
    if let Some(d) = m("rope.dimension_count") {
        let d = d as i32;
        ensure!(d > 0 && d % 2 == 0 && d <= cfg.head_dim, "phi3.rope.dimension_count {d} for heads of {}", cfg.head_dim);
        cfg.rope.dims = (d != cfg.head_dim).then_some(d);
    }
    if h.tensor_infos.iter().any(|t| t.name == "rope_factors_long.weight") {
        cfg.rope.input_scale = m("rope.scaling.attn_factor").unwrap_or(1.0) as f32;
    }
    if let Some(w) = m("attention.sliding_window").filter(|w| *w > 0.0) {
        cfg.max_position_embeddings = cfg.max_position_embeddings.min(w as usize);
    }
    Ok(())
}

/// `self_attn.qkv_proj` into `q_proj`/`k_proj`/`v_proj` and `mlp.gate_up_proj` into
/// `gate_proj`/`up_proj` (weight, and scales and biases when quantized: rows are output
/// features in all three).
pub fn split_fused(raw: &mut HashMap<String, Array>, cfg: &ModelConfig) -> Result<()> {
    let (q, kv) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let fused: Vec<String> = raw.keys().filter(|k| k.contains(".qkv_proj.") || k.contains(".gate_up_proj.")).cloned().collect();
    for key in fused {
        let a = raw.remove(&key).unwrap();
        let (parts, at): (&[&str], Vec<i32>) = if key.contains(".qkv_proj.") {
            (&["q_proj", "k_proj", "v_proj"], vec![q, q + kv])
        } else {
            (&["gate_proj", "up_proj"], vec![cfg.intermediate_size])
        };
        let rows: i32 = if parts.len() == 3 { q + 2 * kv } else { 2 * cfg.intermediate_size };
        ensure!(a.shape().first() == Some(&rows), "{key}: {} rows, config says {rows}", a.shape().first().copied().unwrap_or(0));
        let from = if parts.len() == 3 { "qkv_proj" } else { "gate_up_proj" };
        for (name, piece) in parts.iter().zip(ops::split_at_indices(&a, &at, 0)?) {
            raw.insert(key.replace(from, name), piece);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::config::from_hf_config;

    const BASE: &str = r#"{"model_type":"phi3","hidden_size":64,"num_hidden_layers":2,"intermediate_size":128,
        "num_attention_heads":4,"num_key_value_heads":2,"head_dim":99,"vocab_size":320,"rope_theta":10000.0"#;

    #[test]
    fn head_size_partial_rotation_and_longrope() {
        let (c, _) = from_hf_config(&format!("{BASE}}}")).unwrap();
        assert_eq!((c.head_dim, c.rope.dims, c.rope.input_scale, c.rope.periods.as_ref()), (16, None, 1.0, None));
        let long: Vec<f32> = (0..6).map(|i| 1.0 + i as f32).collect();
        let json = format!(
            r#"{BASE},"partial_rotary_factor":0.75,"max_position_embeddings":8192,"original_max_position_embeddings":512,
            "rope_scaling":{{"type":"longrope","long_factor":{long:?},"short_factor":{long:?}}}}}"#
        );
        let (c, _) = from_hf_config(&json).unwrap();
        assert_eq!(c.rope.dims, Some(12));
        let p = c.rope.periods.unwrap();
        assert_eq!(p[0], 1.0);
        assert!((p[5] - 6.0 * 10000f32.powf(10.0 / 12.0)).abs() < 1e-2);
        assert!((c.rope.input_scale - (1.0 + 16f32.ln() / 512f32.ln()).sqrt()).abs() < 1e-6);
        assert!(from_hf_config(&json.replace("longrope", "yarn")).is_err());
        assert!(from_hf_config(&json.replace("0.75", "0.5")).is_err(), "long_factor must match the rotated dims");
    }

    #[test]
    fn fused_projections_split_by_rows() {
        let (c, _) = from_hf_config(&format!("{BASE}}}")).unwrap();
        let mut raw = HashMap::new();
        let rows = 64 + 2 * 32;
        let qkv: Vec<f32> = (0..rows * 2).map(|i| (i / 2) as f32).collect();
        raw.insert("model.layers.0.self_attn.qkv_proj.weight".to_string(), Array::from_slice(&qkv, &[rows, 2]));
        raw.insert("model.layers.0.mlp.gate_up_proj.scales".to_string(), Array::from_slice(&[0f32; 256], &[256, 1]));
        split_fused(&mut raw, &c).unwrap();
        let k = &raw["model.layers.0.self_attn.k_proj.weight"];
        assert_eq!((k.shape(), k.as_slice::<f32>()[0]), (&[32, 2][..], 64.0));
        assert_eq!(raw["model.layers.0.self_attn.v_proj.weight"].as_slice::<f32>()[0], 96.0);
        assert_eq!(raw["model.layers.0.mlp.up_proj.scales"].shape(), &[128, 1]);
        assert_eq!(raw.len(), 5);
        raw.insert("model.layers.1.self_attn.qkv_proj.weight".to_string(), Array::from_slice(&[0f32; 4], &[2, 2]));
        assert!(split_fused(&mut raw, &c).is_err());
    }
}
