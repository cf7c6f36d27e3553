//! [`Server`]: the engine plus the HTTP API on a socket, startable from any tokio runtime
//! (the CLI's, or the menu-bar app's) and stoppable cleanly.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::alerts::{self, Alerts};
use crate::api::{self, AppState};
use crate::bench::jobs::BenchJobs;
use crate::bench::store::BenchStore;
use crate::config::Config;
use crate::engine::{Engine, EngineOptions, LoadState};
use crate::telemetry::memory::PressureLevel;
use crate::metrics::Metrics;
use crate::model_store;
use crate::telemetry::Telemetry;

/// What the menu-bar icon shows at a glance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerStatus {
    pub url: String,
    pub state: LoadState,
    pub paused: bool,
    pub pressure: PressureLevel,
    /// Generated tokens per second over the last few seconds.
    pub tokens_per_second: f64,
    pub running: usize,
    pub waiting: usize,
    /// Firing alerts that are not snoozed.
    pub alerts_firing: usize,
    /// A bench run holds the engine.
    pub bench_running: bool,
}

pub struct Server {
    addr: SocketAddr,
    state: AppState,
    engine: Arc<Engine>,
    telemetry: Arc<Telemetry>,
    alerts: Arc<Alerts>,
    paused: Arc<AtomicBool>,
    monitor: JoinHandle<()>,
    stopping: tokio::sync::watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    /// Binds the socket and starts loading the model; answers right away (`/health` says
    /// "loading" until [`Server::wait_ready`]). Fetches the default model first if needed.
    pub async fn start(config: Config) -> Result<Server> {
        config.validate()?;
        let model_path = match &config.model {
            Some(p) => p.clone(),
            None => tokio::task::spawn_blocking(model_store::ensure_default_model).await??,
        };
        let listener = tokio::net::TcpListener::bind(config.addr())
            .await
            .with_context(|| format!("binding {}", config.addr()))?;
        let addr = listener.local_addr()?;
        let telemetry = Telemetry::start(std::time::Duration::from_secs(1));
        let gate_telemetry = telemetry.clone();
        let engine = Arc::new(Engine::start(EngineOptions {
            model_path,
            weight_format: config.weight_format,
            queue_capacity: config.queue_capacity,
            max_batch: config.max_batch,
            kv_budget_tokens: config.kv_budget_tokens,
            prefix_cache_bytes: config.prefix_cache_bytes,
            mlx_memory_limit: config.mlx_memory_limit_bytes,
            mlx_cache_limit: config.mlx_cache_limit_bytes,
            admission_gate: Some(Arc::new(move || gate_telemetry.pressure_critical())),
            test_fail_marker: config.test_fail_marker.clone(),
        })?);
        let metrics = Arc::new(Metrics::with_per_request(config.metrics_enabled));
        let alerts = Alerts::new(alerts::rules::resolve(&config.alerts)?);
        let monitor = alerts::monitor::spawn(alerts.clone(), engine.clone(), telemetry.clone(), metrics.clone());
        // The bench talks to this server over loopback (or the bound address if it is not
        // a wildcard).
        let self_ip = if addr.ip().is_unspecified() { std::net::IpAddr::from([127, 0, 0, 1]) } else { addr.ip() };
        let bench = BenchJobs::new(BenchStore::new(&config.data_dir()), format!("http://{}", SocketAddr::new(self_ip, addr.port())), config.api_key.clone(), metrics.clone());
        let paused = Arc::new(AtomicBool::new(false));
        let (stopping, stopping_rx) = tokio::sync::watch::channel(false);
        let state = AppState {
            engine: engine.clone(),
            config: Arc::new(config),
            metrics,
            telemetry: telemetry.clone(),
            alerts: alerts.clone(),
            bench: bench.clone(),
            paused: paused.clone(),
            stopping: stopping_rx,
            started: Instant::now(),
            started_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        };
        let app = api::router(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = served.await {
                tracing::error!("server error: {e}");
            }
        });
        Ok(Server { addr, state, engine, telemetry, alerts, paused, monitor, stopping, stop: Some(stop), task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn status(&self) -> ServerStatus {
        let sys = self.telemetry.latest();
        ServerStatus {
            url: self.url(),
            state: self.engine.state(),
            paused: self.is_paused(),
            pressure: sys.memory.as_ref().map(|m| m.pressure).unwrap_or_default(),
            tokens_per_second: self.state.metrics.live.tokens_per_second_now(),
            running: self.engine.running(),
            waiting: self.engine.waiting(),
            alerts_firing: self.alerts.view().iter().filter(|a| a.firing && !a.snoozed).count(),
            bench_running: self.state.bench.active().is_some(),
        }
    }

    /// Bench runs: start one from the menu bar with `server.bench().start("quick")`.
    pub fn bench(&self) -> &Arc<BenchJobs> {
        &self.state.bench
    }

    pub fn alerts(&self) -> &Arc<Alerts> {
        &self.alerts
    }

    /// Test hook: pretend memory pressure is at `level` (None: measure again).
    #[doc(hidden)]
    pub fn force_memory_pressure(&self, level: Option<PressureLevel>) {
        self.telemetry.force_pressure(level);
    }

    /// While paused, generation requests get 503 with Retry-After; running ones finish.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    pub async fn wait_ready(&self) -> Result<()> {
        self.engine.wait_ready().await
    }

    /// Cancels a bench run, stops the engine (running requests end with an error within one
    /// step), then lets open connections finish and closes the socket.
    pub async fn shutdown(mut self) {
        self.state.bench.cancel_active().await;
        self.telemetry.stop();
        self.monitor.abort();
        let _ = self.stopping.send(true);
        let engine = self.engine.clone();
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}
