//! Expert streaming (engine::experts) on the tiny mixture-of-experts fixtures
//! (tests/data/tiny, made with mlx-lm's classes; MLX folders and GGUF files), in the default
//! weight format: with a cache
//! that holds a quarter of the experts, prefill and batched decode logits equal the resident
//! model's; the cache never holds more than its budget (its own count and MLX's active
//! memory); every router selection is counted once as a hit or a miss; a cache that holds
//! everything stops missing once warm; a file cut short under a running model fails that
//! step with an error naming the read, and the model serves again once the file is back.
//! Then through the server: `--expert-cache-bytes` streams a model, a greedy chat answers
//! what the resident model computes, `/metrics` and `/api/models` show the cache, and a
//! truncated file fails that request (500) without taking the server down.
use std::path::{Path, PathBuf};
use std::sync::Mutex;

mod common;

use mlx_rs::Device;
use mlxbar::engine::batch_kv::BatchKv;
use mlxbar::engine::experts::ExpertView;
use mlxbar::engine::model::Model;
use mlxbar::engine::{loader, sampling::argmax, WeightFormat};
use mlxbar::{Config, Server};
use serde_json::{json, Value};

/// MLX's active memory is process-wide: the tests here take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn tiny(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny").join(name)
}

fn load(dir: &Path, cache: Option<u64>) -> Model {
    Device::set_default(&Device::cpu());
    loader::load_reporting(dir, "m", WeightFormat::Auto, cache, &|_| {}).unwrap_or_else(|e| panic!("{}: {e:#}", dir.display())).0
}

fn experts(model: &Model) -> ExpertView {
    model.expert_stats().expect("streamed").view()
}

/// (experts of all sparse layers, experts per token in one layer, sparse layers).
fn shape(model: &Model) -> (u64, u64, u64) {
    let moe = model.config.moe.as_ref().unwrap();
    let sparse = (0..model.config.num_layers).filter(|&l| moe.is_sparse(l)).count() as u64;
    (sparse * moe.num_experts as u64, moe.experts_per_token as u64, sparse)
}

