//! The model routes: `GET /v1/models` (OpenAI's list: every runnable model, loaded ones
//! first), `GET /api/models` (the whole library with each model's state, memory and the
//! budget), `POST /api/models/refresh` (rescan the model folders, then the same listing:
//! a POST, so the cross-site rules keep web pages from making the server scan), and
//! `POST /api/models/{id}/load` | `/unload` (ids hold a '/', so one wildcard route takes the
//! action from the path's end).
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

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
    /// Moved to `POST /api/models/refresh`; named here to say so.
    refresh: Option<String>,
}

/// How long `POST /api/models/refresh` waits for its scan.
const REFRESH_WAIT: Duration = Duration::from_secs(10);

pub async fn library(State(state): State<AppState>, Query(q): Query<ListQuery>) -> Result<Json<Value>, ApiError> {
    if q.refresh.is_some() {
        return Err(ApiError::bad_request(
            "GET /api/models no longer rescans (a GET must not change anything): send POST /api/models/refresh with Content-Type: application/json",
        )
        .param("refresh")
        .code("use_post_refresh"));
    }
    Ok(Json(listing(&state)))
}

/// `POST /api/models/refresh` (body `{}` or none, as JSON): rescans, then the listing. The
/// scan is shared with any other running; 503 if it has not ended after 10 s (a folder that
/// does not answer), the listing unchanged.
pub async fn refresh(State(state): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    if !body.iter().all(u8::is_ascii_whitespace) {
        let _: RefreshBody =
            serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}; send {{}}")))?;
    }
    match state.models.library().refresh_async(REFRESH_WAIT).await {
        Some(_) => Ok(Json(listing(&state))),
        None => Err(ApiError::unavailable(format!(
            "The model library scan has not ended after {} s (a models folder does not answer?); the listing is unchanged",
            REFRESH_WAIT.as_secs()
        ))
        .code("scan_running")),
    }
}

/// `POST /api/models/refresh` takes no fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefreshBody {}

fn listing(state: &AppState) -> Value {
    let models = &state.models;
    let list = models.list();
    let loaded_bytes: u64 = list.iter().filter_map(|m| m.memory_bytes).sum();
    let budget = models.budget();
    let available = state.telemetry.latest().memory.as_ref().map(|m| m.available);
    json!({
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
    })
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
    // A model copied in a moment ago is found (a rescan off the runtime) before it is pinned.
    let id = &models.find(Some(id)).await?;
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
