//! The memory budget: the one place that sets MLX's process-wide memory and cache limits,
//! sizes the caches from the model and the machine, estimates what a model needs before it
//! loads, and decides whether it fits beside the loaded ones — which idle ones to unload
//! first, or why it cannot load at all. Pure arithmetic apart from [`Budget::install`] and
//! [`Budget::apply_cache_limit`], so the tests feed it recorded figures.
use std::time::Instant;

use crate::config::Config;
use crate::engine::model::quantized::QuantMode;
use crate::engine::WeightFormat;
use crate::library::entry::WeightPart;
use crate::library::{ModelEntry, Shape};

/// A model loads with at least this much KV (one short conversation); more as room allows.
pub const MIN_KV_TOKENS: usize = 1024;
/// The KV a model gets when room allows and `kv_budget_tokens` is not set: enough for the
/// whole batch of typical chats, not `max_batch` full contexts (32k × 8 is tens of GB).
pub const DEFAULT_KV_TOKENS: usize = 16384;

/// The prefix cache holds this many tokens of KV unless `prefix_cache_bytes` says otherwise:
/// a long shared system prompt, or the last turns of a few chats. Counted in tokens, so a
/// model with a fat KV gets more bytes and a small one does not sit on 256 MiB it never fills.
pub const PREFIX_CACHE_TOKENS: u64 = 2048;

/// MLX's buffer cache holds this many engine steps' transient buffers: a step frees its
/// activations, the next allocates the same sizes again, so one step's worth is reused; the
/// second covers a prefill chunk and a decode step alternating.
pub const CACHE_STEPS: u64 = 2;
/// Below this a cache limit saves nothing worth having (a small model's step is a few MB,
/// and a malloc per op is what the cache is there to avoid).
pub const MIN_CACHE_LIMIT: u64 = 32 << 20;
/// Free buffers past this are memory the machine can use better than MLX can.
pub const MAX_CACHE_LIMIT: u64 = 512 << 20;
/// Tokens of one prefill pass, for the transient estimate.
const PREFILL_TOKENS: u64 = crate::engine::PREFILL_CHUNK as u64;

/// Bytes one engine step allocates and frees again, at most: the larger of a prefill chunk
/// (its tokens' activations through one layer — a handful of hidden-wide tensors, the
/// MLP's three intermediate-wide ones — and its attention scores against a context as long
/// as the chunk) and a decode step of a full batch (the same per row, plus float32 logits).
/// KV buffers are not counted: they live as long as their sequence, and when a batch's KV
/// grows (every 256 tokens) its old buffers go back to the system rather than to the cache.
pub fn step_transient_bytes(shape: &Shape, max_batch: usize, dtype_bytes: usize) -> u64 {
    let per_token = 6 * shape.hidden_size as u64 + 3 * shape.intermediate_size as u64;
    let prefill = PREFILL_TOKENS * (per_token + shape.num_heads as u64 * PREFILL_TOKENS) * dtype_bytes as u64;
    let decode = max_batch.max(1) as u64 * (per_token * dtype_bytes as u64 + 4 * shape.vocab_size as u64);
    prefill.max(decode)
}

/// MLX's cache limit for models with `step` transient bytes: [`CACHE_STEPS`] steps, within
/// [`MIN_CACHE_LIMIT`]..[`MAX_CACHE_LIMIT`] and at most 1/16 of the machine's memory.
pub fn cache_limit_for_step(step: u64, total: u64) -> u64 {
    let limit = (CACHE_STEPS * step).clamp(MIN_CACHE_LIMIT, MAX_CACHE_LIMIT);
    if total > 0 {
        limit.min(total / 16)
    } else {
        limit
    }
}

/// The prefix cache for a model whose KV takes `kv_per_token` bytes a token:
/// [`PREFIX_CACHE_TOKENS`] of it, at most 1/32 of the machine's memory.
pub fn prefix_cache_for(kv_per_token: u64, total: u64) -> u64 {
    let bytes = PREFIX_CACHE_TOKENS * kv_per_token;
    if total > 0 {
        bytes.min(total / 32)
    } else {
        bytes
    }
}

