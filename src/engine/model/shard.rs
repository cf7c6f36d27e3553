//! Tensor parallel: one rank's share of every layer, cut as mlx-lm's `shard()` cuts llama's.
//! Each rank holds a contiguous run of the attention heads (its rows of q, k and v, its
//! columns of o) and of the MLP's hidden units (its rows of gate and up, its columns of
//! down); o's and down's outputs are then partial sums, which an `all_sum` over the ranks
//! adds up ([`Reduce`]) before the residual add. Norms are held whole on every rank; the
//! embedding and head on rank 0 only, which samples (the others are handed the embedded
//! input).
use std::rc::Rc;

use anyhow::{bail, ensure, Result};
use mlx_rs::Array;

use super::config::{Arch, LayerStyle, ModelConfig};
use super::linear::{Quantized, Weight};
use super::quantized::{QuantMode, QuantSpec};

/// Adds up a partial output over the ranks (MLX's `all_sum`), lazily.
pub type Reduce = Rc<dyn Fn(&Array) -> Result<Array>>;

/// Which share of each layer a rank holds: `rank` of `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Shard {
    pub rank: usize,
    pub of: usize,
}

impl Shard {
    /// Why `config` (its projections quantized as `quantization`, None when float) cannot
    /// be split over `ranks` by heads, if it cannot: llama, mistral, qwen2 and qwen3 only;
    /// heads, KV heads and the MLP's hidden units divisible by the ranks; and each rank's
    /// columns of o and down on whole quantization groups.
    pub fn refusal(config: &ModelConfig, ranks: usize, quantization: Option<QuantSpec>) -> Option<String> {
        let n = ranks as i32;
        let llama_style = matches!(config.arch, Arch::Llama | Arch::Mistral | Arch::Qwen2 | Arch::Qwen3);
        if !llama_style || config.moe.is_some() || config.style != LayerStyle::llama() {
            return Some(format!("tensor parallel splits llama, mistral, qwen2 and qwen3 layers only, not {:?}'s", config.arch));
        }
        let uneven: Vec<String> =
            [("attention heads", config.num_heads), ("KV heads", config.num_kv_heads), ("MLP units", config.intermediate_size)]
                .iter()
                .filter(|(_, v)| v % n != 0)
                .map(|(what, v)| format!("{v} {what}"))
                .collect();
        if !uneven.is_empty() {
            return Some(format!("{} do not split evenly over {ranks} ranks", uneven.join(" and ")));
        }
        let q = quantization?;
        let columns = [config.num_heads * config.head_dim / n, config.intermediate_size / n];
        let unit = match q.mode {
            QuantMode::Affine => q.group_size.max(32 / q.bits),
            QuantMode::Mxfp4 => return Some("tensor parallel splits affine-quantized or float weights only".into()),
        };
        columns
            .iter()
            .find(|c| *c % unit != 0)
            .map(|c| format!("{c} columns a rank do not fall on {}-column quantization groups", q.group_size))
    }

    /// The config of one rank's share: its heads and MLP units.
    pub fn local(&self, config: &ModelConfig) -> ModelConfig {
        let n = self.of as i32;
        ModelConfig {
            num_heads: config.num_heads / n,
            num_kv_heads: config.num_kv_heads / n,
            intermediate_size: config.intermediate_size / n,
            ..config.clone()
        }
    }

    /// This rank's consecutive share of `total`: `[start, end)`.
    fn range(&self, total: i32) -> (i32, i32) {
        let n = total / self.of as i32;
        (self.rank as i32 * n, (self.rank as i32 + 1) * n)
    }

    /// This rank's output rows of `w` (q, k, v, gate, up), copied out (a slice would keep
    /// the whole tensor's buffer alive).
    pub fn rows(&self, w: Weight) -> Result<Weight> {
        let (a, b) = self.range(w.out_features());
        let idx = indices(a, b);
        Ok(match w {
            Weight::Dense(m) => Weight::Dense(m.take_axis(&idx, 0)?),
            Weight::Quantized(q) => Weight::Quantized(q.map_all(|x| Ok(x.take_axis(&idx, 0)?))?),
        })
    }

    /// This rank's rows of a bias or other per-output vector.
    pub fn vector_rows(&self, v: Array) -> Result<Array> {
        let (a, b) = self.range(v.shape()[0]);
        Ok(v.take_axis(indices(a, b), 0)?)
    }

    /// This rank's input columns of `w` (o, down), of `inputs` in all; quantized groups and
    /// packed words must not straddle two ranks.
    pub fn columns(&self, w: Weight, inputs: i32) -> Result<Weight> {
        let (a, b) = self.range(inputs);
        Ok(match w {
            Weight::Dense(m) => Weight::Dense(m.take_axis(indices(a, b), 1)?),
            Weight::Quantized(q) => {
                ensure!(q.mode == QuantMode::Affine, "tensor parallel splits affine-quantized or float weights only");
                ensure!(!q.strips, "tensor parallel splits weights in MLX's layout only");
                let per_word = 32 / q.bits;
                if a % q.group_size != 0 || a % per_word != 0 {
                    bail!("{} columns a rank do not fall on {}-column quantization groups", b - a, q.group_size);
                }
                let (words, groups) = (indices(a / per_word, b / per_word), indices(a / q.group_size, b / q.group_size));
                Weight::Quantized(Quantized {
                    weight: q.weight.take_axis(&words, 1)?,
                    scales: q.scales.take_axis(&groups, 1)?,
                    biases: q.biases.map(|x| x.take_axis(&groups, 1)).transpose()?,
                    ..q
                })
            }
        })
    }
}

