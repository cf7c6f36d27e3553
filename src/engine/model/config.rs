//! The hyper-parameters of a transformer, read from a GGUF header or an HF `config.json`:
//! llama's, plus what a family's file ([`super::qwen3_moe`], [`super::mixtral`],
//! [`super::phi3`], [`super::gemma3`], [`super::gpt_oss`]) reads from its own keys: a mixture-of-experts
//! family's [`MoeConfig`], another family's [`LayerStyle`].
use anyhow::{bail, ensure, Context, Result};
use mlx_rs::Dtype;

pub use super::quantized::{QuantMode, QuantSpec};
use serde::Deserialize;

pub use super::switch::MoeConfig;

/// Architectures: llama's block layout (pre-norm, RoPE, GQA, SwiGLU MLP) and the families
/// that vary it through [`MoeConfig`] and [`LayerStyle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// qwen3's attention with sparse (mixture-of-experts) MLPs ([`super::qwen3_moe`]).
    Qwen3Moe,
    /// llama's attention with a mixture of experts in every layer ([`super::mixtral`]).
    Mixtral,
    /// llama with fused projections, partial and LongRoPE-scaled rotation ([`super::phi3`]).
    Phi3,
    /// Gemma 3's sandwich norms, GELU, local/global attention ([`super::gemma3`]).
    Gemma3,
    /// gpt-oss: attention sinks, alternating local/global layers, biased experts
    /// ([`super::gpt_oss`]).
    GptOss,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Arch> {
        Ok(match name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3_moe" => Arch::Qwen3Moe,
            "mixtral" => Arch::Mixtral,
            "phi3" => Arch::Phi3,
            // The multimodal checkpoints' text model is the same (their vision tower is not read).
            "gemma3" | "gemma3_text" => Arch::Gemma3,
            "gpt_oss" => Arch::GptOss,
            other => bail!(
                "unsupported architecture '{other}' (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma3, gpt_oss)"
            ),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
            Arch::GptOss => "gpt_oss",
        }
    }
}

/// Llama 3.x frequency scaling ("rope_type": "llama3").
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    #[serde(default = "one")]
    pub low_freq_factor: f32,
    #[serde(default = "four")]
    pub high_freq_factor: f32,
    #[serde(default = "eight_k")]
    pub original_max_position_embeddings: f32,
}
fn one() -> f32 {
    1.0
}
fn four() -> f32 {
    4.0
}
fn eight_k() -> f32 {
    8192.0
}

#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f32,
    /// Interleaved pairs (GGML order) instead of rotate-half (NeoX/HF order).
    pub traditional: bool,
    pub llama3_scaling: Option<Llama3RopeScaling>,
    /// Linear position scaling (`rope_scaling.type == "linear"`): positions are multiplied by this.
    pub position_scale: f32,
    /// Rotated dimensions when fewer than `head_dim` (phi3's `partial_rotary_factor`).
    pub dims: Option<i32>,
    /// The rotated part of q and k is multiplied by this first (LongRoPE's attention factor).
    pub input_scale: f32,
    /// Per-pair periods a config spells out (LongRoPE's `long_factor` × `theta^(2i/dims)`).
    pub periods: Option<Vec<f32>>,
}

impl RopeConfig {
    /// Unscaled rotation at `theta` over the whole head.
    pub fn plain(theta: f32, traditional: bool) -> RopeConfig {
        RopeConfig { theta, traditional, llama3_scaling: None, position_scale: 1.0, dims: None, input_scale: 1.0, periods: None }
    }
}

/// How a gated MLP (dense or each expert) combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up`.
    Silu,
    /// `gelu_approx(gate) * up` (tanh), Gemma's.
    GeluApprox,
    /// gpt-oss's: `(clip(up, ±7) + 1) * g * sigmoid(1.702 g)` with `g = min(gate, 7)`.
    SwigluOai,
}

/// Local attention: some layers see only the last `window` positions (Gemma 3's five in
/// six, with their own RoPE base; gpt-oss's every other one, with the global RoPE).
#[derive(Debug, Clone, PartialEq)]
pub struct LocalAttention {
    pub window: i32,
    /// Local layers' RoPE base, unscaled; None: the same rotation as the global layers.
    pub rope_theta: Option<f32>,
    /// Per layer: local (true) or global.
    pub layers: Vec<bool>,
}

