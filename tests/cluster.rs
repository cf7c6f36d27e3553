//! Several `mlxbar` processes serving the default model together over MLX's ring backend
//! (ranks on 127.0.0.1, as the wheel's ring runs them here), against one process serving it
//! alone. Pipeline parallel: the same greedy answers (the hidden states cross the ring
//! exactly, so each rank computes what the one process computes for its layers). Tensor
//! parallel: the same greedy answer within a measured logprob tolerance, and the shares.
//! Both: batching, structured output and cancellation through rank 0; the faults (a rank
//! killed or hung mid-stream, a rank lost while idle, a rank that never joins) ending
//! within their deadlines; with `--on-rank-lost rejoin`, a lost rank waited for and the
//! cluster serving again once it is back; idle ranks asleep rather than polling; each
//! rank's memory its share of the 1B scale fixture.
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::{until, ANSWER, QUESTION};
use serde_json::{json, Value};

/// Ring ports: a block per cluster of this test binary, below Linux's ephemeral range
/// (32768 up) so no client socket holds one.
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

fn ring_port() -> u16 {
    20000 + (std::process::id() % 250) as u16 * 40 + NEXT_PORT.fetch_add(4, Ordering::Relaxed)
}

fn hostfile(dir: &Path, ranks: usize) -> std::path::PathBuf {
    let path = dir.join("hosts.json");
    let hosts: Vec<Value> = (0..ranks).map(|_| json!({"ssh": "localhost", "ips": ["127.0.0.1"]})).collect();
    std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
    path
}

/// A process whose stderr lines arrive on a channel; killed when dropped.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(mut cmd: Command, data_dir: &Path) -> Proc {
        // An empty config file: the user's own never applies.
        let config = data_dir.join("config.toml");
        std::fs::write(&config, "").unwrap();
        cmd.env("MLXBAR_DATA_DIR", data_dir).env("MLXBAR_CONFIG", &config).env_remove("MLXBAR_API_KEY");
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let _ = tx.send(line);
            }
        });
        Proc { child, lines }
    }

    /// The first stderr line containing `what`, within `secs`.
    fn line(&self, what: &str, secs: u64) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("no line with {what:?} within {secs} s"),
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the process ended before a line with {what:?}"),
            }
        }
    }

    /// The first stderr line containing each of `whats`, in whatever order they come,
    /// within `secs`.
    fn lines(&self, whats: &[&str], secs: u64) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        let mut found: Vec<Option<String>> = vec![None; whats.len()];
        while found.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|e| panic!("no lines with all of {whats:?} within {secs} s: {e}"));
            for (slot, what) in found.iter_mut().zip(whats) {
                if slot.is_none() && line.contains(what) {
                    *slot = Some(line.clone());
                }
            }
        }
        found.into_iter().flatten().collect()
    }

    /// rank 0's URL, once it serves.
    fn url(&self) -> String {
        let url = self.listening();
        self.line("ready: model", 120);
        url
    }

    /// rank 0's URL, once it listens (before the model is ready).
    fn listening(&self) -> String {
        listening_url(&self.line("listening on http://", 60))
    }

    fn exits_within(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "pid {} still running after {secs} s", self.child.id());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    /// SIGTERM first, so a launcher stops its ranks and a rank 0 tells its followers to stop
    /// (SIGKILL would leave them running after a failed test); SIGKILL past 10 s.
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child this test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a "listening on http://…" line.
fn listening_url(line: &str) -> String {
    format!("http://{}", line.split("http://").nth(1).unwrap().split_whitespace().next().unwrap())
}

fn mlxbar() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mlxbar"))
}

/// `mlxbar serve --hostfile F --rank r --parallel P` for every rank, highest first
/// (`parallel` may carry more flags after the mode).
fn ranks_by_hand(dir: &Path, ranks: usize, parallel: &str) -> Vec<Proc> {
    hostfile(dir, ranks);
    let port = ring_port();
    let mut procs: Vec<Proc> = (0..ranks).rev().map(|r| rank_by_hand(dir, port, r, parallel, &common::model_path())).collect();
    procs.reverse();
    procs
}

