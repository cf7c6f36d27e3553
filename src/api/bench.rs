//! Bench runs over HTTP: `GET /api/bench/profiles`, `POST /api/bench {"profile"}` (202, or
//! 409 while one runs), `GET /api/bench` (recent jobs), `GET`/`DELETE /api/bench/{id}`
//! (progress, cancel), `GET /api/bench/{id}/report` (HTML), `GET /api/history?limit=N`
//! and `GET /api/history/{id}`. Also the gate that keeps other generation requests off
//! the engine while a run holds it.
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::json::OpenAiJson;
use super::AppState;
use crate::bench::jobs::{StartError, BENCH_TOKEN_HEADER};
use crate::bench::record::is_valid_run_id;

pub async fn profiles(State(state): State<AppState>) -> Json<Value> {
    let (plans, warnings) = state.bench.profiles();
    let data: Vec<Value> = plans
        .iter()
        .map(|p| {
            let mut v = serde_json::to_value(p).unwrap_or_default();
            v["cells"] = json!(p.cells().len());
            v["requests"] = json!(p.total_requests());
            v
        })
        .collect();
    Json(json!({"object": "list", "data": data, "plans_dir": state.bench.store().plans_dir(), "warnings": warnings}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    profile: String,
}

pub async fn start(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<StartRequest>) -> Result<Response, ApiError> {
    if state.paused.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::paused());
    }
    if state.models.engine(state.models.default_id()).is_none() {
        return Err(ApiError::unavailable("The default model is not loaded; retry shortly"));
    }
    match state.bench.start(&req.profile) {
        Ok(job) => {
            let location = format!("/api/bench/{}", job.id);
            Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)], Json(job.view())).into_response())
        }
        Err(e @ StartError::Busy(_)) => Err(ApiError::conflict(e.to_string()).code("bench_running")),
        Err(e @ StartError::UnknownProfile(_)) => Err(ApiError::not_found(e.to_string()).param("profile").code("profile_not_found")),
        Err(e @ StartError::DataDir(_)) => Err(ApiError::insufficient_storage(e.to_string(), "data_dir_unwritable")),
    }
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let jobs: Vec<_> = state.bench.jobs().iter().map(|j| j.view()).collect();
    Json(json!({"object": "list", "data": jobs, "active": state.bench.active().map(|a| a.id)}))
}

fn no_run(id: &str) -> ApiError {
    ApiError::not_found(format!("No bench run '{id}'")).code("run_not_found")
}

/// A job this server ran (live), else a saved run.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if let Some(job) = state.bench.job(&id) {
        return Ok(Json(serde_json::to_value(job.view()).unwrap_or_default()));
    }
    let store = state.bench.store().clone();
    let run = tokio::task::spawn_blocking(move || store.run(&id).ok_or(id)).await.map_err(|e| ApiError::internal(e.to_string()))?;
    run.map(|r| Json(serde_json::to_value(r).unwrap_or_default())).map_err(|id| no_run(&id))
}

/// Cancels a running job; answers once its requests are dropped and the engine is free.
pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let job = state.bench.job(&id).ok_or_else(|| no_run(&id))?;
    if !job.is_running() {
        return Err(ApiError::conflict(format!("Bench run '{id}' has already ended ({:?})", job.view().state)).code("run_not_running"));
    }
    job.cancel().await;
    Ok(Json(serde_json::to_value(job.view()).unwrap_or_default()))
}

pub async fn report(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !is_valid_run_id(&id) {
        return Err(no_run(&id));
    }
    let path = state.bench.store().report_path(&id);
    match tokio::fs::read_to_string(&path).await {
        Ok(html) => Ok(([(header::CONTENT_SECURITY_POLICY, "default-src 'none'; style-src 'unsafe-inline'")], Html(html)).into_response()),
        Err(_) => Err(ApiError::not_found(format!("No report for bench run '{id}' (yet)")).code("run_not_found")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    limit: Option<String>,
}

pub async fn history(State(state): State<AppState>, Query(q): Query<HistoryQuery>) -> Result<Json<Value>, ApiError> {
    let limit = match q.limit.as_deref() {
        None => 20,
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be a whole number from 1 to 1000, got '{s}'")).param("limit"))?,
    };
    let store = state.bench.store().clone();
    let entries = tokio::task::spawn_blocking(move || store.history(limit)).await.map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(json!({"object": "list", "data": entries})))
}

pub async fn history_run(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let store = state.bench.store().clone();
    let found = tokio::task::spawn_blocking(move || store.run(&id).filter(|r| r.state == crate::bench::record::RunState::Done).ok_or(id))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    found.map(|r| Json(serde_json::to_value(r).unwrap_or_default())).map_err(|id| no_run(&id))
}

/// Middleware on the generation routes: while a bench run holds the engine, requests
/// without its token wait up to `bench_wait_seconds`, then get 503 with Retry-After.
pub async fn gate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let token = req.headers().get(BENCH_TOKEN_HEADER).map(|v| v.as_bytes().to_vec());
    let wait = Duration::from_secs_f64(state.config.bench_wait_seconds);
    match state.bench.gate(token.as_deref(), wait).await {
        Ok(()) => next.run(req).await,
        Err(retry_after) => {
            state.metrics.admission_refused_total.with_label_values(&["bench_running"]).inc();
            ApiError::bench_running(retry_after).into_response()
        }
    }
}