/// Where a family's layers differ from llama's; [`LayerStyle::llama`] for llama's own.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerStyle {
    /// Attention scores' scale; None: `1/sqrt(head_dim)`.
    pub attn_scale: Option<f32>,
    pub local: Option<LocalAttention>,
    pub activation: Activation,
    /// Embeddings are multiplied by this.
    pub embed_scale: Option<f32>,
    /// Norms on the attention's and the MLP's outputs too, before each residual add.
    pub sandwich_norms: bool,
    /// A learned per-head logit in every softmax of attention (`layers.{i}.sinks`).
    pub attention_sinks: bool,
}

impl LayerStyle {
    pub fn llama() -> LayerStyle {
        LayerStyle {
            attn_scale: None,
            local: None,
            activation: Activation::Silu,
            embed_scale: None,
            sandwich_norms: false,
            attention_sinks: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: i32,
    pub num_layers: usize,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub intermediate_size: i32,
    pub vocab_size: i32,
    pub rms_norm_eps: f32,
    pub rope: RopeConfig,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// The experts of a mixture-of-experts family; None for dense models.
    pub moe: Option<MoeConfig>,
    pub style: LayerStyle,
}

impl ModelConfig {
    /// Bytes of KV cache one token takes in every layer, at `bytes_per_value`.
    pub fn kv_bytes_per_token(&self, bytes_per_value: usize) -> usize {
        2 * self.num_layers * (self.num_kv_heads * self.head_dim) as usize * bytes_per_value
    }

    pub fn validate(&self) -> Result<()> {
        if self.num_heads <= 0 || self.num_kv_heads <= 0 || self.num_heads % self.num_kv_heads != 0 {
            bail!("bad head counts: {} heads, {} kv heads", self.num_heads, self.num_kv_heads);
        }
        if self.head_dim <= 0 || self.head_dim % 2 != 0 {
            bail!("bad head_dim {}", self.head_dim);
        }
        if self.num_layers == 0 || self.hidden_size <= 0 || self.vocab_size <= 0 {
            bail!("empty model: {} layers, hidden {}, vocab {}", self.num_layers, self.hidden_size, self.vocab_size);
        }
        if let Some(moe) = &self.moe {
            moe.validate()?;
        }
        if let Some(d) = self.rope.dims {
            if d <= 0 || d > self.head_dim || d % 2 != 0 {
                bail!("bad rotary dims {d} for head_dim {}", self.head_dim);
            }
        }
        if let Some(local) = &self.style.local {
            if local.window <= 0 || local.layers.len() != self.num_layers {
                bail!("bad local attention: window {}, {} layer flags for {} layers", local.window, local.layers.len(), self.num_layers);
            }
        }
        Ok(())
    }
}

/// `quantization` in an mlx-community `config.json`: defaults plus per-module overrides
/// (or OpenAI's `quantization_config: {"quant_method": "mxfp4"}`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizationConfig {
    pub default: QuantSpec,
    pub overrides: std::collections::HashMap<String, QuantSpec>,
}

impl QuantizationConfig {
    /// How the module at `module` (a path such as `model.layers.0.self_attn.q_proj`) is
    /// packed, as mlx-lm's loader decides: what config.json names for it, else what its
    /// scales say (`u8` scales are mxfp4's), else the default when that is affine.
    pub fn spec(&self, module: &str, scales_dtype: Dtype, weight_cols: i32, scale_cols: i32) -> Result<QuantSpec> {
        if let Some(s) = self.overrides.get(module) {
            return Ok(*s);
        }
        if let Some(s) = QuantMode::infer(scales_dtype, weight_cols, scale_cols).with_context(|| module.to_string())? {
            return Ok(s);
        }
        ensure!(
            self.default.mode == QuantMode::Affine,
            "{module}: float scales (affine quantization) but config.json names no group size and bits for it (its default is {})",
            self.default.mode.name()
        );
        Ok(self.default)
    }
}

/// The subset of HF's `config.json` that the llama family needs.
#[derive(Debug, Deserialize)]
struct HfConfig {
    hidden_size: i32,
    num_hidden_layers: usize,
    intermediate_size: i32,
    num_attention_heads: i32,
    num_key_value_heads: Option<i32>,
    head_dim: Option<i32>,
    vocab_size: i32,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    #[serde(default)]
    rope_traditional: bool,
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default = "default_ctx")]
    max_position_embeddings: usize,
    /// Mistral v0.1's sliding-window attention (qwen2 names one too, switched off by
    /// `use_sliding_window: false`).
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
}
fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10000.0
}
fn default_ctx() -> usize {
    4096
}

