//! The model registry: which engines are loaded, loading them on demand within the memory
//! budget and unloading them when idle, least recently used or asked to.
//!
//! [`Models`] owns every [`Engine`]. A request gets a [`Lease`] on the model it names
//! ([`Models::acquire`]): loaded, it is served at once; not loaded, it is loaded first (the
//! budget may unload idle models to make room, or refuse with the two figures); loading, the
//! request waits for it. Loads and unloads take one lock, so an unload always completes (and
//! MLX's cache is cleared) before a load starts, and two loads never run at once. A reaper
//! unloads models idle past their keep-alive. Pins and keep-alives set through the API are
//! saved in the data dir's state file and restored on start ([`crate::state_store`]).
pub mod budget;
pub mod experts;
pub mod keep_alive;
mod lease;
pub mod slot;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use budget::{Budget, Refusal, Resident, UnloadReason};
pub use keep_alive::KeepAlive;
pub use lease::Lease;
pub use slot::{ModelView, SlotState};
use slot::{Phase, Slot};

use crate::config::Config;
use crate::engine::stats::MaskSeconds;
use crate::engine::{AdmissionGate, ClusterMember, DeviceKind, DeviceLock, Engine, EngineOptions, LoadState, StatsView};
use crate::library::{Library, ModelEntry};
use crate::metrics::Metrics;
use crate::state_store::StateStore;
use crate::telemetry::Telemetry;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("The model '{0}' does not exist; GET /v1/models lists the models this server can run")]
    NotFound(String),
    #[error("{id} cannot run here: {reason}")]
    NotRunnable { id: String, reason: String },
    #[error("{message}")]
    Refused { refusal: Refusal, message: String },
    #[error("{reason}")]
    Failed { id: String, reason: String },
    #[error("{0} is still loading")]
    Loading(String),
    #[error("{0} is not loaded")]
    NotLoaded(String),
    #[error("{waiting} requests already wait for models to load")]
    QueueFull { waiting: usize },
    #[error("the server is shutting down")]
    Stopped,
    /// Another load, reload or unload holds the registry.
    #[error("{0}")]
    Busy(String),
}

/// How long a request naming an unknown model waits for the rescan that may find it.
pub const UNKNOWN_NAME_SCAN_WAIT: Duration = Duration::from_secs(5);

/// What a [`Models`] is built from besides the config.
pub struct Parts {
    pub library: Arc<Library>,
    /// The default model (`--model PATH`, else the cached default): always loadable, even
    /// if the library would not list it (its loader then says what is wrong).
    pub default: ModelEntry,
    pub telemetry: Arc<Telemetry>,
    pub metrics: Arc<Metrics>,
    pub gate: Option<AdmissionGate>,
}

/// Counters of engines already unloaded, so the process totals never go backwards.
#[derive(Default)]
struct Retired {
    stats: StatsView,
    steps: u64,
    batch_sizes: Vec<u64>,
}

