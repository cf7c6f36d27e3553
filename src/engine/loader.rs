//! Finds out what `--model PATH` is (a .gguf file or an MLX/HF folder) and loads the
//! model and its text codec.
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use serde::Serialize;

use super::model::config::ModelConfig;
use super::model::{gguf, hf, Model, Slice, TensorMap, WeightFormat};
use super::tokenizer::{self, TextCodec};
use super::tools::ToolFormat;

/// What the API and `/health` say about the loaded model.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ModelInfo {
    /// The id clients send as `model`.
    pub id: String,
    pub path: String,
    pub source: &'static str,
    pub architecture: &'static str,
    pub weight_format: WeightFormat,
    pub dtype: String,
    /// Bytes of weights held resident (a streamed model's experts not included).
    pub weight_bytes: usize,
    /// Set when the model's experts stream from disk through a cache of this many bytes.
    pub expert_cache_bytes: Option<u64>,
    pub context_length: usize,
    pub vocab_size: i32,
    pub layers: usize,
    /// What this process holds: every layer and both ends, or a cluster rank's part.
    pub held: Slice,
    /// The model family's tool-call syntax, from its chat template and vocabulary.
    pub tool_format: ToolFormat,
    pub load_seconds: f64,
}

/// Loads the model at `path`, named after its file or folder.
pub fn load(path: &Path, format: WeightFormat) -> Result<(Model, TextCodec, ModelInfo)> {
    let id = match path.is_dir() {
        true => path.file_name(),
        false => path.file_stem(),
    }
    .map(|s| s.to_string_lossy().into_owned())
    .unwrap_or_else(|| "model".into());
    load_reporting(path, &id, format, None, &|_| {})
}

/// Loads the model at `path` as `id`, telling `progress` how far it has got (0..1): reading
/// the file is the first tenth, materializing the weights layer by layer the rest. With
/// `expert_cache` (bytes), a mixture-of-experts model's experts stream through a cache of
/// that size instead of loading.
pub fn load_reporting(
    path: &Path,
    id: &str,
    format: WeightFormat,
    expert_cache: Option<u64>,
    progress: &dyn Fn(f64),
) -> Result<(Model, TextCodec, ModelInfo)> {
    load_part(path, id, format, expert_cache, progress, &mut |c, _| Ok(Slice::whole(c.num_layers)))
}

/// [`load_reporting`] of the part `choose` picks once the file's config and tensors are
/// known (a rank of a cluster: [`crate::distributed`]).
pub fn load_part(
    path: &Path,
    id: &str,
    format: WeightFormat,
    expert_cache: Option<u64>,
    progress: &dyn Fn(f64),
    choose: &mut dyn FnMut(&ModelConfig, &TensorMap) -> Result<Slice>,
) -> Result<(Model, TextCodec, ModelInfo)> {
    let started = Instant::now();
    let (model, codec, source) = if path.is_dir() {
        let (config, tensors) = hf::load(path, expert_cache)?;
        let codec = tokenizer::from_hf_dir(path)?;
        progress(0.1);
        let slice = choose(&config, &tensors)?;
        (Model::assemble_slice(config, tensors, format, slice, progress)?, codec, "mlx-folder")
    } else if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        let loaded = gguf::load(path, expert_cache)?;
        let codec = tokenizer::from_gguf(&loaded.header)?;
        progress(0.1);
        let slice = choose(&loaded.config, &loaded.tensors)?;
        (Model::assemble_slice(loaded.config, loaded.tensors, format, slice, progress)?, codec, "gguf")
    } else if path.exists() {
        bail!("{} is neither a .gguf file nor a model folder (config.json + *.safetensors)", path.display());
    } else {
        bail!("model path {} does not exist", path.display());
    };
    let info = ModelInfo {
        id: id.to_string(),
        path: path.display().to_string(),
        source,
        architecture: model.config.arch.name(),
        weight_format: model.format,
        dtype: format!("{:?}", model.dtype).to_lowercase(),
        weight_bytes: model.nbytes(),
        expert_cache_bytes: model.expert_stats().map(|s| s.view().budget_bytes),
        context_length: model.config.max_position_embeddings,
        vocab_size: model.config.vocab_size,
        layers: model.config.num_layers,
        held: model.slice.clone(),
        tool_format: ToolFormat::detect(codec.template.as_ref().map(|t| t.source()), &codec.tokenizer),
        load_seconds: started.elapsed().as_secs_f64(),
    };
    Ok((model, codec, info))
}
