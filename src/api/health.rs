//! `GET /health`: load state, model, device and queue.
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::engine::LoadState;

/// 200 when the model is ready, 503 while loading or after a failed load; the body says which.
pub async fn health(State(state): State<AppState>) -> impl IntoResponse {
    let engine = &state.engine;
    let load = engine.state();
    let status = if load == LoadState::Ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let (name, detail) = match &load {
        LoadState::Loading => ("loading", None),
        LoadState::Ready => ("ready", None),
        LoadState::Failed(e) => ("failed", Some(e.clone())),
        LoadState::Stopped => ("stopped", None),
    };
    let body = json!({
        "status": if status == StatusCode::OK { "ok" } else { "unavailable" },
        "state": name,
        "detail": detail,
        "model": engine.model(),
        "device": engine.device().as_str(),
        "version": env!("CARGO_PKG_VERSION"),
        "queue": {"waiting": engine.waiting(), "running": engine.running(), "capacity": engine.options().queue_capacity},
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
    });
    (status, Json(body))
}
