//! `mlxbar bench soak`: minutes of mixed load against one mlxbar, to find what a short bench
//! misses: requests that hang or vanish, and memory that creeps up. `streams` loops send
//! streamed chats of random sizes (some disconnect mid-stream), bursts overflow the queue
//! (429 with Retry-After expected), and `/metrics` is scraped every second for RSS and MLX
//! memory. Every request ends in exactly one bucket; the run fails if any was lost or
//! failed, a scrape failed, the server did not drain, more requests waited than the
//! in-process server's queue capacity, or resident memory grew past a bound.
//! The bound is on RSS less the two caches that fill up to a limit by design over the first
//! minutes of load (MLX's buffer cache, 1 GiB by default, and the prefix cache's KV, 256 MB):
//! growth, but not a leak.
//!
//! A leak is memory that stays after the requests that took it have ended, so the slope
//! verdict reads the server at rest: every `--rest-every` seconds the load pauses, the
//! requests in flight finish, the server drains, and RSS less the caches is sampled idle.
//! Under load the same series swings with the requests in flight (8 to 24 here), which a
//! ten-minute least-squares slope mistook for a leak three runs in four.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::client::Target;
use super::machine::Machine;
use super::{prompt, runner};
use crate::config::Config;
use crate::engine::WeightFormat;
use crate::Server;

/// A request with no answer by then counts as lost (hung); generous, since a burst request
/// may wait behind a full queue on a slow CPU.
const REQUEST_DEADLINE: Duration = Duration::from_secs(300);
/// After the load stops the server must be idle (nothing running or waiting) within this.
const DRAIN_DEADLINE: Duration = Duration::from_secs(60);
/// Share of the run whose memory samples are ignored for growth and slope (model load,
/// caches filling).
const WARMUP_FRACTION: f64 = 0.1;
/// Share of the run whose rests the slope verdict skips: glibc's arenas and MLX's buffers
/// settle over the first minutes of load. Measured (15 minutes, 2 cores, SmolLM2 packed):
/// RSS less the caches at rest 302 MB at minute 3, then 330, 333, 334, 333, 332 MB to the end.
const REST_WARMUP_FRACTION: f64 = 1.0 / 3.0;
/// Scrapes of the idle server per rest; their median is the rest's point.
const REST_SAMPLES: usize = 3;
/// Share of stream requests that disconnect at a random point.
const DISCONNECT_FRACTION: f64 = 0.15;
const MB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long to keep the load on (fractions allowed)
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Concurrent request loops
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Soak this mlxbar (it must serve /metrics) instead of an in-process one: URL[#MODEL]
    #[arg(long)]
    pub target: Option<String>,
    /// Seed for prompt and output sizes, disconnects and bursts
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds between bursts of simultaneous requests (0: no bursts)
    #[arg(long, default_value_t = 30.0)]
    pub burst_every: f64,
    /// Requests per burst; more than the queue holds, so some get 429
    #[arg(long, default_value_t = 40)]
    pub burst_size: usize,
    /// Queue capacity of the in-process server (small, so bursts overflow it)
    #[arg(long, default_value_t = 16)]
    pub queue_capacity: usize,
    /// Fail if RSS less the MLX buffer cache and the prefix cache grew more than this (MB)
    /// from its post-warm-up minimum to the end
    #[arg(long, default_value_t = 200.0)]
    pub max_growth_mb: f64,
    /// Fail if RSS less the caches, sampled at rest, rises faster than this (MB per hour,
    /// least squares over the rests after the warm-up): a leak a short run keeps under the
    /// growth bound still shows as a slope
    #[arg(long, default_value_t = 100.0)]
    pub max_slope_mb_per_hour: f64,
    /// Seconds of load between rests (the load pauses, the server drains, memory is sampled
    /// idle; 0: no rests, and no slope verdict)
    #[arg(long, default_value_t = 120.0)]
    pub rest_every: f64,
    /// A .gguf or MLX folder for the in-process server (default: the default model)
    #[arg(long)]
    pub model: Option<String>,
    /// Weight format for the in-process server
    #[arg(long, value_enum, default_value = "auto")]
    pub weight_format: WeightFormat,
    /// Print the report (with every memory sample) as JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// How one request ended, as this client saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `[DONE]` after the tokens.
    Completed { tokens: u64 },
    /// 429 with a Retry-After header (seconds).
    Rejected { retry_after: u64 },
    /// We disconnected on purpose after `tokens` chunks.
    Cancelled { tokens: u64 },
    /// An error status other than 429, an error event, a broken stream or one without `[DONE]`.
    Failed(String),
    /// No answer within [`REQUEST_DEADLINE`].
    Lost(String),
}

/// Requests by bucket. `sent` is counted before each request starts, so a request that never
/// reports (a panicked task) shows up as unaccounted and is treated as lost.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Tally {
    pub sent: u64,
    pub completed: u64,
    pub rejected_429: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub lost: u64,
    /// Tokens received: usage of completed streams plus chunks of cancelled ones.
    pub tokens: u64,
    pub burst_sent: u64,
    pub burst_rejected_429: u64,
    /// The first few failure and loss reasons.
    pub problems: Vec<String>,
}

