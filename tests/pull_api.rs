//! `POST /api/models/pull` and `GET /api/models/pulls` on a real mlxbar server, pulling from
//! the fake hub (tests/pull/hub.rs) that HF_ENDPOINT points at. Its own test binary with one
//! test: the server reads HF_ENDPOINT / HF_HUB_CACHE from the process environment, set here
//! before any other thread could read it.
mod common;
#[path = "pull/hub.rs"]
mod hub;

use std::time::{Duration, Instant};

use hub::{commit_of, pattern, FakeHub};
use serde_json::{json, Value};

const REPO: &str = "mlx-test/api-4bit";

#[tokio::test]
async fn the_pull_routes_start_refuse_and_list_pulls() {
    let hub = FakeHub::start();
    hub.add(REPO, "config.json", b"{}");
    hub.add(REPO, "model.safetensors", &pattern(4096, 9));
    let cache = tempfile::tempdir().unwrap();
    std::env::set_var("HF_ENDPOINT", &hub.base);
    std::env::set_var("HF_HUB_CACHE", cache.path());
    std::env::remove_var("HF_TOKEN");
    let base = common::start_server(common::test_config());
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
}
