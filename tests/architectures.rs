//! Every architecture README names runs a correct forward pass: tiny random-weight models
//! of each (tests/data/tiny/, made by scripts/make-tiny-models.sh with mlx-lm's own model
//! classes) load through the normal loader, and their prefill logits, their step-by-step
//! decode logits through [`BatchKv`] (the path the server runs) and their greedy ids match
//! mlx-lm's, one sequence at a time and with all sequences of a model in one batch.
//! Mixture-of-experts models (qwen3_moe, mixtral) are checked the same way in both
//! checkpoint layouts, and 4-bit quantized against mlx-lm's quantized model (phi3 and
//! gemma3 too); phi3
//! (LongRoPE, partial rotation; also as a GGUF) and gemma3 (local attention windows the longer sequences
//! pass) as dense models, gemma3 also from a multimodal checkpoint and a GGUF; gpt_oss (sinks, windows,
//! YaRN, biased experts) float, and with MXFP4 experts as OpenAI, mlx-community and
//! llama.cpp's GGUF converter ship them.
use std::path::{Path, PathBuf};

use mlx_rs::Device;
use mlxbar::engine::batch_kv::BatchKv;
use mlxbar::engine::model::Model;
use mlxbar::engine::{loader, sampling::argmax, WeightFormat};
use serde_json::Value;

/// Both sides run float32 MLX ops on the same weights; only the summation order differs
/// (mlxbar fuses q|k|v and gate|up into one matmul each and multiplies through OpenBLAS).
/// Measured differences are <= 4e-5 on logits of magnitude ~10 (std ~4); 2e-4 leaves a 5x margin
/// and is still far below what any real error moves (a dropped bias or a RoPE position off
/// by one moves them by > 0.1), and below the smallest top-2 gap the generator allows (1e-3).
const TOLERANCE: f32 = 2e-4;

/// One reference sequence: its ids, the logits after prefill and after each decode step
/// (each fed the greedy id before it), and the greedy ids (`greedy[0]` from the prefill).
struct Case {
    ids: Vec<u32>,
    prefill: Vec<f32>,
    decode: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn tiny_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny")
}

/// The model of folder `name` (its model.gguf when it has one) and its reference cases.
fn load(name: &str, format: WeightFormat) -> (Model, Vec<Case>) {
    Device::set_default(&Device::cpu());
    let dir = tiny_dir().join(name);
    let gguf = dir.join("model.gguf");
    let path = if gguf.exists() { gguf } else { dir.clone() };
    let (model, codec, info) = loader::load(&path, format).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(codec.vocab_size(), info.vocab_size as usize, "{name}: tokenizer and model vocab");
    assert_eq!(codec.decode(&codec.encode("Hello, tiny world!").unwrap()).unwrap(), "Hello, tiny world!", "{name}: tokenizer round trip");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let floats = |v: &Value| -> Vec<f32> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect() };
    let cases = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            ids: serde_json::from_value(c["ids"].clone()).unwrap(),
            prefill: floats(&c["prefill_logits"]),
            decode: c["decode_logits"].as_array().unwrap().iter().map(floats).collect(),
            greedy: serde_json::from_value(c["greedy_ids"].clone()).unwrap(),
        })
        .collect();
    (model, cases)
}

/// Max |got - want| over the whole vocabulary, asserted within `tolerance`.
fn compare(what: &str, got: &[f32], want: &[f32], tolerance: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: vocab size");
    let (at, diff) =
        got.iter().zip(want).map(|(g, w)| (g - w).abs()).enumerate().fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
    assert!(diff < tolerance, "{what}: logit of token {at} is {}, mlx-lm says {} (|diff| {diff:.2e})", got[at], want[at]);
    diff
}

/// The greedy id equals mlx-lm's wherever its top two logits are more than twice `tolerance`
/// apart (every step of the float32 fixtures: their generator keeps the gaps above 1e-3);
/// closer than that, logits within the tolerance may rank either way. Each step is still fed
/// mlx-lm's id, so a flip here changes nothing downstream.
fn greedy(what: &str, got: &[f32], want: &[f32], want_id: u32, tolerance: f32) {
    let mut sorted = want.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if sorted[0] - sorted[1] > 2.0 * tolerance {
        assert_eq!(argmax(got), want_id, "{what}");
    }
}