#[derive(Debug, Clone)]
pub struct Budget {
    /// MLX's allocator limit (one process, every model).
    pub mlx_memory_limit: u64,
    /// `mlx_cache_limit_bytes`, when set: the cache limit whatever is loaded.
    pub cache_limit_configured: Option<u64>,
    /// `prefix_cache_bytes`, when set: every model's prefix cache.
    pub prefix_configured: Option<u64>,
    /// Physical memory (0: unknown).
    pub total: u64,
    /// What loaded models may take together: `memory_budget_bytes`, else the MLX limit.
    pub ceiling: u64,
    /// The ceiling was configured (a refusal then says "within the memory budget").
    pub configured: bool,
    /// Kept free for the rest of the machine when judging the system's available memory.
    pub margin: u64,
    pub kv_tokens: Option<usize>,
    pub max_batch: usize,
    pub max_loaded: usize,
}

/// What loading a model needs: its weights as held, and KV from the least that is useful to
/// what it would like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub weights: u64,
    pub kv_min: u64,
    pub kv_preferred: u64,
}

impl Need {
    pub fn least(&self) -> u64 {
        self.weights + self.kv_min
    }
    pub fn preferred(&self) -> u64 {
        self.weights + self.kv_preferred
    }
}

/// A loaded model as the budget sees it.
#[derive(Debug, Clone)]
pub struct Resident {
    pub id: String,
    pub bytes: u64,
    /// Of `bytes`, KV granted and not in use yet: the system still counts it available,
    /// but the model may claim it any moment.
    pub unused: u64,
    /// Idle and not pinned: may be unloaded to make room.
    pub evictable: bool,
    pub last_used: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnloadReason {
    /// Its keep-alive ran out.
    Idle,
    /// `max_loaded_models` were loaded; it was the least recently used.
    Lru,
    /// Another model needed its memory.
    Memory,
    /// Asked for (API, menu).
    Request,
}

impl UnloadReason {
    pub const ALL: [UnloadReason; 4] = [UnloadReason::Idle, UnloadReason::Lru, UnloadReason::Memory, UnloadReason::Request];

    pub fn as_str(self) -> &'static str {
        match self {
            UnloadReason::Idle => "idle",
            UnloadReason::Lru => "lru",
            UnloadReason::Memory => "memory",
            UnloadReason::Request => "request",
        }
    }
}

/// What to do to load: unload these first, then give the model this much KV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub unload: Vec<(String, UnloadReason)>,
    pub kv_bytes: u64,
    /// Room left beside the weights and `kv_bytes` (what a streamed model's expert cache
    /// may grow into).
    pub spare: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Even with every idle model unloaded, `need` exceeds `available`.
    Memory { need: u64, available: u64, within_budget: bool },
    /// `max_loaded_models` are loaded and none can go (busy or pinned).
    Busy { loaded: usize },
    /// The kernel reports critical memory pressure.
    Pressure,
}

impl Budget {
    /// Sets MLX's limits from the config and the machine's memory, once for the process.
    ///
    /// Memory limit: MLX's own default, but at most 75% of physical memory, so a big model
    /// fails to allocate rather than pushing the machine into swap. Cache limit (freed
    /// buffers MLX keeps for reuse): sized for `first`, the model that loads first (see
    /// [`Budget::cache_limit`]); each load resizes it. Margin: a tenth of memory, at most 2 GiB.
    pub fn install(config: &Config, total: u64, first: Option<&ModelEntry>) -> Budget {
        let mlx_default = mlx_rs::memory::memory_limit().unwrap_or(0) as u64;
        let mlx_memory_limit = config.mlx_memory_limit_bytes.map(|b| b as u64).unwrap_or(match (mlx_default, total) {
            (0, t) => t * 3 / 4,
            (d, 0) => d,
            (d, t) => d.min(t * 3 / 4),
        });
        crate::telemetry::mlx_memory::tune_allocator();
        if mlx_memory_limit > 0 {
            if let Err(e) = mlx_rs::memory::set_memory_limit(mlx_memory_limit as usize) {
                tracing::warn!("setting the MLX memory limit: {e}");
            }
        }
        let budget = Budget {
            mlx_memory_limit,
            cache_limit_configured: config.mlx_cache_limit_bytes.map(|b| b as u64),
            prefix_configured: config.prefix_cache_bytes.map(|b| b as u64),
            total,
            ceiling: config.memory_budget_bytes.map(|b| b as u64).unwrap_or(mlx_memory_limit).min(mlx_memory_limit.max(1)),
            configured: config.memory_budget_bytes.is_some(),
            margin: (total / 10).min(2 << 30),
            kv_tokens: config.kv_budget_tokens,
            max_batch: config.max_batch.max(1),
            max_loaded: config.max_loaded_models.max(1),
        };
        let cache_limit = budget.cache_limit(first.into_iter());
        budget.apply_cache_limit(cache_limit);
        tracing::info!(
            "MLX memory limit {} MB, cache limit {} MB; models may take {} MB together (at most {})",
            mlx_memory_limit >> 20,
            cache_limit >> 20,
            budget.ceiling >> 20,
            budget.max_loaded
        );
        budget
    }

