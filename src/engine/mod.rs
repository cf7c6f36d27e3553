//! The inference engine: model, tokenizer and chat template, sampling, KV cache and the
//! generation loop, on a thread of its own. [`Engine`] is the `Send + Sync` handle the
//! HTTP side uses: it renders and counts prompts, and queues requests with back-pressure.
pub mod batch_kv;
pub mod chat_template;
pub mod constraint;
pub mod cpu_backend;
#[cfg(feature = "test-hooks")]
pub mod faults;
pub mod kv_cache;
pub mod loader;
pub mod logprobs;
pub mod model;
pub mod prefix_cache;
mod quiet;
pub mod request;
pub mod sampling;
pub mod stats;
pub mod text_stream;
pub mod tokenizer;
pub mod tools;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

pub use constraint::{Constraint, ConstraintError, ConstraintState, Grammars};
pub use loader::ModelInfo;
pub use model::WeightFormat;
pub use request::{Completion, EngineError, ErrorKind, Event, FinishReason, GenerationRequest, Timings};
pub use sampling::SamplingParams;
pub use stats::StatsView;
pub use tokenizer::TextCodec;
pub use worker::PREFILL_CHUNK;

/// Says whether new work must wait (memory pressure critical); asked once per engine
/// iteration while requests wait.
pub type AdmissionGate = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Clone)]
pub struct EngineOptions {
    pub model_path: PathBuf,
    /// The id clients name the model by (the registry's: `org/name` for hub models).
    pub model_id: String,
    pub weight_format: WeightFormat,
    /// Requests that may wait for the engine; more get "queue full".
    pub queue_capacity: usize,
    /// Sequences decoded together in one batched step.
    pub max_batch: usize,
    /// KV tokens (prompt + max_tokens) running requests may claim together; None derives
    /// it from `kv_budget_bytes`.
    pub kv_budget_tokens: Option<usize>,
    /// Bytes of KV this engine's running requests may hold together: its share of memory,
    /// granted by the registry's budget before the load.
    pub kv_budget_bytes: usize,
    /// MLX's process-wide memory limit (set by `registry::budget`): one request needing
    /// more than it leaves beside the weights is refused.
    pub mlx_memory_limit: usize,
    /// Bytes of finished sequences' KV kept for prefix reuse (0: off).
    pub prefix_cache_bytes: usize,
    /// With no work on any engine for this long, MLX's buffer cache is cleared.
    pub cache_idle: std::time::Duration,
    pub admission_gate: Option<AdmissionGate>,
    /// The process-wide grammar-mask histogram every engine observes.
    pub mask_seconds: stats::MaskSeconds,
    pub device_lock: DeviceLock,
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("model_path", &self.model_path)
            .field("model_id", &self.model_id)
            .field("weight_format", &self.weight_format)
            .field("queue_capacity", &self.queue_capacity)
            .field("max_batch", &self.max_batch)
            .field("kv_budget_tokens", &self.kv_budget_tokens)
            .field("kv_budget_bytes", &self.kv_budget_bytes)
            .field("prefix_cache_bytes", &self.prefix_cache_bytes)
            .finish_non_exhaustive()
    }
}

/// Where the engine runs its arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

