//! What observability costs: `cargo bench --bench metrics_cost`.
//!
//! - /metrics scrape time (p50/p99) while 8 streams are queued and generating, and the
//!   live snapshot's build time under the same load; with
//!   `MLXBAR_PEER_METRICS=URL` a peer's /metrics is scraped in the same run for a ratio
//!   (e.g. vllm-mlx started by ../shared/peers/serve.sh);
//! - decode tok/s of one stream with per-request instrumentation on vs off;
//! - the 1 Hz sampler's CPU cost as a share of one core, and the power sampler's (on Linux
//!   the RAPL/hwmon reader against tests/data/sysfs; on macOS macmon over 10 s).
use std::time::{Duration, Instant};

use mlxbar::bench::client::{timed_chat, Target};
use mlxbar::{Config, Server};
use serde_json::json;

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Milliseconds per GET of each URL, `n` rounds, the URLs taken in turn within a round (so
/// each sees the same load).
async fn scrape_times<const K: usize>(client: &reqwest::Client, urls: [&str; K], n: usize) -> [Vec<f64>; K] {
    let mut out: [Vec<f64>; K] = std::array::from_fn(|_| Vec::with_capacity(n));
    for _ in 0..n {
        for (url, times) in urls.iter().zip(&mut out) {
            let t = Instant::now();
            let body = client.get(*url).send().await.unwrap().text().await.unwrap();
            assert!(!body.is_empty());
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    out
}

async fn median_decode(client: &reqwest::Client, t: &Target, runs: usize) -> f64 {
    let messages = json!([{"role": "user", "content": "Write a long story about a lighthouse keeper."}]);
    timed_chat(client, t, &messages, 8).await.unwrap();
    let mut v: Vec<f64> = vec![];
    for _ in 0..runs {
        v.push(timed_chat(client, t, &messages, 96).await.unwrap().decode_tok_s);
    }
    pct(&mut v, 0.5)
}

#[tokio::main]
async fn main() {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build().unwrap();
    let start = |metrics_enabled| async move {
        let s = Server::start(Config { port: 0, metrics_enabled, ..Config::default() }).await.unwrap();
        s.wait_ready().await.unwrap();
        s
    };

    // 1. scrapes under load
    let on = start(true).await;
    let base = format!("http://{}", on.local_addr());
    let mut streams = vec![];
    for i in 0..8 {
        let (client, base) = (client.clone(), base.clone());
        streams.push(tokio::spawn(async move {
            let body =
                json!({"messages": [{"role": "user", "content": format!("Story number {i}, please.")}], "max_tokens": 32, "stream": true});
            client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap().text().await.unwrap()
        }));
    }
    let [mut ours, mut snapshots] = scrape_times(&client, [&format!("{base}/metrics"), &format!("{base}/api/metrics/snapshot")], 200).await;
    let lines = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap().lines().count();
    let busy = client.get(format!("{base}/api/metrics/snapshot")).send().await.unwrap().json::<serde_json::Value>().await.unwrap()
        ["scheduler"]["running"]
        .as_u64()
        .unwrap();
    for s in streams {
        s.await.unwrap();
    }
    let (p50, p99) = (pct(&mut ours, 0.5), pct(&mut ours, 0.99));
    println!("/metrics under 8 streams: {lines} lines, p50 {p50:.3} ms, p99 {p99:.3} ms (200 scrapes)");
    let (s50, s99) = (pct(&mut snapshots, 0.5), pct(&mut snapshots, 0.99));
    println!("/api/metrics/snapshot, read in turn with each scrape: p50 {s50:.3} ms, p99 {s99:.3} ms ({busy} of 8 streams still running after the last read)");
    if let Ok(peer) = std::env::var("MLXBAR_PEER_METRICS") {
        let [mut theirs] = scrape_times(&client, [&peer], 200).await;
        let (q50, q99) = (pct(&mut theirs, 0.5), pct(&mut theirs, 0.99));
        println!(
            "peer {peer}: p50 {q50:.3} ms, p99 {q99:.3} ms -> mlxbar's scrape is {:.1}x faster at p50, {:.1}x at p99",
            q50 / p50,
            q99 / p99
        );
    }

    // 2. per-token instrumentation: the same server build with recording on and off
    let target_on = Target { label: "on".into(), base_url: base.clone(), model: "default".into() };
    let tok_on = median_decode(&client, &target_on, 3).await;
    on.shutdown().await;
    let off = start(false).await;
    let target_off = Target { label: "off".into(), base_url: format!("http://{}", off.local_addr()), model: "default".into() };
    let tok_off = median_decode(&client, &target_off, 3).await;
    off.shutdown().await;
    println!("decode, one stream: metrics on {tok_on:.2} tok/s, off {tok_off:.2} tok/s -> on/off = {:.3}", tok_on / tok_off);

    // 3. the sampler
    let mut prev = mlxbar::telemetry::sample(None, Duration::ZERO);
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        prev = mlxbar::telemetry::sample(Some(&prev), Duration::from_secs(1));
    }
    let per = t.elapsed().as_secs_f64() / n as f64;
    println!("sampler: {:.1} us a reading -> {:.4}% of one core at 1 Hz (target < 0.1%)", per * 1e6, per * 100.0);

    // 4. the power sampler: on Linux the RAPL/hwmon reader against the fixture tree (this
    // build machine has neither in /sys), every reading counting all its file reads
    power_sampler_cost();
}

#[cfg(target_os = "linux")]
fn power_sampler_cost() {
    use mlxbar::telemetry::power::{linux::Reader, PowerSample};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sysfs");
    let mut reader = Reader::at(&root);
    let mut sample = PowerSample::default();
    let n = 2000;
    let cpu = cpu_seconds();
    let t = Instant::now();
    for _ in 0..n {
        sample = sample.advance("sysfs", reader.read(1.0));
    }
    let per = t.elapsed().as_secs_f64() / n as f64;
    let per_cpu = (cpu_seconds() - cpu) / n as f64;
    assert!(sample.available(mlxbar::telemetry::power::Component::Cpu));
    println!(
        "power sampler (RAPL + hwmon, fixture tree, {} sensors): {:.1} us wall, {:.1} us CPU a reading -> {:.4}% of one core at 1 Hz (target < 0.5%)",
        sample.temperatures.len(),
        per * 1e6,
        per_cpu * 1e6,
        per_cpu * 100.0
    );
}

/// This process's CPU time (user + system), seconds.
#[cfg(target_os = "linux")]
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the command
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// macOS: macmon's sampler blocks for its interval; its CPU cost per 1 s interval is this
/// process's CPU time over a few intervals.
#[cfg(target_os = "macos")]
fn power_sampler_cost() {
    let m = mlxbar::telemetry::power::monitor::PowerMonitor::start(Duration::from_secs(1));
    let before = mlxbar::telemetry::process::read().unwrap().cpu_seconds;
    std::thread::sleep(Duration::from_secs(10));
    let used = mlxbar::telemetry::process::read().unwrap().cpu_seconds - before;
    m.stop();
    println!("power sampler (macmon): {:.4}% of one core at 1 Hz over 10 s, the whole process's CPU (target < 0.5%)", used / 10.0 * 100.0);
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn power_sampler_cost() {}
