//! gemma3 (Gemma 3: `gemma3_text` checkpoints, and the text model of the multimodal `gemma3`
//! ones, whose vision tower is not read), as mlx-lm's `models/gemma3_text.py` defines it:
//! q/k norms, norms after attention and after the MLP as well as before ("sandwich"),
//! `gelu_approx` MLPs, embeddings scaled by √hidden (rounded to bfloat16 as mlx-lm does),
//! scores scaled by `query_pre_attn_scalar^-½`, and five layers in six (`sliding_window_pattern`)
//! attending to the last `sliding_window` positions only, with their own RoPE base. Gemma's
//! norms multiply by `1 + weight`; the 1 is added here at load, so the shared RMS norm runs
//! them. Config keys (with mlx-lm's defaults, which Google's configs rely on) live here.
use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::{Activation, Arch, LayerStyle, LocalAttention, ModelConfig, QuantizationConfig, RopeConfig};
use super::validate::GgufSummary;
use super::TensorMap;

#[derive(Deserialize)]
struct Keys {
    #[serde(default = "d::hidden")]
    hidden_size: i32,
    #[serde(default = "d::layers")]
    num_hidden_layers: usize,
    #[serde(default = "d::intermediate")]
    intermediate_size: i32,
    #[serde(default = "d::heads")]
    num_attention_heads: i32,
    #[serde(default = "d::head_dim")]
    head_dim: i32,
    #[serde(default = "d::eps")]
    rms_norm_eps: f32,
    #[serde(default = "d::vocab")]
    vocab_size: i32,
    #[serde(default = "d::kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "d::theta")]
    rope_theta: f32,
    #[serde(default = "d::local_theta")]
    rope_local_base_freq: f32,
    #[serde(default = "d::head_dim_f")]
    query_pre_attn_scalar: f32,
    #[serde(default = "d::window")]
    sliding_window: i32,
    #[serde(default = "d::pattern")]
    sliding_window_pattern: usize,
    #[serde(default = "d::ctx")]
    max_position_embeddings: usize,
    rope_scaling: Option<serde_json::Value>,
}

/// mlx-lm's `gemma3_text.ModelArgs` defaults.
mod d {
    pub fn hidden() -> i32 {
        1152
    }
    pub fn layers() -> usize {
        26
    }
    pub fn intermediate() -> i32 {
        6912
    }
    pub fn heads() -> i32 {
        4
    }
    pub fn head_dim() -> i32 {
        256
    }
    pub fn head_dim_f() -> f32 {
        256.0
    }
    pub fn eps() -> f32 {
        1e-6
    }
    pub fn vocab() -> i32 {
        262144
    }
    pub fn kv_heads() -> i32 {
        1
    }
    pub fn theta() -> f32 {
        1_000_000.0
    }
    pub fn local_theta() -> f32 {
        10_000.0
    }
    pub fn window() -> i32 {
        512
    }
    pub fn pattern() -> usize {
        6
    }
    pub fn ctx() -> usize {
        32768
    }
}

