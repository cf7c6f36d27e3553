//! Where each expert's bytes lie in a model folder's safetensors files or a GGUF file, from
//! their headers alone, so a streamed expert is read with positional reads of its own byte
//! ranges and never the whole file. Both checkpoint layouts: stacked (mlx-community's
//! `mlp.switch_mlp.gate_proj.weight` `[experts, out, in]`, where expert `e` is the `e`-th
//! equal run of bytes) and Hugging Face's (one tensor per expert,
//! `mlp.experts.{e}.gate_proj.weight`, mixtral's `block_sparse_moe.experts.{e}.w1.weight`).
//! And reading them: an expert's three projections as the arrays the resident model would
//! hold (`[1, out, in]`, converted to the model's weight format).
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use mlx_rs::{Array, Dtype};

use super::cache::Key;
use crate::engine::model::config::{Arch, QuantMode, QuantSpec, QuantizationConfig};
use crate::engine::model::gguf;
use crate::engine::model::gguf_read::{self, Tensor};
use crate::engine::model::linear::{Quantized, Weight};
use crate::engine::model::switch::{SwitchGlu, SwitchLinear};
use crate::engine::model::validate::{GgmlType, GgufSummary, GgufTensorInfo};

/// A run of bytes in one of the files, and what array it is: raw elements of `dtype`, or
/// GGML blocks of `ggml` (a GGUF's expert, converted as [`gguf_read::convert`] does).
#[derive(Debug, Clone)]
struct Part {
    file: usize,
    offset: u64,
    len: u64,
    dtype: Dtype,
    shape: Vec<i32>,
    ggml: Option<GgmlType>,
}

/// One projection of one expert: its weight, and scales and biases when quantized, and a
/// bias when the family has one (gpt-oss).
#[derive(Debug, Clone, Default)]
struct Projection {
    weight: Option<Part>,
    scales: Option<Part>,
    biases: Option<Part>,
    bias: Option<Part>,
    /// The stacked module's path (config.json's quantization overrides name it).
    module: String,
    /// How it is packed, when quantized (from the whole index: the scales and weight).
    quantization: Option<QuantSpec>,
}

/// Every expert of every sparse layer of a folder or a GGUF, by (layer, expert).
pub struct ExpertFiles {
    files: Vec<(PathBuf, File)>,
    experts: HashMap<Key, [Projection; 3]>,
}

/// The projections in [`SwitchGlu`] order.
const PROJECTIONS: [&str; 3] = ["gate", "up", "down"];

impl ExpertFiles {
    /// Indexes the experts of the safetensors `files` of a `arch` model with `num_experts`
    /// experts a sparse layer, quantized as `quantization` says.
    pub fn index(files: &[PathBuf], arch: Arch, num_experts: i32, quantization: Option<&QuantizationConfig>) -> Result<ExpertFiles> {
        let mut experts: HashMap<Key, [Projection; 3]> = HashMap::new();
        let mut opened = Vec::with_capacity(files.len());
        for (f, path) in files.iter().enumerate() {
            let summary = crate::engine::model::validate::safetensors_file(path)?;
            for (name, range) in &summary.ranges {
                let Some(t) = expert_tensor(name, arch) else { continue };
                let shape: Vec<i32> = summary.shapes[name].iter().map(|&d| d as i32).collect();
                let dtype = dtype_of(&range.dtype).with_context(|| format!("{name}: dtype {}", range.dtype))?;
                let mut place = |expert: i32, offset: u64, len: u64, shape: Vec<i32>| {
                    let projections = experts.entry((t.layer, expert as u32)).or_default();
                    let p = &mut projections[t.projection];
                    let part = Some(Part { file: f, offset, len, dtype, shape, ggml: None });
                    match t.kind {
                        "weight" => p.weight = part,
                        "scales" => p.scales = part,
                        "biases" => p.biases = part,
                        _ => p.bias = part,
                    }
                    p.module.clone_from(&t.stacked_module);
                };
                match t.expert {
                    Some(e) => {
                        ensure!(e < num_experts, "{name}: expert {e} beyond num_experts = {num_experts}");
                        place(e, range.offset, range.len, shape);
                    }
                    None => {
                        ensure!(shape.first() == Some(&num_experts), "{name}: shape {shape:?}, {num_experts} experts");
                        let per = range.len / num_experts as u64;
                        for e in 0..num_experts {
                            place(e, range.offset + e as u64 * per, per, shape[1..].to_vec());
                        }
                    }
                }
            }
            opened.push((path.clone(), File::open(path).with_context(|| format!("opening {}", path.display()))?));
        }
        for ((layer, expert), projections) in experts.iter_mut() {
            for (p, name) in projections.iter_mut().zip(PROJECTIONS) {
                let Some(weight) = &p.weight else { bail!("layer {layer} expert {expert}: no {name} weight") };
                let Some(scales) = &p.scales else {
                    ensure!(p.biases.is_none(), "layer {layer} expert {expert}: {name} has biases and no scales");
                    continue;
                };
                let q = quantization.with_context(|| format!("{} is quantized but config.json has no quantization", p.module))?;
                let cols = |part: &Part| part.shape.last().copied().unwrap_or(0);
                let spec = q.spec(&p.module, scales.dtype, cols(weight), cols(scales))?;
                ensure!(
                    p.biases.is_some() == (spec.mode == QuantMode::Affine),
                    "layer {layer} expert {expert}: {name} is {} with{} biases",
                    spec.mode.name(),
                    if p.biases.is_some() { "" } else { "out" }
                );
                p.quantization = Some(spec);
            }
        }
        Ok(ExpertFiles { files: opened, experts })
    }