impl Tally {
    pub fn record(&mut self, o: &Outcome, burst: bool) {
        match o {
            Outcome::Completed { tokens } => {
                self.completed += 1;
                self.tokens += tokens;
            }
            Outcome::Rejected { .. } => {
                self.rejected_429 += 1;
                self.burst_rejected_429 += u64::from(burst);
            }
            Outcome::Cancelled { tokens } => {
                self.cancelled += 1;
                self.tokens += tokens;
            }
            Outcome::Failed(why) | Outcome::Lost(why) => {
                if matches!(o, Outcome::Failed(_)) {
                    self.failed += 1;
                } else {
                    self.lost += 1;
                }
                if self.problems.len() < 10 {
                    self.problems.push(why.clone());
                }
            }
        }
    }

    fn answered(&self) -> u64 {
        self.completed + self.rejected_429 + self.cancelled + self.failed + self.lost
    }

    /// Sent but in no bucket: only possible if a request task died.
    pub fn unaccounted(&self) -> u64 {
        self.sent.saturating_sub(self.answered())
    }
}

/// One `/metrics` scrape's memory figures, `t` seconds into the run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    pub t: f64,
    pub rss: f64,
    pub mlx_active: Option<f64>,
    pub mlx_cache: Option<f64>,
    pub prefix_cache: Option<f64>,
    /// Requests queued, not yet taken by the engine.
    pub waiting: Option<f64>,
}

impl Sample {
    /// Resident memory that is not in a capped cache (MLX's buffers, the prefix cache's KV).
    pub fn rss_less_caches(&self) -> f64 {
        self.rss - self.mlx_cache.unwrap_or(0.0) - self.prefix_cache.unwrap_or(0.0)
    }
}

/// RSS and MLX memory figures out of a Prometheus text page; None without RSS.
pub fn parse_sample(t: f64, text: &str) -> Option<Sample> {
    let value = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse::<f64>().ok()))
    };
    Some(Sample {
        t,
        rss: value("mlxbar_process_resident_memory_bytes")?,
        mlx_active: value("mlxbar_mlx_memory_bytes{kind=\"active\"}"),
        mlx_cache: value("mlxbar_mlx_memory_bytes{kind=\"cache\"}"),
        prefix_cache: value("mlxbar_prefix_cache_bytes"),
        waiting: value("mlxbar_scheduler_waiting_requests"),
    })
}

/// Least-squares slope of y over t, per hour of t seconds; None without two distinct times.
pub fn slope_per_hour(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (mt, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    Some(sxy / sxx * 3600.0)
}

/// One memory series (MB) over the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MemStats {
    pub start_mb: f64,
    pub end_mb: f64,
    pub max_mb: f64,
    /// End minus the lowest value after the warm-up.
    pub growth_mb: f64,
    /// Least-squares slope after the warm-up, MB per hour.
    pub slope_mb_per_hour: Option<f64>,
}

/// Stats of `(t, bytes)` points; the warm-up is the first `warmup` share of the time span.
pub fn mem_stats(points: &[(f64, f64)], warmup: f64) -> Option<MemStats> {
    let (first, last) = (points.first()?, points.last()?);
    let cut = first.0 + (last.0 - first.0) * warmup;
    let mut after: Vec<(f64, f64)> = points.iter().filter(|p| p.0 >= cut).map(|&(t, y)| (t, y / MB)).collect();
    if after.len() < 2 {
        after = points.iter().map(|&(t, y)| (t, y / MB)).collect();
    }
    let min_after = after.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    Some(MemStats {
        start_mb: first.1 / MB,
        end_mb: last.1 / MB,
        max_mb: points.iter().map(|p| p.1).fold(f64::MIN, f64::max) / MB,
        growth_mb: last.1 / MB - min_after,
        slope_mb_per_hour: slope_per_hour(&after),
    })
}

/// RSS less the caches of the idle server at one rest (MB), `t` seconds into the run.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RestPoint {
    pub t: f64,
    pub mb: f64,
}

/// The least-squares slope (MB/h) of the rests after the warm-up (the first `warmup` share of
/// `span` seconds); None with fewer than two.
pub fn rest_slope(rests: &[RestPoint], span: f64, warmup: f64) -> Option<f64> {
    let after: Vec<(f64, f64)> = rests.iter().filter(|r| r.t >= span * warmup).map(|r| (r.t, r.mb)).collect();
    slope_per_hour(&after)
}

