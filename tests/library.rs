//! The model library against real layouts built from the default model: a hub cache with
//! mlx-community style 4- and 8-bit folders (blobs + symlinks), LM Studio's GGUF layout,
//! folders the engine refuses, incomplete downloads, id clashes, the hub-cache env
//! precedence, the file-system watch, and `mlxbar models` as a process; and a server whose
//! models dir holds FIFOs named like model files: it starts, lists, rescans and answers
//! `/health` within a second throughout (scans never block on them, nor run on its runtime).
mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fixtures;
use mlxbar::library::{Library, ModelEntry, ModelFormat, ModelSource, Quantization, Sources};
use serde_json::json;

/// Sources with only what a test names (nothing from this machine's real folders).
fn sources(root: &Path) -> Sources {
    Sources { hub_caches: vec![], lmstudio: vec![], mlxbar_models: root.join("no-mlxbar-models"), models_dirs: vec![], paths: vec![] }
}

fn get(lib: &Library, id: &str) -> ModelEntry {
    lib.get(id).unwrap_or_else(|| panic!("no {id} in {:?}", lib.entries().iter().map(|e| &e.id).collect::<Vec<_>>()))
}

/// Polls `f` until it holds, for at most 10 s.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const SMOLLM2_PARAMS: u64 = 134_515_008;

#[test]
fn hub_cache_models_are_found_through_their_symlinked_blobs() {
    let root = tempfile::tempdir().unwrap();
    let hub = root.path().join("hub");
    let snap4 = fixtures::hub_cache(&hub, "mlx-community/SmolLM2-135M-Instruct-4bit", |d| fixtures::mlx_folder(d, Some(4)));
    let snap8 = fixtures::hub_cache(&hub, "mlx-community/SmolLM2-135M-Instruct-8bit", |d| fixtures::mlx_folder(d, Some(8)));
    assert!(snap8.join("model.safetensors").symlink_metadata().unwrap().is_symlink());
    let lib = Library::new(Sources { hub_caches: vec![hub.clone()], ..sources(root.path()) });
    assert_eq!(lib.entries().len(), 2);

    let mut sizes = vec![];
    for (snap, bits) in [(&snap4, 4), (&snap8, 8)] {
        let e = get(&lib, &format!("mlx-community/SmolLM2-135M-Instruct-{bits}bit"));
        assert_eq!(&e.path, snap);
        assert_eq!(e.revision.as_deref(), Some(snap.file_name().unwrap().to_str().unwrap()));
        assert_eq!((e.format, e.source), (ModelFormat::Mlx, ModelSource::HubCache));
        assert_eq!(e.architecture.as_deref(), Some("llama"));
        assert_eq!(e.quantization, Some(Quantization::affine(bits, 64)));
        assert_eq!(e.parameters, Some(SMOLLM2_PARAMS), "≈134.5M");
        assert_eq!((e.context_length, e.chat_template), (Some(8192), true));
        assert!(e.runnable, "{:?}", e.unsupported_reason);
        let shape = e.shape.unwrap();
        assert_eq!((shape.layers, shape.num_kv_heads, shape.head_dim, shape.tie_word_embeddings), (30, 3, 64, true));
        assert_eq!(e.kv_bytes_per_token(2), Some(2 * 30 * 3 * 64 * 2));
        // The size is the blob's, not the symlink's.
        let blob = std::fs::canonicalize(snap.join("model.safetensors")).unwrap();
        assert!(blob.starts_with(std::fs::canonicalize(&hub).unwrap()) && blob.parent().unwrap().ends_with("blobs"));
        assert_eq!(e.size_bytes, blob.metadata().unwrap().len());
        sizes.push(e.size_bytes);
    }
    assert!(sizes[0] > 60_000_000 && sizes[1] > sizes[0] * 3 / 2, "8 bits take more room than 4: {sizes:?}");
    // Runnable means the loader takes it: the requantized 8-bit folder loads.
    let (_, _, info) = mlxbar::engine::loader::load(&snap8, mlxbar::engine::WeightFormat::Float32).unwrap();
    assert_eq!((info.architecture, info.context_length), ("llama", 8192));
}

