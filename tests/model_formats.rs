//! The other ways a model arrives: an mlx-community style quantized folder (config.json +
//! safetensors + tokenizer.json), and GGUF weights kept quantized (the Metal path).
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
    // Q4_1 stays packed: ~115 MB (float32 scales and biases) instead of ~538 MB.
    assert!(info.weight_bytes < 130_000_000, "{}", info.weight_bytes);
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
