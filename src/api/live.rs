//! Live views for the popover and other dashboards: `GET /api/metrics/snapshot` (JSON)
//! and `GET /api/metrics/stream` (SSE: a `snapshot` event on connect, then one whenever
//! something changed, at most twice a second, and a heartbeat comment while idle). The
//! snapshot's shape is [`Snapshot`](super::snapshot::Snapshot).
use std::convert::Infallible;
use std::time::{Duration, Instant};

use super::snapshot::{Bench, Links, Memory, Requests, Scheduler, Snapshot, Totals};
use super::AppState;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::Json;
use futures::{Stream, StreamExt};

/// Minimum gap between two stream events.
const MIN_INTERVAL: Duration = Duration::from_millis(500);
/// A comment line keeps idle connections (and proxies) alive.
const HEARTBEAT: Duration = Duration::from_secs(15);
const RETRY: Duration = Duration::from_millis(1500);

pub fn snapshot(state: &AppState) -> Snapshot {
    let e = &state.models;
    let m = &state.metrics;
    let sys = state.telemetry.latest();
    let (requests, completion_tokens) = m.live.totals();
    let caches = e.stats();
    let lookups = caches.prefix_hits + caches.prefix_misses;
    Snapshot {
        version: env!("CARGO_PKG_VERSION"),
        at: crate::metrics::live::unix_seconds(),
        started_at: state.started_unix,
        uptime_seconds: state.started.elapsed().as_secs_f64(),
        device: e.device(),
        models: e.active_views(),
        library_generation: e.library_generation(),
        pulls: state.pulls.list(),
        state: e.default_state(),
        scheduler: Scheduler {
            waiting: e.waiting(),
            running: e.running(),
            queue_capacity: state.config.queue_capacity,
            last_step_age_seconds: e.stall_seconds(),
            health: super::health::status_word(state),
            restart_required: state.models.restart_required(),
            max_batch: state.config.max_batch,
            tokens_per_second: m.live.tokens_per_second_now(),
        },
        caches,
        prefix_cache_hit_rate: (lookups > 0).then(|| caches.prefix_hits as f64 / lookups as f64),
        memory: Memory {
            system: sys.memory.clone(),
            mlx: sys.mlx,
            process: sys.process,
            swap_in_pages_per_second: sys.swap_in_rate,
            swap_out_pages_per_second: sys.swap_out_rate,
            process_cpu_cores: sys.cpu_cores,
        },
        alerts: state.alerts.view(),
        bench: Bench {
            active: state.bench.active().and_then(|a| state.bench.job(&a.id)).map(|j| j.view()),
            waiting_requests: state.bench.waiting(),
        },
        paused: state.paused.load(std::sync::atomic::Ordering::Relaxed),
        totals: Totals { requests, completion_tokens, errors: m.live.errors_total() },
        requests: Requests { by_result: m.live.by_result(), recent: m.live.recent() },
        links: Links { metrics: "/metrics", grafana: state.config.grafana_url.clone() },
        timings: m.live.distributions(),
        throughput: m.live.throughput(),
    }
}

pub async fn get_snapshot(State(state): State<AppState>) -> Json<Snapshot> {
    Json(snapshot(&state))
}

/// A snapshot as one SSE event's data.
fn event_data(state: &AppState) -> String {
    serde_json::to_string(&snapshot(state)).expect("a snapshot is JSON")
}

/// What makes a new event worth sending: requests moved, the queue or load state changed,
/// the pressure level changed, swap or MLX memory moved by a visible step. Memory byte
/// counts jitter every second; that alone is not news.
type Fingerprint =
    (u64, usize, usize, String, Option<u8>, u64, u64, Vec<(crate::alerts::Phase, bool)>, bool, (u64, u64, bool), Option<(String, usize)>);

/// The models' states (a load's progress in tenths) and the library's generation.
fn models_fingerprint(state: &AppState) -> String {
    let views = state.models.active_views();
    let parts: Vec<String> =
        views.iter().map(|v| format!("{}:{:?}:{}:{}", v.entry.id, v.state, (v.progress.unwrap_or(0.0) * 10.0) as u32, v.pinned)).collect();
    let pulls: Vec<String> = state.pulls.list().iter().map(|p| format!("{}:{:?}:{}", p.repo, p.state, p.bytes_done >> 20)).collect();
    format!("{} {} {}", state.models.library_generation(), parts.join(","), pulls.join(","))
}

fn fingerprint(state: &AppState) -> Fingerprint {
    const SWAP_STEP: u64 = 64 << 20;
    const MLX_STEP: u64 = 16 << 20;
    let sys = state.telemetry.latest();
    let mem = sys.memory.as_ref();
    (
        state.metrics.live.version(),
        state.models.waiting(),
        state.models.running(),
        models_fingerprint(state),
        mem.and_then(|m| m.pressure.as_number()),
        mem.map_or(0, |m| m.swap_used / SWAP_STEP),
        sys.mlx.active / MLX_STEP,
        state.alerts.view().iter().map(|a| (a.state, a.snoozed)).collect(),
        state.paused.load(std::sync::atomic::Ordering::Relaxed),
        {
            let c = state.models.stats();
            (c.prefix_entries, c.prefix_hits, c.admission_blocked)
        },
        state.bench.active().map(|a| (a.id.clone(), a.requests_done())),
    )
}

pub async fn stream(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // `retry` tells EventSource to reconnect after 1.5 s when the server goes away.
    let first = Event::default().event("snapshot").retry(RETRY).data(event_data(&state));
    let state_stopping = state.stopping.clone();
    let seen = Some(fingerprint(&state));
    let now = tokio::time::Instant::now();
    // A check at most every MIN_INTERVAL, kept across events: two snapshots are never
    // closer than that.
    let s = futures::stream::unfold(
        (state, seen, now + MIN_INTERVAL, Instant::now()),
        |(state, mut seen, mut next_check, mut last_any)| async move {
            loop {
                tokio::time::sleep_until(next_check).await;
                next_check = tokio::time::Instant::now() + MIN_INTERVAL;
                let fp = fingerprint(&state);
                if seen.as_ref() != Some(&fp) {
                    seen = Some(fp);
                    last_any = Instant::now();
                    let ev = Event::default().event("snapshot").data(event_data(&state));
                    return Some((Ok(ev), (state, seen, next_check, last_any)));
                }
                if last_any.elapsed() >= HEARTBEAT {
                    last_any = Instant::now();
                    return Some((Ok(Event::default().comment("heartbeat")), (state, seen, next_check, last_any)));
                }
            }
        },
    );
    let mut stopping = state_stopping;
    let stopped = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    Sse::new(futures::stream::once(async move { Ok(first) }).chain(s).take_until(stopped))
}