/// The model config of a `gemma3_text` config.json, or of a multimodal `gemma3` one's
/// `text_config` (with the outer `vocab_size`, 262208 by default, and mlx-lm's 8 heads over
/// 4 kv heads when unsaid); and the quantization, if any.
pub fn config(json: &str) -> Result<(ModelConfig, Option<QuantizationConfig>)> {
    let outer: serde_json::Value = serde_json::from_str(json).context("config.json")?;
    let text = match outer.get("text_config") {
        Some(tc) if outer.get("model_type").and_then(|t| t.as_str()) == Some("gemma3") => {
            let mut tc = tc.clone();
            let fields = tc.as_object_mut().context("text_config is not an object")?;
            fields.insert("vocab_size".into(), outer.get("vocab_size").cloned().unwrap_or(262208.into()));
            fields.entry("num_attention_heads").or_insert(8.into());
            fields.entry("num_key_value_heads").or_insert(4.into());
            tc
        }
        _ => outer.clone(),
    };
    let k: Keys = serde_json::from_value(text).context("config.json (gemma3 keys)")?;
    if k.sliding_window_pattern == 0 {
        bail!("sliding_window_pattern must be at least 1");
    }
    let mut rope = RopeConfig::plain(k.rope_theta, false);
    if let Some(s) = k.rope_scaling.as_ref().filter(|s| !s.is_null()) {
        match s.get("rope_type").or_else(|| s.get("type")).and_then(|t| t.as_str()).unwrap_or("default") {
            "linear" => rope.position_scale = 1.0 / s.get("factor").and_then(|f| f.as_f64()).context("rope_scaling.factor")? as f32,
            "default" => {}
            other => bail!("unsupported gemma3 rope_scaling type '{other}' (supported: linear)"),
        }
    }
    let quant = super::config::quantization(&outer)?;
    let cfg = ModelConfig {
        arch: Arch::Gemma3,
        hidden_size: k.hidden_size,
        num_layers: k.num_hidden_layers,
        num_heads: k.num_attention_heads,
        num_kv_heads: k.num_key_value_heads,
        head_dim: k.head_dim,
        intermediate_size: k.intermediate_size,
        vocab_size: k.vocab_size,
        rms_norm_eps: k.rms_norm_eps,
        rope,
        // Google's checkpoints have no lm_head: the loader ties the head then, as mlx-lm's
        // sanitize does.
        tie_word_embeddings: false,
        max_position_embeddings: k.max_position_embeddings,
        moe: None,
        style: LayerStyle {
            attn_scale: Some(k.query_pre_attn_scalar.powf(-0.5)),
            local: Some(LocalAttention {
                window: k.sliding_window,
                rope_theta: Some(k.rope_local_base_freq),
                layers: (0..k.num_hidden_layers).map(|i| (i + 1) % k.sliding_window_pattern != 0).collect(),
            }),
            activation: Activation::GeluApprox,
            embed_scale: Some(bf16_round((k.hidden_size as f32).sqrt())),
            sandwich_norms: true,
            attention_sinks: false,
        },
    };
    cfg.validate()?;
    Ok((cfg, quant))
}

