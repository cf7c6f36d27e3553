//! Expert streaming: a mixture-of-experts model whose experts do not fit the memory budget
//! runs with its other weights resident and its experts in a cache the budget sizes
//! ([`cache`]: frequency with decay), read on demand from the model's own files (an MLX folder's
//! safetensors or a GGUF) by byte range ([`locate`]) when the router picks one that is not in memory
//! ([`streamed`]), with hits, misses, bytes read and routing entropy reported ([`stats`]).
//! This is MLX-Flash's expert cache inside mlxbar's engine; the registry decides when a
//! model streams (`expert_cache_bytes`, or its experts exceeding the budget).
pub mod cache;
pub mod locate;
pub mod stats;
pub mod streamed;

pub use locate::ExpertFiles;
pub use stats::{ExpertStats, ExpertView};
pub use streamed::ExpertStore;

/// What the loader hands `Model::assemble` for a streamed model: where the experts are and
/// how many bytes of them may stay in memory.
pub struct StreamSpec {
    pub files: ExpertFiles,
    pub budget: u64,
}
