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
use crate::engine::LoadState;
use crate::library::{inspect, Library, ModelEntry, ModelFormat, ModelSource, Sources, Watcher};
use crate::metrics::Metrics;
use crate::model_store;
use crate::ollama_port::{OllamaPort, Switch, OLLAMA_DEFAULT_PORT};
use crate::registry::{Models, Parts};
use crate::telemetry::memory::PressureLevel;
use crate::telemetry::Telemetry;
use crate::transport;

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
    /// Work waits but the engine made no step for `stall_seconds`.
    pub stalled: bool,
    /// GPU busy share (0–1) and frequency, chip power and thermal pressure, each None where
    /// this machine cannot read it.
    pub gpu_busy_ratio: Option<f64>,
    pub gpu_frequency_hertz: Option<f64>,
    pub chip_watts: Option<f64>,
    pub thermal: Option<crate::telemetry::power::ThermalPressure>,
}

/// The port is taken: `Server::start` fails with this (the CLI and the app print its one
/// line and exit non-zero).
#[derive(Debug, thiserror::Error)]
#[error("port {port} on {host} is already in use (another mlxbar, or another program); choose another with --port")]
pub struct PortInUse {
    pub host: std::net::IpAddr,
    pub port: u16,
}

pub struct Server {
    addr: SocketAddr,
    state: AppState,
    models: Arc<Models>,
    telemetry: Arc<Telemetry>,
    alerts: Arc<Alerts>,
    paused: Arc<AtomicBool>,
    monitor: JoinHandle<()>,
    /// Rescans the library when a model folder changes; dropped with the server.
    _watcher: Option<Watcher>,
    stopping: tokio::sync::watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// The second address for Ollama clients (`ollama_port`, the menu bar's switch).
    ollama: Arc<Switch>,
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
        match transport::nofile::raise() {
            Some(open_files) if (open_files as usize) < config.max_connections + transport::REFUSING + 64 => tracing::warn!(
                "the open-files limit is {open_files}: max_connections = {} leaves little room for model files; lower it or raise the limit",
                config.max_connections
            ),
            _ => {}
        }
        let listener = match tokio::net::TcpListener::bind(config.addr()).await {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return Err(PortInUse { host: config.host, port: config.port }.into()),
            Err(e) => return Err(e).with_context(|| format!("binding {}", config.addr())),
        };
        let addr = listener.local_addr()?;
        let telemetry = Telemetry::start(std::time::Duration::from_secs(1), config.power_sampler);
        let gate_telemetry = telemetry.clone();
        let metrics = Arc::new(Metrics::with_per_request(config.metrics_enabled));
        let config = Arc::new(config);
        let library = {
            let sources = Sources::from_env(config.models_dirs.clone(), vec![model_path.clone()]);
            Arc::new(tokio::task::spawn_blocking(move || Library::new(sources)).await?)
        };
        let watcher = match library.watch() {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!("not watching the model folders for changes ({e:#}); POST /api/models/refresh rescans");
                None
            }
        };
        let default = default_entry(&library, &model_path);
        let models = Models::new(
            config.clone(),
            Parts {
                library,
                default,
                telemetry: telemetry.clone(),
                metrics: metrics.clone(),
                gate: Some(Arc::new(move || gate_telemetry.pressure_critical())),
            },
        );
        // The default model loads now; the server answers meanwhile (/health: loading).
        tokio::spawn({
            let models = models.clone();
            async move {
                let id = models.default_id().to_string();
                if let Err(e) = models.load(&id).await {
                    tracing::error!("the default model {id} did not load: {e}");
                }
            }
        });
        let mut rules = alerts::rules::resolve(&config.alerts)?;
        // The watchdog's alert fires when /health says stalled, unless the config sets its own.
        let own = config.alerts.get("engine_stalled").is_some_and(|o| o.threshold.is_some() || o.recover_below.is_some());
        if let Some(r) = rules.iter_mut().find(|r| r.id == "engine_stalled").filter(|_| !own) {
            (r.threshold, r.recover_below) = (config.stall_seconds, config.stall_seconds);
            r.summary = alerts::rules::summary(r.signal, r.threshold, r.window_seconds);
        }
        let alerts = Alerts::new(rules);
        alerts.persist_in(models.state_store().clone());
        let monitor = alerts::monitor::spawn(alerts.clone(), models.clone(), telemetry.clone(), metrics.clone());
        // The bench talks to this server over loopback (or the bound address if it is not
        // a wildcard).
        let self_ip = if addr.ip().is_unspecified() { std::net::IpAddr::from([127, 0, 0, 1]) } else { addr.ip() };
        let bench = BenchJobs::new(
            BenchStore::new(&config.data_dir()),
            format!("http://{}", SocketAddr::new(self_ip, addr.port())),
            config.api_key.clone(),
            metrics.clone(),
            telemetry.power.clone(),
        );
        let paused = Arc::new(AtomicBool::new(false));
        let draining = Arc::new(AtomicBool::new(false));
        let (stopping, stopping_rx) = tokio::sync::watch::channel(false);
        let live = api::live::Feed::new(config.max_stream_subscribers);
        let prepare = crate::inference::prepare::Prepare::new(config.prepare_threads());
        let state = AppState {
            models: models.clone(),
            config,
            metrics,
            telemetry: telemetry.clone(),
            alerts: alerts.clone(),
            bench: bench.clone(),
            // A finished pull is in the library before it says "done".
            pulls: crate::library::pull::Pulls::new({
                let library = models.library().clone();
                Arc::new(move |_snapshot: &std::path::Path| {
                    library.refresh();
                })
            }),
            paused: paused.clone(),
            draining,
            stopping: stopping_rx,
            live,
            prepare,
            ollama_port: Arc::new(std::sync::Mutex::new(OllamaPort::Off)),
            started: Instant::now(),
            started_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        };
        let app = api::router(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let limits = transport::Limits::from_config(&state.config);
        // The Ollama port serves the same router: on as the menu bar last left it, else as
        // the config says.
        let ollama = Arc::new(Switch::new(
            state.config.ollama_port.unwrap_or(OLLAMA_DEFAULT_PORT),
            state.ollama_port.clone(),
            app.clone(),
            limits,
            state.metrics.clone(),
            models.state_store().clone(),
        ));
        let saved = models.state_store().get().ollama_port;
        if saved.unwrap_or(state.config.ollama_port.is_some()) {
            ollama.set(true, false).await;
        }
        let task = tokio::spawn(transport::serve(listener, app, limits, state.metrics.clone(), async {
            let _ = stopped.await;
        }));
        Ok(Server { addr, state, models, telemetry, alerts, paused, monitor, _watcher: watcher, stopping, stop: Some(stop), task, ollama })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model registry: list, load and unload models (the tray's Model menu).
    pub fn models(&self) -> &Arc<Models> {
        &self.models
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn status(&self) -> ServerStatus {
        let sys = self.telemetry.latest();
        let power = self.telemetry.power.latest();
        ServerStatus {
            url: self.url(),
            state: self.models.default_state(),
            paused: self.is_paused(),
            pressure: sys.memory.as_ref().map(|m| m.pressure).unwrap_or_default(),
            tokens_per_second: self.state.metrics.live.tokens_per_second_now(),
            running: self.models.running(),
            waiting: self.models.waiting(),
            alerts_firing: self.alerts.view().iter().filter(|a| a.firing && !a.snoozed).count(),
            bench_running: self.state.bench.active().is_some(),
            stalled: crate::api::health::status_word(&self.state) == "stalled",
            gpu_busy_ratio: power.gpu_busy_ratio,
            gpu_frequency_hertz: power.gpu_frequency_hertz,
            chip_watts: power.chip_watts,
            thermal: power.thermal_pressure,
        }
    }

    /// The Ollama port (127.0.0.1:`ollama_port`, else 11434): the menu bar turns it on and off.
    pub fn ollama_port(&self) -> &Arc<Switch> {
        &self.ollama
    }

    /// Bench runs: start one from the menu bar with `server.bench().start("quick")`.
    pub fn bench(&self) -> &Arc<BenchJobs> {
        &self.state.bench
    }

    pub fn alerts(&self) -> &Arc<Alerts> {
        &self.alerts
    }

    /// Test hook: pretend memory pressure is at `level` (None: measure again).
    #[cfg(feature = "test-hooks")]
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
        self.models.wait_ready().await
    }

    /// Drains, then stops: new generation requests get 503 `shutting_down` while the
    /// in-flight ones finish (up to `shutdown_grace_seconds`); then a bench run is
    /// cancelled, the engine stops (what still runs ends with a 503), live streams end and
    /// the socket closes (connections still answering get [`transport::DRAIN`]).
    pub async fn shutdown(mut self) {
        self.state.draining.store(true, Ordering::Relaxed);
        let grace = std::time::Duration::from_secs_f64(self.state.config.shutdown_grace_seconds);
        let deadline = tokio::time::Instant::now() + grace;
        let bench_active = self.state.bench.active().is_some();
        // A bench run's requests are not worth waiting for.
        while !bench_active && self.models.running() + self.models.waiting() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        self.state.bench.cancel_active().await;
        self.telemetry.stop();
        self.monitor.abort();
        let _ = self.stopping.send(true);
        let models = self.models.clone();
        let _ = tokio::task::spawn_blocking(move || models.shutdown()).await;
        self.ollama.set(false, false).await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// The default model's library entry; a path the library cannot describe still gets one
/// (named after its file), so its load runs and the loader says what is wrong.
fn default_entry(library: &Library, path: &std::path::Path) -> ModelEntry {
    let found = library.entries().into_iter().find(|e| e.path == path).or_else(|| inspect::inspect(path));
    found.unwrap_or_else(|| ModelEntry {
        id: path.file_stem().or(path.file_name()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()),
        path: path.to_path_buf(),
        format: if path.is_dir() { ModelFormat::Mlx } else { ModelFormat::Gguf },
        source: ModelSource::Path,
        revision: None,
        architecture: None,
        parameters: None,
        quantization: None,
        size_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        context_length: None,
        chat_template: false,
        shape: None,
        weight_parts: vec![],
        experts: None,
        runnable: false,
        unsupported_reason: Some(format!("{} could not be read as a model", path.display())),
    })
}
