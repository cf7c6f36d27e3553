//! Continuous batching, the prefix cache and memory-aware admission on the real engine:
//! batched greedy output equals one-at-a-time output while the engine's own batch-size
//! histogram shows steps of three or more sequences, streams join and leave and one can be
//! cancelled (ending as cancelled, its KV freed) without disturbing the rest, a second chat
//! turn reuses the first turn's KV with the same output (bit for bit on a CPU without AMX,
//! though the reused KV came from another prefill shape: agreement.rs), forced critical pressure
//! refuses new work, and speculative decoding (Predicted Outputs, prompt lookup) keeps the
//! greedy answer while its usage and metrics count the drafts.
mod common;

use std::time::Duration;

use futures::StreamExt;
use mlxbar::telemetry::memory::PressureLevel;
use mlxbar::{Config, Server};
use serde_json::{json, Value};

async fn start(config: Config) -> (Server, String) {
    mlxbar::engine::faults::arm();
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

/// A greedy answer with each step's logprobs (common::agreement).
async fn traced(base: &str, messages: &Value, max_tokens: usize) -> common::agreement::Traced {
    let body = common::agreement::traced_body(&json!({"messages": messages, "max_tokens": max_tokens}));
    let r = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    common::agreement::Traced::from_answer(&r.json().await.unwrap())
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).map(|v| v.parse().unwrap())).unwrap_or_else(|| panic!("{name} missing"))
}

/// Prompts with long answers: each is still decoding when the next one joins.
const PROMPTS: [&str; 3] = ["Explain gravity to a child.", "Tell me about cats.", "How do rainbows form?"];

/// A streaming greedy chat completion, read token by token.
struct Streaming {
    events: common::Sse,
    text: String,
    tokens: usize,
}

impl Streaming {
    async fn open(base: &str, content: &str, max_tokens: usize) -> Streaming {
        let body = json!({"messages": messages(content), "max_tokens": max_tokens, "temperature": 0, "stream": true});
        let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        Streaming { events: common::sse(resp), text: String::new(), tokens: 0 }
    }

    /// Reads until the next content delta; false at the end of the stream (`[DONE]`).
    async fn next_token(&mut self) -> bool {
        while let Some(event) = self.events.next().await {
            if event.data == "[DONE]" {
                return false;
            }
            let chunk: Value = serde_json::from_str(&event.data).expect("JSON chunk");
            let delta = common::chunk_text(&chunk);
            if !delta.is_empty() {
                self.text.push_str(delta);
                self.tokens += 1;
                return true;
            }
        }
        panic!("the stream ended without [DONE] after {} tokens", self.tokens)
    }

    async fn until_tokens(&mut self, n: usize) {
        while self.tokens < n {
            assert!(self.next_token().await, "the stream ended after {} tokens", self.tokens);
        }
    }

    async fn rest(mut self) -> String {
        while self.next_token().await {}
        self.text
    }
}

