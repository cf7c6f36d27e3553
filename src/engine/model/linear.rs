//! Projection and embedding weights, dense or MLX-quantized ([`Quantized`]).
use anyhow::{ensure, Result};
use mlx_rs::{fast, nn, ops, Array, Dtype};

pub use super::quantized::{QuantMode, Quantized};
use crate::engine::cpu_backend::Prologue;

/// The weight matrix of a projection.
#[derive(Clone)]
pub enum Weight {
    /// `[out_features, in_features]`, contiguous: each output is a dot product with one
    /// contiguous row, which single-row decode (gemv) and batched decode
    /// (`engine::cpu_backend::small_m`) both stream once.
    Dense(Array),
    /// `[out_features, in_features·bits/32]` as MLX quantizes.
    Quantized(Quantized),
}

impl Weight {
    /// A dense weight from a `[out_features, in_features]` matrix (the files' layout).
    pub fn dense(w: Array) -> Result<Weight> {
        Ok(Weight::Dense(w.contiguous()?))
    }

    /// `x @ W.T` in the files' terms.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Weight::Dense(w) => ops::matmul(x, w.t())?,
            Weight::Quantized(q) if q.cpu_kernel => q.cpu_matmul(x, Prologue::None, None)?,
            Weight::Quantized(q) => q.matmul(x)?,
        })
    }

    /// `apply(rms_norm(x, norm, eps))`: one op where the CPU kernel runs the weight (the
    /// norm in its prologue), else MLX's norm first.
    pub fn apply_normed(&self, x: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match self {
            Weight::Quantized(q) if q.cpu_kernel => q.cpu_matmul(x, Prologue::RmsNorm(norm, eps), None),
            _ => self.apply(&fast::rms_norm(x, Some(norm), eps)?),
        }
    }

    pub fn out_features(&self) -> i32 {
        match self {
            Weight::Dense(w) => w.shape()[0],
            Weight::Quantized(q) => q.weight.shape()[0],
        }
    }

    /// Converts to a dense matrix of `dtype`; quantized weights are dequantized first.
    pub fn into_dense(self, dtype: Dtype) -> Result<Weight> {
        match self {
            Weight::Dense(wt) if wt.dtype() == dtype => Ok(Weight::Dense(wt)),
            Weight::Dense(wt) => Ok(Weight::Dense(wt.as_dtype(dtype)?)),
            // Scales to the target type first: dequantizing with float16 scales would round
            // every weight to float16 (and float16 arithmetic is emulated on x86).
            Weight::Quantized(q) => {
                let q = q.map(Ok, |a| cast(a, dtype))?;
                Weight::dense(q.dequantize(dtype)?)
            }
        }
    }

    /// Casts the float parts (dense matrix, or scales and biases) to `dtype`.
    pub fn cast_floats(self, dtype: Dtype) -> Result<Weight> {
        Ok(match self {
            Weight::Dense(w) => Weight::Dense(cast(w, dtype)?),
            Weight::Quantized(q) => Weight::Quantized(q.map(Ok, |a| cast(a, dtype))?),
        })
    }

    /// For the CPU device: quantized weights the CPU kernel runs stay packed, their scales
    /// and biases in the float type the file holds (float16 or bfloat16: in float32 they
    /// would add half again to a 4-bit matrix), mxfp4 ones too (MLX's own CPU ops run
    /// them: float32 would be eight times their size), the rest become float32 matrices.
    pub fn for_cpu(self) -> Result<Weight> {
        match self {
            Weight::Quantized(q)
                if q.mode == QuantMode::Affine && crate::engine::cpu_backend::quantized_kernel(q.bits, q.group_size).is_some() =>
            {
                let kept = |a: Array| match a.dtype() {
                    Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 => Ok(a),
                    _ => cast(a, Dtype::Float32),
                };
                let q = q.map(Ok, kept)?;
                Ok(Weight::Quantized(Quantized { cpu_kernel: true, ..q }))
            }
            Weight::Quantized(q) if q.mode == QuantMode::Mxfp4 => Ok(Weight::Quantized(q)),
            other => other.into_dense(Dtype::Float32),
        }
    }

    /// Stacks several projections of the same input into one (q|k|v, gate|up), so a step
    /// runs one matmul instead of several. None when their formats differ.
    pub fn concat_rows(parts: &[Weight]) -> Result<Option<Weight>> {
        if parts.iter().all(|p| matches!(p, Weight::Dense(_))) {
            let ws: Vec<&Array> = parts
                .iter()
                .map(|p| match p {
                    Weight::Dense(w) => w,
                    _ => unreachable!(),
                })
                .collect();
            return Ok(Some(Weight::Dense(ops::concatenate(&ws, 0)?)));
        }
        let qs: Option<Vec<&Quantized>> = parts
            .iter()
            .map(|p| match p {
                Weight::Quantized(q) => Some(q),
                _ => None,
            })
            .collect();
        let Some(qs) = qs else { return Ok(None) };
        let first = qs[0];
        if qs.iter().any(|q| q.spec() != first.spec() || q.cpu_kernel != first.cpu_kernel || q.strips) {
            return Ok(None);
        }
        let cat = |f: fn(&Quantized) -> &Array| -> Result<Array> { Ok(ops::concatenate(&qs.iter().map(|q| f(q)).collect::<Vec<_>>(), 0)?) };
        let biases = match first.biases {
            Some(_) => Some(ops::concatenate(&qs.iter().filter_map(|q| q.biases.as_ref()).collect::<Vec<_>>(), 0)?),
            None => None,
        };
        Ok(Some(Weight::Quantized(Quantized { weight: cat(|q| &q.weight)?, scales: cat(|q| &q.scales)?, biases, ..first.clone() })))
    }

    /// Reorders the output features by `perm` (indices into the current order).
    pub fn take_outputs(self, perm: &Array) -> Result<Weight> {
        Ok(match self {
            Weight::Dense(w) => Weight::Dense(w.take_axis(perm, 0)?),
            Weight::Quantized(q) => Weight::Quantized(q.map_all(|a| Ok(a.take_axis(perm, 0)?))?),
        })
    }

    /// Splits the output features into consecutive pieces of these sizes (a fused
    /// projection into its parts).
    pub fn split_outputs(self, sizes: &[i32]) -> Result<Vec<Weight>> {
        let total: i32 = sizes.iter().sum();
        ensure!(total == self.out_features(), "{} output features cannot split into {sizes:?}", self.out_features());
        let mut start = 0;
        let mut parts = Vec::with_capacity(sizes.len());
        for &n in sizes {
            let rows: Vec<i32> = (start..start + n).collect();
            parts.push(self.clone().take_outputs(&Array::from_slice(&rows, &[n]))?);
            start += n;
        }
        Ok(parts)
    }

    pub fn nbytes(&self) -> usize {
        match self {
            Weight::Dense(w) => w.nbytes(),
            Weight::Quantized(q) => q.nbytes(),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Weight::Dense(w) => vec![w],
            Weight::Quantized(q) => q.arrays(),
        }
    }

    /// Repacked for the CPU kernel where it reads that faster ([`Quantized::into_strips`]);
    /// whether it was.
    pub(super) fn repack_in_strips(&mut self) -> Result<bool> {
        if let Weight::Quantized(q) = self {
            if !q.strips {
                *q = q.clone().into_strips()?;
                return Ok(q.strips);
            }
        }
        Ok(false)
    }
}

