//! Continuous batching, the prefix cache and memory-aware admission on the real engine:
//! batched greedy output equals one-at-a-time output, streams join and leave and one can
//! be cancelled without disturbing the rest, a second chat turn reuses the first turn's KV
//! with identical output, and forced critical pressure refuses new work.
mod common;

use std::time::Duration;

use futures::StreamExt;
use mlxbar::telemetry::memory::PressureLevel;
use mlxbar::{Config, Server};
use serde_json::{json, Value};

async fn start(config: Config) -> (Server, String) {
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    (server, base)
}

fn messages(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

async fn greedy(base: &str, messages: &Value, max_tokens: usize) -> String {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0});
    let r = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).map(|v| v.parse().unwrap())).unwrap_or_else(|| panic!("{name} missing"))
}

const PROMPTS: [&str; 6] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "List three fruits.",
    "Tell me about cats.",
    "How do rainbows form?",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_serving_matches_one_at_a_time_and_survives_a_cancelled_stream() {
    // One at a time, no prefix cache: the reference.
    let (solo, solo_url) = start(Config { max_batch: 1, prefix_cache_bytes: 0, ..common::test_config() }).await;
    let mut want = vec![];
    for p in PROMPTS {
        want.push(greedy(&solo_url, &messages(p), 24).await);
    }
    solo.shutdown().await;

    let (server, base) = start(Config { prefix_cache_bytes: 0, ..common::test_config() }).await;
    // A long stream that is cancelled after a few tokens, while the others run batched
    // and join at different moments.
    let body = json!({"messages": messages("Write a very long story."), "max_tokens": 200, "temperature": 0, "stream": true});
    let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut doomed = resp.bytes_stream();
    doomed.next().await.unwrap().unwrap();
    let mut tasks = vec![];
    for (i, p) in PROMPTS.iter().enumerate() {
        let base = base.clone();
        let p = p.to_string();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await; // staggered joins
            greedy(&base, &messages(&p), 24).await
        }));
    }
    for _ in 0..3 {
        doomed.next().await.unwrap().unwrap();
    }
    drop(doomed);
    let mut got = vec![];
    for t in tasks {
        got.push(t.await.unwrap());
    }
    assert_eq!(got, want, "batched greedy output differs from one-at-a-time");
    assert!(metric(&base, "mlxbar_scheduler_max_batch").await == 8.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_chat_turn_reuses_the_first_turns_kv_with_identical_output() {
    let (plain, plain_url) = start(Config { prefix_cache_bytes: 0, ..common::test_config() }).await;
    let (cached, url) = start(common::test_config()).await;
    let turn1 = json!([
        {"role": "system", "content": "You are a concise assistant who answers in one sentence."},
        {"role": "user", "content": "What is the tallest mountain on Earth?"}
    ]);
    let answer = greedy(&url, &turn1, 24).await;
    assert_eq!(answer, greedy(&plain_url, &turn1, 24).await);
    assert_eq!(metric(&url, "mlxbar_prefix_cache_entries").await, 1.0);
    let mut turn2 = turn1.as_array().unwrap().clone();
    turn2.push(json!({"role": "assistant", "content": answer}));
    turn2.push(json!({"role": "user", "content": "And the second tallest?"}));
    let turn2 = Value::Array(turn2);
    let hits_before = metric(&url, "mlxbar_prefix_cache_hits_total").await;
    let with_cache = greedy(&url, &turn2, 24).await;
    assert_eq!(metric(&url, "mlxbar_prefix_cache_hits_total").await, hits_before + 1.0);
    assert!(metric(&url, "mlxbar_prefix_cache_tokens_saved_total").await > 40.0, "the first turn's tokens were reused");
    assert_eq!(with_cache, greedy(&plain_url, &turn2, 24).await, "reusing the prefix changed the output");
    plain.shutdown().await;
    cached.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_prefix_budget_evicts_and_critical_pressure_refuses_new_work() {
    // One 256-token KV buffer of this model is ~11 MiB: a 16 MiB budget holds one entry.
    let (server, base) = start(Config { prefix_cache_bytes: 16 << 20, ..common::test_config() }).await;
    greedy(&base, &messages(&format!("{} Answer briefly.", PROMPTS[0])), 8).await;
    greedy(&base, &messages(&format!("{} Answer briefly.", PROMPTS[1])), 8).await;
    assert!(metric(&base, "mlxbar_prefix_cache_evictions_total").await >= 1.0);
    assert_eq!(metric(&base, "mlxbar_prefix_cache_entries").await, 1.0);

    server.force_memory_pressure(Some(PressureLevel::Critical));
    let body = json!({"messages": messages("Hi"), "max_tokens": 4});
    let r = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "memory_pressure");
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert!(text.contains("mlxbar_admission_refused_total{reason=\"memory_pressure\"} 1"), "{text}");
    // ... and the alert engine raises admission_held (it evaluates once a second).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let alerts: Value = reqwest::get(format!("{base}/api/alerts")).await.unwrap().json().await.unwrap();
        let held = alerts["data"].as_array().unwrap().iter().find(|a| a["id"] == "admission_held").unwrap().clone();
        if held["firing"] == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "admission_held did not fire: {held}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.force_memory_pressure(None);
    greedy(&base, &messages("Hi"), 4).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_admission_wait_requests_are_held_until_pressure_eases() {
    let (server, base) = start(Config { admission: mlxbar::config::Admission::Wait, ..common::test_config() }).await;
    server.force_memory_pressure(Some(PressureLevel::Critical));
    let url = base.clone();
    let held = tokio::spawn(async move { greedy(&url, &messages("Hi"), 4).await });
    // Held in the queue: visible as waiting and blocked.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&base, "mlxbar_admission_blocked").await != 1.0 {
        assert!(std::time::Instant::now() < deadline, "admission never reported blocked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(&base, "mlxbar_scheduler_waiting_requests").await, 1.0);
    assert!(!held.is_finished());
    server.force_memory_pressure(None);
    assert!(!tokio::time::timeout(Duration::from_secs(30), held).await.unwrap().unwrap().is_empty());
    server.shutdown().await;
}