/// Logits of a 40-token prefill (80 selections a layer: the sorted gather), then of three
/// sequences decoded together for 4 steps (the unsorted gather), greedy; each step's logits.
fn run(model: &Model, after_step: &mut dyn FnMut(&Model, u64)) -> Vec<Vec<f32>> {
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 300).collect();
    let mut out = vec![];
    let mut batch = BatchKv::default();
    let mut next = vec![];
    let mut tokens = 0u64;
    for (row, len) in [(0u64, 40usize), (1, 5), (2, 9)] {
        let mut cache = model.new_cache();
        let logits = model.forward(&ids[..len], &mut cache).unwrap();
        tokens += len as u64;
        after_step(model, tokens);
        let logits = logits.as_slice::<f32>().to_vec();
        next.push(argmax(&logits));
        out.push(logits);
        batch.join(row, cache).unwrap();
    }
    for _ in 0..4 {
        let logits = model.decode(&next, &mut batch).unwrap();
        tokens += next.len() as u64;
        after_step(model, tokens);
        let all = logits.as_slice::<f32>().to_vec();
        let vocab = all.len() / next.len();
        next = all.chunks(vocab).map(argmax).collect();
        out.extend(all.chunks(vocab).map(<[f32]>::to_vec));
    }
    out
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn a_quarter_of_the_experts_in_memory_computes_what_the_resident_model_does() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Stacked 4-bit (qwen3_moe: 8-bit router), stacked 4-bit with every layer sparse
    // (mixtral), float experts one tensor each (Hugging Face's layout), and MXFP4 experts
    // beside 8-bit affine modules (mlx-community's gpt-oss MXFP4-Q8); and from GGUF files in
    // llama.cpp's layout: float experts (qwen3moe), Q8_0 ones (GGML blocks converted an expert
    // at a time by mlxbar's reader, the resident ones by MLX's), and gpt-oss's MXFP4 experts
    // with their biases.
    for name in [
        "qwen3-moe-4bit",
        "mixtral-4bit",
        "qwen3-moe-hf",
        "gpt-oss-mxfp4-q8",
        "qwen3-moe-gguf/model.gguf",
        "qwen3-moe-q8-gguf/model.gguf",
        "gpt-oss-gguf/model.gguf",
    ] {
        let dir = tiny(name);
        let resident = load(&dir, None);
        let want = run(&resident, &mut |_, _| {});
        let resident_bytes = resident.nbytes() as u64;
        drop(resident);

        let per_expert = experts(&load(&dir, Some(u64::MAX))).expert_bytes;
        let streamed = load(&dir, Some(u64::MAX));
        let (total, k, sparse) = shape(&streamed);
        drop(streamed);
        let budget = per_expert * total / 4;
        let streamed = load(&dir, Some(budget));
        let other_weights = streamed.nbytes() as u64;
        assert!(other_weights + per_expert * total <= resident_bytes + 4096, "{name}: resident {resident_bytes}, streamed {other_weights}");
        let mut selections = 0;
        let got = run(&streamed, &mut |m, tokens| {
            let v = experts(m);
            assert!(v.resident_bytes <= budget && v.resident_experts <= total / 4, "{name}: {v:?} over {budget}");
            // One lookup per (token, chosen expert): the first load at load time is not one.
            assert_eq!(v.hits + v.misses, tokens * k * sparse, "{name}: {v:?}");
            selections = tokens * k * sparse;
        });
        let v = experts(&streamed);
        assert!(v.misses > 0 && v.hits > 0 && v.loads > v.misses / 2, "{name}: {v:?}");
        assert_eq!(v.routing_entropy.len() as u64, sparse);
        assert!(v.routing_entropy.iter().all(|l| l.bits.is_some_and(|h| h > 0.0 && h <= 3.0)), "{v:?}");
        // The same gathers over the same weights, a (token, expert) pair at a time: equal.
        let diff = max_diff(&got, &want);
        assert_eq!(diff, 0.0, "{name}: streamed logits differ");
        // MLX's own count of what the streamed model holds (what dropping it frees): its
        // weights less the experts, plus at most the cache's budget. Slack for MLX's own small
        // arrays of less than one expert, or 12 KB where experts are smaller (measured 1.1 KB
        // beside the 4-bit fixtures, 12 KB beside the float one, whose experts are 24 KB, and
        // 0.8 to 4.9 KB beside the gpt-oss GGUF, whose MXFP4 experts are 3.8 KB, once 9.0 KB
        // in a clean-clone CI run): an expert of the float fixtures beyond the budget fails.
        let active = mlx_rs::memory::active_memory().unwrap() as u64;
        drop(streamed);
        let held = active - mlx_rs::memory::active_memory().unwrap() as u64;
        let slack = (per_expert - 1).max(12 * 1024);
        let bound = other_weights + budget + slack;
        assert!(held <= bound, "{name}: the model held {held} bytes, weights {other_weights} + cache {budget} + {slack}");
        println!(
            "{name}: {total} experts of {per_expert} B, cache {budget} B, {selections} selections, hit ratio {:.2}, |diff| {diff}, held {held} B",
            v.hit_ratio.unwrap()
        );
    }
}

#[test]
fn a_cache_that_holds_every_expert_stops_missing_once_warm() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let streamed = load(&tiny("mixtral-4bit"), Some(u64::MAX));
    run(&streamed, &mut |_, _| {});
    let cold = experts(&streamed);
    assert!(cold.misses > 0 && cold.misses < cold.total_experts, "{cold:?}");
    run(&streamed, &mut |_, _| {});
    let warm = experts(&streamed);
    // The second pass routes as the first: every selection finds its expert.
    assert_eq!((warm.misses, warm.loads), (cold.misses, cold.loads), "{warm:?}");
    assert_eq!(warm.hits - cold.hits, cold.hits + cold.misses);
}

#[test]
fn a_file_cut_short_fails_the_step_and_the_model_recovers_when_it_is_back() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&tiny("mixtral-4bit"), dir.path());
    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let per_expert = experts(&load(dir.path(), Some(u64::MAX))).expert_bytes;
    // One expert's room: nearly every selection reads the file.
    let model = load(dir.path(), Some(per_expert));
    let mut cache = model.new_cache();
    model.forward(&[1, 2, 3], &mut cache).unwrap();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(bytes.len() as u64 / 3).unwrap();
    let err = format!("{:#}", model.forward(&[4, 5, 6, 7, 8, 9], &mut model.new_cache()).unwrap_err());
    assert!(err.contains("reading expert") && err.contains("model.safetensors"), "{err}");
    std::fs::write(&file, &bytes).unwrap();
    model.forward(&[4, 5, 6, 7, 8, 9], &mut model.new_cache()).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::await_holding_lock, reason = "the lock only orders whole tests: the others here are synchronous")]
