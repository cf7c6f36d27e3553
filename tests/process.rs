//! `mlxbar serve` as a process: SIGTERM drains (in-flight streams finish, new requests get
//! 503, exit 0), a port already in use is one clear line and a non-zero exit, and a model
//! that fails to load leaves the server up saying why; a stuck step or load wedges nothing
//! (test hooks armed for the child), and a memory-limited cgroup refuses a model too big.
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

/// `mlxbar serve` on `port` with the default model and `data_dir/config.toml` (created empty
/// if missing, so no user config leaks in).
fn serve(port: u16, data_dir: &std::path::Path) -> Child {
    serve_model(port, data_dir, &common::model_path())
}

fn serve_model(port: u16, data_dir: &std::path::Path, model: &std::path::Path) -> Child {
    let config = data_dir.join("config.toml");
    if !config.exists() {
        std::fs::write(&config, "").unwrap();
    }
    Command::new(env!("CARGO_BIN_EXE_mlxbar"))
        .args(["serve", "--port", &port.to_string(), "--model"])
        .arg(model)
        .env("MLXBAR_DATA_DIR", data_dir)
        .env("MLXBAR_CONFIG", &config)
        .env_remove("MLXBAR_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the child's log until a line contains `marker`; returns where it listens and a
/// thread that keeps draining its stderr (so it never blocks on a full pipe) into a string.
fn listen_until(child: &mut Child, marker: &str) -> (String, std::thread::JoinHandle<String>) {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut base = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            base = Some(rest.split_whitespace().next().unwrap().to_string());
        }
        if line.contains(marker) {
            break;
        }
    }
    let base = base.expect("the server said where it listens");
    (base, std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n")))
}

/// Waits for the child to exit, at most `secs`.
fn wait_exit(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the server did not exit within {secs} s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_port_in_use_is_one_line_and_a_non_zero_exit() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let mut child = serve(port, dir.path());
    let status = wait_exit(&mut child, 60);
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(&format!("port {port} on 127.0.0.1 is already in use")) && lines[0].contains("--port"), "{stderr}");
    drop(taken);
}

/// An empty key (exported empty, on the command line or in the file) and a wildcard Host
/// without a key would each switch the DNS-rebinding defence off: both are startup errors.
#[test]
fn an_empty_api_key_or_any_host_without_a_key_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let run = |args: &[&str], env_key: Option<&str>, file: &str| {
        std::fs::write(&config, file).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlxbar"));
        cmd.arg("serve").args(args).args(["--port", "0", "--model"]).arg(common::model_path());
        cmd.env("MLXBAR_DATA_DIR", dir.path()).env("MLXBAR_CONFIG", &config).env_remove("MLXBAR_API_KEY").stdin(Stdio::null());
        if let Some(k) = env_key {
            cmd.env("MLXBAR_API_KEY", k);
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for (args, env_key, file) in [(&[][..], Some(""), ""), (&["--api-key", ""][..], None, ""), (&[][..], None, "api_key = \"\"\n")] {
        let (code, stderr) = run(args, env_key, file);
        assert_ne!(code, Some(0), "{args:?} {env_key:?} {file:?}: {stderr}");
        assert!(stderr.contains("API key is empty"), "{args:?} {env_key:?} {file:?}: {stderr}");
    }
    let (code, stderr) = run(&["--allowed-host", "*"], None, "");
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("DNS-rebinding"), "{stderr}");
    let (code, stderr) = run(&[], None, "allowed_hosts = [\"*\"]\n");
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("DNS-rebinding"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_streams_finish_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), "shutdown_grace_seconds = 60\n").unwrap();
    let mut child = serve(0, dir.path());
    let (base, log) = listen_until(&mut child, "ready: model");

    let http = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "Write a poem about the sea."}], "max_tokens": 40, "temperature": 0, "stream": true});
    let resp = http.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut stream = common::sse(resp);
    common::read_tokens(&mut stream, 1).await;
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    // Draining: /health says so, new generation requests get 503.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = http.get(format!("{base}/health")).send().await.unwrap();
        if h.status() == 503 && h.json::<Value>().await.unwrap()["status"] == "stopping" {
            break;
        }
        assert!(Instant::now() < deadline, "health never said stopping");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.json::<Value>().await.unwrap()["error"]["code"], "shutting_down");
    // The stream in flight runs to its end.
    let rest: Vec<String> = stream.map(|e| e.data).collect().await;
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "{rest:?}");
    assert!(rest.iter().any(|d| d.contains("\"finish_reason\":\"length\"")), "{rest:?}");
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut child, 60)).await.unwrap();
    let log = log.join().unwrap();
    assert!(status.success(), "exit {status:?}\n{log}");
}

