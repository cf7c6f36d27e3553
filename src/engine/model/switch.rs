//! The mixture-of-experts MLP every MoE family shares, as mlx-lm's `switch_layers.py` and
//! its families' sparse blocks compute it: a router picks the top-k experts of each token
//! the family's way ([`Routing`]: qwen3_moe's softmax over all experts, then the k largest,
//! optionally renormalized to sum to 1; mixtral's k largest logits, then a softmax over
//! those k), a SwitchGLU runs each token through its k experts (`gather_mm` over
//! stacked float experts, `gather_qmm` over stacked quantized ones, tokens sorted by
//! expert when there are many, so each expert's weights are read in one run), and the
//! experts' outputs are summed weighted by their router scores.
//!
//! On the CPU this is correct but slow: MLX's `gather_qmm` there is a single-threaded
//! matrix-vector product per (token, expert) pair, with no reuse between tokens routed to
//! the same expert (a Qwen3-30B-A3B-shaped layer, 4-bit: ~36 ms for one token, ~300 ms for
//! eight, against ~2 ms to read the experts once). The fast path is a primitive of ours
//! beside `cpu_backend::affine_qmm` (see issue 24).
use std::collections::HashMap;
use std::rc::Rc;

use anyhow::{bail, ensure, Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::config::Activation;
use super::linear::Weight;
use crate::engine::experts::ExpertStore;

/// Experts of a mixture-of-experts model, from its family's config keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: i32,
    /// k: experts each token runs through.
    pub experts_per_token: i32,
    /// Each expert's gated MLP width.
    pub expert_intermediate_size: i32,
    /// How each expert combines gate and up.
    pub activation: Activation,
    /// How the router's logits become each token's experts and their weights.
    pub routing: Routing,
    /// Per layer: sparse (experts) or dense (the family's plain MLP).
    pub sparse_layers: Vec<bool>,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }

    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.num_experts > 0 && self.experts_per_token > 0 && self.experts_per_token <= self.num_experts,
            "bad expert counts: {} experts, {} per token",
            self.num_experts,
            self.experts_per_token
        );
        ensure!(self.expert_intermediate_size > 0, "bad expert intermediate size {}", self.expert_intermediate_size);
        Ok(())
    }
}

/// How a family turns router logits into the top-k experts and their weights, as its
/// mlx-lm block computes them (equal in exact arithmetic when `Softmax` renormalizes, not
/// in rounding: each is followed as written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// qwen3_moe: softmax over every expert, the k most probable, their probabilities
    /// renormalized to sum to 1 when `renormalize` (`norm_topk_prob`).
    Softmax { renormalize: bool },
    /// mixtral: the k largest logits, then a softmax over those k.
    TopKSoftmax,
}

/// A checkpoint's experts one tensor each (`{prefix}.{block}.experts.{e}.{proj}.{suffix}`,
/// Hugging Face's layout) stacked on a new leading axis into
/// `{prefix}.{block}.switch_mlp.{name(proj)}.{suffix}` (mlx-community's layout), as the
/// families' `sanitize` in mlx-lm stacks them: every one of the `experts` must be there, and
/// a projection `name` does not know is an error. Tensors already stacked pass unchanged.
pub fn stack_experts(raw: &mut HashMap<String, Array>, experts: i32, block: &str, name: impl Fn(&str) -> Option<&str>) -> Result<()> {
    let first = format!(".{block}.experts.0.");
    let mut groups: Vec<(String, String, String)> = raw
        .keys()
        .filter_map(|k| {
            let (prefix, rest) = k.split_once(&first)?;
            let (proj, suffix) = rest.split_once('.')?;
            Some((prefix.to_string(), proj.to_string(), suffix.to_string()))
        })
        .collect();
    groups.sort();
    for (prefix, proj, suffix) in groups {
        let stacked = name(&proj).with_context(|| format!("unknown expert projection {prefix}.{block}.experts.0.{proj}"))?;
        let parts = (0..experts)
            .map(|e| {
                let key = format!("{prefix}.{block}.experts.{e}.{proj}.{suffix}");
                raw.remove(&key).with_context(|| format!("missing {key} ({experts} experts)"))
            })
            .collect::<Result<Vec<Array>>>()?;
        raw.insert(format!("{prefix}.{block}.switch_mlp.{stacked}.{suffix}"), ops::stack(&parts, 0)?);
    }
    let inner = format!(".{block}.experts.");
    if let Some(stray) = raw.keys().find(|k| k.contains(&inner)) {
        bail!("expert tensor {stray} beyond num_experts = {experts}");
    }
    Ok(())
}