pub struct Models {
    config: Arc<Config>,
    library: Arc<Library>,
    budget: Budget,
    default: ModelEntry,
    slots: Mutex<BTreeMap<String, Slot>>,
    pinned: Mutex<BTreeSet<String>>,
    /// Keep-alives set through the API, by id: each model's own instead of the config's.
    keep_alive: Mutex<BTreeMap<String, KeepAlive>>,
    /// Where pins and keep-alives set through the API are saved.
    state: Arc<StateStore>,
    /// The last refused load's reason, by id, until a load succeeds.
    refused: Mutex<BTreeMap<String, String>>,
    /// Held by every load and unload; each of them is bounded (`load_timeout_seconds`,
    /// `engine_stop_seconds`, `shutdown_grace_seconds`), so it is always released.
    lifecycle: Arc<tokio::sync::Mutex<()>>,
    /// Engines whose thread did not stop (stuck in a step or a load): kept, never joined,
    /// so nothing waits on them; they hold their memory until the process restarts.
    abandoned: Mutex<Vec<(String, Arc<Engine>, String)>>,
    /// Requests waiting for a model to load (bounded by `queue_capacity`).
    waiting_for_load: AtomicUsize,
    /// Woken on every state change (for `wait_ready` and the live views).
    changed: tokio::sync::Notify,
    telemetry: Arc<Telemetry>,
    metrics: Arc<Metrics>,
    gate: Option<AdmissionGate>,
    mask_seconds: MaskSeconds,
    device: DeviceKind,
    retired: Mutex<Retired>,
    stopping: AtomicBool,
    runtime: tokio::runtime::Handle,
    /// When an unknown name last made the library rescan.
    rescanned: Mutex<Option<Instant>>,
    /// Numbers slots, so a lease on an engine since replaced is told apart.
    generations: std::sync::atomic::AtomicU64,
    /// The default model's first load has not ended yet (`/health`: loading).
    default_pending: AtomicBool,
    device_lock: DeviceLock,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Models {
    /// Why this rank 0 restarted to form its cluster again, while it has not formed yet
    /// (`--on-rank-lost rejoin`): the ranks it waits for, and why.
    pub fn cluster_rejoining(&self) -> Option<(usize, String)> {
        let spec = self.config.cluster.as_ref()?;
        let why = spec.rejoining.as_ref()?;
        // Still loading: a restarted rank 0 that failed for good (a refusal) waits no more.
        let waiting = matches!(self.default_state(), LoadState::Loading);
        waiting.then(|| (spec.size(), format!("waiting for every rank to join the cluster again after: {why}")))
    }

    /// Sets MLX's limits, restores the saved pins and keep-alives (of models that still
    /// exist) and starts the reaper; loads nothing yet (see [`Models::load`]). Call from
    /// within a tokio runtime.
    pub fn new(config: Arc<Config>, parts: Parts) -> Arc<Models> {
        let state = StateStore::open(&config.data_dir());
        let (pinned, keep_alive) = restore(&state, &config, &parts);
        let total =
            parts.telemetry.latest().memory.as_ref().map(|m| m.total).or_else(|| crate::telemetry::memory::read().ok().map(|m| m.total));
        let budget = Budget::install(&config, total.unwrap_or(0), Some(&parts.default));
        let mask_seconds = MaskSeconds::default();
        parts.metrics.register_engine_histogram(mask_seconds.0.clone());
        let models = Arc::new(Models {
            budget,
            library: parts.library,
            default: parts.default,
            slots: Mutex::default(),
            pinned: Mutex::new(pinned),
            keep_alive: Mutex::new(keep_alive),
            state,
            refused: Mutex::default(),
            lifecycle: Arc::new(tokio::sync::Mutex::new(())),
            abandoned: Mutex::default(),
            waiting_for_load: AtomicUsize::new(0),
            changed: tokio::sync::Notify::new(),
            telemetry: parts.telemetry,
            metrics: parts.metrics,
            gate: parts.gate,
            mask_seconds,
            device: DeviceKind::for_this_platform(),
            retired: Mutex::default(),
            stopping: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
            rescanned: Mutex::new(None),
            generations: Default::default(),
            default_pending: AtomicBool::new(true),
            device_lock: Default::default(),
            config,
        });
        models.spawn_reaper();
        models
    }

    pub fn default_id(&self) -> &str {
        &self.default.id
    }

    pub fn device(&self) -> DeviceKind {
        self.device
    }

    pub fn library(&self) -> &Arc<Library> {
        &self.library
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// What survives a restart (the alerts save their snoozes here too).
    pub fn state_store(&self) -> &Arc<StateStore> {
        &self.state
    }

    /// `id`'s keep-alive when a request names none: the one set through the API, else the config's.
    fn keep_alive_of(&self, id: &str) -> KeepAlive {
        lock(&self.keep_alive).get(id).copied().unwrap_or(self.config.keep_alive)
    }

    /// The id a request's `model` names: absent or "default" is the default model, then
    /// the config's aliases, then library ids (as last scanned: see [`Models::find`]).
    pub fn resolve(&self, requested: Option<&str>) -> Result<String, ModelError> {
        let name = match requested.map(str::trim) {
            None | Some("") | Some("default") => return Ok(self.default.id.clone()),
            Some(n) => n,
        };
        let name = self.config.aliases.get(name).map(String::as_str).unwrap_or(name);
        if name == self.default.id || lock(&self.slots).contains_key(name) || self.library.get(name).is_some() {
            return Ok(name.to_string());
        }
        Err(ModelError::NotFound(name.to_string()))
    }

    /// [`Models::resolve`], and for a name not found, a rescan first: a model copied into
    /// a models folder a moment ago is found even if the watcher has not caught up. The
    /// scan runs on the library's thread (never on this runtime), shared by every request
    /// that asks meanwhile; at most one is asked for a second (later unknown names wait for
    /// the one running), and none is waited on longer than [`UNKNOWN_NAME_SCAN_WAIT`].
    pub async fn find(&self, requested: Option<&str>) -> Result<String, ModelError> {
        match self.resolve(requested) {
            Err(ModelError::NotFound(_)) => {}
            found => return found,
        }
        let due = {
            let mut last = lock(&self.rescanned);
            let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            self.library.refresh_async(UNKNOWN_NAME_SCAN_WAIT).await;
        } else {
            self.library.settled(UNKNOWN_NAME_SCAN_WAIT).await;
        }
        self.resolve(requested)
    }

    fn entry(&self, id: &str) -> Result<ModelEntry, ModelError> {
        if id == self.default.id {
            return Ok(self.default.clone());
        }
        self.library.get(id).ok_or_else(|| ModelError::NotFound(id.to_string()))
    }

    /// A lease on the model `requested` names, loading it first if need be.
    pub async fn acquire(self: &Arc<Self>, requested: Option<&str>, keep_alive: Option<KeepAlive>) -> Result<Lease, ModelError> {
        let id = self.find(requested).await?;
        loop {
            if let Some(lease) = self.try_lease(&id, keep_alive)? {
                return Ok(lease);
            }
            let capacity = self.config.queue_capacity.max(1);
            self.waiting_for_load
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| (w < capacity).then_some(w + 1))
                .map_err(|waiting| ModelError::QueueFull { waiting })?;
            // Counted until this future ends, however it ends (a client leaving drops it).
            let _waiting = scopeguard(|| {
                self.waiting_for_load.fetch_sub(1, Ordering::AcqRel);
            });
            self.load_queued(&id).await?;
        }
    }

    /// A lease if `id` is ready; None if it must be loaded (or waited for); an error if
    /// its engine failed (reload it to go on).
    fn try_lease(self: &Arc<Self>, id: &str, keep_alive: Option<KeepAlive>) -> Result<Option<Lease>, ModelError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(ModelError::Stopped);
        }
        let mut slots = lock(&self.slots);
        let Some(slot) = slots.get_mut(id) else { return Ok(None) };
        match &slot.phase {
            Phase::Ready(engine) => match engine.state() {
                LoadState::Ready => {}
                LoadState::Failed(reason) => return Err(ModelError::Failed { id: id.into(), reason }),
                LoadState::Loading => return Ok(None),
                LoadState::Stopped => return Err(ModelError::Stopped),
            },
            Phase::Failed { reason, .. } => return Err(ModelError::Failed { id: id.into(), reason: reason.clone() }),
            Phase::Loading(_) | Phase::Unloading => return Ok(None),
        }
        let engine = slot.engine().cloned().expect("ready");
        slot.active += 1;
        slot.touch();
        Ok(Some(Lease::new(self.clone(), id.to_string(), slot.generation, engine, keep_alive)))
    }

    /// A lease ended: the model was used now; with keep-alive 0 it unloads once idle.
    fn release(self: &Arc<Self>, id: &str, generation: u64, keep_alive: Option<KeepAlive>) {
        let unload_now = {
            let mut slots = lock(&self.slots);
            // A lease on an engine since unloaded or reloaded is not the new one's.
            let Some(slot) = slots.get_mut(id).filter(|s| s.generation == generation) else { return };
            slot.active = slot.active.saturating_sub(1);
            slot.touch();
            // As Ollama does: each request's keep-alive, else the model's (API) or the configured one.
            slot.keep_alive = keep_alive.unwrap_or_else(|| self.keep_alive_of(id));
            slot.active == 0 && slot.keep_alive.is_zero()
        };
        if unload_now {
            let (models, id) = (self.clone(), id.to_string());
            self.runtime.spawn(async move {
                if let Err(e) = models.unload_as(&id, UnloadReason::Idle).await {
                    tracing::debug!("unloading {id} after its answer: {e}");
                }
            });
        }
    }

    /// Loads `id` (an id or alias) unless it is loaded; waits while another load runs.
    /// A failed model is loaded afresh.
    pub async fn load(self: &Arc<Self>, requested: &str) -> Result<(), ModelError> {
        let id = self.find(Some(requested)).await?;
        let models = self.clone();
        self.detached(async move { models.load_now(id).await }).await
    }

    /// Runs lifecycle work as a task of its own: a caller that goes away (a client
    /// disconnecting) does not stop a load or an unload halfway.
    async fn detached(&self, work: impl std::future::Future<Output = Result<(), ModelError>> + Send + 'static) -> Result<(), ModelError> {
        self.runtime.spawn(work).await.unwrap_or(Err(ModelError::Stopped))
    }

    async fn load_now(self: Arc<Self>, id: String) -> Result<(), ModelError> {
        let _one = self.lifecycle.lock().await;
        let failed = {
            let slots = lock(&self.slots);
            match slots.get(&id).map(|s| &s.phase) {
                Some(Phase::Ready(e)) => !matches!(e.state(), LoadState::Ready),
                Some(Phase::Failed { .. }) => true,
                _ => false,
            }
        };
        if failed {
            // MLX keeps the ring of a process's first join: a cluster's model cannot load again.
            self.clustered(&id, "loaded again")?;
            self.unload_locked(&id, UnloadReason::Request, false).await;
        }
        self.load_locked(&id).await
    }

    /// Stops `id`'s engine if it runs (its requests end with a 503: the way out of a stall)
    /// and loads it afresh. Refused at once (Busy) while another load, reload or unload
    /// runs; the reload itself then goes on even if the caller leaves.
    pub fn start_reload(self: &Arc<Self>, requested: &str) -> Result<tokio::task::JoinHandle<Result<(), ModelError>>, ModelError> {
        let id = self.resolve(Some(requested))?;
        self.clustered(&id, "reloaded")?;
        let one = self.lifecycle.clone().try_lock_owned().map_err(|_| {
            ModelError::Busy(format!("Cannot reload {id} now: a model load, reload or unload is under way; retry when it ends"))
        })?;
        let models = self.clone();
        Ok(self.runtime.spawn(async move {
            let _one = one;
            models.unload_locked(&id, UnloadReason::Request, false).await;
            // An engine stuck in its step is left behind with the slot failed: the reload
            // is the way on, so it starts a fresh engine all the same.
            models.forget_failed(&id);
            models.load_locked(&id).await
        }))
    }

    /// Refuses to let the model a cluster serves go: the other ranks exit when it stops,
    /// and only a restart of every rank brings them back.
    fn clustered(&self, id: &str, what: &str) -> Result<(), ModelError> {
        match &self.config.cluster {
            Some(spec) if id == self.default.id => Err(ModelError::Busy(format!(
                "{id} is served by a cluster of {} ranks and cannot be {what}: restart the cluster (every rank) to change it",
                spec.size()
            ))),
            _ => Ok(()),
        }
    }

    /// Drops `id`'s slot when it is failed, so that a load starts afresh.
    fn forget_failed(&self, id: &str) {
        let mut slots = lock(&self.slots);
        if matches!(slots.get(id).map(|s| &s.phase), Some(Phase::Failed { .. })) {
            slots.remove(id);
        }
    }

    /// [`Models::start_reload`], waiting for the reload's end.
    pub async fn reload(self: &Arc<Self>, requested: &str) -> Result<(), ModelError> {
        self.start_reload(requested)?.await.unwrap_or(Err(ModelError::Stopped))
    }

    /// Why a restart is required, if an engine had to be left behind (stuck in a step or a
    /// load, holding its memory).
    pub fn restart_required(&self) -> Option<String> {
        lock(&self.abandoned).last().map(|(_, _, reason)| reason.clone())
    }

    /// Gives up on `engine`, whose thread did not stop: keeps it (dropping it would wait on
    /// the thread), frees the device for the others, and marks `id` failed with `reason`.
    fn abandon(&self, id: &str, engine: Arc<Engine>, reason: String) {
        tracing::error!("{reason}");
        self.device_lock.abandon();
        lock(&self.abandoned).push((id.to_string(), engine, reason.clone()));
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        lock(&self.slots).insert(id.into(), Slot::new(Phase::Failed { reason }, self.keep_alive_of(id), generation));
        if id == self.default.id {
            self.default_pending.store(false, Ordering::Relaxed);
        }
        self.changed.notify_waiters();
    }

    /// Stops `engine` on a blocking thread (bounded by `engine_stop_seconds`): Err with the
    /// reason when its thread is stuck.
    async fn stop_engine(engine: &Arc<Engine>) -> Result<(), String> {
        let stopping = engine.clone();
        tokio::task::spawn_blocking(move || stopping.shutdown()).await.unwrap_or_else(|e| Err(format!("stopping the engine: {e}")))
    }

    /// A request's load: behind any load or unload under way. A failed model's reason is
    /// the answer (requests do not each retry a broken model; `load` does).
    async fn load_queued(self: &Arc<Self>, id: &str) -> Result<(), ModelError> {
        let (models, id) = (self.clone(), id.to_string());
        self.detached(async move {
            let _one = models.lifecycle.lock().await;
            models.load_locked(&id).await
        })
        .await
    }

    async fn load_locked(self: &Arc<Self>, id: &str) -> Result<(), ModelError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(ModelError::Stopped);
        }
        if let Some(slot) = lock(&self.slots).get(id) {
            match &slot.phase {
                Phase::Ready(_) => return Ok(()),
                Phase::Failed { reason, .. } => return Err(ModelError::Failed { id: id.into(), reason: reason.clone() }),
                Phase::Loading(_) | Phase::Unloading => {}
            }
        }
        let entry = self.entry(id)?;
        let is_default = id == self.default.id;
        if !entry.runnable && !is_default {
            let reason = entry.unsupported_reason.clone().unwrap_or_else(|| "not a model mlxbar can run".into());
            return Err(ModelError::NotRunnable { id: id.into(), reason });
        }
        let on_gpu = self.device == DeviceKind::Gpu;
        let format = self.config.weight_format.resolve(on_gpu, entry.quantization_spec());
        let residents = self.residents();
        let available = self.telemetry.latest().memory.as_ref().map(|m| m.available).unwrap_or(u64::MAX / 4);
        let ask = experts::Ask {
            format,
            on_gpu,
            available,
            residents: &residents,
            pressure_critical: self.telemetry.pressure_critical(),
            cap: self.config.expert_cache_bytes,
            ranks: match &self.config.cluster {
                Some(spec) if id == self.default.id => spec.size(),
                _ => 1,
            },
        };
        let (plan, expert_cache) = match experts::plan(&self.budget, &entry, &ask) {
            Ok(p) => (p.plan, p.expert_cache),
            Err((refusal, note)) => {
                let mut message = refusal.message(id, self.budget.max_loaded);
                if let Some(note) = note {
                    message = format!("{message}, {note}");
                }
                tracing::warn!("{message}");
                self.metrics.model_loads_total.with_label_values(&[id, "refused"]).inc();
                lock(&self.refused).insert(id.into(), message.clone());
                if id == self.default.id {
                    self.default_pending.store(false, Ordering::Relaxed);
                }
                self.changed.notify_waiters();
                return Err(ModelError::Refused { refusal, message });
            }
        };
        for (victim, reason) in &plan.unload {
            tracing::info!("unloading {victim} ({}) to load {id}", reason.as_str());
            self.unload_locked(victim, *reason, true).await;
        }
        if let Some(bytes) = expert_cache {
            tracing::info!("{id}: its experts stream from disk through a {} cache", budget::human(bytes));
        }
        self.resize_mlx_cache(Some(&entry));
        let options = EngineOptions {
            model_path: entry.path.clone(),
            model_id: id.to_string(),
            weight_format: self.config.weight_format,
            expert_cache_bytes: expert_cache,
            queue_capacity: self.config.queue_capacity,
            max_batch: self.config.max_batch,
            kv_budget_tokens: self.config.kv_budget_tokens,
            kv_budget_bytes: plan.kv_bytes as usize,
            mlx_memory_limit: self.budget.mlx_memory_limit as usize,
            prefix_cache_bytes: self.budget.prefix_cache_bytes(&entry, on_gpu) as usize,
            cache_idle: Duration::from_secs_f64(self.config.mlx_cache_idle_seconds),
            admission_gate: self.gate.clone(),
            mask_seconds: self.mask_seconds.clone(),
            device_lock: self.device_lock.clone(),
            stop_timeout: Duration::from_secs_f64(self.config.engine_stop_seconds),
            // The cluster serves the default model; others load on this process alone.
            cluster: match &self.config.cluster {
                Some(spec) if id == self.default.id => Some(ClusterMember { spec: spec.clone(), budget: self.budget.ceiling }),
                _ => None,
            },
        };
        let engine = match Engine::start(options) {
            Ok(e) => Arc::new(e),
            Err(e) => return Err(self.failed(id, format!("starting the engine: {e:#}"))),
        };
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        lock(&self.slots).insert(id.into(), Slot::new(Phase::Loading(engine.clone()), self.keep_alive_of(id), generation));
        self.changed.notify_waiters();
        let started = Instant::now();
        let timeout = Duration::from_secs_f64(self.config.load_timeout_seconds);
        let Ok(ready) = tokio::time::timeout(timeout, engine.wait_ready()).await else {
            let reason = format!(
                "loading {id} did not finish within {} s (load_timeout_seconds); its thread is left behind: restart mlxbar (restart required) to free what it holds",
                self.config.load_timeout_seconds
            );
            // Asks the thread to stop should the load ever end; bounded either way.
            let _ = Self::stop_engine(&engine).await;
            self.metrics.model_loads_total.with_label_values(&[id, "failed"]).inc();
            self.abandon(id, engine, reason.clone());
            return Err(ModelError::Failed { id: id.into(), reason });
        };
        self.metrics.model_load_seconds.observe(started.elapsed().as_secs_f64());
        match ready {
            Ok(()) => {
                let weights = engine.model().map_or_else(|| self.budget.need(&entry, format, on_gpu).weights, |m| m.weight_bytes as u64);
                let memory = weights + plan.kv_bytes + expert_cache.unwrap_or(0);
                if let Some(slot) = lock(&self.slots).get_mut(id) {
                    slot.phase = Phase::Ready(engine);
                    slot.memory_bytes = memory;
                    slot.kv_bytes = plan.kv_bytes;
                    slot.touch();
                }
                lock(&self.refused).remove(id);
                if id == self.default.id {
                    self.default_pending.store(false, Ordering::Relaxed);
                }
                self.metrics.model_loads_total.with_label_values(&[id, "ok"]).inc();
                self.metrics.model_memory_bytes.with_label_values(&[id]).set(memory as i64);
                self.changed.notify_waiters();
                Ok(())
            }
            Err(e) => {
                // The engine thread has ended; dropping the handle joins it.
                Err(self.failed(id, format!("{e:#}")))
            }
        }
    }

    fn failed(&self, id: &str, reason: String) -> ModelError {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        lock(&self.slots).insert(id.into(), Slot::new(Phase::Failed { reason: reason.clone() }, self.keep_alive_of(id), generation));
        if id == self.default.id {
            self.default_pending.store(false, Ordering::Relaxed);
        }
        self.metrics.model_loads_total.with_label_values(&[id, "failed"]).inc();
        self.changed.notify_waiters();
        ModelError::Failed { id: id.into(), reason }
    }

    fn residents(&self) -> Vec<Resident> {
        let pinned = lock(&self.pinned);
        lock(&self.slots)
            .iter()
            .filter(|(_, s)| s.engine().is_some())
            .map(|(id, s)| Resident {
                id: id.clone(),
                bytes: s.memory_bytes,
                unused: s.engine().map_or(0, |e| s.kv_bytes.saturating_sub(e.stats().kv_bytes)),
                evictable: s.idle() && !pinned.contains(id),
                last_used: s.last_used,
            })
            .collect()
    }

    /// Unloads `id` (an id or alias): its running requests finish first (up to
    /// `shutdown_grace_seconds`), then the engine stops and MLX's cache is cleared.
    pub async fn unload(self: &Arc<Self>, requested: &str) -> Result<(), ModelError> {
        let id = self.resolve(Some(requested))?;
        self.clustered(&id, "unloaded")?;
        let models = self.clone();
        self.detached(async move { models.unload_as(&id, UnloadReason::Request).await }).await
    }

    async fn unload_as(self: &Arc<Self>, id: &str, reason: UnloadReason) -> Result<(), ModelError> {
        let _one = self.lifecycle.lock().await;
        let still_wanted = {
            let slots = lock(&self.slots);
            match slots.get(id) {
                None => return Err(ModelError::NotLoaded(id.into())),
                // The reaper's and keep-alive 0's unloads give way to a request that came.
                Some(s) => reason != UnloadReason::Request && !s.idle() && s.engine().is_some(),
            }
        };
        if still_wanted {
            return Ok(());
        }
        self.unload_locked(id, reason, true).await;
        Ok(())
    }

    /// The unload itself (after its requests finish, if `drain`); the caller holds
    /// `lifecycle`.
    async fn unload_locked(&self, id: &str, reason: UnloadReason, drain: bool) {
        let engine = {
            let mut slots = lock(&self.slots);
            let Some(slot) = slots.get_mut(id) else { return };
            match std::mem::replace(&mut slot.phase, Phase::Unloading) {
                Phase::Ready(e) | Phase::Loading(e) => Some(e),
                Phase::Failed { .. } | Phase::Unloading => None,
            }
        };
        self.changed.notify_waiters();
        if let Some(engine) = engine {
            let deadline = Instant::now() + Duration::from_secs_f64(self.config.shutdown_grace_seconds);
            while drain && Instant::now() < deadline && (engine.running() + engine.waiting() > 0 || self.active(id) > 0) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            {
                let mut retired = lock(&self.retired);
                let (stats, batches) = (engine.stats(), engine.decode_steps_by_batch_size());
                retired.stats = retired.stats.plus(&stats);
                retired.steps += engine.steps();
                add_counts(&mut retired.batch_sizes, &batches);
            }
            if let Err(stuck) = Self::stop_engine(&engine).await {
                self.abandon(id, engine, stuck);
                self.metrics.model_unloads_total.with_label_values(&[id, reason.as_str()]).inc();
                return;
            }
            let device_lock = self.device_lock.clone();
            let _ = tokio::task::spawn_blocking(move || {
                // The model's buffers went back to MLX's cache with the engine thread; give
                // them back to the system before anything else loads.
                let _device = device_lock.lock();
                crate::telemetry::mlx_memory::release(crate::telemetry::mlx_memory::ClearReason::Unload);
            })
            .await;
            self.metrics.model_unloads_total.with_label_values(&[id, reason.as_str()]).inc();
            tracing::info!("unloaded {id} ({})", reason.as_str());
        }
        lock(&self.slots).remove(id);
        self.resize_mlx_cache(None);
        self.metrics.model_loaded.with_label_values(&[id]).set(0);
        self.metrics.model_memory_bytes.with_label_values(&[id]).set(0);
        self.metrics.model_weight_bytes.with_label_values(&[id]).set(0);
        self.metrics.model_kv_bytes.with_label_values(&[id]).set(0);
        self.metrics.model_prefix_cache_bytes.with_label_values(&[id]).set(0);
        self.changed.notify_waiters();
    }

    /// Sizes MLX's cache for the models loaded (and `loading`): see [`Budget::cache_limit`].
    fn resize_mlx_cache(&self, loading: Option<&ModelEntry>) {
        let ids: Vec<String> = lock(&self.slots)
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Ready(_) | Phase::Loading(_)))
            .map(|(id, _)| id.clone())
            .collect();
        let mut entries: Vec<ModelEntry> = ids.iter().filter_map(|id| self.entry(id).ok()).collect();
        entries.extend(loading.cloned());
        self.budget.apply_cache_limit(self.budget.cache_limit(entries.iter()));
    }

    fn active(&self, id: &str) -> usize {
        lock(&self.slots).get(id).map_or(0, |s| s.active)
    }

    /// Pins `id` (kept loaded through idle time and LRU) or unpins it; saved.
    pub fn set_pinned(&self, requested: &str, pinned: bool) -> Result<(), ModelError> {
        let id = self.resolve(Some(requested))?;
        if !pinned {
            self.clustered(&id, "unpinned")?;
        }
        {
            let mut set = lock(&self.pinned);
            if pinned {
                set.insert(id.clone());
            } else {
                set.remove(&id);
            }
        }
        self.state.update(|p| {
            p.pins.insert(id, pinned);
        });
        self.changed.notify_waiters();
        Ok(())
    }

    /// Sets how long the loaded `id` stays loaded once idle: its keep-alive from now on
    /// (saved) when a request names none.
    pub fn set_keep_alive(&self, requested: &str, keep_alive: KeepAlive) -> Result<(), ModelError> {
        let id = self.resolve(Some(requested))?;
        match lock(&self.slots).get_mut(&id) {
            Some(slot) => slot.keep_alive = keep_alive,
            None => return Err(ModelError::NotLoaded(id)),
        }
        lock(&self.keep_alive).insert(id.clone(), keep_alive);
        self.state.update(|p| {
            p.keep_alive.insert(id, keep_alive);
        });
        Ok(())
    }

    /// Every 1 s: unloads models idle past their keep-alive (pinned ones stay).
    fn spawn_reaper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let Some(models) = weak.upgrade() else { return };
                if models.stopping.load(Ordering::Relaxed) {
                    return;
                }
                for id in models.expired() {
                    let _ = models.unload_as(&id, UnloadReason::Idle).await;
                }
            }
        });
    }

    fn expired(&self) -> Vec<String> {
        let pinned = lock(&self.pinned);
        lock(&self.slots)
            .iter()
            .filter(|(id, s)| !pinned.contains(*id) && s.idle())
            .filter(|(_, s)| matches!(s.keep_alive, KeepAlive::For(d) if s.last_used.elapsed() >= d))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Waits until the default model has loaded (Ok) or failed (Err).
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let refused = lock(&self.refused).get(&self.default.id).cloned();
            match self.slot_state(&self.default.id) {
                (SlotState::Loaded, _) => return Ok(()),
                (SlotState::Failed, reason) => anyhow::bail!("{}", reason.unwrap_or_default()),
                _ if self.stopping.load(Ordering::Relaxed) => anyhow::bail!("the server is shutting down"),
                (SlotState::Unloaded, _) if !self.default_pending.load(Ordering::Relaxed) => {
                    anyhow::bail!("{}", refused.unwrap_or_else(|| "the default model is not loaded".into()))
                }
                _ => notified.await,
            }
        }
    }

    /// `id`'s state, with the failure reason when failed.
    pub fn slot_state(&self, id: &str) -> (SlotState, Option<String>) {
        match lock(&self.slots).get(id).map(|s| &s.phase) {
            None => (SlotState::Unloaded, None),
            Some(Phase::Loading(_)) => (SlotState::Loading, None),
            Some(Phase::Unloading) => (SlotState::Unloading, None),
            Some(Phase::Failed { reason, .. }) => (SlotState::Failed, Some(reason.clone())),
            Some(Phase::Ready(e)) => match e.state() {
                LoadState::Ready => (SlotState::Loaded, None),
                LoadState::Loading => (SlotState::Loading, None),
                LoadState::Failed(r) => (SlotState::Failed, Some(r)),
                LoadState::Stopped => (SlotState::Unloading, None),
            },
        }
    }

    /// The default model's engine state, as `/health` and the menu bar's icon read it
    /// (unloaded after idle time counts as ready: a request loads it).
    pub fn default_state(&self) -> LoadState {
        match self.slot_state(&self.default.id) {
            (SlotState::Loading, _) => LoadState::Loading,
            (SlotState::Unloaded, _) if self.default_pending.load(Ordering::Relaxed) => LoadState::Loading,
            (SlotState::Failed, reason) => LoadState::Failed(reason.unwrap_or_default()),
            _ if self.stopping.load(Ordering::Relaxed) => LoadState::Stopped,
            _ => LoadState::Ready,
        }
    }

    /// The engines loaded now, by id.
    pub fn engines(&self) -> Vec<(String, Arc<Engine>)> {
        lock(&self.slots)
            .iter()
            .filter_map(|(id, s)| match &s.phase {
                Phase::Ready(e) | Phase::Loading(e) => Some((id.clone(), e.clone())),
                _ => None,
            })
            .collect()
    }

    /// The engine serving `id`, if loaded.
    pub fn engine(&self, id: &str) -> Option<Arc<Engine>> {
        lock(&self.slots).get(id).and_then(|s| s.engine().cloned())
    }

    pub fn waiting(&self) -> usize {
        self.waiting_for_load.load(Ordering::Relaxed) + self.engines().iter().map(|(_, e)| e.waiting()).sum::<usize>()
    }

    pub fn running(&self) -> usize {
        self.engines().iter().map(|(_, e)| e.running()).sum()
    }

    /// The longest any engine has gone without progress while it has work.
    pub fn stall_seconds(&self) -> f64 {
        self.engines().iter().map(|(_, e)| e.stall_seconds()).fold(0.0, f64::max)
    }

    /// Engine steps since start, over every engine that ran.
    pub fn steps(&self) -> u64 {
        lock(&self.retired).steps + self.engines().iter().map(|(_, e)| e.steps()).sum::<u64>()
    }

    /// Cache, batch and admission figures summed over the loaded engines (counters include
    /// the unloaded ones).
    pub fn stats(&self) -> StatsView {
        let retired = lock(&self.retired).stats;
        let mut total = StatsView {
            kv_tokens: 0,
            kv_bytes: 0,
            kv_budget_tokens: 0,
            kv_reserved_tokens: 0,
            prefix_entries: 0,
            prefix_bytes: 0,
            prefix_budget_bytes: 0,
            admission_blocked: false,
            max_batch: 0,
            ..retired
        };
        for (_, e) in self.engines() {
            total = total.plus(&e.stats());
        }
        total
    }

    pub fn decode_steps_by_batch_size(&self) -> Vec<u64> {
        let mut counts = lock(&self.retired).batch_sizes.clone();
        for (_, e) in self.engines() {
            add_counts(&mut counts, &e.decode_steps_by_batch_size());
        }
        counts
    }

    /// Bumps when models appear or go, loads start or end.
    pub fn library_generation(&self) -> u64 {
        self.library.generation()
    }

    /// Every model: the library's and the loaded ones, loaded first, then by id.
    pub fn list(&self) -> Vec<ModelView> {
        let mut entries: BTreeMap<String, ModelEntry> = self.library.entries().into_iter().map(|e| (e.id.clone(), e)).collect();
        entries.insert(self.default.id.clone(), self.default.clone());
        let mut views: Vec<ModelView> = entries.into_values().map(|e| self.view_of(e)).collect();
        views.sort_by_key(|v| (v.state == SlotState::Unloaded, !v.default, v.entry.id.clone()));
        views
    }

    /// The models that are not unloaded (loaded, loading, unloading, failed).
    pub fn active_views(&self) -> Vec<ModelView> {
        let ids: Vec<String> = lock(&self.slots).keys().cloned().collect();
        let mut views: Vec<ModelView> = ids.into_iter().filter_map(|id| self.entry(&id).ok()).map(|e| self.view_of(e)).collect();
        views.sort_by_key(|v| !v.default);
        views
    }

    /// Expert reads timed since the last call, by loaded model (for the metrics' histogram).
    pub fn drain_expert_loads(&self, id: &str) -> Vec<f64> {
        match lock(&self.slots).get(id).map(|s| &s.phase) {
            Some(Phase::Ready(e)) => e.drain_expert_load_seconds(),
            _ => vec![],
        }
    }

    pub fn view(&self, requested: &str) -> Result<ModelView, ModelError> {
        let id = self.resolve(Some(requested))?;
        Ok(self.view_of(self.entry(&id)?))
    }

    fn view_of(&self, entry: ModelEntry) -> ModelView {
        let id = entry.id.clone();
        let (state, failure) = self.slot_state(&id);
        let on_gpu = self.device == DeviceKind::Gpu;
        let need = entry
            .shape
            .is_some()
            .then(|| self.budget.need(&entry, self.config.weight_format.resolve(on_gpu, entry.quantization_spec()), on_gpu).least());
        // Lock order everywhere: pinned, refused, then slots.
        let pinned = lock(&self.pinned).contains(&id);
        let keep_alive = self.keep_alive_of(&id);
        let refused = lock(&self.refused).get(&id).cloned();
        let slots = lock(&self.slots);
        let slot = slots.get(&id);
        let engine = slot.and_then(|s| match &s.phase {
            Phase::Ready(e) | Phase::Loading(e) => Some(e.clone()),
            _ => None,
        });
        let loaded = state == SlotState::Loaded;
        let stats = engine.as_ref().filter(|_| loaded).map(|e| e.stats());
        ModelView {
            state,
            progress: (state == SlotState::Loading).then(|| engine.as_ref().map_or(0.0, |e| e.load_progress())),
            error: failure.or(refused),
            memory_bytes: loaded.then(|| slot.map_or(0, |s| s.memory_bytes)),
            kv_bytes: stats.map(|s| s.kv_bytes),
            prefix_cache_bytes: stats.map(|s| s.prefix_bytes),
            prefix_cache_limit_bytes: stats.map(|s| s.prefix_budget_bytes),
            estimate_bytes: need,
            idle_seconds: slot.filter(|s| loaded && s.idle()).map(|s| s.last_used.elapsed().as_secs_f64()),
            last_used_unix: slot.map(|s| s.last_used_unix),
            keep_alive_seconds: match slot.map_or(keep_alive, |s| s.keep_alive) {
                KeepAlive::For(d) => Some(d.as_secs_f64()),
                KeepAlive::Forever => None,
            },
            requests: engine.as_ref().map_or(0, |e| e.running() + e.waiting()),
            pinned,
            default: id == self.default.id,
            experts: engine.as_ref().filter(|_| loaded).and_then(|e| e.expert_view()),
            info: engine.and_then(|e| e.model()),
            entry,
        }
    }

    /// Stops every engine (their requests end with a 503), all at once, so the whole stop
    /// takes at most `engine_stop_seconds` however many are stuck; the registry then
    /// refuses work.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let engines = self.engines();
        std::thread::scope(|scope| {
            for (id, engine) in &engines {
                scope.spawn(move || {
                    if let Err(stuck) = engine.shutdown() {
                        tracing::error!("{id}: {stuck}");
                    }
                });
            }
        });
        self.changed.notify_waiters();
    }
}