    /// MLX's cache limit while `models` are loaded: `mlx_cache_limit_bytes` if set, else
    /// the largest of their [`cache_limit_for_step`] (a model of unknown shape, or none,
    /// gets the minimum).
    pub fn cache_limit<'a>(&self, models: impl Iterator<Item = &'a ModelEntry>) -> u64 {
        if let Some(limit) = self.cache_limit_configured {
            return limit;
        }
        let dtype_bytes = if crate::engine::DeviceKind::for_this_platform() == crate::engine::DeviceKind::Gpu { 2 } else { 4 };
        models
            .filter_map(|m| m.shape.as_ref())
            .map(|s| cache_limit_for_step(step_transient_bytes(s, self.max_batch, dtype_bytes), self.total))
            .max()
            .unwrap_or_else(|| cache_limit_for_step(0, self.total))
    }

    /// Sets MLX's cache limit (process-wide; freed buffers past it go back to the system).
    pub fn apply_cache_limit(&self, limit: u64) {
        use std::sync::atomic::Ordering;
        if crate::telemetry::mlx_memory::CACHE_LIMIT.load(Ordering::Relaxed) == limit {
            return;
        }
        match mlx_rs::memory::set_cache_limit(limit as usize) {
            Ok(_) => {
                crate::telemetry::mlx_memory::CACHE_LIMIT.store(limit, Ordering::Relaxed);
                tracing::debug!("MLX cache limit {} MB", limit >> 20);
            }
            Err(e) => tracing::warn!("setting the MLX cache limit: {e}"),
        }
    }

    /// The prefix cache `entry` gets: `prefix_cache_bytes` if set, else
    /// [`prefix_cache_for`] its KV per token at the device's dtype (a model of unknown
    /// shape: 64 MiB within the same cap).
    pub fn prefix_cache_bytes(&self, entry: &ModelEntry, on_gpu: bool) -> u64 {
        if let Some(bytes) = self.prefix_configured {
            return bytes;
        }
        let dtype_bytes = if on_gpu { 2 } else { 4 };
        match entry.kv_bytes_per_token(dtype_bytes) {
            Some(per_token) => prefix_cache_for(per_token as u64, self.total),
            None => (64u64 << 20).min(if self.total > 0 { self.total / 32 } else { u64::MAX }),
        }
    }

    /// What `entry` needs in `format` (resolved) on the device: weights as they will be
    /// held, KV at the device's dtype.
    pub fn need(&self, entry: &ModelEntry, format: WeightFormat, on_gpu: bool) -> Need {
        let weights = weights_as_held(entry, format, on_gpu);
        let dtype_bytes = if on_gpu { 2 } else { 4 };
        let per_token = entry.kv_bytes_per_token(dtype_bytes).unwrap_or(0) as u64;
        let context = entry.context_length.unwrap_or(4096).max(1);
        let preferred_tokens = self.kv_tokens.unwrap_or_else(|| (context * self.max_batch).min(DEFAULT_KV_TOKENS));
        let min_tokens = self.kv_tokens.unwrap_or(MIN_KV_TOKENS).min(context).min(preferred_tokens);
        Need { weights, kv_min: per_token * min_tokens as u64, kv_preferred: per_token * preferred_tokens as u64 }
    }

    /// Decides how `need` fits beside `resident` with `system_available` bytes free on the
    /// machine: unloads the least recently used idle models while the count or the memory
    /// requires it, and grants KV between the least and the preferred.
    pub fn plan(&self, need: &Need, system_available: u64, resident: &[Resident], pressure_critical: bool) -> Result<Plan, Refusal> {
        if pressure_critical {
            return Err(Refusal::Pressure);
        }
        let mut candidates: Vec<&Resident> = resident.iter().filter(|r| r.evictable).collect();
        candidates.sort_by_key(|r| r.last_used);
        let mut candidates = candidates.into_iter();
        let mut kept: u64 = resident.iter().map(|r| r.bytes).sum();
        let mut count = resident.len();
        let mut freed = 0u64;
        let mut unload = vec![];
        // What the system reports free, less the margin and the KV loaded models were
        // promised and have not taken yet.
        let promised: u64 = resident.iter().map(|r| r.unused).sum();
        let system_free = system_available.saturating_sub(self.margin).saturating_sub(promised);
        let room = |kept: u64, freed: u64| (system_free + freed).min(self.ceiling.saturating_sub(kept));
        loop {
            let reason = if count >= self.max_loaded {
                UnloadReason::Lru
            } else if room(kept, freed) < need.least() {
                UnloadReason::Memory
            } else {
                break;
            };
            let Some(victim) = candidates.next() else {
                return Err(if reason == UnloadReason::Lru {
                    Refusal::Busy { loaded: count }
                } else {
                    let system = system_free + freed;
                    let budget = self.ceiling.saturating_sub(kept);
                    Refusal::Memory { need: need.least(), available: system.min(budget), within_budget: budget < system }
                });
            };
            unload.push((victim.id.clone(), reason));
            kept -= victim.bytes;
            freed += victim.bytes;
            count -= 1;
        }
        let spare = room(kept, freed) - need.weights;
        let kv_bytes = spare.clamp(need.kv_min, need.kv_preferred.max(need.kv_min));
        Ok(Plan { unload, kv_bytes, spare: spare.saturating_sub(kv_bytes) })
    }
}