/// Sort tokens by expert from this many (token, expert) pairs on, as mlx-lm does.
const SORT_FROM: usize = 64;

/// One projection of every expert, stacked: `[experts, out, in]` (dense) or MLX affine
/// quantized with the same leading axis; and each expert's bias `[experts, out]` (gpt-oss).
pub struct SwitchLinear(pub Weight, pub Option<Array>);

impl SwitchLinear {
    /// `x` `[..., 1, in]` through the expert each of `indices` names (`x`'s batch axes
    /// broadcast against `indices`'): `[..., 1, out]`.
    fn apply(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        let y = match &self.0 {
            Weight::Dense(w) => ops::gather_mm(x, w.swap_axes(-1, -2)?, None, indices, sorted)?,
            Weight::Quantized(q) => q.gather(x, indices, sorted)?,
        };
        Ok(match &self.1 {
            Some(b) => y.add(b.take_axis(indices, 0)?.expand_dims(-2)?)?,
            None => y,
        })
    }

    /// `(experts, out_features)` of the stack.
    pub fn dims(&self) -> (i32, i32) {
        let w = match &self.0 {
            Weight::Dense(w) => w,
            Weight::Quantized(q) => &q.weight,
        };
        let s = w.shape();
        (s.first().copied().unwrap_or(0), s.get(1).copied().unwrap_or(0))
    }
}

/// mlx-lm's `SwitchGLU`: `down(act(gate(x), up(x)))` through each token's chosen experts.
pub struct SwitchGlu {
    pub gate: SwitchLinear,
    pub up: SwitchLinear,
    pub down: SwitchLinear,
    pub activation: Activation,
}

impl SwitchGlu {
    /// `x` `[..., 1, hidden]` through the experts `idx` names (broadcast against `x`'s
    /// batch axes; `sorted` when `idx` ascends): `[..., 1, hidden]`.
    pub fn experts(&self, x: &Array, idx: &Array, sorted: bool) -> Result<Array> {
        let up = self.up.apply(x, idx, sorted)?;
        let gate = self.gate.apply(x, idx, sorted)?;
        self.down.apply(&super::mlp::gated(self.activation, &gate, &up)?, idx, sorted)
    }

    /// `x` `[T, hidden]`, `indices` `[T, k]` (uint32) -> `[T, k, hidden]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let (t, k) = (indices.shape()[0], indices.shape()[1]);
        let hidden = x.shape()[1];
        let x = x.reshape(&[t, 1, 1, hidden])?;
        let expert = |x: &Array, idx: &Array, sorted: bool| self.experts(x, idx, sorted);
        if (t * k) as usize >= SORT_FROM {
            // Pairs in expert order: rows of x repeated per pair, the result put back.
            let flat = indices.reshape(&[-1])?;
            let order = ops::argsort_axis(&flat, 0)?;
            let inverse = ops::argsort_axis(&order, 0)?;
            let rows = order.floor_divide(Array::from_int(k))?;
            let xs = x.reshape(&[t, 1, hidden])?.take_axis(&rows, 0)?;
            let y = expert(&xs, &flat.take_axis(&order, 0)?, true)?;
            Ok(y.take_axis(&inverse, 0)?.reshape(&[t, k, hidden])?)
        } else {
            Ok(expert(&x, indices, false)?.reshape(&[t, k, hidden])?)
        }
    }

    pub fn nbytes(&self) -> usize {
        [&self.gate, &self.up, &self.down].iter().map(|l| l.0.nbytes() + l.1.as_ref().map_or(0, |b| b.nbytes())).sum()
    }

    pub fn arrays(&self) -> Vec<&Array> {
        [&self.gate, &self.up, &self.down].into_iter().flat_map(|l| l.0.arrays().into_iter().chain(l.1.as_ref())).collect()
    }
}