/// Rank `r` of the cluster in `dir`'s host file serving `model`, its ring from `port`.
fn rank_by_hand(dir: &Path, port: u16, r: usize, parallel: &str, model: &Path) -> Proc {
    let mut cmd = mlxbar();
    cmd.args(["serve", "--port", "0", "--ring-port", &port.to_string(), "--rank", &r.to_string(), "--parallel"]);
    cmd.args(parallel.split_whitespace()).arg("--hostfile").arg(dir.join("hosts.json"));
    cmd.arg("--model").arg(model);
    Proc::spawn(cmd, dir)
}

fn chat_body(content: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": max_tokens})
}

async fn answer(base: &str, body: &Value) -> Value {
    let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(body).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{base}");
    resp.json().await.unwrap()
}

fn text(v: &Value) -> String {
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

/// Requests whose answers the cluster must give as one process does. Each is sent once
/// to each server, and each system message differs from its first token: no two prompts
/// share a 16-token block, so neither server finds a cached prefix (on AMX CPUs KV reused
/// from another prompt's prefill may differ in its last bits from KV prefilled afresh).
fn distinct(system: &str, user: &str) -> Value {
    json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "temperature": 0, "max_tokens": 24})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_launched_ranks_serve_as_one_process_does() {
    let single = common::server();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hostfile(dir.path(), 2);
    let mut cmd = mlxbar();
    let port = ring_port().to_string();
    cmd.args(["cluster", "launch", "--ring-port", &port, "--hostfile"]).arg(&hosts);
    cmd.args(["--", "--port", "0", "--on-rank-lost", "rejoin", "--model"]).arg(common::model_path());
    let mut launcher = Proc::spawn(cmd, dir.path());
    let base = launcher.url();

    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);
    for body in [
        distinct("Colors are your subject.", "Name three colors."),
        distinct("Poetry is your craft.", "Write a haiku about the sea."),
        distinct("Explain software plainly.", "What does a compiler do?"),
    ] {
        assert_eq!(text(&answer(&base, &body).await), text(&answer(single, &body).await), "{body}");
    }

    // Four streams batched together, each answered whole.
    let body = chat_body(QUESTION, 24);
    let answers = futures::future::join_all((0..4).map(|_| answer(&base, &body))).await;
    for a in &answers {
        assert_eq!(text(a), ANSWER);
    }

    structured_then_cancelled(&base, Some(single)).await;

    // --on-rank-lost rejoin: rank 1 killed, the launcher starts it again, rank 0 restarts
    // itself in place (MLX keeps a process's first ring: only a new process joins another),
    // and the cluster serves again.
    let found = Command::new("pgrep").args(["-f", "--", &format!("--rank 1 --ring-port {port}")]).output().unwrap();
    let pid: i32 = String::from_utf8_lossy(&found.stdout).trim().parse().expect("rank 1's pid");
    // SAFETY: kill(2) on rank 1, a process of this test's launcher.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let [_, why] = &launcher.lines(&["[launch] rank 1 exited", "restarting this rank in"], 30)[..] else { unreachable!() };
    assert!(why.starts_with("[rank 0]") && why.contains("the cluster lost rank 1 (localhost)"), "{why}");
    let base = launcher.url();
    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);
    // Formed again, /health no longer says it waits.
    let h: Value = reqwest::get(format!("{base}/health")).await.unwrap().json().await.unwrap();
    assert_eq!(h["cluster"]["rejoining_after"], Value::Null, "{h}");

    // SIGTERM to the launcher stops every rank.
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(launcher.child.id() as i32, libc::SIGTERM) };
    assert!(launcher.exits_within(60).success());
    let left = Command::new("pgrep").args(["-f", &format!("--hostfile {}", hosts.display())]).output().unwrap();
    assert!(left.stdout.is_empty(), "ranks left running: {}", String::from_utf8_lossy(&left.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ranks_by_hand_then_one_lost_mid_stream() {
    let single = common::server();
    let dir = tempfile::tempdir().unwrap();
    let mut ranks = ranks_by_hand(dir.path(), 3, "pipeline");
    let base = ranks[0].url();
    for rank in &ranks[1..] {
        rank.line("following rank 0", 30);
    }
    let h: Value = reqwest::get(format!("{base}/health")).await.unwrap().json().await.unwrap();
    assert_eq!(h["cluster"]["ranks"], 3, "{h}");
    assert_eq!(h["model"]["held"], json!({"layers": {"start": 0, "end": 10}, "ends": true}), "{h}");
    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);
    let body = distinct("Geography quizzes are your job.", "Which ocean is the largest?");
    assert_eq!(text(&answer(&base, &body).await), text(&answer(single, &body).await));

    // Rank 0's /metrics: every rank's part. The shares add up to the whole model as one
    // process holds it, byte for byte (each layer on one rank, the ends on rank 0), and
    // each rank's MLX memory is its share plus a little KV and a step's arrays.
    let whole =
        reqwest::get(format!("{single}/health")).await.unwrap().json::<Value>().await.unwrap()["model"]["weight_bytes"].as_u64().unwrap();
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    let sample = |name: &str, rank: usize| rank_sample(&metrics, name, rank);
    assert!(metrics.contains("mlxbar_cluster_ranks 3\n") && metrics.contains("mlxbar_cluster_ranks_healthy 3\n"), "{metrics}");
    let weights: Vec<f64> = (0..3).map(|r| sample("cluster_rank_weight_bytes", r)).collect();
    assert_eq!(weights.iter().sum::<f64>() as u64, whole, "{weights:?}");
    for (r, &weight) in weights.iter().enumerate() {
        assert_eq!(sample("cluster_rank_layers", r), 10.0);
        assert_eq!(sample("cluster_rank_passes_total", r), sample("cluster_rank_passes_total", 0), "every pass runs on every rank");
        assert!(sample("cluster_rank_link_sent_bytes_total", r) > 0.0);
        let active = sample("cluster_rank_mlx_active_bytes", r);
        assert!(active >= weight && active <= weight * 1.1 + 16e6, "rank {r}: MLX holds {active} bytes for {weight} of weights");
    }
    assert!(weights[0] > weights[1], "rank 0 also holds the embedding and head: {weights:?}");
    // Every hop carried every pass (into rank 0 too: the last rank hands the hidden states
    // back), each in well under the pass timeout; every rank read its host's memory (one
    // machine here, so the same total).
    let snapshot: Value = reqwest::get(format!("{base}/api/metrics/snapshot")).await.unwrap().json().await.unwrap();
    let total = snapshot["memory"]["system"]["total"].as_f64().unwrap();
    for r in 0..3 {
        let (messages, secs) = (sample("cluster_rank_link_in_messages_total", r), sample("cluster_rank_link_in_seconds_total", r));
        assert!(messages >= sample("cluster_rank_passes_total", r), "rank {r}: {messages} messages in");
        assert!(secs > 0.0 && secs / messages < 1.0, "rank {r}: {secs} s for {messages} messages");
        assert_eq!(sample("cluster_rank_host_memory_total_bytes", r), total, "rank {r}");
        assert!(sample("cluster_rank_host_memory_available_bytes", r) > 0.0);
        assert!((-1.0..=2.0).contains(&sample("cluster_rank_host_memory_pressure_level", r)));
    }
    let view = &snapshot["cluster"];
    let links: Vec<(u64, u64)> =
        view["links"].as_array().unwrap().iter().map(|l| (l["from"].as_u64().unwrap(), l["to"].as_u64().unwrap())).collect();
    assert_eq!(links, [(2, 0), (0, 1), (1, 2)], "{view}");
    assert!(view["slowest_link"]["ms_per_message"].as_f64().unwrap() > 0.0, "{view}");
    // The Grafana dashboard's cluster row queries series this scrape has.
    let dashboard = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/grafana/mlxbar.json")).unwrap();
    let queried: std::collections::BTreeSet<&str> = dashboard
        .match_indices("mlxbar_cluster_")
        .map(|(i, _)| dashboard[i..].split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap())
        .collect();
    assert!(queried.len() >= 6, "{queried:?}");
    for name in queried {
        assert!(metrics.contains(&format!("# TYPE {name} ")), "the dashboard queries {name}, which rank 0 does not export");
    }

    fault_mid_stream(&base, &ranks[2], libc::SIGKILL, "the cluster lost rank 2 (localhost)").await;
    let h = health_says(&base, "the cluster lost", 30).await;
    // Rank 0 names the rank lost (rank 1 passes the news back before it exits).
    let detail = h["detail"].as_str().unwrap();
    assert!(detail.contains("rank 2 (localhost)"), "{detail}");
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    // ... and the engine counts as failed, which fires the engine_error alert.
    assert!(metrics.contains("mlxbar_cluster_ranks_healthy 0\n") && metrics.contains("mlxbar_engine_failed 1\n"), "{metrics}");
    // New requests fail at once, saying why.
    let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&chat_body(QUESTION, 8)).send().await.unwrap();
    assert!(resp.status().is_server_error(), "{}", resp.status());
    // Rank 1 lost its neighbour and exits by itself.
    assert!(!ranks[1].exits_within(30).success());
}

