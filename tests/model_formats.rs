//! The other ways a model arrives: an mlx-community style quantized folder (config.json +
//! safetensors + tokenizer.json), and GGUF weights kept quantized (the Metal path).
mod common;

use std::collections::HashMap;

use mlx_rs::{io::GgufFile, Array, Device};
use mlxbar::engine::{loader, sampling::argmax, WeightFormat};
use serde_json::json;

fn first_logits(path: &std::path::Path, format: WeightFormat, prompt: &[u32]) -> Vec<f32> {
    let (model, _, _) = loader::load(path, format).unwrap();
    let mut cache = model.new_cache();
    model.forward(prompt, &mut cache).unwrap().as_slice::<f32>().to_vec()
}

fn unpermute_rows(a: &Array, heads: i32) -> Array {
    let perm = mlxbar::engine::model::gguf::hf_row_order(a.shape()[0], heads);
    a.take_axis(Array::from_slice(&perm, &[perm.len() as i32]), 0).unwrap()
}

/// Writes the default GGUF as an MLX folder (what mlx-community's converters produce):
/// HF tensor names, q/k rows in HF order (so NeoX RoPE), quantization in config.json.
fn gguf_to_mlx_folder(gguf: &std::path::Path, dir: &std::path::Path) {
    let g = GgufFile::load(gguf).unwrap();
    let (_, codec, _) = loader::load(gguf, WeightFormat::Float32).unwrap();
    let mut out: HashMap<String, Array> = HashMap::new();
    for key in g.array_keys().unwrap() {
        let a = g.get_array(&key).unwrap().unwrap();
        let (base, suffix) = key.rsplit_once('.').unwrap();
        let name = match base {
            "token_embd" => "model.embed_tokens".to_string(),
            "output_norm" => "model.norm".to_string(),
            _ => {
                let (layer, part) = base.strip_prefix("blk.").unwrap().split_once('.').unwrap();
                let hf = match part {
                    "attn_norm" => "input_layernorm",
                    "ffn_norm" => "post_attention_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_output" => "self_attn.o_proj",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    other => panic!("unexpected {other}"),
                };
                format!("model.layers.{layer}.{hf}")
            }
        };
        let a = match base.rsplit('.').next().unwrap() {
            "attn_q" => unpermute_rows(&a, 9),
            "attn_k" => unpermute_rows(&a, 3),
            _ => a,
        };
        out.insert(format!("{name}.{suffix}"), a);
    }
    Array::save_safetensors(out.iter().map(|(k, v)| (k.as_str(), v)), None, dir.join("model.safetensors")).unwrap();
    let config = json!({
        "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "tie_word_embeddings": true, "max_position_embeddings": 8192,
        "eos_token_id": 2, "bos_token_id": 1,
        "quantization": {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    codec.tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    let template = g.get_metadata_string("tokenizer.chat_template").unwrap().unwrap();
    let tc = json!({"chat_template": template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": false});
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
}

#[test]
fn an_mlx_quantized_folder_computes_what_the_gguf_does() {
    Device::set_default(&Device::cpu());
    let gguf = common::model_path();
    let dir = tempfile::tempdir().unwrap();
    gguf_to_mlx_folder(&gguf, dir.path());
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
    let case = &common::reference()["prompts"][0];
    let prompt: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
    let (model, _, info) = loader::load(&gguf, WeightFormat::Native).unwrap();
    // Q4_1 stays packed: ~98 MB instead of ~538 MB.
    assert!(info.weight_bytes < 120_000_000, "{}", info.weight_bytes);
    let mut cache = model.new_cache();
    let native = model.forward(&prompt, &mut cache).unwrap().as_slice::<f32>().to_vec();
    let float32 = first_logits(&gguf, WeightFormat::Float32, &prompt);
    // Quantized matmuls (float32 scales and activations on the CPU device) against
    // dequantized float32 ones: the same weights, another kernel.
    assert_eq!(argmax(&native), argmax(&float32));
    let max_diff = native.iter().zip(&float32).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max_diff < 1e-2, "max |diff| {max_diff}");
}