/// `a` as `dtype` (itself when it already is).
fn cast(a: Array, dtype: Dtype) -> Result<Array> {
    Ok(if a.dtype() == dtype { a } else { a.as_dtype(dtype)? })
}

/// A linear layer: weight plus optional bias (qwen2 has q/k/v biases).
#[derive(Clone)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Array>,
}

impl Linear {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.weight.apply(x)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    /// Weights the CPU kernel runs with its fusions (quantized, no bias): each fused
    /// method below is then one MLX op instead of two to five.
    pub fn fuses(&self) -> bool {
        self.fusable().is_some()
    }

    /// The quantized weight mlxbar's CPU kernel runs with its prologues and residual (no
    /// bias to add), None otherwise.
    pub(super) fn fusable(&self) -> Option<&Quantized> {
        match &self.weight {
            Weight::Quantized(q) if q.cpu_kernel && self.bias.is_none() => Some(q),
            _ => None,
        }
    }

    /// `forward(rms_norm(x, norm, eps))`.
    pub fn forward_normed(&self, x: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match &self.bias {
            None => self.weight.apply_normed(x, norm, eps),
            Some(_) => self.forward(&fast::rms_norm(x, Some(norm), eps)?),
        }
    }

    /// `residual + forward(x)`.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        match self.fusable() {
            Some(q) => q.cpu_matmul(x, Prologue::None, Some(residual)),
            None => Ok(residual.add(&self.forward(x)?)?),
        }
    }

    /// `residual + forward(silu(gate) · up)` for `gate_up = [gate | up]` on the last axis.
    pub fn forward_swiglu_add(&self, gate_up: &Array, residual: &Array) -> Result<Array> {
        match self.fusable() {
            Some(q) => q.cpu_matmul(gate_up, Prologue::SwiGlu, Some(residual)),
            None => {
                let half = gate_up.shape()[gate_up.ndim() - 1] / 2;
                let parts = ops::split_at_indices(gate_up, &[half], -1)?;
                self.forward_add(&nn::silu(&parts[0])?.multiply(&parts[1])?, residual)
            }
        }
    }

    /// See [`Weight::concat_rows`]; biases must be all present or all absent.
    pub fn concat_rows(parts: Vec<Linear>) -> Result<Result<Linear, Vec<Linear>>> {
        let weights: Vec<Weight> = parts.iter().map(|p| p.weight.clone()).collect();
        let Some(weight) = Weight::concat_rows(&weights)? else { return Ok(Err(parts)) };
        let bias = match parts.iter().map(|p| p.bias.as_ref()).collect::<Option<Vec<_>>>() {
            Some(bs) => Some(ops::concatenate(&bs, 0)?),
            None if parts.iter().all(|p| p.bias.is_none()) => None,
            None => return Ok(Err(parts)),
        };
        Ok(Ok(Linear { weight, bias }))
    }
}

