//! The HTTP API: the OpenAI Chat Completions, OpenAI Responses, Anthropic Messages and
//! Ollama dialects (`openai/`, `responses/`, `anthropic/`, `ollama/`, each over the neutral
//! core in `crate::inference`), health, metrics, alerts and bench routes, with the security
//! layers.
pub mod alerts;
pub mod anthropic;
pub mod bench;
pub mod cross_site;
pub mod engine;
pub mod error;
pub mod health;
pub mod json;
pub mod json_errors;
pub mod live;
pub mod metrics;
pub mod models;
pub mod ollama;
pub mod openai;
pub mod pull;
pub mod responses;
pub mod security;
pub mod snapshot;
pub mod ui;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method};
use axum::routing::{any, delete, get, post};
use axum::{middleware, Extension, Router};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::alerts::Alerts;
use crate::bench::jobs::BenchJobs;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;
use error::ApiError;

#[derive(Clone)]
pub struct AppState {
    /// The model registry: every engine, loaded on demand.
    pub models: Arc<crate::registry::Models>,
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    pub telemetry: Arc<Telemetry>,
    pub alerts: Arc<Alerts>,
    pub bench: Arc<BenchJobs>,
    /// Pulls from Hugging Face (`POST /api/models/pull`).
    pub pulls: Arc<crate::library::pull::Pulls>,
    /// Set from the menu bar: generation requests get 503 until resumed.
    pub paused: Arc<AtomicBool>,
    /// Set when shutdown begins: in-flight requests finish, new ones get 503.
    pub draining: Arc<AtomicBool>,
    /// Turns true when the server shuts down: long-lived streams end so shutdown can finish.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The live snapshot stream's one producer and its subscriber cap.
    pub live: Arc<live::Feed>,
    /// Bounded threads for preparing requests (schemas, templates, tokenizing, grammars).
    pub prepare: Arc<crate::inference::prepare::Prepare>,
    /// The second address for Ollama clients (`ollama_port`), as it is now.
    pub ollama_port: Arc<std::sync::Mutex<crate::ollama_port::OllamaPort>>,
    pub started: Instant,
    pub started_unix: u64,
}

pub fn router(state: AppState) -> Router {
    let config = state.config.clone();
    // While a bench run holds the engine, generation waits or gets 503 (see bench::gate).
    let generation = Router::new()
        .route("/v1/chat/completions", post(openai::chat::chat_completions))
        .route("/v1/completions", post(openai::completions::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::responses))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route_layer(middleware::from_fn_with_state(state.clone(), bench::gate));
    let mut app = Router::new()
        .route("/", get(ui::index))
        .route("/ui/{*path}", get(ui::asset))
        .merge(generation)
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(models::list_models))
        .route("/api/models", get(models::library))
        .route("/api/models/refresh", post(models::refresh))
        .route("/api/models/{*rest}", post(models::action))
        .route("/health", get(health::health))
        .route("/metrics", get(metrics::prometheus))
        .route("/api/metrics/snapshot", get(live::get_snapshot))
        .route("/api/metrics/snapshot/schema", get(snapshot::get_schema))
        .route("/api/metrics/stream", get(live::stream))
        .route("/api/alerts", get(alerts::list))
        .route("/api/alerts/{id}/snooze", post(alerts::snooze).delete(alerts::unsnooze))
        .route("/api/bench/profiles", get(bench::profiles))
        .route("/api/bench", get(bench::list).post(bench::start))
        .route("/api/bench/{id}", get(bench::get).delete(bench::cancel))
        .route("/api/bench/{id}/report", get(bench::report))
        .route("/api/history", get(bench::history))
        .route("/api/history/{id}", get(bench::history_run))
        .route("/api/engine/reload", post(engine::reload))
        .route("/api/models/pull", post(pull::start))
        .route("/api/models/pulls", get(pull::list))
        .route("/api/models/pulls/{id}", delete(pull::cancel))
        .route("/api/tags", get(ollama::models::tags))
        .route("/api/show", post(ollama::models::show))
        .route("/api/ps", get(ollama::models::ps))
        .route("/api/version", get(ollama::models::version))
        .route("/api/pull", post(ollama::pull::pull))
        .route("/api/create", any(ollama::errors::unsupported))
        .route("/api/push", any(ollama::errors::unsupported))
        .route("/api/copy", any(ollama::errors::unsupported))
        .route("/api/delete", any(ollama::errors::unsupported))
        .route("/api/embed", any(ollama::errors::unsupported))
        .route("/api/embeddings", any(ollama::errors::unsupported))
        .route("/api/blobs/{digest}", any(ollama::errors::unsupported))
        .fallback(|| async { ApiError::not_found("No such route; see /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /api/chat, /api/generate, /api/tags, /health, /metrics, /api/models, /api/metrics/snapshot, /api/alerts, /api/bench, /api/history") })
        .method_not_allowed_fallback(|| async {
            let mut e = ApiError::bad_request("Method not allowed for this route");
            e.status = axum::http::StatusCode::METHOD_NOT_ALLOWED;
            e
        })
        .layer(middleware::from_fn(json_errors::rewrite))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(Extension(json::BodyLimit(config.max_body_bytes)))
        .layer(middleware::from_fn_with_state(state.clone(), cross_site::check))
        .layer(middleware::from_fn_with_state(state.clone(), security::check_api_key))
        .layer(middleware::from_fn_with_state(state.clone(), security::check_host))
        // Errors on the Anthropic routes, the guards' too, in Anthropic's shape.
        .layer(middleware::from_fn(anthropic::errors::reshape))
        // ... and on the Ollama routes in Ollama's.
        .layer(middleware::from_fn(ollama::errors::reshape))
        // Outermost, so requests the guards refuse are counted too.
        .layer(middleware::from_fn_with_state(state.clone(), crate::metrics::http::track));
    // No CORS headers at all unless origins are configured: browsers then refuse
    // cross-origin reads. Never a wildcard.
    let origins: Vec<HeaderValue> = config.cors_origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    if !origins.is_empty() {
        app = app.layer(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([Method::GET, Method::POST, Method::DELETE])
                .allow_headers([
                    axum::http::header::CONTENT_TYPE,
                    axum::http::header::AUTHORIZATION,
                    axum::http::HeaderName::from_static("x-api-key"),
                    axum::http::HeaderName::from_static("anthropic-version"),
                ]),
        );
    }
    app.with_state(state)
}