/// Parses `config.json`; returns the model config and its quantization, if any.
pub fn from_hf_config(json: &str) -> Result<(ModelConfig, Option<QuantizationConfig>)> {
    // The architecture first: another family's config lacks llama's fields, and "missing
    // field hidden_size" would hide the real reason.
    #[derive(Deserialize)]
    struct ModelType {
        model_type: String,
    }
    let kind: ModelType = serde_json::from_str(json).context("config.json")?;
    let arch = Arch::parse(&kind.model_type).context("config.json model_type")?;
    match arch {
        // Its own keys and defaults (mlx-lm's), nested under text_config when multimodal.
        Arch::Gemma3 => return super::gemma3::config(json),
        Arch::GptOss => return super::gpt_oss::config(json),
        _ => {}
    }
    let hf: HfConfig = serde_json::from_str(json).context("config.json")?;
    let mut rope = RopeConfig::plain(hf.rope_theta, hf.rope_traditional);
    // phi3 reads its own scaling (LongRoPE) in phi3::adjust.
    if let Some(scaling) = hf.rope_scaling.as_ref().filter(|_| arch != Arch::Phi3) {
        if !scaling.is_null() {
            let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
            match kind {
                "llama3" => rope.llama3_scaling = Some(serde_json::from_value(scaling.clone()).context("rope_scaling")?),
                "linear" => {
                    let factor = scaling.get("factor").and_then(|v| v.as_f64()).unwrap_or(1.0) as f32;
                    rope.position_scale = 1.0 / factor;
                }
                "default" => {}
                other => bail!("unsupported rope_scaling type '{other}'"),
            }
        }
    }
    let quant = quantization(&serde_json::from_str(json).context("config.json")?)?;
    let mut cfg = ModelConfig {
        arch,
        hidden_size: hf.hidden_size,
        num_layers: hf.num_hidden_layers,
        num_heads: hf.num_attention_heads,
        num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads),
        intermediate_size: hf.intermediate_size,
        vocab_size: hf.vocab_size,
        rms_norm_eps: hf.rms_norm_eps,
        rope,
        // HF's default: llama/mistral untie, but checkpoints say so explicitly; a missing
        // lm_head weight also means tied (checked by the loader).
        tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
        // Attention here is over the whole context; within the window that is exactly what a
        // sliding-window model computes, so the context stops at the window.
        max_position_embeddings: match (hf.sliding_window, hf.use_sliding_window) {
            (Some(w), None | Some(true)) => hf.max_position_embeddings.min(w),
            _ => hf.max_position_embeddings,
        },
        moe: match arch {
            Arch::Qwen3Moe => Some(super::qwen3_moe::moe_config(json, hf.num_hidden_layers)?),
            Arch::Mixtral => Some(super::mixtral::moe_config(json, hf.num_hidden_layers, hf.intermediate_size)?),
            _ => None,
        },
        style: LayerStyle::llama(),
    };
    match arch {
        Arch::Mixtral => super::mixtral::adjust(&mut cfg),
        Arch::Phi3 => super::phi3::adjust(&mut cfg, json)?,
        _ => {}
    }
    cfg.validate()?;
    Ok((cfg, quant))
}