impl DeviceKind {
    /// Metal on macOS, MLX's CPU backend elsewhere.
    pub fn for_this_platform() -> DeviceKind {
        if cfg!(target_os = "macos") {
            DeviceKind::Gpu
        } else {
            DeviceKind::Cpu
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "state", content = "detail", rename_all = "lowercase")]
pub enum LoadState {
    Loading,
    Ready,
    Failed(String),
    Stopped,
}

/// The loaded model's text side, read together (a reload replaces it whole).
#[derive(Clone)]
pub struct Loaded {
    pub info: ModelInfo,
    pub codec: Arc<TextCodec>,
    /// Compiles requests' output constraints against this model's vocabulary.
    pub grammars: Arc<Grammars>,
}

/// State shared between the engine thread and its handles.
pub struct Shared {
    state: RwLock<LoadState>,
    loaded: RwLock<Option<Loaded>>,
    /// Requests queued, not yet taken by the engine.
    pub waiting: AtomicUsize,
    /// Sequences being generated.
    pub running: AtomicUsize,
    /// Engine steps (prefills and decode steps) run since start.
    pub steps: std::sync::atomic::AtomicU64,
    /// Cache, batch and admission figures for metrics and the snapshot.
    pub stats: stats::EngineStats,
    /// Set by [`Engine::shutdown`]: running requests end at their next step.
    stopping: std::sync::atomic::AtomicBool,
    ready: tokio::sync::Notify,
    /// How far the load has got, in thousandths.
    load_progress: std::sync::atomic::AtomicU32,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// `queue_capacity` requests already wait; `retry_after_secs` is estimated from the pace.
    #[error("the request queue is full ({waiting} waiting)")]
    QueueFull { waiting: usize, retry_after_secs: u64 },
    #[error("the model is still loading")]
    Loading,
    #[error("the engine is not running: {0}")]
    Unavailable(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the model is already loading")]
    AlreadyLoading,
    #[error("the engine has been shut down")]
    Stopped,
    #[error("starting the engine thread: {0}")]
    Spawn(String),
}

pub struct Engine {
    /// Replaced with the thread on a reload.
    jobs: Mutex<mpsc::SyncSender<worker::Job>>,
    shared: Arc<Shared>,
    options: EngineOptions,
    device: DeviceKind,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Serializes reloads and shutdown.
    lifecycle: Mutex<()>,
}

impl Engine {
    /// Starts the engine thread, which loads the model; [`Engine::wait_ready`] waits for it.
    pub fn start(options: EngineOptions) -> Result<Engine> {
        let shared = Arc::new(Shared {
            state: RwLock::new(LoadState::Loading),
            loaded: RwLock::new(None),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            steps: Default::default(),
            stats: stats::EngineStats::with_mask_seconds(options.mask_seconds.clone()),
            stopping: Default::default(),
            ready: tokio::sync::Notify::new(),
            load_progress: Default::default(),
        });
        let device = DeviceKind::for_this_platform();
        let (tx, thread) = spawn_thread(&options, device, &shared)?;
        Ok(Engine { jobs: Mutex::new(tx), shared, options, device, thread: Mutex::new(Some(thread)), lifecycle: Mutex::new(()) })
    }

    /// Stops the engine thread if it runs (its requests end with a 503), then loads the
    /// model afresh on a new one: the way back from a failed load or a dead engine.
    /// Blocks for at most one engine step; the load itself goes on in the background.
    pub fn reload(&self) -> Result<(), ReloadError> {
        let _one_at_a_time = self.lifecycle.lock().unwrap();
        match self.state() {
            LoadState::Loading => return Err(ReloadError::AlreadyLoading),
            LoadState::Stopped => return Err(ReloadError::Stopped),
            LoadState::Ready | LoadState::Failed(_) => {}
        }
        self.stop_thread();
        let s = &self.shared;
        s.stopping.store(false, Ordering::Relaxed);
        s.waiting.store(0, Ordering::Relaxed);
        s.running.store(0, Ordering::Relaxed);
        s.load_progress.store(0, Ordering::Relaxed);
        *s.loaded.write().unwrap() = None;
        *s.state.write().unwrap() = LoadState::Loading;
        let (tx, thread) = spawn_thread(&self.options, self.device, &self.shared).map_err(|e| {
            *s.state.write().unwrap() = LoadState::Failed(format!("starting the engine thread: {e}"));
            ReloadError::Spawn(e.to_string())
        })?;
        *self.jobs.lock().unwrap() = tx;
        *self.thread.lock().unwrap() = Some(thread);
        Ok(())
    }

    /// Asks the engine thread to stop within one step and waits for it.
    fn stop_thread(&self) {
        let Some(thread) = self.thread.lock().unwrap().take() else { return };
        self.shared.stopping.store(true, Ordering::Relaxed);
        // A full queue or a dead thread: the stopping flag alone ends the loop.
        let _ = self.jobs.lock().unwrap().try_send(worker::Job::Shutdown);
        let _ = thread.join();
    }

    /// Waits until the model is loaded (Ok) or failed to load (Err).
    pub async fn wait_ready(&self) -> Result<()> {
        loop {
            let notified = self.shared.ready.notified();
            match self.state() {
                LoadState::Ready => return Ok(()),
                LoadState::Failed(e) => anyhow::bail!("{e}"),
                LoadState::Stopped => anyhow::bail!("engine stopped"),
                LoadState::Loading => notified.await,
            }
        }
    }

    pub fn state(&self) -> LoadState {
        self.shared.state.read().unwrap().clone()
    }

    pub fn device(&self) -> DeviceKind {
        self.device
    }

    /// How far the load has got (0..1); 1 once loaded.
    pub fn load_progress(&self) -> f64 {
        f64::from(self.shared.load_progress.load(Ordering::Relaxed)) / 1000.0
    }

