//! Memory at rest, on a real server with a short quiet period (`mlx_cache_idle_seconds`):
//! after a burst of requests MLX's buffer cache goes back to the system once, counted in
//! `/metrics`; and the memory split (per model: weights, KV in use, prefix cache; process:
//! MLX's buffer cache) is in `/metrics` and the snapshot, sized from the model, and adds up.
mod common;

use common::{metric_sum, until};
use mlxbar::Config;
use serde_json::{json, Value};

const IDLE: &str = r#"reason="idle""#;

async fn snapshot(base: &str) -> Value {
    reqwest::get(format!("{base}/api/metrics/snapshot")).await.unwrap().json().await.unwrap()
}

async fn chat(client: &reqwest::Client, base: &str, content: &str, stream: bool) -> reqwest::Response {
    let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 24, "temperature": 0, "stream": stream});
    let resp = client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_server_gives_the_buffer_cache_back_and_shows_what_it_holds() {
    let base = common::start_server(Config { mlx_cache_idle_seconds: 0.5, ..common::test_config() });
    let client = reqwest::Client::new();

    // The load's own quiet spell ends in a release; after it the engine blocks until work
    // comes, so the count holds still until the burst below.
    let after_load = until("the release after the load", 20, async || {
        let n = metric_sum(&base, "mlxbar_mlx_cache_clears_total", &[IDLE]).await;
        (n >= 1.0).then_some(n)
    })
    .await;

    // While a stream decodes, its KV is in use and shows against its model.
    let mut stream = common::sse(chat(&client, &base, "Count from one to twenty.", true).await);
    common::read_tokens(&mut stream, 2).await;
    let kv = metric_sum(&base, "mlxbar_model_kv_bytes", &[]).await;
    assert!(kv > 0.0, "KV in use while a request decodes: {kv}");
    drop(stream);

    // A burst: four requests together, each leaving its KV to the prefix cache.
    let burst = ["Name a colour.", "Name a fruit.", "Name a city in France.", "Say hello politely to a friend."];
    let answers = futures::future::join_all(burst.map(|p| chat(&client, &base, p, false))).await;
    for a in answers {
        a.json::<Value>().await.unwrap();
    }

    // Quiet again: one more release, and the cache MLX reports is empty.
    until("the release after the burst, with MLX's cache at 0", 20, async || {
        let clears = metric_sum(&base, "mlxbar_mlx_cache_clears_total", &[IDLE]).await;
        let cache = metric_sum(&base, "mlxbar_mlx_memory_bytes", &[r#"kind="cache""#]).await;
        (clears > after_load && cache == 0.0).then_some(())
    })
    .await;
    assert_eq!(metric_sum(&base, "mlxbar_mlx_cache_clears_total", &[IDLE]).await, after_load + 1.0, "one release per quiet spell");

    // The split, idle: weights held, no KV in use, the prefix cache within its limit, which
    // is 2048 tokens of this model's KV (float32 on the CPU, float16 on Metal).
    let snap = snapshot(&base).await;
    let model = &snap["models"][0];
    let id = model["id"].as_str().unwrap();
    let weights = model["info"]["weight_bytes"].as_u64().unwrap();
    let prefix = model["prefix_cache_bytes"].as_u64().unwrap();
    let limit = model["prefix_cache_limit_bytes"].as_u64().unwrap();
    assert!(weights > 0);
    assert_eq!(model["kv_bytes"], 0, "no request runs: no KV in use");
    assert!(prefix > 0 && prefix <= limit, "the burst's prefixes are kept within the limit: {prefix} of {limit}");
    let shape = &model["shape"];
    let dtype = if snap["device"] == "gpu" { 2 } else { 4 };
    let per_token =
        2 * shape["layers"].as_u64().unwrap() * shape["num_kv_heads"].as_u64().unwrap() * shape["head_dim"].as_u64().unwrap() * dtype;
    let total = snap["memory"]["system"]["total"].as_u64().unwrap();
    assert_eq!(limit, (2048 * per_token).min(total / 32), "the prefix cache is sized from the model");

    // /metrics says the same, by model.
    let label = format!(r#"model="{id}""#);
    assert_eq!(metric_sum(&base, "mlxbar_model_weight_bytes", &[&label]).await, weights as f64);
    assert_eq!(metric_sum(&base, "mlxbar_model_prefix_cache_bytes", &[&label]).await, prefix as f64);
    assert_eq!(metric_sum(&base, "mlxbar_model_kv_bytes", &[&label]).await, 0.0);
    // MLX's cache limit: two engine steps' transient buffers, the larger of a 512-token
    // prefill chunk (per token 6 hidden-wide and 3 MLP-wide activations, and the attention
    // scores of every head against the chunk) and a decode step of the whole batch (the
    // same per row plus float32 logits); at most 1/16 of memory.
    let cache_limit = metric_sum(&base, "mlxbar_mlx_memory_bytes", &[r#"kind="cache_limit""#]).await;
    let n = |k: &str| shape[k].as_u64().unwrap();
    let per_token = 6 * n("hidden_size") + 3 * n("intermediate_size");
    let prefill = 512 * (per_token + n("num_heads") * 512) * dtype;
    let decode = snap["scheduler"]["max_batch"].as_u64().unwrap() * (per_token * dtype + 4 * n("vocab_size"));
    let want = (2 * prefill.max(decode)).clamp(32 << 20, 512 << 20).min(total / 16);
    assert_eq!(cache_limit, want as f64, "MLX's cache limit is sized from the model");
    assert_eq!(snap["memory"]["mlx"]["cache_limit"].as_f64().unwrap(), cache_limit);
    assert!(snap["memory"]["mlx"]["idle_clears"].as_f64().unwrap() >= after_load + 1.0);
    // Unloads have not happened: their reason is exported at 0 all the same.
    assert!(reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .contains(r#"mlxbar_mlx_cache_clears_total{reason="unload"} 0"#));
}
