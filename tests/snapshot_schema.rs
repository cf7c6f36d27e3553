//! The live snapshot's published JSON Schema (`GET /api/metrics/snapshot/schema`) against
//! real snapshots of real servers: every SSE event and JSON answer while a server is idle,
//! serves requests, fires an alert and runs a bench; a server whose model failed to load.
//! The schema itself is a valid draft 2020-12 document that requires every field and
//! refuses snapshots that lost a field or changed a type.
mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use jsonschema::Validator;
use mlxbar::{Config, Server};
use serde_json::{json, Value};

// Long enough (128 tokens a request, ~1 s with the packed default on two cores) that the
// run spans several of the stream's 500 ms samples: with 16 tokens a whole run could start
// and end between two of them once AMX took prefill, and the stream never showed it.
const TINY: &str = "concurrency = [1, 2]\nprompt_tokens = [32]\noutput_tokens = [128]\nwarmup = 0\nrepetitions = 1\n";

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

/// The schema as the server publishes it, checked against the draft 2020-12 meta-schema.
async fn published_schema(base: &str) -> (Value, Validator) {
    let r = client().get(format!("{base}/api/metrics/snapshot/schema")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/schema+json");
    let schema: Value = r.json().await.unwrap();
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    jsonschema::draft202012::meta::validate(&schema).unwrap_or_else(|e| panic!("not a 2020-12 schema: {e}"));
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    (schema, validator)
}

fn assert_valid(v: &Validator, snapshot: &Value, what: &str) {
    let errors: Vec<String> = v.iter_errors(snapshot).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{what} does not match the schema:\n{}\n{snapshot:#}", errors.join("\n"));
}

async fn get_snapshot(base: &str) -> Value {
    client().get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap()
}

/// Reads `snapshot` events off an SSE body into `seen` until the stream ends.
async fn collect_events(resp: reqwest::Response, seen: tokio::sync::mpsc::UnboundedSender<Value>) {
    let mut events = common::sse(resp);
    while let Some(event) = events.next().await {
        if event.event == "snapshot" && seen.send(serde_json::from_str(&event.data).unwrap()).is_err() {
            return;
        }
    }
}

/// Polls the JSON snapshot (checking each against the schema) until `done` holds.
async fn until(base: &str, v: &Validator, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = get_snapshot(base).await;
        assert_valid(v, &s, what);
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_snapshot_of_a_busy_server_matches_the_published_schema() {
    let dir = tempfile::tempdir().unwrap();
    let plans = dir.path().join("metrics/bench/plans");
    std::fs::create_dir_all(&plans).unwrap();
    std::fs::write(plans.join("tiny.toml"), TINY).unwrap();
    // An alert that fires on the first request, so snapshots carry a firing alert with a value.
    let alerts = toml::from_str("[ttft_p90_high]\nthreshold = 0.001\nfor_seconds = 0\n").unwrap();
    let config = Config {
        data_dir: Some(dir.path().into()),
        grafana_url: Some("http://127.0.0.1:3000/d/mlxbar".into()),
        alerts,
        ..common::test_config()
    };
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = server.url();
    let (schema, v) = published_schema(&base).await;

    // Every top-level field is required, nullable ones included (none is ever left out).
    let props: Vec<&str> = schema["properties"].as_object().unwrap().keys().map(String::as_str).collect();
    let mut required: Vec<&str> = schema["required"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    required.sort();
    let mut sorted = props.clone();
    sorted.sort();
    assert_eq!(required, sorted);
    assert!(props.len() >= 19, "{props:?}");

    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let resp = client().get(format!("{base}/api/metrics/stream")).send().await.unwrap();
    let reader = tokio::spawn(collect_events(resp, tx));

    let idle = until(&base, &v, "the idle snapshot", |_| true).await;
    assert_eq!(idle["requests"]["recent"], json!([]));
    assert!(idle["prefix_cache_hit_rate"].is_null());

    // A request: recent requests, timings, a firing alert.
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0});
    let r = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let served = until(&base, &v, "the alert to fire", |s| {
        s["alerts"].as_array().unwrap().iter().any(|a| a["id"] == "ttft_p90_high" && a["firing"] == true)
    })
    .await;
    assert_eq!(served["requests"]["recent"].as_array().unwrap().len(), 1);
    assert_eq!(served["links"]["grafana"], "http://127.0.0.1:3000/d/mlxbar");

    // A bench run: the active job with its progress and current cell, then its results.
    let r = client().post(format!("{base}/api/bench")).json(&json!({"profile": "tiny"})).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let running =
        until(&base, &v, "a cell to run", |s| !s["bench"]["active"]["progress"]["current"].is_null() || s["bench"]["active"].is_null())
            .await;
    assert!(running["bench"]["active"]["progress"]["current"]["label"].is_string(), "the run ended before a snapshot saw it: {running}");
    let _ = until(&base, &v, "the run to end", |s| s["bench"]["active"].is_null()).await;

    // The stream carried all of that too; check every event it sent.
    server.shutdown().await;
    reader.await.unwrap();
    let mut n = 0;
    let (mut saw_bench, mut saw_recent) = (false, false);
    while let Ok(s) = events.try_recv() {
        assert_valid(&v, &s, &format!("stream event {n}"));
        saw_bench |= !s["bench"]["active"].is_null();
        saw_recent |= !s["requests"]["recent"].as_array().unwrap().is_empty();
        n += 1;
    }
    assert!(n >= 3 && saw_bench && saw_recent, "{n} events, bench seen {saw_bench}, requests seen {saw_recent}");
}

/// Breaks a valid snapshot in one way.
type Spoil = fn(&mut Value);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_and_broken_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let config = Config { model: Some(missing), port: 0, data_dir: Some(dir.path().into()), ..Config::default() };
    let server = Server::start(config).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(60), server.wait_ready()).await.unwrap().is_err());
    let base = server.url();
    let (_, v) = published_schema(&base).await;
    let failed = get_snapshot(&base).await;
    assert_valid(&v, &failed, "the failed server's snapshot");
    assert_eq!(failed["state"]["state"], "failed");
    assert!(failed["state"]["detail"].is_string());
    // The failed default model is listed, with its reason.
    assert_eq!(failed["models"][0]["state"], "failed");
    assert!(failed["models"][0]["error"].is_string(), "{}", failed["models"]);
    assert_eq!(failed["scheduler"]["health"], "failed");
    server.shutdown().await;

    // The schema is strict enough to catch what a client would trip on.
    let broken: [(&str, Spoil); 7] = [
        ("a missing section", |s| {
            s.as_object_mut().unwrap().remove("scheduler");
        }),
        ("a missing nullable field", |s| {
            s.as_object_mut().unwrap().remove("prefix_cache_hit_rate");
        }),
        ("a bool as a string", |s| s["paused"] = json!("no")),
        ("a null count", |s| s["totals"]["requests"] = Value::Null),
        ("an unknown load state", |s| s["state"] = json!({"state": "asleep"})),
        ("an unknown health word", |s| s["scheduler"]["health"] = json!("fine")),
        ("a negative byte count", |s| s["memory"]["mlx"]["active"] = json!(-1)),
    ];
    for (what, spoil) in broken {
        let mut s = failed.clone();
        spoil(&mut s);
        assert!(!v.is_valid(&s), "the schema accepts {what}");
    }
}
