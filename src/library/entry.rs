//! What the library knows about one local model: where it is, what it is, and whether
//! this engine can run it (with the reason when not). Serialized as-is by the API.
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Serialize;

use crate::engine::model::quantized::{QuantMode, QuantSpec};

/// How the weights are stored.
#[derive(Serialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    /// An MLX / Hugging Face folder: config.json + *.safetensors + tokenizer.json.
    Mlx,
    /// One .gguf file.
    Gguf,
}

impl ModelFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::Mlx => "mlx",
            ModelFormat::Gguf => "gguf",
        }
    }
}

/// Where the library found the model; earlier sources win an id (see `Sources`).
#[derive(Serialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum ModelSource {
    /// Given by path (`--model PATH`).
    Path,
    /// mlxbar's own models dir (the default model).
    Mlxbar,
    /// A `models_dirs` entry of the config.
    ModelsDir,
    /// The Hugging Face hub cache.
    HubCache,
    /// LM Studio's models folder.
    LmStudio,
}

impl ModelSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelSource::Path => "path",
            ModelSource::Mlxbar => "mlxbar",
            ModelSource::ModelsDir => "models-dir",
            ModelSource::HubCache => "hub-cache",
            ModelSource::LmStudio => "lm-studio",
        }
    }
}

/// Quantization of the weights (the dominant one when modules differ).
#[derive(Serialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantization {
    pub bits: u32,
    pub group_size: u32,
    /// `affine` (integers with a scale and bias per group) or `mxfp4` (gpt-oss's experts).
    pub mode: QuantMode,
}

impl Quantization {
    pub fn affine(bits: u32, group_size: u32) -> Quantization {
        Quantization { bits, group_size, mode: QuantMode::Affine }
    }

    pub fn spec(self) -> QuantSpec {
        QuantSpec { group_size: self.group_size as i32, bits: self.bits as i32, mode: self.mode }
    }

    /// Bytes `elements` values take packed: the values, and per group a scale (and an
    /// affine bias) of `float_bytes` each, an mxfp4 scale one byte.
    pub fn packed_bytes(self, elements: u64, float_bytes: u64) -> u64 {
        let groups = elements / self.group_size.max(1) as u64;
        let per_group = match self.mode {
            QuantMode::Affine => 2 * float_bytes,
            QuantMode::Mxfp4 => 1,
        };
        elements * self.bits as u64 / 8 + groups * per_group
    }
}

/// Weights stored one way: `elements` values affine-quantized as `quantization`, or float
/// (`None`; on the CPU every float weight is held as float32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightPart {
    pub quantization: Option<Quantization>,
    pub elements: u64,
    /// Bytes of each quantization scale and bias as stored (2: float16 or bfloat16, what
    /// model files hold; 4: float32); the CPU keeps them so.
    pub scale_bytes: u64,
}

impl WeightPart {
    /// Scales and biases of 16 bits, as model files and GGUF's blocks store them.
    pub fn new(quantization: Option<Quantization>, elements: u64) -> WeightPart {
        WeightPart { quantization, elements, scale_bytes: 2 }
    }
}

/// The experts of a mixture-of-experts folder, for the memory estimate of streaming them.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertParts {
    /// Their weights by width, as [`WeightPart`]s.
    pub parts: Vec<WeightPart>,
    /// Experts of all sparse layers together.
    pub count: u64,
    /// Experts one token runs through across all sparse layers (k per sparse layer): the
    /// least an expert cache should hold.
    pub per_token: u64,
}

/// The transformer's dimensions, for the memory estimate.
#[derive(Serialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub layers: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub intermediate_size: usize,
    pub tie_word_embeddings: bool,
}

