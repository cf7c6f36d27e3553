//! A request that cannot fit in MLX's memory limit fails alone with a clear 507, while the
//! process and the other streams live. In a test binary of its own: MLX's memory limit is
//! process-wide.
mod common;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_memory_limit_gets_507_and_others_go_on() {
    // The default model holds ~115 MB of packed weights in the default format; 64 MB more
    // leaves room for short requests, not for a 6,000-token prompt's ~280 MB of KV.
    let limit = 115_000_000 + (64 << 20);
    let base = common::start_server(mlxbar::Config { mlx_memory_limit_bytes: Some(limit), ..common::test_config() });
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();

    // A stream that is running when the big one comes.
    let body = json!({"messages": [{"role": "user", "content": "Write a poem about the sea."}], "max_tokens": 24, "temperature": 0, "stream": true});
    let resp = http.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut stream = common::sse(resp);
    common::read_tokens(&mut stream, 1).await;

    let big = json!({"messages": [{"role": "user", "content": "ocean ".repeat(6000)}], "max_tokens": 16});
    let r = http.post(format!("{base}/v1/chat/completions")).json(&big).send().await.unwrap();
    assert_eq!(r.status(), 507);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "insufficient_memory", "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("MB") && msg.contains("memory limit"), "{msg}");

    let rest: Vec<String> = stream.map(|e| e.data).collect().await;
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "the other stream finished: {rest:?}");
    assert!(rest.iter().any(|d| d.contains("\"finish_reason\":\"length\"")), "{rest:?}");
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "and the server goes on");
}