#[test]
fn an_lm_studio_gguf_is_read_from_its_header() {
    let root = tempfile::tempdir().unwrap();
    let lm = root.path().join("lmstudio");
    let file = fixtures::lmstudio_gguf(&lm, "lmstudio-community", "SmolLM2-135M-Instruct-GGUF");
    let lib = Library::new(Sources { lmstudio: vec![lm], ..sources(root.path()) });
    let e = get(&lib, "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(e.path, file);
    assert_eq!((e.format, e.source, e.revision.as_deref()), (ModelFormat::Gguf, ModelSource::LmStudio, None));
    assert_eq!(e.quantization, Some(Quantization::affine(4, 32)), "Q4_1");
    assert_eq!(e.size_bytes, mlxbar::model_store::DEFAULT_MODEL.size, "the link's target");
    assert_eq!(e.parameters, Some(SMOLLM2_PARAMS));
    assert_eq!((e.architecture.as_deref(), e.context_length, e.chat_template), (Some("llama"), Some(8192), true));
    assert_eq!(e.shape.unwrap().vocab_size, 49152);
    assert!(e.runnable, "{:?}", e.unsupported_reason);
    assert_eq!(e.float32_weight_bytes(), Some(SMOLLM2_PARAMS * 4));
}

#[test]
fn refused_models_say_why() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("models");
    fixtures::unknown_arch_folder(&dir.join("gpt-bigcode-tiny"));
    fixtures::vision_folder(&dir.join("llava-tiny"));
    fixtures::tiny_supported_folder(&dir.join("no-tokenizer"));
    std::fs::remove_file(dir.join("no-tokenizer/tokenizer.json")).unwrap();
    fixtures::tiny_supported_folder(&dir.join("fine"));
    let lib = Library::new(Sources { models_dirs: vec![dir], ..sources(root.path()) });
    let why = |id: &str| {
        let e = get(&lib, id);
        assert_eq!(e.source, ModelSource::ModelsDir);
        assert!(!e.runnable || e.unsupported_reason.is_none());
        e.unsupported_reason
    };
    assert_eq!(
        why("gpt-bigcode-tiny").as_deref(),
        Some("unsupported architecture 'gpt_bigcode' (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, phi3, gemma3, gpt_oss)")
    );
    assert_eq!(get(&lib, "gpt-bigcode-tiny").architecture.as_deref(), Some("gpt_bigcode"));
    let vision = why("llava-tiny").unwrap();
    assert!(vision.starts_with("vision model (LlavaForConditionalGeneration"), "{vision}");
    assert_eq!(why("no-tokenizer").as_deref(), Some("no tokenizer.json"));
    assert_eq!(why("fine"), None);
}

#[test]
fn incomplete_hub_downloads_are_not_runnable() {
    let root = tempfile::tempdir().unwrap();
    let hub = root.path().join("hub");
    // A weight blob gone (a cleaned cache or an interrupted copy): the link dangles.
    let snap = fixtures::hub_cache(&hub, "org/dangling", fixtures::tiny_supported_folder);
    std::fs::remove_file(std::fs::canonicalize(snap.join("model.safetensors")).unwrap()).unwrap();
    // Still downloading: config and tokenizer there, the weights an `.incomplete` blob.
    let snap = fixtures::hub_cache(&hub, "org/downloading", |d| {
        fixtures::tiny_supported_folder(d);
        std::fs::remove_file(d.join("model.safetensors")).unwrap();
    });
    std::fs::write(snap.join("../../blobs/0123abcd.incomplete"), b"partial").unwrap();
    fixtures::hub_cache(&hub, "org/complete", fixtures::tiny_supported_folder);
    let lib = Library::new(Sources { hub_caches: vec![hub], ..sources(root.path()) });
    for id in ["org/dangling", "org/downloading"] {
        let e = get(&lib, id);
        let why = e.unsupported_reason.unwrap_or_default();
        assert!(!e.runnable && why.starts_with("incomplete download"), "{id}: {why}");
    }
    assert!(get(&lib, "org/complete").runnable);
}

