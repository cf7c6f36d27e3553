//! Bench runs on the real engine with the default model and tiny plans: the routes, live
//! progress, exclusivity (other requests get 503, or wait and then run), cancelling
//! mid-cell, history order and limit with a corrupt file in the way, and the CLI's
//! `--target`/`--compare` against other mlxbar instances on loopback.
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use mlxbar::{Config, Server};
use serde_json::{json, Value};

async fn start(config: Config) -> (Server, String) {
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = server.url();
    (server, base)
}

/// A data dir holding user plans (name → TOML).
fn data_dir(plans: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let plans_dir = dir.path().join("metrics/bench/plans");
    std::fs::create_dir_all(&plans_dir).unwrap();
    for (name, toml) in plans {
        std::fs::write(plans_dir.join(format!("{name}.toml")), toml).unwrap();
    }
    dir
}

const TINY: &str = "concurrency = [1, 2]\nprompt_tokens = [48]\noutput_tokens = [12]\nwarmup = 1\nrepetitions = 1\n";

async fn get(url: String) -> Value {
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    r.json().await.unwrap()
}

async fn post(url: String, body: Value) -> reqwest::Response {
    reqwest::Client::new().post(url).json(&body).send().await.unwrap()
}

fn chat_body(max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens, "temperature": 0})
}

