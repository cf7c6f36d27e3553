//! `POST /api/engine/reload`: loads the model afresh on a new engine thread, the way back
//! from a failed load or a dead engine (the menu bar's "Reload model" does the same).
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::AppState;
use crate::engine::ReloadError;

/// 202 once the reload has started (`GET /health` follows it); 409 while loading.
pub async fn reload(State(state): State<AppState>) -> Result<Response, ApiError> {
    let engine = state.engine.clone();
    // Stopping the old thread waits for its current step.
    let started = tokio::task::spawn_blocking(move || engine.reload()).await.map_err(|e| ApiError::internal(format!("reload: {e}")))?;
    match started {
        Ok(()) => Ok((StatusCode::ACCEPTED, Json(json!({"state": "loading"}))).into_response()),
        Err(e @ ReloadError::AlreadyLoading) => Err(ApiError::conflict(format!("Cannot reload: {e}")).code("model_loading")),
        Err(e) => Err(ApiError::unavailable(format!("Cannot reload: {e}"))),
    }
}