#[test]
fn clashing_ids_stay_unique_and_stable() {
    let root = tempfile::tempdir().unwrap();
    let mlxbar_models = root.path().join("mlxbar-models");
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    for d in [&mlxbar_models, &a, &b] {
        fixtures::unknown_arch_folder(&d.join("tiny"));
    }
    // The same GGUF reached twice (LM Studio links it from mlxbar's dir): listed once.
    std::fs::create_dir_all(&mlxbar_models).unwrap();
    std::os::unix::fs::symlink(common::model_path(), mlxbar_models.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let lm = root.path().join("lm");
    fixtures::lmstudio_gguf(&lm, "pub", "smol");
    let lib = Library::new(Sources { mlxbar_models, models_dirs: vec![a.clone(), b.clone()], lmstudio: vec![lm], ..sources(root.path()) });
    let ids: Vec<String> = lib.entries().into_iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(get(&lib, "SmolLM2-135M-Instruct.Q4_1").source, ModelSource::Mlxbar, "the first source keeps the id");
    assert_eq!(get(&lib, "tiny").source, ModelSource::Mlxbar);
    assert_eq!(get(&lib, "tiny@models-dir").path, a.join("tiny"));
    let hashed = ids.iter().find(|i| i.starts_with("tiny@") && *i != "tiny@models-dir").unwrap();
    assert_eq!(get(&lib, hashed).path, b.join("tiny"));
    let generation = lib.generation();
    assert_eq!(lib.refresh(), generation, "nothing changed: the same generation");
    assert_eq!(lib.entries().into_iter().map(|e| e.id).collect::<Vec<_>>(), ids, "ids do not move on a rescan");
}

#[test]
fn hf_hub_cache_wins_over_hf_home() {
    let root = tempfile::tempdir().unwrap();
    let hf_home = root.path().join("hf-home");
    let hub_cache = root.path().join("hub-cache");
    fixtures::hub_cache(&hf_home.join("hub"), "org/in-hf-home", fixtures::tiny_supported_folder);
    fixtures::hub_cache(&hub_cache, "org/in-hub-cache", fixtures::tiny_supported_folder);
    let home = root.path().join("home");
    let ids = |vars: Vec<(&'static str, PathBuf)>| {
        let var = move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v));
        let mut s = Sources::from_vars(var, Some(home.clone()), vec![], vec![]);
        s.mlxbar_models = root.path().join("none");
        Library::new(s).entries().into_iter().map(|e| e.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(vec![("HF_HOME", hf_home.clone())]), ["org/in-hf-home"]);
    assert_eq!(ids(vec![("HF_HOME", hf_home.clone()), ("HF_HUB_CACHE", hub_cache.clone())]), ["org/in-hub-cache"]);
    assert!(ids(vec![]).is_empty(), "~/.cache/huggingface/hub under the empty home");
}

#[test]
fn the_watch_picks_up_new_and_removed_models() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("models");
    std::fs::create_dir_all(&dir).unwrap();
    // A source that does not exist yet (LM Studio not installed).
    let lm = root.path().join("later").join("models");
    let lib = Arc::new(Library::new(Sources { models_dirs: vec![dir.clone()], lmstudio: vec![lm.clone()], ..sources(root.path()) }));
    let changes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = changes.clone();
    lib.on_change(move |g| seen.store(g, std::sync::atomic::Ordering::SeqCst));
    let start = lib.generation();
    let watcher = lib.watch().unwrap();

    fixtures::tiny_supported_folder(&dir.join("new-model"));
    eventually("the new folder", || lib.get("new-model").is_some_and(|e| e.runnable));
    assert!(lib.generation() > start);
    assert_eq!(changes.load(std::sync::atomic::Ordering::SeqCst), lib.generation(), "listeners hear of it");

    fixtures::lmstudio_gguf(&lm, "pub", "smol");
    eventually("a model in a source that appeared", || lib.get("SmolLM2-135M-Instruct.Q4_1").is_some());

    std::fs::remove_dir_all(dir.join("new-model")).unwrap();
    eventually("the removal", || lib.get("new-model").is_none());

    drop(watcher);
    let after = lib.generation();
    fixtures::tiny_supported_folder(&dir.join("unwatched"));
    assert_eq!(lib.refresh(), after + 1, "a dropped watcher left refresh to the caller");
}

#[test]
fn mlxbar_models_lists_the_hub_cache_as_json_and_a_table() {
    let root = tempfile::tempdir().unwrap();
    let hub = root.path().join("hub");
    fixtures::hub_cache(&hub, "org/tiny", fixtures::tiny_supported_folder);
    fixtures::hub_cache(&hub, "org/bigcode", fixtures::unknown_arch_folder);
    let extra = root.path().join("extra");
    fixtures::vision_folder(&extra.join("llava-tiny"));
    let config = root.path().join("config.toml");
    std::fs::write(&config, format!("models_dirs = [{:?}]\n", extra.display().to_string())).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlxbar"))
            .arg("models")
            .args(args)
            .env("HF_HUB_CACHE", &hub)
            .env("HOME", root.path().join("home"))
            .env("XDG_CONFIG_HOME", root.path().join("config-home"))
            .env("MLXBAR_CACHE_DIR", root.path().join("mlxbar-cache"))
            .env_remove("MLXBAR_CONFIG")
            .env_remove("HF_HOME")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
    let list = json.as_array().unwrap();
    let ids: Vec<&str> = list.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["org/bigcode", "org/tiny"]);
    assert_eq!(list[1]["source"], "hub-cache");
    assert_eq!(list[1]["runnable"], true);
    assert_eq!(list[1]["revision"], fixtures::revision_of("org/tiny"));
    assert_eq!(list[0]["runnable"], false);

    let table = run(&["--config", config.to_str().unwrap()]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ID") && lines[0].ends_with("RUNNABLE"), "{table}");
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines.iter().any(|l| l.starts_with("llava-tiny") && l.contains("no: vision model")), "{table}");
    assert!(lines.iter().any(|l| l.starts_with("org/tiny ") && l.ends_with("yes")), "{table}");
}

