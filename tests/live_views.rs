//! The live views: a JSON snapshot and an SSE stream of snapshots.
mod common;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

/// The next `snapshot` event of the SSE stream (heartbeats and other events skipped).
async fn next_snapshot(events: &mut common::Sse) -> Value {
    loop {
        let event = events.next().await.expect("the snapshot stream ended");
        if event.event == "snapshot" {
            return serde_json::from_str(&event.data).unwrap();
        }
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
    let mut body = common::sse(resp);
    let first = next_snapshot(&mut body).await;
    assert_eq!(first["scheduler"]["running"], 0);
    assert_eq!(first["timings"]["ttft_seconds"]["count"], 0);
    assert_eq!(first["models"][0]["info"]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(first["memory"]["system"]["total"].as_u64().unwrap() > 1 << 30);
    assert!(first["memory"]["mlx"]["active"].is_u64(), "{}", first["memory"]);

    // A request makes the stream move; events come at most twice a second.
    let req = json!({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 0});
    let done = tokio::spawn({
        let (client, base, req) = (client.clone(), base.clone(), req.clone());
        async move { client.post(format!("{base}/v1/chat/completions")).json(&req).send().await.unwrap().json::<Value>().await.unwrap() }
    });
    let mut snapshots = vec![first];
    loop {
        let s = next_snapshot(&mut body).await;
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
    // MLX holds at least the model's weights. The memory figures are sampled on their own
    // clock: on a loaded machine the answer can be done before the first sample after the
    // load (a CI run saw all zeros), so the snapshot is read again until it shows them.
    let weights = snap["models"][0]["info"]["weight_bytes"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut mlx = snap["memory"]["mlx"].clone();
    while mlx["active"].as_u64().unwrap() < weights && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        let again: Value = client.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap();
        mlx = again["memory"]["mlx"].clone();
    }
    assert!(mlx["active"].as_u64().unwrap() >= weights, "{mlx} < {weights}");
    assert_eq!(snap["scheduler"]["queue_capacity"], 64);
    // The scheduler's rate covers the last whole seconds: it shows the answer's tokens
    // once their second is over, and no more of them than there were.
    let generated = answer["usage"]["completion_tokens"].as_f64().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rate = loop {
        let s: Value = client.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap();
        let rate = s["scheduler"]["tokens_per_second"].as_f64().unwrap();
        if rate > 0.0 || std::time::Instant::now() > deadline {
            break rate;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(rate > 0.0 && rate <= generated, "{rate} tokens/s after {generated} tokens");
    let series = &snap["throughput"];
    let len = series["tokens_per_second"].as_array().unwrap().len();
    assert!(series["running"].as_array().unwrap().len() == len && series["waiting"].as_array().unwrap().len() == len);

    // The request is listed as it ended, with the figures its answer reported.
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let recent = snap["requests"]["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 1);
    let r = &recent[0];
    let result = answer["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(r["result"], result);
    assert_eq!(snap["requests"]["by_result"][result], 1);
    assert_eq!((r["endpoint"].as_str(), r["stream"].as_bool()), (Some("chat"), Some(false)));
    assert_eq!(r["prompt_tokens"], answer["usage"]["prompt_tokens"]);
    assert_eq!(r["completion_tokens"], answer["usage"]["completion_tokens"]);
    assert_eq!(r["cached_prompt_tokens"], 0);
    assert!(r["decode_tokens_per_second"].as_f64().unwrap() > 0.0 && r["prefill_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(r["ttft_seconds"].as_f64().unwrap() <= r["e2e_seconds"].as_f64().unwrap());
    assert_eq!(snap["timings"]["cached_prompt_share"], 0.0);

    // The same prompt again starts from the prefix cache: the answer, the request's line
    // and the window's cached share all say how much.
    let again: Value = client.post(format!("{base}/v1/chat/completions")).json(&req).send().await.unwrap().json().await.unwrap();
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached >= 16 && cached < prompt, "{cached} of {prompt} prompt tokens cached");
    let snap: Value = client.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap();
    assert_eq!(snap["requests"]["recent"][1]["cached_prompt_tokens"], cached);
    let share = snap["timings"]["cached_prompt_share"].as_f64().unwrap();
    assert!((share - cached as f64 / (2 * prompt) as f64).abs() < 1e-9, "share {share}");
    assert_eq!(snap["timings"]["requests"], 2);
    assert!(snap["prefix_cache_hit_rate"].as_f64().unwrap() > 0.0);

    // A client that leaves mid-stream is counted as cancelled, with what it got.
    let stream_req =
        json!({"messages": [{"role": "user", "content": "Count to one hundred."}], "max_tokens": 200, "temperature": 0, "stream": true});
    let resp = client.post(format!("{base}/v1/chat/completions")).json(&stream_req).send().await.unwrap();
    let mut tokens = common::sse(resp);
    common::read_tokens(&mut tokens, 2).await;
    drop(tokens);
    let cancelled = loop {
        let s = next_snapshot(&mut body).await;
        if s["requests"]["by_result"]["cancelled"] == 1 {
            break s;
        }
    };
    let r = cancelled["requests"]["recent"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((r["result"].as_str(), r["stream"].as_bool()), (Some("cancelled"), Some(true)));
    assert!(r["completion_tokens"].as_u64().unwrap() >= 1 && r["prompt_tokens"].is_null());
    assert_eq!(cancelled["timings"]["requests"], 2, "only completed requests make the distributions");
}

#[tokio::test]
async fn streams_share_one_rendering_and_are_capped() {
    let base = common::start_server(mlxbar::Config { max_stream_subscribers: 3, ..common::test_config() });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let open = || client.get(format!("{base}/api/metrics/stream")).send();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let resp = open().await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut events = common::sse(resp);
        next_snapshot(&mut events).await;
        streams.push(events);
    }
    // A fourth subscriber is refused in the API's error shape.
    let refused = open().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.json::<Value>().await.unwrap()["error"]["code"], "too_many_streams");

    // A change is rendered once: every subscriber gets the very same event (the snapshot
    // carries its own time and uptime, so separate renderings would differ).
    let alerts: Value = client.get(format!("{base}/api/alerts")).send().await.unwrap().json().await.unwrap();
    let id = alerts["data"][0]["id"].as_str().unwrap().to_string();
    let r = client.post(format!("{base}/api/alerts/{id}/snooze")).json(&json!({"seconds": 600})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut seen = Vec::new();
    for events in streams.iter_mut() {
        loop {
            let event = events.next().await.expect("the snapshot stream ended");
            let snapshot: Value = if event.event == "snapshot" { serde_json::from_str(&event.data).unwrap() } else { continue };
            let snoozed = snapshot["alerts"].as_array().unwrap().iter().any(|a| a["id"] == id.as_str() && a["snoozed"] == true);
            if snoozed {
                seen.push(event.data);
                break;
            }
        }
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:#?}");

    // A subscriber that leaves frees its place.
    streams.pop();
    common::until("a free stream place", 30, async || (open().await.ok()?.status() == 200).then_some(())).await;
}
