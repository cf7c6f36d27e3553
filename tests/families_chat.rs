//! The families beyond llama's, served: one server lists the tiny fixtures
//! (tests/data/tiny, whose logits tests/architectures.rs checks against mlx-lm's classes) as
//! runnable with their architecture, loads each on request, and a greedy chat through
//! `/v1/chat/completions` (its chat template, the engine's batched decode) answers what the
//! model computes step by step on the rendered prompt: a mixture of experts (qwen3_moe),
//! phi3, gemma3 from a multimodal checkpoint and gpt_oss (local attention: the prompt passes
//! their windows).
use std::path::Path;

mod common;

use mlxbar::engine::WeightFormat;
use mlxbar::{Config, Server};
use serde_json::{json, Value};

const MAX_TOKENS: usize = 12;

/// Folder (and model id) -> the architecture the library must report.
const FAMILIES: [(&str, &str); 4] = [("qwen3-moe", "qwen3_moe"), ("phi3", "phi3"), ("gemma3-multimodal", "gemma3"), ("gpt-oss", "gpt_oss")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_family_chats_through_the_server() {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    let content = "Tell me about the lighthouse keeper.";
    let config = Config {
        port: 0,
        model: Some(tiny.join("qwen3-moe")),
        models_dirs: vec![tiny.clone()],
        weight_format: WeightFormat::Float32,
        data_dir: Some(tempfile::tempdir().unwrap().keep()),
        ..Config::default()
    };
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let models: Value = reqwest::get(format!("{base}/api/models")).await.unwrap().json().await.unwrap();
    for (id, arch) in FAMILIES {
        let entry = models["models"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap_or_else(|| panic!("{id} listed")).clone();
        assert_eq!((entry["architecture"].as_str(), entry["runnable"].as_bool()), (Some(arch), Some(true)), "{entry}");

        let (prompt_tokens, want) = tokio::task::spawn_blocking({
            let dir = tiny.join(id);
            move || common::engine_greedy(&dir, WeightFormat::Float32, content, MAX_TOKENS)
        })
        .await
        .unwrap();
        assert!(!want.is_empty());
        let body = json!({"model": id, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS, "temperature": 0});
        let r = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{id}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens as u64), "{id}: {v}");
        assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want.as_str()), "{id}: {v}");
    }
    server.shutdown().await;
}