/// Decode steps that ran more than `size` sequences together, from `mlxbar_batch_size`.
async fn steps_larger_than(base: &str, size: usize) -> f64 {
    metric(base, "mlxbar_batch_size_count").await - common::metric_sum(base, "mlxbar_batch_size_bucket", &[&format!("le=\"{size}\"")]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_serving_matches_one_at_a_time_and_survives_a_cancelled_stream() {
    const TOKENS: usize = 32;
    // One at a time, no prefix cache: the reference.
    let (solo, solo_url) = start(Config { max_batch: 1, prefix_cache_bytes: Some(0), ..common::test_config() }).await;
    let mut want = vec![];
    for p in &PROMPTS {
        want.push(greedy(&solo_url, &messages(p), TOKENS).await);
    }
    assert!(metric(&solo_url, "mlxbar_batch_size_count").await > 0.0);
    assert_eq!(steps_larger_than(&solo_url, 1).await, 0.0, "max_batch 1 decoded more than one sequence per step");
    solo.shutdown().await;

    let (server, base) = start(Config { prefix_cache_bytes: Some(0), ..common::test_config() }).await;
    // Join points come from the streams: each request starts once the previous one has
    // streamed its first token, so each joins a batch that is already decoding. A long
    // stream runs under all of them and is cancelled once the third has decoded a token.
    let mut doomed = Streaming::open(&base, "Write a very long story.", 200).await;
    doomed.until_tokens(1).await;
    let mut streams = vec![];
    for p in &PROMPTS {
        let mut s = Streaming::open(&base, p, TOKENS).await;
        s.until_tokens(1).await;
        streams.push(s);
    }
    streams[2].until_tokens(2).await; // a decode step ran with the third stream in it
    doomed.until_tokens(doomed.tokens + 1).await;
    drop(doomed);
    let mut got = vec![];
    for s in streams {
        got.push(s.rest().await);
    }
    // Exact even with AMX: every chat-templated prompt here is over 16 tokens, so each is
    // prefilled on the tiles alone or together, and decode steps of 1 to 8 rows stay on
    // the VNNI kernel either way.
    assert_eq!(got, want, "batched greedy output differs from one-at-a-time");
    let wider = steps_larger_than(&base, 2).await;
    assert!(wider > 0.0, "no decode step ran three or more sequences together");
    let snapshot: Value = reqwest::get(format!("{base}/api/metrics/snapshot")).await.unwrap().json().await.unwrap();
    assert!(snapshot["caches"]["peak_batch"].as_u64().unwrap() >= 3, "the snapshot's peak batch: {}", snapshot["caches"]);

    // The cancelled stream ends as cancelled, and every KV buffer is released.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let cancelled = common::metric_sum(&base, "mlxbar_requests_total", &[r#"result="cancelled""#]).await;
        let (kv_tokens, kv_bytes) = (metric(&base, "mlxbar_kv_cache_tokens").await, metric(&base, "mlxbar_kv_cache_bytes").await);
        let running = metric(&base, "mlxbar_scheduler_running_requests").await;
        if cancelled == 1.0 && kv_tokens == 0.0 && kv_bytes == 0.0 && running == 0.0 {
            break;
        }
        assert!(cancelled <= 1.0, "{cancelled} cancelled");
        assert!(
            std::time::Instant::now() < deadline,
            "after the streams: {cancelled} cancelled, {running} running, KV {kv_tokens} tokens / {kv_bytes} bytes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let finished = common::metric_sum(&base, "mlxbar_requests_total", &[r#"result="length""#]).await
        + common::metric_sum(&base, "mlxbar_requests_total", &[r#"result="stop""#]).await;
    assert_eq!(finished, 3.0, "the three streams finished normally");
    assert_eq!(common::metric_sum(&base, "mlxbar_requests_total", &[r#"result="error""#]).await, 0.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_chat_turn_reuses_the_first_turns_kv_with_the_same_output() {
    let (plain, plain_url) = start(Config { prefix_cache_bytes: Some(0), ..common::test_config() }).await;
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
    let with_cache = traced(&url, &turn2, 24).await;
    assert_eq!(metric(&url, "mlxbar_prefix_cache_hits_total").await, hits_before + 1.0);
    assert!(metric(&url, "mlxbar_prefix_cache_tokens_saved_total").await > 40.0, "the first turn's tokens were reused");
    // The reused KV was computed in another prefill shape: the same answer bit for bit on a
    // CPU without AMX, parting at a near-tie at most on Metal and with AMX (agreement.rs).
    let plain_answer = traced(&plain_url, &turn2, 24).await;
    common::agreement::assert_agree(&with_cache, &plain_answer, "second turn, prefix reused vs not");
    plain.shutdown().await;
    cached.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_prefix_budget_evicts_and_critical_pressure_refuses_new_work() {
    // Each answer leaves ~45 tokens of KV (trimmed to its length): 2.1 MB at float32 on the
    // CPU, half that at float16 on Metal. A budget of 1.5 entries holds one.
    let budget = if cfg!(target_os = "macos") { 3 << 19 } else { 3 << 20 };
    let (server, base) = start(Config { prefix_cache_bytes: Some(budget), ..common::test_config() }).await;
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
    let answer = tokio::time::timeout(Duration::from_secs(30), held).await.unwrap().unwrap();
    assert_eq!(answer, greedy(&base, &messages("Hi"), 4).await, "the held request got the model's greedy answer");
    server.shutdown().await;
}

/// The text of a chat completion's usage field `completion_tokens_details[key]`.
fn prediction_tokens(answer: &Value, key: &str) -> u64 {
    answer["usage"]["completion_tokens_details"][key].as_u64().unwrap_or_else(|| panic!("usage without {key}: {answer}"))
}

async fn chat(base: &str, body: &Value) -> Value {
    let r = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(body).send().await.unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    v
}

/// Predicted Outputs and prompt lookup change how many passes an answer takes, not the
/// answer: drafts verified in one pass give the greedy answer of one token a pass (bit for
/// bit on a CPU without AMX though a verifying pass runs several positions, another shape;
/// within agreement.rs's near-tie rule on Metal and with AMX),
/// and the usage and metrics count what was accepted and rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_outputs_and_prompt_lookup_keep_the_greedy_answer_and_count_drafts() {
    let (plain, plain_url) = start(Config { prefix_cache_bytes: Some(0), ..common::test_config() }).await;
    let (lookup, lookup_url) =
        start(Config { prefix_cache_bytes: Some(0), speculative: mlxbar::config::Speculative::PromptLookup, ..common::test_config() })
            .await;
    let text = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. \
                All that glitters is not gold.";
    let ask = messages(&format!("Repeat this text exactly, with nothing else:\n\n{text}"));
    let request = json!({"messages": ask, "max_tokens": 48});
    let want = traced(&plain_url, &ask, 48).await;
    assert!(want.steps.len() >= 16, "a long enough answer to draft: {:?}", want.text);

    // The answer itself as the prediction: most of it comes from drafts.
    let mut body = common::agreement::traced_body(&request);
    body["prediction"] = json!({"type": "content", "content": want.text});
    let answer = chat(&plain_url, &body).await;
    common::agreement::assert_agree(&common::agreement::Traced::from_answer(&answer), &want, "prediction = the answer");
    let completion = answer["usage"]["completion_tokens"].as_u64().unwrap();
    let accepted = prediction_tokens(&answer, "accepted_prediction_tokens");
    assert!(accepted * 2 >= completion, "{accepted} of {completion} tokens came from the prediction");
    assert_eq!(metric(&plain_url, "mlxbar_speculative_draft_tokens_total{result=\"accepted\"}").await, accepted as f64);
    assert!(metric(&plain_url, "mlxbar_speculative_passes_total").await >= 1.0);

    // A prediction with an edit in the middle (as text parts): drafts are rejected at the
    // edit and taken again after it.
    let edited = want.text.replacen("thousand", "hundred", 1);
    assert_ne!(edited, want.text, "the answer repeats the text: {:?}", want.text);
    let (head, tail) = edited.split_at(edited.len() / 2);
    body["prediction"] = json!({"type": "content", "content": [{"type": "text", "text": head}, {"type": "text", "text": tail}]});
    let answer = chat(&plain_url, &body).await;
    common::agreement::assert_agree(&common::agreement::Traced::from_answer(&answer), &want, "prediction with an edit");
    assert!(prediction_tokens(&answer, "accepted_prediction_tokens") > 0, "{answer}");
    assert!(prediction_tokens(&answer, "rejected_prediction_tokens") > 0, "{answer}");

    // Prompt lookup: the text to repeat is in the prompt.
    let body = common::agreement::traced_body(&request);
    let answer = chat(&lookup_url, &body).await;
    common::agreement::assert_agree(&common::agreement::Traced::from_answer(&answer), &want, "prompt lookup");
    assert!(prediction_tokens(&answer, "accepted_prediction_tokens") > 8, "{answer}");
    assert!(metric(&lookup_url, "mlxbar_speculative_draft_tokens_total{result=\"accepted\"}").await > 8.0);
    // Two at once: prompt lookup gives way to the batch while others decode, and takes
    // over again alone; each answer is still the greedy one.
    let (a, b) = tokio::join!(chat(&lookup_url, &body), chat(&lookup_url, &body));
    for answer in [a, b] {
        common::agreement::assert_agree(&common::agreement::Traced::from_answer(&answer), &want, "prompt lookup beside another");
    }

    // Sampling with a prediction, streamed with usage: the rejection rule runs, the stream
    // ends with the counts.
    let body = json!({"messages": ask, "max_tokens": 24, "temperature": 0.7, "seed": 3, "stream": true,
        "stream_options": {"include_usage": true}, "prediction": {"type": "content", "content": want.text}});
    let r = reqwest::Client::new().post(format!("{plain_url}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut events = common::sse(r);
    let mut usage = None;
    while let Some(event) = events.next().await {
        if event.data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event.data).unwrap();
        if !chunk["usage"].is_null() {
            usage = Some(chunk["usage"].clone());
        }
    }
    let usage = usage.expect("a usage chunk");
    assert!(usage["completion_tokens_details"]["accepted_prediction_tokens"].is_u64(), "{usage}");

    // A malformed prediction is a 400 naming it.
    for bad in [
        json!({"type": "file", "content": "x"}),
        json!({"type": "content"}),
        json!("x"),
        json!({"type": "content", "content": [{"type": "image"}]}),
    ] {
        let body = json!({"messages": ask, "max_tokens": 4, "prediction": bad});
        let r = reqwest::Client::new().post(format!("{plain_url}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "prediction", "{bad}");
    }
    plain.shutdown().await;
    lookup.shutdown().await;
}