/// The bytes `entry`'s weights take once loaded in `format` (resolved) on the device.
pub fn weights_as_held(entry: &ModelEntry, format: WeightFormat, on_gpu: bool) -> u64 {
    let float32 = entry.float32_weight_bytes().unwrap_or(entry.size_bytes.saturating_mul(4));
    match format {
        WeightFormat::Float32 | WeightFormat::Auto => float32,
        // Quantized weights stay packed; on the CPU their float parts (and any dense
        // float16 weight) become float32.
        WeightFormat::Native if on_gpu => entry.size_bytes,
        // Each part at its own width (a Q8_0 embedding beside Q4_1 layers): what the CPU
        // kernel runs stays packed, everything else becomes float32.
        WeightFormat::Native => match entry.parts() {
            parts if parts.is_empty() => float32,
            parts => parts.iter().map(cpu_bytes).sum(),
        },
    }
}

/// The bytes `parts` take once loaded in `format` (resolved) on the device: float32, or
/// packed with float16 scales and biases on the GPU, or as [`cpu_bytes`] on the CPU.
pub fn parts_as_held(parts: &[WeightPart], format: WeightFormat, on_gpu: bool) -> u64 {
    parts
        .iter()
        .map(|p| match (format, p.quantization) {
            (WeightFormat::Float32 | WeightFormat::Auto, _) => p.elements * 4,
            (WeightFormat::Native, Some(q)) if on_gpu => q.packed_bytes(p.elements, 2),
            (WeightFormat::Native, None) if on_gpu => p.elements * 2,
            (WeightFormat::Native, _) => cpu_bytes(p),
        })
        .sum()
}

/// What the CPU device holds of `part`: packed values plus a scale and bias a group as the
/// file stores them (the kernel reads float16, bfloat16 or float32) where its kernel runs
/// them, mxfp4 as stored (MLX's ops run it), else float32.
fn cpu_bytes(part: &WeightPart) -> u64 {
    match part.quantization {
        Some(q) if q.mode == QuantMode::Mxfp4 => q.packed_bytes(part.elements, 4),
        Some(q) if crate::engine::cpu_backend::quantized_kernel(q.bits as i32, q.group_size as i32).is_some() => {
            q.packed_bytes(part.elements, part.scale_bytes)
        }
        _ => part.elements * 4,
    }
}