#[tokio::test]
async fn a_model_that_fails_to_load_leaves_the_server_up_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("cut.gguf");
    let bytes = std::fs::read(common::model_path()).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let mut child = serve_model(0, dir.path(), &model);
    let (base, _log) = listen_until(&mut child, "the model did not load");
    let r = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(r.status(), 503);
    let h: Value = r.json().await.unwrap();
    assert_eq!(h["status"], "failed");
    assert!(h["detail"].as_str().unwrap().contains("cut.gguf"), "{h}");
    assert_eq!(reqwest::get(format!("{base}/metrics")).await.unwrap().status(), 200);
    assert!(child.try_wait().unwrap().is_none(), "the process is still running");
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut child, 30)).await.unwrap();
    assert!(status.success(), "{status:?}");
}

/// `mlxbar serve` on the default model with `data_dir/config.toml` and the fault hooks
/// armed (through the variable only test harnesses set).
fn serve_armed(data_dir: &std::path::Path) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlxbar"));
    cmd.args(["serve", "--port", "0", "--model"]).arg(common::model_path());
    cmd.env("MLXBAR_DATA_DIR", data_dir).env("MLXBAR_CONFIG", data_dir.join("config.toml")).env_remove("MLXBAR_API_KEY");
    cmd.env(mlxbar::engine::faults::ARM_VARIABLE, "1").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// An armed `mlxbar serve` ([`serve_armed`]) with `config` (TOML) and a library folder that
/// holds the default model's file (a hard link, or a copy) under each of `names`; ready to
/// serve. Returns its data dir (kept alive by the caller), the child, its URL and its log.
fn armed_with_library(names: &[&str], config: &str) -> (tempfile::TempDir, Child, String, std::thread::JoinHandle<String>) {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    for name in names {
        let path = models.join(format!("{name}.gguf"));
        std::fs::hard_link(common::model_path(), &path).or_else(|_| std::fs::copy(common::model_path(), &path).map(drop)).unwrap();
    }
    std::fs::write(dir.path().join("config.toml"), format!("{config}models_dirs = [{:?}]\n", models.display().to_string())).unwrap();
    let mut child = serve_armed(dir.path());
    let (base, log) = listen_until(&mut child, "ready: model");
    (dir, child, base, log)
}

