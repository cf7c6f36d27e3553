//! Shared by the integration tests: the real default model, and real servers on loopback.
#![allow(dead_code)]
pub mod agreement;
pub mod fixtures;

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

/// A question whose greedy answer is the same in every weight format, so tests can assert
/// it whole: its top two tokens are at least 0.43 apart at every step with the packed
/// default, 0.73 with float32 (measured). "What is the capital of France?" has a near-tie
/// at its first token: packed weights answer "L'Étoile, la Marseillaise, …" as llama.cpp
/// does on this file, float32 "The capital of France is Paris.".
pub const QUESTION: &str = "What is 2+2?";
/// [`QUESTION`]'s greedy answer: 11 tokens, then the end of turn.
pub const ANSWER: &str = "The answer to this classic math problem is 4.";

/// The marker that makes the test servers' engine panic on a request (test-hooks feature).
pub const FAIL_MARKER: &str = mlxbar::engine::faults::PANIC_IN_REQUEST;

/// A server on 127.0.0.1:<free port> with the default model, alive for the whole test
/// binary (its own runtime on its own thread, so any test runtime can talk to it).
pub fn start_server(config: Config) -> String {
    mlxbar::engine::faults::arm();
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

/// The server tests run what users run: the default weight format (`WeightFormat::Auto`:
/// on this CPU the GGUF's 4-bit weights stay packed and activations are rounded to int8,
/// as llama.cpp's kernels do). Its numerics against llama.cpp and float32 are in
/// reference.rs and quantized_kernel.rs, its memory in scale.rs. Where a test needs exact
/// float arithmetic (logprob values against Python MLX's logits) it says so and uses
/// `float32_config`.
/// Each gets a data dir of its own: the state a server saves (pins, snoozes) never reaches
/// another test's server or the user's own.
pub fn test_config() -> Config {
    Config { port: 0, model: Some(model_path()), data_dir: Some(tempfile::tempdir().expect("a temp data dir").keep()), ..Config::default() }
}

/// `test_config` with float32 weights: the arithmetic Python MLX's reference runs (only the
/// summation order differs), for tests that compare values to it.
pub fn float32_config() -> Config {
    Config { weight_format: mlxbar::engine::WeightFormat::Float32, ..test_config() }
}

/// The shared server (queue of 64).
pub fn server() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| start_server(test_config()))
}

/// A response body read as Server-Sent Events by eventsource-stream, the parser the bench
/// client uses too, so every test reads streams the way a spec-following client does
/// (CRLF or LF line ends, multi-line `data:`, comments skipped).
pub type Sse = std::pin::Pin<Box<dyn futures::Stream<Item = eventsource_stream::Event> + Send>>;

pub fn sse(resp: reqwest::Response) -> Sse {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    Box::pin(resp.bytes_stream().eventsource().map(|e| e.expect("a well-formed SSE stream")))
}

/// Every event's `data` to the end of the body.
pub async fn sse_data(resp: reqwest::Response) -> Vec<String> {
    use futures::StreamExt;
    sse(resp).map(|e| e.data).collect().await
}

/// The JSON chunks of a completion stream, checking it ends with `[DONE]`.
pub async fn sse_chunks(resp: reqwest::Response) -> Vec<serde_json::Value> {
    let mut data = sse_data(resp).await;
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "the stream ends with [DONE]");
    data.iter().map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk {d}: {e}"))).collect()
}

/// The text a completion chunk carries (chat delta or text completion), "" for none.
pub fn chunk_text(chunk: &serde_json::Value) -> &str {
    let choice = &chunk["choices"][0];
    choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or("")
}

/// Reads a completion stream until `n` chunks carried text (so the engine is generating
/// for it) and returns the chunks read; the stream stays open.
pub async fn read_tokens(stream: &mut Sse, n: usize) -> Vec<serde_json::Value> {
    use futures::StreamExt;
    let mut chunks = Vec::new();
    while chunks.iter().filter(|c| !chunk_text(c).is_empty()).count() < n {
        let event = stream.next().await.expect("the stream ended before its tokens");
        chunks.push(serde_json::from_str(&event.data).unwrap_or_else(|e| panic!("chunk {}: {e}", event.data)));
    }
    chunks
}

/// The sum of a metric's samples in the server's Prometheus text that carry all `labels`
/// (e.g. `r#"result="cancelled""#`; none: every sample of the metric). 0 when none match.
pub async fn metric_sum(base: &str, metric: &str, labels: &[&str]) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| series.split('{').next() == Some(metric) && labels.iter().all(|l| series.contains(l)))
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// Polls `check` every 50 ms until it gives Some, failing after `secs`: waiting for a state
/// without sleeping a guessed time.
pub async fn until<T>(what: &str, secs: u64, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The python of the official client SDKs' venv (scripts/sdk-venv.sh makes it, idempotently).
pub fn sdk_python() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let venv = std::process::Command::new("bash").arg(format!("{root}/scripts/sdk-venv.sh")).output().expect("running scripts/sdk-venv.sh");
    assert!(venv.status.success(), "creating the SDK venv failed:\n{}", String::from_utf8_lossy(&venv.stderr));
    String::from_utf8(venv.stdout).unwrap().trim().to_string()
}

/// An SDK check script's run: its output printed, its exit status 0 and its "all passed".
pub fn assert_sdk_checks_passed(run: &std::process::Output) {
    let out = String::from_utf8_lossy(&run.stdout);
    println!("{out}{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "SDK checks failed:\n{out}");
    assert!(out.contains("all passed"), "{out}");
}

/// The greedy chat answer of the model at `dir` held as `format` to one user message, as
/// `Model::forward` then `Model::decode` compute it (the path the server runs): the prompt's
/// token count and the text of at most `max_tokens` ids, ending before a stop id.
pub fn engine_greedy(dir: &std::path::Path, format: mlxbar::engine::WeightFormat, content: &str, max_tokens: usize) -> (usize, String) {
    use mlxbar::engine::{batch_kv::BatchKv, chat_template::ChatMessage, loader, sampling::argmax};
    mlx_rs::Device::set_default(&mlx_rs::Device::cpu());
    let (model, codec, _) = loader::load(dir, format).unwrap();
    let prompt = codec.template.as_ref().unwrap().render(&[ChatMessage::new("user", content)], &[], true).unwrap();
    let ids = codec.encode(&prompt).unwrap();
    let mut cache = model.new_cache();
    let mut next = argmax(model.forward(&ids, &mut cache).unwrap().as_slice::<f32>());
    let mut batch = BatchKv::default();
    batch.join(0, cache).unwrap();
    let mut out = vec![];
    while out.len() < max_tokens && !codec.stop_ids.contains(&next) {
        out.push(next);
        next = argmax(model.decode(&[next], &mut batch).unwrap().as_slice::<f32>());
    }
    // A byte-level answer cut by max_tokens may end inside a character: the server's text
    // stream holds those bytes back (they never complete), a whole decode shows U+FFFD.
    (ids.len(), codec.decode(&out).unwrap().trim_end_matches('\u{FFFD}').to_string())
}
