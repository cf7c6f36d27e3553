//! The model registry end to end, on real servers: models found in a hub cache (MLX
//! folders converted from the default model, 4- and 8-bit, as mlx-community publishes) and
//! a models dir, loaded just in time by naming them, switched back and forth with the same
//! greedy answers as a fresh server, the least recently used one unloaded at
//! `max_loaded_models`, idle ones after their keep-alive, concurrent requests waiting for
//! one load, a load refused with the two figures when it does not fit the budget, and
//! pinning; pins, keep-alives and alert snoozes kept across a restart (a corrupt state file
//! set aside).
mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use mlxbar::Config;
use serde_json::{json, Value};

const FOUR: &str = "mlx-community/SmolLM2-135M-Instruct-4bit";
const EIGHT: &str = "mlx-community/SmolLM2-135M-Instruct-8bit";

/// The library every server here sees: a hub cache (set as HF_HUB_CACHE before any server
/// starts) and a models dir, built once for the binary.
struct Fixture {
    models_dir: PathBuf,
    eight_bit: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let root = tempfile::tempdir().unwrap().keep();
        let hub = root.join("hub");
        common::fixtures::hub_cache(&hub, FOUR, |dir| common::fixtures::mlx_folder(dir, None));
        let eight_bit = common::fixtures::hub_cache(&hub, EIGHT, |dir| common::fixtures::mlx_folder(dir, Some(8)));
        let models_dir = root.join("models");
        std::fs::create_dir_all(&models_dir).unwrap();
        common::fixtures::unknown_arch_folder(&models_dir.join("gpt2-like"));
        common::fixtures::vision_folder(&models_dir.join("llava-like"));
        // Set before the first server reads it; every test of this binary uses this value.
        std::env::set_var("HF_HUB_CACHE", &hub);
        Fixture { models_dir, eight_bit }
    })
}

fn config(extra: impl FnOnce(&mut Config)) -> Config {
    let f = fixture();
    let mut c = Config { models_dirs: vec![f.models_dir.clone()], default_temperature: 0.0, ..common::test_config() };
    extra(&mut c);
    c
}

/// max_loaded_models = 1: every switch unloads the other model.
fn one_at_a_time() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| common::start_server(config(|c| c.max_loaded_models = 1)))
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn get(url: String) -> Value {
    client().get(url).send().await.unwrap().json().await.unwrap()
}