async fn the_server_streams_a_model_shows_its_cache_and_survives_a_bad_read() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("mixtral-4bit");
    std::fs::create_dir(&model_dir).unwrap();
    copy_dir(&tiny("mixtral-4bit"), &model_dir);
    let content = "Tell me about the lighthouse keeper.";
    // Held to the end: the server's engine allocates in this process too.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (prompt_tokens, want) = common::engine_greedy(&model_dir, WeightFormat::Auto, content, 12);
    let per_expert = experts(&load(&model_dir, Some(u64::MAX))).expert_bytes;
    let config = Config {
        port: 0,
        model: Some(model_dir.clone()),
        expert_cache_bytes: Some(per_expert * 4),
        data_dir: Some(dir.path().join("data")),
        // Every request prefills in full: the selections are the request's own tokens.
        prefix_cache_bytes: Some(0),
        ..Config::default()
    };
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let client = reqwest::Client::new();
    let chat = |content: &str| json!({"model": "mixtral-4bit", "messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0});
    let r = client.post(format!("{base}/v1/chat/completions")).json(&chat(content)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want.as_str()), "{v}");
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens as u64));

    let models: Value = client.get(format!("{base}/api/models")).send().await.unwrap().json().await.unwrap();
    let card = models["models"].as_array().unwrap().iter().find(|m| m["id"] == "mixtral-4bit").unwrap().clone();
    let x = &card["experts"];
    assert_eq!((x["total_experts"].as_u64(), x["budget_bytes"].as_u64()), (Some(16), Some(per_expert * 4)), "{card}");
    assert!(x["resident_experts"].as_u64().unwrap() <= 4, "{card}");
    assert_eq!(card["info"]["expert_cache_bytes"].as_u64(), Some(per_expert * 4), "{card}");
    // mixtral: 2 of 8 experts in both layers, for every token but the last generated.
    let selections = (prompt_tokens as u64 + completion - 1) * 2 * 2;
    let metric = |name: &'static str| {
        let base = base.clone();
        async move { common_metric(&base, name).await }
    };
    assert_eq!(metric("mlxbar_expert_cache_hits_total").await + metric("mlxbar_expert_cache_misses_total").await, selections as f64);
    assert_eq!(metric("mlxbar_expert_cache_total_experts").await, 16.0);
    assert!(metric("mlxbar_expert_cache_bytes").await <= (per_expert * 4) as f64);
    assert!(metric("mlxbar_expert_load_seconds_count").await >= 1.0);
    assert!(metric("mlxbar_expert_read_bytes_total").await > 0.0);
    // What the Grafana row queries is in this scrape, and every expert series has its row in
    // dashboards/README.md (tests/dashboards.rs checks the rest against a server that does
    // not stream).
    let scrape = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let families: Vec<&str> =
        scrape.lines().filter_map(|l| l.strip_prefix("# TYPE mlxbar_expert_")).map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(families.len(), 9, "{families:?}");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for f in &families {
        assert!(readme.contains(&format!("| `mlxbar_expert_{f}` |")), "mlxbar_expert_{f} has no row in dashboards/README.md");
    }
    let grafana = std::fs::read_to_string(root.join("grafana/mlxbar.json")).unwrap();
    let queried: std::collections::BTreeSet<&str> = grafana
        .match_indices("mlxbar_expert_")
        .map(|(i, _)| {
            let name = &grafana[i..];
            let name = &name[..name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len())];
            name.trim_end_matches("_bucket")
        })
        .collect();
    assert!(queried.len() >= 5, "{queried:?}");
    for q in queried {
        assert!(families.iter().any(|f| q == format!("mlxbar_expert_{f}")), "the dashboard queries {q}, which is not exported");
    }

    // The file cut short: that request fails, the server stays up and serves again once
    // the file is whole.
    let file = model_dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(bytes.len() as u64 / 3).unwrap();
    let r =
        client.post(format!("{base}/v1/chat/completions")).json(&chat("A different question, for other experts?")).send().await.unwrap();
    assert_eq!(r.status(), 500);
    let err: Value = r.json().await.unwrap();
    assert!(err["error"]["message"].as_str().unwrap().contains("reading expert"), "{err}");
    std::fs::write(&file, &bytes).unwrap();
    let r = client.post(format!("{base}/v1/chat/completions")).json(&chat(content)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want.as_str()), "{v}");
    server.shutdown().await;
}

/// The value of an unlabelled-but-for-`model` series in the scrape.
async fn common_metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("model=\"mixtral-4bit\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}