/// Why the run failed; empty means it passed.
/// `resident` is the series the growth bound applies to (RSS less the capped caches),
/// `rest_slope` the same series' slope at rest ([`rest_slope`]); `queue` the most requests
/// seen waiting and, when known, the server's queue capacity.
pub fn verdict(
    tally: &Tally,
    scrapes_failed: u64,
    drain: &Result<(), String>,
    queue: (u64, Option<u64>),
    (resident, rest_slope): (Option<&MemStats>, Option<f64>),
    (max_growth_mb, max_slope_mb_per_hour): (f64, f64),
) -> Vec<String> {
    let mut why = vec![];
    let lost = tally.lost + tally.unaccounted();
    if lost > 0 {
        why.push(format!("{lost} request(s) lost (no answer within {} s)", REQUEST_DEADLINE.as_secs()));
    }
    if tally.failed > 0 {
        why.push(format!("{} request(s) failed", tally.failed));
    }
    if tally.completed == 0 {
        why.push("no request completed".into());
    }
    if scrapes_failed > 0 {
        why.push(format!("{scrapes_failed} /metrics scrape(s) failed"));
    }
    if let Err(e) = drain {
        why.push(format!("the server did not drain: {e}"));
    }
    if let (peak, Some(capacity)) = queue {
        if peak > capacity {
            why.push(format!("{peak} requests waited at once, past the queue capacity of {capacity} (they should have had 429)"));
        }
    }
    match resident {
        None => why.push("no RSS samples".into()),
        Some(m) => {
            if m.growth_mb > max_growth_mb {
                why.push(format!("RSS less the caches grew {:.0} MB after the warm-up (bound {max_growth_mb:.0} MB)", m.growth_mb));
            }
            if let Some(slope) = rest_slope.filter(|s| *s > max_slope_mb_per_hour) {
                why.push(format!(
                    "RSS less the caches, at rest, rose {slope:.0} MB/h after the warm-up (bound {max_slope_mb_per_hour:.0} MB/h)"
                ));
            }
        }
    }
    why
}

/// What one request asks for.
#[derive(Debug, Clone)]
struct Shot {
    messages: Value,
    max_tokens: usize,
    temperature: f64,
    /// Disconnect after this many content chunks (0: right after the response head).
    disconnect_after: Option<u64>,
}

impl Shot {
    /// A stream loop's request: 8-320 prompt tokens, 1-160 output tokens; a quarter reuse one
    /// of six fixed prompts so the prefix cache hits and evicts too.
    fn stream(rng: &mut ChaCha8Rng, worker: usize, n: usize) -> Shot {
        let max_tokens = rng.random_range(1..=160);
        let messages = if rng.random_bool(0.25) {
            let k = rng.random_range(0..6usize);
            prompt::messages(64 + 48 * k, 9999, k, 0)
        } else {
            prompt::messages(rng.random_range(8..=320), 10_000 + worker, n, 0)
        };
        let disconnect_after = rng.random_bool(DISCONNECT_FRACTION).then(|| rng.random_range(0..=max_tokens as u64));
        Shot { messages, max_tokens, temperature: if rng.random_bool(0.5) { 0.0 } else { 0.8 }, disconnect_after }
    }

    /// A burst request: short, so the bursts test admission more than throughput.
    fn burst(rng: &mut ChaCha8Rng, burst: usize, i: usize) -> Shot {
        Shot {
            messages: prompt::messages(rng.random_range(8..=64), 20_000 + burst, i, 0),
            max_tokens: rng.random_range(1..=16),
            temperature: 0.0,
            disconnect_after: None,
        }
    }
}

/// Sends one streamed chat and reads it to its end (or our disconnect).
async fn attempt(client: &reqwest::Client, t: &Target, shot: &Shot) -> Outcome {
    let body = json!({
        "model": t.model, "messages": shot.messages, "max_tokens": shot.max_tokens,
        "temperature": shot.temperature, "stream": true, "stream_options": {"include_usage": true},
    });
    let resp = match client.post(format!("{}/v1/chat/completions", t.base_url)).json(&body).send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("request error: {e}")),
    };
    let status = resp.status();
    if status.as_u16() == 429 {
        let retry =
            resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
        let shaped = resp.json::<Value>().await.ok().is_some_and(|v| v.pointer("/error/message").is_some_and(Value::is_string));
        return match (retry, shaped) {
            (Some(retry_after), true) => Outcome::Rejected { retry_after },
            (None, _) => Outcome::Failed("429 without a numeric Retry-After".into()),
            (_, false) => Outcome::Failed("429 body is not an OpenAI error".into()),
        };
    }
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Outcome::Failed(format!("HTTP {status}: {}", text.chars().take(200).collect::<String>()));
    }
    let mut events = resp.bytes_stream().eventsource();
    let (mut chunks, mut usage) = (0u64, None);
    loop {
        if shot.disconnect_after.is_some_and(|k| chunks >= k) {
            // Dropping the body closes the connection; the server should stop the request.
            return Outcome::Cancelled { tokens: chunks };
        }
        let event = match events.next().await {
            Some(Ok(e)) => e,
            Some(Err(e)) => return Outcome::Failed(format!("stream broke after {chunks} chunks: {e}")),
            None => return Outcome::Failed(format!("stream ended without [DONE] after {chunks} chunks")),
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            let tokens = usage.unwrap_or(chunks);
            if tokens > shot.max_tokens as u64 {
                return Outcome::Failed(format!("{tokens} tokens for max_tokens {}", shot.max_tokens));
            }
            return Outcome::Completed { tokens };
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(_) => return Outcome::Failed(format!("bad chunk: {}", data.chars().take(200).collect::<String>())),
        };
        if let Some(e) = v.get("error") {
            return Outcome::Failed(format!("error event: {}", e.get("message").and_then(Value::as_str).unwrap_or("?")));
        }
        if let Some(n) = v.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
            usage = Some(n);
        }
        if v.pointer("/choices/0/delta/content").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) {
            chunks += 1;
        }
    }
}

