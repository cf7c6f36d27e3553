//! `POST /api/engine/reload`: loads the default model afresh on a new engine thread, the
//! way back from a failed load or a dead engine (the menu bar's "Reload model" does the
//! same; `POST /api/models/{id}/load` does it for any model).
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::AppState;
use crate::registry::SlotState;

/// 202 once the reload has started (`GET /health` follows it); 409 while loading, or while
/// another load, reload or unload is under way.
pub async fn reload(State(state): State<AppState>) -> Result<Response, ApiError> {
    let models = state.models.clone();
    let id = models.default_id().to_string();
    if models.slot_state(&id).0 == SlotState::Loading {
        return Err(ApiError::conflict("Cannot reload: the model is already loading").code("model_loading"));
    }
    let reload = models.start_reload(&id)?;
    tokio::spawn(async move {
        if let Ok(Err(e)) = reload.await {
            tracing::error!("reloading {id}: {e}");
        }
    });
    Ok((StatusCode::ACCEPTED, Json(json!({"state": "loading"}))).into_response())
}
