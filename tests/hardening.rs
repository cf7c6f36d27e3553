//! The local API against hostile pages, overload and faults, through real sockets on the
//! real engine: drive-by requests, /health's redaction, /v1/responses's refusals, bounded metric labels, the queue
//! bound, a dead or stalled engine and its reload, a client leaving during prefill, an
//! unwritable data dir; the Ollama routes' bad input in Ollama's error shape. (Process-level cases, SIGTERM and a taken port, are in
//! tests/process.rs; the memory limit in tests/memory_limit.rs.)
mod common;

use std::time::Duration;

use futures::StreamExt;
use mlxbar::engine::faults;
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = client().get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn metrics(base: &str) -> String {
    client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap()
}

/// The value of one unlabelled (or exactly labelled) sample in Prometheus text.
fn sample(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' '))).map(|v| v.parse().unwrap()).unwrap_or(f64::NAN)
}

/// A POST that declares a `length`-byte JSON body and sends one byte of it.
async fn post_declaring(url: &str, length: usize) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let u = reqwest::Url::parse(url).unwrap();
    let mut sock = tokio::net::TcpStream::connect((u.host_str().unwrap(), u.port().unwrap())).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{{",
        u.path()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), sock.read_to_end(&mut raw)).await.expect("an answer in time").unwrap();
    let text = String::from_utf8_lossy(&raw);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (text[9..12].parse().unwrap(), serde_json::from_str(body).unwrap_or(Value::Null))
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

/// Starts a streamed chat and returns its event stream once a token has arrived (the
/// engine has admitted it).
async fn stream_until_token(base: &str, body: Value) -> common::Sse {
    let mut body = body;
    body["stream"] = json!(true);
    let resp = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = common::sse(resp);
    common::read_tokens(&mut stream, 1).await;
    stream
}

