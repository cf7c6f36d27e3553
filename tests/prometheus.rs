//! A real Prometheus (Debian's `prometheus`) scrapes a running mlxbar on loopback; its
//! HTTP API must show the counters and histograms with sane values, and `promtool check
//! metrics` must find nothing to complain about in a scrape taken under load.
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_prometheus(target: &str) -> Prometheus {
    let dir = tempfile::tempdir().unwrap();
    // The MLX-Flash compat rules from dashboards/ run too, on live data.
    let compat = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/prometheus/mlx_flash_compat.yml");
    std::fs::copy(compat, dir.path().join("mlx_flash_compat.yml")).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - mlx_flash_compat.yml\nscrape_configs:\n  - job_name: mlxbar\n    static_configs:\n      - targets: ['{}']\n",
        target.trim_start_matches("http://")
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (apt-get install prometheus)");
    Prometheus { child, base: format!("http://127.0.0.1:{port}"), _dir: dir }
}

/// Runs `query` until `accept` likes the first sample's value, or fails after 60 s.
async fn wait_for(prom: &Prometheus, query: &str, accept: impl Fn(f64) -> bool) -> f64 {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        if let Ok(resp) = client.get(format!("{}/api/v1/query", prom.base)).query(&[("query", query)]).send().await {
            if let Ok(v) = resp.json::<Value>().await {
                let value = v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse::<f64>().ok());
                if let Some(x) = value {
                    if accept(x) {
                        return x;
                    }
                }
                last = Some(v);
            }
        }
        // Prometheus scrapes every second; ask again at that pace.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{query}: no acceptable value within 60 s; last answer {last:?}");
}

#[tokio::test]
async fn prometheus_scrapes_counters_and_histograms() {
    let base = common::start_server(common::test_config());
    let prom = start_prometheus(&base);
    wait_for(&prom, "up{job=\"mlxbar\"}", |v| v == 1.0).await;

    let client = reqwest::Client::new();
    let mut generated = 0;
    for (i, stream) in [false, true, false].into_iter().enumerate() {
        let mut body = json!({"messages": [{"role": "user", "content": format!("Count to {}.", i + 3)}], "max_tokens": 8, "temperature": 0, "stream": stream});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let resp = client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let usage: Value = if stream {
            common::sse_chunks(resp).await.last().unwrap()["usage"].clone()
        } else {
            resp.json::<Value>().await.unwrap()["usage"].clone()
        };
        generated += usage["completion_tokens"].as_u64().unwrap();
    }
    let requests = wait_for(&prom, "sum(mlxbar_requests_total)", |v| v >= 3.0).await;
    assert_eq!(requests, 3.0);
    let by_stream = wait_for(&prom, "sum(mlxbar_requests_total{endpoint=\"chat\",stream=\"true\"})", |v| v >= 1.0).await;
    assert_eq!(by_stream, 1.0);
    let tokens = wait_for(&prom, "sum(mlxbar_generation_tokens_total)", |v| v >= generated as f64).await;
    assert_eq!(tokens, generated as f64);
    // histograms: 3 observations, and a median TTFT between 1 ms and a minute
    let ttft_count = wait_for(&prom, "sum(mlxbar_time_to_first_token_seconds_count)", |v| v >= 3.0).await;
    assert_eq!(ttft_count, 3.0);
    let p50 = wait_for(&prom, "histogram_quantile(0.5, sum by (le) (mlxbar_time_to_first_token_seconds_bucket))", |v| v.is_finite()).await;
    assert!(p50 > 0.001 && p50 < 60.0, "TTFT p50 {p50}");
    let itl = wait_for(&prom, "sum(mlxbar_inter_token_latency_seconds_count)", |v| v > 0.0).await;
    assert_eq!(itl, (generated - 3) as f64, "one interval between each pair of tokens");
    // HTTP metrics carry the route template; the scrape itself is not counted
    let http = wait_for(&prom, "sum(mlxbar_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"})", |v| v >= 3.0).await;
    assert_eq!(http, 3.0);
    wait_for(&prom, "count(mlxbar_http_requests_total{route=\"/metrics\"}) or vector(0)", |v| v == 0.0).await;
    // system gauges
    let total = wait_for(&prom, "mlxbar_memory_bytes{kind=\"total\"}", |v| v > 0.0).await;
    assert!(total > 1e9);
    wait_for(&prom, "mlxbar_model_loaded", |v| v == 1.0).await;
    wait_for(&prom, "mlxbar_mlx_memory_bytes{kind=\"active\"}", |v| v > 1e8).await;
    // MLX-Flash's names, recorded by the compat rules from the same scrapes
    let flash_tokens = wait_for(&prom, "mlxbar_tokens_generated_total", |v| v >= generated as f64).await;
    assert_eq!(flash_tokens, generated as f64);
    let flash_total = wait_for(&prom, "mlxbar_memory_total_bytes", |v| v > 0.0).await;
    assert_eq!(flash_total, total);
    wait_for(&prom, "mlxbar_workers_total - mlxbar_workers_healthy", |v| v == 0.0).await;
}

#[tokio::test]
async fn promtool_finds_nothing_in_a_scrape_under_load() {
    let base = common::server();
    let client = reqwest::Client::new();
    // a stream in flight while scraping
    let body = json!({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 40, "stream": true});
    let resp = client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let scrape = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert!(scrape.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = scrape.text().await.unwrap();
    drop(resp);
    assert!(text.contains("mlxbar_http_requests_in_flight{method=\"POST\",route=\"/v1/chat/completions\"} 1"), "in flight while streaming");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let complaints = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && complaints.trim().is_empty(), "promtool: {complaints}");
}