async fn ask(base: &str, model: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": common::QUESTION}], "max_tokens": 12});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let r = client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn answer(base: &str, model: &str) -> String {
    let (status, body) = ask(base, model, json!({})).await;
    assert_eq!(status, 200, "{body}");
    if model != "default" {
        assert_eq!(body["model"], model, "the answer names the model that gave it");
    }
    body["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

fn model<'a>(list: &'a Value, id: &str) -> &'a Value {
    list["models"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap_or_else(|| panic!("{id} not in {list}"))
}

async fn state_of(base: &str, id: &str) -> Value {
    model(&get(format!("{base}/api/models")).await, id).clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_lists_local_models_and_v1_models_the_runnable_ones() {
    let base = one_at_a_time();
    let list = get(format!("{base}/api/models")).await;
    let four = model(&list, FOUR);
    assert_eq!(four["format"], "mlx");
    assert_eq!(four["source"], "hub-cache");
    assert_eq!(four["quantization"], json!({"bits": 4, "group_size": 32, "mode": "affine"}));
    assert_eq!(four["runnable"], true);
    assert_eq!(four["state"], "unloaded");
    // The default format keeps 4-bit weights packed, scales and biases as stored: the
    // estimate is the stored size and 1,024 tokens of KV, not float32's ~540 MB.
    let (estimate, stored) = (four["estimate_bytes"].as_u64().unwrap(), four["size_bytes"].as_u64().unwrap());
    assert!(estimate > stored && estimate < stored + 150_000_000, "packed weights (the default format): {four}");
    assert_eq!(model(&list, EIGHT)["quantization"]["bits"], 8);
    let unknown = model(&list, "gpt2-like");
    assert_eq!(unknown["runnable"], false);
    assert!(unknown["unsupported_reason"].as_str().unwrap().contains("architecture"), "{unknown}");
    assert_eq!(model(&list, "llava-like")["runnable"], false);
    let default = list["default"].as_str().unwrap();
    assert_eq!(model(&list, default)["default"], true);

    let v1 = get(format!("{base}/v1/models")).await;
    let ids: Vec<&str> = v1["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&FOUR) && ids.contains(&EIGHT), "{ids:?}");
    assert!(!ids.contains(&"gpt2-like") && !ids.contains(&"llava-like"), "{ids:?}");
    assert_eq!(v1["data"][0]["owned_by"], if ids[0].contains('/') { json!(ids[0].split('/').next().unwrap()) } else { json!("mlxbar") });

    // Naming a model that is not runnable says why; one that does not exist, 404.
    let (status, body) = ask(base, "gpt2-like", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("model_not_runnable")), "{body}");
    let (status, body) = ask(base, "nobody/nothing", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("model_not_found")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_models_by_name_gives_a_fresh_servers_answers() {
    let base = one_at_a_time();
    let fresh = common::start_server(config(|c| c.model = Some(fixture().eight_bit.clone())));
    let fresh_eight = answer(&fresh, "default").await;

    let default_first = answer(base, "default").await;
    let eight = answer(base, EIGHT).await;
    assert_eq!(eight, fresh_eight, "the 8-bit model loaded by name answers as a server started on it");
    let default_again = answer(base, "default").await;
    assert_eq!(default_again, default_first);
    assert_eq!(answer(base, EIGHT).await, fresh_eight);
    assert_eq!(default_first, common::ANSWER);

    // One model at a time: each switch unloaded the least recently used one.
    assert!(common::metric_sum(base, "mlxbar_model_unloads_total", &[r#"reason="lru""#]).await >= 3.0);
    let eight_view = state_of(base, EIGHT).await;
    assert_eq!(eight_view["state"], "loaded");
    assert!(eight_view["memory_bytes"].as_u64().unwrap() > 500_000_000, "{eight_view}");
    assert_eq!(eight_view["info"]["id"], EIGHT);
    assert_eq!(common::metric_sum(base, "mlxbar_model_loaded", &[&format!(r#"model="{EIGHT}""#)]).await, 1.0);
    assert!(common::metric_sum(base, "mlxbar_model_loads_total", &[&format!(r#"model="{EIGHT}""#), r#"result="ok""#]).await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_an_unloaded_model_share_one_load() {
    let base = common::start_server(config(|_| {}));
    let label = format!(r#"model="{FOUR}""#);
    let labels = [label.as_str()];
    let loads = || common::metric_sum(&base, "mlxbar_model_loads_total", &labels);
    let before = loads().await;
    let asks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn({
                let base = base.clone();
                async move { ask(&base, FOUR, json!({"max_tokens": 4})).await }
            })
        })
        .collect();
    // While it loads the model says so, with its progress.
    let seen = common::until("the load to show", 60, async || {
        let m = state_of(&base, FOUR).await;
        (m["state"] != "unloaded").then_some(m)
    })
    .await;
    assert!(seen["state"] == "loading" || seen["state"] == "loaded", "{seen}");
    for a in asks {
        let (status, body) = a.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(loads().await - before, 1.0, "one load served all four");
    // Two fit together here (max_loaded_models = 2): the default stayed.
    let list = get(format!("{base}/api/models")).await;
    assert_eq!(model(&list, list["default"].as_str().unwrap())["state"], "loaded");

    // keep_alive 0 unloads right after the answer; a short one after that long idle.
    let (status, _) = ask(&base, FOUR, json!({"keep_alive": 0, "max_tokens": 2})).await;
    assert_eq!(status, 200);
    common::until("keep_alive 0 to unload", 30, async || (state_of(&base, FOUR).await["state"] == "unloaded").then_some(())).await;
    let (status, _) = ask(&base, EIGHT, json!({"keep_alive": "1s", "max_tokens": 2})).await;
    assert_eq!(status, 200);
    common::until("keep_alive 1s to unload", 30, async || (state_of(&base, EIGHT).await["state"] == "unloaded").then_some(())).await;
    assert!(common::metric_sum(&base, "mlxbar_model_unloads_total", &[r#"reason="idle""#]).await >= 2.0);
    let (status, body) = ask(&base, EIGHT, json!({"keep_alive": "soon"})).await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_does_not_fit_is_refused_with_both_figures_and_pinned_ones_stay() {
    let default_id = common::model_path().file_stem().unwrap().to_string_lossy().into_owned();
    // The default model takes the budget (its packed weights, then KV up to what is left)
    // and is pinned: no room for a second.
    let base = common::start_server(config(|c| {
        c.memory_budget_bytes = Some(700_000_000);
        c.pinned = vec![default_id.clone()];
        c.keep_alive = mlxbar::registry::KeepAlive::parse("1s").unwrap();
    }));
    let (status, body) = ask(&base, FOUR, json!({})).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_memory");
    let message = body["error"]["message"].as_str().unwrap();
    // The sentence whole, its figures those /api/models shows: the model's estimate, and
    // the budget less what the loaded model holds.
    let list = get(format!("{base}/api/models")).await;
    let mb = |bytes: u64| format!("{} MB", bytes.div_ceil(1 << 20));
    let (budget, loaded) = (list["memory"]["budget_bytes"].as_u64().unwrap(), list["memory"]["loaded_bytes"].as_u64().unwrap());
    let want = format!(
        "{FOUR} needs ~{}; {} is left within the memory budget (memory_budget_bytes)",
        mb(model(&list, FOUR)["estimate_bytes"].as_u64().unwrap()),
        mb(budget - loaded)
    );
    assert_eq!(message, want);
    let r = client().post(format!("{base}/api/models/{FOUR}/load")).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 507);
    let view = state_of(&base, FOUR).await;
    assert_eq!(view["state"], "unloaded");
    assert_eq!(view["error"].as_str(), Some(message), "the refusal stays visible");
    assert_eq!(common::metric_sum(&base, "mlxbar_model_loads_total", &[&format!(r#"model="{FOUR}""#), r#"result="refused""#]).await, 2.0);

    // Pinned: past its 1 s keep-alive and the reaper's ticks, the default stays loaded.
    let pinned = common::until("the default to idle past its keep-alive", 30, async || {
        let m = state_of(&base, &default_id).await;
        (m["idle_seconds"].as_f64().unwrap_or(0.0) > 2.5).then_some(m)
    })
    .await;
    assert_eq!((pinned["state"].as_str(), pinned["pinned"].as_bool()), (Some("loaded"), Some(true)), "{pinned}");
    // Unpinned, it goes the next tick.
    let r = client().post(format!("{base}/api/models/{default_id}/load")).json(&json!({"pinned": false})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    common::until("the unpinned default to unload", 30, async || (state_of(&base, &default_id).await["state"] == "unloaded").then_some(()))
        .await;
    // Unloaded while idle, the server is still healthy: a request loads it again.
    assert_eq!(client().get(format!("{base}/health")).send().await.unwrap().status(), 200);
    assert_eq!(answer(&base, "default").await, common::ANSWER);
    // Explicit unload; unloading what is not loaded says so.
    let unload = |id: String| client().post(format!("{base}/api/models/{id}/unload")).json(&json!({})).send();
    assert_eq!(unload(default_id.clone()).await.unwrap().status(), 200);
    assert_eq!(unload(default_id.clone()).await.unwrap().status(), 409);
    assert_eq!(common::metric_sum(&base, "mlxbar_model_unloads_total", &[r#"reason="request""#]).await, 1.0);
}

/// The routes change state: a web page cannot drive them (text/plain, foreign origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_follow_the_state_changing_rules() {
    let base = one_at_a_time();
    let url = format!("{base}/api/models/{FOUR}/load");
    let r = client().post(&url).header("content-type", "text/plain").body("{}").send().await.unwrap();
    assert_eq!(r.status(), 415);
    let r = client().post(&url).header("origin", "https://evil.example").json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let r = client().post(&url).json(&json!({"bogus": 1})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = client().post(format!("{base}/api/models/{FOUR}/explode")).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// A server on `data_dir`, ready; with its URL.
async fn start_on(data_dir: &std::path::Path) -> (mlxbar::Server, String) {
    let server = mlxbar::Server::start(config(|c| c.data_dir = Some(data_dir.into()))).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = server.url();
    (server, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_keep_alives_and_snoozes_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let (server, base) = start_on(data.path()).await;
    let default = get(format!("{base}/api/models")).await["default"].as_str().unwrap().to_string();
    let r =
        client().post(format!("{base}/api/models/{default}/load")).json(&json!({"pinned": true, "keep_alive": "1h"})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client().post(format!("{base}/api/alerts/queue_backlog/snooze")).json(&json!({"seconds": 600})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    server.shutdown().await;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(data.path().join("state.json")).unwrap().permissions().mode() & 0o777, 0o600);
    }

    let (server, base) = start_on(data.path()).await;
    let me = state_of(&base, &default).await;
    assert_eq!((me["pinned"].as_bool(), me["keep_alive_seconds"].as_f64()), (Some(true), Some(3600.0)), "{me}");
    let alerts = get(format!("{base}/api/alerts")).await;
    let backlog = alerts["data"].as_array().unwrap().iter().find(|a| a["id"] == "queue_backlog").unwrap().clone();
    assert_eq!(backlog["snoozed"], true, "{backlog}");
    server.shutdown().await;

    // A pin of a model that is gone is dropped from the file (with a log line).
    let file = data.path().join("state.json");
    let mut saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    saved["pins"]["gone/model"] = json!(true);
    std::fs::write(&file, serde_json::to_vec(&saved).unwrap()).unwrap();
    let (server, base) = start_on(data.path()).await;
    assert_eq!(state_of(&base, &default).await["pinned"], true);
    server.shutdown().await;
    let saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(saved["pins"].get("gone/model").is_none() && saved["pins"][&default] == true, "{saved}");

    // A corrupt file is set aside; the server starts with nothing restored.
    std::fs::write(&file, "{\"pins\": {").unwrap();
    let (server, base) = start_on(data.path()).await;
    assert_eq!(state_of(&base, &default).await["pinned"], false);
    server.shutdown().await;
    let aside: Vec<_> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("state.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(data.path().join(&aside[0])).unwrap(), "{\"pins\": {", "kept as it was");
}
