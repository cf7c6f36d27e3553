//! What constrained decoding costs: `cargo bench --bench constrained_decoding`.
//!
//! The default model decodes the same prompt greedily, free and under a JSON Schema (and
//! free with tools offered, whose grammar also runs on every step); the bench prints the
//! time per decode step of each, the grammar mask's mean time from
//! `mlxbar_constrained_decoding_mask_seconds`, and the mask as a share of a free step
//! (goal: under 10%). With `MLXBAR_PEER=URL` (e.g. llama.cpp's server started by
//! ../shared/peers/serve.sh) the schema run is repeated against the peer for a ratio.
use std::time::{Duration, Instant};

use futures::StreamExt;
use mlxbar::{Config, Server};
use serde_json::{json, Value};

const TOKENS: usize = 96;

/// Milliseconds per decode step (first token to last, over the tokens after the first) and
/// the tokens generated.
async fn step_ms(client: &reqwest::Client, base: &str, extra: &Value) -> (f64, usize) {
    let mut body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "List ten famous lighthouses with their country, height in metres and the year each was built."}],
        "max_tokens": TOKENS, "temperature": 0.0, "stream": true,
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let resp = client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
    let mut stream = resp.bytes_stream();
    let (mut first, mut last, mut chunks) = (None, Instant::now(), 0usize);
    while let Some(bytes) = stream.next().await {
        let bytes = bytes.unwrap();
        let n = bytes.windows(5).filter(|w| w == b"data:").count();
        if n > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            chunks += n;
        }
    }
    let first = first.expect("some chunks");
    // Roughly one chunk per token (opening, finish and [DONE] chunks aside).
    let tokens = chunks.saturating_sub(3).max(2);
    ((last - first).as_secs_f64() * 1e3 / (tokens - 1) as f64, tokens)
}

async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().filter_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build().unwrap();
    let server = Server::start(Config { port: 0, ..Config::default() }).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let schema = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "lighthouses", "schema": {
        "type": "object",
        "properties": {"lighthouses": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "country": {"type": "string"},
                "height_m": {"type": "number", "minimum": 0}, "built": {"type": "integer"},
            },
            "required": ["name", "country", "height_m", "built"], "additionalProperties": false,
        }}},
        "required": ["lighthouses"], "additionalProperties": false,
    }}}});
    let tools = json!({"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]});
    step_ms(&client, &base, &json!({})).await; // warm-up
    let runs = 3;
    let (mut free, mut constrained, mut with_tools) = (vec![], vec![], vec![]);
    let (count0, sum0) = (
        metric(&client, &base, "mlxbar_constrained_decoding_mask_seconds_count").await,
        metric(&client, &base, "mlxbar_constrained_decoding_mask_seconds_sum").await,
    );
    for _ in 0..runs {
        free.push(step_ms(&client, &base, &json!({})).await.0);
        constrained.push(step_ms(&client, &base, &schema).await.0);
    }
    let (count1, sum1) = (
        metric(&client, &base, "mlxbar_constrained_decoding_mask_seconds_count").await,
        metric(&client, &base, "mlxbar_constrained_decoding_mask_seconds_sum").await,
    );
    for _ in 0..runs {
        with_tools.push(step_ms(&client, &base, &tools).await.0);
    }
    let (count2, sum2) = (
        metric(&client, &base, "mlxbar_constrained_decoding_mask_seconds_count").await,
        metric(&client, &base, "mlxbar_constrained_decoding_mask_seconds_sum").await,
    );
    let (free, constrained, with_tools) = (median(free), median(constrained), median(with_tools));
    let schema_mask_ms = (sum1 - sum0) / (count1 - count0).max(1.0) * 1e3;
    let tools_mask_ms = (sum2 - sum1) / (count2 - count1).max(1.0) * 1e3;
    let cpu = mlxbar::bench::machine::Machine::this().chip;
    println!("machine: {cpu}; default model, greedy, {TOKENS} tokens, median of {runs}");
    println!(
        "decode step: free {free:.2} ms, JSON Schema {constrained:.2} ms ({:+.1}%), tools offered {with_tools:.2} ms ({:+.1}%)",
        (constrained / free - 1.0) * 100.0,
        (with_tools / free - 1.0) * 100.0
    );
    println!("grammar mask: {schema_mask_ms:.3} ms a step under the schema ({:.1}% of a free step), {tools_mask_ms:.3} ms with tools ({:.1}%); goal < 10%",
        schema_mask_ms / free * 100.0, tools_mask_ms / free * 100.0);
    if let Ok(peer) = std::env::var("MLXBAR_PEER") {
        let theirs = median(vec![step_ms(&client, &peer, &schema).await.0, step_ms(&client, &peer, &schema).await.0]);
        println!("peer {peer} under the same schema: {theirs:.2} ms a step -> mlxbar/peer time = {:.2}", constrained / theirs);
    }
    server.shutdown().await;
}
