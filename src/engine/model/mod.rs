//! A decoder-only transformer in MLX, built from shared pieces as mlx-lm's `models/` are:
//! llama (SmolLM2, Llama 3.x), mistral, qwen2 (q/k/v biases) and qwen3 (q/k norms); GQA,
//! tied or untied embeddings; each layer's MLP dense or, in mixture-of-experts families
//! ([`qwen3_moe`], [`mixtral`]), sparse ([`mlp`], [`switch`]). Other families' files say how
//! their layers differ ([`config::LayerStyle`]): [`phi3`] (partial, LongRoPE rotation),
//! [`gemma3`] (sandwich norms, GELU, local attention windows), [`gpt_oss`] (attention sinks,
//! alternating windows, YaRN, biased experts).
//!
//! Loaders ([`gguf`], [`hf`]) turn a file or folder into canonical [`TensorMap`] names;
//! [`Model::assemble`] applies the weight format and fuses projections.
pub mod config;
pub mod gemma3;
pub mod gguf;
pub(crate) mod gguf_read;
pub mod gpt_oss;
pub mod hf;
pub mod linear;
pub mod mixtral;
mod mlp;
pub mod phi3;
pub mod quantized;
pub mod qwen3_moe;
pub mod rope;
pub mod shard;
pub mod switch;
pub mod validate;

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, ops, Array, Dtype};

use super::batch_kv::BatchKv;
use super::cpu_backend::{AttentionStep, QuantizedArrays};
use super::experts::{ExpertStats, ExpertStore, StreamSpec};
use super::kv_cache::KvCache;
use config::{LocalAttention, ModelConfig};
use linear::{expect_shape, Embedding, Linear, Weight};
use mlp::Mlp;
use shard::{Reduce, Shard};

/// How weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// The faster on this machine: native on the GPU; on the CPU, quantized weights stay
    /// packed where mlxbar's CPU kernel runs them and beats float32 (always with AVX2,
    /// measured once otherwise), else float32.
    Auto,
    /// Dequantize everything to float32 at load (OpenBLAS matmuls; 4-8x the memory of
    /// quantized weights).
    Float32,
    /// Keep what the file has (quantized stays quantized): the right choice on Metal. On the
    /// CPU device the float parts (scales, norms, activations) are float32, and quantized
    /// weights the CPU kernel cannot run become float32.
    Native,
}

impl WeightFormat {
    /// The format a model quantized as `quantization` (None for float weights) is held in
    /// on this device. MXFP4 stays packed on the CPU too: MLX's own CPU ops run it, and
    /// float32 would be eight times its size.
    pub fn resolve(self, on_gpu: bool, quantization: Option<quantized::QuantSpec>) -> WeightFormat {
        match self {
            WeightFormat::Auto if on_gpu => WeightFormat::Native,
            WeightFormat::Auto => match quantization {
                Some(q) if q.mode == quantized::QuantMode::Mxfp4 => WeightFormat::Native,
                Some(q)
                    if super::cpu_backend::quantized_kernel(q.bits, q.group_size).is_some()
                        && super::cpu_backend::quantized_is_faster() =>
                {
                    WeightFormat::Native
                }
                _ => WeightFormat::Float32,
            },
            other => other,
        }
    }
}

/// Tensors by canonical name: `embed`, `norm`, `lm_head`, `rope_periods`, and per layer
/// `layers.{i}.{attn_norm,mlp_norm,q,k,v,o,q_norm,k_norm,gate,up,down}` (sandwich-normed
/// families add `post_attn_norm`, `post_mlp_norm`; gpt-oss `sinks`), or for a sparse
/// MLP `layers.{i}.{router,experts.gate,experts.up,experts.down}` (experts stacked on a
/// leading axis). Projections carry their bias under `{name}.bias`.
#[derive(Default)]
pub struct TensorMap {
    pub weights: HashMap<String, Weight>,
    pub vectors: HashMap<String, Array>,
    /// The experts of a streamed model (then absent from `weights`).
    pub streamed: Option<StreamSpec>,
}

impl TensorMap {
    fn take_weight(&mut self, name: &str) -> Result<Weight> {
        self.weights.remove(name).ok_or_else(|| anyhow!("missing weight '{name}'"))
    }
    fn take_vector(&mut self, name: &str) -> Result<Array> {
        self.vectors.remove(name).ok_or_else(|| anyhow!("missing tensor '{name}'"))
    }

    /// How the first layer's MLP projections (its experts when sparse) are quantized, None
    /// when they are float.
    pub fn quantization(&self) -> Option<quantized::QuantSpec> {
        if let Some(s) = &self.streamed {
            return s.files.quantization();
        }
        match self.weights.get("layers.0.gate").or_else(|| self.weights.get("layers.0.experts.gate"))? {
            Weight::Quantized(q) => Some(q.spec()),
            Weight::Dense(_) => None,
        }
    }
}

/// q|k|v or gate|up: one fused matmul when the formats allow, else separate ones.
enum Projections {
    Fused { linear: Linear, split_at: Vec<i32> },
    Separate(Vec<Linear>),
}

