//! What the engine thread publishes about its caches and admission, for /metrics, the
//! live snapshot and the alert engine: plain atomics, written once per engine iteration.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;

use super::prefix_cache::PrefixStats;

#[derive(Debug, Default)]
pub struct EngineStats {
    kv_tokens: AtomicU64,
    kv_bytes: AtomicU64,
    kv_budget_tokens: AtomicU64,
    kv_reserved_tokens: AtomicU64,
    max_batch: AtomicU64,
    prefix_entries: AtomicU64,
    prefix_bytes: AtomicU64,
    prefix_budget_bytes: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_misses: AtomicU64,
    prefix_evictions: AtomicU64,
    prefix_tokens_saved: AtomicU64,
    /// Speculative decoding: passes that verified a draft, and the draft tokens they
    /// accepted and rejected.
    draft_passes: AtomicU64,
    draft_accepted: AtomicU64,
    draft_rejected: AtomicU64,
    /// New work is held back (memory pressure critical).
    admission_blocked: AtomicBool,
    /// Requests the engine ended with an error, counted whatever `metrics_enabled` says
    /// (the `engine_error` alert reads it).
    failed_requests: AtomicU64,
    /// When the engine last showed progress (finished an iteration, or was handed work
    /// while idle), in microseconds since [`clock_base`]; the stall watchdog reads it.
    progress_micros: AtomicU64,
    /// Moving average of a finished request's time in the engine (admitted to done), in
    /// microseconds; 0 before the first. Paces the queue's Retry-After.
    service_micros: AtomicU64,
    /// Decode steps run, by how many sequences each decoded together.
    batch_sizes: BatchSizes,
    /// Time the grammar mask took per constrained step; /metrics exports this very histogram.
    mask_seconds: MaskSeconds,
}

/// `mlxbar_constrained_decoding_mask_seconds` (the registry adds the prefix): made here (the engine observes it on every
/// constrained step) and registered by [`crate::metrics::Metrics`].
#[derive(Clone)]
pub struct MaskSeconds(pub prometheus::Histogram);

impl Default for MaskSeconds {
    fn default() -> Self {
        let opts = prometheus::HistogramOpts::new(
            "constrained_decoding_mask_seconds",
            "Time to compute and apply the grammar's token mask for one decode step of a constrained request (response_format, tool calls)",
        )
        .buckets(prometheus::exponential_buckets(2.5e-5, 2.0, 14).expect("valid buckets"));
        MaskSeconds(prometheus::Histogram::with_opts(opts).expect("valid histogram"))
    }
}

impl std::fmt::Debug for MaskSeconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MaskSeconds({} samples)", self.0.get_sample_count())
    }
}

/// Decode steps by batch size: `steps[n]` counts the steps that decoded `n` sequences
/// together (sizes past [`BatchSizes::MAX`] count at the end; `max_batch` cannot exceed it).
#[derive(Debug)]
pub struct BatchSizes {
    steps: [AtomicU64; BatchSizes::MAX + 1],
}

impl BatchSizes {
    pub const MAX: usize = 256;

