//! The inference engine: model, tokenizer and chat template, sampling, KV cache and the
//! generation loop, on a thread of its own. [`Engine`] is the `Send + Sync` handle the
//! HTTP side uses: it renders and counts prompts, and queues requests with back-pressure.
pub mod batch_kv;
pub mod chat_template;
pub mod constraint;
pub mod cpu_backend;
mod device_lock;
pub mod draft;
pub mod executor;
pub mod experts;
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
pub mod tokenizer_spm;
pub mod tools;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

pub use constraint::{Constraint, ConstraintError, ConstraintState, Grammars};
pub use device_lock::DeviceLock;
pub use loader::ModelInfo;
pub use model::WeightFormat;
pub use request::{Completion, EngineError, ErrorKind, Event, Events, FinishReason, GenerationRequest, Timings};
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
    /// Some: a mixture-of-experts model's experts stream from disk through a cache of this
    /// many bytes ([`experts`]); the registry sets it.
    pub expert_cache_bytes: Option<u64>,
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
    /// How long a stop waits for the engine thread to finish its step; past it the thread
    /// is left behind (stuck) and the engine reports itself failed: restart required.
    pub stop_timeout: std::time::Duration,
    /// Rank 0 of a cluster: the model is split over the ranks ([`crate::distributed`]).
    pub cluster: Option<ClusterMember>,
}

/// This process in a cluster, and what it may hold.
#[derive(Debug, Clone)]
pub struct ClusterMember {
    pub spec: crate::distributed::ClusterSpec,
    /// Bytes of weights this rank may hold (its memory budget's ceiling).
    pub budget: u64,
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
    /// A streamed model's expert cache figures.
    pub experts: Option<Arc<experts::ExpertStats>>,
    /// Rank 0 of a cluster: every rank's figures.
    pub cluster: Option<Arc<crate::distributed::report::ClusterStats>>,
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
    /// Set when the thread is left stuck (a stop found it in a step, or a cluster's rank
    /// was lost while it waited in a collective): why a restart is required. A watch, so
    /// the requests it was running end when it is set: [`request::Events`].
    stuck: tokio::sync::watch::Sender<Option<String>>,
}

impl Shared {
    /// The engine thread is left behind: turns the engine failed, then ends its requests
    /// with `reason` (in that order: a client that reads the error then asks /health must
    /// find the engine failed).
    fn give_up(&self, reason: &str) {
        *self.state.write().unwrap() = LoadState::Failed(reason.to_string());
        self.stuck.send_replace(Some(reason.to_string()));
        self.ready.notify_waiters();
    }
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

pub struct Engine {
    jobs: Mutex<mpsc::SyncSender<worker::Job>>,
    shared: Arc<Shared>,
    options: EngineOptions,
    device: DeviceKind,
    thread: Mutex<Option<EngineThread>>,
    /// Serializes shutdowns.
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
            stuck: tokio::sync::watch::Sender::new(None),
        });
        let device = DeviceKind::for_this_platform();
        let (tx, thread) = spawn_thread(&options, device, &shared)?;
        Ok(Engine { jobs: Mutex::new(tx), shared, options, device, thread: Mutex::new(Some(thread)), lifecycle: Mutex::new(()) })
    }

    /// Asks the engine thread to stop within one step and waits for it, at most
    /// `stop_timeout`. A thread still in its step then is left behind (a thread cannot be
    /// killed): the engine turns failed with the returned reason, and it keeps what it holds
    /// (its memory, the device lock of its step) until the process restarts.
    fn stop_thread(&self) -> Result<(), String> {
        let Some(thread) = self.thread.lock().unwrap().take() else { return Ok(()) };
        self.shared.stopping.store(true, Ordering::Relaxed);
        // A full queue or a dead thread: the stopping flag alone ends the loop.
        let _ = self.jobs.lock().unwrap().try_send(worker::Job::Shutdown);
        match thread.exited.recv_timeout(self.options.stop_timeout) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let reason = format!(
                    "the engine of {} is stuck in a step and did not stop within {:.0} s; restart mlxbar (restart required) to free what it holds",
                    self.options.model_id,
                    self.options.stop_timeout.as_secs_f64()
                );
                tracing::error!("{reason}");
                self.shared.give_up(&reason);
                Err(reason)
            }
            // Exited (the sender went with the thread): the join returns at once.
            _ => {
                let _ = thread.handle.join();
                Ok(())
            }
        }
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
    /// A streamed model's expert cache figures; None when its experts are resident (or it
    /// has none).
    pub fn expert_view(&self) -> Option<experts::ExpertView> {
        self.shared.loaded.read().unwrap().as_ref().and_then(|l| l.experts.as_ref().map(|s| s.view()))
    }

    /// Load times of the expert reads since the last call (for the metrics' histogram).
    pub fn drain_expert_load_seconds(&self) -> Vec<f64> {
        self.shared.loaded.read().unwrap().as_ref().and_then(|l| l.experts.as_ref().map(|s| s.drain_load_seconds())).unwrap_or_default()
    }

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

    /// Stops the engine thread within one step (running requests get an error) and waits
    /// for it, at most `stop_timeout`: Err with the reason when it is stuck (the engine
    /// then stays failed; see [`Engine::stop_thread`]).
    pub fn shutdown(&self) -> Result<(), String> {
        let _one_at_a_time = self.lifecycle.lock().unwrap();
        if let Some(reason) = self.stuck() {
            return Err(reason);
        }
        self.stop_thread()?;
        *self.shared.state.write().unwrap() = LoadState::Stopped;
        self.shared.ready.notify_waiters();
        Ok(())
    }

    /// Why a restart is required, when a stop found the engine thread stuck (it still
    /// holds what it had).
    pub fn stuck(&self) -> Option<String> {
        self.shared.stuck.borrow().clone()
    }

    pub fn new_request(
        &self,
        prompt_ids: Vec<u32>,
        max_tokens: usize,
        sampling: SamplingParams,
        stop: Vec<String>,
    ) -> (GenerationRequest, Events) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let req = GenerationRequest {
            prompt_ids,
            max_tokens,
            sampling,
            stop,
            constraint: None,
            logprobs: None,
            special_tokens_as_text: false,
            draft: None,
            events: tx,
            enqueued_at: Instant::now(),
        };
        (req, Events::new(rx, self.shared.stuck.subscribe()))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// The engine thread and the channel that closes when it ends (its sender lives in the
