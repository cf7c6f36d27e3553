//! The inference engine: model, tokenizer and chat template, sampling, KV cache and the
//! generation loop, on a thread of its own. [`Engine`] is the `Send + Sync` handle the
//! HTTP side uses: it renders and counts prompts, and queues requests with back-pressure.
pub mod chat_template;
#[cfg(target_os = "linux")]
pub mod gemv_forward;
pub mod kv_cache;
pub mod loader;
pub mod model;
pub mod request;
pub mod sampling;
pub mod text_stream;
pub mod tokenizer;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock, RwLock};
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

pub use loader::ModelInfo;
pub use model::WeightFormat;
pub use request::{Completion, Event, FinishReason, GenerationRequest, Timings};
pub use sampling::SamplingParams;
pub use tokenizer::TextCodec;

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub model_path: PathBuf,
    pub weight_format: WeightFormat,
    /// Requests that may wait for the engine; more get "queue full".
    pub queue_capacity: usize,
    /// Test hook: a prompt containing this string makes the engine panic on it.
    pub test_fail_marker: Option<String>,
}

/// Where the engine runs its arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", content = "detail", rename_all = "lowercase")]
pub enum LoadState {
    Loading,
    Ready,
    Failed(String),
    Stopped,
}

/// State shared between the engine thread and its handles.
pub struct Shared {
    state: RwLock<LoadState>,
    loaded: OnceLock<(ModelInfo, Arc<TextCodec>)>,
    /// Requests queued, not yet taken by the engine.
    pub waiting: AtomicUsize,
    /// Sequences being generated.
    pub running: AtomicUsize,
    /// Engine steps (prefills and decode steps) run since start.
    pub steps: std::sync::atomic::AtomicU64,
    /// Set by [`Engine::shutdown`]: running requests end at their next step.
    stopping: std::sync::atomic::AtomicBool,
    ready: tokio::sync::Notify,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error("the model is still loading")]
    Loading,
    #[error("the engine is not running: {0}")]
    Unavailable(String),
}

pub struct Engine {
    jobs: mpsc::SyncSender<worker::Job>,
    shared: Arc<Shared>,
    options: EngineOptions,
    device: DeviceKind,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread, which loads the model; [`Engine::wait_ready`] waits for it.
    pub fn start(options: EngineOptions) -> Result<Engine> {
        let (tx, rx) = mpsc::sync_channel(options.queue_capacity.max(1));
        let shared = Arc::new(Shared {
            state: RwLock::new(LoadState::Loading),
            loaded: OnceLock::new(),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            steps: Default::default(),
            stopping: Default::default(),
            ready: tokio::sync::Notify::new(),
        });
        let device = DeviceKind::for_this_platform();
        let thread = {
            let (shared, options) = (shared.clone(), options.clone());
            std::thread::Builder::new().name("mlxbar-engine".into()).spawn(move || engine_thread(options, device, rx, shared))?
        };
        Ok(Engine { jobs: tx, shared, options, device, thread: std::sync::Mutex::new(Some(thread)) })
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

    pub fn model(&self) -> Option<&ModelInfo> {
        self.shared.loaded.get().map(|(info, _)| info)
    }

    pub fn codec(&self) -> Option<Arc<TextCodec>> {
        self.shared.loaded.get().map(|(_, c)| c.clone())
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
        self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        self.jobs.try_send(worker::Job::Generate(req)).map_err(|e| {
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::TrySendError::Full(_) => SubmitError::QueueFull(self.waiting()),
                mpsc::TrySendError::Disconnected(_) => SubmitError::Unavailable("engine thread exited".into()),
            }
        })
    }

    /// Stops the engine thread within one step (running requests get an error) and waits for it.
    pub fn shutdown(&self) {
        let Some(thread) = self.thread.lock().unwrap().take() else { return };
        self.shared.stopping.store(true, Ordering::Relaxed);
        // Blocking send: waits for room if the queue is full.
        let _ = self.jobs.send(worker::Job::Shutdown);
        let _ = thread.join();
        *self.shared.state.write().unwrap() = LoadState::Stopped;
    }

    pub fn new_request(&self, prompt_ids: Vec<u32>, max_tokens: usize, sampling: SamplingParams, stop: Vec<String>) -> (GenerationRequest, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let req = GenerationRequest { prompt_ids, max_tokens, sampling, stop, events: tx, enqueued_at: Instant::now(), inject_panic: false };
        (req, rx)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn engine_thread(options: EngineOptions, device: DeviceKind, jobs: mpsc::Receiver<worker::Job>, shared: Arc<Shared>) {
    let set_state = |s: LoadState| {
        *shared.state.write().unwrap() = s;
        shared.ready.notify_waiters();
    };
    #[cfg(target_os = "linux")]
    gemv_forward::install();
    mlx_rs::Device::set_default(&match device {
        DeviceKind::Gpu => mlx_rs::Device::gpu(),
        DeviceKind::Cpu => mlx_rs::Device::cpu(),
    });
    let format = options.weight_format.resolve(device == DeviceKind::Gpu);
    tracing::info!("loading {} ({format:?} weights, {} device)", options.model_path.display(), device.as_str());
    let loaded = std::panic::catch_unwind(|| loader::load(&options.model_path, format));
    let (model, codec, info) = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::error!("model load failed: {e:#}");
            return set_state(LoadState::Failed(format!("{e:#}")));
        }
        Err(_) => return set_state(LoadState::Failed("model load panicked".into())),
    };
    tracing::info!(
        "model {} loaded in {:.1}s: {} layers, {} MB of {} weights",
        info.id,
        info.load_seconds,
        info.layers,
        info.weight_bytes / 1_000_000,
        info.dtype
    );
    let codec = Arc::new(codec);
    let _ = shared.loaded.set((info, codec.clone()));
    set_state(LoadState::Ready);
    worker::run(model, codec, jobs, shared.clone());
}
