//! Shared by the integration tests: the real default model, and real servers on loopback.
#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::OnceLock;

use mlxbar::{Config, Server};

pub fn model_path() -> PathBuf {
    mlxbar::model_store::ensure_default_model().expect("default model (run `mlxbar fetch-model`)")
}

pub fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The marker that makes the test servers' engine panic on a request (test-hooks feature).
pub const FAIL_MARKER: &str = mlxbar::engine::faults::PANIC_IN_REQUEST;

/// A server on 127.0.0.1:<free port> with the default model, alive for the whole test
/// binary (its own runtime on its own thread, so any test runtime can talk to it).
pub fn start_server(config: Config) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let server = Server::start(config).await.expect("server start");
            server.wait_ready().await.expect("model load");
            tx.send(format!("http://{}", server.local_addr())).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().expect("server thread")
}

pub fn test_config() -> Config {
    Config { port: 0, model: Some(model_path()), ..Config::default() }
}

/// The shared server (queue of 64).
pub fn server() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| start_server(test_config()))
}