impl Projections {
    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Projections::Fused { linear, .. } => vec![linear],
            Projections::Separate(parts) => parts.iter_mut().collect(),
        }
    }

    fn new(parts: Vec<Linear>) -> Result<Self> {
        let sizes: Vec<i32> = parts.iter().map(|p| p.weight.out_features()).collect();
        Ok(match Linear::concat_rows(parts)? {
            Ok(linear) => {
                let split_at = sizes
                    .iter()
                    .scan(0, |acc, s| {
                        *acc += s;
                        Some(*acc)
                    })
                    .take(sizes.len() - 1)
                    .collect();
                Projections::Fused { linear, split_at }
            }
            Err(parts) => Projections::Separate(parts),
        })
    }

    /// The projections of `rms_norm(x, norm, eps)`.
    fn forward_normed(&self, x: &Array, norm: &Array, eps: f32) -> Result<Vec<Array>> {
        match self {
            Projections::Fused { linear, split_at } => Ok(ops::split_at_indices(&linear.forward_normed(x, norm, eps)?, split_at, -1)?),
            Projections::Separate(parts) => {
                let x = fast::rms_norm(x, Some(norm), eps)?;
                parts.iter().map(|p| p.forward(&x)).collect()
            }
        }
    }

    /// [`Projections::forward_normed`]'s outputs side by side on the last axis, as the fused
    /// projection gives them (no split; projections that could not be fused are joined, one
    /// op where they took none).
    fn forward_normed_joined(&self, x: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match self {
            Projections::Fused { linear, .. } => linear.forward_normed(x, norm, eps),
            Projections::Separate(_) => Ok(ops::concatenate(&self.forward_normed(x, norm, eps)?, -1)?),
        }
    }

    fn linears(&self) -> Vec<&Linear> {
        match self {
            Projections::Fused { linear, .. } => vec![linear],
            Projections::Separate(parts) => parts.iter().collect(),
        }
    }

    fn nbytes(&self) -> usize {
        self.linears().iter().map(|l| l.weight.nbytes() + l.bias.as_ref().map_or(0, |b| b.nbytes())).sum()
    }

    /// The weight arrays (biases are evaluated with the vectors).
    fn arrays(&self) -> Vec<&Array> {
        self.linears().into_iter().flat_map(|l| l.weight.arrays()).collect()
    }
}

struct Block {
    attn_norm: Array,
    mlp_norm: Array,
    qkv: Projections,
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    o: Linear,
    mlp: Mlp,
    /// Norms on the attention's and the MLP's outputs (Gemma's sandwich), both or neither.
    post_norms: Option<[Array; 2]>,
    /// Per-head attention sink logits `[heads]` (gpt-oss).
    sinks: Option<Array>,
}

impl Block {
    /// `h + mlp(rms_norm(h))`, the MLP's output normed too when sandwiched; a tensor-parallel
    /// share's partial output summed over the ranks first.
    fn mlp(&self, h: &Array, eps: f32, reduce: Option<&Reduce>) -> Result<Array> {
        match (&self.post_norms, reduce) {
            (None, None) => self.mlp.forward_add(h, &self.mlp_norm, eps),
            (None, Some(sum)) => Ok(h.add(sum(&self.mlp.forward_normed(h, &self.mlp_norm, eps)?)?)?),
            (Some([_, post]), reduce) => {
                let out = summed(self.mlp.forward_normed(h, &self.mlp_norm, eps)?, reduce)?;
                Ok(h.add(fast::rms_norm(&out, Some(post), eps)?)?)
            }
        }
    }

    /// `h + o(attention)`, the output normed too when sandwiched; summed over the ranks
    /// first as in [`Block::mlp`].
    fn attention_out(&self, o: &Array, h: &Array, eps: f32, reduce: Option<&Reduce>) -> Result<Array> {
        match (&self.post_norms, reduce) {
            (None, None) => self.o.forward_add(o, h),
            (None, Some(sum)) => Ok(h.add(sum(&self.o.forward(o)?)?)?),
            (Some([post, _]), reduce) => Ok(h.add(fast::rms_norm(&summed(self.o.forward(o)?, reduce)?, Some(post), eps)?)?),
        }
    }
}

impl Block {
    /// The attention's and a dense MLP's projections (not the experts, which MLX's
    /// `gather_qmm` runs).
    fn dense_projections_mut(&mut self) -> Vec<&mut Linear> {
        let mut all = self.qkv.linears_mut();
        all.push(&mut self.o);
        if let Mlp::Dense { gate_up, down, .. } = &mut self.mlp {
            all.extend(gate_up.linears_mut());
            all.push(down);
        }
        all
    }

    /// The four projections as [`super::cpu_backend::decode_block`] takes them: a dense
    /// SwiGLU block with q|k|v and gate|up fused, each projection run by the CPU kernel, no
    /// sandwich norms or sinks; None for any other block.
    fn fused_projections(&self) -> Option<[QuantizedArrays<'_>; 4]> {
        if self.post_norms.is_some() || self.sinks.is_some() {
            return None;
        }
        let Mlp::Dense { gate_up, down, activation: config::Activation::Silu } = &self.mlp else { return None };
        fn arrays(l: &Linear) -> Option<QuantizedArrays<'_>> {
            let q = l.fusable()?;
            Some(QuantizedArrays {
                weight: &q.weight,
                scales: &q.scales,
                biases: q.biases.as_ref()?,
                group_size: q.group_size,
                bits: q.bits,
                strips: q.strips,
            })
        }
        fn fused(p: &Projections) -> Option<QuantizedArrays<'_>> {
            match p {
                Projections::Fused { linear, .. } => arrays(linear),
                Projections::Separate(_) => None,
            }
        }
        Some([fused(&self.qkv)?, arrays(&self.o)?, fused(gate_up)?, arrays(down)?])
    }
}

/// `x` summed over the ranks when it is a tensor-parallel share's partial output.
fn summed(x: Array, reduce: Option<&Reduce>) -> Result<Array> {
    match reduce {
        Some(sum) => sum(&x),
        None => Ok(x),
    }
}

/// The part of a model one process holds: every layer and both ends on one process; a
/// contiguous run of layers per rank when several serve it ([`crate::distributed`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Slice {
    /// The layers held (model-wide indices).
    pub layers: std::ops::Range<usize>,
    /// The embedding, final norm and head: the rank that samples holds both ends (a tied
    /// head is then not held twice, and ranks pass hidden states, never logits).
    pub ends: bool,
    /// Tensor parallel: this rank's share of every layer's heads and MLP units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

impl Slice {
    pub fn whole(num_layers: usize) -> Slice {
        Slice { layers: 0..num_layers, ends: true, shard: None }
    }
}