/// CPU seconds `pid` has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // SAFETY: sysconf only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / ticks
}

/// Rank `rank`'s sample of `mlxbar_{name}` in a `/metrics` scrape.
fn rank_sample(metrics: &str, name: &str, rank: usize) -> f64 {
    let series = format!("mlxbar_{name}{{rank=\"{rank}\"}} ");
    let line = metrics.lines().find(|l| l.starts_with(&series)).unwrap_or_else(|| panic!("no {series} in /metrics"));
    line[series.len()..].parse().unwrap()
}

/// `/health` once it answers 503 with a detail containing `what`, within `secs`.
async fn health_says(base: &str, what: &str, secs: u64) -> Value {
    until(&format!("/health to say {what:?}"), secs, async || {
        let resp = reqwest::get(format!("{base}/health")).await.ok()?;
        (resp.status() == 503).then_some(())?;
        let h: Value = resp.json().await.ok()?;
        h["detail"].as_str()?.contains(what).then_some(h)
    })
    .await
}

/// A structured-output request (the grammar's mask applies on rank 0, which holds the
/// head; its answer equal to `single`'s when given), then a stream cancelled mid-answer:
/// its KV goes on every rank, and the cluster goes on answering.
async fn structured_then_cancelled(base: &str, single: Option<&str>) {
    let schema =
        json!({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"], "additionalProperties": false});
    let mut body = distinct("Arithmetic only.", QUESTION);
    body["max_tokens"] = json!(40);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "sum", "schema": schema, "strict": true}});
    let got = text(&answer(base, &body).await);
    if let Some(single) = single {
        assert_eq!(got, text(&answer(single, &body).await));
    }
    assert!(serde_json::from_str::<Value>(&got).unwrap()["answer"].is_i64(), "{got}");

    let mut stream_body = chat_body("Count from one to one hundred in words.", 300);
    stream_body["stream"] = json!(true);
    let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&stream_body).send().await.unwrap();
    let mut stream = common::sse(resp);
    common::read_tokens(&mut stream, 3).await;
    drop(stream);
    until("the cancelled stream to leave the engine", 30, async || {
        let h: Value = reqwest::get(format!("{base}/health")).await.ok()?.json().await.ok()?;
        (h["queue"]["running"] == 0).then_some(())
    })
    .await;
    assert_eq!(text(&answer(base, &chat_body(QUESTION, 24)).await), ANSWER);
}

