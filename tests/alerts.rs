//! The alert engine inside a real server: a rule forced low fires after a real request,
//! shows in /api/alerts, /metrics and the snapshot, and can be snoozed; pausing serving
//! turns generation requests away with 503.
mod common;

use std::time::{Duration, Instant};

use mlxbar::Server;
use serde_json::{json, Value};

async fn get(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

fn alert<'a>(list: &'a Value, id: &str) -> &'a Value {
    list["data"].as_array().unwrap().iter().find(|a| a["id"] == id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_alert_fires_snoozes_and_pausing_refuses_work() {
    let mut config = common::test_config();
    config.alerts = toml::from_str("[ttft_p90_high]\nthreshold = 0.001\nfor_seconds = 0\n").unwrap();
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let http = reqwest::Client::new();

    let list = get(&format!("{base}/api/alerts")).await;
    assert_eq!(list["data"].as_array().unwrap().len(), mlxbar::alerts::rules::defaults().len());
    assert_eq!(alert(&list, "ttft_p90_high")["state"], "ok", "no requests, no TTFT, no alert");

    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let r = http.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // The monitor evaluates once a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    let fired = loop {
        let list = get(&format!("{base}/api/alerts")).await;
        if alert(&list, "ttft_p90_high")["firing"] == true {
            break list;
        }
        assert!(Instant::now() < deadline, "alert did not fire: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let a = alert(&fired, "ttft_p90_high");
    // A value with its unit (ms, or s on a loaded machine).
    let text = a["value_text"].as_str().unwrap();
    assert!(a["value"].as_f64().unwrap() > 0.0 && (text.ends_with(" ms") || text.ends_with(" s")), "{a}");
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("mlxbar_alerts_firing{alert=\"ttft_p90_high\"} 1"), "{metrics}");
    assert!(metrics.contains("mlxbar_alerts_firing{alert=\"memory_pressure_critical\"} 0"));
    let snap = get(&format!("{base}/api/metrics/snapshot")).await;
    assert_eq!(alert(&json!({"data": snap["alerts"]}), "ttft_p90_high")["firing"], true);

    // Snooze: empty JSON body = an hour; explicit seconds; bad input is a 400; unknown id a
    // 404; no JSON Content-Type a 415 (what a web page's simple request would send).
    let r =
        http.post(format!("{base}/api/alerts/ttft_p90_high/snooze")).header("content-type", "text/plain").body("{}").send().await.unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(
        get(&format!("{base}/api/alerts")).await["data"].as_array().unwrap().iter().find(|a| a["id"] == "ttft_p90_high").unwrap()
            ["snoozed"],
        false
    );
    let v: Value = http
        .post(format!("{base}/api/alerts/ttft_p90_high/snooze"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["snoozed"], true);
    let r = http.post(format!("{base}/api/alerts/ttft_p90_high/snooze")).json(&json!({"seconds": 60})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let until = r.json::<Value>().await.unwrap()["snoozed_until_unix"].as_u64().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!((now + 55..=now + 61).contains(&until), "{until} vs {now}");
    for (body, status) in [(json!({"seconds": -5}), 400), (json!({"minutes": 5}), 400)] {
        let r = http.post(format!("{base}/api/alerts/ttft_p90_high/snooze")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), status);
        assert!(r.json::<Value>().await.unwrap()["error"]["message"].is_string());
    }
    let r = http.post(format!("{base}/api/alerts/nope/snooze")).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "alert_not_found");
    let v: Value = http.delete(format!("{base}/api/alerts/ttft_p90_high/snooze")).send().await.unwrap().json().await.unwrap();
    assert_eq!((v["snoozed"].clone(), v["firing"].clone()), (json!(false), json!(true)));

    // Pause / resume serving.
    server.set_paused(true);
    let r = http.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "serving_paused");
    assert_eq!(get(&format!("{base}/api/metrics/snapshot")).await["paused"], true);
    server.set_paused(false);
    let r = http.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
    assert_eq!(r.status(), 200);
    server.shutdown().await;
}