/// A sparse layer's experts: all in memory, or streamed through the model's expert cache.
pub enum Experts {
    Resident(SwitchGlu),
    Streamed { layer: u32, store: Rc<ExpertStore> },
}

impl Experts {
    /// `x` `[T, hidden]`, `indices` `[T, k]` (uint32) -> `[T, k, hidden]`.
    fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        match self {
            Experts::Resident(glu) => glu.forward(x, indices),
            Experts::Streamed { layer, store } => store.forward(*layer, x, indices),
        }
    }
}

/// A sparse MLP: router, top-k, experts, weighted sum (mlx-lm's `Qwen3MoeSparseMoeBlock`,
/// `MixtralSparseMoeBlock`).
pub struct SparseMoe {
    /// `[experts, hidden]`: one logit per expert; plus a bias per expert (gpt-oss).
    pub router: Weight,
    pub router_bias: Option<Array>,
    pub experts: Experts,
    pub top_k: i32,
    pub routing: Routing,
}

impl SparseMoe {
    /// The MLP of `x` `[..., hidden]` (already normed), same shape.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let shape = x.shape().to_vec();
        let hidden = shape[shape.len() - 1];
        let x = x.reshape(&[-1, hidden])?;
        let (indices, scores) = self.route(&x)?;
        let y = self.experts.forward(&x, &indices)?;
        let y = y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, None)?;
        Ok(y.reshape(&shape)?)
    }

    /// Each token's top-k experts `[T, k]` (uint32) and their weights `[T, k]`.
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = self.router.apply(x)?;
        let logits = match &self.router_bias {
            Some(b) => logits.add(b)?,
            None => logits,
        };
        let gates = match self.routing {
            Routing::Softmax { .. } => ops::softmax_axis(&logits, -1, true)?,
            Routing::TopKSoftmax => logits,
        };
        let experts = gates.shape()[1];
        let k = self.top_k;
        let indices = ops::argpartition_axis(&gates, experts - k, -1)?.index((.., experts - k..));
        let scores = gates.take_along_axis(&indices, -1)?;
        let scores = match self.routing {
            Routing::Softmax { renormalize: true } => scores.divide(scores.sum_axis(-1, true)?)?,
            Routing::Softmax { renormalize: false } => scores,
            Routing::TopKSoftmax => ops::softmax_axis(&scores, -1, true)?,
        };
        Ok((indices, scores))
    }

    /// Bytes held resident: a streamed layer's experts count with the expert cache.
    pub fn nbytes(&self) -> usize {
        let experts = match &self.experts {
            Experts::Resident(glu) => glu.nbytes(),
            Experts::Streamed { .. } => 0,
        };
        self.router.nbytes() + self.router_bias.as_ref().map_or(0, |b| b.nbytes()) + experts
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = self.router.arrays();
        all.extend(self.router_bias.as_ref());
        if let Experts::Resident(glu) = &self.experts {
            all.extend(glu.arrays());
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::quantized::{QuantSpec, Quantized};
    use mlx_rs::random;

    const HIDDEN: i32 = 64;
    const WIDTH: i32 = 32;
    const EXPERTS: i32 = 8;

    fn normal(shape: &[i32], scale: f32, seed: u64) -> Array {
        random::normal::<f32>(shape, None, scale, &random::key(seed).unwrap()).unwrap()
    }

    fn moe(packed: bool, routing: Routing) -> SparseMoe {
        let stack = |out: i32, inp: i32, seed: u64| {
            let w = normal(&[EXPERTS, out, inp], 0.15, seed);
            SwitchLinear(
                if packed {
                    let (weight, scales, biases) = ops::quantize(&w, 32, 4).unwrap();
                    Weight::Quantized(Quantized::new(weight, scales, Some(biases), QuantSpec::affine(32, 4)).unwrap())
                } else {
                    Weight::Dense(w)
                },
                None,
            )
        };
        SparseMoe {
            router: Weight::Dense(normal(&[EXPERTS, HIDDEN], 0.3, 1)),
            router_bias: None,
            experts: Experts::Resident(SwitchGlu {
                gate: stack(WIDTH, HIDDEN, 2),
                up: stack(WIDTH, HIDDEN, 3),
                down: stack(HIDDEN, WIDTH, 4),
                activation: Activation::Silu,
            }),
            top_k: 2,
            routing,
        }
    }

    /// The expert `e` slice of a stacked projection, as a dense `[out, in]` matrix.
    fn slice(l: &SwitchLinear, e: i32) -> Array {
        let w = match &l.0 {
            Weight::Dense(w) => w.clone(),
            Weight::Quantized(q) => q.dequantize(mlx_rs::Dtype::Float32).unwrap(),
        };
        w.index(e)
    }

    /// Token by token, expert by expert, with plain matmuls: what the block must compute.
    fn reference(m: &SparseMoe, x: &Array) -> Vec<f32> {
        let Experts::Resident(glu) = &m.experts else { unreachable!("built resident") };
        let (indices, scores) = m.route(x).unwrap();
        let (indices, scores) = (indices.as_type::<u32>().unwrap(), scores);
        let mut out = vec![];
        for t in 0..x.shape()[0] {
            let row = x.index(t..t + 1);
            let mut y = Array::zeros::<f32>(&[1, HIDDEN]).unwrap();
            for j in 0..m.top_k {
                let e = indices.index((t, j)).item_cast::<u32>() as i32;
                let proj = |l: &SwitchLinear, v: &Array| ops::matmul(v, slice(l, e).t()).unwrap();
                let h = mlx_rs::nn::silu(proj(&glu.gate, &row)).unwrap().multiply(proj(&glu.up, &row)).unwrap();
                y = y.add(proj(&glu.down, &h).multiply(scores.index((t, j))).unwrap()).unwrap();
            }
            out.extend_from_slice(y.as_slice::<f32>());
        }
        out
    }

    /// Unsorted (a few tokens) and sorted (64 pairs and more) gathers, over float and over
    /// 4-bit experts (`gather_qmm` against matmuls on the dequantized weights), equal the
    /// per-token computation; the router's top-k and weights as mlx-lm's: qwen3_moe's
    /// probabilities, raw or renormalized (`norm_topk_prob`), and mixtral's softmax over the
    /// top-k logits.
    #[test]
    fn sparse_moe_equals_token_by_token_experts() {
        let (plain, renormalized, mixtral) =
            (Routing::Softmax { renormalize: false }, Routing::Softmax { renormalize: true }, Routing::TopKSoftmax);
        for (tokens, packed, routing) in [
            (3, false, renormalized),
            (40, false, renormalized),
            (3, true, renormalized),
            (40, true, plain),
            (3, false, mixtral),
            (40, true, mixtral),
        ] {
            let m = moe(packed, routing);
            let x = normal(&[tokens, HIDDEN], 1.0, 5 + tokens as u64);
            let got = m.forward(&x).unwrap();
            let want = reference(&m, &x);
            let diff = got.as_slice::<f32>().iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
            let scale = want.iter().map(|w| w.abs()).fold(0f32, f32::max);
            assert!(diff <= 1e-5 * scale.max(1.0), "{tokens} tokens, packed {packed}: |diff| {diff} at scale {scale}");

            let (indices, scores) = m.route(&x).unwrap();
            let probs = ops::softmax_axis(m.router.apply(&x).unwrap(), -1, true).unwrap();
            for t in 0..tokens {
                let p: Vec<f32> = probs.index(t).as_slice::<f32>().to_vec();
                let mut order: Vec<usize> = (0..p.len()).collect();
                order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
                let mut chosen: Vec<usize> =
                    indices.index(t).as_type::<u32>().unwrap().as_slice::<u32>().iter().map(|&i| i as usize).collect();
                chosen.sort();
                let mut top: Vec<usize> = order[..2].to_vec();
                top.sort();
                assert_eq!(chosen, top, "token {t}: the two most probable experts");
                let raw: f32 = top.iter().map(|&e| p[e]).sum();
                let idx = indices.index(t).as_type::<u32>().unwrap();
                for (&e, &s) in idx.as_slice::<u32>().iter().zip(scores.index(t).as_slice::<f32>()) {
                    // A softmax over the top-k logits is the top-k probabilities renormalized.
                    let want = if routing == plain { p[e as usize] } else { p[e as usize] / raw };
                    assert!((s - want).abs() < 1e-6, "token {t} expert {e} ({routing:?}): score {s}, want {want}");
                }
            }
        }
    }
}
