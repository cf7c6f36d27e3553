//! `POST /api/models/pull {"model": "org/name", "revision"?, "file"?}` starts a pull from
//! Hugging Face (202 + its progress; 409 while one of the same repo runs; 400 for a name
//! that is not a repo id), `GET /api/models/pulls` lists them (running and recent ones).
//! The pull uses the server's environment (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE/HF_HOME).
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::json::OpenAiJson;
use super::AppState;
use crate::library::pull::{PullError, PullOptions};

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
    match state.pulls.start(opts) {
        Ok(progress) => Ok((StatusCode::ACCEPTED, Json(progress)).into_response()),
        Err(e @ PullError::Running(_)) => Err(ApiError::conflict(e.to_string()).param("model").code("pull_running")),
        Err(e @ PullError::Invalid(_)) => Err(ApiError::bad_request(e.to_string()).code("invalid_pull")),
    }
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": state.pulls.list()}))
}
