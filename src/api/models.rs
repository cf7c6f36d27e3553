//! `GET /v1/models`.
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::AppState;

pub async fn list_models(State(state): State<AppState>) -> impl IntoResponse {
    let data: Vec<_> = state
        .engine
        .model()
        .map(|m| json!({"id": m.id, "object": "model", "created": state.started_unix, "owned_by": "mlxbar"}))
        .into_iter()
        .collect();
    Json(json!({"object": "list", "data": data}))
}