/// What the run's tasks share.
struct Ctx {
    client: reqwest::Client,
    target: Target,
    tally: Mutex<Tally>,
    in_flight: std::sync::atomic::AtomicI64,
    /// Cancelled when the load should stop (time up or Ctrl-C); requests in flight finish.
    stop: CancellationToken,
    /// Every request holds a read guard while it runs; a rest takes the write guard, which
    /// waits for the requests in flight and holds new ones back until the rest is over.
    gate: tokio::sync::RwLock<()>,
}

impl Ctx {
    async fn request(&self, shot: &Shot, burst: bool) -> Outcome {
        use std::sync::atomic::Ordering::Relaxed;
        let _running = self.gate.read().await;
        {
            let mut t = self.tally.lock().unwrap();
            t.sent += 1;
            t.burst_sent += u64::from(burst);
        }
        self.in_flight.fetch_add(1, Relaxed);
        let o = match tokio::time::timeout(REQUEST_DEADLINE, attempt(&self.client, &self.target, shot)).await {
            Ok(o) => o,
            Err(_) => Outcome::Lost(format!("no end within {} s (max_tokens {})", REQUEST_DEADLINE.as_secs(), shot.max_tokens)),
        };
        self.in_flight.fetch_sub(1, Relaxed);
        self.tally.lock().unwrap().record(&o, burst);
        o
    }
}

async fn stream_loop(ctx: Arc<Ctx>, seed: u64, worker: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (worker as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut n = 0;
    while !ctx.stop.is_cancelled() {
        let shot = Shot::stream(&mut rng, worker, n);
        n += 1;
        if let Outcome::Rejected { retry_after } = ctx.request(&shot, false).await {
            // Honour Retry-After (capped, so a stop is noticed soon).
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(retry_after.min(2))) => {}
                _ = ctx.stop.cancelled() => {}
            }
        }
    }
}

async fn burst_loop(ctx: Arc<Ctx>, seed: u64, every: Duration, size: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xB0B5_7000);
    let mut bursts = JoinSet::new();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    for b in 0.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = ctx.stop.cancelled() => break,
        }
        let shots: Vec<Shot> = (0..size).map(|i| Shot::burst(&mut rng, b, i)).collect();
        let ctx = ctx.clone();
        // A burst may outlast the interval; the next one starts anyway.
        bursts.spawn(async move { futures::future::join_all(shots.iter().map(|s| ctx.request(s, true))).await });
    }
    while bursts.join_next().await.is_some() {}
}

/// Every `every` until the load stops: pauses it, waits for the server to drain and records
/// the median of [`REST_SAMPLES`] idle scrapes. A rest that cannot drain ends the rests (the
/// final drain then reports it).
async fn rest_loop(ctx: Arc<Ctx>, start: Instant, every: Duration) -> Vec<RestPoint> {
    let mut rests = vec![];
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = ctx.stop.cancelled() => return rests,
        }
        // Requests in flight end within REQUEST_DEADLINE, so this wait is bounded.
        let _paused = ctx.gate.write().await;
        if ctx.stop.is_cancelled() {
            return rests;
        }
        if let Err(e) = drain(&ctx.client, &ctx.target).await {
            eprintln!("rest at {:.0} s: {e}", start.elapsed().as_secs_f64());
            return rests;
        }
        let mut mb = vec![];
        for i in 0..REST_SAMPLES {
            if i > 0 {
                // Sampling cadence, not synchronization: the server is already idle.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if let Ok(s) = scrape(&ctx.client, &ctx.target, 0.0).await {
                mb.push(s.rss_less_caches() / MB);
            }
        }
        mb.sort_by(f64::total_cmp);
        if let Some(&median) = mb.get(mb.len() / 2) {
            let t = start.elapsed().as_secs_f64();
            eprintln!("[{t:>4.0}s] at rest: RSS less the caches {median:.0} MB");
            rests.push(RestPoint { t, mb: median });
        }
    }
}

/// Scrapes `/metrics` every second until `done`, keeping memory samples; a progress line
/// goes to stderr every 10 s.
async fn scraper(ctx: Arc<Ctx>, start: Instant, total: Duration, done: CancellationToken) -> (Vec<Sample>, u64, Vec<String>) {
    let (mut samples, mut failed, mut errors) = (vec![], 0u64, vec![]);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_progress = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = done.cancelled() => break,
        }
        match scrape(&ctx.client, &ctx.target, start.elapsed().as_secs_f64()).await {
            Ok(s) => samples.push(s),
            Err(e) => {
                failed += 1;
                if errors.len() < 5 {
                    errors.push(e);
                }
            }
        }
        if last_progress.elapsed() >= Duration::from_secs(10) {
            last_progress = Instant::now();
            let t = ctx.tally.lock().unwrap().clone();
            let mem = samples
                .last()
                .map(|s| {
                    format!(
                        "rss {:.0} MB  mlx active {:.0} / cache {:.0} MB",
                        s.rss / MB,
                        s.mlx_active.unwrap_or(0.0) / MB,
                        s.mlx_cache.unwrap_or(0.0) / MB
                    )
                })
                .unwrap_or_default();
            eprintln!(
                "[{:>4.0}s/{:.0}s] completed {}  429 {}  cancelled {}  failed {}  lost {}  in flight {}  scrapes failed {failed}  {mem}",
                start.elapsed().as_secs_f64(),
                total.as_secs_f64(),
                t.completed,
                t.rejected_429,
                t.cancelled,
                t.failed,
                t.lost,
                ctx.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
    }
    (samples, failed, errors)
}