/// A step that never returns (a test hook stalls it) wedges nothing: the stuck request ends
/// with 503 `engine_stuck`, a reload answers at once (409 while it runs) and replaces the
/// engine once the old one is left behind (`restart_required` in /health, /metrics, the
/// snapshot and the alert), another model loads and serves, and SIGTERM still exits 0
/// within the grace period plus the engine-stop deadline. On a main without bounded stops,
/// the reload, the second model and the exit all wait for the stuck step for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_step_wedges_nothing() {
    let (_dir, mut child, base, log) =
        armed_with_library(&["smollm2-second"], "engine_stop_seconds = 2\nshutdown_grace_seconds = 2\nstall_seconds = 1\n");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let chat = |content: String, model: Option<&str>| {
        let mut body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 3, "temperature": 0});
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        http.post(format!("{base}/v1/chat/completions")).json(&body).send()
    };
    let stuck = tokio::spawn(chat(format!("{} Hi", mlxbar::engine::faults::STALL), None));
    common::until("health to say stalled", 30, async || {
        let h: Value = http.get(format!("{base}/health")).send().await.ok()?.json().await.ok()?;
        (h["status"] == "stalled").then_some(())
    })
    .await;

    // The reload answers at once; a second one while it waits for the stuck thread is 409.
    let reload = http.post(format!("{base}/api/engine/reload")).json(&json!({})).send().await.unwrap();
    assert_eq!(reload.status(), 202, "{:?}", reload.text().await);
    let again = http.post(format!("{base}/api/engine/reload")).json(&json!({})).send().await.unwrap();
    assert_eq!(again.status(), 409);
    assert_eq!(again.json::<Value>().await.unwrap()["error"]["code"], "models_busy");

    // The stuck request ends: its engine was left behind.
    let stuck = stuck.await.unwrap().expect("the stuck request is answered");
    assert_eq!(stuck.status(), 503);
    let e: Value = stuck.json().await.unwrap();
    assert_eq!(e["error"]["code"], "engine_stuck", "{e}");

    // The reload brought a fresh engine; the old one's memory needs a restart, and says so.
    let health = common::until("the reloaded engine to be ready", 60, async || {
        let h: Value = http.get(format!("{base}/health")).send().await.ok()?.json().await.ok()?;
        (h["status"] == "ok").then_some(h)
    })
    .await;
    assert!(health["restart_required"].as_str().is_some_and(|r| r.contains("restart")), "{health}");
    let snap: Value = http.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap();
    assert!(snap["scheduler"]["restart_required"].as_str().is_some_and(|r| r.contains("stuck")), "{}", snap["scheduler"]);
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "mlxbar_engine_restart_required 1"), "{metrics}");
    common::until("the restart_required alert to fire", 30, async || {
        let a: Value = http.get(format!("{base}/api/alerts")).send().await.ok()?.json().await.ok()?;
        a["data"].as_array()?.iter().any(|a| a["id"] == "restart_required" && a["firing"] == true).then_some(())
    })
    .await;

    // Both the reloaded default and another model serve.
    for model in [None, Some("smollm2-second")] {
        let r = chat("Say hi.".into(), model).await.unwrap();
        assert_eq!(r.status(), 200, "{model:?}: {:?}", r.text().await);
        let answer: Value = r.json().await.unwrap();
        assert!(!answer["choices"][0]["message"]["content"].as_str().unwrap_or("").is_empty(), "{answer}");
    }

    // SIGTERM: the left-behind thread does not hold the exit.
    let signalled = Instant::now();
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut child, 30)).await.unwrap();
    let log = log.join().unwrap();
    assert!(status.success(), "exit {status:?}\n{log}");
    assert!(signalled.elapsed() < Duration::from_secs(15), "exit took {:?}", signalled.elapsed());
}

/// A load that never ends (a test hook stalls it) wedges nothing: while it holds the
/// registry, a reload answers 409 at once; after `load_timeout_seconds` the request that
/// asked for it gets a 503 naming the timeout, the model is failed with the reason, the
/// server says a restart is required, the default model serves on and SIGTERM exits 0. On
/// a main without a load timeout the request waits for the stuck load for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_load_wedges_nothing() {
    let stuck_id = format!("stuck{}", mlxbar::engine::faults::STALL_LOAD);
    let (_dir, mut child, base, log) =
        armed_with_library(&[stuck_id.as_str()], "load_timeout_seconds = 3\nengine_stop_seconds = 1\nshutdown_grace_seconds = 2\n");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let chat = |model: &str| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "temperature": 0});
        http.post(format!("{base}/v1/chat/completions")).json(&body).send()
    };
    let asked = Instant::now();
    let stuck = tokio::spawn(chat(&stuck_id));
    common::until("the stuck model to be loading", 30, async || {
        let l: Value = http.get(format!("{base}/api/models")).send().await.ok()?.json().await.ok()?;
        l["models"].as_array()?.iter().any(|m| m["id"] == stuck_id.as_str() && m["state"] == "loading").then_some(())
    })
    .await;
    let reload = http.post(format!("{base}/api/engine/reload")).json(&json!({})).send().await.unwrap();
    assert_eq!(reload.status(), 409, "a reload while a load holds the registry");
    assert_eq!(reload.json::<Value>().await.unwrap()["error"]["code"], "models_busy");

    let stuck = stuck.await.unwrap().expect("the request for the stuck model is answered");
    let waited = asked.elapsed();
    assert_eq!(stuck.status(), 503);
    let e: Value = stuck.json().await.unwrap();
    let message = e["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not finish within 3 s (load_timeout_seconds)"), "{e}");
    assert!(waited < Duration::from_secs(20), "answered after {waited:?}");

    let listing: Value = http.get(format!("{base}/api/models")).send().await.unwrap().json().await.unwrap();
    let entry = listing["models"].as_array().unwrap().iter().find(|m| m["id"] == stuck_id.as_str()).unwrap().clone();
    assert_eq!(entry["state"], "failed", "{entry}");
    assert!(entry["error"].as_str().is_some_and(|r| r.contains("load_timeout_seconds")), "{entry}");
    let health: Value = http.get(format!("{base}/health")).send().await.unwrap().json().await.unwrap();
    assert!(health["restart_required"].as_str().is_some_and(|r| r.contains("load_timeout_seconds")), "{health}");

    // The default model serves on, and a reload goes through now that nothing holds the registry.
    let default = listing["default"].as_str().unwrap().to_string();
    let r = chat(&default).await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let reload = http.post(format!("{base}/api/engine/reload")).json(&json!({})).send().await.unwrap();
    assert_eq!(reload.status(), 202, "{:?}", reload.text().await);

    let signalled = Instant::now();
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut child, 30)).await.unwrap();
    let log = log.join().unwrap();
    assert!(status.success(), "exit {status:?}\n{log}");
    assert!(signalled.elapsed() < Duration::from_secs(15), "exit took {:?}", signalled.elapsed());
}