/// Checks one model end to end in float32; prints the largest difference of each path.
fn check(name: &str) {
    check_as(name, WeightFormat::Float32, TOLERANCE);
}

/// Checks one model end to end with its weights held as `format`, logits within `tolerance`.
fn check_as(name: &str, format: WeightFormat, tolerance: f32) -> [f32; 3] {
    check_cases(name, format, tolerance, &|_| true)
}

/// [`check_as`] on the reference's sequences `keep` picks (by index).
fn check_cases(name: &str, format: WeightFormat, tolerance: f32, keep: &dyn Fn(usize) -> bool) -> [f32; 3] {
    let (model, cases) = load(name, format);
    let cases: Vec<Case> = cases.into_iter().enumerate().filter(|(n, _)| keep(*n)).map(|(_, c)| c).collect();
    let compare = |what: &str, got: &[f32], want: &[f32]| compare(what, got, want, tolerance);
    let vocab = model.config.vocab_size as usize;

    // 1. Each sequence alone: prefill, then decode through its own one-row batch.
    let mut worst = [0f32; 3];
    for (n, case) in cases.iter().enumerate() {
        let mut cache = model.new_cache();
        let logits = model.forward(&case.ids, &mut cache).unwrap();
        worst[0] =
            worst[0].max(compare(&format!("{name} seq {n} ({} tokens) prefill", case.ids.len()), logits.as_slice::<f32>(), &case.prefill));
        greedy(&format!("{name} seq {n}: greedy id after prefill"), logits.as_slice::<f32>(), &case.prefill, case.greedy[0], tolerance);
        let mut batch = BatchKv::default();
        batch.join(0, cache).unwrap();
        for (step, want) in case.decode.iter().enumerate() {
            let logits = model.decode(&[case.greedy[step]], &mut batch).unwrap();
            let got = logits.as_slice::<f32>();
            worst[1] = worst[1].max(compare(&format!("{name} seq {n} decode step {step}"), got, want));
            greedy(&format!("{name} seq {n}: greedy id of decode step {step}"), got, want, case.greedy[step + 1], tolerance);
        }
    }

    // 2. All sequences prefilled in one pass, then decoded in one batch that they join one
    //    step apart and leave when done, as the server's engine moves them: rows of
    //    different lengths, so padding, the mask and per-row RoPE positions all matter.
    let mut caches: Vec<_> = cases.iter().map(|_| model.new_cache()).collect();
    let parts: Vec<&[u32]> = cases.iter().map(|c| c.ids.as_slice()).collect();
    let logits = model.prefill(&parts, &mut caches.iter_mut().collect::<Vec<_>>()).unwrap();
    let logits = logits.as_slice::<f32>();
    for (n, case) in cases.iter().enumerate() {
        worst[0] = worst[0].max(compare(&format!("{name} seq {n} batched prefill"), &logits[n * vocab..(n + 1) * vocab], &case.prefill));
    }
    let mut waiting: Vec<_> = caches.into_iter().enumerate().map(|(n, c)| (n as u64, c)).collect();
    waiting.reverse();
    let mut steps_done = vec![0usize; cases.len()];
    let mut batch = BatchKv::default();
    let mut max_rows = 0;
    while !waiting.is_empty() || !batch.ids().is_empty() {
        if let Some((id, cache)) = waiting.pop() {
            batch.join(id, cache).unwrap();
        }
        let rows: Vec<usize> = batch.ids().iter().map(|&id| id as usize).collect();
        max_rows = max_rows.max(rows.len());
        let tokens: Vec<u32> = rows.iter().map(|&n| cases[n].greedy[steps_done[n]]).collect();
        let logits = model.decode(&tokens, &mut batch).unwrap();
        let logits = logits.as_slice::<f32>();
        for (r, &n) in rows.iter().enumerate() {
            let step = steps_done[n];
            let got = &logits[r * vocab..(r + 1) * vocab];
            worst[2] = worst[2].max(compare(
                &format!("{name} seq {n} decode step {step} in a batch of {}", rows.len()),
                got,
                &cases[n].decode[step],
            ));
            let what = format!("{name} seq {n}: greedy id of batched decode step {step}");
            greedy(&what, got, &cases[n].decode[step], cases[n].greedy[step + 1], tolerance);
            steps_done[n] += 1;
            if steps_done[n] == cases[n].decode.len() {
                batch.leave(n as u64).unwrap();
            }
        }
    }
    assert_eq!(max_rows, cases.len(), "every sequence decoded in the batch at once at some step");
    println!("{name} ({format:?}): max |diff| prefill {:.2e}, decode alone {:.2e}, decode batched {:.2e}", worst[0], worst[1], worst[2]);
    worst
}

