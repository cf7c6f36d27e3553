//! The live snapshot as types: what `GET /api/metrics/snapshot` answers and every `snapshot`
//! event of `/api/metrics/stream` carries, read by the popover (ui/app.js) and by bench runs
//! describing an mlxbar target. Typed so the shape is one definition: its JSON Schema
//! (draft 2020-12, describing what is serialized) is published at
//! `GET /api/metrics/snapshot/schema`, and the tests check real snapshots against it.
use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde::Serialize;

use crate::alerts::AlertView;
use crate::bench::jobs::JobView;
use crate::engine::stats::StatsView;
use crate::engine::{DeviceKind, LoadState};
use crate::metrics::live::{ByResult, Distributions, FinishedRequest, Throughput};
use crate::registry::ModelView;
use crate::telemetry::memory::MemoryStats;
use crate::telemetry::mlx_memory::MlxMemory;
use crate::telemetry::power::attribution::EnergyView;
use crate::telemetry::power::PowerSample;
use crate::telemetry::process::ProcessStats;

/// One moment of the server: model, scheduler, caches, memory, alerts, bench, requests.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Snapshot {
    /// mlxbar's version.
    pub version: &'static str,
    /// When the snapshot was taken, Unix seconds.
    pub at: f64,
    /// When the server started, Unix seconds.
    pub started_at: u64,
    pub uptime_seconds: f64,
    pub device: DeviceKind,
    /// The models not unloaded (loaded, loading with progress, unloading, failed); the
    /// whole library is at `GET /api/models`.
    pub models: Vec<ModelView>,
    /// Bumps when the library changes: refetch `GET /api/models`.
    pub library_generation: u64,
    /// Downloads from Hugging Face, running and recent.
    pub pulls: Vec<crate::library::pull::PullProgress>,
    /// The default model's state.
    pub state: LoadState,
    pub scheduler: Scheduler,
    pub caches: StatsView,
    /// Prefix-cache hits over lookups; null before the first lookup.
    pub prefix_cache_hit_rate: Option<f64>,
    pub memory: Memory,
    /// GPU, power, temperatures, thermal pressure and energy per token; null figures are
    /// not readable on this machine (`power.sample.unavailable` says why).
    pub power: Power,
    pub alerts: Vec<AlertView>,
    pub bench: Bench,
    /// Set from the menu bar: generation requests get 503 until resumed.
    pub paused: bool,
    pub totals: Totals,
    pub requests: Requests,
    pub links: Links,
    pub timings: Distributions,
    pub throughput: Throughput,
    /// The ranks serving the default model with this one (rank 0), when it is a cluster's.
    pub cluster: Option<crate::distributed::report::ClusterView>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Scheduler {
    /// Requests queued, not yet taken by the engine.
    pub waiting: usize,
    /// Sequences being generated.
    pub running: usize,
    pub queue_capacity: usize,
    /// Seconds since the engine last made progress while it had work (0 when idle).
    pub last_step_age_seconds: f64,
    /// `/health`'s status word.
    #[schemars(extend("enum" = ["ok", "loading", "failed", "stopped", "stopping", "stalled"]))]
    pub health: &'static str,
    /// Why mlxbar must be restarted (an engine thread stuck past its deadline was left
    /// behind, holding its memory); null when all is well.
    pub restart_required: Option<String>,
    pub max_batch: usize,
    pub tokens_per_second: f64,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Memory {
    /// The OS's view; null when its reader failed.
    pub system: Option<MemoryStats>,
    pub mlx: MlxMemory,
    pub process: ProcessStats,
    pub swap_in_pages_per_second: f64,
    pub swap_out_pages_per_second: f64,
    /// This process's CPU use in cores (1.0 = one core busy).
    pub process_cpu_cores: f64,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Power {
    /// The sampler's latest reading.
    pub sample: PowerSample,
    /// Energy spent generating, tokens per joule over the last minute, idle power.
    pub energy: EnergyView,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Bench {
    /// The run holding the engine, if any.
    pub active: Option<JobView>,
    /// Requests waiting for the run to end.
    pub waiting_requests: usize,
}

/// Since start.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Totals {
    pub requests: u64,
    pub completion_tokens: u64,
    pub errors: u64,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Requests {
    pub by_result: ByResult,
    /// The last finished requests, newest last.
    pub recent: Vec<FinishedRequest>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Links {
    pub metrics: &'static str,
    /// From the config; null when none is set.
    pub grafana: Option<String>,
}

/// The schema of [`Snapshot`] as serialized: every field required (none is ever skipped),
/// nullable ones typed as such. Built once; it never changes while the binary runs.
pub fn schema() -> &'static serde_json::Value {
    static SCHEMA: OnceLock<serde_json::Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let schema = SchemaSettings::draft2020_12().for_serialize().into_generator().into_root_schema_for::<Snapshot>();
        serde_json::to_value(schema).expect("a schema is JSON")
    })
}

/// `GET /api/metrics/snapshot/schema`.
pub async fn get_schema() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/schema+json")], serde_json::to_string(schema()).expect("a schema is JSON"))
}