#[tokio::test]
async fn drive_by_requests_from_web_pages_change_nothing() {
    let base = common::server();
    let http = client();
    let before = metrics(base).await;
    // What a page's `fetch(url, {method: "POST", body})` sends: text/plain, its Origin.
    for (path, body) in [
        ("/api/bench", r#"{"profile":"standard"}"#),
        ("/api/alerts/memory_pressure_warn/snooze", r#"{"seconds":604800}"#),
        ("/v1/chat/completions", r#"{"messages":[{"role":"user","content":"hi"}]}"#),
        ("/v1/responses", r#"{"input":"hi"}"#),
        // Ollama's routes, Ollama's clients' bodies (their errors in Ollama's shape).
        ("/api/chat", r#"{"model":"default","messages":[{"role":"user","content":"hi"}]}"#),
        ("/api/generate", r#"{"model":"default","prompt":"hi"}"#),
        ("/api/pull", r#"{"model":"org/name"}"#),
    ] {
        let ollama = path.starts_with("/api/") && !path.starts_with("/api/bench") && !path.starts_with("/api/alerts");
        let code = |e: &Value, code: &str| match ollama {
            // {"error": "message"}: the words say what the code says.
            true => assert!(
                e["error"].as_str().is_some_and(|m| m.contains(if code == "origin_not_allowed" { "rigin" } else { "Content-Type" })),
                "{path}: {e}"
            ),
            false => assert_eq!(e["error"]["code"], code, "{path}: {e}"),
        };
        let r = http
            .post(format!("{base}{path}"))
            .header("content-type", "text/plain;charset=UTF-8")
            .header("origin", "https://evil.example")
            .header("sec-fetch-site", "cross-site")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{path}");
        let e: Value = r.json().await.unwrap();
        code(&e, "origin_not_allowed");
        // Without an Origin (curl) the wrong type is a 415, in the same error shape.
        let r = http.post(format!("{base}{path}")).header("content-type", "text/plain").body(body).send().await.unwrap();
        assert_eq!(r.status(), 415, "{path}");
        code(&r.json::<Value>().await.unwrap(), "unsupported_media_type");
        // JSON from another port of localhost: another origin.
        let r = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .header("origin", "http://127.0.0.1:1")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{path}");
    }
    // Nothing happened: no bench job, no snooze, no generation counted, no pull.
    let (_, pulls) = get_json(&format!("{base}/api/models/pulls")).await;
    assert_eq!(pulls["data"], json!([]), "{pulls}");
    let (_, jobs) = get_json(&format!("{base}/api/bench")).await;
    assert!(jobs["active"].is_null(), "{jobs}");
    let (_, alerts) = get_json(&format!("{base}/api/alerts")).await;
    assert!(alerts["data"].as_array().unwrap().iter().all(|a| a["snoozed"] == false), "{alerts}");
    // Each was refused before any handler ran (other tests of this binary get no 403/415).
    let after = metrics(base).await;
    let refused = |t: &str, code: &str| {
        t.lines()
            .filter(|l| l.starts_with("mlxbar_http_requests_total") && l.contains(&format!("status=\"{code}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    assert_eq!(refused(&after, "403") - refused(&before, "403"), 14.0);
    assert_eq!(refused(&after, "415") - refused(&before, "415"), 7.0);
    // The same request the SDKs send still works: JSON, no Origin.
    let r = http.post(format!("{base}/v1/chat/completions")).json(&chat("Hi", 2)).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn health_beyond_loopback_says_only_its_state_without_the_key() {
    let base = common::start_server(mlxbar::Config { api_key: Some("s3cret".into()), ..common::test_config() });
    let r = client().get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}), "no model path, no error text");
    let r = client().get(format!("{base}/health")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    let full: Value = client().get(format!("{base}/health")).bearer_auth("s3cret").send().await.unwrap().json().await.unwrap();
    assert_eq!(full["state"], "ready");
    assert!(full["model"]["path"].as_str().unwrap().ends_with(".gguf"), "{full}");
    assert_eq!(client().get(format!("{base}/metrics")).send().await.unwrap().status(), 401);
}

#[tokio::test]
async fn metric_labels_stay_bounded_whatever_clients_send() {
    // A server of its own: other tests' requests would add their own (bounded) series.
    let base = &*Box::leak(common::start_server(common::test_config()).into_boxed_str());
    let http = client();
    let series = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    // One of each kind first, so every label value these requests can reach exists.
    let hit = |model: String, path: String| {
        let http = http.clone();
        async move {
            let _ = http
                .post(format!("{base}/v1/chat/completions"))
                .json(&json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}))
                .send()
                .await
                .unwrap();
            let _ = http.get(format!("{base}/{path}")).send().await.unwrap();
        }
    };
    hit("warm-up-model".into(), "warm/up".into()).await;
    let baseline = series(&metrics(base).await);
    let names: Vec<(String, String)> =
        (0..1000).map(|i| (format!("model-{i}-{}", rand::random::<u32>()), format!("p{i}/{}?q={i}", rand::random::<u32>()))).collect();
    futures::stream::iter(names).for_each_concurrent(32, |(m, p)| hit(m, p)).await;
    let after = metrics(base).await;
    let added: Vec<_> = series(&after).difference(&baseline).cloned().collect();
    assert!(added.is_empty(), "1,000 unknown models and paths added series: {added:?}");
    assert!(!after.contains("model-1-") && !after.contains("p1/"));
}

#[tokio::test]
async fn the_queue_bound_holds_deterministically() {
    // One running, one waiting: the third is refused, whatever the engine's timing.
    let base = common::start_server(mlxbar::Config { max_batch: 1, queue_capacity: 1, ..common::test_config() });
    let long = json!({"messages": [{"role": "user", "content": "Write a very long story about the ocean."}], "max_tokens": 4000, "temperature": 0.8});
    let running = stream_until_token(&base, long.clone()).await;
    let mut queued = long.clone();
    queued["stream"] = json!(true);
    let waiting = client().post(format!("{base}/v1/chat/completions")).json(&queued).send().await.unwrap();
    assert_eq!(waiting.status(), 200, "the second waits in the queue");
    let refused = client().post(format!("{base}/v1/chat/completions")).json(&chat("Hi", 2)).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let retry: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=300).contains(&retry), "{retry}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let (_, health) = get_json(&format!("{base}/health")).await;
    assert_eq!((health["queue"]["running"].clone(), health["queue"]["waiting"].clone()), (json!(1), json!(1)));
    drop(running);
    drop(waiting);
    // Both leave: the engine is free again and the next request is served.
    common::until("the queue to empty", 60, async || {
        let (_, h) = get_json(&format!("{base}/health")).await;
        (h["queue"]["running"] == 0 && h["queue"]["waiting"] == 0).then_some(())
    })
    .await;
    let r = client().post(format!("{base}/v1/chat/completions")).json(&chat("Hi", 2)).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_500_ends_each_request_complete_or_429() {
    let base = common::start_server(mlxbar::Config { queue_capacity: 16, ..common::test_config() });
    // A fresh connection per request: a pooled keep-alive connection that the server gives
    // to a newcomer (it waited on its client past EVICT_AFTER) can be reused by the client at
    // that very moment, HTTP/1.1's known race (a reset of a request the server never read,
    // which clients retry); seen once here with another test loading both cores.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(300)).pool_max_idle_per_host(0).build().unwrap();
    let burst = futures::future::join_all((0..500).map(|i| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let body = json!({"messages": [{"role": "user", "content": format!("Say {i}")}], "max_tokens": 2, "temperature": 0});
            let r = http.post(format!("{base}/v1/chat/completions")).json(&body).send().await.expect("every request is answered");
            let status = r.status().as_u16();
            let retry = r.headers().get("retry-after").is_some();
            let v: Value = r.json().await.expect("a JSON body");
            match status {
                200 => assert!(v["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0, "{v}"),
                429 => assert!(retry && v["error"]["code"] == "queue_full", "{v}"),
                other => panic!("request {i}: {other} {v}"),
            }
            status
        }
    }));
    // /health and /metrics keep answering while the burst is on.
    let probes = async {
        let mut answered = 0;
        for _ in 0..10 {
            assert_eq!(client().get(format!("{base}/health")).timeout(Duration::from_secs(10)).send().await.unwrap().status(), 200);
            assert_eq!(client().get(format!("{base}/metrics")).timeout(Duration::from_secs(10)).send().await.unwrap().status(), 200);
            answered += 1;
        }
        answered
    };
    let (statuses, answered) = tokio::join!(burst, probes);
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(ok + statuses.iter().filter(|&&s| s == 429).count(), 500);
    assert!(ok >= 17, "at least a batch and a full queue were served ({ok})");
    assert_eq!(answered, 10);
    let (_, h) = get_json(&format!("{base}/health")).await;
    assert_eq!((h["queue"]["running"].clone(), h["queue"]["waiting"].clone()), (json!(0), json!(0)), "nothing left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_reports_failed_and_reloads() {
    let base = common::start_server(common::test_config());
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat(&format!("please {}", faults::KILL_ENGINE), 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500, "the request in flight ends with an error");
    let health = common::until("health to say failed", 30, async || {
        let (status, h) = get_json(&format!("{base}/health")).await;
        (status == 503 && h["status"] == "failed").then_some(h)
    })
    .await;
    assert!(health["detail"].as_str().unwrap().contains("engine thread died"), "{health}");
    let r = client().post(format!("{base}/v1/chat/completions")).json(&chat("Hi", 2)).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("engine thread died"));
    assert_eq!(sample(&metrics(&base).await, "mlxbar_engine_failed"), 1.0);
    common::until("engine_error to fire", 30, async || {
        let (_, a) = get_json(&format!("{base}/api/alerts")).await;
        a["data"].as_array().unwrap().iter().any(|a| a["id"] == "engine_error" && a["firing"] == true).then_some(())
    })
    .await;

    // Reload: a fresh engine thread loads the model; the server serves again.
    let r = client().post(format!("{base}/api/engine/reload")).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 202);
    common::until("the reloaded model", 120, async || (get_json(&format!("{base}/health")).await.0 == 200).then_some(())).await;
    let r = client().post(format!("{base}/v1/chat/completions")).json(&chat(common::QUESTION, 16)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["choices"][0]["message"]["content"], common::ANSWER);
    assert_eq!(sample(&metrics(&base).await, "mlxbar_engine_failed"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_engine_is_noticed_by_the_watchdog() {
    let base = common::start_server(mlxbar::Config { stall_seconds: 1.0, ..common::test_config() });
    let body = chat(&format!("{} Hi", faults::STALL), 3);
    let stuck = tokio::spawn({
        let base = base.clone();
        async move { client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap().status() }
    });
    let health = common::until("health to say stalled", 30, async || {
        let (status, h) = get_json(&format!("{base}/health")).await;
        (status == 503 && h["status"] == "stalled").then_some(h)
    })
    .await;
    assert!(health["last_step_age_seconds"].as_f64().unwrap() >= 1.0, "{health}");
    assert!(sample(&metrics(&base).await, "mlxbar_engine_last_step_age_seconds") >= 1.0);
    let (_, snap) = get_json(&format!("{base}/api/metrics/snapshot")).await;
    assert_eq!(snap["scheduler"]["health"], "stalled");
    common::until("engine_stalled to fire", 60, async || {
        let (_, a) = get_json(&format!("{base}/api/alerts")).await;
        a["data"].as_array().unwrap().iter().any(|a| a["id"] == "engine_stalled" && a["firing"] == true).then_some(())
    })
    .await;
    faults::release_stalls();
    assert_eq!(stuck.await.unwrap(), 200, "the stalled request completes once the step goes on");
    common::until("health to recover", 30, async || (get_json(&format!("{base}/health")).await.0 == 200).then_some(())).await;
    assert_eq!(sample(&metrics(&base).await, "mlxbar_engine_last_step_age_seconds"), 0.0, "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_during_prefill_stops_it_and_frees_its_kv() {
    let base = common::start_server(common::test_config());
    let before = metrics(&base).await;
    // ~6,000 prompt tokens: 12 prefill chunks of 512.
    let prompt = "ocean ".repeat(6000);
    let resp = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut stream = common::sse(resp);
    // The role chunk goes out at once; the prompt is being prefilled now.
    let role: Value = serde_json::from_str(&stream.next().await.unwrap().data).unwrap();
    assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
    common::until("the engine to take the request", 30, async || {
        (get_json(&format!("{base}/health")).await.1["queue"]["running"] == 1).then_some(())
    })
    .await;
    drop(stream);
    common::until("the request to end", 60, async || (get_json(&format!("{base}/health")).await.1["queue"]["running"] == 0).then_some(()))
        .await;
    let after = metrics(&base).await;
    let steps = sample(&after, "mlxbar_engine_steps_total") - sample(&before, "mlxbar_engine_steps_total");
    assert!(steps < 12.0, "the prefill stopped early: {steps} steps ran of the 12 it needed");
    assert_eq!(sample(&after, "mlxbar_kv_cache_tokens"), 0.0, "its KV is released");
    assert_eq!(sample(&after, "mlxbar_kv_cache_reserved_tokens"), 0.0);
}

#[tokio::test]
async fn an_unwritable_data_dir_refuses_a_bench_and_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let base = common::start_server(mlxbar::Config { data_dir: Some(file.join("data")), ..common::test_config() });
    let r = client().post(format!("{base}/api/bench")).json(&json!({"profile": "quick"})).send().await.unwrap();
    assert_eq!(r.status(), 507);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "data_dir_unwritable");
    assert!(e["error"]["message"].as_str().unwrap().contains("not-a-dir"), "{e}");
    let (_, jobs) = get_json(&format!("{base}/api/bench")).await;
    assert!(jobs["active"].is_null());
    let r = client().post(format!("{base}/v1/chat/completions")).json(&chat("Hi", 2)).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn request_limits_are_clear_400s() {
    let base = common::server();
    // Two JSON values in one body (the second would otherwise be ignored).
    let r = client()
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(r#"{"prompt":"a","max_tokens":1}{"prompt":"b"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("after the JSON body"));
    for (extra, param) in [
        (json!({"stop": ["x".repeat(300)]}), "stop"),
        (json!({"stop": [""]}), "stop"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"n": 3}), "n"),
        (json!({"max_tokens": 8190}), "messages"),
    ] {
        let mut body = chat("Hi", 2);
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{extra}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["param"], param, "{extra}: {e}");
    }
}

#[tokio::test]
async fn responses_refuse_bad_bodies_in_openais_shape() {
    let base = common::server();
    let url = format!("{base}/v1/responses");
    // Past the body limit: refused on the declared length, before the upload.
    let (status, e) = post_declaring(&url, 1 << 30).await;
    assert_eq!((status, e["error"]["code"].as_str()), (413, Some("payload_too_large")), "{e}");
    for (body, param, names) in [
        (json!({"input": 5}), None, "input"),
        (json!({"input": "hi", "temperature": "hot"}), None, "temperature"),
        (json!({"input": "hi", "bogus": 1}), None, "bogus"),
        (json!({"input": "hi", "store": true}), Some("store"), "store"),
        (json!({"input": "hi", "previous_response_id": "resp_1"}), Some("previous_response_id"), "previous_response_id"),
        (json!({"input": []}), Some("input"), "at least one item"),
        (json!({"input": [{"role": "robot", "content": "x"}]}), Some("input"), "input[0].role"),
        (json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}), Some("input"), "input_image"),
        (json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), Some("input"), "item references"),
        (json!({"input": "hi", "tools": [{"type": "web_search"}]}), Some("tools"), "web_search"),
        (json!({"input": "hi", "tool_choice": "required"}), Some("tool_choice"), "needs 'tools'"),
        (json!({"input": "hi", "include": ["file_search_call.results"]}), Some("include"), "file_search_call.results"),
        (json!({"input": "hi", "text": {"format": {"type": "yaml"}}}), Some("text"), "yaml"),
        (json!({"input": "hi", "max_output_tokens": 0}), Some("max_output_tokens"), "max_output_tokens"),
        (
            json!({"input": "hi", "text": {"format": {"type": "json_object"}}, "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
            Some("text.format"),
            "text.format",
        ),
    ] {
        let r = client().post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["type"], "invalid_request_error", "{body}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(names), "{body}: {e}");
        if let Some(param) = param {
            assert_eq!(e["error"]["param"], param, "{body}: {e}");
        }
    }
}

/// The Ollama routes: bad input is a 400 (too large a 413) in Ollama's shape,
/// `{"error": "message"}` naming what is wrong, before any model work.
#[tokio::test]
async fn the_ollama_routes_answer_bad_input_in_ollamas_shape() {
    let base = common::server();
    let limit = mlxbar::Config::default().max_body_bytes;
    let post = |path: &'static str, body: String| {
        client().post(format!("{base}{path}")).header("content-type", "application/json").body(body).send()
    };
    let user = json!([{"role": "user", "content": "hi"}]);
    for (path, body, status, needle) in [
        ("/api/chat", json!({"model": "default", "messages": "hi"}).to_string(), 400, "messages"),
        ("/api/chat", json!({"model": 7, "messages": user}).to_string(), 400, "model"),
        ("/api/chat", json!({"model": "default", "messages": user, "stream": "yes"}).to_string(), 400, "stream"),
        (
            "/api/chat",
            json!({"model": "default", "messages": user, "options": {"temperature": "hot"}}).to_string(),
            400,
            "options.temperature",
        ),
        ("/api/chat", json!({"model": "default", "messages": user, "options": {"num_gpu": 1}}).to_string(), 400, "options.num_gpu"),
        ("/api/chat", json!({"model": "default", "messages": user, "bogus": 1}).to_string(), 400, "bogus"),
        ("/api/chat", json!({"model": "default", "messages": [{"role": "robot", "content": "x"}]}).to_string(), 400, "role"),
        ("/api/chat", json!({"model": "default", "messages": user, "keep_alive": "soon"}).to_string(), 400, "keep_alive"),
        ("/api/chat", json!({"model": "default", "messages": user, "tools": [{"type": "web"}]}).to_string(), 400, "tools[0].type"),
        ("/api/generate", json!({"model": "default", "prompt": "hi", "images": ["aGk="]}).to_string(), 400, "images"),
        ("/api/generate", json!({"model": "default", "prompt": "hi", "suffix": "end"}).to_string(), 400, "suffix"),
        ("/api/generate", json!({"model": "default", "prompt": "hi", "format": 3}).to_string(), 400, "format"),
        ("/api/generate", "{\"model\": \"default\", \"prompt\": ".to_string(), 400, "JSON"),
        ("/api/show", json!({"model": "nobody/nothing"}).to_string(), 404, "nobody/nothing"),
        ("/api/pull", json!({"model": "../../etc"}).to_string(), 400, "Hugging Face"),
    ] {
        let r = post(path, body).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{path} {needle}");
        let e: Value = r.json().await.unwrap();
        let message = e["error"].as_str().unwrap_or_else(|| panic!("{path} {needle}: not Ollama's shape: {e}"));
        assert!(message.contains(needle), "{path}: {needle} not in {message}");
        assert_eq!(e.as_object().unwrap().len(), 1, "{e}");
    }
    // A body past the limit, refused on its declared length (sending it whole races the
    // refusal: the server may answer and close before the client has written it all).
    let (status, e) = post_declaring(&format!("{base}/api/chat"), limit + 1).await;
    assert_eq!(status, 413, "{e}");
    assert!(e["error"].as_str().is_some_and(|m| m.contains("limit")) && e.as_object().unwrap().len() == 1, "not Ollama's shape: {e}");
    // Routes Ollama has and mlxbar does not: 501, in the same shape.
    let r = client().delete(format!("{base}/api/delete")).json(&json!({"model": "default"})).send().await.unwrap();
    assert_eq!(r.status(), 501);
    assert!(r.json::<Value>().await.unwrap()["error"].as_str().unwrap().contains("/api/delete"));
}