/// The folders each test below covers; a new folder without a test fails here.
const MODELS: [&str; 28] = [
    "llama3-rope",
    "llama3-rope-gguf",
    "llama-gqa-untied",
    "mistral",
    "qwen2-bias",
    "qwen2-bias-gguf",
    "qwen3-qknorm",
    "qwen3-qknorm-gguf",
    "qwen3-moe",
    "qwen3-moe-hf",
    "qwen3-moe-4bit",
    "qwen3-moe-gguf",
    "qwen3-moe-q8-gguf",
    "mixtral",
    "mixtral-gguf",
    "mixtral-hf",
    "mixtral-4bit",
    "phi3",
    "phi3-gguf",
    "phi3-4bit",
    "gemma3",
    "gemma3-multimodal",
    "gemma3-4bit",
    "gemma3-gguf",
    "gpt-oss",
    "gpt-oss-openai",
    "gpt-oss-gguf",
    "gpt-oss-mxfp4-q8",
];

#[test]
fn every_tiny_model_has_a_test() {
    let mut found: Vec<String> = std::fs::read_dir(tiny_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    // gpt-oss with harmony's tokens and chat template: gpt-oss's weights plus 7 embedding rows,
    // served in tests/families_chat.rs; not an architecture of its own.
    found.retain(|f| f != "gpt-oss-harmony");
    let mut named: Vec<String> = MODELS.iter().map(|s| s.to_string()).collect();
    named.sort();
    assert_eq!(found, named);
}

#[test]
fn llama_with_llama3_rope_scaling() {
    check("llama3-rope");
}

#[test]
fn llama_gguf_with_rope_freqs_and_permuted_qk() {
    check("llama3-rope-gguf");
}

#[test]
fn llama_with_gqa_and_untied_embeddings() {
    check("llama-gqa-untied");
}

#[test]
fn mistral() {
    check("mistral");
}

#[test]
fn qwen2_with_qkv_biases() {
    check("qwen2-bias");
}

#[test]
fn qwen2_gguf_with_qkv_biases() {
    check("qwen2-bias-gguf");
}

#[test]
fn qwen3_with_qk_norms() {
    check("qwen3-qknorm");
}

#[test]
fn qwen3_gguf_with_qk_norms() {
    check("qwen3-qknorm-gguf");
}

#[test]
fn qwen3_moe_with_stacked_experts() {
    check("qwen3-moe");
}

#[test]
fn qwen3_moe_with_hugging_face_per_expert_tensors() {
    check("qwen3-moe-hf");
}

/// llama.cpp's qwen3moe GGUF layout: routers `ffn_gate_inp`, experts stacked
/// `ffn_{gate,up,down}_exps`, layer 1 dense (no router), the top k renormalized.
#[test]
fn qwen3_moe_gguf_with_stacked_experts() {
    check("qwen3-moe-gguf");
}

/// The same GGUF with every matrix but the routers Q8_0, as llama-quantize writes it
/// (MLX's reader: 8-bit affine groups of 32), dequantized, against mlx-lm on the weights the
/// file holds.
#[test]
fn qwen3_moe_gguf_in_q8_0() {
    check("qwen3-moe-q8-gguf");
}

/// The 4-bit model dequantized to float32 computes what mlx-lm's quantized model computes
/// (the same dequantized values, summed in another order).
#[test]
fn qwen3_moe_4bit_dequantized() {
    check("qwen3-moe-4bit");
}

/// The 4-bit model as `native` holds it on the CPU: experts packed through MLX's
/// `gather_qmm`, the router float32, attention and the dense MLP through mlxbar's packed
/// kernel, whose int8 activations move the logits (see [`PACKED_TOLERANCE`]).
#[test]
fn qwen3_moe_4bit_packed() {
    check_as("qwen3-moe-4bit", WeightFormat::Native, PACKED_TOLERANCE);
}

/// mlxbar's CPU kernel rounds activations to int8 per 32 values (README: logits move by up
/// to ~1 on a 30-layer model). Here they move by at most 0.32 (measured; the tiny model's
/// random weights make large activations, logits of std ~4), all of it from that rounding:
/// the packed experts alone equal matmuls on their dequantized weights within 1e-5
/// (`switch::tests`), and the same file dequantized to float32 is within 1.3e-5 of mlx-lm.
/// 0.5 leaves a 1.5x margin.
const PACKED_TOLERANCE: f32 = 0.5;

#[test]
fn mixtral_with_stacked_experts() {
    check("mixtral");
}

/// mixtral as llama.cpp writes it: a llama GGUF with `llama.expert_count`, its q/k rows
/// permuted for GGML's RoPE like any llama's.
#[test]
fn mixtral_gguf_as_llama_with_experts() {
    check("mixtral-gguf");
}

/// Hugging Face's `block_sparse_moe.experts.{e}.w1|w2|w3`, stacked at load.
#[test]
fn mixtral_with_hugging_face_per_expert_tensors() {
    check("mixtral-hf");
}

/// The 4-bit model (router 4-bit too: mlx-lm quantizes mixtral's gate) dequantized to
/// float32 against mlx-lm's quantized model.
#[test]
fn mixtral_4bit_dequantized() {
    check("mixtral-4bit");
}

/// The 4-bit mixtral as `native` holds it on the CPU, within [`PACKED_TOLERANCE`] on the 1-
/// and 13-token sequences. The 50-token one is left out, for a measured reason: at its
/// prefill token 40, layer 0's router puts expert 6 second and expert 5 third, 0.027 apart
/// in router logits (mlx-lm, and mlxbar's float32 and dequantized paths, which match it to
/// 1e-5); the packed kernel's int8 activations move those logits by up to 0.044 (6: 1.141 →
/// 1.098, 5: 1.115 → 1.132), so expert 5 runs instead of 6, and the different expert output
/// reaches every later position through the KV cache (max |diff| 1.72 at its decode step 2).
#[test]
fn mixtral_4bit_packed() {
    check_cases("mixtral-4bit", WeightFormat::Native, PACKED_TOLERANCE, &|n| n < 2);
}

#[test]
fn phi3_with_fused_projections_partial_rotation_and_longrope() {
    check("phi3");
}

/// The same phi3 as llama.cpp's converter writes it: q|k|v in one `attn_qkv`, gate|up in
/// one `ffn_up`, the rotated dims in `phi3.rope.dimension_count`, LongRoPE as the
/// `rope_factors_long` tensor and `rope.scaling.attn_factor`.
#[test]
fn phi3_gguf_with_fused_tensors_and_rope_factors() {
    check("phi3-gguf");
}

/// Layer 0 attends to its last 8 positions: the 13- and 50-token sequences and every decode
/// step after them pass the window, alone and in a batch with rows at other positions.
#[test]
fn gemma3_with_sandwich_norms_and_local_attention() {
    check("gemma3");
}

#[test]
fn gemma3_from_a_multimodal_checkpoint() {
    check("gemma3-multimodal");
}

/// gemma3 as llama.cpp's converter writes it: norms stored as 1 + weight, its tensor names,
/// the windows and RoPE bases from `gemma3.*` keys, a SentencePiece vocabulary (whose
/// tokenizer tests/tokenizer.rs checks); scores scaled by head_dim^-½ as llama.cpp has it.
#[test]
fn gemma3_gguf_in_llama_cpps_layout() {
    check("gemma3-gguf");
}

/// phi3 and gemma3 4-bit as `mlx_lm.convert -q` makes them (every linear layer and the
/// embedding, group 32): dequantized to float32 they compute mlx-lm's quantized model to
/// float rounding (measured 1.5e-5 and 1.9e-6); as the default format holds them on the CPU
/// (packed, mlxbar's kernel with its int8 activations) gemma3 within [`PACKED_TOLERANCE`]
/// (measured 0.064) and phi3 within [`PHI3_PACKED_TOLERANCE`].
#[test]
fn phi3_and_gemma3_4bit_dequantized_and_packed() {
    for (name, packed) in [("phi3-4bit", PHI3_PACKED_TOLERANCE), ("gemma3-4bit", PACKED_TOLERANCE)] {
        check(name);
        check_as(name, WeightFormat::Native, packed);
    }
}

/// The int8 rounding of phi3's activations moves its logits by up to 0.425 (measured on an
/// Intel Xeon, AVX-512 VNNI, at a decode step; std ~4 as every fixture's), more than the
/// other families' 0.32 (why is not measured: LongRoPE's attention factor, which scales
/// the scores by 1.2, is one candidate). 1.5x the measured figure; a wrong scale or packing
/// moves logits by units.
const PHI3_PACKED_TOLERANCE: f32 = 0.65;

/// Sinks in every softmax, layer 0 local (window 8), YaRN, biased router and experts with
/// gpt-oss's clamped SwiGLU.
#[test]
fn gpt_oss_with_sinks_windows_yarn_and_biased_experts() {
    check("gpt-oss");
}

/// gpt-oss's experts in MXFP4 as OpenAI's checkpoint holds them (`gate_up_proj_blocks`,
/// gate and up rows interleaved), everything else float32. `auto` keeps the experts packed
/// on the CPU (MLX's own mxfp4 `gather_qmm`; float32 would be eight times their size) and
/// computes what mlx-lm's model does to float rounding: the same values, summed in another
/// order, so the float tolerance holds.
#[test]
fn gpt_oss_mxfp4_experts_in_openai_layout() {
    let worst = check_as("gpt-oss-openai", WeightFormat::Auto, TOLERANCE);
    assert!(worst.iter().all(|d| *d < TOLERANCE));
}

/// The same gpt-oss as llama.cpp's converter writes OpenAI's checkpoint: the experts as
/// GGML's MXFP4 (type 39, written before every other tensor; MLX's GGUF reader returns no
/// tensor of such a file, so mlxbar reads it itself), gate and up split from the
/// interleaved rows, `attn_sinks`, `post_attention_norm`, YaRN from the `rope.scaling.*`
/// keys. The experts reach MLX's mxfp4 mode bit for bit, so this is the OpenAI folder's
/// computation and its tolerance.
#[test]
fn gpt_oss_gguf_with_mxfp4_experts() {
    let worst = check_as("gpt-oss-gguf", WeightFormat::Auto, TOLERANCE);
    assert!(worst.iter().all(|d| *d < TOLERANCE));
}

/// mlx-community's gpt-oss MXFP4-Q8 layout: experts MXFP4 (config.json's default mode,
/// inferred from their byte scales), every other module 8-bit affine named one by one.
/// Dequantized to float32 it computes mlx-lm's quantized model to float rounding (measured
/// ≤ 1.4e-5). As `auto` holds it on the CPU, the 8-bit modules run mlxbar's packed kernel,
/// whose int8 activations move the logits: measured up to 1.35 (prefill of the 50-token
/// sequence), beyond [`PACKED_TOLERANCE`]. The MXFP4 experts are not the cause (the OpenAI
/// fixture runs them packed within 2e-5), and rounding alone moves qwen3_moe's 4-bit logits
/// by 0.32; this fixture's routers come within 0.0014 of a tie (its reference records the
/// smallest k-th/(k+1)-th probability gap), so a flipped expert is the likely cause
/// (unverified, as for mixtral below). [`FLIP_TOLERANCE`] bounds what such a flip moved
/// here; a wrong mode, scale or layout moves logits of std ~4 by several units.
#[test]
fn gpt_oss_mxfp4_experts_beside_8_bit_affine() {
    check("gpt-oss-mxfp4-q8");
    check_as("gpt-oss-mxfp4-q8", WeightFormat::Auto, FLIP_TOLERANCE);
}

/// See [`gpt_oss_mxfp4_experts_beside_8_bit_affine`]: 1.5x the 1.35 measured.
const FLIP_TOLERANCE: f32 = 2.0;
