//! The model routes: `GET /v1/models` (OpenAI's list: every runnable model, loaded ones
//! first), `GET /api/models` (the whole library with each model's state, memory and the
//! budget), and `POST /api/models/{id}/load` | `/unload` (ids hold a '/', so one wildcard
//! route takes the action from the path's end).
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::json::OpenAiJson;
use super::AppState;
use crate::registry::{KeepAlive, ModelView, SlotState};

pub async fn list_models(State(state): State<AppState>) -> impl IntoResponse {
    let data: Vec<_> = state
        .models
        .list()
        .into_iter()
        .filter(|m| m.entry.runnable || m.state == SlotState::Loaded)
        .map(|m| json!({"id": m.entry.id, "object": "model", "created": state.started_unix, "owned_by": owner(&m)}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// The hub organisation for hub models, else mlxbar.
fn owner(m: &ModelView) -> String {
    match m.entry.id.split_once('/') {
        Some((org, _)) => org.to_string(),
        None => "mlxbar".into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Rescan the model folders first.
    #[serde(default)]
    refresh: bool,
}

pub async fn library(State(state): State<AppState>, Query(q): Query<ListQuery>) -> impl IntoResponse {
    let models = state.models.clone();
    if q.refresh {
        let library = models.library().clone();
        let _ = tokio::task::spawn_blocking(move || library.refresh()).await;
    }
    let list = models.list();
    let loaded_bytes: u64 = list.iter().filter_map(|m| m.memory_bytes).sum();
    let budget = models.budget();
    let available = state.telemetry.latest().memory.as_ref().map(|m| m.available);
    Json(json!({
        "default": models.default_id(),
        "max_loaded_models": budget.max_loaded,
        "memory": {
            "available_bytes": available,
            "budget_bytes": budget.ceiling,
            "budget_configured": budget.configured,
            "margin_bytes": budget.margin,
            "loaded_bytes": loaded_bytes,
        },
        "generation": models.library_generation(),
        "models": list,
        "pulls": state.pulls.list(),
    }))
}

/// `POST /api/models/{id}/load`'s body: all optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBody {
    /// Keep it loaded through idle time and LRU (or stop doing so).
    pinned: Option<bool>,
    /// How long it stays loaded once idle (Ollama's spelling: "5m", 300, -1).
    keep_alive: Option<KeepAlive>,
}

/// `POST /api/models/{*rest}`: `{id}/load` (200 with the model once loaded; 507 when it
/// does not fit, 404 unknown, 422 not runnable) or `{id}/unload` (200 once unloaded).
pub async fn action(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    OpenAiJson(body): OpenAiJson<LoadBody>,
) -> Result<Response, ApiError> {
    let models = state.models.clone();
    let (id, action) =
        rest.rsplit_once('/').ok_or_else(|| ApiError::not_found("Use POST /api/models/{id}/load or /api/models/{id}/unload"))?;
    match action {
        "load" => {
            if let Some(pinned) = body.pinned {
                models.set_pinned(id, pinned)?;
            }
            models.load(id).await?;
            if let Some(k) = body.keep_alive {
                models.set_keep_alive(id, k)?;
            }
        }
        "unload" => {
            if body.pinned.is_some() || body.keep_alive.is_some() {
                return Err(ApiError::bad_request("unload takes no fields; send {}"));
            }
            models.unload(id).await?;
        }
        _ => return Err(ApiError::not_found(format!("No action '{action}' for models; use load or unload"))),
    }
    Ok(Json(json!({"model": models.view(id)?})).into_response())
}
