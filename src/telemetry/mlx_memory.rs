//! MLX's allocator: memory held by live arrays, the peak, the buffer cache, and the limit.
use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct MlxMemory {
    pub active: u64,
    pub peak: u64,
    pub cache: u64,
    pub limit: u64,
    /// Freed buffers MLX keeps for reuse, at most (set at engine start).
    pub cache_limit: u64,
}

/// MLX has no getter for the cache limit: the engine records what it set.
pub static CACHE_LIMIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Process-global counters; safe to read from any thread.
pub fn read() -> MlxMemory {
    let get = |r: mlx_rs::error::Result<usize>| r.map(|v| v as u64).unwrap_or(0);
    MlxMemory {
        active: get(mlx_rs::memory::active_memory()),
        peak: get(mlx_rs::memory::peak_memory()),
        cache: get(mlx_rs::memory::cache_memory()),
        limit: get(mlx_rs::memory::memory_limit()),
        cache_limit: CACHE_LIMIT.load(std::sync::atomic::Ordering::Relaxed),
    }
}
