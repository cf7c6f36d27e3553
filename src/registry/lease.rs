//! [`Lease`]: a request's hold on a loaded model. While any lease is held the model is not
//! idle (the reaper and LRU leave it); dropping it records the use and the request's
//! keep-alive.
use std::sync::Arc;

use super::{KeepAlive, Models};
use crate::engine::Engine;

pub struct Lease {
    models: Arc<Models>,
    id: String,
    generation: u64,
    engine: Arc<Engine>,
    keep_alive: Option<KeepAlive>,
}

impl Lease {
    pub(super) fn new(models: Arc<Models>, id: String, generation: u64, engine: Arc<Engine>, keep_alive: Option<KeepAlive>) -> Lease {
        Lease { models, id, generation, engine, keep_alive }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The registry's id of the model.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.models.release(&self.id, self.generation, self.keep_alive);
    }
}