#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct ModelEntry {
    /// `org/name` for hub models; the file stem (GGUF) or folder name otherwise; unique in
    /// the library (a clash gets `@source`, then a path hash, appended).
    pub id: String,
    /// The folder (hub: the snapshot dir) or the .gguf file.
    pub path: PathBuf,
    pub format: ModelFormat,
    pub source: ModelSource,
    /// The hub snapshot's commit.
    pub revision: Option<String>,
    /// `model_type` (config.json) or `general.architecture` (GGUF).
    pub architecture: Option<String>,
    /// Counted from the shapes.
    pub parameters: Option<u64>,
    pub quantization: Option<Quantization>,
    /// Weights on disk (hub symlinks followed to their blobs).
    pub size_bytes: u64,
    pub context_length: Option<usize>,
    pub chat_template: bool,
    pub shape: Option<Shape>,
    /// The weights by how the loader will get them, one part per width: a GGUF's Q8_0
    /// embedding beside its Q4_1 layers, an MLX folder's per-module overrides, float norms.
    /// The memory estimate counts each at its own width; empty when the files were not read.
    #[serde(skip)]
    pub weight_parts: Vec<WeightPart>,
    /// A mixture-of-experts model's experts (part of `weight_parts`): what streaming them
    /// leaves on disk. None for dense models and for GGUF files holding a type mlxbar's own
    /// GGUF reader does not read (K-quants: those load resident only).
    #[serde(skip)]
    pub experts: Option<ExpertParts>,
    pub runnable: bool,
    /// Why it cannot run, when `runnable` is false.
    pub unsupported_reason: Option<String>,
}

impl ModelEntry {
    /// The quantization, as `WeightFormat::resolve` takes it.
    pub fn quantization_spec(&self) -> Option<QuantSpec> {
        self.quantization.map(Quantization::spec)
    }

    /// Bytes of keys and values one token takes in every layer.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> Option<usize> {
        let s = self.shape?;
        Some(2 * s.layers * s.num_kv_heads * s.head_dim * dtype_bytes)
    }

    /// The weights dequantized to float32 (what the CPU device holds).
    pub fn float32_weight_bytes(&self) -> Option<u64> {
        self.parameters.map(|p| p * 4)
    }

    /// [`ModelEntry::weight_parts`], or when the files were not read, every parameter at the
    /// one reported quantization.
    pub fn parts(&self) -> Vec<WeightPart> {
        match (self.weight_parts.is_empty(), self.parameters) {
            (false, _) => self.weight_parts.clone(),
            (true, Some(elements)) => vec![WeightPart::new(self.quantization, elements)],
            (true, None) => vec![],
        }
    }

    /// Not runnable, with the reason.
    pub(crate) fn refuse(&mut self, reason: impl Into<String>) {
        if self.runnable || self.unsupported_reason.is_none() {
            self.unsupported_reason = Some(reason.into());
        }
        self.runnable = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_with_the_api_spellings() {
        let e = ModelEntry {
            id: "org/m".into(),
            path: "/m".into(),
            format: ModelFormat::Gguf,
            source: ModelSource::LmStudio,
            revision: None,
            architecture: Some("llama".into()),
            parameters: Some(10),
            quantization: Some(Quantization::affine(4, 32)),
            size_bytes: 5,
            context_length: Some(8192),
            chat_template: true,
            shape: Some(Shape {
                layers: 30,
                hidden_size: 576,
                num_heads: 9,
                num_kv_heads: 3,
                head_dim: 64,
                vocab_size: 49152,
                intermediate_size: 1536,
                tie_word_embeddings: true,
            }),
            weight_parts: vec![],
            experts: None,
            runnable: true,
            unsupported_reason: None,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!((v["format"].as_str(), v["source"].as_str()), (Some("gguf"), Some("lm-studio")));
        assert_eq!(v["quantization"], serde_json::json!({"bits": 4, "group_size": 32, "mode": "affine"}));
        assert_eq!(e.kv_bytes_per_token(4), Some(2 * 30 * 3 * 64 * 4));
        assert_eq!(e.float32_weight_bytes(), Some(40));
        for s in [ModelSource::Path, ModelSource::Mlxbar, ModelSource::ModelsDir, ModelSource::HubCache, ModelSource::LmStudio] {
            assert_eq!(serde_json::to_value(s).unwrap().as_str(), Some(s.as_str()));
        }
    }
}
