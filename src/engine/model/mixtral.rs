//! mixtral (Mixtral-8x7B, 8x22B), as mlx-lm's `models/mixtral.py` defines it: llama's
//! attention (no biases, no q/k norms, `head_dim = hidden_size / num_attention_heads`
//! whatever config.json says, plain RoPE at `rope_theta`: mlx-lm reads `rope_scaling` and
//! does not apply it) and in every layer a mixture-of-experts MLP ([`super::switch`]: the
//! top-k router logits, then a softmax over those k, [`Routing::TopKSoftmax`]) of experts as
//! wide as `intermediate_size`. Its config keys and its checkpoints' expert layouts live here.
use std::collections::HashMap;

use anyhow::{Context, Result};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::Activation;
use super::config::ModelConfig;
use super::switch::{MoeConfig, Routing};

/// The keys of `config.json` this family adds to llama's (mlx-lm's defaults).
#[derive(Deserialize)]
struct Keys {
    #[serde(default = "eight")]
    num_local_experts: i32,
    #[serde(default = "two")]
    num_experts_per_tok: i32,
}
fn eight() -> i32 {
    8
}
fn two() -> i32 {
    2
}

/// The experts of a mixtral `config.json` with `layers` layers, each `intermediate_size`
/// wide: every layer is sparse.
pub fn moe_config(json: &str, layers: usize, intermediate_size: i32) -> Result<MoeConfig> {
    let k: Keys = serde_json::from_str(json).context("config.json (mixtral keys)")?;
    Ok(MoeConfig {
        num_experts: k.num_local_experts,
        experts_per_token: k.num_experts_per_tok,
        expert_intermediate_size: intermediate_size,
        routing: Routing::TopKSoftmax,
        activation: Activation::Silu,
        sparse_layers: vec![true; layers],
    })
}

/// What mlx-lm's mixtral computes from a config the llama reader filled: `head_dim` from
/// the hidden size and head count, RoPE unscaled.
pub fn adjust(cfg: &mut ModelConfig) {
    cfg.head_dim = cfg.hidden_size / cfg.num_heads.max(1);
    cfg.rope.llama3_scaling = None;
    cfg.rope.position_scale = 1.0;
}

/// Hugging Face's layout (`model.layers.{l}.block_sparse_moe.experts.{e}.w1|w2|w3.*`: gate,
/// down, up) into the stacked one mlx-community ships
/// (`model.layers.{l}.block_sparse_moe.switch_mlp.{gate_proj,down_proj,up_proj}.*`), as
/// mlx-lm's `sanitize` stacks them. Folders already stacked pass unchanged.
pub fn stack_experts(raw: &mut HashMap<String, Array>, moe: &MoeConfig) -> Result<()> {
    super::switch::stack_experts(raw, moe.num_experts, "block_sparse_moe", |proj| match proj {
        "w1" => Some("gate_proj"),
        "w2" => Some("down_proj"),
        "w3" => Some("up_proj"),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::config::from_hf_config;

    /// Mixtral-8x7B-v0.1's config.json (the keys that matter).
    const MIXTRAL_8X7B: &str = r#"{"model_type":"mixtral","hidden_size":4096,"num_hidden_layers":32,"intermediate_size":14336,
        "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":32000,"rms_norm_eps":1e-5,"rope_theta":1e6,
        "num_local_experts":8,"num_experts_per_tok":2,"max_position_embeddings":32768,"sliding_window":null,
        "tie_word_embeddings":false}"#;

    #[test]
    fn reads_mixtral_8x7b() {
        let (cfg, _) = from_hf_config(MIXTRAL_8X7B).unwrap();
        let moe = cfg.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (8, 2, 14336));
        assert_eq!(moe.routing, Routing::TopKSoftmax);
        assert!((0..32).all(|l| moe.is_sparse(l)));
        assert_eq!(cfg.head_dim, 128);
        assert_eq!(cfg.max_position_embeddings, 32768);
        // mlx-lm ignores head_dim and rope_scaling in a mixtral config.
        let odd = MIXTRAL_8X7B.replace(r#""sliding_window":null"#, r#""head_dim":64,"rope_scaling":{"type":"linear","factor":4.0}"#);
        let (cfg, _) = from_hf_config(&odd).unwrap();
        assert_eq!((cfg.head_dim, cfg.rope.position_scale), (128, 1.0));
    }

    #[test]
    fn per_expert_w1_w2_w3_stack_as_gate_down_up() {
        let (cfg, _) = from_hf_config(MIXTRAL_8X7B).unwrap();
        let moe = cfg.moe.unwrap();
        let mut raw = HashMap::new();
        for e in 0..8 {
            for (w, v) in [("w1", 1.0), ("w2", 2.0), ("w3", 3.0)] {
                raw.insert(
                    format!("model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"),
                    Array::from_slice(&[v + e as f32; 6], &[3, 2]),
                );
            }
        }
        raw.insert("model.layers.0.block_sparse_moe.gate.weight".into(), Array::from_slice(&[0f32; 16], &[8, 2]));
        stack_experts(&mut raw, &moe).unwrap();
        assert_eq!(raw.len(), 4);
        for (name, v) in [("gate_proj", 1.0), ("down_proj", 2.0), ("up_proj", 3.0)] {
            let stacked = &raw[&format!("model.layers.0.block_sparse_moe.switch_mlp.{name}.weight")];
            assert_eq!(stacked.shape(), &[8, 3, 2]);
            assert_eq!(stacked.as_slice::<f32>()[6 * 5], v + 5.0, "{name}");
        }

        raw.insert("model.layers.1.block_sparse_moe.experts.0.w4.weight".into(), Array::from_slice(&[0f32; 6], &[3, 2]));
        let err = format!("{:#}", stack_experts(&mut raw, &moe).unwrap_err());
        assert!(err.contains("unknown expert projection"), "{err}");
    }
}
