//! `mlxbar serve` as a process: SIGTERM drains (in-flight streams finish, new requests get
//! 503, exit 0), a port already in use is one clear line and a non-zero exit, and a model
//! that fails to load leaves the server up saying why.
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
