//! Live views for the popover and other dashboards: `GET /api/metrics/snapshot` (JSON)
//! and `GET /api/metrics/stream` (SSE: a `snapshot` event on connect, then one whenever
//! something changed, at most twice a second, and a heartbeat comment while idle; one
//! [`Feed`] renders each change once for every subscriber). The snapshot's shape is
//! [`Snapshot`](super::snapshot::Snapshot).
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::error::ApiError;
use super::snapshot::{Bench, Links, Memory, Power, Requests, Scheduler, Snapshot, Totals};
use super::AppState;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::Json;
use futures::{Stream, StreamExt};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

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
        power: Power { sample: (*state.telemetry.power.latest()).clone(), energy: state.telemetry.power.energy() },
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
        cluster: e.engine(e.default_id()).and_then(|x| x.loaded()).and_then(|l| l.cluster).map(|c| c.view()).or_else(|| {
            // Restarted to form the cluster again: none serving yet, and why.
            let (_, why) = e.cluster_rejoining()?;
            let spec = state.config.cluster.as_ref()?;
            Some(crate::distributed::report::ClusterView::rejoining(spec, why))
        }),
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
/// counts jitter every second; that alone is not news. So do watts: a whole watt, 5 % of GPU
/// busy or a thermal level is.
type Fingerprint = (
    u64,
    usize,
    usize,
    String,
    Option<u8>,
    u64,
    u64,
    Vec<(crate::alerts::Phase, bool)>,
    bool,
    (u64, u64, bool),
    Option<(String, usize)>,
    (Option<i64>, Option<i64>, Option<u8>),
);

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
        {
            let p = state.telemetry.power.latest();
            (p.chip_watts.map(|w| w as i64), p.gpu_busy_ratio.map(|b| (b * 20.0) as i64), p.thermal_pressure.map(|t| t.as_number()))
        },
    )
}

/// The live stream's one producer: while anyone listens, it looks every [`MIN_INTERVAL`]
/// whether something changed and, if so, renders one snapshot that every subscriber sends
/// (N dashboards cost one snapshot per change, not N every half second). At most
/// `max_stream_subscribers` listen at once.
pub struct Feed {
    /// The latest change's event data; subscribers wait on it.
    tx: watch::Sender<Arc<str>>,
    subscribers: Arc<Semaphore>,
    max: usize,
    /// Whether the ticker task runs (it ends when the last subscriber leaves).
    ticking: Mutex<bool>,
}

impl Feed {
    pub fn new(max_subscribers: usize) -> Arc<Feed> {
        Arc::new(Feed {
            tx: watch::Sender::new(Arc::from("")),
            subscribers: Arc::new(Semaphore::new(max_subscribers)),
            max: max_subscribers,
            ticking: Mutex::new(false),
        })
    }

    /// A place among the subscribers (503 past the cap) and the changes to come.
    fn subscribe(self: &Arc<Self>, state: &AppState) -> Result<(OwnedSemaphorePermit, watch::Receiver<Arc<str>>), ApiError> {
        let permit = self.subscribers.clone().try_acquire_owned().map_err(|_| ApiError::too_many_streams(self.max))?;
        let rx = self.tx.subscribe();
        let mut ticking = self.ticking.lock().unwrap_or_else(|p| p.into_inner());
        if !*ticking {
            *ticking = true;
            tokio::spawn(self.clone().tick(state.clone()));
        }
        Ok((permit, rx))
    }

    async fn tick(self: Arc<Self>, state: AppState) {
        let mut seen = fingerprint(&state);
        let mut stopping = state.stopping.clone();
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + MIN_INTERVAL, MIN_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stopping.wait_for(|s| *s) => {}
            }
            {
                // Decided under the lock a new subscriber takes: it either sees the ticker
                // running or starts another.
                let mut ticking = self.ticking.lock().unwrap_or_else(|p| p.into_inner());
                if self.tx.receiver_count() == 0 || *state.stopping.borrow() {
                    *ticking = false;
                    return;
                }
            }
            let fp = fingerprint(&state);
            if fp != seen {
                seen = fp;
                self.tx.send_replace(Arc::from(event_data(&state)));
            }
        }
    }
}

pub async fn stream(State(state): State<AppState>) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let (permit, rx) = state.live.subscribe(&state)?;
    // `retry` tells EventSource to reconnect after 1.5 s when the server goes away.
    let first = Event::default().event("snapshot").retry(RETRY).data(event_data(&state));
    // Each change the feed renders, or a heartbeat after HEARTBEAT without one; the
    // subscriber's place is held until its stream is dropped.
    let changes = futures::stream::unfold((rx, permit), |(mut rx, permit)| async move {
        match tokio::time::timeout(HEARTBEAT, rx.changed()).await {
            Ok(Ok(())) => {
                let data = rx.borrow_and_update().clone();
                Some((Ok(Event::default().event("snapshot").data(&*data)), (rx, permit)))
            }
            Ok(Err(_)) => None,
            Err(_) => Some((Ok(Event::default().comment("heartbeat")), (rx, permit))),
        }
    });
    let mut stopping = state.stopping.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    Ok(Sse::new(futures::stream::once(async move { Ok(first) }).chain(changes).take_until(stopped)))
}
