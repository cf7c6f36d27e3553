//! The official ollama Python library (pinned in scripts/sdk-venv.sh) against the real
//! server and default model, through `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/pull` and the Ollama port (tests/sdk/ollama_api.py): plain and streamed
//! answers equal to the OpenAI route's, structured output, a tool call the model makes and a
//! tool round trip, num_ctx as the window, keep_alive,
//! load and unload, errors with their statuses. The pull fetches from the fake hub
//! (tests/pull/hub.rs) that HF_ENDPOINT points at, set before the server reads it. The API
//! key goes as the library sends it (`Authorization: Bearer`, from OLLAMA_API_KEY).
mod common;
#[path = "pull/hub.rs"]
mod hub;

use std::process::Command;

use hub::{pattern, FakeHub};

const PULLED: &str = "mlx-test/ollama-pull";

#[test]
fn the_ollama_library_chats_generates_lists_and_pulls() {
    let hub = FakeHub::start();
    hub.add(PULLED, "config.json", b"{}");
    hub.add(PULLED, "model.safetensors", &pattern(64 * 1024, 5));
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("HF_ENDPOINT", &hub.base);
    std::env::set_var("HF_HUB_CACHE", cache.path());
    std::env::remove_var("HF_TOKEN");
    let key = "ollama-sdk-test-key";
    // ollama_port 0: a free port, which /health names (the script reads it there).
    let base = common::start_server(mlxbar::Config {
        default_temperature: 0.0,
        api_key: Some(key.into()),
        ollama_port: Some(0),
        ..common::test_config()
    });
    let root = env!("CARGO_MANIFEST_DIR");
    let python = common::sdk_python();
    let run = Command::new(&python)
        .arg(format!("{root}/tests/sdk/ollama_api.py"))
        .args([&base, PULLED])
        .env("OLLAMA_API_KEY", key)
        .env("QUESTION", common::QUESTION)
        .env("ANSWER", common::ANSWER)
        .output()
        .expect("running the SDK checks");
    common::assert_sdk_checks_passed(&run);
}
