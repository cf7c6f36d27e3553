//! MLX's allocator: memory held by live arrays, the peak, the buffer cache, and the limit;
//! and [`release`], the one way mlxbar gives the buffer cache back to the system (counted
//! by reason for `/metrics` and the snapshot).
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct MlxMemory {
    pub active: u64,
    pub peak: u64,
    pub cache: u64,
    pub limit: u64,
    /// Freed buffers MLX keeps for reuse, at most (sized from the loaded models).
    pub cache_limit: u64,
    /// Times the buffer cache was given back after a quiet spell (`mlx_cache_idle_seconds`).
    pub idle_clears: u64,
    /// Times it was given back after a model unloaded.
    pub unload_clears: u64,
}

/// MLX has no getter for the cache limit: the budget records what it set.
pub static CACHE_LIMIT: AtomicU64 = AtomicU64::new(0);
static IDLE_CLEARS: AtomicU64 = AtomicU64::new(0);
static UNLOAD_CLEARS: AtomicU64 = AtomicU64::new(0);

/// Why the buffer cache was cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearReason {
    /// No engine had work for `mlx_cache_idle_seconds`.
    Idle,
    /// A model unloaded: its buffers went to the cache.
    Unload,
}

impl ClearReason {
    pub const ALL: [ClearReason; 2] = [ClearReason::Idle, ClearReason::Unload];

    pub fn as_str(self) -> &'static str {
        match self {
            ClearReason::Idle => "idle",
            ClearReason::Unload => "unload",
        }
    }

    fn counter(self) -> &'static AtomicU64 {
        match self {
            ClearReason::Idle => &IDLE_CLEARS,
            ClearReason::Unload => &UNLOAD_CLEARS,
        }
    }

    /// Clears so far for this reason (process-wide).
    pub fn count(self) -> u64 {
        self.counter().load(Ordering::Relaxed)
    }
}

/// Gives MLX's buffer cache back to the system, then (glibc) the heap pages `free` kept:
/// MLX's CPU allocator takes its buffers from malloc, and glibc keeps freed mid-sized
/// chunks in its arenas, so without the trim the process's resident size would not drop.
/// Call while holding the device lock (no step allocates meanwhile).
pub fn release(reason: ClearReason) {
    if let Err(e) = mlx_rs::memory::clear_cache() {
        tracing::warn!("clearing MLX's cache: {e}");
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes their locks itself.
    unsafe {
        libc::malloc_trim(0);
    }
    reason.counter().fetch_add(1, Ordering::Relaxed);
}

/// Makes freed buffers leave the process (glibc). By default glibc raises its mmap threshold
/// to the size of each mmapped block freed (up to 32 MiB), after which MLX's KV-sized buffers
/// come from the heap and stay resident when freed: under 8 streams that kept ~200 MB of
/// freed memory in a SmolLM2-135M server. A fixed 1 MiB threshold sends every buffer that
/// size or larger back to the system on free; smaller ones still come from the heap, and
/// MLX's buffer cache spares a steady step the mmap calls. Once per process.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only sets glibc's allocator parameters.
        ONCE.call_once(|| unsafe {
            if libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) != 1 {
                tracing::warn!("mallopt(M_MMAP_THRESHOLD) failed");
            }
        });
    }
}

/// Process-global counters; safe to read from any thread.
pub fn read() -> MlxMemory {
    let get = |r: mlx_rs::error::Result<usize>| r.map(|v| v as u64).unwrap_or(0);
    MlxMemory {
        active: get(mlx_rs::memory::active_memory()),
        peak: get(mlx_rs::memory::peak_memory()),
        cache: get(mlx_rs::memory::cache_memory()),
        limit: get(mlx_rs::memory::memory_limit()),
        cache_limit: CACHE_LIMIT.load(Ordering::Relaxed),
        idle_clears: ClearReason::Idle.count(),
        unload_clears: ClearReason::Unload.count(),
    }
}