/// The pins (the config's, then the saved ones over them) and the saved keep-alives, of
/// models that exist; the saved ones of models gone are dropped from the file, with a log line.
fn restore(state: &StateStore, config: &Config, parts: &Parts) -> (BTreeSet<String>, BTreeMap<String, KeepAlive>) {
    let exists = |id: &str| id == parts.default.id || parts.library.get(id).is_some();
    let saved = state.get();
    let mut pinned: BTreeSet<String> = config.pinned.iter().cloned().collect();
    let cluster_model = config.cluster.as_ref().map(|_| parts.default.id.clone());
    for (id, &pin) in &saved.pins {
        if !exists(id) {
            tracing::info!("dropping the saved pin of {id}: no such model any more");
        } else if pin {
            pinned.insert(id.clone());
        } else {
            pinned.remove(id);
        }
    }
    let mut keep_alive = BTreeMap::new();
    for (id, &k) in &saved.keep_alive {
        if exists(id) {
            keep_alive.insert(id.clone(), k);
        } else {
            tracing::info!("dropping the saved keep-alive of {id}: no such model any more");
        }
    }
    state.update(|p| {
        p.pins.retain(|id, _| exists(id));
        p.keep_alive.retain(|id, _| exists(id));
    });
    // A cluster's model stays loaded: see [`Models::clustered`].
    pinned.extend(cluster_model);
    (pinned, keep_alive)
}

fn add_counts(into: &mut Vec<u64>, more: &[u64]) {
    if into.len() < more.len() {
        into.resize(more.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(more) {
        *a += b;
    }
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