/// The token embedding table (`[vocab, hidden]` in file terms); also the output head when tied.
#[derive(Clone)]
pub struct Embedding(pub Weight);

impl Embedding {
    /// Rows for `ids` (`[L]` -> `[L, hidden]`).
    pub fn lookup(&self, ids: &Array) -> Result<Array> {
        Ok(match &self.0 {
            Weight::Dense(w) => w.take_axis(ids, 0)?,
            Weight::Quantized(q) => {
                let rows = q.clone().map_all(|a| Ok(a.take_axis(ids, 0)?))?;
                if q.cpu_kernel {
                    // The CPU runs float32: the looked-up rows' scales widened first, so the
                    // values are not rounded to float16 on the way.
                    rows.map(Ok, |a| cast(a, Dtype::Float32))?.dequantize(Dtype::Float32)?
                } else {
                    let dtype = q.biases.as_ref().map_or(Dtype::Float32, |b| b.dtype());
                    rows.dequantize(dtype)?
                }
            }
        })
    }

    /// Rows for `ids` (`[L, hidden]`, float32) dequantized on the host where the CPU
    /// kernel holds the table packed ([`crate::engine::cpu_backend::dequantize_rows`]): the
    /// same values as [`Embedding::lookup`] without MLX's ~40 ops; None where it does not
    /// apply.
    pub fn lookup_on_host(&self, ids: &[u32]) -> Result<Option<Array>> {
        match &self.0 {
            Weight::Quantized(Quantized { weight, scales, biases: Some(biases), group_size, bits, cpu_kernel: true, strips, .. }) => {
                crate::engine::cpu_backend::dequantize_rows(weight, scales, biases, (*group_size, *bits, *strips), ids)
            }
            _ => Ok(None),
        }
    }

    pub fn vocab_size(&self) -> i32 {
        self.0.out_features()
    }
}

/// Checks a weight's shape against what the config says.
pub fn expect_shape(name: &str, w: &Weight, out_features: i32) -> Result<()> {
    ensure!(w.out_features() == out_features, "{name}: {} output rows, config says {out_features}", w.out_features());
    Ok(())
}

#[cfg(test)]
mod tests {
    use mlx_rs::{ops, random, Array, Device, Dtype};

    use super::{Embedding, Quantized, Weight};
    use crate::engine::model::quantized::QuantSpec;

    /// The host lookup gives MLX's dequantized rows bit for bit (so a step's embedding does
    /// not depend on which path took it), for 4 and 8 bits, each group size and each stored
    /// scale type, from the table in MLX's layout and in strips (where this machine's
    /// kernel reads those), and refuses an id outside the vocabulary.
    #[test]
    fn host_lookup_equals_mlx_dequantize() {
        Device::set_default(&Device::cpu());
        let table = random::normal::<f32>(&[48, 256][..], 0.0, 0.05, None).unwrap();
        for (bits, group_size, dtype) in
            [(4, 32, Dtype::Float16), (8, 32, Dtype::Float16), (4, 64, Dtype::Bfloat16), (8, 128, Dtype::Float32), (4, 128, Dtype::Float32)]
        {
            let (wq, scales, biases) = ops::quantize(&table, group_size, bits).unwrap();
            let (scales, biases) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
            let q = Quantized::new(wq, scales, Some(biases), QuantSpec::affine(group_size, bits)).unwrap();
            let Weight::Quantized(q) = Weight::Quantized(q).for_cpu().unwrap() else { panic!("stays quantized") };
            if !q.cpu_kernel {
                return; // no CPU kernel on this machine: the host path does not apply
            }
            let ids = [0u32, 47, 7, 7, 22, 16];
            let mlx = Embedding(Weight::Quantized(q.clone())).lookup(&Array::from_slice(&ids, &[ids.len() as i32])).unwrap();
            let strips = q.clone().into_strips().unwrap();
            for table in std::iter::once(q.clone()).chain(strips.strips.then_some(strips)) {
                let in_strips = table.strips;
                let embedding = Embedding(Weight::Quantized(table));
                let host = embedding.lookup_on_host(&ids).unwrap().expect("the host path applies");
                assert_eq!(host.shape(), mlx.shape());
                let (h, m) = (host.as_slice::<f32>(), mlx.as_slice::<f32>());
                for (i, (a, b)) in h.iter().zip(m).enumerate() {
                    let what = format!("{bits} bits, groups of {group_size}, {dtype:?}, strips {in_strips}");
                    assert_eq!(a.to_bits(), b.to_bits(), "{what}: value {i}: {a} vs {b}");
                }
                assert!(embedding.lookup_on_host(&[48]).unwrap_err().to_string().contains("outside the vocabulary"));
            }
        }
    }
}