async fn metrics_text(client: &reqwest::Client, t: &Target) -> Result<String, String> {
    let r = client
        .get(format!("{}/metrics", t.base_url))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("/metrics: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("/metrics: HTTP {}", r.status()));
    }
    r.text().await.map_err(|e| format!("/metrics body: {e}"))
}

async fn scrape(client: &reqwest::Client, t: &Target, at: f64) -> Result<Sample, String> {
    parse_sample(at, &metrics_text(client, t).await?).ok_or_else(|| "/metrics has no mlxbar_process_resident_memory_bytes".into())
}

/// Waits until the server has nothing running or waiting.
async fn drain(client: &reqwest::Client, t: &Target) -> Result<(), String> {
    let gauge = |text: &str, name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok());
    let deadline = Instant::now() + DRAIN_DEADLINE;
    loop {
        let state = metrics_text(client, t)
            .await
            .map(|m| (gauge(&m, "mlxbar_scheduler_running_requests"), gauge(&m, "mlxbar_scheduler_waiting_requests")));
        match state {
            Ok((Some(r), Some(w))) if r == 0.0 && w == 0.0 => return Ok(()),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(250)).await,
            Ok((r, w)) => return Err(format!("{} s after the load stopped: running {r:?}, waiting {w:?}", DRAIN_DEADLINE.as_secs())),
            Err(e) => return Err(e),
        }
    }
}

/// Everything `--json` prints.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub command: String,
    pub server: String,
    pub machine: Machine,
    pub model: Option<String>,
    pub mlxbar: Option<Value>,
    /// Seconds of load, then the whole run (the requests in flight finish, the server drains).
    pub load_seconds: f64,
    pub seconds: f64,
    pub tally: Tally,
    pub requests_per_second: f64,
    pub tokens_per_second: f64,
    pub scrapes_ok: usize,
    /// The most requests the scrapes saw waiting, and the queue capacity when known.
    pub max_waiting: u64,
    pub queue_capacity: Option<u64>,
    pub scrapes_failed: u64,
    pub scrape_errors: Vec<String>,
    pub drain: Result<(), String>,
    pub rss: Option<MemStats>,
    pub rss_less_caches: Option<MemStats>,
    /// RSS less the caches of the idle server at each rest and after the final drain.
    pub rests: Vec<RestPoint>,
    /// Their slope after the warm-up, MB/h (the slope verdict's figure).
    pub rest_slope_mb_per_hour: Option<f64>,
    pub mlx_active: Option<MemStats>,
    pub mlx_cache: Option<MemStats>,
    pub prefix_cache: Option<MemStats>,
    pub failures: Vec<String>,
    pub samples: Vec<Sample>,
}

impl SoakReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn table(&self) -> String {
        let t = &self.tally;
        let mut s = format!(
            "{}\nserver: {}\nmachine: {} ({} cores), {}\n",
            self.command, self.server, self.machine.chip, self.machine.cores, self.machine.os
        );
        if let Some(m) = &self.model {
            s += &format!("model: {m}\n");
        }
        s += &format!(
            "\n| requests ({:.0} s of load, {:.0} s to drain) | count |\n|---|---:|\n",
            self.load_seconds,
            self.seconds - self.load_seconds
        );
        s += &format!("| sent | {} |\n| completed | {} |\n", t.sent, t.completed);
        s += &format!(
            "| rejected 429 (all with Retry-After; {} of {} burst requests) | {} |\n",
            t.burst_rejected_429, t.burst_sent, t.rejected_429
        );
        s += &format!(
            "| cancelled (client disconnects) | {} |\n| failed | {} |\n| lost | {} |\n",
            t.cancelled,
            t.failed,
            t.lost + t.unaccounted()
        );
        s += &format!(
            "| requests/s (whole run) | {:.2} |\n| tokens received | {} ({:.1} tok/s) |\n",
            self.requests_per_second, t.tokens, self.tokens_per_second
        );
        s += &format!("| /metrics scrapes ok / failed | {} / {} |\n", self.scrapes_ok, self.scrapes_failed);
        let capacity = self.queue_capacity.map(|c| format!(" (capacity {c})")).unwrap_or_default();
        s += &format!("| most requests waiting at once{capacity} | {} |\n", self.max_waiting);
        s += &format!("| drained after the load | {} |\n", if self.drain.is_ok() { "yes" } else { "no" });
        s += "\n| memory (MB) | start | end | max | growth after warm-up | slope after warm-up (MB/h) |\n|---|---:|---:|---:|---:|---:|\n";
        let rows = [
            ("RSS", &self.rss),
            ("MLX active", &self.mlx_active),
            ("MLX cache", &self.mlx_cache),
            ("prefix cache", &self.prefix_cache),
            ("**RSS − caches** (the bound)", &self.rss_less_caches),
        ];
        for (name, m) in rows {
            match m {
                Some(m) => {
                    let slope = m.slope_mb_per_hour.map(|v| format!("{v:+.1}")).unwrap_or_else(|| "-".into());
                    s += &format!("| {name} | {:.0} | {:.0} | {:.0} | {:+.0} | {slope} |\n", m.start_mb, m.end_mb, m.max_mb, m.growth_mb);
                }
                None => s += &format!("| {name} | - | - | - | - | - |\n"),
            }
        }
        s += &format!("\n({} samples, 1/s; warm-up = first {:.0}% of the run)\n", self.samples.len(), WARMUP_FRACTION * 100.0);
        if self.rests.is_empty() {
            s += "\nno rests (--rest-every 0), so no slope verdict\n";
        } else {
            let points: Vec<String> = self.rests.iter().map(|r| format!("{:.0} MB at {:.0} s", r.mb, r.t)).collect();
            let slope =
                self.rest_slope_mb_per_hour.map_or("- (fewer than two rests after the warm-up)".into(), |v| format!("{v:+.1} MB/h"));
            s += &format!(
                "\n**RSS − caches at rest** (load paused, server drained): {}; slope after the first {:.0}% of the run {slope}\n",
                points.join(", "),
                REST_WARMUP_FRACTION * 100.0
            );
        }
        if !t.problems.is_empty() {
            s += "\nfirst problems:\n";
            for p in &t.problems {
                s += &format!("  - {p}\n");
            }
        }
        for e in &self.scrape_errors {
            s += &format!("  - scrape: {e}\n");
        }
        if t.rejected_429 == 0 {
            s += "\nnote: no request got 429, so the queue never overflowed\n";
        }
        s += &if self.passed() { "\nverdict: PASS\n".to_string() } else { format!("\nverdict: FAIL: {}\n", self.failures.join("; ")) };
        s
    }
}