/// Sends `signal` to `rank` (rank 2 of a cluster) while rank 0 at `base` streams an
/// answer: the stream ends with an error object saying `why`, then `[DONE]`, within the
/// deadline, not a hang.
async fn fault_mid_stream(base: &str, rank: &Proc, signal: i32, why: &str) {
    let mut stream_body = chat_body("Count from one to one hundred in words.", 400);
    stream_body["stream"] = json!(true);
    let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&stream_body).send().await.unwrap();
    let mut stream = common::sse(resp);
    common::read_tokens(&mut stream, 2).await;
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(rank.child.id() as i32, signal) };
    let events = tokio::time::timeout(Duration::from_secs(30), async {
        use futures::StreamExt;
        let mut events = vec![];
        while let Some(ev) = stream.next().await {
            events.push(ev.data);
        }
        events
    })
    .await
    .expect("the stream ended");
    let error = events.iter().rev().nth(1).unwrap_or_else(|| panic!("{events:?}"));
    let error: Value = serde_json::from_str(error).unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains(why), "{error}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
}

/// How far tensor parallel's logprobs may stray from one process's on the packed default.
const TOLERANCE: f64 = 0.5;

/// Each greedy step's chosen token and its logprob.
async fn steps(base: &str, content: &str, n: u32) -> Vec<(String, f64)> {
    let mut body = chat_body(content, n);
    body["logprobs"] = json!(true);
    let v = answer(base, &body).await;
    v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["token"].as_str().unwrap().to_string(), t["logprob"].as_f64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ranks_tensor_parallel_then_one_hung_mid_stream() {
    let single = common::server();
    let dir = tempfile::tempdir().unwrap();
    let mut ranks = ranks_by_hand(dir.path(), 3, "tensor --pass-timeout 15");
    let base = ranks[0].url();
    let h: Value = reqwest::get(format!("{base}/health")).await.unwrap().json().await.unwrap();
    assert_eq!(h["model"]["held"], json!({"layers": {"start": 0, "end": 30}, "ends": true, "shard": {"rank": 0, "of": 3}}), "{h}");

    // The same greedy answer as one process. Not bit for bit: o's and down's sums are
    // split three ways and added up by all_sum, and the packed kernel rounds each rank's
    // share of their inputs to int8 with a scale of its own; each step's logprob stays
    // within TOLERANCE of one process's (measured: up to MEASURED here).
    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);
    let (split, whole) = (steps(&base, QUESTION, 24).await, steps(single, QUESTION, 24).await);
    assert_eq!(split.iter().map(|s| &s.0).collect::<Vec<_>>(), whole.iter().map(|s| &s.0).collect::<Vec<_>>());
    let worst = split.iter().zip(&whole).map(|(a, b)| (a.1 - b.1).abs()).fold(0.0, f64::max);
    eprintln!("tensor parallel: the chosen tokens' logprobs differ from one process's by up to {worst:.4}");
    assert!(worst < TOLERANCE, "{worst}");

    // Batched decode across the ranks: four streams at once, each whole.
    let bodies: Vec<Value> = (0..4).map(|i| distinct(&format!("Answer briefly, as assistant number {i}."), QUESTION)).collect();
    let answers = futures::future::join_all(bodies.iter().map(|b| answer(&base, b))).await;
    for a in &answers {
        assert_eq!(a["choices"][0]["finish_reason"], "stop", "{a}");
    }
    // The second ask of QUESTION above reused its prompt's KV (a third of it on each rank);
    // structured output and a cancelled stream, as on one process.
    structured_then_cancelled(&base, None).await;

    // Every rank holds a third of every layer: equal shares past rank 0, whose share
    // also has the embedding and head; the shares add up to one process's model plus the
    // norms each rank holds whole.
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    let sample = |name: &str, rank: usize| rank_sample(&metrics, name, rank);
    let total =
        reqwest::get(format!("{single}/health")).await.unwrap().json::<Value>().await.unwrap()["model"]["weight_bytes"].as_f64().unwrap();
    let weights: Vec<f64> = (0..3).map(|r| sample("cluster_rank_weight_bytes", r)).collect();
    assert_eq!(weights[1], weights[2]);
    let sum: f64 = weights.iter().sum();
    assert!(sum >= total && sum <= total * 1.01, "{weights:?} against {total}");
    for (r, &weight) in weights.iter().enumerate() {
        assert_eq!(sample("cluster_rank_layers", r), 30.0);
        assert_eq!(sample("cluster_rank_passes_total", r), sample("cluster_rank_passes_total", 0));
        // MLX's memory: the share, the four streams' KV (a third of the heads' each) and a
        // step's arrays.
        let (active, kv) = (sample("cluster_rank_mlx_active_bytes", r), sample("cluster_rank_kv_bytes", r));
        assert!(
            active >= weight + kv && active <= weight * 1.1 + kv + 16e6,
            "rank {r}: MLX holds {active} bytes for {weight} of weights, {kv} of KV"
        );
        if r > 0 {
            assert_eq!(kv, sample("cluster_rank_kv_bytes", 0), "every rank holds a third of every sequence's KV");
        }
    }

    // A rank that hangs mid-stream, its sockets open (stopped): the pass waits inside MLX's
    // all_sums, which have no timeout; --pass-timeout (15 s here: three ranks crowd two
    // cores, and other tests run beside) gives the cluster up and
    // ends the stream. Once the hung rank dies, rank 1 (waiting with it) exits.
    fault_mid_stream(&base, &ranks[2], libc::SIGSTOP, "the cluster gave a pass up after 15 s").await;
    let h: Value = reqwest::get(format!("{base}/health")).await.unwrap().json().await.unwrap();
    assert_eq!(h["state"], "failed", "{h}");
    ranks[2].child.kill().unwrap();
    assert!(!ranks[1].exits_within(30).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_ranks_sleep_and_a_rank_lost_while_idle_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut ranks = ranks_by_hand(dir.path(), 2, "auto");
    let base = ranks[0].url();
    // Auto: 9 heads do not split over 2 ranks, so pipeline, saying why.
    let why = ranks[1].line("pipeline parallel:", 30);
    assert!(why.contains("9 attention heads and 3 KV heads do not split evenly over 2 ranks"), "{why}");
    ranks[1].line("following rank 0", 30);
    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);

    // Idle, no rank burns a core: MLX's ring receive polls, so a rank waiting in it used
    // ~70 % of a core; ranks now sleep on their doorbell. A 3 s window measures it (a
    // tenth of a core allows for the engine's own once-a-second wake).
    let before: Vec<f64> = ranks.iter().map(|p| cpu_seconds(p.child.id())).collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (r, p) in ranks.iter().enumerate() {
        let used = cpu_seconds(p.child.id()) - before[r];
        assert!(used < 0.3, "idle rank {r} used {used:.2} CPU seconds in 3 s");
    }

    // A rank lost while nobody asks anything: rank 0 says which at once, not at the next
    // request.
    ranks[1].child.kill().unwrap();
    let h = health_says(&base, "the cluster lost rank 1 (localhost)", 15).await;
    assert_eq!(h["state"], "failed", "{h}");
    // The cluster_rank_lost alert fires, its notice naming the rank.
    let notice = ranks[0].line("A rank of the cluster was lost", 15);
    assert!(notice.contains("The cluster lost rank 1 (localhost)"), "{notice}");
    let resp = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&chat_body(QUESTION, 8)).send().await.unwrap();
    assert!(resp.status().is_server_error(), "{}", resp.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_rejoin_a_lost_rank_is_waited_for_and_the_cluster_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let port = ring_port();
    hostfile(dir.path(), 2);
    let mode = "pipeline --on-rank-lost rejoin";
    let mut ranks = vec![rank_by_hand(dir.path(), port, 1, mode, &common::model_path())];
    ranks.insert(0, rank_by_hand(dir.path(), port, 0, mode, &common::model_path()));
    let base = ranks[0].url();
    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);
    let pid = ranks[0].child.id();

    // Rank 1 dies; nobody restarts it yet. Rank 0 restarts itself in place (same pid, a
    // new server) and says what it waits for, in /health, /metrics, the snapshot and the
    // cluster_rank_lost notice.
    ranks[1].child.kill().unwrap();
    ranks[1].exits_within(10);
    let restart = ranks[0].line("restarting this rank in", 30);
    assert!(restart.contains("the cluster lost rank 1 (localhost)"), "{restart}");
    // The new server's address and the notice may come in either order: both threads log.
    let found = ranks[0].lines(&["listening on http://", "Waiting for every rank to join the cluster again after"], 60);
    let (base, notice) = (listening_url(&found[0]), &found[1]);
    assert!(notice.contains("A rank of the cluster was lost") && notice.contains("again after: the cluster lost rank 1"), "{notice}");
    let h = health_says(&base, "waiting for every rank to join the cluster again after: the cluster lost rank 1 (localhost)", 30).await;
    assert_eq!(h["state"], "loading", "{h}");
    assert!(h["cluster"]["rejoining_after"].as_str().unwrap().starts_with("the cluster lost rank 1"), "{h}");
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("mlxbar_cluster_ranks 2\n") && metrics.contains("mlxbar_cluster_ranks_healthy 0\n"), "{metrics}");
    let snapshot: Value = reqwest::get(format!("{base}/api/metrics/snapshot")).await.unwrap().json().await.unwrap();
    assert_eq!(snapshot["cluster"]["healthy"], 0, "{}", snapshot["cluster"]);
    assert!(snapshot["cluster"]["broken"].as_str().unwrap().starts_with("waiting for every rank"), "{}", snapshot["cluster"]);

    // Rank 1 back: the cluster forms again and answers as before, from the same process.
    ranks[1] = rank_by_hand(dir.path(), port, 1, mode, &common::model_path());
    ranks[0].line("ready: model", 120);
    assert_eq!(ranks[0].child.id(), pid);
    assert!(ranks[0].child.try_wait().unwrap().is_none(), "rank 0 restarted in place");
    assert_eq!(text(&answer(&base, &chat_body(QUESTION, 24)).await), ANSWER);

    // Rank 0 stopped: rank 1 waits for it rather than exiting.
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(ranks[0].exits_within(30).success());
    ranks[1].line("restarting this rank in", 30);
    ranks[1].line("restarted to rejoin the cluster after: rank 0 stopped", 30);
    assert!(ranks[1].child.try_wait().unwrap().is_none(), "rank 1 waits");
}