/// In a container's memory limit (a cgroup v1 or v2 memory group, made here as a child of
/// this test's own), the budget takes the group's limit as the machine's memory: a model
/// too big for it (the 1B scale fixture, ~0.7 GB loaded) is refused with a 507 naming what it
/// needs and what is available, where reading the machine's memory would start the load and
/// end in the kernel's OOM killer. The server serves on. Needs a writable memory cgroup
/// (root, as CI runs): without one the test fails and says so.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_memory_limited_cgroup_a_model_too_big_is_refused_not_oom_killed() {
    use mlxbar::telemetry::memory::cgroup;
    const LIMIT: u64 = 640 << 20;
    let own = cgroup::own_group(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let group = own
        .iter()
        .find_map(|g| {
            let m = cgroup::mount(&mountinfo, g.version)?;
            let rel = g.path.strip_prefix(&m.root).unwrap_or(&g.path).trim_start_matches('/');
            let dir = m.mount_point.join(rel).join(format!("mlxbar-test-{}", std::process::id()));
            std::fs::create_dir(&dir).ok()?;
            let limit_file = if g.version == 1 { "memory.limit_in_bytes" } else { "memory.max" };
            std::fs::write(dir.join(limit_file), LIMIT.to_string()).ok().map(|_| dir)
        })
        .expect("this test needs a writable cgroup memory controller (run as root, as CI does)");
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _group = Remove(group.clone());

    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    std::os::unix::fs::symlink(common::fixtures::scale_folder(), models.join("big-1b")).unwrap();
    std::fs::write(dir.path().join("config.toml"), format!("models_dirs = [{:?}]\n", models.display().to_string())).unwrap();
    // The shell joins the group, then becomes the server: everything it allocates is charged.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" serve --port 0 --model "$3""#)
        .arg("sh")
        .arg(&group)
        .arg(env!("CARGO_BIN_EXE_mlxbar"))
        .arg(common::model_path())
        .env("MLXBAR_DATA_DIR", dir.path())
        .env("MLXBAR_CONFIG", dir.path().join("config.toml"))
        .env_remove("MLXBAR_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (base, log) = listen_until(&mut child, "ready: model");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let snap: Value = http.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json().await.unwrap();
    let system = &snap["memory"]["system"];
    assert_eq!(system["cgroup"]["limit"], LIMIT, "the server sees its group's limit: {system}");
    assert_eq!(system["total"], LIMIT, "{system}");

    let r = http.post(format!("{base}/api/models/big-1b/load")).json(&json!({})).send().await.unwrap();
    let status = r.status();
    let e: Value = r.json().await.unwrap();
    assert_eq!(status, 507, "{e}");
    assert_eq!(e["error"]["code"], "insufficient_memory", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    // what it needs, and what is left (of the machine's memory, or of the budget: by default
    // the MLX memory limit, 75 % of the group's limit)
    let available = message.contains("is available without swapping") || message.contains("is left within the memory budget");
    assert!(message.starts_with("big-1b needs ~") && available, "both figures: {message}");
    let library: Value = http.get(format!("{base}/api/models")).send().await.unwrap().json().await.unwrap();
    let big = library["models"].as_array().unwrap().iter().find(|m| m["id"] == "big-1b").expect("the fixture is listed").clone();
    assert_ne!(big["state"], "loaded", "{big}");

    // Alive and serving.
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(child.try_wait().unwrap().is_none(), "the server is alive");
    // SAFETY: kill(2) on our own child's pid (the shell exec'd the server), a valid signal.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || wait_exit(&mut child, 60)).await.unwrap();
    assert!(status.success(), "{status:?}\n{}", log.join().unwrap());
}