/// Bytes as a user reads them, in the binary units Activity Monitor, the tray and the
/// popover use: "5.1 GB", "540 MB".
pub fn human(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes as f64 >= GIB {
        format!("{:.1} GB", bytes as f64 / GIB)
    } else {
        format!("{} MB", bytes.div_ceil(1 << 20))
    }
}

impl Refusal {
    /// The sentence a user sees (API error, notification, popover).
    pub fn message(&self, id: &str, max_loaded: usize) -> String {
        match self {
            Refusal::Memory { need, available, within_budget: false } => {
                format!("{id} needs ~{}; {} is available without swapping", human(*need), human(*available))
            }
            Refusal::Memory { need, available, within_budget: true } => {
                format!("{id} needs ~{}; {} is left within the memory budget (memory_budget_bytes)", human(*need), human(*available))
            }
            Refusal::Busy { loaded } => format!(
                "{id} cannot load: {loaded} models are loaded (max_loaded_models = {max_loaded}) and none is idle and unpinned; retry when one finishes"
            ),
            Refusal::Pressure => format!("{id} cannot load while memory pressure is critical"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;
    const MB: u64 = 1_000_000;

    fn budget(ceiling: u64, max_loaded: usize) -> Budget {
        Budget {
            mlx_memory_limit: 18 * GB,
            cache_limit_configured: None,
            prefix_configured: None,
            total: 24 * GB,
            ceiling,
            configured: false,
            margin: 2 * GB,
            kv_tokens: None,
            max_batch: 8,
            max_loaded,
        }
    }

    fn resident(id: &str, bytes: u64, evictable: bool, age_s: u64) -> Resident {
        Resident { id: id.into(), bytes, unused: 0, evictable, last_used: Instant::now() - std::time::Duration::from_secs(age_s) }
    }

    // SmolLM2-135M on the CPU, as measured: 538 MB of float32 weights, 46,080 B of KV a token.
    const SMOL: Need = Need { weights: 538_000_000, kv_min: 1024 * 46_080, kv_preferred: 16384 * 46_080 };

    #[test]
    fn fits_on_an_empty_machine_with_the_preferred_kv() {
        let plan = budget(18 * GB, 2).plan(&SMOL, 21 * GB, &[], false).unwrap();
        assert_eq!(plan, Plan { unload: vec![], kv_bytes: SMOL.kv_preferred, spare: 18 * GB - SMOL.preferred() });
    }

    #[test]
    fn a_tight_ceiling_grants_less_kv_but_at_least_the_minimum() {
        let plan = budget(SMOL.weights + 64 * MB, 2).plan(&SMOL, 21 * GB, &[], false).unwrap();
        assert_eq!(plan.kv_bytes, 64 * MB);
        let err = budget(SMOL.weights, 2).plan(&SMOL, 21 * GB, &[], false).unwrap_err();
        assert!(matches!(err, Refusal::Memory { need, .. } if need == SMOL.least()));
    }

    #[test]
    fn the_least_recently_used_idle_model_goes_first_when_the_count_is_reached() {
        let loaded = [resident("old", GB, true, 100), resident("new", GB, true, 5), resident("busy", GB, false, 500)];
        let plan = budget(18 * GB, 3).plan(&SMOL, 15 * GB, &loaded, false).unwrap();
        assert_eq!(plan.unload, vec![("old".to_string(), UnloadReason::Lru)]);
    }

    #[test]
    fn memory_unloads_idle_models_until_the_need_fits() {
        // 3 GB free minus the 2 GB margin: 1 GB; the need is ~0.59 GB, fine. A 4 GB model needs two unloads.
        let big = Need { weights: 4 * GB, kv_min: 100 * MB, kv_preferred: 500 * MB };
        let loaded = [resident("a", 2 * GB, true, 50), resident("b", 2 * GB, true, 10), resident("pinned", 3 * GB, false, 900)];
        let plan = budget(18 * GB, 8).plan(&big, 3 * GB, &loaded, false).unwrap();
        assert_eq!(plan.unload, vec![("a".to_string(), UnloadReason::Memory), ("b".to_string(), UnloadReason::Memory)]);
        assert_eq!(plan.kv_bytes, 500 * MB, "5 GB free after the unloads: the preferred KV fits");
    }

    #[test]
    fn a_refusal_says_what_is_needed_and_what_is_available() {
        const MIB: u64 = 1 << 20;
        let big = Need { weights: 4_922 * MIB, kv_min: 300 * MIB, kv_preferred: GB };
        let loaded = [resident("pinned", GB, false, 1)];
        let err = budget(18 * GB, 4).plan(&big, 2 * GB + 3_277 * MIB, &loaded, false).unwrap_err();
        assert_eq!(err, Refusal::Memory { need: 5_222 * MIB, available: 3_277 * MIB, within_budget: false });
        assert_eq!(
            err.message("Qwen2.5-7B-Instruct-4bit", 4),
            "Qwen2.5-7B-Instruct-4bit needs ~5.1 GB; 3.2 GB is available without swapping"
        );
    }

    #[test]
    fn kv_promised_to_loaded_models_is_not_counted_free() {
        // 5 GB free less the 2 GB margin; a loaded model was promised 2.5 GB of KV it has not used.
        let loaded = [Resident { unused: 2_500 * MB, ..resident("busy", 3 * GB, false, 1) }];
        let err = budget(18 * GB, 4).plan(&SMOL, 5 * GB, &loaded, false).unwrap_err();
        assert_eq!(err, Refusal::Memory { need: SMOL.least(), available: 500 * MB, within_budget: false });
    }

    #[test]
    fn busy_or_pinned_models_block_a_load_past_the_count() {
        let loaded = [resident("a", MB, false, 1), resident("b", MB, false, 2)];
        assert_eq!(budget(18 * GB, 2).plan(&SMOL, 21 * GB, &loaded, false).unwrap_err(), Refusal::Busy { loaded: 2 });
    }

    #[test]
    fn critical_pressure_refuses_every_load() {
        assert_eq!(budget(18 * GB, 2).plan(&SMOL, 21 * GB, &[], true).unwrap_err(), Refusal::Pressure);
    }

    #[test]
    fn a_configured_budget_is_the_binding_figure() {
        let mut b = budget(300 * MB, 2);
        b.configured = true;
        let err = b.plan(&SMOL, 21 * GB, &[], false).unwrap_err();
        assert_eq!(err, Refusal::Memory { need: SMOL.least(), available: 300 * MB, within_budget: true });
        assert!(err.message("m", 2).contains("within the memory budget"), "{}", err.message("m", 2));
    }

    const SMOL_SHAPE: Shape = Shape {
        layers: 30,
        hidden_size: 576,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        vocab_size: 49152,
        intermediate_size: 1536,
        tie_word_embeddings: true,
    };
    const QWEN7B_SHAPE: Shape = Shape {
        layers: 28,
        hidden_size: 3584,
        num_heads: 28,
        num_kv_heads: 4,
        head_dim: 128,
        vocab_size: 152064,
        intermediate_size: 18944,
        tie_word_embeddings: false,
    };

    fn entry(shape: Option<Shape>) -> ModelEntry {
        ModelEntry {
            id: "m".into(),
            path: "/m".into(),
            format: crate::library::ModelFormat::Gguf,
            source: crate::library::ModelSource::Path,
            revision: None,
            architecture: None,
            parameters: None,
            quantization: None,
            size_bytes: 0,
            context_length: None,
            chat_template: false,
            shape,
            weight_parts: vec![],
            experts: None,
            runnable: true,
            unsupported_reason: None,
        }
    }

    /// A mixture-of-experts model streams only when it does not fit (or `expert_cache_bytes`
    /// says so), its cache sized by the room left; one that does not fit even streamed is
    /// refused with a note saying so.
    #[test]
    fn expert_streaming_plans() {
        use super::super::experts::{plan, Ask};
        use crate::library::entry::ExpertParts;
        // 1 GB of float32 experts (100 of 10 MB, 8 a token) beside 100 MB of other weights.
        let experts = WeightPart::new(None, 250 * MB);
        let moe = ModelEntry {
            weight_parts: vec![experts, WeightPart::new(None, 25 * MB)],
            parameters: Some(275 * MB),
            experts: Some(ExpertParts { parts: vec![experts], count: 100, per_token: 8 }),
            ..entry(None)
        };
        let b = budget(18 * GB, 2);
        let ask = |available: u64, cap: Option<u64>| Ask {
            format: WeightFormat::Float32,
            on_gpu: false,
            available: b.margin + available,
            residents: &[],
            pressure_critical: false,
            cap,
            ranks: 1,
        };
        let cache = |available, cap| plan(&b, &moe, &ask(available, cap)).ok().unwrap().expert_cache;
        // A cluster's rank 0 plans about its share, experts resident (they never stream there).
        assert_eq!(plan(&b, &moe, &Ask { ranks: 2, ..ask(10 * GB, Some(300 * MB)) }).unwrap().expert_cache, None);
        assert_eq!(cache(10 * GB, None), None, "fits: resident");
        assert_eq!(cache(10 * GB, Some(300 * MB)), Some(300 * MB), "forced");
        assert_eq!(cache(10 * GB, Some(5 * GB)), Some(1000 * MB), "at most every expert");
        let streamed = cache(700 * MB, None).unwrap();
        assert!((80 * MB..=600 * MB).contains(&streamed), "the room left: {streamed}");
        let (refusal, note) = plan(&b, &moe, &ask(150 * MB, None)).err().unwrap();
        assert!(matches!(refusal, Refusal::Memory { .. }));
        assert!(note.unwrap().contains("experts streamed"));
        let dense = ModelEntry { experts: None, ..moe.clone() };
        assert_eq!(plan(&b, &dense, &ask(10 * GB, Some(MB))).ok().unwrap().expert_cache, None, "a dense model never streams");
    }

    /// A 4-bit 7B on the CPU: packed values plus 16-bit scales and biases (groups of 64:
    /// 0.5625 bytes a parameter, ~4.3 GB), where float32 would take ~30 GB; what the kernel
    /// cannot run (3 bits) is float32.
    #[cfg(target_os = "linux")]
    #[test]
    fn packed_weights_on_the_cpu_are_estimated_at_their_packed_size() {
        let b = budget(18 * GB, 2);
        let params = 7_615_616_512u64;
        let mut e = entry(Some(QWEN7B_SHAPE));
        e.parameters = Some(params);
        e.quantization = Some(crate::library::Quantization::affine(4, 64));
        assert_eq!(b.need(&e, WeightFormat::Native, false).weights, params / 2 + params / 16);
        assert_eq!(b.need(&e, WeightFormat::Float32, false).weights, params * 4);
        e.quantization = Some(crate::library::Quantization::affine(3, 64));
        assert_eq!(b.need(&e, WeightFormat::Native, false).weights, params * 4);
    }

    /// The default model's GGUF: Q4_1 layers (0.625 bytes a value packed with float16
    /// scales and biases, as the file holds them), a Q8_0 embedding that is also the head
    /// (1.125), float32 norms: 98 MB. A part the kernel cannot run (3 bits) is float32.
    #[cfg(target_os = "linux")]
    #[test]
    fn each_part_is_estimated_at_its_own_width() {
        let b = budget(18 * GB, 2);
        let part = |width: Option<(u32, u32)>, elements| {
            WeightPart::new(width.map(|(bits, group_size)| crate::library::Quantization::affine(bits, group_size)), elements)
        };
        let mut e = entry(Some(SMOL_SHAPE));
        e.parameters = Some(134_515_008);
        e.quantization = Some(crate::library::Quantization::affine(4, 32));
        e.weight_parts = vec![part(None, 35_136), part(Some((4, 32)), 106_168_320), part(Some((8, 32)), 28_311_552)];
        assert_eq!(b.need(&e, WeightFormat::Native, false).weights, 106_168_320 * 5 / 8 + 28_311_552 * 9 / 8 + 35_136 * 4);
        assert_eq!(b.need(&e, WeightFormat::Native, false).weights, 98_346_240);
        assert_eq!(b.need(&e, WeightFormat::Float32, false).weights, 134_515_008 * 4);
        e.weight_parts[2] = part(Some((3, 32)), 28_311_552);
        assert_eq!(b.need(&e, WeightFormat::Native, false).weights, 106_168_320 * 5 / 8 + 28_311_552 * 4 + 35_136 * 4);
    }

    #[test]
    fn the_mlx_cache_holds_two_steps_of_the_model_not_a_flat_gigabyte() {
        // SmolLM2-135M on the CPU: a 512-token prefill chunk is the largest step (26 MB;
        // a batch of 8 decoding allocates 1.8 MB), so two steps: 49.5 MiB.
        let smol = step_transient_bytes(&SMOL_SHAPE, 8, 4);
        assert_eq!(smol, 512 * (6 * 576 + 3 * 1536 + 9 * 512) * 4);
        assert_eq!(cache_limit_for_step(smol, 24 * GB), 51_904_512);
        // A 7B on Metal (float16): 95 MB a step, 190 MB of cache.
        let qwen = step_transient_bytes(&QWEN7B_SHAPE, 8, 2);
        assert_eq!(cache_limit_for_step(qwen, 24 * GB), 2 * qwen);
        assert_eq!(qwen, 94_896_128);
        // Bounded below, above, and by the machine.
        assert_eq!(cache_limit_for_step(1, 24 * GB), MIN_CACHE_LIMIT);
        assert_eq!(cache_limit_for_step(10 * GB, 64 * GB), MAX_CACHE_LIMIT);
        assert_eq!(cache_limit_for_step(qwen, 2 << 30), 128 << 20, "1/16 of a 2 GiB machine");
        // A wide batch of a large vocabulary makes the decode step the larger one.
        let wide = step_transient_bytes(&QWEN7B_SHAPE, 256, 2);
        assert_eq!(wide, 256 * (78_336 * 2 + 4 * 152_064));
    }

    #[test]
    fn the_cache_limit_follows_the_largest_loaded_model_unless_configured() {
        let mut b = budget(18 * GB, 2);
        let (smol, qwen, unknown) = (entry(Some(SMOL_SHAPE)), entry(Some(QWEN7B_SHAPE)), entry(None));
        let dtype = if crate::engine::DeviceKind::for_this_platform() == crate::engine::DeviceKind::Gpu { 2 } else { 4 };
        let expect = |s: &Shape| cache_limit_for_step(step_transient_bytes(s, 8, dtype), 24 * GB);
        assert_eq!(b.cache_limit([&smol].into_iter()), expect(&SMOL_SHAPE));
        assert_eq!(b.cache_limit([&smol, &qwen, &unknown].into_iter()), expect(&QWEN7B_SHAPE));
        assert_eq!(b.cache_limit([&unknown].into_iter()), MIN_CACHE_LIMIT);
        assert_eq!(b.cache_limit(std::iter::empty()), MIN_CACHE_LIMIT);
        b.cache_limit_configured = Some(1 << 30);
        assert_eq!(b.cache_limit([&smol].into_iter()), 1 << 30);
    }

    #[test]
    fn the_prefix_cache_is_sized_in_tokens_of_the_models_kv_and_capped_by_memory() {
        let mut b = budget(18 * GB, 2);
        let smol = entry(Some(SMOL_SHAPE));
        // 2048 tokens × 46,080 B (30 layers × 3 KV heads × 64 × K and V × float32): 90 MiB,
        // where the old flat default kept 256 MiB.
        assert_eq!(b.prefix_cache_bytes(&smol, false), 2048 * 46_080);
        assert_eq!(b.prefix_cache_bytes(&smol, true), 2048 * 23_040, "float16 KV on Metal");
        let qwen = ModelEntry { shape: Some(QWEN7B_SHAPE), ..smol.clone() };
        assert_eq!(b.prefix_cache_bytes(&qwen, true), 2048 * 57_344);
        b.total = 1 << 30;
        assert_eq!(b.prefix_cache_bytes(&qwen, true), 32 << 20, "1/32 of a 1 GiB machine");
        let unknown = ModelEntry { shape: None, ..smol.clone() };
        assert_eq!(b.prefix_cache_bytes(&unknown, false), 32 << 20);
        b.total = 24 * GB;
        assert_eq!(b.prefix_cache_bytes(&unknown, false), 64 << 20);
        b.prefix_configured = Some(0);
        assert_eq!(b.prefix_cache_bytes(&smol, false), 0, "configured: 0 turns it off");
    }
}