    pub fn model(&self) -> Option<ModelInfo> {
        self.shared.loaded.read().unwrap().as_ref().map(|l| l.info.clone())
    }

    /// The loaded model, its codec and grammars.
    pub fn loaded(&self) -> Option<Loaded> {
        self.shared.loaded.read().unwrap().clone()
    }

    pub fn waiting(&self) -> usize {
        self.shared.waiting.load(Ordering::Relaxed)
    }

    pub fn running(&self) -> usize {
        self.shared.running.load(Ordering::Relaxed)
    }

    pub fn steps(&self) -> u64 {
        self.shared.steps.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> StatsView {
        self.shared.stats.view()
    }

    /// Decode steps since start by batch size (index = sequences decoded together).
    pub fn decode_steps_by_batch_size(&self) -> Vec<u64> {
        self.shared.stats.batch_sizes().counts()
    }

    /// Seconds the engine has gone without finishing an iteration while work waits or
    /// runs; 0 when idle. The stall watchdog (`/health`, `engine_stalled`) reads it.
    pub fn stall_seconds(&self) -> f64 {
        if self.waiting() + self.running() == 0 {
            return 0.0;
        }
        self.shared.stats.since_progress()
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Queues a request; its tokens arrive on `req.events`.
    pub fn submit(&self, req: GenerationRequest) -> Result<(), SubmitError> {
        match self.state() {
            LoadState::Ready => {}
            LoadState::Loading => return Err(SubmitError::Loading),
            LoadState::Failed(e) => return Err(SubmitError::Unavailable(e)),
            LoadState::Stopped => return Err(SubmitError::Unavailable("stopped".into())),
        }
        // `waiting` counts every request not yet admitted, queued in the channel or held
        // by the engine, so the capacity bounds them all.
        let capacity = self.options.queue_capacity.max(1);
        let before = self
            .shared
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| (w < capacity).then_some(w + 1))
            .map_err(|waiting| SubmitError::QueueFull { waiting, retry_after_secs: self.retry_after_secs(waiting) })?;
        // Work arriving at an idle engine starts the stall clock afresh.
        if before == 0 && self.running() == 0 {
            self.shared.stats.mark_progress();
        }
        self.jobs.lock().unwrap().try_send(worker::Job::Generate(req)).map_err(|e| {
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::TrySendError::Full(_) => SubmitError::QueueFull { waiting: self.waiting(), retry_after_secs: 1 },
                mpsc::TrySendError::Disconnected(_) => SubmitError::Unavailable("engine thread exited".into()),
            }
        })
    }

    /// When a request turned away now could expect room: the queue ahead of it, served
    /// `max_batch` at a time at the recent pace of one request (1 s before any finished).
    pub fn retry_after_secs(&self, waiting: usize) -> u64 {
        let per_request = self.shared.stats.service_seconds().unwrap_or(1.0);
        let rounds = (waiting as f64 / self.options.max_batch.max(1) as f64).ceil().max(1.0);
        (per_request * rounds).ceil().clamp(1.0, 300.0) as u64
    }

    /// Stops the engine thread within one step (running requests get an error) and waits for it.
    pub fn shutdown(&self) {
        let _one_at_a_time = self.lifecycle.lock().unwrap();
        self.stop_thread();
        *self.shared.state.write().unwrap() = LoadState::Stopped;
        self.shared.ready.notify_waiters();
    }