/// The model config of a gemma3 GGUF, as llama.cpp's `Gemma3Model` converter writes its
/// header and llama.cpp reads it (`llama_model_gemma3::load_arch_hparams`), put back into the
/// config.json keys [`config`] reads. What the file does not say, llama.cpp fixes: local
/// layers' RoPE base 10000 (`rope.freq_base_swa` when written), five local layers in six
/// (`attention.sliding_window_pattern` as a period when written; all global without
/// `attention.sliding_window`), head_dim hidden / heads, and scores scaled by head_dim^-½
/// except in the 62-layer 27B,
/// which takes (hidden / heads)^-½ as Google's config does. The norms in such a file already
/// hold 1 + weight (the converter adds it), so the loader leaves them.
pub fn config_from_gguf(h: &GgufSummary) -> Result<ModelConfig> {
    let m = |k: &str| h.number(&format!("gemma3.{k}"));
    let req = |k: &str| m(k).with_context(|| format!("GGUF lacks gemma3.{k}"));
    // Counts as integers (metadata numbers arrive as f64), so serde reads them into config.json's integer fields.
    let count = |k: &str| req(k).map(|v| v as u64);
    if m("final_logit_softcapping").is_some_and(|c| c > 0.0) {
        bail!("a gemma3 GGUF with final_logit_softcapping is not supported (Gemma 3 has none; Gemma 2 does)");
    }
    let (layers, hidden, heads) = (count("block_count")?, count("embedding_length")?, count("attention.head_count")?);
    ensure!(heads > 0, "gemma3.attention.head_count is 0");
    let head_dim = m("attention.key_length").map_or(hidden / heads, |d| d as u64);
    let context = m("context_length").map_or(131_072, |c| c as u64);
    // llama.cpp: no window (absent or 0) means no local layer; then every layer is global
    // (a period of 1) and the window, which no layer uses, is the whole context.
    let (window, pattern) =
        match (m("attention.sliding_window").filter(|w| *w > 0.0), h.metadata.get("gemma3.attention.sliding_window_pattern")) {
            (None, _) => (context, 1),
            (Some(w), None) => (w as u64, 6),
            (Some(w), Some(v)) => (
                w as u64,
                v.as_f64().context("a per-layer gemma3.attention.sliding_window_pattern array is not read: only a period")? as u64,
            ),
        };
    let rope_scaling = match h.string("gemma3.rope.scaling.type") {
        None | Some("none") => serde_json::Value::Null,
        Some("linear") => serde_json::json!({"rope_type": "linear", "factor": m("rope.scaling.factor").unwrap_or(1.0)}),
        Some(other) => bail!("unsupported gemma3 GGUF rope scaling '{other}' (supported: linear)"),
    };
    let json = serde_json::json!({
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": count("feed_forward_length")?,
        "num_attention_heads": heads,
        "num_key_value_heads": m("attention.head_count_kv").map_or(heads, |n| n as u64),
        "head_dim": head_dim,
        "rms_norm_eps": m("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        "vocab_size": h.array_len("tokenizer.ggml.tokens").context("GGUF lacks tokenizer.ggml.tokens")?,
        "rope_theta": m("rope.freq_base").unwrap_or(10_000.0),
        "rope_local_base_freq": m("rope.freq_base_swa").unwrap_or(10_000.0),
        "rope_scaling": rope_scaling,
        "query_pre_attn_scalar": if layers == 62 { hidden / heads } else { head_dim },
        "sliding_window": window,
        "sliding_window_pattern": pattern,
        "max_position_embeddings": context,
    });
    let (config, _) = config(&json.to_string())?;
    Ok(config)
}

/// `x` rounded to the nearest bfloat16, as mlx-lm's `mx.array(√hidden, mx.bfloat16)`.
fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// A multimodal checkpoint's text weights under the names a text one has
/// (`language_model.model.*` → `model.*`); the vision tower and projector are dropped.
pub fn text_weights(raw: &mut HashMap<String, Array>) {
    let keys: Vec<String> = raw.keys().cloned().collect();
    for k in keys {
        if let Some(rest) = k.strip_prefix("language_model.") {
            let a = raw.remove(&k).unwrap();
            raw.insert(rest.to_string(), a);
        } else if k.starts_with("vision_tower.") || k.starts_with("multi_modal_projector.") {
            raw.remove(&k);
        }
    }
}

/// Gemma's norms scale by `1 + weight`: add the 1 to every norm vector.
pub fn shift_norms(t: &mut TensorMap) -> Result<()> {
    for (name, v) in t.vectors.iter_mut().filter(|(n, _)| n.ends_with("norm")) {
        *v = v.add(Array::from_f32(1.0).as_dtype(v.dtype())?).with_context(|| format!("{name} + 1"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gemma3 GGUF header with these `gemma3.*` numbers beside the usual ones.
    fn gguf_header(extra: &[(&str, f64)]) -> GgufSummary {
        use super::super::validate::GgufValue;
        let mut metadata: std::collections::BTreeMap<String, GgufValue> = [
            ("block_count", 4.0),
            ("embedding_length", 64.0),
            ("attention.head_count", 4.0),
            ("attention.head_count_kv", 2.0),
            ("feed_forward_length", 128.0),
            ("context_length", 1024.0),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (format!("gemma3.{k}"), GgufValue::Float(*v)))
        .collect();
        metadata.insert("tokenizer.ggml.tokens".into(), GgufValue::Array { len: 320, values: None });
        GgufSummary { version: 3, metadata_entries: 0, tensors: 0, alignment: 32, data_start: 0, metadata, tensor_infos: vec![] }
    }

    #[test]
    fn gguf_windows_as_llama_cpp_reads_them() {
        let local = |c: &ModelConfig| c.style.local.as_ref().map(|l| (l.window, l.layers.clone(), l.rope_theta));
        // No window, or a window of 0: every layer global, as llama.cpp's LLAMA_SWA_TYPE_NONE.
        for extra in [&[][..], &[("attention.sliding_window", 0.0)]] {
            let c = config_from_gguf(&gguf_header(extra)).unwrap();
            assert_eq!(local(&c).map(|l| l.1), Some(vec![false; 4]), "{extra:?}");
            assert_eq!(c.head_dim, 16, "hidden / heads without attention.key_length");
        }
        // A window: five local layers in six, the local RoPE base 10000 unless said.
        let c = config_from_gguf(&gguf_header(&[("attention.sliding_window", 512.0)])).unwrap();
        assert_eq!(local(&c), Some((512, vec![true; 4], Some(10_000.0))));
        let c = config_from_gguf(&gguf_header(&[
            ("attention.sliding_window", 8.0),
            ("attention.sliding_window_pattern", 2.0),
            ("rope.freq_base_swa", 100.0),
        ]))
        .unwrap();
        assert_eq!(local(&c), Some((8, vec![true, false, true, false], Some(100.0))));
        assert!(config_from_gguf(&gguf_header(&[("attention.head_count", 0.0)])).is_err());
    }

    #[test]
    fn google_configs_lean_on_mlx_lms_defaults() {
        // gemma-3-1b-it's config.json, trimmed to what it sets.
        let text = r#"{"model_type":"gemma3_text","hidden_size":1152,"num_hidden_layers":26,"intermediate_size":6912,
            "num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"query_pre_attn_scalar":256,
            "rope_theta":1000000,"rope_local_base_freq":10000,"sliding_window":512,"sliding_window_pattern":6,
            "vocab_size":262144,"rope_scaling":null}"#;
        let (c, q) = config(text).unwrap();
        assert!(q.is_none());
        let local = c.style.local.as_ref().unwrap();
        assert_eq!(local.layers.iter().filter(|l| !**l).count(), 4, "layers 5, 11, 17, 23 are global");
        assert!(!local.layers[5] && local.layers[0] && local.layers[6]);
        assert_eq!(c.style.attn_scale, Some(1.0 / 16.0));
        // √1152 = 33.941…, 34 in bfloat16.
        assert_eq!(c.style.embed_scale, Some(34.0));
        // gemma-3-4b-it's (multimodal): text_config leaves heads and vocab to the defaults.
        let mm = r#"{"model_type":"gemma3","text_config":{"hidden_size":2560,"intermediate_size":10240,"num_hidden_layers":34,
            "rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024},
            "quantization":{"group_size":64,"bits":4}}"#;
        let (c, q) = config(mm).unwrap();
        assert_eq!((c.num_heads, c.num_kv_heads, c.vocab_size, c.rope.position_scale), (8, 4, 262208, 0.125));
        assert_eq!((c.style.local.unwrap().window, q.unwrap().default.bits), (1024, 4));
        assert!(config(&text.replace(r#""rope_scaling":null"#, r#""rope_scaling":{"rope_type":"yarn"}"#)).is_err());
    }

    #[test]
    fn multimodal_weights_keep_only_the_text_model() {
        let mut raw = HashMap::new();
        for k in
            ["language_model.model.norm.weight", "vision_tower.x.weight", "multi_modal_projector.y.weight", "model.embed_tokens.weight"]
        {
            raw.insert(k.to_string(), Array::from_f32(0.0));
        }
        text_weights(&mut raw);
        let mut keys: Vec<&String> = raw.keys().collect();
        keys.sort();
        assert_eq!(keys, ["model.embed_tokens.weight", "model.norm.weight"]);
    }
}