    /// Indexes the stacked experts (`blk.{l}.ffn_{gate,up,down}_exps`, gpt-oss's biases
    /// too) of the checked GGUF at `path` (header `h`) of an `arch` model with `num_experts`
    /// experts a sparse layer. GGML stores an `[experts, out, in]` tensor expert by expert,
    /// each in whole blocks, so expert `e` is the `e`-th equal run of its bytes.
    pub fn index_gguf(path: &Path, h: &GgufSummary, arch: Arch, num_experts: i32) -> Result<ExpertFiles> {
        let mut experts: HashMap<Key, [Projection; 3]> = HashMap::new();
        for info in &h.tensor_infos {
            let Some((layer, projection, kind)) = gguf::expert_tensor(&info.name, arch) else { continue };
            let (experts_axis, rows) = info.dims.split_last().context("a scalar expert tensor")?;
            ensure!(*experts_axis == num_experts as u64, "{}: {:?} (GGML order), {num_experts} experts", info.name, info.dims);
            let quantization = match info.ggml_type.name {
                "F32" | "F16" | "BF16" => None,
                "Q4_0" | "Q4_1" => Some(QuantSpec::affine(32, 4)),
                "Q8_0" => Some(QuantSpec::affine(32, 8)),
                "MXFP4" => Some(QuantSpec::MXFP4),
                other => bail!(
                    "{}: experts in {other} cannot stream (mlxbar reads F32, F16, BF16, Q8_0, Q4_0, Q4_1 and MXFP4 experts \
                     itself); use such a file, or the memory to load them all",
                    info.name
                ),
            };
            let per = info.bytes / num_experts as u64;
            let shape: Vec<i32> = rows.iter().rev().map(|&d| d as i32).collect();
            for e in 0..num_experts as u32 {
                let part = Part {
                    file: 0,
                    offset: h.data_start + info.offset + e as u64 * per,
                    len: per,
                    dtype: Dtype::Float32,
                    shape: shape.clone(),
                    ggml: Some(info.ggml_type),
                };
                let p = &mut experts.entry((layer, e)).or_default()[projection];
                match kind {
                    "weight" => {
                        p.weight = Some(part);
                        p.quantization = quantization;
                    }
                    _ => p.bias = Some(part),
                }
                p.module.clone_from(&info.name);
            }
        }
        for ((layer, expert), projections) in &experts {
            for (p, name) in projections.iter().zip(PROJECTIONS) {
                ensure!(p.weight.is_some(), "layer {layer} expert {expert}: no {name} weight (ffn_{name}_exps)");
            }
        }
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Ok(ExpertFiles { files: vec![(path.to_path_buf(), file)], experts })
    }