    pub fn new_request(
        &self,
        prompt_ids: Vec<u32>,
        max_tokens: usize,
        sampling: SamplingParams,
        stop: Vec<String>,
    ) -> (GenerationRequest, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let req = GenerationRequest {
            prompt_ids,
            max_tokens,
            sampling,
            stop,
            constraint: None,
            logprobs: None,
            special_tokens_as_text: false,
            events: tx,
            enqueued_at: Instant::now(),
        };
        (req, rx)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The engine's scheduling limits: its KV budget in tokens (from the bytes the registry
/// granted, at most a full context for every batch slot) and what one request may use.
fn limits(options: &EngineOptions, model: &model::Model, info: &ModelInfo) -> worker::Limits {
    let per_token = model.kv_bytes_per_token().max(1);
    let ceiling = options.max_batch * info.context_length;
    let kv_budget_tokens = options.kv_budget_tokens.unwrap_or_else(|| (options.kv_budget_bytes / per_token).min(ceiling)).max(1);
    tracing::info!(
        "{}: batch up to {}, KV budget {} tokens ({} KB each), prefix cache {} MB",
        info.id,
        options.max_batch,
        kv_budget_tokens,
        per_token >> 10,
        options.prefix_cache_bytes >> 20
    );
    worker::Limits {
        max_batch: options.max_batch.max(1),
        kv_budget_tokens,
        prefix_cache_bytes: options.prefix_cache_bytes,
        gate: options.admission_gate.clone(),
        request_memory_bytes: options.mlx_memory_limit.saturating_sub(info.weight_bytes),
        kv_bytes_per_token: per_token,
        attention_heads: model.config.num_heads.max(1) as usize,
        device_lock: options.device_lock.clone(),
        cache_idle: options.cache_idle,
    }
}

/// The device the loaded models share: one engine computes at a time (one device gains
/// nothing from interleaving them, and MLX's streams are not meant to be driven from
/// several threads at once). Each engine holds it for its load and for each scheduling
/// step. Fair (first come, first served), so an engine decoding non-stop does not starve
/// another or a load. One per registry (a server), made by `registry::Models`.
pub type DeviceLock = Arc<parking_lot::FairMutex<()>>;

/// A new engine thread with its queue (capacity: `queue_capacity`).
fn spawn_thread(
    options: &EngineOptions,
    device: DeviceKind,
    shared: &Arc<Shared>,
) -> std::io::Result<(mpsc::SyncSender<worker::Job>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::sync_channel(options.queue_capacity.max(1) + 1);
    let (shared, options) = (shared.clone(), options.clone());
    let thread = std::thread::Builder::new().name("mlxbar-engine".into()).spawn(move || engine_thread(options, device, rx, shared))?;
    Ok((tx, thread))
}

fn engine_thread(options: EngineOptions, device: DeviceKind, jobs: mpsc::Receiver<worker::Job>, shared: Arc<Shared>) {
    let set_state = |s: LoadState| {
        *shared.state.write().unwrap() = s;
        shared.ready.notify_waiters();
    };
    cpu_backend::install();
    mlx_rs::Device::set_default(&match device {
        DeviceKind::Gpu => mlx_rs::Device::gpu(),
        DeviceKind::Cpu => mlx_rs::Device::cpu(),
    });
    let format = options.weight_format;
    tracing::info!("loading {} ({format:?} weights, {} device)", options.model_path.display(), device.as_str());
    let progress = |f: f64| shared.load_progress.store((f.clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
    let loaded = {
        let _device = options.device_lock.lock();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            loader::load_reporting(&options.model_path, &options.model_id, format, &progress)
        }))
    };
    let (model, codec, info) = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::error!("model load failed: {e:#}");
            return set_state(LoadState::Failed(format!("{e:#}")));
        }
        Err(_) => return set_state(LoadState::Failed("model load panicked".into())),
    };
    tracing::info!(
        "model {} loaded in {:.1}s: {} layers, {} MB of weights ({:?}, {} activations)",
        info.id,
        info.load_seconds,
        info.layers,
        info.weight_bytes / 1_000_000,
        info.weight_format,
        info.dtype
    );
    let limits = limits(&options, &model, &info);
    let started = Instant::now();
    let grammars = match Grammars::new(&codec, model.config.vocab_size.max(0) as usize) {
        Ok(g) => Arc::new(g),
        Err(e) => return set_state(LoadState::Failed(format!("building the token trie for constrained decoding: {e:#}"))),
    };
    tracing::debug!("token trie for constrained decoding built in {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    let codec = Arc::new(codec);
    *shared.loaded.write().unwrap() = Some(Loaded { info, codec: codec.clone(), grammars });
    progress(1.0);
    set_state(LoadState::Ready);
    shared.stats.mark_progress();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker::run(model, codec, jobs, shared.clone(), limits)));
    if shared.stopping.load(Ordering::Relaxed) {
        return;
    }
    // The loop ended without being asked to: whatever was queued or running is gone with
    // it (their clients see the stream end), and the engine reports itself failed.
    let reason = match ran {
        Ok(()) => "the engine thread ended unexpectedly".to_string(),
        Err(panic) => format!("the engine thread died: {}", worker::panic_message(panic.as_ref())),
    };
    tracing::error!("{reason}; reload the model (POST /api/engine/reload, or the menu bar's Reload model)");
    shared.waiting.store(0, Ordering::Relaxed);
    shared.running.store(0, Ordering::Relaxed);
    set_state(LoadState::Failed(reason));
}
