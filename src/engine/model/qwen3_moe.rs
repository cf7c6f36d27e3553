//! qwen3_moe (Qwen3-30B-A3B, Qwen3-235B-A22B), as mlx-lm's `models/qwen3_moe.py` defines
//! it: qwen3's attention (q/k norms) and, in the layers its config makes sparse, a
//! mixture-of-experts MLP ([`super::switch`]: softmax router, top-k, `norm_topk_prob`)
//! instead of the dense one. Its config keys and its checkpoints' expert layouts live here.
use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use mlx_rs::Array;
use serde::Deserialize;

use super::config::Activation;
use super::switch::{MoeConfig, Routing};

/// The keys of `config.json` this family adds to qwen3's.
#[derive(Deserialize)]
struct Keys {
    num_experts: i32,
    num_experts_per_tok: i32,
    moe_intermediate_size: i32,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    #[serde(default)]
    norm_topk_prob: bool,
}
fn one() -> usize {
    1
}

/// The experts of a qwen3_moe `config.json` with `layers` layers. A layer is sparse unless
/// `mlp_only_layers` names it, when `num_experts > 0` and `(layer + 1) % decoder_sparse_step
/// == 0` (mlx-lm's rule).
pub fn moe_config(json: &str, layers: usize) -> Result<MoeConfig> {
    let k: Keys = serde_json::from_str(json).context("config.json (qwen3_moe keys)")?;
    if k.decoder_sparse_step == 0 {
        bail!("decoder_sparse_step must be at least 1");
    }
    let sparse_layers =
        (0..layers).map(|l| !k.mlp_only_layers.contains(&l) && k.num_experts > 0 && (l + 1) % k.decoder_sparse_step == 0).collect();
    Ok(MoeConfig {
        num_experts: k.num_experts,
        experts_per_token: k.num_experts_per_tok,
        expert_intermediate_size: k.moe_intermediate_size,
        routing: Routing::Softmax { renormalize: k.norm_topk_prob },
        activation: Activation::Silu,
        sparse_layers,
    })
}

/// Hugging Face's layout (one tensor per expert, `model.layers.{l}.mlp.experts.{e}.{proj}.*`)
/// into the stacked one mlx-community ships (`model.layers.{l}.mlp.switch_mlp.{proj}.*`,
/// `[experts, out, in]`), as mlx-lm's `sanitize` stacks them: every expert of a layer must
/// be there. Folders already stacked pass unchanged.
pub fn stack_experts(raw: &mut HashMap<String, Array>, moe: &MoeConfig) -> Result<()> {
    super::switch::stack_experts(raw, moe.num_experts, "mlp", |proj| Some(proj))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"{"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":4,"intermediate_size":128,
        "num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"vocab_size":320,
        "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":32"#;

    fn sparse(extra: &str) -> Vec<bool> {
        moe_config(&format!("{BASE}{extra}}}"), 4).unwrap().sparse_layers
    }

    #[test]
    fn sparse_layers_follow_mlx_lms_rule() {
        assert_eq!(sparse(""), [true; 4]);
        assert_eq!(sparse(r#","decoder_sparse_step":2"#), [false, true, false, true]);
        assert_eq!(sparse(r#","mlp_only_layers":[0,3]"#), [false, true, true, false]);
        assert_eq!(sparse(r#","decoder_sparse_step":2,"mlp_only_layers":[1]"#), [false, false, false, true]);
        let moe = moe_config(&format!("{BASE},\"norm_topk_prob\":true}}"), 4).unwrap();
        assert!(moe.routing == Routing::Softmax { renormalize: true } && moe.experts_per_token == 2 && moe.expert_intermediate_size == 32);
        assert!(moe_config(&format!("{BASE},\"decoder_sparse_step\":0}}"), 4).is_err());
    }

    #[test]
    fn per_expert_tensors_stack_in_expert_order() {
        let moe = moe_config(&format!("{BASE}}}"), 4).unwrap();
        let mut raw = HashMap::new();
        for e in 0..8 {
            raw.insert(format!("model.layers.0.mlp.experts.{e}.up_proj.weight"), Array::from_slice(&[e as f32; 6], &[3, 2]));
        }
        raw.insert("model.layers.0.mlp.gate.weight".into(), Array::from_slice(&[0f32; 16], &[8, 2]));
        stack_experts(&mut raw, &moe).unwrap();
        let stacked = &raw["model.layers.0.mlp.switch_mlp.up_proj.weight"];
        assert_eq!(stacked.shape(), &[8, 3, 2]);
        assert_eq!(stacked.as_slice::<f32>()[6 * 5], 5.0);
        assert!(raw.contains_key("model.layers.0.mlp.gate.weight"));
        assert_eq!(raw.len(), 2);

        raw.insert("model.layers.1.mlp.experts.0.up_proj.weight".into(), Array::from_slice(&[0f32; 6], &[3, 2]));
        let err = format!("{:#}", stack_experts(&mut raw, &moe).unwrap_err());
        assert!(err.contains("missing model.layers.1.mlp.experts.1.up_proj.weight"), "{err}");
    }
}
