//! `GET /health`: load state, model, device and queue, and the stall watchdog.
//!
//! With an API key configured (the server is reachable beyond this machine) a caller
//! without the key learns only the one-word status, never paths or error text.
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::engine::LoadState;
use crate::registry::SlotState;

/// The one word `/health` answers with; 200 only for `ok`.
pub fn status_word(state: &AppState) -> &'static str {
    let models = &state.models;
    match models.default_state() {
        LoadState::Loading => "loading",
        LoadState::Failed(_) => "failed",
        LoadState::Stopped => "stopped",
        LoadState::Ready if state.draining.load(std::sync::atomic::Ordering::Relaxed) => "stopping",
        LoadState::Ready if models.stall_seconds() >= state.config.stall_seconds => "stalled",
        LoadState::Ready => "ok",
    }
}

/// 200 when the default model is ready (or unloaded while idle: a request loads it) and
/// every engine makes progress; 503 while it loads, after a failure, while stalled (no step
/// for `stall_seconds` with work waiting) or stopping.
pub async fn health(State(state): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let word = status_word(&state);
    let status = if word == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    if !super::security::key_given(&state, &headers) {
        return (status, Json(json!({"status": word})));
    }
    let models = &state.models;
    let load = models.default_state();
    // Restarted to form the cluster again (--on-rank-lost rejoin), not formed yet: why.
    let rejoining = models.cluster_rejoining().map(|(_, why)| why);
    let (name, detail) = match &load {
        LoadState::Loading => ("loading", rejoining.clone()),
        LoadState::Ready => ("ready", None),
        LoadState::Failed(e) => ("failed", Some(e.clone())),
        LoadState::Stopped => ("stopped", None),
    };
    let body = json!({
        "status": word,
        "state": name,
        "detail": detail,
        "model": models.engine(models.default_id()).and_then(|e| e.model()),
        "loaded": models.active_views().into_iter().filter(|v| v.state == SlotState::Loaded).map(|v| v.entry.id).collect::<Vec<_>>(),
        "device": models.device().as_str(),
        // Ranks serving the default model together (none: this process alone).
        "cluster": state.config.cluster.as_ref().map(|c| json!({
            "ranks": c.size(),
            "hosts": c.hosts.hosts.iter().map(|h| h.ssh.as_str()).collect::<Vec<_>>(),
            "rejoining_after": c.rejoining.as_ref().filter(|_| rejoining.is_some()),
        })),
        "version": env!("CARGO_PKG_VERSION"),
        "queue": {"waiting": models.waiting(), "running": models.running(), "capacity": state.config.queue_capacity},
        "last_step_age_seconds": models.stall_seconds(),
        // An engine left behind stuck (its memory held until mlxbar restarts).
        "restart_required": models.restart_required(),
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
        // The second address for Ollama clients: "off", {"listening": addr} or {"failed": why}.
        "ollama_port": state.ollama_port.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    });
    (status, Json(body))
}
