//! Bounded preparation: checking schemas, rendering the chat template, tokenizing (a 4 MiB
//! prompt takes about a second) and compiling grammars run on blocking threads, at most
//! `prepare_threads` at once. A burst of large requests then queues here instead of
//! holding the async workers (where `/health` and every other route run) or taking a
//! blocking thread each (tokio allows 512) and every core from the engine.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::api::error::ApiError;

/// A request that waits longer than this for a turn gets 503 `server_busy`.
const WAIT: Duration = Duration::from_secs(30);

pub struct Prepare {
    permits: Arc<Semaphore>,
}

impl Prepare {
    pub fn new(threads: usize) -> Arc<Prepare> {
        Arc::new(Prepare { permits: Arc::new(Semaphore::new(threads.max(1))) })
    }

    /// Runs `work` on a blocking thread once a turn is free. The turn is held until `work`
    /// returns, even if the caller is gone by then (the thread cannot be stopped).
    pub async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
        let permit = match tokio::time::timeout(WAIT, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            _ => return Err(ApiError::preparation_busy(5)),
        };
        tokio::task::spawn_blocking(move || {
            let _turn = permit;
            work()
        })
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request: {e}")))
    }
}