/// Polls `GET url` until `done` holds (a condition, with a deadline against hangs).
async fn until(url: String, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let v = get(url.clone()).await;
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_to_end(base: &str, profile: &str) -> Value {
    let r = post(format!("{base}/api/bench"), json!({"profile": profile})).await;
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    until(format!("{base}/api/bench/{id}"), "the run to end", |v| v["state"] != "running").await
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok())).unwrap_or_else(|| panic!("{series} missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_exclusively_with_progress_and_history() {
    let dir = data_dir(&[("tiny", TINY), ("broken", "concurrency = [\n")]);
    let (server, base) = start(Config { data_dir: Some(dir.path().into()), bench_wait_seconds: 0.0, ..common::test_config() }).await;

    let profiles = get(format!("{base}/api/bench/profiles")).await;
    let names: Vec<&str> = profiles["data"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    for want in ["quick", "standard", "concurrency-sweep", "long-context", "tiny"] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert!(profiles["warnings"][0].as_str().unwrap().contains("broken.toml"), "{profiles}");

    let r = post(format!("{base}/api/bench"), json!({"profile": "nope"})).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "profile_not_found");
    let r = post(format!("{base}/api/bench"), json!({"profil": "tiny"})).await;
    assert_eq!(r.status(), 400);

    // Start; a second start and an ordinary request are refused while it runs.
    let r = post(format!("{base}/api/bench"), json!({"profile": "tiny"})).await;
    assert_eq!(r.status(), 202);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    let job: Value = r.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    assert_eq!(location, format!("/api/bench/{id}"));
    let r = post(format!("{base}/api/bench"), json!({"profile": "quick"})).await;
    assert_eq!(r.status(), 409);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "bench_running");
    let r = post(format!("{base}/v1/chat/completions"), chat_body(4)).await;
    assert_eq!(r.status(), 503);
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "bench_running");
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert_eq!(metric(&metrics, "mlxbar_bench_running "), 1.0);
    assert!(metric(&metrics, "mlxbar_admission_refused_total{reason=\"bench_running\"} ") >= 1.0);
    let snapshot = get(format!("{base}/api/metrics/snapshot")).await;
    assert_eq!(snapshot["bench"]["active"]["id"], id.as_str());

    // Progress moves while it runs, and the run ends complete.
    until(format!("{base}/api/bench/{id}"), "progress", |v| {
        v["progress"]["requests_done"].as_u64().unwrap() > 0 || v["state"] != "running"
    })
    .await;
    let done = until(format!("{base}/api/bench/{id}"), "the run to end", |v| v["state"] != "running").await;
    assert_eq!(done["state"], "done", "{done}");
    let p = &done["progress"];
    assert_eq!((p["cells_done"].as_u64(), p["cells_total"].as_u64()), (Some(2), Some(2)));
    assert_eq!(p["requests_done"], p["requests_total"]);
    assert_eq!(p["requests_total"], 1 + 1 + 1 + 2);
    for cell in done["cells"].as_array().unwrap() {
        assert_eq!(cell["errors"], 0, "{cell}");
        assert!(cell["completion_tokens"].as_u64().unwrap() >= cell["concurrency"].as_u64().unwrap(), "{cell}");
        assert!(cell["ttft_p50"].as_f64().unwrap() > 0.0 && cell["aggregate_tok_s"].as_f64().unwrap() > 0.0, "{cell}");
        assert!(cell["prompt_tokens_counted"].as_u64().unwrap() > 24, "{cell}");
        assert!(cell["peak_mlx_bytes"].as_u64().unwrap() > 0, "memory is followed on mlxbar targets: {cell}");
    }
    // The engine is free again.
    assert_eq!(post(format!("{base}/v1/chat/completions"), chat_body(4)).await.status(), 200);
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert_eq!(metric(&metrics, "mlxbar_bench_running "), 0.0);

    let report = reqwest::get(format!("{base}{}", done["report_url"].as_str().unwrap())).await.unwrap();
    assert_eq!(report.status(), 200);
    assert!(report.text().await.unwrap().matches("<svg").count() == 2);
    let full = get(format!("{base}/api/history/{id}")).await;
    assert_eq!((full["plan"]["name"].as_str(), full["state"].as_str()), (Some("tiny"), Some("done")));
    assert!(full["machine"]["memory_bytes"].as_u64().unwrap() > 0);
    assert_eq!(full["targets"][0]["mlxbar"]["device"], "cpu");

    // A second run; history lists newest first, honours the limit, skips a corrupt file.
    std::fs::write(dir.path().join("metrics/history/zz-corrupt.json"), "{\"id\": \"zz\", \"cells\": [").unwrap();
    let second = run_to_end(&base, "tiny").await;
    let second_id = second["id"].as_str().unwrap();
    assert_eq!(second["state"], "done");
    let ids = |v: &Value| v["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(ids(&get(format!("{base}/api/history")).await), [second_id.to_string(), id.clone()]);
    assert_eq!(ids(&get(format!("{base}/api/history?limit=1")).await), [second_id.to_string()]);
    let entry = &get(format!("{base}/api/history?limit=1")).await["data"][0];
    assert_eq!(entry["cells"].as_array().unwrap().len(), 2);
    assert!(entry["cells"][0]["aggregate_tok_s"].as_f64().unwrap() > 0.0);
    let r = reqwest::get(format!("{base}/api/history?limit=0")).await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(reqwest::get(format!("{base}/api/history/nope")).await.unwrap().status(), 404);
    let jobs = get(format!("{base}/api/bench")).await;
    assert_eq!(ids(&jobs), [second_id.to_string(), id.clone()]);
    assert!(jobs["active"].is_null());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_mid_cell_frees_the_engine_for_a_waiting_request() {
    let long = "concurrency = [2]\nprompt_tokens = [48]\noutput_tokens = [400]\nwarmup = 0\nrepetitions = 3\n";
    let dir = data_dir(&[("long", long)]);
    let (server, base) = start(Config { data_dir: Some(dir.path().into()), bench_wait_seconds: 600.0, ..common::test_config() }).await;
    let r = post(format!("{base}/api/bench"), json!({"profile": "long"})).await;
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    until(format!("{base}/api/metrics/snapshot"), "the bench's streams to run", |s| s["scheduler"]["running"] == 2).await;

    // An ordinary request waits at the gate (it is visible) instead of failing.
    let waiting = tokio::spawn(post(format!("{base}/v1/chat/completions"), chat_body(4)));
    let s = until(format!("{base}/api/metrics/snapshot"), "the request to wait", |s| s["bench"]["waiting_requests"] == 1).await;
    assert_eq!(s["bench"]["active"]["state"], "running");
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert_eq!(metric(&metrics, "mlxbar_bench_waiting_requests "), 1.0);

    let r = reqwest::Client::new().delete(format!("{base}/api/bench/{id}")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let cancelled: Value = r.json().await.unwrap();
    assert_eq!(cancelled["state"], "cancelled");
    assert_eq!(cancelled["progress"]["cells_done"], 0, "cancelled mid-cell");
    // The waiting request now runs to completion.
    let r = waiting.await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["object"], "chat.completion");
    until(format!("{base}/api/metrics/snapshot"), "the bench's streams to end", |s| s["scheduler"]["running"] == 0).await;

    let r = reqwest::Client::new().delete(format!("{base}/api/bench/{id}")).send().await.unwrap();
    assert_eq!(r.status(), 409, "already ended");
    assert_eq!(get(format!("{base}/api/bench/{id}")).await["state"], "cancelled");
    assert!(get(format!("{base}/api/history")).await["data"].as_array().unwrap().is_empty(), "cancelled runs are not history");
    assert!(dir.path().join(format!("metrics/bench/runs/{id}.json")).exists(), "the partial record is kept");
    server.shutdown().await;
}

fn cli(data_dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mlxbar"))
        .arg("bench")
        .args(args)
        .env("MLXBAR_DATA_DIR", data_dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// The body rows of the CLI's Markdown table, as trimmed cells.
/// The index of the column headed `name` in the table's rows.
fn column(table: &str, name: &str) -> usize {
    let header = table.lines().find(|l| l.starts_with("| cell ")).unwrap_or_else(|| panic!("no header: {table}"));
    header.trim_matches('|').split('|').map(str::trim).position(|h| h == name).unwrap_or_else(|| panic!("no column {name}: {table}"))
}

fn table_rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("| cell ") && !l.starts_with("|---"))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

#[test]
fn cli_targets_and_compares_other_servers() {
    let dir = data_dir(&[("tiny", TINY)]);
    let a = common::server();
    let b = common::start_server(common::test_config());

    let out = cli(dir.path(), &["--profile", "tiny", "--target", a, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((record["state"].as_str(), record["profile"].as_str()), (Some("done"), Some("tiny")));
    assert_eq!(record["targets"][0]["url"], a);
    assert_eq!(record["targets"][0]["model_id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(record["cells"].as_array().unwrap().len(), 2);
    assert!(record["cells"].as_array().unwrap().iter().all(|c| c["errors"] == 0 && c["completion_tokens"].as_u64() > Some(0)));
    let id = record["id"].as_str().unwrap();
    assert!(dir.path().join(format!("metrics/history/{id}.json")).exists());
    assert!(dir.path().join(format!("metrics/bench/runs/{id}.html")).exists());

    let out = cli(
        dir.path(),
        &["--profile", "tiny", "--concurrency", "2", "--target", &format!("first={a}"), "--compare", &format!("second={b}#default")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("aggregate × vs first"), "{table}");
    // --concurrency 2 replaced the profile's [1, 2]: one cell, on both servers.
    let rows = table_rows(&table);
    let cells: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    assert_eq!(cells, [("2×48→12", "first"), ("2×48→12", "second")], "{table}");
    // The first server against itself: 1.00 (tok/J's ratio too where power is readable).
    assert_eq!(rows[0][column(&table, "aggregate × vs first")], "1.00", "{table}");
    assert!(["1.00", "unavailable"].contains(&rows[0][column(&table, "tok/J × vs first")].as_str()), "{table}");

    let out = cli(dir.path(), &["--profile", "tiny", "--target", "http://127.0.0.1:1"]);
    assert!(!out.status.success(), "an unreachable target fails the run");
    // Errors are counted per cell: every timed request of the plan's cells (1 and 2
    // streams, one round each; warm-ups not counted).
    let table = String::from_utf8(out.stdout).unwrap();
    let errors = column(&table, "errors");
    let cells: Vec<(String, String)> = table_rows(&table).into_iter().map(|r| (r[0].clone(), r[errors].clone())).collect();
    let want = [("1×48→12", "1"), ("2×48→12", "2")].map(|(c, e)| (c.to_string(), e.to_string()));
    assert_eq!(cells, want, "{table}");
}