/// The embedding, final norm and head ([`Slice::ends`]).
struct Ends {
    embed: Embedding,
    norm: Array,
    /// None when tied to the embedding.
    lm_head: Option<Weight>,
}

pub struct Model {
    pub config: ModelConfig,
    pub dtype: Dtype,
    pub format: WeightFormat,
    pub slice: Slice,
    ends: Option<Ends>,
    /// The layers of `slice`, in order.
    blocks: Vec<Block>,
    rope_periods: Option<Array>,
    /// Decode steps' norms, RoPE, cache writes and attention run mlxbar's CPU op
    /// (`cpu_backend::decode_attention`), and prefill's attention its other
    /// (`cpu_backend::prefill_attention`).
    cpu_attention: bool,
    /// RoPE runs mlxbar's CPU op (`cpu_backend::rope`).
    cpu_rope: bool,
    /// A streamed model's experts (their cache and its figures).
    experts: Option<Rc<ExpertStore>>,
    /// Tensor parallel: adds up o's and down's partial outputs over the ranks.
    reduce: Option<Reduce>,
}

impl Model {
    /// Builds the model from loaded tensors, converting them to `format` (resolved here).
    pub fn assemble(config: ModelConfig, t: TensorMap, format: WeightFormat) -> Result<Model> {
        Self::assemble_reporting(config, t, format, &|_| {})
    }

    /// [`Model::assemble`], telling `progress` how many of the layers are materialized
    /// (from 0.1 to 0.95; the engine says 1 once it serves).
    pub fn assemble_reporting(config: ModelConfig, t: TensorMap, format: WeightFormat, progress: &dyn Fn(f64)) -> Result<Model> {
        let whole = Slice::whole(config.num_layers);
        Self::assemble_slice(config, t, format, whole, progress)
    }