/// thread), so a stop can wait for it with a deadline.
struct EngineThread {
    handle: std::thread::JoinHandle<()>,
    exited: mpsc::Receiver<()>,
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
        gate: options.admission_gate.clone(),
        request_memory_bytes: options.mlx_memory_limit.saturating_sub(info.weight_bytes),
        kv_bytes_per_token: per_token,
        attention_heads: model.config.num_heads.max(1) as usize,
        device_lock: options.device_lock.clone(),
        cache_idle: options.cache_idle,
    }
}

/// A new engine thread with its queue (capacity: `queue_capacity`).
fn spawn_thread(
    options: &EngineOptions,
    device: DeviceKind,
    shared: &Arc<Shared>,
) -> std::io::Result<(mpsc::SyncSender<worker::Job>, EngineThread)> {
    let (tx, rx) = mpsc::sync_channel(options.queue_capacity.max(1) + 1);
    let (exit_tx, exited) = mpsc::channel::<()>();
    let (shared, options) = (shared.clone(), options.clone());
    let handle = std::thread::Builder::new().name("mlxbar-engine".into()).spawn(move || {
        // Dropped when the thread ends, however it ends: that closes `exited`.
        let _exit = exit_tx;
        engine_thread(options, device, rx, shared)
    })?;
    Ok((tx, EngineThread { handle, exited }))
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
        #[cfg(feature = "test-hooks")]
        if faults::for_path(&options.model_path) == Some(faults::Fault::StallLoad) {
            faults::stall();
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &options.cluster {
            None => loader::load_reporting(&options.model_path, &options.model_id, format, options.expert_cache_bytes, &progress).map(
                |(model, codec, info)| {
                    let prefix = prefix_cache::PrefixCache::new(options.prefix_cache_bytes);
                    (executor::Executor::new(model, prefix, None), codec, info)
                },
            ),
            Some(member) => crate::distributed::join_and_load(
                &member.spec,
                &options.model_path,
                &options.model_id,
                format,
                member.budget,
                options.prefix_cache_bytes,
                &progress,
            )
            .map(|j| {
                let (exec, codec, info, _) = j.into_executor();
                (exec, codec, info)
            }),
        }))
    };
    let (exec, codec, info) = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::error!("model load failed: {e:#}");
            // A cluster that did not form (not one that cannot: another model, a refusal).
            if let Some(member) = options.cluster.as_ref().filter(|_| crate::distributed::rejoin::curable(&e)) {
                member.spec.rejoin(&format!("{e:#}"), false);
            }
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
    let model = &exec.model;
    let limits = limits(&options, model, &info);
    let started = Instant::now();
    let grammars = match Grammars::new(&codec, model.config.vocab_size.max(0) as usize) {
        Ok(g) => Arc::new(g),
        Err(e) => return set_state(LoadState::Failed(format!("building the token trie for constrained decoding: {e:#}"))),
    };
    tracing::debug!("token trie for constrained decoding built in {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    let codec = Arc::new(codec);
    let experts = model.expert_stats();
    let cluster = exec.cluster_stats();
    *shared.loaded.write().unwrap() = Some(Loaded { info, codec: codec.clone(), grammars, experts, cluster: cluster.clone() });
    progress(1.0);
    set_state(LoadState::Ready);
    if let Some(c) = &cluster {
        // A lost rank can leave this thread waiting in a collective for ever (MLX's ring
        // notices a dead peer in send and recv, not in every all_sum): its requests end
        // and the engine turns failed at once, whether or not the thread comes back.
        // After Ready, so a rank lost during the load's last steps is not overwritten.
        let shared = shared.clone();
        let spec = options.cluster.as_ref().map(|m| m.spec.clone());
        c.on_broken(Box::new(move |why| {
            shared.give_up(why);
            // --on-rank-lost rejoin: this process starts afresh to form the cluster again
            // (on a thread of its own: this one may be the engine's, stuck in a collective).
            if let Some(spec) = spec.clone().filter(|s| s.on_lost == crate::distributed::rejoin::OnRankLost::Rejoin) {
                let why = why.to_string();
                let _ = std::thread::Builder::new().name("mlxbar-rejoin".into()).spawn(move || spec.rejoin(&why, true));
            }
        }));
    }
    shared.stats.mark_progress();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker::run(exec, codec, jobs, shared.clone(), limits)));
    if shared.stopping.load(Ordering::Relaxed) {
        return;
    }
    // The loop ended without being asked to: whatever was queued or running is gone with
    // it (their clients see the stream end), and the engine reports itself failed.
    let reason = match ran {
        Ok(Some(why)) => why,
        Ok(None) => "the engine thread ended unexpectedly".to_string(),
        Err(panic) => format!("the engine thread died: {}", worker::panic_message(panic.as_ref())),
    };
    tracing::error!("{reason}; reload the model (POST /api/engine/reload, or the menu bar's Reload model)");
    shared.waiting.store(0, Ordering::Relaxed);
    shared.running.store(0, Ordering::Relaxed);
    set_state(LoadState::Failed(reason));
}