/// A FIFO at `path`: opening it for reading waits for a writer, for ever.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// `common::start_server`, failing after `secs` instead of waiting for ever.
fn start_server_within(config: mlxbar::Config, secs: u64) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let server = mlxbar::Server::start(config).await.expect("server start");
            server.wait_ready().await.expect("model load");
            let _ = tx.send(format!("http://{}", server.local_addr()));
            std::future::pending::<()>().await;
        });
    });
    rx.recv_timeout(Duration::from_secs(secs)).unwrap_or_else(|_| panic!("the server did not start within {secs} s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_named_like_models_never_block_the_server() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("models");
    fixtures::tiny_supported_folder(&dir.join("fine"));
    mkfifo(&dir.join("x.gguf"));
    std::fs::create_dir_all(dir.join("fifo-config")).unwrap();
    mkfifo(&dir.join("fifo-config/config.json"));
    fixtures::tiny_supported_folder(&dir.join("half"));
    std::fs::remove_file(dir.join("half/model.safetensors")).unwrap();
    mkfifo(&dir.join("half/model.safetensors"));
    let config = mlxbar::Config { models_dirs: vec![dir.clone()], ..common::test_config() };
    let base = start_server_within(config, 120);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap();
    let slow = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();

    let library: serde_json::Value = slow.get(format!("{base}/api/models")).send().await.unwrap().json().await.unwrap();
    let model = |list: &serde_json::Value, id: &str| list["models"].as_array().unwrap().iter().find(|m| m["id"] == id).cloned();
    assert_eq!(model(&library, "fine").map(|m| m["runnable"].clone()), Some(json!(true)), "{library}");
    let half = model(&library, "half").expect("a folder with a FIFO for weights is listed, refused");
    let why = half["unsupported_reason"].as_str().unwrap();
    assert!(why.contains("not a regular file") && why.contains("model.safetensors"), "{why}");
    assert!(model(&library, "x").is_none() && model(&library, "fifo-config").is_none(), "FIFOs are not models: {library}");

    // More FIFOs while it runs (the watch rescans), requests naming unknown models (each may
    // rescan), explicit refreshes: /health answers within a second all along.
    mkfifo(&dir.join("y.gguf"));
    let mut busy = Vec::new();
    for i in 0..4 {
        let (c, b) = (slow.clone(), base.clone());
        busy.push(tokio::spawn(async move {
            let chat = json!({"model": format!("no-such-model-{i}"), "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
            c.post(format!("{b}/v1/chat/completions")).json(&chat).send().await.unwrap().status().as_u16()
        }));
        let (c, b) = (slow.clone(), base.clone());
        busy.push(tokio::spawn(async move {
            c.post(format!("{b}/api/models/refresh")).json(&json!({})).send().await.unwrap().status().as_u16()
        }));
    }
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until || !busy.iter().all(|b| b.is_finished()) {
        let asked = Instant::now();
        let health = client.get(format!("{base}/health")).send().await;
        assert!(health.is_ok_and(|r| r.status() == 200), "/health did not answer within 1 s");
        assert!(asked.elapsed() < Duration::from_secs(1));
        assert!(Instant::now() < until + Duration::from_secs(30), "requests still running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for b in busy {
        assert!([404, 200].contains(&b.await.unwrap()));
    }

    // A model copied in is found by the next request naming it (a rescan, off the runtime).
    fixtures::unknown_arch_folder(&dir.join("just-copied"));
    let chat = json!({"model": "just-copied", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
    let r = slow.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 422, "found, and refused for what it is: {body}");

    // The rescan is a POST (JSON, same-origin rules); the old GET form says where it went.
    let r = slow.get(format!("{base}/api/models?refresh=true")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let err: serde_json::Value = r.json().await.unwrap();
    assert!(err["error"]["message"].as_str().unwrap().contains("POST /api/models/refresh"), "{err}");
    let refreshed: serde_json::Value =
        slow.post(format!("{base}/api/models/refresh")).json(&json!({})).send().await.unwrap().json().await.unwrap();
    assert!(model(&refreshed, "just-copied").is_some() && model(&refreshed, "y").is_none(), "{refreshed}");
    let r = slow.post(format!("{base}/api/models/refresh")).header("content-type", "text/plain").body("{}").send().await.unwrap();
    assert_eq!(r.status(), 415);
    let r = slow.post(format!("{base}/api/models/refresh")).header("origin", "https://evil.example").json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let r = slow.post(format!("{base}/api/models/refresh")).json(&json!({"deep": true})).send().await.unwrap();
    assert_eq!(r.status(), 400, "no field silently ignored");
}