    /// [`Model::assemble_reporting`] for the part `slice` names; the other layers' tensors
    /// are dropped unread.
    pub fn assemble_slice(
        config: ModelConfig,
        mut t: TensorMap,
        format: WeightFormat,
        slice: Slice,
        progress: &dyn Fn(f64),
    ) -> Result<Model> {
        config.validate()?;
        // A tensor-parallel share runs as a model of its own heads and MLP units.
        let config = match slice.shard {
            Some(shard) => {
                if let Some(why) = Shard::refusal(&config, shard.of, t.quantization()) {
                    anyhow::bail!("{why}");
                }
                shard.local(&config)
            }
            None => config,
        };
        anyhow::ensure!(
            slice.layers.start < slice.layers.end && slice.layers.end <= config.num_layers,
            "layers {:?} of a {}-layer model",
            slice.layers,
            config.num_layers
        );
        anyhow::ensure!(
            slice == Slice::whole(config.num_layers) || t.streamed.is_none(),
            "a model whose experts stream from disk is served by one process"
        );
        let c = &config;
        // Arrays go to MLX's default device (the engine thread sets it before loading).
        let on_gpu = mlx_rs::Device::try_default().and_then(|d| d.get_type()).is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Gpu));
        let format = format.resolve(on_gpu, t.quantization());
        let embed_w = t.take_weight("embed")?;
        let dtype = match (format, &embed_w) {
            (WeightFormat::Float32 | WeightFormat::Auto, _) => Dtype::Float32,
            // float16 arithmetic is emulated on x86 CPUs: ~10x slower and, over 30 layers,
            // enough rounding to move the logits by ~0.5.
            (WeightFormat::Native, _) if !on_gpu => Dtype::Float32,
            (WeightFormat::Native, Weight::Quantized(q)) => q.biases.as_ref().map_or(Dtype::Bfloat16, |b| b.dtype()),
            (WeightFormat::Native, Weight::Dense(w)) => w.dtype(),
        };
        let weight = move |w: Weight| -> Result<Weight> {
            match format {
                WeightFormat::Native if on_gpu => w.cast_floats(dtype),
                WeightFormat::Native => w.for_cpu(),
                _ => w.into_dense(dtype),
            }
        };
        let streamed = match t.streamed.take() {
            Some(spec) => {
                let moe = c.moe.as_ref().context("experts to stream in a model without experts")?;
                let store = ExpertStore::new(spec.files, spec.budget, Box::new(weight), moe.activation, moe.num_experts as u32)?;
                Some(Rc::new(store))
            }
            None => None,
        };
        // A router's choice is discrete: on the CPU it runs float32 whatever the format, so
        // the packed kernel's int8 activations cannot flip which experts a token gets.
        let router = |w: Weight| -> Result<Weight> {
            match on_gpu {
                true => weight(w),
                false => w.into_dense(Dtype::Float32),
            }
        };
        let vector = |a: Array| -> Result<Array> { Ok(if a.dtype() == dtype { a } else { a.as_dtype(dtype)? }) };
        let linear = |t: &mut TensorMap, name: &str, out: i32| -> Result<Linear> {
            let w = weight(t.take_weight(name)?)?;
            expect_shape(name, &w, out)?;
            let bias = t.vectors.remove(&format!("{name}.bias")).map(vector).transpose()?;
            Ok(Linear { weight: w, bias })
        };
        // A share's projections: its rows of those that fan out (q, k, v, gate, up), its
        // columns of those that gather (o, down; their bias is added once, on rank 0).
        let shard = slice.shard;
        let cut_rows = |t: &mut TensorMap, name: &str| -> Result<()> {
            let Some(shard) = shard else { return Ok(()) };
            let w = shard.rows(t.take_weight(name)?)?;
            t.weights.insert(name.to_string(), w);
            if let Some(b) = t.vectors.remove(&format!("{name}.bias")) {
                t.vectors.insert(format!("{name}.bias"), shard.vector_rows(b)?);
            }
            Ok(())
        };
        let cut_columns = |t: &mut TensorMap, name: &str, local_inputs: i32| -> Result<()> {
            let Some(shard) = shard else { return Ok(()) };
            let w = shard.columns(t.take_weight(name)?, local_inputs * shard.of as i32)?;
            t.weights.insert(name.to_string(), w);
            if shard.rank > 0 {
                t.vectors.remove(&format!("{name}.bias"));
            }
            Ok(())
        };

        let embed = match slice.ends {
            true => {
                let e = Embedding(weight(embed_w)?);
                expect_shape("embed", &e.0, c.vocab_size)?;
                Some(e)
            }
            false => None,
        };
        let (q_out, kv_out) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let mut blocks = Vec::with_capacity(slice.layers.len());
        for i in slice.layers.clone() {
            let p = |s: &str| format!("layers.{i}.{s}");
            for name in ["q", "k", "v", "gate", "up"] {
                cut_rows(&mut t, &p(name))?;
            }
            cut_columns(&mut t, &p("o"), q_out)?;
            cut_columns(&mut t, &p("down"), c.intermediate_size)?;
            let qkv = vec![linear(&mut t, &p("q"), q_out)?, linear(&mut t, &p("k"), kv_out)?, linear(&mut t, &p("v"), kv_out)?];
            let mlp = match c.moe.as_ref().filter(|m| m.is_sparse(i)) {
                Some(moe) => Mlp::sparse(&mut t, i, moe, c.hidden_size, &weight, &router, streamed.as_ref())?,
                None => {
                    let gate_up = vec![linear(&mut t, &p("gate"), c.intermediate_size)?, linear(&mut t, &p("up"), c.intermediate_size)?];
                    let down = linear(&mut t, &p("down"), c.hidden_size)?;
                    Mlp::Dense { gate_up: Projections::new(gate_up)?, down, activation: c.style.activation }
                }
            };
            blocks.push(Block {
                attn_norm: vector(t.take_vector(&p("attn_norm"))?)?,
                mlp_norm: vector(t.take_vector(&p("mlp_norm"))?)?,
                qkv: Projections::new(qkv)?,
                q_norm: t.vectors.remove(&p("q_norm")).map(vector).transpose()?,
                k_norm: t.vectors.remove(&p("k_norm")).map(vector).transpose()?,
                o: linear(&mut t, &p("o"), c.hidden_size)?,
                mlp,
                post_norms: match c.style.sandwich_norms {
                    true => Some([vector(t.take_vector(&p("post_attn_norm"))?)?, vector(t.take_vector(&p("post_mlp_norm"))?)?]),
                    false => None,
                },
                sinks: match c.style.attention_sinks {
                    true => {
                        let s = vector(t.take_vector(&p("sinks"))?)?;
                        anyhow::ensure!(s.shape() == [c.num_heads], "{}: shape {:?}, {} heads", p("sinks"), s.shape(), c.num_heads);
                        Some(s)
                    }
                    false => None,
                },
            });
        }
        let lm_head = match t.weights.remove("lm_head") {
            Some(w) if !c.tie_word_embeddings && slice.ends => {
                let w = weight(w)?;
                expect_shape("lm_head", &w, c.vocab_size)?;
                Some(w)
            }
            _ => None,
        };
        let rope_periods = match (t.vectors.remove("rope_periods"), &c.rope.llama3_scaling, &c.rope.periods) {
            (Some(p), _, _) => Some(p.as_dtype(Dtype::Float32)?),
            (None, Some(s), _) => {
                let p = rope::llama3_periods(c.head_dim, c.rope.theta, s);
                Some(Array::from_slice(&p, &[p.len() as i32]))
            }
            (None, None, Some(p)) => Some(Array::from_slice(p, &[p.len() as i32])),
            (None, None, None) => None,
        };
        let ends = match embed {
            Some(embed) => Some(Ends { embed, norm: vector(t.take_vector("norm")?)?, lm_head }),
            None => None,
        };
        // mlxbar's CPU attention ops see every position: not for local windows.
        let cpu_attention = !on_gpu
            && dtype == Dtype::Float32
            && c.style.local.is_none()
            && !c.style.attention_sinks
            && super::cpu_backend::has_decode_attention();
        let cpu_rope = !on_gpu && dtype == Dtype::Float32 && super::cpu_backend::has_rope();
        let mut model =
            Model { config, dtype, format, slice, ends, blocks, rope_periods, cpu_attention, cpu_rope, experts: streamed, reduce: None };
        model.eval_weights(progress)?;
        if !on_gpu {
            model.projections_in_strips()?;
            model.weights_on_huge_pages();
        }
        Ok(model)
    }

    /// Materializes every weight now, so load time is paid at load and not by the first
    /// request; a layer at a time, so the load can show its progress.
    fn eval_weights(&self, progress: &dyn Fn(f64)) -> Result<()> {
        let mut all: Vec<&Array> = vec![];
        if let Some(e) = &self.ends {
            all.extend(e.embed.0.arrays());
            all.push(&e.norm);
            all.extend(e.lm_head.iter().flat_map(|h| h.arrays()));
        }
        mlx_rs::transforms::eval(std::mem::take(&mut all)).context("materializing weights")?;
        let layers = self.blocks.len().max(1) as f64;
        for (i, b) in self.blocks.iter().enumerate() {
            all.extend([&b.attn_norm, &b.mlp_norm]);
            all.extend(b.q_norm.iter().chain(b.k_norm.iter()).chain(b.post_norms.iter().flatten()).chain(b.sinks.iter()));
            all.extend(b.qkv.arrays());
            all.extend(b.o.weight.arrays());
            all.extend(b.mlp.arrays());
            mlx_rs::transforms::eval(std::mem::take(&mut all)).context("materializing weights")?;
            progress(0.1 + 0.85 * (i + 1) as f64 / layers);
        }
        Ok(())
    }

    /// On the CPU, the projections (the head and the embedding too: the host lookup reads
    /// either layout) repacked for the CPU kernel where it reads them faster so
    /// ([`Weight::repack_in_strips`]).
    fn projections_in_strips(&mut self) -> Result<()> {
        let start = std::time::Instant::now();
        let mut repacked = 0;
        if let Some(e) = &mut self.ends {
            repacked += usize::from(e.embed.0.repack_in_strips()?);
            if let Some(head) = &mut e.lm_head {
                repacked += usize::from(head.repack_in_strips()?);
            }
        }
        for b in &mut self.blocks {
            for l in b.dense_projections_mut() {
                repacked += usize::from(l.weight.repack_in_strips()?);
            }
        }
        if repacked > 0 {
            tracing::info!("{repacked} weights in 16-column strips for the AVX512-VNNI kernel ({:.0?})", start.elapsed());
        }
        Ok(())
    }

    /// On the CPU, the weights' buffers onto huge pages
    /// ([`super::cpu_backend::weights_on_huge_pages`]): a decode step reads each of them.
    fn weights_on_huge_pages(&self) {
        let mut all: Vec<&Array> = vec![];
        if let Some(e) = &self.ends {
            all.extend(e.embed.0.arrays());
            all.extend(e.lm_head.iter().flat_map(|h| h.arrays()));
        }
        for b in &self.blocks {
            all.extend(b.qkv.arrays());
            all.extend(b.o.weight.arrays());
            all.extend(b.mlp.arrays());
        }
        if let Some((huge, total, took)) = super::cpu_backend::weights_on_huge_pages(&all) {
            tracing::info!("weights on huge pages: {} of {} MiB ({took:.0?})", huge >> 20, total >> 20);
        }
    }

    /// Bytes of all weights as held in memory.
    pub fn nbytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let qk_norms: usize = b
                    .q_norm
                    .iter()
                    .chain(b.k_norm.iter())
                    .chain(b.post_norms.iter().flatten())
                    .chain(b.sinks.iter())
                    .map(|n| n.nbytes())
                    .sum();
                b.attn_norm.nbytes() + b.mlp_norm.nbytes() + qk_norms + b.qkv.nbytes() + b.o.weight.nbytes() + b.mlp.nbytes()
            })
            .sum();
        let ends = self.ends.as_ref().map_or(0, |e| e.embed.0.nbytes() + e.norm.nbytes() + e.lm_head.as_ref().map_or(0, |h| h.nbytes()));
        blocks + ends
    }

    /// Tensor parallel: sums o's and down's partial outputs over the ranks with `reduce`
    /// (a model assembled from a [`Shard`]).
    pub fn set_reduce(&mut self, reduce: Reduce) {
        self.reduce = Some(reduce);
    }

    /// A streamed model's expert cache figures; None when every expert is resident.
    pub fn expert_stats(&self) -> Option<Arc<ExpertStats>> {
        self.experts.as_ref().map(|s| s.stats.clone())
    }

    /// A cache for the layers this model holds.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.blocks.len())
    }

    /// Runs `tokens` through the model after what `cache` holds and returns the logits of
    /// the last position (`[vocab]`, float32), evaluated.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Array> {
        let logits = self.prefill(&[tokens], &mut [cache])?;
        Ok(logits.reshape(&[-1])?)
    }

    /// Prefills several sequences in one pass: `parts[i]` follows what `caches[i]` holds.
    /// Token-wise work runs on all their tokens together, so the weights are read (and
    /// BLAS packs them) once for all; attention runs per sequence over its own cache,
    /// causally. Returns each part's last-position logits (`[parts, vocab]`, float32),
    /// evaluated.
    pub fn prefill(&self, parts: &[&[u32]], caches: &mut [&mut KvCache]) -> Result<Array> {
        self.run_parts(parts, caches, false)
    }

    /// Runs `tokens` after what `cache` holds, as [`Model::prefill`] does, and returns the
    /// logits of every position (`[tokens, vocab]`, float32), evaluated: one pass verifies
    /// a draft (`tokens` = the next token and the draft after it).
    pub fn verify(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Array> {
        self.run_parts(&[tokens], &mut [cache], true)
    }

    fn run_parts(&self, parts: &[&[u32]], caches: &mut [&mut KvCache], every_position: bool) -> Result<Array> {
        anyhow::ensure!(parts.len() == caches.len() && parts.iter().all(|p| !p.is_empty()), "one non-empty part per cache");
        let lens: Vec<i32> = parts.iter().map(|p| p.len() as i32).collect();
        let h = self.embed_parts(parts)?;
        let h = self.prefill_layers(h, &lens, caches)?;
        self.head_of_parts(&h, &lens, every_position)
    }

    /// The embeddings of several sequences' new tokens, one after another: `[1, total, hidden]`.
    pub fn embed_parts(&self, parts: &[&[u32]]) -> Result<Array> {
        let ids: Vec<u32> = parts.concat();
        anyhow::ensure!(!ids.is_empty(), "no tokens");
        let h = match self.ends()?.embed.lookup_on_host(&ids)? {
            Some(rows) => self.scale_embedding(rows)?,
            None => self.embed(&Array::from_slice(&ids, &[ids.len() as i32]))?,
        };
        Ok(h.reshape(&[1, ids.len() as i32, self.config.hidden_size])?)
    }

    /// Runs this model's layers over `h` (`[1, total, hidden]`: parts of `lens` tokens, part
    /// i after what `caches[i]` holds), writing their keys and values; the caches advance.
    /// Token-wise work runs on all parts together, so the weights are read (and BLAS packs
    /// them) once for all; attention runs per part over its own cache, causally.
    pub fn prefill_layers(&self, mut h: Array, lens: &[i32], caches: &mut [&mut KvCache]) -> Result<Array> {
        let c = &self.config;
        anyhow::ensure!(!lens.is_empty() && lens.len() == caches.len() && lens.iter().all(|&l| l > 0), "one non-empty part per cache");
        let starts: Vec<i32> = lens.iter().scan(0, |acc, &l| Some(std::mem::replace(acc, *acc + l))).collect();
        let offsets: Vec<i32> = caches.iter().map(|k| k.offset()).collect();
        for (i, b) in self.blocks.iter().enumerate() {
            let qkv = b.qkv.forward_normed(&h, &b.attn_norm, c.rms_norm_eps)?;
            let mut outs = Vec::with_capacity(lens.len());
            for (p, cache) in caches.iter_mut().enumerate() {
                let (s, l) = (starts[p], lens[p]);
                let mine: Vec<Array> =
                    if lens.len() == 1 { qkv.clone() } else { qkv.iter().map(|a| a.index((.., s..s + l, ..))).collect() };
                outs.push(self.attention(&mine, cache, i, offsets[p], l)?);
            }
            let o = if outs.len() == 1 { outs.pop().unwrap() } else { ops::concatenate(&outs, 1)? };
            h = b.attention_out(&o, &h, c.rms_norm_eps, self.reduce.as_ref())?;
            h = b.mlp(&h, c.rms_norm_eps, self.reduce.as_ref())?;
        }
        for (cache, &l) in caches.iter_mut().zip(lens) {
            cache.advance(l);
        }
        Ok(h)
    }

    /// The logits of each part's last position (`[parts, vocab]`), or of every position,
    /// from the last layer's `h`; float32, evaluated.
    pub fn head_of_parts(&self, h: &Array, lens: &[i32], every_position: bool) -> Result<Array> {
        let total: i32 = lens.iter().sum();
        let h = h.reshape(&[total, self.config.hidden_size])?;
        let h = if every_position {
            h
        } else {
            let last: Vec<i32> = lens
                .iter()
                .scan(0, |end, l| {
                    *end += l;
                    Some(*end - 1)
                })
                .collect();
            h.take_axis(Array::from_slice(&last, &[last.len() as i32]), 0)?
        };
        let logits = self.head(&h)?;
        logits.eval()?;
        Ok(logits)
    }

    /// Final norm and head over `h` `[rows, hidden]`: logits `[rows, vocab]` (float32, lazy).
    pub fn head(&self, h: &Array) -> Result<Array> {
        let ends = self.ends()?;
        let head = ends.lm_head.as_ref().unwrap_or(&ends.embed.0);
        let logits = head.apply_normed(h, &ends.norm, self.config.rms_norm_eps)?;
        Ok(logits.as_dtype(Dtype::Float32)?)
    }

    fn ends(&self) -> Result<&Ends> {
        self.ends.as_ref().ok_or_else(|| anyhow!("this rank holds layers {:?}, not the embedding and head", self.slice.layers))
    }

    /// One sequence's attention over `len` new positions (its slice of the q|k|v
    /// projections), written into and read from its cache; `[1, len, heads*head_dim]`.
    /// `layer` counts this model's layers (its cache's); the model-wide index picks the
    /// layer's rotation and window.
    fn attention(&self, qkv: &[Array], cache: &mut KvCache, layer: usize, offset: i32, len: i32) -> Result<Array> {
        let c = &self.config;
        let b = &self.blocks[layer];
        let global = self.slice.layers.start + layer;
        let (q, k, v) = self.heads(b, qkv, [1, len], |a| self.rope(a, offset, global))?;
        let (keys, values) = cache.update(layer, &k, &v)?;
        let scale = self.attn_scale();
        let o = match self.window(global).filter(|w| offset + len > *w) {
            // A local layer past its window: each query sees its last `w` positions only.
            Some(w) => {
                let queries = ops::arange::<_, i32>(offset, offset + len, None)?.reshape(&[len, 1])?;
                let keys_at = ops::arange::<_, i32>(0, offset + len, None)?.reshape(&[1, offset + len])?;
                let mask = keys_at.le(&queries)?.logical_and(&keys_at.gt(&queries.subtract(Array::from_int(w))?)?)?;
                fast::scaled_dot_product_attention(&q, &keys, &values, scale, &mask, b.sinks.as_ref())?
            }
            // Causal, aligned to the end of the keys so cached prefixes are visible: on the
            // CPU mlxbar's op (the same arithmetic, without the score matrix).
            None if len > 1 && self.cpu_attention => super::cpu_backend::prefill_attention(&q, &keys, &values, scale)?,
            None if len > 1 => fast::scaled_dot_product_attention(
                &q,
                &keys,
                &values,
                scale,
                fast::ScaledDotProductAttentionMask::Causal,
                b.sinks.as_ref(),
            )?,
            None => fast::scaled_dot_product_attention(&q, &keys, &values, scale, None, b.sinks.as_ref())?,
        };
        Ok(o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, len, c.num_heads * c.head_dim])?)
    }

    /// The q, k, v projections `[1, batch*len, heads*head_dim]` as
    /// `[batch, heads, len, head_dim]` each, q/k normed (qwen3) and rotated by `rope`.
    fn heads(
        &self,
        b: &Block,
        qkv: &[Array],
        [batch, len]: [i32; 2],
        rope: impl Fn(&Array) -> Result<Array>,
    ) -> Result<(Array, Array, Array)> {
        let c = &self.config;
        let split = |a: &Array, n: i32| -> Result<Array> { Ok(a.reshape(&[batch, len, n, c.head_dim])?) };
        let norm_rope = |a: Array, norm: Option<&Array>| -> Result<Array> {
            let a = match norm {
                Some(w) => fast::rms_norm(&a, Some(w), c.rms_norm_eps)?,
                None => a,
            };
            rope(&a.transpose_axes(&[0, 2, 1, 3])?)
        };
        let q = norm_rope(split(&qkv[0], c.num_heads)?, b.q_norm.as_ref())?;
        let k = norm_rope(split(&qkv[1], c.num_kv_heads)?, b.k_norm.as_ref())?;
        let v = split(&qkv[2], c.num_kv_heads)?.transpose_axes(&[0, 2, 1, 3])?;
        Ok((q, k, v))
    }

    /// One decode step for every sequence in `kv`: `tokens[i]` follows what row i holds.
    /// Token-wise work (embedding, norms, projections, MLP, head) runs on all of them as
    /// one `[1, B, hidden]` batch, so each weight is read once per step whatever the batch
    /// size; on the CPU a dense block's whole step is one op of mlxbar's
    /// ([`super::cpu_backend::decode_block`]), other blocks' attention one op a layer (norms,
    /// RoPE, the cache write and attention), one masked SDPA over the padded batch cache on
    /// Metal. Returns
    /// the logits `[B, vocab]` (float32), evaluated.
    pub fn decode(&self, tokens: &[u32], kv: &mut BatchKv) -> Result<Array> {
        let logits = self.decode_graph(tokens, kv)?;
        logits.eval()?;
        Ok(logits)
    }

    /// [`Model::decode`]'s step as MLX's graph, not yet run (the batch already counts the
    /// step's token: evaluate it before the next step). `decode_profile` counts its ops.
    pub fn decode_graph(&self, tokens: &[u32], kv: &mut BatchKv) -> Result<Array> {
        let h = self.embed_parts(&[tokens])?;
        let h = self.decode_layers(h, kv)?;
        self.head(&h.reshape(&[tokens.len() as i32, self.config.hidden_size])?)
    }

    /// Runs this model's layers over `h` `[1, B, hidden]`, row i the next token of the
    /// batch's row i; the batch advances by the step. Lazy.
    pub fn decode_layers(&self, mut h: Array, kv: &mut BatchKv) -> Result<Array> {
        let c = &self.config;
        let n = h.shape()[1];
        anyhow::ensure!(n > 0 && kv.ids().len() == n as usize, "one batch row per token");
        let (positions, mask) = kv.prepare_step()?;
        // Local layers' rows see their last `window` positions only.
        let local_mask = match &c.style.local {
            Some(local) => {
                let columns = ops::arange::<_, i32>(0, mask.shape()[3], None)?.reshape(&[1, 1, 1, -1])?;
                let oldest = positions.subtract(Array::from_int(local.window))?.reshape(&[n, 1, 1, 1])?;
                Some(mask.logical_and(&columns.gt(&oldest)?)?)
            }
            None => None,
        };
        for (i, b) in self.blocks.iter().enumerate() {
            let mask = match (&local_mask, self.window(self.slice.layers.start + i)) {
                (Some(m), Some(_)) => m,
                _ => &mask,
            };
            if let Some(out) = self.fused_block(b, &h, kv, i, &positions)? {
                h = out;
                continue;
            }
            h = self.batched_attention(b, &h, kv, i, &positions, mask)?;
            h = b.mlp(&h, c.rms_norm_eps, self.reduce.as_ref())?;
        }
        kv.advance();
        Ok(h)
    }

    /// `b`'s whole step over `h` as one op of mlxbar's on the CPU
    /// ([`super::cpu_backend::decode_block`]: the attention and the MLP with their norms
    /// and residuals, one op where they take five), where the block allows; None elsewhere.
    fn fused_block(&self, b: &Block, h: &Array, kv: &mut BatchKv, layer: usize, positions: &Array) -> Result<Option<Array>> {
        if !self.cpu_attention || self.reduce.is_some() {
            return Ok(None);
        }
        let Some([qkv, o, gate_up, down]) = b.fused_projections() else { return Ok(None) };
        let r = self.layer_rope(self.slice.layers.start + layer);
        let (keys, values) = kv.buffers(layer);
        let block = super::cpu_backend::DecodeBlock {
            h,
            attn_norm: &b.attn_norm,
            mlp_norm: &b.mlp_norm,
            qkv,
            o,
            gate_up,
            down,
            attention: self.attention_step(b, keys, values, positions, &r),
        };
        Ok(Some(super::cpu_backend::decode_block(&block)?))
    }

    /// What mlxbar's CPU decode attention takes for block `b` besides q|k|v.
    fn attention_step<'a>(
        &self,
        b: &'a Block,
        keys: &'a Array,
        values: &'a Array,
        positions: &'a Array,
        r: &LayerRope<'a>,
    ) -> AttentionStep<'a> {
        let c = &self.config;
        AttentionStep {
            keys,
            values,
            positions,
            heads: c.num_heads,
            q_norm: b.q_norm.as_ref(),
            k_norm: b.k_norm.as_ref(),
            eps: c.rms_norm_eps,
            rope: self.rope_params(r),
            periods: r.periods,
            scale: self.attn_scale(),
        }
    }

    /// `h` plus the attention of `rms_norm(h)` over the batch cache.
    fn batched_attention(&self, b: &Block, h: &Array, kv: &mut BatchKv, layer: usize, positions: &Array, mask: &Array) -> Result<Array> {
        let c = &self.config;
        let n = positions.shape()[0];
        let scale = self.attn_scale();
        let global = self.slice.layers.start + layer;
        let o = if self.cpu_attention {
            let r = self.layer_rope(global);
            let (keys, values) = kv.buffers(layer);
            super::cpu_backend::decode_attention(&super::cpu_backend::DecodeAttention {
                qkv: &b.qkv.forward_normed_joined(h, &b.attn_norm, c.rms_norm_eps)?,
                step: self.attention_step(b, keys, values, positions, &r),
            })?
        } else {
            // The batch as n sequences of one token, each row rotated by its own position.
            let qkv = b.qkv.forward_normed(h, &b.attn_norm, c.rms_norm_eps)?;
            let (q, k, v) = self.heads(b, &qkv, [n, 1], |a| self.rope_rows(a, positions, global))?;
            let (keys, values) = kv.update(layer, &k, &v, positions)?;
            let o = fast::scaled_dot_product_attention(&q, &keys, &values, scale, mask, b.sinks.as_ref())?;
            o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, n, c.num_heads * c.head_dim])?
        };
        b.attention_out(&o, h, c.rms_norm_eps, self.reduce.as_ref())
    }

    /// RoPE for `x` `[B, heads, 1, head_dim]` with row i at position `offsets[i]`
    /// (MLX's array-offset RoPE, which mlx-rs does not wrap yet).
    fn rope_rows(&self, x: &Array, offsets: &Array, layer: usize) -> Result<Array> {
        let r = self.layer_rope(layer);
        if self.cpu_rope {
            return self.cpu_rope(x, offsets, &r);
        }
        let x = &self.rope_input(x)?;
        let base = mlx_sys::mlx_optional_float { value: r.theta.unwrap_or(0.0), has_value: r.theta.is_some() };
        let stream = mlx_rs::Stream::thread_local_or_default();
        // SAFETY: every handle passed is alive for the call; the result is a new array
        // owned by the returned Array.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            let no_freqs = mlx_sys::mlx_array_new();
            let rc = mlx_sys::mlx_fast_rope_dynamic(
                &mut res,
                x.as_ptr(),
                r.dims,
                r.traditional,
                base,
                r.position_scale,
                offsets.as_ptr(),
                r.periods.map_or(no_freqs, |f| f.as_ptr()),
                stream.as_ptr(),
            );
            mlx_sys::mlx_array_free(no_freqs);
            if rc != 0 {
                mlx_sys::mlx_array_free(res);
                anyhow::bail!("mlx_fast_rope_dynamic failed");
            }
            Ok(Array::from_ptr(res))
        }
    }

    /// Bytes of keys and values one token adds to a cache (activations' dtype).
    pub fn kv_bytes_per_token(&self) -> usize {
        let c = &self.config;
        let elem = if self.dtype == Dtype::Float32 { 4 } else { 2 };
        2 * self.blocks.len() * c.num_kv_heads as usize * c.head_dim as usize * elem
    }

    fn rope(&self, x: &Array, offset: i32, layer: usize) -> Result<Array> {
        let r = self.layer_rope(layer);
        if self.cpu_rope {
            return self.cpu_rope(x, &Array::from_slice(&[offset], &[1]), &r);
        }
        let x = &self.rope_input(x)?;
        Ok(match r.periods {
            Some(p) => fast::rope(x, r.dims, r.traditional, None, r.position_scale, offset, p)?,
            None => fast::rope(x, r.dims, r.traditional, r.theta, r.position_scale, offset, None)?,
        })
    }

    /// RoPE as one op of mlxbar's on the CPU, LongRoPE's input scale folded in.
    fn cpu_rope(&self, x: &Array, offsets: &Array, r: &LayerRope) -> Result<Array> {
        super::cpu_backend::rope(x, offsets, r.periods, self.rope_params(r))
    }

    /// A layer's rotation as mlxbar's CPU ops take it.
    fn rope_params(&self, r: &LayerRope) -> super::cpu_backend::RopeParams {
        super::cpu_backend::RopeParams {
            dims: r.dims,
            traditional: r.traditional,
            base: r.theta.unwrap_or(0.0),
            position_scale: r.position_scale,
            input_scale: self.config.rope.input_scale,
        }
    }

    /// Layer `layer`'s rotation: the model's, or a local layer's own base, unscaled.
    fn layer_rope(&self, layer: usize) -> LayerRope<'_> {
        let r = &self.config.rope;
        let dims = r.dims.unwrap_or(self.config.head_dim);
        match (&self.config.style.local, &self.rope_periods) {
            (Some(LocalAttention { rope_theta: Some(theta), layers, .. }), _) if layers[layer] => {
                LayerRope { dims, traditional: r.traditional, theta: Some(*theta), periods: None, position_scale: 1.0 }
            }
            (_, Some(p)) => LayerRope { dims, traditional: r.traditional, theta: None, periods: Some(p), position_scale: r.position_scale },
            (_, None) => {
                LayerRope { dims, traditional: r.traditional, theta: Some(r.theta), periods: None, position_scale: r.position_scale }
            }
        }
    }

    /// q or k with its rotated part scaled by LongRoPE's attention factor, when there is one.
    fn rope_input(&self, x: &Array) -> Result<Array> {
        let r = &self.config.rope;
        if r.input_scale == 1.0 {
            return Ok(x.clone());
        }
        let scale = Array::from_f32(r.input_scale).as_dtype(x.dtype())?;
        Ok(match r.dims {
            Some(d) => {
                let (rotated, rest) = (x.index((.., .., .., ..d)), x.index((.., .., .., d..)));
                ops::concatenate(&[rotated.multiply(&scale)?, rest], -1)?
            }
            None => x.multiply(&scale)?,
        })
    }

    /// Attention scores' scale: the family's, else `1/sqrt(head_dim)`.
    fn attn_scale(&self) -> f32 {
        self.config.style.attn_scale.unwrap_or(1.0 / (self.config.head_dim as f32).sqrt())
    }

    /// The window of a local layer, None for a global one.
    fn window(&self, layer: usize) -> Option<i32> {
        self.config.style.local.as_ref().filter(|l| l.layers[layer]).map(|l| l.window)
    }

    /// Token embeddings, scaled as the family scales them (in their own dtype).
    fn embed(&self, ids: &Array) -> Result<Array> {
        self.scale_embedding(self.ends()?.embed.lookup(ids)?)
    }

    /// The family's embedding scale (Gemma's √hidden) applied to looked-up rows.
    fn scale_embedding(&self, h: Array) -> Result<Array> {
        Ok(match self.config.style.embed_scale {
            Some(s) => h.multiply(Array::from_f32(s).as_dtype(h.dtype())?)?,
            None => h,
        })
    }
}

/// One layer's RoPE parameters ([`Model::layer_rope`]).
struct LayerRope<'a> {
    dims: i32,
    traditional: bool,
    /// The base, or per-pair `periods`.
    theta: Option<f32>,
    periods: Option<&'a Array>,
    position_scale: f32,
}