/// A config.json's `quantization` (None when absent or not an object), else its
/// `quantization_config` when that is OpenAI's MXFP4 (gpt-oss as OpenAI ships it); any other
/// `quant_method` (GPTQ, AWQ, FP8, bitsandbytes) is refused by name.
pub fn quantization(config: &serde_json::Value) -> Result<Option<QuantizationConfig>> {
    if let Some(q) = config.get("quantization").filter(|q| q.is_object()) {
        return parse_quantization(q).map(Some);
    }
    let Some(method) = config.get("quantization_config").and_then(|q| q.get("quant_method")) else { return Ok(None) };
    match method.as_str() {
        Some("mxfp4") => Ok(Some(QuantizationConfig { default: QuantSpec::MXFP4, overrides: Default::default() })),
        _ => bail!("unsupported quantization_config.quant_method {method} (supported: MLX's quantization, OpenAI's mxfp4)"),
    }
}

fn parse_quantization(q: &serde_json::Value) -> Result<QuantizationConfig> {
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_i64()).map(|x| x as i32);
    let mode = |v: &serde_json::Value| v.get("mode").and_then(|m| m.as_str()).map_or(Ok(QuantMode::Affine), QuantMode::parse);
    let default = QuantSpec {
        group_size: num(q, "group_size").context("quantization.group_size")?,
        bits: num(q, "bits").context("quantization.bits")?,
        mode: mode(q)?,
    };
    let mut out = QuantizationConfig { default: default.validate()?, overrides: Default::default() };
    for (k, v) in q.as_object().into_iter().flatten() {
        if let (Some(group_size), Some(bits)) = (num(v, "group_size"), num(v, "bits")) {
            let spec = QuantSpec { group_size, bits, mode: mode(v).with_context(|| format!("quantization.{k}"))? };
            out.overrides.insert(k.clone(), spec.validate().with_context(|| format!("quantization.{k}"))?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mlx_community_quantized_config() {
        let json = r#"{"model_type":"llama","hidden_size":576,"num_hidden_layers":30,"intermediate_size":1536,
            "num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,"rms_norm_eps":1e-5,
            "rope_theta":100000.0,"tie_word_embeddings":true,"max_position_embeddings":8192,
            "quantization":{"group_size":32,"bits":4,"model.embed_tokens":{"group_size":32,"bits":8}}}"#;
        let (cfg, q) = from_hf_config(json).unwrap();
        assert_eq!(cfg.head_dim, 64);
        assert!(cfg.tie_word_embeddings);
        let q = q.unwrap();
        assert_eq!(q.spec("model.embed_tokens", Dtype::Float16, 72, 18).unwrap(), QuantSpec::affine(32, 8));
        assert_eq!(q.spec("model.layers.0.mlp.up_proj", Dtype::Float16, 72, 18).unwrap(), QuantSpec::affine(32, 4));
        assert_eq!(cfg.kv_bytes_per_token(4), 2 * 30 * 192 * 4);
    }

    #[test]
    fn parses_llama3_rope_scaling_and_rejects_unknown_arch() {
        let json = r#"{"model_type":"llama","hidden_size":2048,"num_hidden_layers":16,"intermediate_size":8192,
            "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
            "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let (cfg, q) = from_hf_config(json).unwrap();
        assert!(q.is_none());
        assert_eq!(cfg.rope.llama3_scaling.unwrap().factor, 32.0);
        assert!(from_hf_config(&json.replace("\"llama\"", "\"gpt2\"")).is_err());
        // GPT-2's own config has none of llama's fields: the architecture is still what is named.
        let gpt2 = r#"{"model_type":"gpt2","n_embd":768,"n_head":12,"n_layer":12,"vocab_size":50257}"#;
        let err = format!("{:#}", from_hf_config(gpt2).unwrap_err());
        assert!(err.contains("unsupported architecture 'gpt2'"), "{err}");
    }

    #[test]
    fn a_sliding_window_bounds_the_context_unless_switched_off() {
        let base = r#"{"model_type":"mistral","hidden_size":64,"num_hidden_layers":2,"intermediate_size":128,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":320,"max_position_embeddings":32768"#;
        let ctx = |extra: &str| from_hf_config(&format!("{base}{extra}}}")).unwrap().0.max_position_embeddings;
        assert_eq!(ctx(""), 32768);
        assert_eq!(ctx(r#","sliding_window":null"#), 32768);
        assert_eq!(ctx(r#","sliding_window":4096"#), 4096);
        assert_eq!(ctx(r#","sliding_window":4096,"use_sliding_window":false"#), 32768);
    }
}
