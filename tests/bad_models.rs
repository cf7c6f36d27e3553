//! Broken models through a real server: a GGUF cut in half, safetensors headers that lie,
//! a config.json of an unknown architecture, a missing tokenizer, a missing path. Each
//! time the server starts, `/health` says 503 "failed" with a detail naming the problem,
//! `/metrics` still answers, generation gets a JSON 503, and this process does not crash
//! (MLX's readers never see a file that would make them abort).
mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use mlxbar::{Config, Server};
use serde_json::{json, Value};

/// One runtime for every case (they run in parallel on it).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Runtime::new().unwrap())
}

/// Serves `model`, waits for the load to fail, checks the endpoints, and returns the
/// failure detail `/health` reports.
fn failed_load(model: PathBuf) -> String {
    rt().block_on(async move {
        let data = tempfile::tempdir().unwrap();
        let config = Config { model: Some(model.clone()), port: 0, data_dir: Some(data.path().into()), ..Config::default() };
        let server = Server::start(config).await.expect("the server starts whatever the model");
        let load = tokio::time::timeout(Duration::from_secs(60), server.wait_ready()).await.expect("the load ends");
        assert!(load.is_err(), "{} loaded", model.display());
        let base = server.url();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();

        let health = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 503);
        let health: Value = health.json().await.unwrap();
        assert_eq!(health["state"], "failed", "{health}");
        let detail = health["detail"].as_str().unwrap_or_else(|| panic!("no detail: {health}")).to_string();

        let metrics = client.get(format!("{base}/metrics")).send().await.unwrap();
        assert_eq!(metrics.status(), 200);
        assert!(metrics.text().await.unwrap().contains("mlxbar_engine_failed 1"));

        let chat = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(chat.status(), 503);
        let body: Value = chat.json().await.unwrap();
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");

        server.shutdown().await;
        detail
    })
}

fn assert_names(detail: &str, parts: &[&str]) {
    for p in parts {
        assert!(detail.contains(p), "{p:?} not in the detail: {detail}");
    }
}

/// A tiny llama config.json (any model_type).
fn config_json(model_type: &str) -> Value {
    json!({"model_type": model_type, "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 16,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16})
}

/// A safetensors file from its header entries and data size, written by hand.
fn write_safetensors(path: &Path, header: Value, data_bytes: usize) {
    let header = header.to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.resize(out.len() + data_bytes, 0);
    std::fs::write(path, out).unwrap();
}

/// A valid one-tensor safetensors file.
fn write_valid_safetensors(path: &Path) {
    write_safetensors(path, json!({"model.embed_tokens.weight": {"dtype": "F32", "shape": [16, 8], "data_offsets": [0, 512]}}), 512);
}

fn folder(config: Value) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("config.json"), config.to_string()).unwrap();
    (dir, path)
}

#[test]
fn a_gguf_cut_in_half() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("half.gguf");
    let whole = std::fs::read(common::model_path()).unwrap();
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    let detail = failed_load(path);
    assert_names(&detail, &["half.gguf", "GGUF truncated: tensor ", &format!("but the file has {}", whole.len() / 2)]);
}

#[test]
fn a_gguf_whose_header_is_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.gguf");
    // The real magic and version, then a string length of 2^60.
    let mut bytes = b"GGUF\x03\0\0\0\x01\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0".to_vec();
    bytes.extend((1u64 << 60).to_le_bytes());
    bytes.resize(4096, 0x41);
    std::fs::write(&path, bytes).unwrap();
    assert_names(&failed_load(path), &["junk.gguf", "GGUF truncated: metadata key #0"]);
}

#[test]
fn a_safetensors_header_lying_about_sizes() {
    let (_dir, path) = folder(config_json("llama"));
    // [16, 8] F32 is 512 bytes; the header says 64 and the file holds 64.
    write_safetensors(
        &path.join("model.safetensors"),
        json!({"model.embed_tokens.weight": {"dtype": "F32", "shape": [16, 8], "data_offsets": [0, 64]}}),
        64,
    );
    assert_names(
        &failed_load(path),
        &["model.safetensors", "model.embed_tokens.weight", "(512 bytes) but its data_offsets 0..64 span 64 bytes"],
    );
}

#[test]
fn a_safetensors_file_cut_short() {
    let (_dir, path) = folder(config_json("llama"));
    write_safetensors(
        &path.join("model.safetensors"),
        json!({"model.embed_tokens.weight": {"dtype": "F32", "shape": [16, 8], "data_offsets": [0, 512]}}),
        100,
    );
    assert_names(&failed_load(path), &["model.safetensors", "safetensors truncated: tensor model.embed_tokens.weight needs bytes"]);
}

#[test]
fn a_config_json_of_an_unknown_architecture() {
    // GPT-2's own fields, none of llama's: the architecture is what gets named.
    let (_dir, path) = folder(json!({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}));
    write_valid_safetensors(&path.join("model.safetensors"));
    assert_names(&failed_load(path), &["unsupported architecture 'gpt2'"]);
}

#[test]
fn a_folder_without_a_tokenizer() {
    let (_dir, path) = folder(config_json("llama"));
    write_valid_safetensors(&path.join("model.safetensors"));
    assert_names(&failed_load(path), &["tokenizer.json"]);
}

#[test]
fn a_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    assert_names(&failed_load(dir.path().join("nope.gguf")), &["nope.gguf", "No such file"]);
    assert_names(&failed_load(dir.path().join("no-such-folder")), &["no-such-folder", "does not exist"]);
}
