//! The other ways a model arrives: an mlx-community style quantized folder (config.json +
//! safetensors + tokenizer.json), and GGUF weights kept quantized; and the registry's memory
//! estimate of each against what the loader holds.
mod common;

use mlx_rs::Device;
use mlxbar::engine::{loader, sampling::argmax, WeightFormat};

fn first_logits(path: &std::path::Path, format: WeightFormat, prompt: &[u32]) -> Vec<f32> {
    let (model, _, _) = loader::load(path, format).unwrap();
    let mut cache = model.new_cache();
    model.forward(prompt, &mut cache).unwrap().as_slice::<f32>().to_vec()
}

#[test]
fn an_mlx_quantized_folder_computes_what_the_gguf_does() {
    Device::set_default(&Device::cpu());
    let gguf = common::model_path();
    let dir = tempfile::tempdir().unwrap();
    // The GGUF's own Q4_1 as an mlx-community folder (tests/common/fixtures.rs).
    common::fixtures::mlx_folder(dir.path(), None);
    let case = &common::reference()["prompts"][1];
    let prompt: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();

    let (_, codec, info) = loader::load(dir.path(), WeightFormat::Float32).unwrap();
    assert_eq!(info.source, "mlx-folder");
    let rendered =
        codec.template.as_ref().unwrap().render(&serde_json::from_value::<Vec<_>>(case["messages"].clone()).unwrap(), &[], true).unwrap();
    assert_eq!(codec.encode(&rendered).unwrap(), prompt, "tokenizer.json + tokenizer_config.json give the same prompt");
    assert!(codec.stop_ids.contains(&2));

    // Two loaders, one model: the same numbers.
    let from_gguf = first_logits(&gguf, WeightFormat::Float32, &prompt);
    let from_folder = first_logits(dir.path(), WeightFormat::Float32, &prompt);
    let max_diff = from_gguf.iter().zip(&from_folder).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "max |diff| {max_diff}");
}

#[test]
fn quantized_weights_agree_with_float32_on_the_top_tokens() {
    Device::set_default(&Device::cpu());
    let gguf = common::model_path();
    let case = &common::reference()["prompts"][1];
    let prompt: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
    let (model, _, info) = loader::load(&gguf, WeightFormat::Native).unwrap();
    // Q4_1 stays packed, its float16 scales and biases too: ~98 MB instead of ~538 MB (and
    // ~115 MB were they widened to float32).
    assert!(info.weight_bytes < 105_000_000, "{}", info.weight_bytes);
    let mut cache = model.new_cache();
    let native = model.forward(&prompt, &mut cache).unwrap().as_slice::<f32>().to_vec();
    let float32 = first_logits(&gguf, WeightFormat::Float32, &prompt);
    // mlxbar's quantized kernel (int8 activations, as llama.cpp's) against dequantized
    // float32 matmuls: the same weights, another kernel. This prompt's top two are 0.98
    // apart, beyond any rounding; tests/reference.rs bounds the logits over many steps.
    assert_eq!(argmax(&native), argmax(&float32));
    let max_diff = native.iter().zip(&float32).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max_diff < 2.0, "max |diff| {max_diff}");
}

/// The budget's estimate of a model's weights (`registry::budget::weights_as_held`, from the
/// library's inspection: per-tensor widths read from the GGUF's tensor types or the folder's
/// safetensors shapes and per-module quantization) is within this of what the engine holds.
pub const ESTIMATE_TOLERANCE: f64 = 0.03;

/// Loads `path` in `format` and checks the estimate against `weight_bytes`; returns both.
fn estimate_and_held(path: &std::path::Path, format: WeightFormat) -> (u64, u64) {
    let entry = mlxbar::library::inspect::inspect(path).unwrap();
    let resolved = format.resolve(false, entry.quantization_spec());
    let estimate = mlxbar::registry::budget::weights_as_held(&entry, resolved, false);
    let (_, _, info) = loader::load(path, format).unwrap();
    assert_eq!(info.weight_format, resolved, "{}: the registry and the loader resolve {format:?} alike", path.display());
    let held = info.weight_bytes as u64;
    let off = (estimate as f64 - held as f64).abs() / held as f64;
    println!(
        "{} as {resolved:?}: estimate {estimate} B, held {held} B ({:+.2}%)",
        path.display(),
        100.0 * (estimate as f64 / held as f64 - 1.0)
    );
    assert!(off <= ESTIMATE_TOLERANCE, "{} as {resolved:?}: estimated {estimate} B, the engine holds {held} B", path.display());
    (estimate, held)
}

/// The default GGUF (Q4_1 layers, a Q8_0 embedding that is also the head), the same as an
/// MLX folder (a per-module override for the embedding) and an 8-bit MLX folder, each as
/// float32 and packed. Counting every tensor at the one reported width (4 bits) estimated
/// ~101 MB against ~115 MB held.
#[test]
fn the_memory_estimate_is_what_the_engine_holds() {
    Device::set_default(&Device::cpu());
    let gguf = common::model_path();
    let (four, eight) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    common::fixtures::mlx_folder(four.path(), None);
    common::fixtures::mlx_folder(eight.path(), Some(8));
    for path in [gguf.as_path(), four.path(), eight.path()] {
        estimate_and_held(path, WeightFormat::Float32);
        let (_, held) = estimate_and_held(path, WeightFormat::Native);
        assert!(held < 200_000_000, "{}: packed, not float32: {held} B", path.display());
    }
}

/// A mixture-of-experts model's estimate counts every expert (the tiny qwen3_moe and mixtral
/// fixtures: experts stacked, one tensor per expert, and 4-bit with an 8-bit or 4-bit router
/// the CPU holds as float32), as float32 and packed; gpt-oss's MXFP4 experts packed; and the
/// experts a GGUF would stream counted as its folder's.
#[test]
fn the_memory_estimate_counts_every_expert() {
    Device::set_default(&Device::cpu());
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    for name in ["qwen3-moe", "qwen3-moe-hf", "qwen3-moe-4bit", "mixtral", "mixtral-hf", "mixtral-4bit"] {
        let (estimate, held) = estimate_and_held(&tiny.join(name), WeightFormat::Float32);
        assert_eq!(estimate, held, "{name}: float32 is exact");
        estimate_and_held(&tiny.join(name), WeightFormat::Native);
    }
    // gpt-oss's MXFP4 experts, from OpenAI's folder and from llama.cpp's GGUF: the same
    // weights, so the same estimate and the same bytes held, within the tolerance.
    let both = ["gpt-oss-openai", "gpt-oss-gguf/model.gguf"].map(|name| estimate_and_held(&tiny.join(name), WeightFormat::Auto));
    assert_eq!(both[0], both[1], "folder and GGUF");
    // What streaming leaves on disk (the registry's fit check): every expert of the GGUF as
    // of the same shapes in mlx-lm's layout (OpenAI's interleaved layout does not stream).
    let experts = |name: &str| {
        let entry = mlxbar::library::inspect::inspect(&tiny.join(name)).unwrap();
        assert!(entry.runnable, "{name}: {:?}", entry.unsupported_reason);
        let e = entry.experts.unwrap_or_else(|| panic!("{name}: experts"));
        (e.count, e.per_token, e.parts.iter().map(|p| p.elements).sum::<u64>())
    };
    for (folder, gguf) in [("qwen3-moe", "qwen3-moe-gguf/model.gguf"), ("gpt-oss", "gpt-oss-gguf/model.gguf")] {
        assert_eq!(experts(folder), experts(gguf), "{folder} and {gguf}");
    }
}
