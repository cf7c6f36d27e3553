//! `POST /api/models/pull {"model": "org/name", "revision"?, "file"?}` starts a pull from
//! Hugging Face (202 + its progress, with its `id`; 409 while one of the same repo runs;
//! 429 while `max_concurrent_pulls` run; 400 for a name that is not a repo id),
//! `GET /api/models/pulls` lists them (running and recent ones), and
//! `DELETE /api/models/pulls/{id}` cancels one (200 with its progress once it stopped; the
//! partial file stays and the next pull of the repo resumes it; 404 unknown, 409 not
//! running). The pull uses the server's environment (HF_ENDPOINT, HF_TOKEN,
//! HF_HUB_CACHE/HF_HOME, MLXBAR_HF_TOKEN_OVER_HTTP).
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::json::OpenAiJson;
use super::AppState;
use crate::library::pull::{CancelError, PullError, PullOptions, PullProgress};

/// How long a cancel waits for the pull to stop (it stops within 50 ms unless its thread is
/// stuck in a disk write).
const CANCEL_WAIT: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `org/name` on the hub.
    model: String,
    revision: Option<String>,
    /// For a GGUF repo: which `.gguf`.
    file: Option<String>,
}

pub async fn start(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<PullRequest>) -> Result<Response, ApiError> {
    let mut opts = PullOptions::from_env(&req.model);
    opts.revision = req.revision;
    opts.gguf_file = req.file;
    let progress = state.pulls.start(opts, state.config.max_concurrent_pulls).map_err(refused)?;
    Ok((StatusCode::ACCEPTED, Json(progress)).into_response())
}

/// A pull that could not start: 409 while one of the same repo runs, 400 for a name that is
/// not a repo id, 429 while `max_concurrent_pulls` run (Ollama's `/api/pull` answers the same).
pub fn refused(e: PullError) -> ApiError {
    match e {
        PullError::Running(_) => ApiError::conflict(e.to_string()).param("model").code("pull_running"),
        PullError::Invalid(_) => ApiError::bad_request(e.to_string()).code("invalid_pull"),
        PullError::TooMany { .. } => {
            let mut err = ApiError::conflict(e.to_string()).code("too_many_pulls");
            (err.status, err.retry_after_secs) = (StatusCode::TOO_MANY_REQUESTS, Some(5));
            err
        }
    }
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": state.pulls.list()}))
}

pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<PullProgress>, ApiError> {
    let pulls = state.pulls.clone();
    let cancelled = tokio::task::spawn_blocking(move || pulls.cancel(&id, CANCEL_WAIT))
        .await
        .map_err(|e| ApiError::internal(format!("cancelling the pull: {e}")))?;
    match cancelled {
        Ok(progress) => Ok(Json(progress)),
        Err(e @ CancelError::NotFound(_)) => Err(ApiError::not_found(e.to_string()).code("pull_not_found")),
        Err(e @ CancelError::NotRunning { .. }) => Err(ApiError::conflict(e.to_string()).code("pull_not_running")),
    }
}