    /// The sparse layers the files hold experts of, ascending.
    pub fn layers(&self) -> Vec<u32> {
        let mut layers: Vec<u32> = self.experts.keys().map(|k| k.0).collect();
        layers.sort();
        layers.dedup();
        layers
    }

    /// How the experts are quantized, if they are (the first one's).
    pub fn quantization(&self) -> Option<QuantSpec> {
        let first = self.experts.keys().min()?;
        self.experts[first][0].quantization
    }

    pub fn has(&self, key: Key) -> bool {
        self.experts.contains_key(&key)
    }

    /// Bytes of `key` on disk.
    pub fn disk_bytes(&self, key: Key) -> u64 {
        self.experts
            .get(&key)
            .map_or(0, |ps| ps.iter().flat_map(|p| [&p.weight, &p.scales, &p.biases, &p.bias]).flatten().map(|p| p.len).sum())
    }

    /// Reads expert `key` from disk as a one-expert [`SwitchGlu`] (`[1, out, in]` stacks),
    /// each projection converted by `hold` as the resident model converts its weights.
    pub fn read(
        &self,
        key: Key,
        hold: &dyn Fn(Weight) -> Result<Weight>,
        activation: crate::engine::model::config::Activation,
    ) -> Result<SwitchGlu> {
        let projections = self.experts.get(&key).with_context(|| format!("layer {} has no expert {}", key.0, key.1))?;
        let [gate, up, down] = projections;
        let linear = |p: &Projection| -> Result<SwitchLinear> {
            let part = p.weight.as_ref().expect("indexed with a weight");
            let weight = match (part.ggml, &p.scales, p.quantization) {
                (Some(_), ..) => match self.ggml(part)? {
                    Tensor::Quantized(q) => Weight::Quantized(q),
                    Tensor::Plain(w) => Weight::Dense(w),
                },
                (None, Some(s), Some(spec)) => {
                    let biases = p.biases.as_ref().map(|b| self.array(b)).transpose()?;
                    Weight::Quantized(Quantized::new(self.array(part)?, self.array(s)?, biases, spec)?)
                }
                _ => Weight::Dense(self.array(part)?),
            };
            let bias = match &p.bias {
                Some(b) if b.ggml.is_some() => match self.ggml(b)? {
                    Tensor::Plain(b) => Some(b),
                    Tensor::Quantized(_) => bail!("a quantized expert bias"),
                },
                Some(b) => Some(self.array(b)?),
                None => None,
            };
            Ok(SwitchLinear(hold(weight)?, bias))
        };
        let read = || -> Result<SwitchGlu> { Ok(SwitchGlu { gate: linear(gate)?, up: linear(up)?, down: linear(down)?, activation }) };
        read().with_context(|| format!("reading expert {} of layer {} from disk", key.1, key.0))
    }

    /// One part's bytes, read with one positional read.
    fn bytes(&self, p: &Part) -> Result<Vec<u8>> {
        let (path, file) = &self.files[p.file];
        let mut bytes = vec![0u8; p.len as usize];
        file.read_exact_at(&mut bytes, p.offset).with_context(|| format!("{} bytes at {} of {}", p.len, p.offset, path.display()))?;
        Ok(bytes)
    }

    /// A GGUF part as the resident model would hold it, with a leading experts axis of 1.
    fn ggml(&self, p: &Part) -> Result<Tensor> {
        let ggml_type = p.ggml.expect("a GGUF part");
        // GGML order (innermost first), the experts axis of 1 outermost.
        let dims: Vec<u64> = p.shape.iter().rev().map(|&d| d as u64).chain([1]).collect();
        let info = GgufTensorInfo { name: String::new(), dims, ggml_type, offset: 0, bytes: p.len };
        gguf_read::convert(&info, &self.bytes(p)?)
    }

    /// One part's bytes as an array with a leading experts axis of 1.
    fn array(&self, p: &Part) -> Result<Array> {
        let path = &self.files[p.file].0;
        let bytes = self.bytes(p)?;
        let elements: i64 = p.shape.iter().map(|&d| d as i64).product();
        ensure!(elements as u64 * dtype_size(p.dtype) == p.len, "{}: {:?} {:?} is not {} bytes", path.display(), p.dtype, p.shape, p.len);
        let mut shape = vec![1];
        shape.extend(&p.shape);
        // SAFETY: `bytes` holds exactly `shape`'s element count of `dtype` (checked above)
        // and lives across the call, which copies it into an MLX buffer.
        Ok(unsafe { Array::from_raw_data(bytes.as_ptr().cast(), &shape, p.dtype) })
    }
}

