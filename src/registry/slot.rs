//! One model's place in the registry: its phase (loading, ready, unloading, failed), who
//! uses it and until when it stays; and [`ModelView`], what the API, the live stream, the
//! tray and the popover show of it.
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use schemars::JsonSchema;
use serde::Serialize;

use super::keep_alive::KeepAlive;
use crate::engine::{Engine, ModelInfo};
use crate::library::ModelEntry;

pub enum Phase {
    Loading(Arc<Engine>),
    Ready(Arc<Engine>),
    /// Draining or stopping: no new requests; they wait for the unload, then reload it.
    Unloading,
    Failed {
        reason: String,
    },
}

pub struct Slot {
    pub phase: Phase,
    /// Requests holding a [`super::Lease`].
    pub active: usize,
    pub last_used: Instant,
    pub last_used_unix: u64,
    /// The last request's keep-alive (the config's until one asks otherwise).
    pub keep_alive: KeepAlive,
    /// Weights + the KV budget granted: what the budget counts for it.
    pub memory_bytes: u64,
    /// The KV budget granted (part of `memory_bytes`).
    pub kv_bytes: u64,
    /// Which load made it.
    pub generation: u64,
}

impl Slot {
    pub fn new(phase: Phase, keep_alive: KeepAlive, generation: u64) -> Slot {
        Slot {
            phase,
            active: 0,
            last_used: Instant::now(),
            last_used_unix: unix_now(),
            keep_alive,
            memory_bytes: 0,
            kv_bytes: 0,
            generation,
        }
    }

    pub fn engine(&self) -> Option<&Arc<Engine>> {
        match &self.phase {
            Phase::Ready(e) => Some(e),
            _ => None,
        }
    }

    /// Ready and nothing running, queued or leased.
    pub fn idle(&self) -> bool {
        self.active == 0 && self.engine().is_some_and(|e| e.running() + e.waiting() == 0)
    }

    pub fn touch(&mut self) {
        self.last_used = Instant::now();
        self.last_used_unix = unix_now();
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    Unloaded,
    Loading,
    Loaded,
    /// Draining its requests before it unloads.
    Unloading,
    Failed,
}

/// A library model with its state in the registry.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ModelView {
    #[serde(flatten)]
    pub entry: ModelEntry,
    pub state: SlotState,
    /// 0..1 while loading.
    pub progress: Option<f64>,
    /// Why the load failed, or why the last load was refused.
    pub error: Option<String>,
    /// Loaded: weights + the KV budget it holds.
    pub memory_bytes: Option<u64>,
    /// Loaded: bytes of KV buffers its running requests hold now (the decoding batch is
    /// padded to its longest row).
    pub kv_bytes: Option<u64>,
    /// Loaded: bytes of KV its prefix cache holds, and at most may.
    pub prefix_cache_bytes: Option<u64>,
    pub prefix_cache_limit_bytes: Option<u64>,
    /// What loading it needs at least (weights + a minimal KV budget).
    pub estimate_bytes: Option<u64>,
    /// Loaded with nothing running: seconds since its last request.
    pub idle_seconds: Option<f64>,
    pub last_used_unix: Option<u64>,
    /// Seconds it stays loaded once idle; null: until unloaded by hand.
    pub keep_alive_seconds: Option<f64>,
    /// Requests running or queued on it.
    pub requests: usize,
    pub pinned: bool,
    pub default: bool,
    /// What the loaded engine reports (format, dtype, weight bytes, load time).
    pub info: Option<ModelInfo>,
    /// Loaded with its experts streamed: the expert cache's figures.
    pub experts: Option<crate::engine::experts::ExpertView>,
}