pub async fn run(args: SoakArgs) -> Result<()> {
    if args.streams == 0 || args.minutes.is_nan() || args.minutes <= 0.0 {
        bail!("--streams and --minutes must be positive");
    }
    let mut local = None;
    let (target, server) = match &args.target {
        Some(spec) => (Target::parse(spec)?, format!("{spec} (its own config)")),
        None => {
            let config = Config {
                port: 0,
                queue_capacity: args.queue_capacity,
                model: args.model.as_ref().map(std::path::PathBuf::from),
                weight_format: args.weight_format,
                ..Config::default()
            };
            let desc = format!(
                "in-process mlxbar: queue_capacity {}, max_batch {}, prefix_cache {}, weight_format {:?}, admission {:?} (RSS is this process: server + soak client)",
                config.queue_capacity,
                config.max_batch,
                config.prefix_cache_bytes.map_or("sized from the model".into(), |b| format!("{} MB", b >> 20)),
                config.weight_format,
                config.admission
            );
            eprintln!("loading the model into an in-process mlxbar…");
            let s = Server::start(config).await?;
            s.wait_ready().await?;
            let t = Target { label: "mlxbar".into(), base_url: s.url(), model: "default".into() };
            local = Some(s);
            (t, desc)
        }
    };
    let client = reqwest::Client::builder().build()?;
    let info = runner::describe(&client, &target).await;
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let command = format!(
        "mlxbar bench soak --minutes {} --streams {} --seed {} --burst-every {} --burst-size {} --rest-every {} --max-growth-mb {} --max-slope-mb-per-hour {}",
        args.minutes,
        args.streams,
        args.seed,
        args.burst_every,
        args.burst_size,
        args.rest_every,
        args.max_growth_mb,
        args.max_slope_mb_per_hour
    );
    eprintln!("{command}\nserver: {server}");
    let ctx = Arc::new(Ctx {
        client,
        target,
        tally: Mutex::default(),
        in_flight: 0.into(),
        stop: CancellationToken::new(),
        gate: tokio::sync::RwLock::new(()),
    });
    let start = Instant::now();
    let scrapes_done = CancellationToken::new();
    let scraping = tokio::spawn(scraper(ctx.clone(), start, total, scrapes_done.clone()));
    let mut load = JoinSet::new();
    for w in 0..args.streams {
        load.spawn(stream_loop(ctx.clone(), args.seed, w));
    }
    if args.burst_every > 0.0 && args.burst_size > 0 {
        load.spawn(burst_loop(ctx.clone(), args.seed, Duration::from_secs_f64(args.burst_every), args.burst_size));
    }
    let resting = (args.rest_every > 0.0).then(|| tokio::spawn(rest_loop(ctx.clone(), start, Duration::from_secs_f64(args.rest_every))));
    let stopper = {
        let stop = ctx.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(total) => {}
                _ = tokio::signal::ctrl_c() => eprintln!("Ctrl-C: stopping the load; requests in flight finish"),
            }
            stop.cancel();
            start.elapsed().as_secs_f64()
        })
    };
    while let Some(r) = load.join_next().await {
        if let Err(e) = r {
            eprintln!("a load task died: {e}");
        }
    }
    // The loops end only once `stop` is cancelled, so the stopper has returned.
    let load_seconds = stopper.await?;
    let mut rests = match resting {
        Some(r) => r.await?,
        None => vec![],
    };
    eprintln!("load stopped; the last requests ended at {:.0} s; waiting for the server to drain", start.elapsed().as_secs_f64());
    let drained = drain(&ctx.client, &ctx.target).await;
    // One last sample after the drain, so "end" is the idle server.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    scrapes_done.cancel();
    let (mut samples, mut scrapes_failed, mut scrape_errors) = scraping.await?;
    match scrape(&ctx.client, &ctx.target, start.elapsed().as_secs_f64()).await {
        Ok(s) => samples.push(s),
        Err(e) => {
            scrapes_failed += 1;
            scrape_errors.push(e);
        }
    }
    if let (Ok(()), Some(last)) = (&drained, samples.last()) {
        if !rests.is_empty() {
            rests.push(RestPoint { t: last.t, mb: last.rss_less_caches() / MB });
        }
    }
    if let Some(s) = local {
        s.shutdown().await;
    }
    let tally = ctx.tally.lock().unwrap().clone();
    let series = |f: &dyn Fn(&Sample) -> Option<f64>| {
        mem_stats(&samples.iter().filter_map(|s| Some((s.t, f(s)?))).collect::<Vec<_>>(), WARMUP_FRACTION)
    };
    let (rss, rss_less_caches) = (series(&|s| Some(s.rss)), series(&|s| Some(s.rss_less_caches())));
    let (mlx_active, mlx_cache, prefix_cache) = (series(&|s| s.mlx_active), series(&|s| s.mlx_cache), series(&|s| s.prefix_cache));
    let max_waiting = samples.iter().filter_map(|s| s.waiting).fold(0.0, f64::max) as u64;
    let queue_capacity = args.target.is_none().then_some(args.queue_capacity as u64);
    let seconds = start.elapsed().as_secs_f64();
    let rest_slope_mb_per_hour = rest_slope(&rests, seconds, REST_WARMUP_FRACTION);
    let failures = verdict(
        &tally,
        scrapes_failed,
        &drained,
        (max_waiting, queue_capacity),
        (rss_less_caches.as_ref(), rest_slope_mb_per_hour),
        (args.max_growth_mb, args.max_slope_mb_per_hour),
    );
    let report = SoakReport {
        command,
        server,
        machine: Machine::this(),
        model: info.model_id.clone(),
        mlxbar: info.mlxbar.clone(),
        load_seconds,
        seconds,
        requests_per_second: tally.answered() as f64 / seconds,
        tokens_per_second: tally.tokens as f64 / seconds,
        tally,
        scrapes_ok: samples.len(),
        max_waiting,
        queue_capacity,
        scrapes_failed,
        scrape_errors,
        drain: drained,
        rss,
        rss_less_caches,
        rests,
        rest_slope_mb_per_hour,
        mlx_active,
        mlx_cache,
        prefix_cache,
        failures,
        samples,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("\n{}", report.table());
    }
    if !report.passed() {
        bail!("soak failed: {}", report.failures.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_is_least_squares_per_hour() {
        // 1 MB per minute = 60 MB/h, with symmetric noise that must not move the slope.
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 60.0, i as f64 + if i % 2 == 0 { 0.5 } else { -0.5 })).collect();
        let s = slope_per_hour(&pts).unwrap();
        assert!((s - 60.0).abs() < 2.0, "{s}");
        assert_eq!(slope_per_hour(&[(0.0, 5.0), (0.0, 7.0)]), None);
        assert_eq!(slope_per_hour(&[(1.0, 5.0)]), None);
        assert_eq!(slope_per_hour(&[(0.0, 5.0), (3600.0, 5.0)]), Some(0.0));
    }

    #[test]
    fn memory_growth_ignores_the_warm_up() {
        // Climbs to 500 MB during the first 10% (load), dips to 480, ends at 490.
        let mb = |v: f64| v * MB;
        let pts = vec![(0.0, mb(100.0)), (5.0, mb(500.0)), (10.0, mb(480.0)), (50.0, mb(485.0)), (100.0, mb(490.0))];
        let m = mem_stats(&pts, 0.1).unwrap();
        assert_eq!((m.start_mb, m.end_mb, m.max_mb, m.growth_mb), (100.0, 490.0, 500.0, 10.0));
        assert!(m.slope_mb_per_hour.unwrap() > 0.0);
        assert_eq!(mem_stats(&[], 0.1), None);
    }

    #[test]
    fn every_outcome_lands_in_one_bucket() {
        let mut t = Tally { sent: 6, burst_sent: 2, ..Tally::default() };
        for (o, burst) in [
            (Outcome::Completed { tokens: 10 }, false),
            (Outcome::Rejected { retry_after: 1 }, true),
            (Outcome::Rejected { retry_after: 1 }, false),
            (Outcome::Cancelled { tokens: 3 }, false),
            (Outcome::Failed("HTTP 500".into()), true),
        ] {
            t.record(&o, burst);
        }
        assert_eq!((t.completed, t.rejected_429, t.burst_rejected_429, t.cancelled, t.failed, t.lost, t.tokens), (1, 2, 1, 1, 1, 0, 13));
        assert_eq!(t.problems, vec!["HTTP 500".to_string()]);
        // One request never reported back: it counts as lost.
        assert_eq!(t.unaccounted(), 1);
    }

    #[test]
    fn verdict_fails_on_loss_failure_scrapes_drain_queue_and_growth() {
        const Q: (u64, Option<u64>) = (16, Some(16));
        const B: (f64, f64) = (200.0, 100.0);
        let ok_mem = MemStats { start_mb: 100.0, end_mb: 300.0, max_mb: 310.0, growth_mb: 20.0, slope_mb_per_hour: Some(1.0) };
        let good = Tally { sent: 3, completed: 2, rejected_429: 1, ..Tally::default() };
        assert!(verdict(&good, 0, &Ok(()), Q, (Some(&ok_mem), Some(1.0)), B).is_empty());

        let lost = Tally { sent: 4, lost: 1, ..good.clone() };
        assert!(verdict(&lost, 0, &Ok(()), Q, (Some(&ok_mem), Some(1.0)), B)[0].contains("1 request(s) lost"));
        let unaccounted = Tally { sent: 4, ..good.clone() };
        assert!(verdict(&unaccounted, 0, &Ok(()), Q, (Some(&ok_mem), Some(1.0)), B)[0].contains("lost"));
        let failed = Tally { sent: 4, failed: 1, ..good.clone() };
        assert!(verdict(&failed, 0, &Ok(()), Q, (Some(&ok_mem), Some(1.0)), B)[0].contains("failed"));
        assert!(verdict(&good, 2, &Ok(()), Q, (Some(&ok_mem), Some(1.0)), B)[0].contains("scrape"));
        assert!(verdict(&good, 0, &Err("running 1".into()), Q, (Some(&ok_mem), Some(1.0)), B)[0].contains("drain"));
        let grown = MemStats { growth_mb: 250.0, ..ok_mem.clone() };
        assert!(verdict(&good, 0, &Ok(()), Q, (Some(&grown), Some(1.0)), B)[0].contains("grew 250 MB"));
        assert!(!verdict(&good, 0, &Ok(()), Q, (None, None), B).is_empty());
        // Under the growth bound, but rising 150 MB an hour at rest: a leak all the same.
        assert_eq!(
            verdict(&good, 0, &Ok(()), Q, (Some(&ok_mem), Some(150.0)), B),
            vec!["RSS less the caches, at rest, rose 150 MB/h after the warm-up (bound 100 MB/h)".to_string()]
        );
        // Under load the slope follows the requests in flight; only the rests count.
        let swinging = MemStats { slope_mb_per_hour: Some(400.0), ..ok_mem.clone() };
        assert!(verdict(&good, 0, &Ok(()), Q, (Some(&swinging), Some(20.0)), B).is_empty());
        assert!(verdict(&good, 0, &Ok(()), (17, Some(16)), (Some(&ok_mem), Some(1.0)), B)[0].contains("past the queue capacity of 16"));
        assert!(verdict(&good, 0, &Ok(()), (99, None), (Some(&ok_mem), Some(1.0)), B).is_empty());
        assert!(!verdict(&Tally { sent: 1, rejected_429: 1, ..Tally::default() }, 0, &Ok(()), Q, (Some(&ok_mem), Some(1.0)), B).is_empty());
    }

    #[test]
    fn the_rest_slope_skips_the_warm_up_and_needs_two_rests() {
        // The 15-minute run of 2026-12-03: the first rest is low, the allocator still settling.
        let rests = [(170.0, 302.0), (422.0, 330.0), (568.0, 333.0), (732.0, 334.0), (876.0, 333.0), (920.0, 332.0)]
            .map(|(t, mb)| RestPoint { t, mb });
        assert!(rest_slope(&rests, 920.0, 0.1).unwrap() > 100.0, "with it, the settling reads as a leak");
        let s = rest_slope(&rests, 920.0, REST_WARMUP_FRACTION).unwrap();
        assert!(s.abs() < 20.0, "{s}");
        // A steady 10 MB per rest every 2 minutes is 300 MB/h.
        let leaking: Vec<RestPoint> = (1..=5).map(|i| RestPoint { t: 120.0 * i as f64, mb: 300.0 + 10.0 * i as f64 }).collect();
        assert!((rest_slope(&leaking, 600.0, 0.1).unwrap() - 300.0).abs() < 1e-6);
        assert_eq!(rest_slope(&rests[..2], 920.0, REST_WARMUP_FRACTION), None);
    }

    #[test]
    fn parses_memory_from_prometheus_text() {
        let text = "# HELP x\nmlxbar_mlx_memory_bytes{kind=\"active\"} 1048576\nmlxbar_mlx_memory_bytes{kind=\"cache\"} 2097152\nmlxbar_process_resident_memory_bytes 8388608\nmlxbar_process_resident_memory_bytes_x 9\nmlxbar_prefix_cache_bytes 1048576\nmlxbar_scheduler_waiting_requests 3\n";
        let s = parse_sample(2.0, text).unwrap();
        assert_eq!((s.t, s.rss, s.mlx_active, s.mlx_cache, s.prefix_cache), (2.0, 8.0 * MB, Some(MB), Some(2.0 * MB), Some(MB)));
        assert_eq!((s.rss_less_caches(), s.waiting), (5.0 * MB, Some(3.0)));
        assert!(parse_sample(0.0, "mlxbar_mlx_memory_bytes{kind=\"active\"} 1\n").is_none());
    }
}
