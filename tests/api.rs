//! The HTTP API through a real socket, on the real engine and default model: the OpenAI
//! routes, and the other dialects (Anthropic Messages, OpenAI Responses, Ollama) against them:
//! the same greedy answers in both weight formats, the same rules for tools.
mod common;

use std::time::Duration;

use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

async fn post(path: &str, body: Value) -> (u16, Value) {
    post_at(common::server(), path, body).await
}

async fn post_at(base: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = client().post(format!("{base}{path}")).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "temperature": 0})
}

/// Sends only the head of a POST that declares `length` bytes, and reads the answer.
async fn raw_post_declaring(url: &str, length: usize) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let u = reqwest::Url::parse(url).unwrap();
    let mut sock = tokio::net::TcpStream::connect((u.host_str().unwrap(), u.port().unwrap())).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{{",
        u.path()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    sock.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn assert_error(body: &Value, kind: &str) {
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(e["type"], kind, "{body}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{body}");
}

#[tokio::test]
async fn chat_completion_answers_in_openai_shape() {
    let (status, body) = post("/v1/chat/completions", chat(common::QUESTION)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(body["created"].as_u64().unwrap() > 1_700_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], common::ANSWER);
    assert_eq!(choice["finish_reason"], "stop");
    let u = &body["usage"];
    assert_eq!(u["prompt_tokens"], 37);
    assert_eq!(u["completion_tokens"], 11);
    assert_eq!(u["total_tokens"], 48);
}

#[tokio::test]
async fn greedy_is_deterministic_and_max_tokens_cuts_with_length() {
    let mut body = chat("Write a poem about the sea.");
    body["max_tokens"] = json!(12);
    // A first request puts the prompt in the prefix cache, so the two compared both reuse
    // it: where AMX's tiles take prefill, a prompt prefilled whole and one reused from the
    // cache differ in their last bits (README, Configuration), which can flip a near-tie
    // (it did, " ocean" against " blue"). The same path gives the same answer.
    post("/v1/chat/completions", body.clone()).await;
    let (_, a) = post("/v1/chat/completions", body.clone()).await;
    let (_, b) = post("/v1/chat/completions", body.clone()).await;
    for answer in [&a, &b] {
        let (prompt, cached) = (&answer["usage"]["prompt_tokens"], &answer["usage"]["prompt_tokens_details"]["cached_tokens"]);
        assert_eq!(cached.as_u64(), prompt.as_u64().map(|p| p - 1), "the prompt came from the prefix cache");
    }
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    assert_eq!(a["usage"]["completion_tokens"], 12);
    // max_completion_tokens is the newer name for the same limit
    body.as_object_mut().unwrap().remove("max_tokens");
    body["max_completion_tokens"] = json!(5);
    let (_, c) = post("/v1/chat/completions", body).await;
    assert_eq!(c["usage"]["completion_tokens"], 5);
}

#[tokio::test]
async fn seeded_sampling_repeats_and_different_seeds_differ() {
    let mut body = json!({"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 1.2, "top_k": 40, "top_p": 0.95, "max_tokens": 24});
    // A first request puts the prompt in the prefix cache, so the three below all reuse it:
    // with the default format's int8 activations a prompt prefilled whole and one reused
    // from the cache differ by up to ~0.1 in a logprob (common::agreement), which can move a
    // draw at temperature 1.2. The same seed repeats on the same path.
    post("/v1/chat/completions", body.clone()).await;
    let mut texts = vec![];
    for seed in [1, 1, 2] {
        body["seed"] = json!(seed);
        let (status, out) = post("/v1/chat/completions", body.clone()).await;
        assert_eq!(status, 200);
        let (prompt, cached) = (&out["usage"]["prompt_tokens"], &out["usage"]["prompt_tokens_details"]["cached_tokens"]);
        assert_eq!(cached.as_u64(), prompt.as_u64().map(|p| p - 1), "seed {seed}: the prompt came from the prefix cache");
        texts.push(out["choices"][0]["message"]["content"].as_str().unwrap().to_string());
    }
    assert_eq!(texts[0], texts[1]);
    assert_ne!(texts[0], texts[2]);
}

#[tokio::test]
async fn stop_strings_end_the_answer_before_them() {
    let mut body = chat(common::QUESTION);
    body["stop"] = json!([" is"]);
    let (_, out) = post("/v1/chat/completions", body.clone()).await;
    assert_eq!(out["choices"][0]["message"]["content"], "The answer to this classic math problem");
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
    body["stop"] = json!("4");
    let (_, out) = post("/v1/chat/completions", body).await;
    assert_eq!(out["choices"][0]["message"]["content"], "The answer to this classic math problem is ");
}

#[tokio::test]
async fn chat_stream_has_openai_chunks_usage_and_done() {
    let mut body = chat(common::QUESTION);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = client().post(format!("{}/v1/chat/completions", common::server())).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let chunks = common::sse_chunks(resp).await;
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(chunks.iter().all(|c| c["id"] == id && c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().map(common::chunk_text).collect();
    assert_eq!(text, common::ANSWER);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert!(finish["usage"].is_null());
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 11);
    assert_eq!(usage["usage"]["prompt_tokens"], 37);
}

#[tokio::test]
async fn text_completions_stream_and_not() {
    let body = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let (status, out) = post("/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{out}");
    assert!(out["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(out["object"], "text_completion");
    let text = out["choices"][0]["text"].as_str().unwrap().to_string();
    // Greedy goes on from the prompt, and its first two tokens are the 2-token answer.
    assert!(text.starts_with(" Paris"), "{text:?}");
    let (_, two) = post("/v1/completions", json!({"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0})).await;
    let two = two["choices"][0]["text"].as_str().unwrap();
    assert!(!two.is_empty() && text.len() > two.len() && text.starts_with(two), "{two:?} then {text:?}");
    assert_eq!(out["usage"]["completion_tokens"], 4);
    assert_eq!(out["choices"][0]["finish_reason"], "length");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let resp = client().post(format!("{}/v1/completions", common::server())).json(&streamed).send().await.unwrap();
    let chunks = common::sse_chunks(resp).await;
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let joined: String = chunks.iter().map(common::chunk_text).collect();
    assert_eq!(joined, text);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");

    // token ids as the prompt
    let (status, out) = post("/v1/completions", json!({"prompt": [504, 3575], "max_tokens": 2})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["prompt_tokens"], 2);
}

#[tokio::test]
async fn models_and_health_describe_the_engine() {
    let c = client();
    let models: Value = c.get(format!("{}/v1/models", common::server())).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(models["data"][0]["object"], "model");
    let resp = c.get(format!("{}/health", common::server())).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let health: Value = resp.json().await.unwrap();
    assert_eq!(health["state"], "ready");
    assert_eq!(health["device"], if cfg!(target_os = "macos") { "gpu" } else { "cpu" });
    assert_eq!(health["model"]["architecture"], "llama");
    assert_eq!(health["model"]["context_length"], 8192);
    // "default" and the listed id both name the loaded model
    for model in ["default", "SmolLM2-135M-Instruct.Q4_1"] {
        let mut body = chat("Hi");
        body["model"] = json!(model);
        body["max_tokens"] = json!(1);
        assert_eq!(post("/v1/chat/completions", body).await.0, 200);
    }
}

#[tokio::test]
async fn bad_requests_get_openai_errors_with_fitting_statuses() {
    let c = client();
    let url = format!("{}/v1/chat/completions", common::server());
    // malformed JSON
    let resp = c.post(&url).header("content-type", "application/json").body("{\"messages\": [").send().await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_error(&resp.json().await.unwrap(), "invalid_request_error");
    // wrong field type names the field
    let (status, body) = post("/v1/chat/completions", json!({"messages": "hi"})).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("messages"), "{body}");
    // unknown model
    let mut b = chat("hi");
    b["model"] = json!("gpt-9");
    let (status, body) = post("/v1/chat/completions", b).await;
    assert_eq!(status, 404);
    assert_error(&body, "invalid_request_error");
    assert_eq!(body["error"]["code"], "model_not_found");
    // prompt + max_tokens beyond the context: 400 with the numbers
    let mut b = chat("hi");
    b["max_tokens"] = json!(9000);
    let (status, body) = post("/v1/chat/completions", b).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("8192") && msg.contains("9000") && msg.contains("9031"), "{msg}");
    // a prompt alone longer than the context
    let long = "word ".repeat(9000);
    let (status, body) = post("/v1/completions", json!({"prompt": long, "max_tokens": 1})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    // out-of-range sampling parameters, empty messages, n > 1
    for bad in [json!({"temperature": 3.0}), json!({"top_p": 0.0}), json!({"n": 2}), json!({"max_tokens": 0})] {
        let mut b = chat("hi");
        b.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
        let (status, body) = post("/v1/chat/completions", b).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_error(&body, "invalid_request_error");
    }
    assert_eq!(post("/v1/chat/completions", json!({"messages": []})).await.0, 400);
    assert_eq!(post("/v1/completions", json!({"prompt": [999999]})).await.0, 400);
    // body over the limit (4 MiB): refused on its Content-Length, before the body is read
    let (status, body) = raw_post_declaring(&url, 5 << 20).await;
    assert_eq!(status, 413);
    assert_error(&body, "invalid_request_error");
    // unknown route and wrong method, in the same error shape
    let resp = c.get(format!("{}/v1/nothing", common::server())).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_error(&resp.json().await.unwrap(), "invalid_request_error");
    let resp = c.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 405);
}

/// Nothing a request carries is ignored: each field mlxbar does not do is a 400 naming it.
#[tokio::test]
async fn fields_mlxbar_does_not_do_are_refused_by_name() {
    let cases = [
        ("/v1/chat/completions", json!({"n": 3}), "n"),
        ("/v1/chat/completions", json!({"audio": {"voice": "alloy", "format": "wav"}}), "audio"),
        ("/v1/chat/completions", json!({"modalities": ["text", "audio"]}), "modalities"),
        ("/v1/chat/completions", json!({"functions": [{"name": "f", "parameters": {}}]}), "functions"),
        ("/v1/chat/completions", json!({"function_call": "auto"}), "function_call"),
        ("/v1/chat/completions", json!({"prediction": {"type": "content", "content": 5}}), "prediction"),
        ("/v1/chat/completions", json!({"reasoning_effort": "low"}), "reasoning_effort"),
        ("/v1/chat/completions", json!({"web_search_options": {}}), "web_search_options"),
        ("/v1/chat/completions", json!({"store": true}), "store"),
        ("/v1/chat/completions", json!({"service_tier": "flex"}), "service_tier"),
        ("/v1/chat/completions", json!({"top_logprobs": 2}), "top_logprobs"),
        ("/v1/chat/completions", json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        ("/v1/chat/completions", json!({"tool_choice": "required"}), "tool_choice"),
        ("/v1/chat/completions", json!({"logit_bias": {"hello": 1}}), "logit_bias"),
        ("/v1/chat/completions", json!({"logit_bias": {"5": 101}}), "logit_bias"),
        ("/v1/chat/completions", json!({"presence_penalty": 2.5}), "presence_penalty"),
        ("/v1/chat/completions", json!({"made_up_field": 1}), "made_up_field"),
        ("/v1/completions", json!({"echo": true}), "echo"),
        ("/v1/completions", json!({"suffix": "x"}), "suffix"),
        ("/v1/completions", json!({"best_of": 2}), "best_of"),
        ("/v1/completions", json!({"logprobs": 6}), "logprobs"),
    ];
    for (path, extra, name) in cases {
        let mut b = if path == "/v1/completions" { json!({"prompt": "hi", "max_tokens": 2}) } else { chat("hi") };
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, body) = post(path, b).await;
        assert_eq!(status, 400, "{extra}: {body}");
        assert_error(&body, "invalid_request_error");
        assert!(body["error"]["message"].as_str().unwrap().contains(name), "{extra}: {body}");
    }
    // Message-level fields too: image parts, names, tool fields on the wrong roles.
    for (message, name) in [
        (json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}), "image_url"),
        (json!({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}), "input_audio"),
        (json!({"role": "user", "content": "hi", "name": "ana"}), "name"),
        (json!({"role": "tool", "content": "18 C"}), "tool_call_id"),
        (json!({"role": "user", "content": "hi", "tool_call_id": "call_1"}), "tool_call_id"),
        (json!({"role": "user", "content": "hi", "mood": "happy"}), "mood"),
    ] {
        let (status, body) = post("/v1/chat/completions", json!({"messages": [message], "max_tokens": 2})).await;
        assert_eq!(status, 400, "{message}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(name), "{message}: {body}");
    }
}

/// logit_bias and the penalties change what is sampled.
#[tokio::test]
async fn logit_bias_and_penalties_steer_the_answer() {
    let answer = |extra: Value| async move {
        let mut b = chat("Say hello.");
        b["max_tokens"] = json!(12);
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, body) = post("/v1/chat/completions", b).await;
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    };
    let plain = answer(json!({})).await;
    // One token pushed far ahead is all a greedy answer says, max_tokens times over.
    let biased = answer(json!({"logit_bias": {"28": 100}})).await;
    assert_ne!(biased, plain);
    let piece = &biased[..biased.len() / 12];
    assert!(!piece.is_empty() && biased == piece.repeat(12), "{biased:?}");
    // A milder bias still repeats the token; a frequency penalty (2 per earlier use, on
    // the same bias) makes it say the token fewer times. Ignoring the penalty would give
    // the same greedy answer twice.
    let mild = answer(json!({"logit_bias": {"28": 5}})).await;
    let penalized = answer(json!({"logit_bias": {"28": 5}, "frequency_penalty": 2.0})).await;
    let uses = |s: &str| s.matches(piece).count();
    assert!(uses(&mild) >= 3, "bias 5 alone repeats {piece:?}: {mild:?}");
    assert!(uses(&penalized) < uses(&mild), "penalized {penalized:?} vs {mild:?}");
}

/// A float32 server, shared by the tests that need float arithmetic.
fn float32_server() -> &'static str {
    static BASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BASE.get_or_init(|| common::start_server(common::float32_config()))
}

/// Logprobs are the model's own: at each greedy step the top-10 logprobs differ from the
/// first by what the reference logits (Python mlx-lm, float32, tests/data/reference.json)
/// differ by. On the float32 server: the arithmetic the reference runs (the default
/// format's int8 activations move logits by up to ~1, reference.rs); the tolerance is
/// summation order across implementations (float32 logits agree within 2e-4 in
/// reference.rs; a difference of two is within twice that, plus the softmax's rounding).
#[tokio::test]
async fn logprob_values_are_the_models_logit_differences() {
    let reference = common::reference();
    let case = &reference["prompts"][0];
    let steps = case["step_top10"].as_array().unwrap();
    let mut body = json!({"messages": case["messages"], "temperature": 0, "logprobs": true, "top_logprobs": 10});
    body["max_tokens"] = json!(steps.len());
    let resp = client().post(format!("{}/v1/chat/completions", float32_server())).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    // The last reference step is the end-of-turn token, which ends the answer unshown.
    let content = answer["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), steps.len() - 1, "{answer}");
    for (n, (got, want)) in content.iter().zip(steps).enumerate() {
        let logprobs: Vec<f64> = got["top_logprobs"].as_array().unwrap().iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        let logits: Vec<f64> = want.as_array().unwrap().iter().map(|t| t["logit"].as_f64().unwrap()).collect();
        assert_eq!(logprobs.len(), 10, "step {n}: {got}");
        assert!((got["logprob"].as_f64().unwrap() - logprobs[0]).abs() < 1e-6, "step {n}: the greedy token is the top one: {got}");
        for i in 1..10 {
            let (ours, theirs) = (logprobs[i] - logprobs[0], logits[i] - logits[0]);
            assert!((ours - theirs).abs() < 2e-3, "step {n}, rank {i}: logprob gap {ours} vs the reference's logit gap {theirs}");
        }
    }
}

#[tokio::test]
async fn foreign_host_headers_are_refused() {
    let c = client();
    let resp = c.get(format!("{}/v1/models", common::server())).header("host", "evil.example:8080").send().await.unwrap();
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "host_not_allowed");
    let resp = c.get(format!("{}/v1/models", common::server())).header("host", "localhost:8080").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    // no CORS headers for a foreign origin
    let resp = c.get(format!("{}/v1/models", common::server())).header("origin", "http://evil.example").send().await.unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn engine_failure_is_a_500_and_the_server_keeps_serving() {
    let (status, body) = post("/v1/chat/completions", chat(&format!("please {}", common::FAIL_MARKER))).await;
    assert_eq!(status, 500, "{body}");
    assert_error(&body, "server_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("injected engine failure"));
    let (status, body) = post("/v1/chat/completions", chat(common::QUESTION)).await;
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["message"]["content"], common::ANSWER);
}

#[tokio::test]
async fn a_disconnected_stream_stops_its_generation() {
    // A server of its own, so its engine steps are this request's alone.
    let base = common::start_server(common::test_config());
    let c = client();
    let mut body = chat("Write a very long story about the ocean.");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(4000); // minutes of work, hundreds of tokens, if it went on
    let resp = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut stream = common::sse(resp);
    common::read_tokens(&mut stream, 2).await;
    let health: Value = c.get(format!("{base}/health")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["queue"]["running"], 1);
    let steps_before = common::metric_sum(&base, "mlxbar_engine_steps_total", &[]).await;
    drop(stream);
    // The engine drops it within a few steps (one step decodes one token for each running
    // request), and it is counted as cancelled with its KV released.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let health: Value = c.get(format!("{base}/health")).send().await.unwrap().json().await.unwrap();
        if health["queue"]["running"] == 0 && health["queue"]["waiting"] == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the abandoned request still runs: {health}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let steps = common::metric_sum(&base, "mlxbar_engine_steps_total", &[]).await - steps_before;
    assert!(steps < 16.0, "{steps} engine steps ran after the client left");
    assert_eq!(common::metric_sum(&base, "mlxbar_requests_total", &[r#"result="cancelled""#, r#"stream="true""#]).await, 1.0);
    assert_eq!(common::metric_sum(&base, "mlxbar_requests_total", &[]).await, 1.0, "and nothing else ended");
    assert_eq!(common::metric_sum(&base, "mlxbar_kv_cache_tokens", &[]).await, 0.0, "its KV is released");
    // and the server goes on serving
    let resp = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let base = common::start_server(mlxbar::Config { queue_capacity: 1, ..common::test_config() });
    let c = client();
    let mut long = chat("Write a very long story about the ocean.");
    long["stream"] = json!(true);
    long["max_tokens"] = json!(4000);
    long["temperature"] = json!(0.8);
    // 1: running. The role chunk goes out before the engine takes the request; a token
    // chunk after it means the engine has it.
    let running = c.post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap();
    let mut running = common::sse(running);
    common::read_tokens(&mut running, 1).await;
    // Then more streams: the engine drains its queue (capacity 1) once a step, so one of
    // them finds it full. The ones queued are held open.
    let mut held = vec![];
    let mut refused = None;
    for _ in 0..20 {
        let resp = c.post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap();
        if resp.status() == 429 {
            refused = Some(resp);
            break;
        }
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    let resp = refused.expect("a full queue answers 429");
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_error(&body, "rate_limit_error");
    assert_eq!(body["error"]["code"], "queue_full");
    drop(running);
    drop(held);
}

/// Two functions, as tests/sdk/openai_agents.py offers them: asked for the weather, the
/// default model calls get_weather, then, when parallel calls are allowed (OpenAI's default),
/// a second get_weather call (~37 tokens each).
fn weather_tools(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "get_time", "description": "Get the local time in a timezone", "parameters": {
                "type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"]}}}
        ],
        "tool_choice": "required",
        "temperature": 0
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// `tool_calls_cut_total` for the default model, from /metrics (0 before any cut).
async fn calls_cut() -> u64 {
    let text = client().get(format!("{}/metrics", common::server())).send().await.unwrap().text().await.unwrap();
    text.lines().find(|l| l.starts_with("mlxbar_tool_calls_cut_total{")).map_or(0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// With parallel calls allowed, a call `max_tokens` could not finish is not started: the
/// answer is the complete call, `finish_reason` "tool_calls", well under `max_tokens` (the
/// model wanted a second call, which 64 tokens would have cut: "length" and one call).
#[tokio::test]
async fn required_with_parallel_calls_does_not_start_a_call_max_tokens_would_cut() {
    for stream in [false, true] {
        let extra = if stream {
            json!({"max_tokens": 64, "stream": true, "stream_options": {"include_usage": true}})
        } else {
            json!({"max_tokens": 64})
        };
        let body = weather_tools(extra);
        let (finish, calls, used) = if stream {
            let resp = client().post(format!("{}/v1/chat/completions", common::server())).json(&body).send().await.unwrap();
            let chunks: Vec<Value> = futures::StreamExt::collect::<Vec<_>>(common::sse(resp))
                .await
                .into_iter()
                .filter(|e| e.data != "[DONE]")
                .map(|e| serde_json::from_str(&e.data).unwrap())
                .collect();
            let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string)).unwrap();
            let mut calls: Vec<(String, String)> = vec![];
            for d in chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten() {
                let i = d["index"].as_u64().unwrap() as usize;
                if calls.len() <= i {
                    calls.push((d["function"]["name"].as_str().unwrap().to_string(), String::new()));
                }
                calls[i].1.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
            }
            (finish, calls, chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap())
        } else {
            let (status, b) = post("/v1/chat/completions", body).await;
            assert_eq!(status, 200, "{b}");
            let calls = b["choices"][0]["message"]["tool_calls"].as_array().unwrap().iter();
            let calls = calls
                .map(|c| (c["function"]["name"].as_str().unwrap().to_string(), c["function"]["arguments"].as_str().unwrap().to_string()));
            (
                b["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
                calls.collect(),
                b["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        };
        assert_eq!(finish, "tool_calls", "stream {stream}: {calls:?}");
        assert!(used <= 48, "stream {stream}: {used} tokens");
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].0, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].1).unwrap();
        assert_eq!(args["city"], "Paris", "{args}");
    }
    // With room for both, both come.
    let (_, b) = post("/v1/chat/completions", weather_tools(json!({"max_tokens": 200}))).await;
    assert_eq!(b["choices"][0]["finish_reason"], "tool_calls", "{b}");
    assert_eq!(b["choices"][0]["message"]["tool_calls"].as_array().unwrap().len(), 2, "{b}");
}

/// A call `max_tokens` cuts anyway (inside the first one, or inside its opener) is said:
/// `finish_reason` "length", no call and no text (the cut opener is not content), and
/// /metrics counts it.
#[tokio::test]
async fn a_tool_call_cut_by_max_tokens_is_said_and_counted() {
    for max_tokens in [2, 20] {
        let before = calls_cut().await;
        let (status, b) = post("/v1/chat/completions", weather_tools(json!({"max_tokens": max_tokens}))).await;
        assert_eq!(status, 200, "{b}");
        let choice = &b["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{b}");
        assert!(choice["message"].get("tool_calls").is_none_or(|c| c.as_array().unwrap().is_empty()), "{b}");
        assert_eq!(choice["message"]["content"], "", "max_tokens {max_tokens}: {b}");
        assert_eq!(calls_cut().await, before + 1, "max_tokens {max_tokens}");
    }
}

/// The Anthropic dialect over the same core: the same greedy answer as the chat route for
/// the same prompt (text, then a forced tool call with its arguments), its usage split into
/// cache reads and the rest, and every refusal in Anthropic's error shape with a fitting
/// status, from the route itself and from the guards in front of it.
#[tokio::test]
async fn anthropic_messages_answer_as_the_chat_route_does() {
    let base = common::server();
    let (status, openai) = post(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": common::QUESTION}], "temperature": 0, "max_tokens": 20}),
    )
    .await;
    assert_eq!(status, 200, "{openai}");
    let messages =
        json!({"model": "default", "max_tokens": 20, "temperature": 0, "messages": [{"role": "user", "content": common::QUESTION}]});
    let (status, anthropic) = post("/v1/messages", messages.clone()).await;
    assert_eq!(status, 200, "{anthropic}");
    assert_eq!(anthropic["content"], json!([{"type": "text", "text": openai["choices"][0]["message"]["content"]}]));
    assert_eq!(anthropic["stop_reason"], "end_turn");
    let (u, o) = (&anthropic["usage"], &openai["usage"]);
    assert_eq!(u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(), o["prompt_tokens"].as_u64().unwrap());
    assert_eq!(u["output_tokens"], o["completion_tokens"]);

    // A forced call: the same function and arguments through both dialects.
    let params = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": false});
    let ask = json!([{"role": "user", "content": "What is the weather like in Paris today?"}]);
    let (_, openai) = post(
        "/v1/chat/completions",
        json!({"messages": ask, "temperature": 0, "max_tokens": 60, "tool_choice": "required", "parallel_tool_calls": false,
               "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]}),
    )
    .await;
    let (status, anthropic) = post(
        "/v1/messages",
        json!({"model": "default", "messages": ask, "temperature": 0, "max_tokens": 60,
               "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
               "tools": [{"name": "get_weather", "input_schema": params}]}),
    )
    .await;
    assert_eq!(status, 200, "{anthropic}");
    let call = &openai["choices"][0]["message"]["tool_calls"][0]["function"];
    let uses: Vec<&Value> = anthropic["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").collect();
    assert_eq!(uses.len(), 1, "{anthropic}");
    assert_eq!(uses[0]["name"], call["name"]);
    assert_eq!(uses[0]["input"], serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap());
    assert!(uses[0]["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(anthropic["stop_reason"], "tool_use");

    // Refusals, each in Anthropic's shape and naming what is wrong.
    let refused = |body: Value, status: u16, kind: &'static str, names: &'static str| async move {
        let (got, e) = post("/v1/messages", body).await;
        assert_eq!((got, e["type"].as_str(), e["error"]["type"].as_str()), (status, Some("error"), Some(kind)), "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(names), "{names}: {e}");
    };
    let with = |field: &str, value: Value| {
        let mut b = messages.clone();
        b[field] = value;
        b
    };
    refused(json!({"model": "default", "messages": []}), 400, "invalid_request_error", "max_tokens").await;
    refused(with("model", json!("nobody/nothing")), 404, "not_found_error", "nobody/nothing").await;
    refused(with("bogus", json!(1)), 400, "invalid_request_error", "bogus").await;
    refused(with("thinking", json!({"type": "enabled", "budget_tokens": 1024})), 400, "invalid_request_error", "thinking").await;
    refused(
        with("messages", json!([{"role": "user", "content": [{"type": "image", "source": {}}]}])),
        400,
        "invalid_request_error",
        "image",
    )
    .await;
    refused(
        with("messages", json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}])),
        400,
        "invalid_request_error",
        "prefill",
    )
    .await;
    refused(
        with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}])),
        400,
        "invalid_request_error",
        "web_search_20250305",
    )
    .await;
    refused(with("output_config", json!({"effort": "high"})), 400, "invalid_request_error", "effort").await;
    // From the guards: a form post, a foreign origin, a body past the limit.
    let url = format!("{base}/v1/messages");
    let r = client().post(&url).header("content-type", "text/plain").body(messages.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "invalid_request_error");
    let r = client().post(&url).header("origin", "http://evil.example").json(&messages).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "permission_error");
    let (status, e) = raw_post_declaring(&url, 1 << 30).await;
    assert_eq!((status, e["error"]["type"].as_str()), (413, Some("request_too_large")), "{e}");

    // count_tokens: the prompt as the model sees it.
    let (status, counted) =
        post("/v1/messages/count_tokens", json!({"model": "default", "messages": [{"role": "user", "content": common::QUESTION}]})).await;
    assert_eq!((status, counted["input_tokens"].as_u64()), (200, o["prompt_tokens"].as_u64()), "{counted}");
}

/// What one route answered, in common terms: the text and the prompt and answer tokens.
type Said = (String, u64, u64);

/// `QUESTION` greedily through every route that answers a conversation or a prompt, on
/// `base`: each route's text and token counts (a prompt reused from the prefix cache counts
/// too).
async fn greedy_through_every_route(base: &str) -> Vec<(&'static str, Said)> {
    let ask = json!([{"role": "user", "content": common::QUESTION}]);
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("a count: {v}"));
    let text = |v: &Value| v.as_str().unwrap_or_else(|| panic!("a text: {v}")).to_string();
    let mut said = vec![];
    let (status, b) = post_at(base, "/v1/chat/completions", json!({"messages": ask, "temperature": 0, "max_tokens": 40})).await;
    assert_eq!(status, 200, "{b}");
    said.push((
        "chat",
        (text(&b["choices"][0]["message"]["content"]), n(&b["usage"]["prompt_tokens"]), n(&b["usage"]["completion_tokens"])),
    ));
    // The chat route's prompt as text: SmolLM2's template with its default system message
    // (the prompt token count says it is the same prompt).
    let prompt = format!(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        common::QUESTION
    );
    let (status, b) = post_at(base, "/v1/completions", json!({"prompt": prompt, "temperature": 0, "max_tokens": 40})).await;
    assert_eq!(status, 200, "{b}");
    said.push(("completions", (text(&b["choices"][0]["text"]), n(&b["usage"]["prompt_tokens"]), n(&b["usage"]["completion_tokens"]))));
    let (status, b) = post_at(base, "/v1/messages", json!({"model": "default", "messages": ask, "temperature": 0, "max_tokens": 40})).await;
    assert_eq!(status, 200, "{b}");
    let u = &b["usage"];
    said.push((
        "messages",
        (text(&b["content"][0]["text"]), n(&u["input_tokens"]) + n(&u["cache_read_input_tokens"]), n(&u["output_tokens"])),
    ));
    let (status, b) = post_at(base, "/v1/responses", json!({"input": common::QUESTION, "temperature": 0, "max_output_tokens": 40})).await;
    assert_eq!(status, 200, "{b}");
    said.push((
        "responses",
        (text(&b["output"][0]["content"][0]["text"]), n(&b["usage"]["input_tokens"]), n(&b["usage"]["output_tokens"])),
    ));
    let options = json!({"temperature": 0, "num_predict": 40});
    let model = "default";
    let (status, b) = post_at(base, "/api/chat", json!({"model": model, "messages": ask, "stream": false, "options": options})).await;
    assert_eq!(status, 200, "{b}");
    said.push(("ollama chat", (text(&b["message"]["content"]), n(&b["prompt_eval_count"]), n(&b["eval_count"]))));
    let (status, b) =
        post_at(base, "/api/generate", json!({"model": model, "prompt": common::QUESTION, "stream": false, "options": options})).await;
    assert_eq!(status, 200, "{b}");
    said.push(("ollama generate", (text(&b["response"]), n(&b["prompt_eval_count"]), n(&b["eval_count"]))));
    said
}

/// The same prompt greedily through every API gives the OpenAI chat route's text and token
/// counts, on float32 weights and on the default (packed 4-bit) format: each dialect only
/// translates.
#[tokio::test]
async fn greedy_answers_are_the_same_through_every_api_in_both_formats() {
    for (format, base) in [("float32", float32_server()), ("default", common::server())] {
        let said = greedy_through_every_route(base).await;
        let (_, chat) = &said[0];
        assert_eq!(chat.0, common::ANSWER, "{format}");
        for (route, s) in &said {
            assert_eq!(s, chat, "{format}: {route} against the chat route");
        }
    }
}

/// Tool settings without tools follow one rule on every route: what only allows or limits
/// calls (`auto`, `none`, parallel calls on or off) holds already when there are no tools and
/// is accepted, the answer the plain one; what demands a call is a 400 naming `tool_choice`,
/// in the route's error shape.
#[tokio::test]
async fn tool_settings_without_tools_follow_one_rule_on_every_route() {
    let ask = json!([{"role": "user", "content": common::QUESTION}]);
    let chat_text = |b: &Value| b["choices"][0]["message"]["content"].clone();
    let responses_text = |b: &Value| b["output"][0]["content"][0]["text"].clone();
    let messages_text = |b: &Value| b["content"][0]["text"].clone();
    /// A route's request, the settings it accepts and refuses without tools, and where its text is.
    type Route = (&'static str, Value, Vec<Value>, Vec<Value>, fn(&Value) -> Value);
    let routes: [Route; 3] = [
        (
            "/v1/chat/completions",
            json!({"messages": ask, "temperature": 0, "max_tokens": 40}),
            vec![
                json!({"parallel_tool_calls": true}),
                json!({"parallel_tool_calls": false}),
                json!({"tool_choice": "auto"}),
                json!({"tool_choice": "none", "parallel_tool_calls": false}),
            ],
            vec![json!({"tool_choice": "required"}), json!({"tool_choice": {"type": "function", "function": {"name": "f"}}})],
            chat_text,
        ),
        (
            "/v1/responses",
            json!({"input": common::QUESTION, "temperature": 0, "max_output_tokens": 40}),
            vec![
                json!({"parallel_tool_calls": true}),
                json!({"parallel_tool_calls": false}),
                json!({"tool_choice": "auto"}),
                json!({"tool_choice": "none", "parallel_tool_calls": false}),
            ],
            vec![json!({"tool_choice": "required"}), json!({"tool_choice": {"type": "function", "name": "f"}})],
            responses_text,
        ),
        (
            "/v1/messages",
            json!({"model": "default", "messages": ask, "temperature": 0, "max_tokens": 40}),
            vec![
                json!({"tool_choice": {"type": "auto"}}),
                json!({"tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
                json!({"tool_choice": {"type": "none"}}),
            ],
            vec![json!({"tool_choice": {"type": "any"}}), json!({"tool_choice": {"type": "tool", "name": "f"}})],
            messages_text,
        ),
    ];
    for (path, body, accepted, refused, text) in routes {
        let with = |extra: &Value| {
            let mut b = body.clone();
            b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            b
        };
        for extra in &accepted {
            let (status, b) = post(path, with(extra)).await;
            assert_eq!(status, 200, "{path} {extra}: {b}");
            assert_eq!(text(&b), common::ANSWER, "{path} {extra}: {b}");
        }
        for extra in &refused {
            let (status, b) = post(path, with(extra)).await;
            assert_eq!(status, 400, "{path} {extra}: {b}");
            let message = b["error"]["message"].as_str().unwrap();
            assert!(message.contains("tool_choice") && message.contains("needs 'tools'"), "{path} {extra}: {b}");
        }
    }
}

/// A call's arguments are one JSON object in every dialect: parameters that name no type are
/// decoded as an object (the same object through all four routes, as text on the OpenAI ones,
/// as an object on Anthropic's and Ollama's, streamed or not), and parameters of another type
/// are refused on every route, in its error shape.
#[tokio::test]
async fn tool_arguments_are_one_object_in_every_dialect() {
    // No "type": an object all the same.
    let params = json!({"properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": false});
    let ask = json!([{"role": "user", "content": "What is the weather like in Paris today?"}]);
    let chat = |params: &Value| {
        json!({"messages": ask, "temperature": 0, "max_tokens": 60, "tool_choice": "required", "parallel_tool_calls": false,
               "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]})
    };
    let responses = |params: &Value| {
        json!({"input": ask, "temperature": 0, "max_output_tokens": 60, "tool_choice": "required", "parallel_tool_calls": false,
               "tools": [{"type": "function", "name": "get_weather", "parameters": params}]})
    };
    let messages = |params: &Value| {
        json!({"model": "default", "messages": ask, "temperature": 0, "max_tokens": 60,
               "tool_choice": {"type": "any", "disable_parallel_tool_use": true}, "tools": [{"name": "get_weather", "input_schema": params}]})
    };
    // Ollama has no tool choice: one example turn (a question and the assistant's call) makes
    // the default model's own greedy answer to the next question a call.
    let ollama = |params: &Value| {
        json!({"model": "default", "stream": false, "options": {"temperature": 0, "num_predict": 60},
               "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": params}}],
               "messages": [
                   {"role": "user", "content": "What is the weather like in Rome today?"},
                   {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
                   {"role": "user", "content": "What is the weather like in Paris today?"}]})
    };
    let (status, b) = post("/v1/chat/completions", chat(&params)).await;
    assert_eq!(status, 200, "{b}");
    let call = &b["choices"][0]["message"]["tool_calls"][0]["function"];
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object() && args["city"].is_string(), "{b}");
    let (status, b) = post("/v1/responses", responses(&params)).await;
    assert_eq!(status, 200, "{b}");
    let item = b["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").unwrap_or_else(|| panic!("{b}"));
    assert_eq!(serde_json::from_str::<Value>(item["arguments"].as_str().unwrap()).unwrap(), args, "{b}");
    let (status, b) = post("/v1/messages", messages(&params)).await;
    assert_eq!(status, 200, "{b}");
    let use_ = b["content"].as_array().unwrap().iter().find(|c| c["type"] == "tool_use").unwrap_or_else(|| panic!("{b}"));
    assert_eq!(use_["input"], args, "{b}");
    // Streamed, the input_json_delta pieces make the same object.
    let mut streamed = messages(&params);
    streamed["stream"] = json!(true);
    let resp = client().post(format!("{}/v1/messages", common::server())).json(&streamed).send().await.unwrap();
    let pieces: String = common::sse_data(resp)
        .await
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .map(|e| e["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&pieces).unwrap(), args);
    let (status, b) = post("/api/chat", ollama(&params)).await;
    assert_eq!(status, 200, "{b}");
    let call = &b["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{b}");
    assert!(call["arguments"].is_object() && call["arguments"]["city"].is_string(), "{b}");

    // Parameters of another type: refused everywhere, naming the type.
    let array = json!({"type": "array", "items": {"type": "string"}});
    for (path, body) in [
        ("/v1/chat/completions", chat(&array)),
        ("/v1/responses", responses(&array)),
        ("/v1/messages", messages(&array)),
        ("/api/chat", ollama(&array)),
    ] {
        let (status, b) = post(path, body).await;
        assert_eq!(status, 400, "{path}: {b}");
        let message = if path == "/api/chat" { &b["error"] } else { &b["error"]["message"] };
        let message = message.as_str().unwrap_or_else(|| panic!("{path}: {b}"));
        assert!(message.contains("type \"object\"") && message.contains("\"array\""), "{path}: {b}");
        if path == "/v1/messages" {
            assert_eq!(b["type"], "error", "{b}");
        }
    }
}

/// Ollama's `options.num_ctx` is the window prompt and answer share, as in Ollama: the answer
/// ends at its edge (`done_reason: "length"`) whatever `num_predict` asks; a conversation
/// past it loses its oldest turns, the system message kept, as few as make it fit; a last
/// message that alone leaves no room is a 400.
#[tokio::test]
async fn ollama_num_ctx_is_the_window_prompt_and_answer_share() {
    let chat = |messages: Value, options: Value| async move {
        let mut o = json!({"temperature": 0});
        o.as_object_mut().unwrap().extend(options.as_object().unwrap().clone());
        post("/api/chat", json!({"model": "default", "messages": messages, "stream": false, "options": o})).await
    };
    let counts = |b: &Value| (b["prompt_eval_count"].as_u64().unwrap(), b["eval_count"].as_u64().unwrap());
    // The answer stops at the window's edge, with or without num_predict.
    let long = json!([{"role": "user", "content": "Write a very long story about the ocean."}]);
    for options in [json!({"num_ctx": 64}), json!({"num_ctx": 64, "num_predict": 500})] {
        let (status, b) = chat(long.clone(), options.clone()).await;
        assert_eq!((status, b["done_reason"].as_str()), (200, Some("length")), "{options}: {b}");
        let (prompt, answer) = counts(&b);
        assert_eq!(prompt + answer, 64, "{options}: {b}");
    }
    // A conversation past the window: its oldest turns go, the system message stays.
    let system = json!({"role": "system", "content": "You are a pirate."});
    let (old_question, old_answer) = ("Tell me about ships. ".repeat(20), "Ships are big. ".repeat(20));
    let recent = [json!({"role": "user", "content": "Hi!"}), json!({"role": "assistant", "content": "Ahoy!"})];
    let question = json!({"role": "user", "content": common::QUESTION});
    let conversation = json!([system, {"role": "user", "content": old_question}, {"role": "assistant", "content": old_answer}, recent[0], recent[1], question]);
    let prompt_of = |messages: Value| async move {
        let (status, b) = chat(messages, json!({"num_predict": 1})).await;
        assert_eq!(status, 200, "{b}");
        counts(&b).0
    };
    let whole = prompt_of(conversation.clone()).await;
    let kept = prompt_of(json!([system, recent[0], recent[1], question])).await;
    let last_only = prompt_of(json!([system, question])).await;
    let without_system = prompt_of(json!([recent[0], recent[1], question])).await;
    assert!(last_only < kept && kept < whole && without_system != kept, "{last_only} {kept} {whole} {without_system}");
    let window = kept + 8; // room for the recent turns, not for the old ones
    assert!(whole >= window);
    let (status, b) = chat(conversation.clone(), json!({"num_ctx": window, "num_predict": 4})).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(counts(&b), (kept, 4), "the old turns went, the recent ones and the system message stayed: {b}");
    // A last message that alone leaves no room: Ollama's error shape, naming the window.
    let (status, b) = chat(json!([{"role": "user", "content": "word ".repeat(100)}]), json!({"num_ctx": 50})).await;
    assert_eq!(status, 400, "{b}");
    assert!(b["error"].as_str().unwrap().contains("context window of 50 tokens"), "{b}");
    // Generate has one message: a prompt past the window is refused, one inside it is answered.
    let (status, b) =
        post("/api/generate", json!({"model": "default", "prompt": "word ".repeat(100), "stream": false, "options": {"num_ctx": 50}}))
            .await;
    assert_eq!(status, 400, "{b}");
    let (status, b) =
        post("/api/generate", json!({"model": "default", "prompt": common::QUESTION, "stream": false, "options": {"num_ctx": 40}})).await;
    assert_eq!((status, b["done_reason"].as_str()), (200, Some("length")), "{b}");
    assert_eq!(b["prompt_eval_count"].as_u64().unwrap() + b["eval_count"].as_u64().unwrap(), 40, "{b}");
}