fn indices(a: i32, b: i32) -> Array {
    let v: Vec<i32> = (a..b).collect();
    Array::from_slice(&v, &[b - a])
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, Dtype};

    use super::super::quantized::QuantSpec;
    use super::*;

    fn max_diff(a: &Array, b: &Array) -> f32 {
        a.subtract(b).unwrap().abs().unwrap().max(None).unwrap().item_exact::<f32>()
    }

    /// Each rank's packed rows and columns are the whole matrix's, bit for bit once
    /// dequantized; and the ranks' partial products add up to the whole product (what
    /// the all_sum does).
    #[test]
    fn shares_of_a_packed_matrix_add_up_to_it() {
        let w = mlx_rs::random::normal::<f32>(&[96, 192], None, None, None).unwrap();
        let (weight, scales, biases) = ops::quantize(&w, 32, 4).unwrap();
        let q = Weight::Quantized(Quantized::new(weight, scales, Some(biases), QuantSpec::affine(32, 4)).unwrap());
        let whole = match &q {
            Weight::Quantized(q) => q.dequantize(Dtype::Float32).unwrap(),
            _ => unreachable!(),
        };
        let dense = |w: Weight| match w {
            Weight::Quantized(q) => q.dequantize(Dtype::Float32).unwrap(),
            Weight::Dense(d) => d,
        };
        let x = mlx_rs::random::normal::<f32>(&[2, 192], None, None, None).unwrap();
        let mut sum = ops::zeros::<f32>(&[2, 96]).unwrap();
        for rank in 0..3 {
            let shard = Shard { rank, of: 3 };
            let rows = dense(shard.rows(q.clone()).unwrap());
            let want = whole.take_axis(indices(rank as i32 * 32, rank as i32 * 32 + 32), 0).unwrap();
            assert_eq!(max_diff(&rows, &want), 0.0);
            let cols = dense(shard.columns(q.clone(), 192).unwrap());
            let (a, b) = (rank as i32 * 64, rank as i32 * 64 + 64);
            assert_eq!(max_diff(&cols, &whole.take_axis(indices(a, b), 1).unwrap()), 0.0);
            let part = x.take_axis(indices(a, b), 1).unwrap();
            sum = sum.add(ops::matmul(&part, cols.t()).unwrap()).unwrap();
        }
        assert!(max_diff(&sum, &ops::matmul(&x, whole.t()).unwrap()) < 1e-4);
    }

    #[test]
    fn columns_that_straddle_a_quantization_group_are_refused() {
        let w = mlx_rs::random::normal::<f32>(&[8, 96], None, None, None).unwrap();
        let (weight, scales, biases) = ops::quantize(&w, 32, 4).unwrap();
        let q = Weight::Quantized(Quantized::new(weight, scales, Some(biases), QuantSpec::affine(32, 4)).unwrap());
        // 96 columns over 2 ranks: 48 each, rank 1 would start mid-group.
        let e = Shard { rank: 1, of: 2 }.columns(q, 96).err().unwrap().to_string();
        assert!(e.contains("48 columns a rank do not fall on 32-column quantization groups"), "{e}");
    }

    #[test]
    fn refusals_name_what_does_not_split() {
        // SmolLM2-135M's shape, as its config.json says it.
        let json = r#"{"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000,
            "tie_word_embeddings": true, "max_position_embeddings": 8192}"#;
        let (c, _) = crate::engine::model::config::from_hf_config(json).unwrap();
        let q4 = |group| Some(QuantSpec::affine(group, 4));
        assert_eq!(Shard::refusal(&c, 3, q4(32)), None);
        assert_eq!(Shard::refusal(&c, 2, q4(32)).unwrap(), "9 attention heads and 3 KV heads do not split evenly over 2 ranks");
        // 192 columns of o a rank: whole groups of 32 or 64, not of 128.
        assert_eq!(Shard::refusal(&c, 3, q4(64)), None);
        assert_eq!(Shard::refusal(&c, 3, q4(128)).unwrap(), "192 columns a rank do not fall on 128-column quantization groups");
        let phi3 = ModelConfig { arch: Arch::Phi3, ..c.clone() };
        assert!(Shard::refusal(&phi3, 3, None).unwrap().contains("not Phi3's"));
        let local = Shard { rank: 2, of: 3 }.local(&c);
        assert_eq!((local.num_heads, local.num_kv_heads, local.intermediate_size, local.hidden_size), (3, 1, 512, 576));
    }
}