/// At a size where the shares are measurable (the ~1.1B-parameter 4-bit scale fixture: 32
/// heads and 4 KV heads, so auto splits it by heads over two ranks): each rank's MLX memory
/// is its share of the weights and its KV, the shares add up to the stored weights, and a
/// follower's process holds its share, not the whole model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_1b_fixture_splits_its_memory_over_two_ranks() {
    let model = common::fixtures::scale_folder();
    let stored = common::fixtures::safetensors_bytes(&model);
    let dir = tempfile::tempdir().unwrap();
    let port = ring_port();
    hostfile(dir.path(), 2);
    let follower = rank_by_hand(dir.path(), port, 1, "auto", &model);
    let rank0 = rank_by_hand(dir.path(), port, 0, "auto", &model);
    let base = rank0.url();
    let resp: Value = answer(&base, &chat_body("Say something.", 8)).await;
    assert_eq!(resp["usage"]["completion_tokens"], 8, "{resp}");

    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    let sample = |name: &str, rank: usize| rank_sample(&metrics, name, rank);
    let weights = [sample("cluster_rank_weight_bytes", 0), sample("cluster_rank_weight_bytes", 1)];
    // Stored: the safetensors files, their JSON headers included; each rank also holds
    // the layers' norms whole (a few hundred KB).
    let sum = weights[0] + weights[1];
    assert!((sum - stored as f64).abs() < stored as f64 * 0.01, "{weights:?} against {stored} stored");
    assert!(weights[1] < stored as f64 * 0.55, "rank 1 holds half of every layer: {weights:?}");
    for (r, &weight) in weights.iter().enumerate() {
        assert_eq!(sample("cluster_rank_layers", r), 22.0);
        let (active, kv) = (sample("cluster_rank_mlx_active_bytes", r), sample("cluster_rank_kv_bytes", r));
        assert!(kv > 0.0);
        assert!(
            active >= weight + kv && active <= weight * 1.1 + kv + 16e6,
            "rank {r}: MLX holds {active} for {weight} of weights, {kv} of KV"
        );
    }
    // The follower's whole process (MLX, the tokenizer, the runtime: ~100 MB beside the
    // weights here) stays well short of the whole model: it never held the other half.
    let rss = rss_bytes(follower.child.id());
    let half_the_rest = weights[1] + (stored as f64 - weights[1]) / 2.0;
    println!("1B fixture over 2 ranks: weights {weights:?} of {stored} stored; rank 1 resident {rss}");
    assert!((rss as f64) < half_the_rest, "rank 1 resident {rss} bytes for {} of weights", weights[1]);
}