/// An expert tensor's place: sparse layer, expert (None when stacked), projection index
/// into [`PROJECTIONS`], kind (`weight`, `scales`, `biases`, `bias`), and the stacked module
/// path (quantization overrides are keyed by it).
struct ExpertTensor {
    layer: u32,
    expert: Option<i32>,
    projection: usize,
    kind: &'static str,
    stacked_module: String,
}

/// Recognizes `name` as an expert tensor of an `arch` checkpoint, in either layout.
fn expert_tensor(name: &str, arch: Arch) -> Option<ExpertTensor> {
    let (module, kind) = name.rsplit_once('.')?;
    let kind = ["weight", "scales", "biases", "bias"].into_iter().find(|k| *k == kind)?;
    let (stacked_module, expert) = match module.split_once(".experts.") {
        Some((block, rest)) => match rest.split_once('.') {
            Some((e, proj)) if e.bytes().all(|b| b.is_ascii_digit()) => {
                let proj = match proj {
                    "w1" => "gate_proj",
                    "w2" => "down_proj",
                    "w3" => "up_proj",
                    other => other,
                };
                (format!("{block}.switch_mlp.{proj}"), Some(e.parse().ok()?))
            }
            _ => (module.to_string(), None),
        },
        None => (module.to_string(), None),
    };
    let canonical = crate::engine::model::hf::canonical_name(&stacked_module, arch)?;
    let (layer, part) = canonical.strip_prefix("layers.")?.split_once('.')?;
    let projection = PROJECTIONS.iter().position(|p| part.strip_prefix("experts.") == Some(p))?;
    Some(ExpertTensor { layer: layer.parse().ok()?, expert, projection, kind, stacked_module })
}

/// Whether `name` is an expert's tensor in an `arch` checkpoint (either layout).
pub fn is_expert_tensor(name: &str, arch: Arch) -> bool {
    expert_tensor(name, arch).is_some()
}

/// The MLX dtype of a safetensors dtype name.
fn dtype_of(name: &str) -> Result<Dtype> {
    Ok(match name {
        "F32" => Dtype::Float32,
        "F16" => Dtype::Float16,
        "BF16" => Dtype::Bfloat16,
        "U32" => Dtype::Uint32,
        "U8" => Dtype::Uint8,
        "I32" => Dtype::Int32,
        other => bail!("unsupported dtype {other}"),
    })
}

fn dtype_size(dtype: Dtype) -> u64 {
    match dtype {
        Dtype::Float32 | Dtype::Uint32 | Dtype::Int32 => 4,
        Dtype::Float16 | Dtype::Bfloat16 => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_expert_tensors_in_both_layouts() {
        let t = |n: &str, arch| expert_tensor(n, arch).map(|t| (t.layer, t.expert, PROJECTIONS[t.projection], t.kind, t.stacked_module));
        assert_eq!(
            t("model.layers.3.mlp.switch_mlp.up_proj.scales", Arch::Qwen3Moe),
            Some((3, None, "up", "scales", "model.layers.3.mlp.switch_mlp.up_proj".into()))
        );
        assert_eq!(
            t("model.layers.0.mlp.experts.7.down_proj.weight", Arch::Qwen3Moe),
            Some((0, Some(7), "down", "weight", "model.layers.0.mlp.switch_mlp.down_proj".into()))
        );
        assert_eq!(
            t("model.layers.1.block_sparse_moe.experts.2.w3.weight", Arch::Mixtral),
            Some((1, Some(2), "up", "weight", "model.layers.1.block_sparse_moe.switch_mlp.up_proj".into()))
        );
        assert_eq!(
            t("model.layers.1.mlp.experts.gate_proj.bias", Arch::GptOss).map(|t| (t.0, t.1, t.2, t.3)),
            Some((1, None, "gate", "bias"))
        );
        for other in ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight"] {
            assert!(t(other, Arch::Qwen3Moe).is_none(), "{other}");
        }
    }
}
