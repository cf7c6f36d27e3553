//! `GET /api/alerts` (every rule with its state) and snoozing one:
//! `POST /api/alerts/{id}/snooze {"seconds": 3600}`, `DELETE` lifts it.
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::alerts::{AlertView, MAX_SNOOZE};

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": state.alerts.view()}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnoozeRequest {
    /// Default: one hour.
    #[serde(default)]
    seconds: Option<f64>,
}

/// The body is optional (an empty POST snoozes for an hour).
pub async fn snooze(State(state): State<AppState>, Path(id): Path<String>, body: Bytes) -> Result<Json<AlertView>, ApiError> {
    let req: SnoozeRequest = if body.iter().all(u8::is_ascii_whitespace) {
        SnoozeRequest { seconds: None }
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?
    };
    let seconds = req.seconds.unwrap_or(3600.0);
    if !(seconds > 0.0 && seconds <= MAX_SNOOZE.as_secs_f64()) {
        return Err(ApiError::bad_request(format!("seconds must be in (0, {}]", MAX_SNOOZE.as_secs())).param("seconds"));
    }
    state.alerts.snooze(&id, Some(Duration::from_secs_f64(seconds))).map(Json).ok_or_else(|| no_such_alert(&id))
}

pub async fn unsnooze(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<AlertView>, ApiError> {
    state.alerts.snooze(&id, None).map(Json).ok_or_else(|| no_such_alert(&id))
}

fn no_such_alert(id: &str) -> ApiError {
    ApiError::not_found(format!("No alert named {id:?}; GET /api/alerts lists them")).code("alert_not_found")
}
