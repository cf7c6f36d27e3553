//! `POST /api/models/pull`, `GET /api/models/pulls` and `DELETE /api/models/pulls/{id}` on a
//! real mlxbar server, pulling from the fake hub (tests/pull/hub.rs) that HF_ENDPOINT points
//! at: the cap on pulls running, and a cancel mid-file whose partial blob the next pull
//! resumes with Range. Its own test binary with one test: the server reads HF_ENDPOINT /
//! HF_HUB_CACHE from the process environment, set here before any other thread could read it.
mod common;
#[path = "pull/hub.rs"]
mod hub;

use std::time::{Duration, Instant};

use hub::{commit_of, pattern, sha256, FakeHub};
use serde_json::{json, Value};

const REPO: &str = "mlx-test/api-4bit";
const BIG: &str = "mlx-test/api-big";

#[tokio::test]
async fn the_pull_routes_start_refuse_and_list_pulls() {
    let hub = FakeHub::start();
    hub.add(REPO, "config.json", b"{}");
    hub.add(REPO, "model.safetensors", &pattern(4096, 9));
    let weights = pattern(256 * 1024, 3);
    hub.add(BIG, "config.json", b"{}");
    hub.add(BIG, "model.safetensors", &weights);
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("HF_ENDPOINT", &hub.base);
    std::env::set_var("HF_HUB_CACHE", cache.path());
    std::env::remove_var("HF_TOKEN");
    let base = common::start_server(mlxbar::Config { max_concurrent_pulls: 1, ..common::test_config() });
    let client = reqwest::Client::new();
    let post = |body: Value| client.post(format!("{base}/api/models/pull")).json(&body).send();

    hub.hold(true);
    let resp = post(json!({"model": REPO})).await.unwrap();
    assert_eq!(resp.status(), 202);
    let started: Value = resp.json().await.unwrap();
    assert_eq!((started["repo"].as_str(), started["state"].as_str()), (Some(REPO), Some("running")), "{started}");

    let resp = post(json!({"model": REPO})).await.unwrap();
    assert_eq!(resp.status(), 409);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "pull_running", "{err}");
    // max_concurrent_pulls = 1: another repo waits its turn.
    let resp = post(json!({"model": BIG})).await.unwrap();
    assert_eq!(resp.status(), 429);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "too_many_pulls", "{err}");

    for (body, needle) in
        [(json!({"model": "../../etc"}), "not a Hugging Face model id"), (json!({"model": REPO, "branch": "x"}), "branch")]
    {
        let resp = post(body.clone()).await.unwrap();
        assert_eq!(resp.status(), 400, "{body}");
        let err: Value = resp.json().await.unwrap();
        assert!(err["error"]["message"].as_str().unwrap().contains(needle), "{err}");
    }

    hub.hold(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let list: Value = client.get(format!("{base}/api/models/pulls")).send().await.unwrap().json().await.unwrap();
        let job = list["data"].as_array().unwrap().iter().find(|j| j["repo"] == REPO).cloned().unwrap();
        if job["state"] != "running" {
            break job;
        }
        assert!(Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["state"], "done", "{done}");
    let snapshot = cache.path().join("models--mlx-test--api-4bit/snapshots").join(commit_of(REPO));
    assert_eq!(done["path"].as_str(), snapshot.to_str(), "{done}");
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), pattern(4096, 9));

    // A cancel mid-file: the partial blob stays, and the next pull resumes it with Range.
    hub.stall_next_get("model.safetensors", 100_000);
    let started: Value = post(json!({"model": BIG})).await.unwrap().json().await.unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    let partial = cache.path().join("models--mlx-test--api-big/blobs").join(format!("{}.incomplete", sha256(&weights)));
    common::until("100 000 bytes on disk", 20, async || std::fs::metadata(&partial).ok().filter(|m| m.len() >= 100_000).map(|_| ())).await;
    let resp = client.delete(format!("{base}/api/models/pulls/{id}")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let cancelled: Value = resp.json().await.unwrap();
    assert_eq!((cancelled["id"].as_str(), cancelled["state"].as_str()), (Some(id.as_str()), Some("cancelled")), "{cancelled}");
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 100_000, "the partial blob stays");
    let resp = client.delete(format!("{base}/api/models/pulls/{id}")).send().await.unwrap();
    assert_eq!(resp.status(), 409, "not running any more");
    let resp = client.delete(format!("{base}/api/models/pulls/pull-999")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let resp = client.delete(format!("{base}/api/models/pulls/{id}")).header("origin", "https://evil.example").send().await.unwrap();
    assert_eq!(resp.status(), 403, "a page cannot cancel pulls");

    hub.release_stall();
    hub.clear_hits();
    let resp = post(json!({"model": BIG})).await.unwrap();
    assert_eq!(resp.status(), 202);
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let list: Value = client.get(format!("{base}/api/models/pulls")).send().await.unwrap().json().await.unwrap();
        let job = list["data"].as_array().unwrap().iter().find(|j| j["repo"] == BIG).cloned().unwrap();
        if job["state"] != "running" {
            break job;
        }
        assert!(Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["state"], "done", "{done}");
    let snapshot = cache.path().join("models--mlx-test--api-big/snapshots").join(commit_of(BIG));
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), weights);
    let ranges: Vec<_> = hub.hits().into_iter().filter(|h| h.method == "GET" && h.path.starts_with("/cdn/")).map(|h| h.range).collect();
    assert_eq!(ranges, [Some("bytes=100000-".to_string())], "resumed, not started over");
}