/// A process's resident bytes, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").trim();
    kb.parse::<u64>().unwrap() * 1024
}

#[tokio::test]
async fn a_rank_that_never_joins_fails_within_the_join_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = hostfile(dir.path(), 2);
    let mut cmd = mlxbar();
    cmd.args(["serve", "--port", "0", "--join-timeout", "2", "--rank", "0", "--ring-port", &ring_port().to_string(), "--hostfile"]);
    cmd.arg(&hosts).arg("--model").arg(common::model_path());
    let rank0 = Proc::spawn(cmd, dir.path());
    let base = rank0.listening();
    let h: Value = until("/health to say the ranks did not join", 60, async || {
        let resp = reqwest::get(format!("{base}/health")).await.ok()?;
        let h: Value = resp.json().await.ok()?;
        (h["state"] == "failed").then_some(h)
    })
    .await;
    let detail = h["detail"].as_str().unwrap();
    assert!(detail.contains("did not join within 2 s") && detail.contains("--rank N"), "{detail}");

    // With --on-rank-lost rejoin a rank whose cluster never forms restarts to try again,
    // waiting longer each time, still naming the first failure; SIGTERM stops it all the
    // same, even mid-pause.
    let dir3 = tempfile::tempdir().unwrap();
    let hosts3 = hostfile(dir3.path(), 2);
    // One port for every restart (`--port 0` would move with each).
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut cmd = mlxbar();
    cmd.args(["serve", "--port", &http, "--join-timeout", "1", "--on-rank-lost", "rejoin", "--rank", "0", "--ring-port"]);
    cmd.arg(ring_port().to_string()).arg("--hostfile").arg(&hosts3).arg("--model").arg(common::model_path());
    let mut waiting = Proc::spawn(cmd, dir3.path());
    waiting.line("restarting this rank in 1 s", 30);
    waiting.line("restarting this rank in 2 s", 30);
    let base = format!("http://127.0.0.1:{http}");
    let h = health_says(&base, "waiting for every rank to join the cluster again after: the other ranks did not join within 1 s", 30).await;
    assert_eq!(h["state"], "loading", "{h}");
    waiting.line("restarting this rank in 3 s", 30);
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(waiting.child.id() as i32, libc::SIGTERM) };
    assert!(waiting.exits_within(15).success());

    // --parallel tensor where the heads do not split: both ranks refuse, naming them, and
    // do not restart for it even with --on-rank-lost rejoin (it would fail the same way).
    let dir2 = tempfile::tempdir().unwrap();
    let mut ranks = ranks_by_hand(dir2.path(), 2, "tensor --on-rank-lost rejoin");
    let base = ranks[0].listening();
    let h: Value = until("/health to refuse tensor parallel over 2 ranks", 60, async || {
        let h: Value = reqwest::get(format!("{base}/health")).await.ok()?.json().await.ok()?;
        (h["state"] == "failed").then_some(h)
    })
    .await;
    let detail = h["detail"].as_str().unwrap();
    assert!(detail.contains("--parallel tensor: 9 attention heads and 3 KV heads do not split evenly over 2 ranks"), "{detail}");
    assert!(!ranks[1].exits_within(30).success());

    // Bad host files and ranks are refused before anything starts; a host file for jaccl,
    // as mlx.distributed_config writes it, is taken and refused where this MLX has no jaccl
    // (RDMA over Thunderbolt 5 is macOS 26.2's), saying so.
    std::fs::write(dir.path().join("one.json"), r#"[{"ssh": "localhost", "ips": ["127.0.0.1"]}]"#).unwrap();
    let jaccl = json!({"backend": "jaccl", "envs": [], "hosts": [
        {"ssh": "localhost", "ips": ["127.0.0.1"], "rdma": [null, "rdma_en2"]},
        {"ssh": "localhost", "ips": ["127.0.0.1"], "rdma": ["rdma_en2", null]}]});
    std::fs::write(dir.path().join("jaccl.json"), jaccl.to_string()).unwrap();
    let refusals = [
        ("one.json", "0", "at least two"),
        ("hosts.json", "2", "names 2 ranks"),
        ("jaccl.json", "1", "this MLX build has no jaccl backend"),
    ];
    for (file, rank, want) in refusals {
        let out = mlxbar()
            .args(["serve", "--port", "0", "--rank", rank, "--hostfile"])
            .arg(dir.path().join(file))
            .arg("--model")
            .arg(common::model_path())
            .env("MLXBAR_DATA_DIR", dir.path())
            .env("MLXBAR_CONFIG", dir.path().join("config.toml"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{file} rank {rank}: {err}");
    }
}
