//! The live views: a JSON snapshot and an SSE stream of snapshots.
mod common;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

/// The next `snapshot` event of an SSE body (heartbeat comments skipped).
async fn next_snapshot<S, B, E>(body: &mut S, buf: &mut String) -> Value
where
    S: futures::Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Debug,
{
    loop {
        if let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if event.starts_with("event: snapshot") {
                let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                return serde_json::from_str(data).unwrap();
            }
            continue;
        }
        buf.push_str(&String::from_utf8_lossy(body.next().await.unwrap().unwrap().as_ref()));
    }
}

#[tokio::test]
async fn snapshot_and_stream_follow_a_request() {
    // A server of its own, so the only traffic is this test's.
    let base = common::start_server(common::test_config());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();

    // The stream opens with a snapshot.
    let resp = client.get(format!("{base}/api/metrics/stream")).send().await.unwrap();
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let first = next_snapshot(&mut body, &mut buf).await;
    assert_eq!(first["scheduler"]["running"], 0);
    assert_eq!(first["timings"]["ttft_seconds"]["count"], 0);
    assert_eq!(first["models"][0]["info"]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(first["memory"]["system"]["total"].as_u64().unwrap() > 1 << 30);
    assert!(first["memory"]["mlx"]["active"].as_u64().unwrap() > 100 << 20);

    // A request makes the stream move; events come at most twice a second.
    let req = json!({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 0});
    let done = tokio::spawn({
        let (client, base) = (client.clone(), base.clone());
        async move { client.post(format!("{base}/v1/chat/completions")).json(&req).send().await.unwrap().json::<Value>().await.unwrap() }
    });
    let mut snapshots = vec![first];
    loop {
        let s = next_snapshot(&mut body, &mut buf).await;
        let finished = s["timings"]["ttft_seconds"]["count"] == 1;
        snapshots.push(s);
        if finished {
            break;
        }
    }
    let answer = done.await.unwrap();
    let uptimes: Vec<f64> = snapshots.iter().map(|s| s["uptime_seconds"].as_f64().unwrap()).collect();
    for pair in uptimes[1..].windows(2) {
        assert!(pair[1] - pair[0] >= 0.45, "events {:.3}s apart", pair[1] - pair[0]);
    }
    let last = snapshots.last().unwrap();
    let tokens: u64 = last["throughput"]["tokens_per_second"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(tokens, answer["usage"]["completion_tokens"].as_u64().unwrap());
    assert_eq!(last["throughput"]["resolution_seconds"], 1);
    let ttft = last["timings"]["ttft_seconds"]["p50"].as_f64().unwrap();
    assert!(ttft > 0.0 && ttft < 60.0);

    // The JSON snapshot agrees.
    let snap: Value = client.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap();
    assert_eq!(snap["timings"]["ttft_seconds"]["count"], 1);
    assert_eq!(snap["timings"]["window_minutes"], 5);
    assert_eq!(snap["scheduler"]["queue_capacity"], 64);
}