    /// Steps per batch size, index = size (index 0 is always 0).
    pub fn counts(&self) -> Vec<u64> {
        self.steps.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// The largest batch any step decoded (0 before the first step).
    pub fn peak(&self) -> usize {
        self.steps.iter().rposition(|c| c.load(Ordering::Relaxed) > 0).unwrap_or(0)
    }
}

impl Default for BatchSizes {
    fn default() -> Self {
        BatchSizes { steps: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

/// The origin of the engine's progress clock (monotonic, process-wide).
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now_micros() -> u64 {
    clock_base().elapsed().as_micros() as u64
}

/// A copy of [`EngineStats`] at one moment.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, schemars::JsonSchema)]
pub struct StatsView {
    pub kv_tokens: u64,
    pub kv_bytes: u64,
    pub kv_budget_tokens: u64,
    /// Tokens promised to running requests (prompt + max_tokens each).
    pub kv_reserved_tokens: u64,
    pub max_batch: u64,
    pub prefix_entries: u64,
    pub prefix_bytes: u64,
    pub prefix_budget_bytes: u64,
    pub prefix_hits: u64,
    pub prefix_misses: u64,
    pub prefix_evictions: u64,
    pub prefix_tokens_saved: u64,
    /// Speculative decoding (Predicted Outputs, prompt lookup): passes that verified a
    /// draft, and the draft tokens they accepted and rejected.
    pub draft_passes: u64,
    pub draft_accepted: u64,
    pub draft_rejected: u64,
    pub admission_blocked: bool,
    pub failed_requests: u64,
    /// The most sequences one decode step ran together since start.
    pub peak_batch: u64,
}

impl StatsView {
    /// Two engines' figures together: sizes and counters add, limits take the larger.
    pub fn plus(&self, o: &StatsView) -> StatsView {
        StatsView {
            kv_tokens: self.kv_tokens + o.kv_tokens,
            kv_bytes: self.kv_bytes + o.kv_bytes,
            kv_budget_tokens: self.kv_budget_tokens + o.kv_budget_tokens,
            kv_reserved_tokens: self.kv_reserved_tokens + o.kv_reserved_tokens,
            max_batch: self.max_batch.max(o.max_batch),
            prefix_entries: self.prefix_entries + o.prefix_entries,
            prefix_bytes: self.prefix_bytes + o.prefix_bytes,
            prefix_budget_bytes: self.prefix_budget_bytes + o.prefix_budget_bytes,
            prefix_hits: self.prefix_hits + o.prefix_hits,
            prefix_misses: self.prefix_misses + o.prefix_misses,
            prefix_evictions: self.prefix_evictions + o.prefix_evictions,
            prefix_tokens_saved: self.prefix_tokens_saved + o.prefix_tokens_saved,
            draft_passes: self.draft_passes + o.draft_passes,
            draft_accepted: self.draft_accepted + o.draft_accepted,
            draft_rejected: self.draft_rejected + o.draft_rejected,
            admission_blocked: self.admission_blocked || o.admission_blocked,
            failed_requests: self.failed_requests + o.failed_requests,
            peak_batch: self.peak_batch.max(o.peak_batch),
        }
    }
}

impl EngineStats {
    /// Stats observing `mask_seconds` (shared by every engine of the process).
    pub fn with_mask_seconds(mask_seconds: MaskSeconds) -> EngineStats {
        EngineStats { mask_seconds, ..Default::default() }
    }

    pub fn set_limits(&self, max_batch: usize, kv_budget_tokens: usize) {
        self.max_batch.store(max_batch as u64, Ordering::Relaxed);
        self.kv_budget_tokens.store(kv_budget_tokens as u64, Ordering::Relaxed);
    }

    pub fn set_kv(&self, tokens: usize, bytes: usize, reserved: usize) {
        self.kv_tokens.store(tokens as u64, Ordering::Relaxed);
        self.kv_bytes.store(bytes as u64, Ordering::Relaxed);
        self.kv_reserved_tokens.store(reserved as u64, Ordering::Relaxed);
    }

    pub fn set_prefix(&self, p: &PrefixStats) {
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&self.prefix_entries, p.entries as u64);
        set(&self.prefix_bytes, p.bytes as u64);
        set(&self.prefix_budget_bytes, p.budget as u64);
        set(&self.prefix_hits, p.hits);
        set(&self.prefix_misses, p.misses);
        set(&self.prefix_evictions, p.evictions);
        set(&self.prefix_tokens_saved, p.tokens_saved);
    }

    pub fn set_admission_blocked(&self, blocked: bool) {
        self.admission_blocked.store(blocked, Ordering::Relaxed);
    }

    /// A decode step ran `sequences` rows together.
    pub fn record_decode_step(&self, sequences: usize) {
        self.batch_sizes.steps[sequences.min(BatchSizes::MAX)].fetch_add(1, Ordering::Relaxed);
    }

    /// A pass verified `proposed` draft tokens and accepted `accepted` of them.
    pub fn record_draft(&self, proposed: usize, accepted: usize) {
        if proposed > 0 {
            self.draft_passes.fetch_add(1, Ordering::Relaxed);
            self.draft_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
            self.draft_rejected.fetch_add(proposed.saturating_sub(accepted) as u64, Ordering::Relaxed);
        }
    }

    pub fn batch_sizes(&self) -> &BatchSizes {
        &self.batch_sizes
    }

    pub fn record_mask(&self, seconds: f64) {
        self.mask_seconds.0.observe(seconds);
    }

    pub fn mask_seconds(&self) -> &MaskSeconds {
        &self.mask_seconds
    }

    pub fn count_failure(&self) {
        self.failed_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine finished an iteration (or was handed work while idle).
    pub fn mark_progress(&self) {
        self.progress_micros.store(now_micros(), Ordering::Relaxed);
    }

    /// A request finished after `seconds` in the engine.
    pub fn record_service(&self, seconds: f64) {
        let sample = (seconds * 1e6) as u64;
        let old = self.service_micros.load(Ordering::Relaxed);
        let new = if old == 0 { sample } else { (old * 7 + sample) / 8 };
        self.service_micros.store(new.max(1), Ordering::Relaxed);
    }

    /// The recent time one request spends in the engine; None before the first finished.
    pub fn service_seconds(&self) -> Option<f64> {
        let v = self.service_micros.load(Ordering::Relaxed);
        (v > 0).then(|| v as f64 / 1e6)
    }

    /// Seconds since the engine last showed progress.
    pub fn since_progress(&self) -> f64 {
        now_micros().saturating_sub(self.progress_micros.load(Ordering::Relaxed)) as f64 / 1e6
    }

    pub fn view(&self) -> StatsView {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsView {
            kv_tokens: get(&self.kv_tokens),
            kv_bytes: get(&self.kv_bytes),
            kv_budget_tokens: get(&self.kv_budget_tokens),
            kv_reserved_tokens: get(&self.kv_reserved_tokens),
            max_batch: get(&self.max_batch),
            prefix_entries: get(&self.prefix_entries),
            prefix_bytes: get(&self.prefix_bytes),
            prefix_budget_bytes: get(&self.prefix_budget_bytes),
            prefix_hits: get(&self.prefix_hits),
            prefix_misses: get(&self.prefix_misses),
            prefix_evictions: get(&self.prefix_evictions),
            prefix_tokens_saved: get(&self.prefix_tokens_saved),
            draft_passes: get(&self.draft_passes),
            draft_accepted: get(&self.draft_accepted),
            draft_rejected: get(&self.draft_rejected),
            admission_blocked: self.admission_blocked.load(Ordering::Relaxed),
            failed_requests: get(&self.failed_requests),
            peak_batch: self.batch_sizes.peak() as u64,
        }
    }
}
